package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	config_util "github.com/prometheus/common/config"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v2"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/sys/unix"
)

// ErrSetup marks a failure of this machine (not of the file) while loading
// a web config.
var ErrSetup = errors.New("setting up the web config")

// WebConfig is a parsed and checked --web.config.file (exporter-toolkit's
// format). exporter-toolkit serves its TLS and HTTP settings from a view of
// the file without the users and the rate limit, which this package
// enforces itself (see auth.go for why).
type WebConfig struct {
	*web.Config
	path    string
	users   map[string]string // user -> bcrypt hash
	modTime time.Time
	size    int64
	view    *os.File // the view, in memory (memfd), for exporter-toolkit to read
}

// TLS says whether the file turns TLS on.
func (c *WebConfig) TLS() bool { return c.TLSConfig.IsEnabled() }

// Close frees the view.
func (c *WebConfig) Close() error { return c.view.Close() }

// LoadWebConfig reads, parses and checks the web config at path, as
// exporter-toolkit would (strict YAML, its defaults, paths relative to the
// file's folder, certificates loaded, bcrypt hashes well formed), reading
// the file once. Files over MaxWebConfigBytes are refused before parsing.
func LoadWebConfig(path string) (*WebConfig, error) {
	// The folder relative paths are read from, made absolute: the toolkit
	// is handed a view of the file elsewhere (/proc/self/fd/N), so a path
	// left relative ("cert.pem" beside "--web.config.file=web.yml") would
	// resolve there instead.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxWebConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxWebConfigBytes {
		return nil, fmt.Errorf("the file is larger than the limit of %d bytes (%d KiB); TLS settings and a few users need a few KiB", MaxWebConfigBytes, MaxWebConfigBytes>>10)
	}
	c := &web.Config{
		TLSConfig:  web.TLSConfig{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13},
		HTTPConfig: web.HTTPConfig{HTTP2: true},
	}
	if err := yaml.UnmarshalStrict(data, c); err != nil {
		return nil, err
	}
	dir := filepath.Dir(abs)
	c.TLSConfig.SetDirectory(dir)
	users := make(map[string]string, len(c.Users))
	for u, p := range c.Users {
		if _, err := bcrypt.Cost([]byte(p)); err != nil {
			return nil, fmt.Errorf("basic_auth_users: the password of %q is not a bcrypt hash (%v): give the output of htpasswd -nBC 10 %s", u, err, u)
		}
		users[u] = string(p)
	}
	view, err := toolkitView(data, dir)
	if err != nil {
		return nil, err
	}
	mf, err := newMemFile("gpu-pool-exporter-web-config", view)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSetup, err)
	}
	// exporter-toolkit's own checks (headers, TLS settings, certificates)
	// on the bytes it will read.
	if err := web.Validate(memFilePath(mf)); err != nil {
		mf.Close()
		return nil, err
	}
	return &WebConfig{Config: c, path: path, users: users, modTime: fi.ModTime(), size: fi.Size(), view: mf}, nil
}

// toolkitView is the web config as exporter-toolkit is given it: its TLS
// and HTTP settings, without basic_auth_users and rate_limit, with relative
// paths made absolute (the view lives elsewhere). Everything else is kept
// as written, inline keys included.
func toolkitView(data []byte, dir string) ([]byte, error) {
	var doc yaml.MapSlice
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	var view yaml.MapSlice
	for _, item := range doc {
		switch item.Key {
		case "basic_auth_users", "rate_limit":
			continue
		case "tls_server_config":
			if tc, ok := item.Value.(yaml.MapSlice); ok {
				for i, kv := range tc {
					switch kv.Key {
					case "cert_file", "key_file", "client_ca_file":
						if s, ok := kv.Value.(string); ok {
							tc[i].Value = config_util.JoinDir(dir, s)
						}
					}
				}
			}
		}
		view = append(view, item)
	}
	return yaml.Marshal(view)
}

// newMemFile is a file in memory holding data: the view holds TLS keys
// written inline, which must not reach a disk, and needs no writable
// directory.
func newMemFile(name string, data []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// memFilePath names f for readers that open a path: each open starts at
// the beginning of the file.
func memFilePath(f *os.File) string { return fmt.Sprintf("/proc/self/fd/%d", f.Fd()) }

// webConfigSource is the web config being served: parsed at start, parsed
// again when the file changes (looked at once a second) or at SIGHUP, so
// rotated certificates and passwords need no restart. A file that became
// invalid is logged and the last good config kept.
type webConfigSource struct {
	log  zerolog.Logger
	cur  atomic.Pointer[WebConfig]
	live *os.File   // the view exporter-toolkit reads, at a path that never changes
	mu   sync.Mutex // serialises reloads
	// onLoad, when set, is told of every config served after the first.
	onLoad func(*WebConfig)
}

func newWebConfigSource(c *WebConfig, log zerolog.Logger) *webConfigSource {
	s := &webConfigSource{log: log, live: c.view}
	s.cur.Store(c)
	return s
}

// toolkitPath is where exporter-toolkit reads the view.
func (s *webConfigSource) toolkitPath() string { return memFilePath(s.live) }

func (s *webConfigSource) get() *WebConfig { return s.cur.Load() }

// watch reloads the file when it changes, and at every value on hup, until
// ctx is done.
func (s *webConfigSource) watch(ctx context.Context, hup <-chan os.Signal) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			s.log.Info().Str("file", s.get().path).Msg("SIGHUP received: reloading the web config")
			s.reload("SIGHUP")
		case <-t.C:
			c := s.get()
			if fi, err := os.Stat(c.path); err == nil && (!fi.ModTime().Equal(c.modTime) || fi.Size() != c.size) {
				s.reload("file changed")
			}
		}
	}
}

// reload parses the file again and serves it if it is valid.
func (s *webConfigSource) reload(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.get()
	c, err := LoadWebConfig(old.path)
	if err != nil {
		s.log.Error().Err(err).Str("file", old.path).Str("reason", reason).Msg("the web config cannot be read or is invalid; keeping the last good one")
		return
	}
	// The new view takes the live view's place in one step: a reader
	// opening the path gets the old file or the new one, never a mix.
	if err := unix.Dup3(int(c.view.Fd()), int(s.live.Fd()), unix.O_CLOEXEC); err != nil {
		c.Close()
		s.log.Error().Err(err).Str("file", old.path).Msg("the new web config cannot be handed to the TLS server; keeping the last good one")
		return
	}
	c.Close()
	c.view = s.live
	s.cur.Store(c)
	if s.onLoad != nil {
		s.onLoad(c)
	}
	s.log.Info().Str("file", old.path).Str("reason", reason).Msg("web config reloaded")
}
