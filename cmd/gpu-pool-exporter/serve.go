package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v2"
	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"
)

// The exporter serves its web config (exporter-toolkit's format, checked
// with web.Validate at start) itself rather than through web.Serve: the
// toolkit checks every unknown password with bcrypt, one at a time under one
// lock, and evicts its login cache at random, so a flood of wrong passwords
// queued the real scraper behind it for seconds. Here a scraper whose exact
// credentials were accepted before skips bcrypt, a client address that keeps
// failing is refused before bcrypt runs, and the file is parsed again only
// when it changes (the toolkit parsed it on every request).

// webConfigSource is the parsed --web.config.file, re-read when the file
// changes (looked at most once a second), so rotated certificates and
// passwords need no restart.
type webConfigSource struct {
	path string
	log  zerolog.Logger

	mu      sync.Mutex
	checked time.Time
	modTime time.Time
	size    int64
	cfg     *webConfig
}

// webConfig is a parsed web config with its users as plain strings.
type webConfig struct {
	*web.Config
	users map[string]string
}

func newWebConfigSource(path string, log zerolog.Logger) (*webConfigSource, error) {
	s := &webConfigSource{path: path, log: log}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	cfg, err := loadWebConfig(path)
	if err != nil {
		return nil, err
	}
	s.cfg, s.modTime, s.size, s.checked = cfg, fi.ModTime(), fi.Size(), time.Now()
	return s, nil
}

// get returns the current config; a file that became invalid is logged and
// the last good config kept.
func (s *webConfigSource) get() *webConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < time.Second {
		return s.cfg
	}
	s.checked = time.Now()
	fi, err := os.Stat(s.path)
	if err != nil || (fi.ModTime().Equal(s.modTime) && fi.Size() == s.size) {
		return s.cfg
	}
	s.loadLocked(fi, "file changed")
	return s.cfg
}

// reload reads the file again whether or not it looks changed (SIGHUP).
func (s *webConfigSource) reload(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checked = time.Now()
	fi, err := os.Stat(s.path)
	if err != nil {
		s.log.Error().Err(err).Str("file", s.path).Str("reason", reason).Msg("the web config cannot be read; keeping the last good one")
		return
	}
	s.loadLocked(fi, reason)
}

// loadLocked parses the file and keeps it if valid; under s.mu.
func (s *webConfigSource) loadLocked(fi os.FileInfo, reason string) {
	cfg, err := loadWebConfig(s.path)
	if err == nil {
		err = web.Validate(s.path)
	}
	if err != nil {
		s.log.Error().Err(err).Str("file", s.path).Str("reason", reason).Msg("the web config changed and is invalid; keeping the last good one")
		return
	}
	s.cfg, s.modTime, s.size = cfg, fi.ModTime(), fi.Size()
	s.log.Info().Str("file", s.path).Str("reason", reason).Msg("web config reloaded")
}

// loadWebConfig parses a web config as exporter-toolkit does (strict YAML,
// its defaults, paths relative to the file), refusing big files first.
func loadWebConfig(path string) (*webConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxWebConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxWebConfigBytes {
		return nil, fmt.Errorf("%s is larger than the limit of %d bytes", path, maxWebConfigBytes)
	}
	c := &web.Config{
		TLSConfig:  web.TLSConfig{MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS13},
		HTTPConfig: web.HTTPConfig{HTTP2: true},
	}
	if err := yaml.UnmarshalStrict(data, c); err != nil {
		return nil, err
	}
	c.TLSConfig.SetDirectory(filepath.Dir(path))
	users := make(map[string]string, len(c.Users))
	for u, p := range c.Users {
		users[u] = string(p)
	}
	return &webConfig{Config: c, users: users}, nil
}

// Failed logins per client address: a burst of failBurst, then one more
// every failRefill. Checked before bcrypt runs.
const (
	failBurst      = 5
	failRefill     = 10 * time.Second
	maxFailClients = 4096 // addresses remembered; the fullest buckets go first
	maxGoodLogins  = 64   // distinct accepted credentials remembered

	// bcrypt work waits in a bounded queue: at most bcryptQueue attempts
	// wait for a slot, each at most bcryptWait (well under Prometheus'
	// 10 s scrape timeout), and the rest are refused at once with 503 and
	// Retry-After, so a flood from many addresses costs at most the slots'
	// CPU and never an unbounded queue of goroutines and waits.
	bcryptQueue      = 16
	bcryptWait       = 2 * time.Second
	bcryptRetryAfter = 2 // seconds

	// An address that comes back within busyCooldown of an attempt turned
	// away with bcrypt busy waits among the failing addresses: a scraper
	// asks once per scrape interval (Prometheus' shortest is a second), a
	// flood at once again, so a flood from many addresses that were only
	// turned away (never checked, so never failed) cannot keep a scraper
	// that has not logged in yet out of the queue.
	busyCooldown = time.Second
)

// authenticator checks basic auth against the web config's bcrypt hashes.
// What cannot cost bcrypt is served first: credentials accepted before
// never wait for a bcrypt slot, and a slot that frees goes to an attempt
// from a clean address (no recent failure, and not back at once after
// being turned away) before one from another address; a full queue makes
// room for the former by refusing the newest of the latter.
type authenticator struct {
	now     func() time.Time
	compare func(hash, pass []byte) error // bcrypt.CompareHashAndPassword; a fake in tests
	wait    time.Duration                 // longest wait for a bcrypt slot
	queue   int                           // most attempts waiting for a slot

	mu    sync.Mutex
	good  map[[sha256.Size]byte]struct{} // credentials (with the hash they matched) accepted before
	fails map[string]*failBucket         // client address -> failed attempts
	free  int                            // bcrypt slots free
	clean []*bcryptWaiter                // waiting, from addresses with no recent failure (FIFO)
	dirty []*bcryptWaiter                // waiting, from addresses that failed recently (FIFO)

	refused atomic.Int64 // attempts refused before bcrypt, for tests and logs
	busy    atomic.Int64 // attempts refused because bcrypt was busy
}

// bcryptWaiter is one attempt waiting for a bcrypt slot; done is closed
// when it is given a slot (granted) or pushed out of the queue.
type bcryptWaiter struct {
	done    chan struct{}
	granted bool
}

type failBucket struct {
	tokens float64
	at     time.Time
	busyAt time.Time // an attempt was last turned away with bcrypt busy
}

// cleanLocked: b has no recent failure and was not turned away within
// busyCooldown.
func (a *authenticator) cleanLocked(b *failBucket) bool {
	return b.tokens >= failBurst && a.now().Sub(b.busyAt) >= busyCooldown
}

func newAuthenticator() *authenticator {
	return &authenticator{now: time.Now, compare: bcrypt.CompareHashAndPassword,
		wait: bcryptWait, queue: bcryptQueue, free: max(1, min(2, runtime.GOMAXPROCS(0))),
		good: map[[sha256.Size]byte]struct{}{}, fails: map[string]*failBucket{}}
}

// acquire waits for a bcrypt slot; false if none came within a.wait, the
// queue was full, or the request ended. Under a.mu on entry; returns with
// a.mu unlocked.
func (a *authenticator) acquireLocked(r *http.Request, clean bool) bool {
	if a.free > 0 && len(a.clean)+len(a.dirty) == 0 {
		a.free--
		a.mu.Unlock()
		return true
	}
	if len(a.clean)+len(a.dirty) >= a.queue {
		if !clean || len(a.dirty) == 0 {
			a.mu.Unlock()
			return false
		}
		last := a.dirty[len(a.dirty)-1] // make room: the newest attempt from a failing address goes
		a.dirty = a.dirty[:len(a.dirty)-1]
		close(last.done)
	}
	w := &bcryptWaiter{done: make(chan struct{})}
	if clean {
		a.clean = append(a.clean, w)
	} else {
		a.dirty = append(a.dirty, w)
	}
	a.mu.Unlock()

	t := time.NewTimer(a.wait)
	defer t.Stop()
	select {
	case <-w.done:
	case <-t.C:
	case <-r.Context().Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted {
		return true
	}
	a.clean = removeWaiter(a.clean, w)
	a.dirty = removeWaiter(a.dirty, w)
	return false
}

// release hands the slot to the first clean waiter, else the first dirty
// one, else frees it.
func (a *authenticator) release() {
	a.mu.Lock()
	defer a.mu.Unlock()
	var w *bcryptWaiter
	switch {
	case len(a.clean) > 0:
		w, a.clean = a.clean[0], a.clean[1:]
	case len(a.dirty) > 0:
		w, a.dirty = a.dirty[0], a.dirty[1:]
	default:
		a.free++
		return
	}
	w.granted = true
	close(w.done)
}

func removeWaiter(q []*bcryptWaiter, w *bcryptWaiter) []*bcryptWaiter {
	for i, x := range q {
		if x == w {
			return append(q[:i], q[i+1:]...)
		}
	}
	return q
}

// waiting is how many attempts wait for a bcrypt slot (for tests).
func (a *authenticator) waiting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.clean) + len(a.dirty)
}

// This is a bcrypt hash of "fakepassword" (exporter-toolkit's): an unknown
// user costs as much time as a known one, so timing tells no user names.
const unknownUserHash = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"

// check answers 0 if the request may pass, else the status to refuse it with.
func (a *authenticator) check(users map[string]string, r *http.Request) int {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return http.StatusUnauthorized
	}
	hash, known := users[user]
	if !known {
		hash = unknownUserHash
	}
	h := sha256.New()
	for _, s := range []string{user, pass, hash} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	var key [sha256.Size]byte
	h.Sum(key[:0])
	client := clientAddress(r)

	a.mu.Lock()
	if _, ok := a.good[key]; ok && known {
		a.mu.Unlock()
		return 0
	}
	// An attempt is taken from the address's budget before bcrypt runs
	// (and given back if it succeeds), so concurrent attempts cannot
	// overdraw it.
	b := a.bucketLocked(client)
	if b.tokens < 1 {
		a.mu.Unlock()
		a.refused.Add(1)
		return http.StatusTooManyRequests
	}
	clean := a.cleanLocked(b)
	b.tokens--
	if !a.acquireLocked(r, clean) {
		// Refused unseen: the attempt is given back, so a scraper turned
		// away while bcrypt is busy does not count as failing.
		a.mu.Lock()
		if b := a.fails[client]; b != nil {
			b.tokens = min(failBurst, b.tokens+1)
			b.busyAt = a.now()
		}
		a.mu.Unlock()
		a.busy.Add(1)
		return http.StatusServiceUnavailable
	}
	err := a.compare([]byte(hash), []byte(pass))
	a.release()

	a.mu.Lock()
	defer a.mu.Unlock()
	if err == nil && known {
		if len(a.good) >= maxGoodLogins {
			clear(a.good)
		}
		a.good[key] = struct{}{}
		if b := a.fails[client]; b != nil {
			b.tokens = min(failBurst, b.tokens+1)
		}
		return 0
	}
	return http.StatusUnauthorized
}

func (a *authenticator) refillLocked(b *failBucket) {
	now := a.now()
	b.tokens = min(failBurst, b.tokens+float64(now.Sub(b.at))/float64(failRefill))
	b.at = now
}

// bucketLocked is client's budget of attempts, refilled to now.
func (a *authenticator) bucketLocked(client string) *failBucket {
	b := a.fails[client]
	if b == nil {
		if len(a.fails) >= maxFailClients {
			for k, x := range a.fails { // forget the addresses that have recovered
				if a.refillLocked(x); a.cleanLocked(x) {
					delete(a.fails, k)
				}
			}
			for k := range a.fails { // still full: forget half, any
				if len(a.fails) < maxFailClients/2 {
					break
				}
				delete(a.fails, k)
			}
		}
		b = &failBucket{tokens: failBurst, at: a.now()}
		a.fails[client] = b
	}
	a.refillLocked(b)
	return b
}

// clientAddress is the client's IP address (no port: one client, many connections).
func clientAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// webHandler applies the web config to every request: its headers, its
// rate limit and basic auth.
type webHandler struct {
	src     *webConfigSource
	auth    *authenticator
	limiter *rate.Limiter
	next    http.Handler
}

func (h *webHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.src.get()
	if h.limiter != nil && !h.limiter.Allow() {
		http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
		return
	}
	for k, v := range c.HTTPConfig.Header {
		w.Header().Set(k, v)
	}
	if len(c.users) > 0 {
		code := h.auth.check(c.users, r)
		markLoginRefused(r, code != 0)
		switch code {
		case 0:
		case http.StatusTooManyRequests:
			w.Header().Set("Retry-After", fmt.Sprint(int(failRefill.Seconds())))
			http.Error(w, "too many failed logins from this address; try again later", code)
			return
		case http.StatusServiceUnavailable:
			w.Header().Set("Retry-After", fmt.Sprint(bcryptRetryAfter))
			http.Error(w, "too many logins being checked; try again later", code)
			return
		default:
			w.Header().Set("WWW-Authenticate", "Basic")
			http.Error(w, http.StatusText(code), code)
			return
		}
	}
	h.next.ServeHTTP(w, r)
}

// connKey is the context key of the connection a request came on.
type connKey struct{}

// withConn is the servers' ConnContext hook: it lets a handler reach the
// connection its request came on.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// markLoginRefused records on r's connection whether its last login was
// refused (a wrong password, or refused before bcrypt): at the connection
// cap such a connection gives way first, even with a request in flight.
func markLoginRefused(r *http.Request, refused bool) {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if lc, ok := c.(*limitedConn); ok {
		lc.refused.Store(refused)
	}
}

// limitListener keeps at most n connections open. At the cap, a new
// connection closes one whose last login was refused, even with a request
// in flight (a client sending wrong passwords), or else one that is not
// serving a request (a client still sending its headers or its TLS
// handshake, or an idle keep-alive): the oldest of those from the client
// address holding the most connections; if all n are serving requests and
// none was refused, the new one is closed. So a flood of wrong passwords
// from more clients than the cap closes its own connections, not the
// scraper's idle keep-alive. So slow clients hold
// at most n connections, not the pod's memory, and cannot hold them against
// a scraper: one address with thousands of connections loses them first,
// and the scraper's connection is the newest and sends its request at once.
// Accept never waits, so nothing queues in the kernel ahead of the scraper.
type limitListener struct {
	net.Listener
	max int

	mu     sync.Mutex
	conns  map[*limitedConn]struct{}
	byAddr map[string]int // open connections per client address
	peak   int
	evicts int64
}

func newLimitListener(l net.Listener, n int) net.Listener {
	if n <= 0 {
		return l
	}
	return &limitListener{Listener: l, max: n, conns: map[*limitedConn]struct{}{}, byAddr: map[string]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc := &limitedConn{Conn: c, l: l, since: time.Now(), addr: hostOf(c.RemoteAddr())}
		l.mu.Lock()
		if len(l.conns) >= l.max {
			var victim *limitedConn
			victimRefused := false
			for x := range l.conns {
				refused := x.refused.Load()
				if st := http.ConnState(x.state.Load()); !refused && st != http.StateNew && st != http.StateIdle {
					continue
				}
				if victim == nil || (refused && !victimRefused) || (refused == victimRefused &&
					(l.byAddr[x.addr] > l.byAddr[victim.addr] ||
						(l.byAddr[x.addr] == l.byAddr[victim.addr] && x.since.Before(victim.since)))) {
					victim, victimRefused = x, refused
				}
			}
			if victim == nil { // every connection is serving a request
				l.mu.Unlock()
				c.Close()
				continue
			}
			l.removeLocked(victim)
			l.evicts++
			go victim.Conn.Close()
		}
		l.conns[lc] = struct{}{}
		l.byAddr[lc.addr]++
		l.peak = max(l.peak, len(l.conns))
		l.mu.Unlock()
		return lc, nil
	}
}

func (l *limitListener) removeLocked(c *limitedConn) {
	if _, ok := l.conns[c]; !ok {
		return
	}
	delete(l.conns, c)
	if l.byAddr[c.addr]--; l.byAddr[c.addr] <= 0 {
		delete(l.byAddr, c.addr)
	}
}

func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}

// stats is the open connections, the most ever open and the evictions.
func (l *limitListener) stats() (open, peak int, evicts int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns), l.peak, l.evicts
}

type limitedConn struct {
	net.Conn
	l     *limitListener
	addr  string       // client address
	state atomic.Int32 // http.ConnState, from the server's ConnState hook
	// refused: the last login on it was refused (markLoginRefused)
	refused atomic.Bool
	since   time.Time // when it entered that state; under l.mu
}

func (c *limitedConn) Close() error {
	c.l.mu.Lock()
	c.l.removeLocked(c)
	c.l.mu.Unlock()
	return c.Conn.Close()
}

// trackConnState is the servers' ConnState hook: it tells each limited
// connection whether it is serving a request.
func trackConnState(c net.Conn, s http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	lc.state.Store(int32(s))
	if s == http.StateIdle {
		lc.l.mu.Lock()
		lc.since = time.Now() // idle since now: oldest idle goes first
		lc.l.mu.Unlock()
	}
}

// serveWeb serves srv on every listener, with TLS and basic auth from the
// web config when there is one, until the server is shut down. Each value
// on hup (SIGHUP) reads the web config again, as a change of the file does.
func serveWeb(listeners []net.Listener, srv *http.Server, configFile string, hup <-chan os.Signal, log zerolog.Logger) error {
	useTLS := false
	var src *webConfigSource
	if configFile != "" {
		var err error
		src, err = newWebConfigSource(configFile, log)
		if err != nil {
			return err
		}
		c := src.get()
		h := &webHandler{src: src, auth: newAuthenticator(), next: srv.Handler}
		if c.RateLimiterConfig.Interval != 0 {
			h.limiter = rate.NewLimiter(rate.Every(c.RateLimiterConfig.Interval), c.RateLimiterConfig.Burst)
		}
		srv.Handler = refuseUnservable(h) // refused before a login is checked
		if c.TLSConfig.IsEnabled() {
			tc, err := web.ConfigToTLSConfig(&c.TLSConfig)
			if err != nil {
				return err
			}
			http2 := c.HTTPConfig.HTTP2
			if !http2 {
				srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
			}
			// Certificates and TLS settings are read again for every
			// connection (the file when it changed), so rotation needs no restart.
			tc.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
				cur := src.get()
				next, err := web.ConfigToTLSConfig(&cur.TLSConfig)
				if err != nil {
					return nil, err
				}
				if http2 {
					next.NextProtos = []string{"h2", "http/1.1"}
				} else {
					next.NextProtos = []string{"http/1.1"}
				}
				return next, nil
			}
			srv.TLSConfig = tc
			useTLS = true
		}
	}
	stopHUP := make(chan struct{})
	defer close(stopHUP)
	// Started once src is set: the goroutine reads it.
	go func() {
		for {
			select {
			case <-hup:
				if src == nil {
					log.Info().Msg("SIGHUP received: nothing to reload without --web.config.file")
					continue
				}
				log.Info().Str("file", configFile).Msg("SIGHUP received: reloading the web config")
				src.reload("SIGHUP")
			case <-stopHUP:
				return
			}
		}
	}()
	errs := make(chan error, len(listeners))
	for _, l := range listeners {
		go func() {
			if useTLS {
				errs <- srv.ServeTLS(l, "", "")
			} else {
				errs <- srv.Serve(l)
			}
		}()
	}
	var first error
	for range listeners {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
		if first != nil && !errors.Is(first, http.ErrServerClosed) {
			return first
		}
	}
	return first
}
