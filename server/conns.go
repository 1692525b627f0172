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

// Shed order at a cap (the listener's connections, the memory budget): the
// lowest tier goes first. A connection without accepted credentials
// making no progress goes first, then, with basic auth, every connection
// without accepted credentials that a newcomer without them may push out,
// and only then one with accepted credentials that makes no progress:
// accepted credentials (a stolen password) are no licence to hold what
// others need, but a logged-in client whose writes lag for a moment (a
// loaded node) does not lose its connection to an attacker who holds no
// credentials while any of that attacker's connections could go instead.
// A connection serving a request that makes progress is shed only if it
// has no credentials and basic auth asks for them, and within requestGrace
// only for one with credentials. Which addresses may push out which:
// shedOneLocked.
const (
	tierNoProgress       = iota // no credentials; its writes stall, or its last login was refused
	tierIdle                    // no credentials; no request being served (TLS handshake, headers, keep-alive)
	tierUnauthServing           // basic auth is on, no credentials accepted yet; a login being checked for requestGrace or more
	tierAuthedNoProgress        // credentials accepted on it, but its writes stall
	tierUnauthRecent            // basic auth is on, no credentials accepted yet; a login being checked for less than requestGrace
	tierAuthedIdle              // credentials accepted on it; no request being served
	tierServing                 // serving a request that makes progress: never shed
)

// tracker keeps every connection of a server (all its listeners), what each
// costs and how it does, within the memory budget and each listener's cap.
type tracker struct {
	budget int64
	now    func() time.Time
	auth   atomic.Bool // basic auth is on: clients without credentials go first
	// netLoad is how many login attempts a client address's networks
	// have made lately, in orders of magnitude (authenticator.networkLoad);
	// nil: none counted.
	netLoad func(addr string) int

	mu      sync.Mutex
	used    int64 // bytes charged
	peak    int64 // most bytes ever charged
	conns   map[*trackedConn]struct{}
	byAddr  map[string]int       // open connections per client address
	byUser  map[string]int       // open connections per user whose credentials were accepted on them
	trusted map[string]time.Time // client address -> when its credentials were last accepted
	shed    int64                // connections closed to make room
	refused int64                // connections and requests refused for want of room
}

func newTracker(budget int64) *tracker {
	if budget <= 0 {
		budget = DefaultMemoryBudget
	}
	return &tracker{budget: budget, now: time.Now, conns: map[*trackedConn]struct{}{}, byAddr: map[string]int{}, byUser: map[string]int{}, trusted: map[string]time.Time{}}
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
	boundListenerBuffers(l)
	return &capListener{Listener: l, t: t, max: limit, tls: tls}
}

// boundListenerBuffers gives a TCP listener's socket the send and receive
// buffers of an accepted connection: Linux copies them into the
// connections it accepts for it, so those waiting in the accept queue are
// bounded too, and the window a client is first offered is the small one.
// Its segment size clamp (maxSegmentBytes) holds for every connection it
// accepts from the handshake on.
func boundListenerBuffers(l net.Listener) {
	tl, ok := l.(*net.TCPListener)
	if !ok {
		return
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(boundSocketOptions)
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
		boundSocketBuffers(c)
		now := t.now()
		tc := &trackedConn{Conn: c, l: l, addr: hostOf(c.RemoteAddr()), since: now, cost: connBytes}
		if l.tls {
			tc.cost += tlsConnBytes
		}
		if t.netLoad != nil && !l.noAuth {
			tc.netLoad = t.netLoad(tc.addr)
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

// boundSocketBuffers caps the kernel's send and receive queues of a TCP
// connection (sendBufferBytes, receiveBufferBytes), which would otherwise
// grow to net.ipv4.tcp_wmem's maximum for a client that reads slowly.
func boundSocketBuffers(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(sendBufferBytes)
		_ = tc.SetReadBuffer(receiveBufferBytes)
	}
}

// makeRoomLocked sheds connections until l (nil: no listener cap) has room
// for one more connection and the budget for bytes more, for the sake of
// connection want (new, or one with a request to serve). False if there is
// nothing want may shed.
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
// of any listener): the lowest tier, then (with credentials) the user
// holding the most connections, then the client address holding the
// most, then the one whose networks have made the most login attempts
// lately, then the one longest in its state. A connection with credentials
// that makes progress goes only for another with credentials. An address
// takes room only from an address holding at least as many connections as
// it would, never from one holding fewer: a client reconnecting in a loop
// cannot push out, in the moment before its request is read, the
// connection of a scraper on another address. One exception: a newcomer
// with credentials takes the room of a connection without them from
// networks that have made more login attempts than its own (a password
// flood's), however many connections its own address holds.
//
// On the web listeners a new connection does not push out its own
// address's connections: it is refused instead, which costs an accept (no
// TLS handshake, no state), and its connections age until they stall and a
// scraper from another address may take their place; an address pushing
// out its own would keep its connections forever young. What a connection
// has shown may outrank its own address's others (outranksOwn): a request
// on a connection whose credentials were accepted, or that has had a whole
// answer taken and makes progress, takes the room of what that address
// holds without either, so an attacker sharing a scraper's address (a
// hostNetwork pod, SNAT) cannot starve the scraper's connection of the
// budget. On the probe listener (the kubelet's
// address may be an attacker's too: a hostNetwork pod, SNAT) the oldest
// connection without a whole request gives way to a new one, whatever its
// address: the kubelet sends its request with its connection, and
// probeHeaderTimeout ends the others within a second. False if there is
// none to shed.
func (t *tracker) shedOneLocked(l *capListener, want *trackedConn, now time.Time) bool {
	credentialed := want.credentialed()
	limit := tierServing // tiers below it may go
	if !credentialed {
		limit = tierUnauthRecent
	}
	// The newcomer's address's connections, itself included.
	holds := t.byAddr[want.addr]
	if _, counted := t.conns[want]; !counted {
		holds++
	}
	ownAddress := want.l != nil && want.l.noAuth
	victim := t.victimLocked(now, limit, func(c *trackedConn) bool {
		if c == want || (l != nil && c.l != l) {
			return false
		}
		if c.addr == want.addr {
			return ownAddress || outranksOwn(want, c, now)
		}
		if credentialed && !c.credentialed() && busierNetworks(c.netLoad, want.netLoad) {
			return true
		}
		return t.byAddr[c.addr] >= holds
	})
	if victim == nil {
		return false
	}
	t.shedLocked(victim)
	return true
}

// outranksOwn: a request on want may take the room of c, a connection
// from want's own address on a web listener, if want's own writes do not
// stall and either want's credentials were accepted and c has none (a
// password stolen from the address is bounded per user, maxConnsPerUser),
// or want has had a whole answer taken (a client that reads) while c makes
// no progress (its writes stall, or its last login was refused). Neither
// can be shown by a connection just accepted, so no newcomer takes its
// address's room: a client reconnecting in a loop still only costs
// accepts. And a connection that reads never gives way to its own
// address's others, so one that read an answer and then stalls its
// streams sheds nothing more.
func outranksOwn(want, c *trackedConn, now time.Time) bool {
	if !want.authed && !want.answered {
		return false
	}
	if wt := want.tier(now); wt == tierNoProgress || wt == tierAuthedNoProgress {
		return false
	}
	if want.authed && !c.credentialed() {
		return true
	}
	ct := c.tier(now)
	return want.answered && (ct == tierNoProgress || ct == tierAuthedNoProgress)
}

// victimLocked is the connection of those that may (below tier limit)
// that goes first; nil if none.
func (t *tracker) victimLocked(now time.Time, limit int, may func(*trackedConn) bool) *trackedConn {
	var victim *trackedConn
	vtier := limit
	for c := range t.conns {
		if !may(c) {
			continue
		}
		tier := c.tier(now)
		if tier >= limit {
			continue
		}
		if victim == nil || tier < vtier || (tier == vtier && t.goesBeforeLocked(c, victim)) {
			victim, vtier = c, tier
		}
	}
	return victim
}

// goesBeforeLocked: of two connections in the same tier, c goes before v:
// the user holding more connections, then the address holding more, then
// the one from networks with clearly more login attempts lately
// (busierNetworks: a password flood from many addresses, each holding one
// connection, before a scraper's first login from a network of its own),
// then the one longer in its state.
func (t *tracker) goesBeforeLocked(c, v *trackedConn) bool {
	if cu, vu := t.byUser[c.user], t.byUser[v.user]; cu != vu {
		return cu > vu
	}
	if ca, va := t.byAddr[c.addr], t.byAddr[v.addr]; ca != va {
		return ca > va
	}
	if busierNetworks(c.netLoad, v.netLoad) || busierNetworks(v.netLoad, c.netLoad) {
		return c.netLoad > v.netLoad
	}
	return c.sinceLocked().Before(v.sinceLocked())
}

// busierNetworks: networks whose login load is a (tracker.netLoad) made
// clearly more login attempts lately than those whose load is b, by
// netLoadMargin orders of magnitude or more. Below that margin the loads
// tell nothing apart: a scraper in the flood's own network has about the
// flood's load there, and its connection then goes by age, as any other.
func busierNetworks(a, b int) bool { return a >= b+netLoadMargin }

func (t *tracker) shedLocked(victim *trackedConn) {
	t.removeLocked(victim)
	t.shed++
	go victim.Conn.Close()
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
	t.setUserLocked(c, "")
	t.used -= c.cost
	c.l.open--
}

// setUserLocked counts c under user ("": none).
func (t *tracker) setUserLocked(c *trackedConn, user string) {
	if c.user == user {
		return
	}
	if c.user != "" {
		if t.byUser[c.user]--; t.byUser[c.user] <= 0 {
			delete(t.byUser, c.user)
		}
	}
	c.user = user
	if user != "" {
		t.byUser[user]++
	}
}

// startRequest charges a request of cost bytes to c (the first HTTP/2
// request also its HTTP/2 state). Over the budget it sheds other
// connections; false if there is still no room: the request is to be
// refused, credentials or not, so that nothing is held past the budget.
func (t *tracker) startRequest(c *trackedConn, cost int64, h2 bool) bool {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if !c.refusedAt.IsZero() && now.Sub(c.refusedAt) < refusedAgain {
		t.refused++ // refused a moment ago: refused again without looking for room
		return false
	}
	if h2 && !c.h2 {
		cost += h2ConnBytes
	}
	if !t.makeRoomLocked(nil, cost, c, now) {
		t.refused++
		c.refusedAt = now
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
	// netLoad is the login attempts of its networks when it was accepted,
	// in orders of magnitude (tracker.netLoad).
	netLoad int

	// Under l.t.mu:
	user      string    // the user whose credentials were last accepted on it ("": none)
	cost      int64     // bytes charged
	since     time.Time // opened, or last became idle or began serving
	handlers  int       // requests being served on it
	h2        bool      // HTTP/2 state charged
	authed    bool      // credentials were accepted on it
	trusted   bool      // from an address whose credentials were accepted lately (trustedLocked)
	refused   bool      // its last login was refused
	answered  bool      // an answer with a body was written whole on it: its client takes what it asks for
	refusedAt time.Time // when a request on it last found no room
	released  bool      // no longer counted (closed, shed, or half-closed by the server)

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

// progress watches a connection's writes: how many wait, and how far
// behind a pace of progressBytes a stallGrace they are.
type progress struct {
	mu      sync.Mutex
	pending int       // writes in progress
	last    time.Time // how far the writes have got: each byte written moves it on, up to now
	ended   time.Time // when a write last ended
}

// start: a write begins. Writes that follow one another closely (within
// stallGrace) are one stream of writes, whose progress is counted in
// bytes: a client taking a trickle (a small send buffer freeing a little
// at a time) falls behind, however often one of its small writes ends.
func (p *progress) start(now time.Time) {
	p.mu.Lock()
	if p.pending == 0 && now.Sub(p.ended) >= stallGrace {
		p.last = now
	}
	p.pending++
	p.mu.Unlock()
}

// done: a write of n bytes ended; every progressBytes move the writes
// stallGrace on.
func (p *progress) done(now time.Time, n int) {
	p.mu.Lock()
	p.pending--
	p.ended = now
	if p.last = p.last.Add(time.Duration(int64(n) * int64(stallGrace) / progressBytes)); p.last.After(now) {
		p.last = now
	}
	p.mu.Unlock()
}

// stalled: writes wait, and have fallen stallGrace behind a pace of
// progressBytes every stallGrace.
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

// markAnswered records that c had a successful answer to a GET written
// whole, its body included (guard): its client takes its answers
// (outranksOwn). A refusal has no body (refuse), and a client holding its
// HTTP/2 window at 0 takes none, the buffered rest of the answer included
// (guard flushes it first).
func (t *tracker) markAnswered(c *trackedConn) {
	t.mu.Lock()
	c.answered = true
	t.mu.Unlock()
}

// keepsOnRefusal: a request on c refused for want of room leaves c open:
// its credentials were accepted, or it has had a whole answer taken. Its
// next request may find room; closing it would leave its client to
// reconnect, and a new connection does not take its address's room. A
// client asking again and again on it costs a look for room at most every
// refusedAgain (startRequest).
func (t *tracker) keepsOnRefusal(c *trackedConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return c.authed || c.answered
}

// markLogin records on r's connection how its last login (as user) went:
// a connection whose login was refused gives way first at a cap, even with
// a request in flight; one whose credentials were accepted is shed after
// every connection without them, or, while its writes stall, after every
// one of those but a login still within its requestGrace. A user holding
// more than maxConnsPerUser connections gives up the one of them that goes
// first, serving or not: a thief reconnecting faster than its streams are
// seen to stall holds no more than the cap, and of a user's connections
// serving alike, those of the address holding the most go first.
func markLogin(r *http.Request, user string, accepted bool) {
	c := connOf(r)
	if c == nil {
		return
	}
	t := c.l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	c.refused = !accepted
	c.authed = c.authed || accepted
	if !accepted || c.released {
		return
	}
	now := t.now()
	t.trustLocked(c.addr, now)
	t.setUserLocked(c, user)
	for t.byUser[user] > maxConnsPerUser {
		v := t.victimLocked(now, tierServing+1, func(x *trackedConn) bool { return x != c && x.user == user })
		if v == nil {
			return
		}
		t.shedLocked(v)
	}
}
