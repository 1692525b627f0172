package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
	path  string
	users map[string]string // user -> bcrypt hash
	// badUsers: why each user whose password is no bcrypt hash was left
	// out of users (only a reload serves such a file).
	badUsers []error
	empty    bool      // the file sets nothing (or only has comments)
	stamp    fileStamp // of the file as read
	view     *os.File  // the view, in memory (memfd), for exporter-toolkit to read
}

// fileStamp tells that a file changed without reading it: its inode (a
// Secret's atomic swap, a file moved into place), size, modification time
// and change time (which no copy that keeps the modification time, such
// as cp -p or rsync -t, can set back). The zero stamp is a file that
// cannot be read.
type fileStamp struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // nanoseconds
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fi.Sys().(*syscall.Stat_t) // always, on Linux (memfd and dup3 are Linux's too)
	return fileStamp{
		dev: uint64(st.Dev), // its type varies by platform
		ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
	}
}

// statStamp is the stamp of the file at path now (following links), zero
// where it cannot be read.
func statStamp(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return stampOf(fi)
}

// tlsFiles are the certificate files exporter-toolkit reads again at every
// TLS handshake (cert_file, key_file, client_ca_file, resolved), those set.
func (c *WebConfig) tlsFiles() []string {
	var fs []string
	for _, f := range []string{c.TLSConfig.TLSCertPath, c.TLSConfig.TLSKeyPath, c.TLSConfig.ClientCAs} {
		if f != "" {
			fs = append(fs, f)
		}
	}
	return fs
}

// TLS says whether the file turns TLS on.
func (c *WebConfig) TLS() bool { return c.TLSConfig.IsEnabled() }

// authOn says whether the file asks for basic auth: it names users, even
// if none of them can log in (their passwords are no bcrypt hashes).
func (c *WebConfig) authOn() bool { return len(c.Users) > 0 }

// Close frees the view.
func (c *WebConfig) Close() error { return c.view.Close() }

// LoadWebConfig reads, parses and checks the web config at path, as
// exporter-toolkit would (strict YAML, its defaults, paths relative to the
// file's folder, certificates loaded, bcrypt hashes well formed), reading
// the file once. Files over MaxWebConfigBytes are refused before parsing.
func LoadWebConfig(path string) (*WebConfig, error) {
	c, err := loadWebConfig(path)
	for try := 0; errors.Is(err, errChanging) && try < 5; try++ {
		time.Sleep(200 * time.Millisecond) // being written: read it again
		c, err = loadWebConfig(path)
	}
	if errors.Is(err, errChanging) {
		return nil, fmt.Errorf("%w for a second: start the exporter again once it is written", err)
	}
	if err != nil {
		return nil, err
	}
	if len(c.badUsers) > 0 {
		c.Close()
		return nil, c.badUsers[0]
	}
	return c, nil
}

// loadWebConfig is LoadWebConfig but for the users whose password is not a
// bcrypt hash: they are left out of the users (they cannot log in, as with
// exporter-toolkit, which fails their logins) and named in badUsers, and
// the rest of the file is served. A reload takes a file so: an edit that
// removes one user and mistypes another's hash still removes the first.
func loadWebConfig(path string) (*WebConfig, error) {
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
	if after, err := f.Stat(); err == nil && stampOf(after) != stampOf(fi) {
		return nil, errChanging
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
	c.TLSConfig.SetDirectory(filepath.Dir(abs))
	if err := checkClientCAs(c.TLSConfig); err != nil {
		return nil, err
	}
	users := make(map[string]string, len(c.Users))
	var bad []error
	for _, u := range slices.Sorted(maps.Keys(c.Users)) {
		p := c.Users[u]
		if _, err := bcrypt.Cost([]byte(p)); err != nil {
			// bcrypt's own error can quote the value's first byte: a
			// password written in clear must not reach the log.
			bad = append(bad, fmt.Errorf("basic_auth_users: the password of %q is not a bcrypt hash: give the hash that htpasswd -nBC 10 %s prints after the colon", u, u))
			continue
		}
		users[u] = string(p)
	}
	view, empty, err := toolkitView(data, map[string]string{
		"cert_file":      c.TLSConfig.TLSCertPath,
		"key_file":       c.TLSConfig.TLSKeyPath,
		"client_ca_file": c.TLSConfig.ClientCAs,
	})
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
	return &WebConfig{Config: c, path: path, users: users, badUsers: bad, empty: empty, stamp: stampOf(fi), view: mf}, nil
}

// errChanging: the file changed while it was read (an editor or a copy
// writing it): what was read may be half of it.
var errChanging = errors.New("the file changed while it was read")

// checkClientCAs refuses client CAs (client_ca_file, or client_ca inline)
// without one PEM certificate where exporter-toolkit verifies client
// certificates with them (its own reading of client_auth_type): it accepts
// them, and then refuses every client certificate.
func checkClientCAs(c web.TLSConfig) error {
	if c.ClientCAs == "" && c.ClientCAsText == "" {
		return nil
	}
	tc, err := web.ConfigToTLSConfig(&c)
	if err != nil || (tc.ClientAuth != tls.VerifyClientCertIfGiven && tc.ClientAuth != tls.RequireAndVerifyClientCert) {
		return nil // the toolkit's own check says what is wrong, or it verifies no client
	}
	pem, what := []byte(c.ClientCAsText), "client_ca"
	if c.ClientCAs != "" {
		if pem, err = os.ReadFile(c.ClientCAs); err != nil {
			return fmt.Errorf("client_ca_file: %w", err)
		}
		what = "client_ca_file " + c.ClientCAs
	}
	if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s holds no PEM certificate, so with client_auth_type %s every client certificate would be refused: give the CA certificates that sign the clients' (-----BEGIN CERTIFICATE-----)", what, c.ClientAuth)
	}
	return nil
}

// toolkitView is the web config as exporter-toolkit is given it: its TLS
// and HTTP settings, without basic_auth_users and rate_limit, with the
// certificate paths resolved against the file's folder (absolute: the
// view lives elsewhere). Each path is written as the parsed config holds
// it, whatever YAML scalar it was written as (cert_file: 1.5 is the file
// "1.5" beside the config, as for exporter-toolkit). Everything else is kept
// as written, inline keys included. empty: the file sets nothing.
func toolkitView(data []byte, paths map[string]string) (view []byte, empty bool, err error) {
	var doc yaml.MapSlice
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, false, err
	}
	var kept yaml.MapSlice
	for _, item := range doc {
		switch item.Key {
		case "basic_auth_users", "rate_limit":
			continue
		case "tls_server_config":
			if tc, ok := item.Value.(yaml.MapSlice); ok {
				for i, kv := range tc {
					if k, ok := kv.Key.(string); ok {
						if p, ok := paths[k]; ok {
							tc[i].Value = p
						}
					}
				}
			}
		}
		kept = append(kept, item)
	}
	view, err = yaml.Marshal(kept)
	return view, len(doc) == 0, err
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
// rotated passwords need no restart. A file that became invalid is logged
// once and the last good config kept. Certificate files are exporter-
// toolkit's to read (at every TLS handshake, so renewed ones are served at
// once); when they change, they are checked as it will read them, and a
// pair it cannot load is logged as an error (every handshake fails until
// it is fixed), not left to the debug log's handshake lines.
type webConfigSource struct {
	log  zerolog.Logger
	cur  atomic.Pointer[WebConfig]
	live *os.File   // the view exporter-toolkit reads, at a path that never changes
	mu   sync.Mutex // serialises reloads and the fields below
	// onLoad, when set, is told of every config served after the first.
	onLoad func(*WebConfig)
	// tried is the stamp of the file last read (served or refused): a
	// refused file is not read again, nor logged again, until it changes.
	tried fileStamp
	// certs are the stamps of the served config's certificate files as last
	// checked, and certsBad whether exporter-toolkit could not load them.
	certs    []fileStamp
	certsBad bool
	// What the listeners were opened with: a reload cannot change it.
	startTLS, startHTTP2 bool
	startRate            web.RateLimiterConfig
}

func newWebConfigSource(c *WebConfig, log zerolog.Logger) *webConfigSource {
	s := &webConfigSource{log: log, live: c.view, tried: c.stamp, certs: stamps(c.tlsFiles()),
		startTLS: c.TLS(), startHTTP2: c.HTTPConfig.HTTP2, startRate: c.RateLimiterConfig}
	s.cur.Store(c)
	return s
}

func stamps(files []string) []fileStamp {
	st := make([]fileStamp, len(files))
	for i, f := range files {
		st[i] = statStamp(f)
	}
	return st
}

// toolkitPath is where exporter-toolkit reads the view.
func (s *webConfigSource) toolkitPath() string { return memFilePath(s.live) }

func (s *webConfigSource) get() *WebConfig { return s.cur.Load() }

// watch reloads the file when it changes, and at every value on hup, and
// checks the certificate files when they change, until ctx is done.
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
			s.poll()
		}
	}
}

// poll reloads the file if it changed since it was last read, else checks
// the certificate files if one of them changed.
func (s *webConfigSource) poll() {
	s.mu.Lock()
	changed := statStamp(s.get().path) != s.tried
	s.mu.Unlock()
	if changed {
		s.reload("file changed")
		return
	}
	s.checkCerts()
}

// checkCerts asks exporter-toolkit's own check whether it can load the
// served config's certificate files, once they changed.
func (s *webConfigSource) checkCerts() {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.get()
	now := stamps(c.tlsFiles())
	if slices.Equal(now, s.certs) {
		return
	}
	s.certs = now
	files := strings.Join(c.tlsFiles(), ", ")
	err := web.Validate(s.toolkitPath())
	if err == nil {
		err = checkClientCAs(c.TLSConfig)
	}
	if err != nil {
		s.certsBad = true
		s.log.Error().Err(err).Str("file", c.path).Str("certificate_files", files).
			Msg("the web config's certificate files changed and cannot be used: TLS handshakes fail until they are fixed (a certificate and its key written one after the other load once both are in place)")
		return
	}
	if s.certsBad {
		s.certsBad = false
		s.log.Info().Str("file", c.path).Str("certificate_files", files).Msg("the web config's certificate files load again: TLS handshakes are served")
		return
	}
	s.log.Info().Str("file", c.path).Str("certificate_files", files).Msg("the web config's certificate files changed: new TLS connections get them")
}

// reload parses the file again and serves it if it is valid and can be
// served without a restart.
func (s *webConfigSource) reload(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.get()
	s.tried = statStamp(old.path)
	c, err := loadWebConfig(old.path)
	if errors.Is(err, errChanging) {
		// Being written: read it again at the next look.
		s.tried = fileStamp{}
		s.log.Debug().Str("file", old.path).Msg("the web config changed while it was read; reading it again in a second")
		return
	}
	if err != nil {
		msg := "the web config cannot be read or is invalid; keeping the last good one"
		if len(old.tlsFiles()) > 0 && web.Validate(s.toolkitPath()) != nil {
			// The last good config names certificate files exporter-toolkit
			// reads at every handshake: it cannot keep serving them.
			s.certsBad = true
			s.certs = stamps(old.tlsFiles()) // said here, not again by checkCerts
			msg = "the web config cannot be read or is invalid, and the certificate files of the last good one no longer load either: every TLS handshake fails until they are fixed"
		}
		s.log.Error().Err(err).Str("file", old.path).Str("reason", reason).Msg(msg)
		return
	}
	// An empty file where the served one sets something turns TLS and
	// basic auth off: more likely a file caught while it is written
	// (truncated first) than a wish, which a restart without
	// --web.config.file says plainly.
	if c.empty && !old.empty {
		c.Close()
		s.log.Error().Str("file", old.path).Str("reason", reason).
			Msg("the web config is empty (as a file is while it is being written); keeping the last good one: to serve without TLS and basic auth, restart the exporter without --web.config.file")
		return
	}
	// The listeners were opened with TLS or without it: a config that turns
	// it on or off would leave them serving plain HTTP with TLS asked for,
	// or fail every handshake.
	if c.TLS() != s.startTLS {
		c.Close()
		state := map[bool]string{true: "on", false: "off"}
		s.log.Error().Str("file", old.path).Str("reason", reason).
			Msgf("the web config now turns TLS %s, but the listeners were opened with TLS %s: restart the exporter to apply it; keeping the last good web config until then", state[c.TLS()], state[s.startTLS])
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
	s.certs = stamps(c.tlsFiles())
	s.certsBad = false
	if s.onLoad != nil {
		s.onLoad(c)
	}
	s.log.Info().Str("file", old.path).Str("reason", reason).Msg("web config reloaded")
	for _, err := range c.badUsers {
		msg := "a user of the reloaded web config cannot log in until its password is a bcrypt hash; the other users are served"
		if len(c.users) == 0 {
			msg = "no user of the reloaded web config can log in until a password is a bcrypt hash: every request is refused (401) until then"
		}
		s.log.Error().Err(err).Str("file", old.path).Msg(msg)
	}
	// Settings exporter-toolkit and the server read once, when the
	// listeners open (http2 only matters with TLS: no h2c).
	if s.startTLS && c.HTTPConfig.HTTP2 != s.startHTTP2 {
		s.log.Warn().Str("file", old.path).Bool("http2", c.HTTPConfig.HTTP2).Bool("served", s.startHTTP2).Msg("http_server_config.http2 differs from what the listeners were opened with: it applies when the exporter restarts")
	}
	if c.RateLimiterConfig != s.startRate {
		s.log.Warn().Str("file", old.path).Msg("rate_limit differs from what the exporter started with: it applies when the exporter restarts")
	}
}
