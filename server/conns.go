package server

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// What the server holds for a client, charged to its memory budget: upper
// estimates of what Go's HTTP server keeps (docs/performance.md has the
// measurements and how to repeat them).
const (
	connBytes    = 32 << 10  // an open connection: its goroutine, read and write buffers
	tlsConnBytes = 64 << 10  // more with TLS: record buffers, handshake and cipher state
	h2ConnBytes  = 128 << 10 // more once it speaks HTTP/2: framer, HPACK tables, write scheduler, a second goroutine
	requestBytes = 16 << 10  // a request or HTTP/2 stream being served (its goroutine and response buffer), plus its headers

	// DefaultMemoryBudget is what the server may hold for its clients, all
	// listeners together: with the exporter's own 25-35 MiB and Go's
	// garbage collector's headroom it stays under the chart's 100 MiB.
	DefaultMemoryBudget = 24 << 20
)

// A connection whose writes have waited stallGrace with none of them
// done is making no progress: a client that stopped reading (a full TCP
// window, an HTTP/2 stream held at window 0) or reads a trickle (a write
// of writeChunk bytes then takes seconds). A scraper's writes end in
// milliseconds; over a slow link a chunk still ends well within this.
const stallGrace = time.Second

// With basic auth, a login being checked (a request without accepted
// credentials) gets requestGrace before a newcomer without credentials
// may push its connection out; such a newcomer is refused instead. Under a
// flood of logins at the cap, a scraper's first login would otherwise go
// while it waits for bcrypt, as the flood's connections come and go
// around it; the flood's own logins wait up to bcryptWait.
const requestGrace = time.Second

// A client address whose credentials were accepted within trustFor is
// trusted: its new connections (at most trustedConns of them open) count as
// having credentials from their accept, until a login on them is refused,
// so that a scraper reconnecting during a flood of logins from other
// addresses is not shed before its first request is read. At most
// maxTrusted addresses are remembered, the longest unseen forgotten first.
const (
	trustFor     = 10 * time.Minute
	trustedConns = 4
	maxTrusted   = 256
)

// Shed order at a cap (the listener's connections, the memory budget): the
// lowest tier goes first. With basic auth, a connection without accepted
// credentials goes before any with; a connection serving a request that
// makes progress is shed only if it has no credentials and basic auth
// asks for them, and within requestGrace only for one with credentials.
const (
	tierNoProgress       = iota // no credentials; its writes stall, or its last login was refused
	tierIdle                    // no credentials; no request being served (TLS handshake, headers, keep-alive)
	tierUnauthServing           // basic auth is on, no credentials accepted yet; a login being checked for requestGrace or more
	tierUnauthRecent            // the same, for less than requestGrace
	tierAuthedNoProgress        // credentials accepted on it, but its writes stall
	tierAuthedIdle              // credentials accepted on it; no request being served
	tierServing                 // serving a request that makes progress: never shed
)

// tracker keeps every connection of a server (all its listeners), what each
// costs and how it does, within the memory budget and each listener's cap.
type tracker struct {
	budget int64
	now    func() time.Time
	auth   atomic.Bool // basic auth is on: clients without credentials go first

	mu      sync.Mutex
	used    int64 // bytes charged
	peak    int64 // most bytes ever charged
	conns   map[*trackedConn]struct{}
	byAddr  map[string]int       // open connections per client address
	trusted map[string]time.Time // client address -> when its credentials were last accepted
	shed    int64                // connections closed to make room
	refused int64                // connections and requests refused for want of room
}

func newTracker(budget int64) *tracker {
	if budget <= 0 {
		budget = DefaultMemoryBudget
	}
	return &tracker{budget: budget, now: time.Now, conns: map[*trackedConn]struct{}{}, byAddr: map[string]int{}, trusted: map[string]time.Time{}}
}

// trackerStats are a tracker's figures, for tests.
type trackerStats struct {
	open                int
	used, peak          int64
	shed, refused       int64
	serving, noProgress int
}

func (t *tracker) stats() trackerStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := trackerStats{open: len(t.conns), used: t.used, peak: t.peak, shed: t.shed, refused: t.refused}
	now := t.now()
	for c := range t.conns {
		switch c.tier(now) {
		case tierServing:
			s.serving++
		case tierNoProgress, tierAuthedNoProgress:
			s.noProgress++
		}
	}
	return s
}

// listen wraps l: at most limit connections (0: no cap), each charged to the
// budget, TLS ones more.
func (t *tracker) listen(l net.Listener, limit int, tls bool) *capListener {
	return &capListener{Listener: l, t: t, max: limit, tls: tls}
}

// stats is l's open connections and the most ever open.
func (l *capListener) stats() (open, peak int) {
	l.t.mu.Lock()
	defer l.t.mu.Unlock()
	return l.open, l.peak
}

// capListener is one listener of a tracker. Accept never waits for room:
// it sheds a connection or closes the new one, so nothing queues in the
// kernel ahead of the scraper.
type capListener struct {
	net.Listener
	t      *tracker
	max    int
	tls    bool
	noAuth bool // serves without basic auth (the probe listener)
	open   int  // under t.mu
	peak   int  // under t.mu
}

func (l *capListener) Accept() (net.Conn, error) {
	t := l.t
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		now := t.now()
		tc := &trackedConn{Conn: c, l: l, addr: hostOf(c.RemoteAddr()), since: now, cost: connBytes}
		if l.tls {
			tc.cost += tlsConnBytes
		}
		t.mu.Lock()
		tc.trusted = !l.noAuth && t.trustedLocked(tc.addr, now)
		ok := t.makeRoomLocked(l, tc.cost, tc, now)
		if ok {
			t.conns[tc] = struct{}{}
			t.byAddr[tc.addr]++
			t.used += tc.cost
			t.peak = max(t.peak, t.used)
			l.open++
			l.peak = max(l.peak, l.open)
		} else {
			t.refused++
		}
		t.mu.Unlock()
		if !ok { // every connection is serving and making progress
			c.Close()
			continue
		}
		return tc, nil
	}
}

// makeRoomLocked sheds connections until l (nil: no listener cap) has room
// for one more connection and the budget for bytes more, for the sake of
// connection want (new, or one with a request to serve). False if there is
// nothing to shed, or only connections from want's own address: a client
// does not push out its own connections, it is refused instead, which
// costs nothing (no TLS handshake, no state) where a swap would cost both.
func (t *tracker) makeRoomLocked(l *capListener, bytes int64, want *trackedConn, now time.Time) bool {
	for l != nil && l.max > 0 && l.open >= l.max {
		if !t.shedOneLocked(l, want, now) {
			return false
		}
	}
	for t.used+bytes > t.budget {
		if !t.shedOneLocked(nil, want, now) {
			return false
		}
	}
	return true
}

// shedOneLocked closes the connection that goes first (of listener l, or
// of any listener): the lowest tier, then the client address holding the
// most connections, then the one longest in its state. A connection with
// credentials goes only for another with credentials. False if there is
// none to shed, or it would be one of want's address.
func (t *tracker) shedOneLocked(l *capListener, want *trackedConn, now time.Time) bool {
	limit := tierServing // tiers below it may go
	if !want.credentialed() {
		limit = tierUnauthRecent
	}
	var victim *trackedConn
	vtier := limit
	for c := range t.conns {
		if c == want || (l != nil && c.l != l) {
			continue
		}
		tier := c.tier(now)
		if tier >= limit {
			continue
		}
		if victim == nil || tier < vtier || (tier == vtier && (t.byAddr[c.addr] > t.byAddr[victim.addr] ||
			(t.byAddr[c.addr] == t.byAddr[victim.addr] && c.sinceLocked().Before(victim.sinceLocked())))) {
			victim, vtier = c, tier
		}
	}
	if victim == nil || victim.addr == want.addr {
		return false
	}
	t.removeLocked(victim)
	t.shed++
	go victim.Conn.Close()
	return true
}

// trustedLocked: addr's credentials were accepted within trustFor, and it
// holds fewer than trustedConns connections.
func (t *tracker) trustedLocked(addr string, now time.Time) bool {
	at, ok := t.trusted[addr]
	return ok && now.Sub(at) < trustFor && t.byAddr[addr] < trustedConns
}

// trustLocked remembers that addr's credentials were accepted now.
func (t *tracker) trustLocked(addr string, now time.Time) {
	if _, ok := t.trusted[addr]; !ok && len(t.trusted) >= maxTrusted {
		oldest := ""
		for a, at := range t.trusted {
			if oldest == "" || at.Before(t.trusted[oldest]) {
				oldest = a
			}
		}
		delete(t.trusted, oldest)
	}
	t.trusted[addr] = now
}

func (t *tracker) removeLocked(c *trackedConn) {
	if _, ok := t.conns[c]; !ok {
		return
	}
	c.released = true
	delete(t.conns, c)
	if t.byAddr[c.addr]--; t.byAddr[c.addr] <= 0 {
		delete(t.byAddr, c.addr)
	}
	t.used -= c.cost
	c.l.open--
}

// startRequest charges a request of cost bytes to c (the first HTTP/2
// request also its HTTP/2 state). Over the budget it sheds other
// connections; false if there is no room and c has no credentials: the
// request is to be refused. A connection with credentials is served
// whatever the budget.
func (t *tracker) startRequest(c *trackedConn, cost int64, h2 bool) bool {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if h2 && !c.h2 {
		cost += h2ConnBytes
	}
	if !t.makeRoomLocked(nil, cost, c, now) && !c.authed {
		t.refused++
		return false
	}
	if h2 && !c.h2 {
		c.h2 = true
		cost -= h2ConnBytes
		c.addCostLocked(h2ConnBytes)
	}
	c.addCostLocked(cost)
	if c.handlers == 0 {
		c.since = now // serving since now: a login's requestGrace starts
	}
	c.handlers++
	return true
}

// endRequest gives a request's charge back.
func (t *tracker) endRequest(c *trackedConn, cost int64) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	c.addCostLocked(-cost)
	if c.handlers--; c.handlers == 0 {
		c.since = now // idle since now: the oldest idle goes first
	}
}

// trackedConn is a connection of a capListener. Its writes each get a
// deadline (see Write) and their progress is watched.
type trackedConn struct {
	net.Conn
	l    *capListener
	addr string // client address

	// Under l.t.mu:
	cost     int64     // bytes charged
	since    time.Time // opened, or last became idle or began serving
	handlers int       // requests being served on it
	h2       bool      // HTTP/2 state charged
	authed   bool      // credentials were accepted on it
	trusted  bool      // from an address whose credentials were accepted lately (trustedLocked)
	refused  bool      // its last login was refused
	released bool      // no longer counted (closed, shed, or half-closed by the server)

	raw    progress // its own writes
	stream progress // the writes of its HTTP/2 streams (a stream at window 0 writes nothing to the connection)

	dl             sync.Mutex
	serverDeadline time.Time // the write deadline the HTTP server asked for
}

// addCostLocked changes c's charge (while it is counted).
func (c *trackedConn) addCostLocked(n int64) {
	if c.released {
		return
	}
	c.cost += n
	c.l.t.used += n
	c.l.t.peak = max(c.l.t.peak, c.l.t.used)
}

func (c *trackedConn) sinceLocked() time.Time {
	if s := c.raw.stalledSince(); !s.IsZero() {
		return s
	}
	if s := c.stream.stalledSince(); !s.IsZero() {
		return s
	}
	return c.since
}

// credentialed: c's credentials were accepted, or it comes from a trusted
// address and no login on it was refused; under l.t.mu.
func (c *trackedConn) credentialed() bool {
	return c.authed || (c.trusted && !c.refused)
}

// tier is c's place in the shed order; under l.t.mu.
func (c *trackedConn) tier(now time.Time) int {
	stalled := c.raw.stalled(now) || c.stream.stalled(now)
	auth := c.l.t.auth.Load() && !c.l.noAuth
	authed := c.credentialed()
	recent := now.Sub(c.since) < requestGrace
	switch {
	case authed && stalled:
		return tierAuthedNoProgress
	case authed && c.handlers == 0:
		return tierAuthedIdle
	case authed:
		return tierServing
	case stalled || c.refused:
		return tierNoProgress
	case c.handlers == 0:
		return tierIdle
	case auth && recent:
		return tierUnauthRecent
	case auth:
		return tierUnauthServing
	}
	return tierServing
}

// Write gives every write of the connection a deadline of writeStall (or
// the server's own, if sooner), so no answer, frame or handshake waits
// longer for a client that does not read; HTTP/2 connections have no
// deadline of the server's once their handshake is done.
func (c *trackedConn) Write(b []byte) (int, error) {
	now := time.Now()
	d := now.Add(writeStall)
	c.dl.Lock()
	if !c.serverDeadline.IsZero() && c.serverDeadline.Before(d) {
		d = c.serverDeadline
	}
	c.dl.Unlock()
	_ = c.Conn.SetWriteDeadline(d)
	c.raw.start(now)
	n, err := c.Conn.Write(b)
	c.raw.done(time.Now(), n)
	return n, err
}

func (c *trackedConn) SetWriteDeadline(t time.Time) error {
	c.dl.Lock()
	c.serverDeadline = t
	c.dl.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *trackedConn) SetDeadline(t time.Time) error {
	c.dl.Lock()
	c.serverDeadline = t
	c.dl.Unlock()
	return c.Conn.SetDeadline(t)
}

// CloseWrite is how the HTTP server ends a connection it will read no more
// from (after a 431, or a request body it refuses): it then waits 500 ms
// before closing, so that the client reads the answer. The connection
// leaves the cap and the budget now, not after that wait.
func (c *trackedConn) CloseWrite() error {
	c.release()
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *trackedConn) Close() error {
	c.release()
	return c.Conn.Close()
}

func (c *trackedConn) release() {
	t := c.l.t
	t.mu.Lock()
	t.removeLocked(c)
	t.mu.Unlock()
}

// progress watches a connection's writes: how many wait, and when one
// last ended having written something (or, if none had, when they began).
type progress struct {
	mu      sync.Mutex
	pending int       // writes in progress
	last    time.Time // last progress
}

func (p *progress) start(now time.Time) {
	p.mu.Lock()
	if p.pending == 0 {
		p.last = now
	}
	p.pending++
	p.mu.Unlock()
}

func (p *progress) done(now time.Time, n int) {
	p.mu.Lock()
	p.pending--
	if n > 0 {
		p.last = now
	}
	p.mu.Unlock()
}

// stalled: writes wait, and none has made progress for stallGrace.
func (p *progress) stalled(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending > 0 && now.Sub(p.last) >= stallGrace
}

// stalledSince is the last progress if writes are pending; else zero.
func (p *progress) stalledSince() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == 0 {
		return time.Time{}
	}
	return p.last
}

func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	return a.String()
}

// connKey is the context key of the connection a request came on.
type connKey struct{}

// withConn is the servers' ConnContext hook: it lets a handler reach the
// connection its request came on.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// connOf is the tracked connection r came on; nil if it has none.
func connOf(r *http.Request) *trackedConn {
	c, _ := r.Context().Value(connKey{}).(net.Conn)
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	tc, _ := c.(*trackedConn)
	return tc
}

// markLogin records on r's connection how its last login went: a
// connection whose login was refused gives way first at a cap, even with a
// request in flight; one whose credentials were accepted is shed only
// after every connection without.
func markLogin(r *http.Request, accepted bool) {
	c := connOf(r)
	if c == nil {
		return
	}
	t := c.l.t
	t.mu.Lock()
	c.refused = !accepted
	c.authed = c.authed || accepted
	if accepted {
		t.trustLocked(c.addr, t.now())
	}
	t.mu.Unlock()
}
