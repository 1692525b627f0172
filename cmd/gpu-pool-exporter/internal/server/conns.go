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
