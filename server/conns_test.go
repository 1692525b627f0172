package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// testClock is a tracker's clock that moves only when told.
type testClock struct{ ns atomic.Int64 }

func (c *testClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *testClock) add(d time.Duration) { c.ns.Add(int64(d)) }
func newTestClock() *testClock           { c := &testClock{}; c.ns.Store(time.Unix(1e9, 0).UnixNano()); return c }

// acceptFrom is a tracker (budget bytes; 0: the default) on a clock that
// moves only when told, with one listener capped at limit, accepting in
// the background, and a dial that connects from a loopback address and
// returns the accepted connection.
func acceptFrom(t *testing.T, limit int, budget int64) (*tracker, func(ip string) *trackedConn, *testClock) {
	t.Helper()
	return acceptWithLoads(t, limit, budget, nil)
}

// acceptWithLoads is acceptFrom with basic auth on and the login load of
// each client address's networks (tracker.netLoad) given by loads (absent:
// none).
func acceptWithLoads(t *testing.T, limit int, budget int64, loads map[string]int) (*tracker, func(ip string) *trackedConn, *testClock) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(budget)
	if loads != nil {
		tr.auth.Store(true)
		tr.netLoad = func(addr string) int { return loads[addr] }
	}
	clock := newTestClock()
	tr.now = clock.now
	ll := tr.listen(l, limit, false)
	t.Cleanup(func() { ll.Close() })
	accepted := make(chan *trackedConn, 64)
	go func() {
		for {
			c, err := ll.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*trackedConn)
		}
	}()
	return tr, func(ip string) *trackedConn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		select {
		case tc := <-accepted:
			return tc
		case <-time.After(30 * time.Second): // liveness bound only
			t.Fatal("connection not accepted")
			return nil
		}
	}, clock
}

// open: c still counts at its tracker (not shed, not closed).
func open(tr *tracker, c *trackedConn) bool {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	_, ok := tr.conns[c]
	return ok
}

// The connection cap: slow clients that never finish a request hold at
// most the cap of connections; more from the same address are closed at
// once (they would only push out their own); a scraper from another
// address gets in (a slow client gives way) and keeps its connection while
// the slow clients keep coming, from their address or from others.
func TestConnectionCap(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(0)
	srv := newHTTPServer(guard(tr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })), zerolog.Nop())
	const limit = 8
	ll := tr.listen(l, limit, false)
	go func() { _ = srv.Serve(ll) }()
	defer srv.Close()

	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	slowFrom := func(ip string) net.Conn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")) // never finished
		slow = append(slow, c)
		return c
	}
	for i := 0; i < 5*limit; i++ {
		slowFrom("127.0.0.1")
	}
	waitUntil(t, "the slow clients past the cap to be refused", func() bool { return tr.stats().refused >= 4*limit })
	open, peak := ll.stats()
	if peak > limit || open > limit {
		t.Errorf("%d slow clients: %d connections open, %d at most; want at most the cap of %d", len(slow), open, peak, limit)
	}
	if c := slow[len(slow)-1]; !closedByServer(c) {
		t.Errorf("a slow client past the cap from the address holding it was not closed")
	}
	// A scraper from another address gets in: a slow client gives way.
	scraperDialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	sc, err := scraperDialer.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	waitUntil(t, "the scraper's connection to be accepted", func() bool { return tr.stats().shed == 1 })
	// More slow clients, from the same address and from a few others:
	// those from others push out the address holding the most, not the
	// scraper.
	for i := 0; i < limit/2; i++ {
		for j := 0; j < 4; j++ {
			slowFrom("127.0.0.1")
		}
		slowFrom(fmt.Sprintf("127.0.1.%d", i+1))
	}
	waitUntil(t, "the slow clients from other addresses to be accepted", func() bool { return tr.stats().shed >= 1+limit/2 })
	_, _ = sc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
	_ = sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, _ := io.ReadAll(sc); !strings.HasSuffix(string(b), "ok") {
		t.Errorf("the scraper from its own address lost its connection to the slow ones: %q", b)
	}
	// New scrapes get through while the slow clients keep coming.
	scraper := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: scraperDialer.DialContext, DisableKeepAlives: true}}
	for i := 0; i < 3; i++ {
		// The scraper's last connection is gone first: the server closes
		// it after the answer the client already holds, and while it
		// counts the scraper's address holds two.
		waitUntil(t, "the scraper's last connection to be closed", func() bool {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			return tr.byAddr["127.0.0.2"] == 0
		})
		slowFrom("127.0.0.1")
		slowFrom(fmt.Sprintf("127.0.2.%d", i+1))
		code, body := get(t, scraper, "http://"+l.Addr().String()+"/", "", "")
		if code != 200 || body != "ok" {
			t.Errorf("scrape %d beside %d slow clients: %d %q", i, len(slow), code, body)
		}
	}
	if _, peak := ll.stats(); peak > limit {
		t.Errorf("peak %d connections, cap %d", peak, limit)
	}
}

// closedByServer reports whether the server closed c (EOF or reset) within
// a liveness bound.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// At the connection cap, a connection whose login was refused gives way
// first, even with a request in flight, before the scraper's idle
// keep-alive: a flood of wrong passwords from more clients than the cap
// closes its own connections.
func TestConnectionCapRefusedLoginsGiveWayFirst(t *testing.T) {
	tr, dial, _ := acceptFrom(t, 2, 0)
	scraper := dial("127.0.0.2") // a keep-alive between scrapes
	flood := dial("127.0.0.1")
	tr.startRequest(flood, requestBytes, false) // waiting for its wrong password to be checked
	req := httptest.NewRequest("GET", "/metrics", nil)
	markLogin(req.WithContext(withConn(req.Context(), flood)), "prometheus", false)
	dial("127.0.0.3") // at the cap
	if open(tr, scraper) == false || open(tr, flood) {
		t.Errorf("at the cap: scraper's idle keep-alive open %v, connection with a refused login open %v; want the latter closed", open(tr, scraper), open(tr, flood))
	}
}

// A connection the HTTP server half-closes (after a 431, or a request body
// it refuses) leaves the cap and the budget at once, not after the 500 ms
// net/http then waits before closing: header floods cannot fill the cap.
func TestHalfClosedConnectionLeavesTheCap(t *testing.T) {
	tr, dial, _ := acceptFrom(t, 8, 0)
	c := dial("127.0.0.1")
	if !open(tr, c) {
		t.Fatal("accepted connection not counted")
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if open(tr, c) || tr.stats().used != 0 {
		t.Errorf("half-closed connection still counted (open %v, %d bytes charged)", open(tr, c), tr.stats().used)
	}

	// Through net/http: headers over MaxHeaderBytes get 431 and the
	// connection half-closed; when the client sees the end of the answer,
	// the cap has the place back.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr = newTracker(0)
	ll := tr.listen(l, 8, false)
	srv := newHTTPServer(guard(tr, http.NotFoundHandler()), zerolog.Nop())
	go func() { _ = srv.Serve(ll) }()
	defer srv.Close()
	for i := 0; i < 8; i++ {
		hc, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer hc.Close()
		fmt.Fprintf(hc, "GET / HTTP/1.1\r\nHost: x\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 80<<10))
		_ = hc.SetReadDeadline(time.Now().Add(30 * time.Second)) // a guard against a hang
		b, _ := io.ReadAll(hc)
		if !strings.HasPrefix(string(b), "HTTP/1.1 431") {
			t.Fatalf("oversized headers: %.80q, want 431", b)
		}
	}
	if open, _ := ll.stats(); open != 0 {
		t.Errorf("%d of 8 connections answered 431 and half-closed still counted at the cap", open)
	}
}

// login marks c's last login as user: accepted or refused.
func login(c *trackedConn, user string, accepted bool) {
	markLogin(httptest.NewRequest("GET", "/metrics", nil).WithContext(withConn(context.Background(), c)), user, accepted)
}

// loggedInStreaming marks c logged in as user with a request being served
// whose stream's write waits from now on (HTTP/2 at window 0, or a client
// that reads slowly): stalled once stallGrace has passed.
func loggedInStreaming(tr *tracker, c *trackedConn, user string, now time.Time) *trackedConn {
	login(c, user, true)
	tr.startRequest(c, requestBytes, true)
	c.stream.start(now)
	return c
}

// The shed order: a connection whose login was refused, then one with no
// request being served, then (basic auth being on) one being served
// without credentials past its grace, then one whose credentials were
// accepted but whose writes stall (a stolen password holding HTTP/2
// streams at window 0); an idle one with credentials goes only to make
// room for another with credentials.
func TestShedOrder(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 0, 0)
	tr.auth.Store(true)
	scraper := dial("127.0.0.2")
	login(scraper, "prometheus", true)
	stalled := loggedInStreaming(tr, dial("127.0.0.6"), "prometheus", clock.now())
	idle := dial("127.0.0.3")
	refusedLogin := dial("127.0.0.4")
	login(refusedLogin, "prometheus", false)
	serving := dial("127.0.0.5")
	tr.startRequest(serving, requestBytes, false)
	clock.add(max(requestGrace, stallGrace)) // idle has had its time to send a request; stalled's write has waited
	shed := func(want *trackedConn) bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.shedOneLocked(nil, want, tr.now())
	}
	newcomer := &trackedConn{addr: "127.0.0.9"}
	for _, gone := range []*trackedConn{refusedLogin, idle, serving, stalled} {
		if !shed(newcomer) || open(tr, gone) || !open(tr, scraper) {
			t.Fatalf("shed order: %s still open %v, scraper open %v", gone.addr, open(tr, gone), open(tr, scraper))
		}
	}
	if shed(newcomer) || !open(tr, scraper) {
		t.Error("an idle connection with credentials shed for one without")
	}
	if !shed(&trackedConn{addr: "127.0.0.10", authed: true}) || open(tr, scraper) {
		t.Error("a connection with credentials not shed for another with credentials")
	}
}

// A logged-in scraper whose answer lags for a moment (a loaded node: its
// stream's writes fall behind the pace of progress) keeps its connection
// while a newcomer without credentials finds a connection without
// credentials to push out instead: an attacker who holds no credentials
// does not take a logged-in client's room.
func TestLaggingLoggedInScraperOutlastsConnectionsWithoutCredentials(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 3, 0)
	tr.auth.Store(true)
	// Its page waits for the loaded client to read.
	scraper := loggedInStreaming(tr, dial("127.0.0.2"), "prometheus", clock.now())
	handshake := dial("127.0.0.3") // no request yet: a TLS handshake under way
	tr.startRequest(dial("127.0.0.4"), requestBytes, false)
	clock.add(requestGrace + stallGrace) // the scraper's writes now count as stalled
	dial("127.0.0.5")                    // at the cap, without credentials
	if !open(tr, scraper) || open(tr, handshake) {
		t.Errorf("a newcomer without credentials at the cap: the lagging logged-in scraper open %v, a connection without credentials and no request open %v; want the scraper kept",
			open(tr, scraper), open(tr, handshake))
	}
}

// A stolen password's connections whose streams stall go before any
// logged-in connection that is idle (the scrapers' keep-alives, of the
// user whose password was stolen and of another), for anyone at the cap:
// a new login's connection without credentials, and the scrapers
// reconnecting from their trusted addresses, which take the thief's room
// rather than the new login's.
func TestStolenPasswordsStalledConnectionsGoBeforeLoggedInScrapers(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 8, 0)
	tr.auth.Store(true)
	scraper := dial("127.0.0.2")
	login(scraper, "prometheus", true)
	other := dial("127.0.0.3")
	login(other, "gmp", true)
	var thief []*trackedConn
	for range 6 { // its streams held at window 0
		thief = append(thief, loggedInStreaming(tr, dial("127.0.0.7"), "prometheus", clock.now()))
	}
	clock.add(stallGrace)
	firstLogin := dial("127.0.0.4") // no credentials yet
	otherAgain := dial("127.0.0.3") // trusted: counts as credentialed
	scraperAgain := dial("127.0.0.2")
	for _, c := range []*trackedConn{scraper, other, firstLogin, otherAgain, scraperAgain} {
		if !open(tr, c) {
			t.Errorf("%s's connection shed while the thief's stalled connections were open", c.addr)
		}
	}
	held := 0
	for _, c := range thief {
		if open(tr, c) {
			held++
		}
	}
	if held != 3 || tr.stats().shed != 3 {
		t.Errorf("the thief holds %d of its 6 stalled connections after 3 newcomers at the cap (%d shed), want 3 (3)", held, tr.stats().shed)
	}
}

// streaming marks c serving a request (HTTP/2) whose stream's write waits
// from now on: a client holding its window at 0, stalled once stallGrace
// has passed.
func streaming(tr *tracker, c *trackedConn, now time.Time) *trackedConn {
	tr.startRequest(c, requestBytes, true)
	c.stream.start(now)
	return c
}

// fillBudget makes tr's budget what it holds now: the next request must
// shed a connection or be refused.
func fillBudget(tr *tracker) {
	tr.mu.Lock()
	tr.budget = tr.used
	tr.mu.Unlock()
}

// An attacker on a scraper's own address (a hostNetwork pod, SNAT) holding
// the memory budget with HTTP/2 streams at window 0 does not starve the
// scraper's connection: a request on a connection that has taken a whole
// answer and makes progress takes the room of a connection from its
// address whose writes stall. Nothing else from that address gives way to
// it (a connection still being served, an idle one), and nothing of that
// address gives way to a connection that has taken no answer (the
// attacker's own requests and newcomers) or to one that stalls itself.
func TestConnectionThatReadsTakesTheRoomOfItsAddressStalledOnes(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 0, 0)
	const addr = "127.0.0.2"
	scraper := dial(addr)
	tr.markAnswered(scraper) // its last scrape
	var stalled []*trackedConn
	for range 3 {
		stalled = append(stalled, streaming(tr, dial(addr), clock.now()))
	}
	clock.add(stallGrace) // their streams have waited
	young := streaming(tr, dial(addr), clock.now())
	idle := dial(addr)
	readThenStalled := streaming(tr, dial(addr), clock.now().Add(-stallGrace))
	tr.markAnswered(readThenStalled)
	attacker := dial(addr)
	fillBudget(tr)
	before := tr.stats().shed

	if tr.startRequest(attacker, requestBytes, true) {
		t.Error("a request on a connection that has taken no answer was served over the budget")
	}
	if tr.startRequest(readThenStalled, requestBytes, true) {
		t.Error("a request on a connection whose own writes stall was served over the budget")
	}
	if shed := tr.stats().shed - before; shed != 0 {
		t.Fatalf("%d connections of the address shed for requests that show nothing; want none", shed)
	}
	for i := range 2 {
		if !tr.startRequest(scraper, requestBytes, true) {
			t.Fatalf("scrape %d: the scraper's request refused while connections of its address stall", i)
		}
		tr.endRequest(scraper, requestBytes)
	}
	gone := 0
	for _, c := range append(stalled, readThenStalled) {
		if !open(tr, c) {
			gone++
		}
	}
	if gone != 1 || !open(tr, young) || !open(tr, idle) || !open(tr, attacker) {
		t.Errorf("after the scraper's requests: %d stalled connections gone (want 1: the first request's room is given back), young stream open %v, idle open %v, attacker open %v; want those three open",
			gone, open(tr, young), open(tr, idle), open(tr, attacker))
	}
	// A client that took one answer and then holds its streams at window
	// 0 sheds, while it makes progress, only connections that stall, never
	// the scraper's or an idle one; once its own streams stall, nothing.
	tr.markAnswered(young)
	fillBudget(tr)
	if !tr.startRequest(young, requestBytes, true) {
		t.Fatal("a request on a connection that took an answer found no room while connections of its address stall")
	}
	if !open(tr, scraper) || !open(tr, idle) {
		t.Fatalf("a connection that took one answer pushed out the scraper (open %v) or an idle connection (open %v)", open(tr, scraper), open(tr, idle))
	}
	clock.add(stallGrace) // young's stream stalls now
	fillBudget(tr)
	before = tr.stats().shed
	if tr.startRequest(young, requestBytes, true) || tr.stats().shed != before {
		t.Error("a request on a connection whose own stream stalls took the room of its address's others")
	}
	tr.mu.Lock()
	roomForNewcomer := tr.makeRoomLocked(nil, connBytes, &trackedConn{addr: addr}, clock.now())
	tr.mu.Unlock()
	if roomForNewcomer || tr.stats().shed != before {
		t.Error("a new connection from the address took the room of its address's stalled ones")
	}
	if !open(tr, scraper) || !open(tr, idle) {
		t.Error("the scraper's connection or an idle one gave way to its own address")
	}
}

// With basic auth, a request on a connection whose credentials were
// accepted takes the room of its own address's connections without them
// (idle ones, or TLS handshakes under way), so an attacker without the
// password on the scraper's address cannot starve the scraper; a request
// without credentials from that address is refused and sheds nothing, and
// so is one whose own writes stall.
func TestAcceptedCredentialsTakeTheRoomOfTheirAddressConnectionsWithout(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 0, 0)
	tr.auth.Store(true)
	const addr = "127.0.0.2"
	scraper := dial(addr)
	login(scraper, "prometheus", true)
	var attacker []*trackedConn
	for range 4 {
		attacker = append(attacker, dial(addr))
	}
	thief := dial(addr)
	login(thief, "prometheus", true)
	fillBudget(tr)
	if tr.startRequest(attacker[0], requestBytes, false) {
		t.Error("a request without credentials from the scraper's address served over the budget")
	}
	if shed := tr.stats().shed; shed != 0 {
		t.Fatalf("%d connections shed for a request without credentials from their own address", shed)
	}
	if !tr.startRequest(scraper, requestBytes, false) {
		t.Fatal("the logged-in scraper's request refused while its address holds connections without credentials")
	}
	if shed := tr.stats().shed; shed != 1 || !open(tr, scraper) {
		t.Errorf("%d connections shed for the scraper's request (want 1), scraper open %v", shed, open(tr, scraper))
	}
	// Credentials whose own writes stall (a stolen password holding its
	// streams at window 0) take no room from their address.
	streaming(tr, thief, clock.now())
	login(attacker[0], "prometheus", false) // a wrong password: no credentials, trusted address or not
	clock.add(stallGrace)
	fillBudget(tr)
	before := tr.stats().shed
	if tr.startRequest(thief, requestBytes, true) || tr.stats().shed != before {
		t.Error("a request on a logged-in connection whose writes stall took the room of its address's connections without credentials")
	}
}

// Of connections without credentials alike (one address each, the same
// state), those whose networks have made the most login attempts lately go
// first: a password flood from many addresses, each connection in its TLS
// handshake, pushes out its own connections before a scraper's first login
// from a network of its own, however long that handshake takes.
func TestFloodingNetworksGoBeforeAFirstLogin(t *testing.T) {
	flood := func(i int) string { return fmt.Sprintf("127.%d.0.1", 10+i) }
	loads := map[string]int{}
	for i := 0; i < 3; i++ {
		loads[flood(i)] = 9 // a /16 and a /24 each with hundreds of attempts
	}
	tr, dial, clock := acceptWithLoads(t, 3, 0, loads)
	firstLogin := dial("127.0.0.4") // oldest: its handshake is slow
	clock.add(100 * time.Millisecond)
	var floods []*trackedConn
	for i := 0; i < 2; i++ {
		floods = append(floods, dial(flood(i)))
		clock.add(100 * time.Millisecond)
	}
	dial(flood(2)) // at the cap
	if !open(tr, firstLogin) || (open(tr, floods[0]) && open(tr, floods[1])) {
		t.Errorf("a flood's newcomer at the cap: the first login's connection open %v, the flood's %v %v; want one of the flood's shed",
			open(tr, firstLogin), open(tr, floods[0]), open(tr, floods[1]))
	}
	if tr.stats().shed != 1 {
		t.Errorf("%d connections shed, want 1", tr.stats().shed)
	}
}

// A first login from the flood's own network has about the flood's load
// there: within netLoadMargin the loads tell nothing apart, and the oldest
// of the connections alike goes first, the flood's, not the young login's.
func TestFirstLoginInTheFloodsNetworkGoesByAge(t *testing.T) {
	flood := func(i int) string { return fmt.Sprintf("127.1.0.%d", 10+i) }
	// Its own attempts may put its address's load a little above the
	// flood's: one order of magnitude apart, alike.
	loads := map[string]int{"127.1.0.252": 16}
	for i := 0; i < 3; i++ {
		loads[flood(i)] = 15
	}
	tr, dial, clock := acceptWithLoads(t, 3, 0, loads)
	var floods []*trackedConn
	for i := 0; i < 2; i++ {
		floods = append(floods, dial(flood(i)))
		clock.add(100 * time.Millisecond)
	}
	firstLogin := dial("127.1.0.252")
	clock.add(100 * time.Millisecond)
	dial(flood(2)) // at the cap
	if !open(tr, firstLogin) || open(tr, floods[0]) {
		t.Errorf("a flood's newcomer at the cap, the first login in the flood's network: the first login open %v, the flood's oldest open %v; want the oldest shed",
			open(tr, firstLogin), open(tr, floods[0]))
	}
}

// A newcomer with credentials (a scraper reconnecting from its trusted
// address) takes the room of a connection without credentials from a
// network making more login attempts than its own, even when its address
// already holds more connections than each of the flood's addresses (its
// idle keep-alive besides); it takes none from an address holding fewer on
// a network no busier than its own (a first login), which a thief with a
// stolen password reconnecting in a loop cannot then push out.
func TestTrustedNewcomerTakesTheRoomOfAFloodFromManyAddresses(t *testing.T) {
	flood := func(i int) string { return fmt.Sprintf("127.%d.0.1", 10+i) }
	loads := map[string]int{}
	for i := 0; i < 4; i++ {
		loads[flood(i)] = 9
	}
	tr, dial, clock := acceptWithLoads(t, 4, 0, loads)
	keepAlive := dial("127.0.0.2")
	login(keepAlive, "prometheus", true)
	shut := dial("127.0.0.2") // the scraper's connection, to be lost
	login(shut, "prometheus", true)
	for i := 0; i < 2; i++ {
		dial(flood(i))
		clock.add(time.Millisecond)
	}
	shut.Close()
	dial(flood(2)) // the cap full again: the scraper's address holds 1, each of the flood's 1
	reconnect := dial("127.0.0.2")
	if !open(tr, reconnect) || !open(tr, keepAlive) {
		t.Fatalf("the scraper's reconnect at a cap full of a flood's connections: open %v (its keep-alive open %v); want it in, a flood connection shed",
			open(tr, reconnect), open(tr, keepAlive))
	}
	if !reconnect.credentialed() {
		t.Fatal("the scraper's reconnect is not trusted")
	}

	// A thief with the password, from a quiet network too, holding two
	// connections: its new one does not push out a first login's.
	tr2, dial2, _ := acceptWithLoads(t, 3, 0, map[string]int{})
	thief := dial2("127.0.0.7")
	login(thief, "prometheus", true)
	firstLogin := dial2("127.0.0.4")
	login(dial2("127.0.0.7"), "prometheus", true)
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.7")}}).Dial("tcp", thief.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedByServer(c) || !open(tr2, firstLogin) {
		t.Error("a newcomer with credentials from an address holding 3 pushed out the only connection of a first login from a network no busier than its own")
	}
}

// A user's connections are bounded: past maxConnsPerUser, a login sheds
// that user's connection that goes first (stalled, then idle, the oldest
// first; the scraper whose password was stolen, serving, stays), and no
// other user's; connections serving alike go too, those of the address
// holding the most first.
func TestConnectionsPerUser(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 0, 0)
	tr.auth.Store(true)
	scraper := dial("127.0.0.2")
	login(scraper, "prometheus", true)
	tr.startRequest(scraper, requestBytes, false) // a scrape being written
	other := dial("127.0.0.3")
	login(other, "gmp", true)
	var stolen []*trackedConn
	for i := 0; i < maxConnsPerUser+8; i++ {
		c := dial("127.0.0.1")
		login(c, "prometheus", true)
		stolen = append(stolen, c)
		clock.add(time.Millisecond)
	}
	tr.mu.Lock()
	held := tr.byUser["prometheus"]
	tr.mu.Unlock()
	if held > maxConnsPerUser {
		t.Errorf("one user holds %d connections, want at most %d", held, maxConnsPerUser)
	}
	if !open(tr, scraper) || !open(tr, other) {
		t.Errorf("the scraper serving with progress open %v, another user's connection open %v; want both open", open(tr, scraper), open(tr, other))
	}
	if open(tr, stolen[0]) || !open(tr, stolen[len(stolen)-1]) {
		t.Errorf("the user's oldest idle connection open %v (want shed), its newest open %v", open(tr, stolen[0]), open(tr, stolen[len(stolen)-1]))
	}
	// Every one of the thief's connections serving (streams not yet seen
	// to stall): more logins still shed them, never the scraper's.
	for _, c := range stolen {
		if open(tr, c) {
			tr.startRequest(c, requestBytes, true)
		}
	}
	for i := 0; i < 8; i++ {
		login(dial("127.0.0.1"), "prometheus", true)
	}
	tr.mu.Lock()
	held = tr.byUser["prometheus"]
	tr.mu.Unlock()
	if held > maxConnsPerUser || !open(tr, scraper) {
		t.Errorf("logins beside the user's connections all serving: the user holds %d (want at most %d), the scraper open %v", held, maxConnsPerUser, open(tr, scraper))
	}
}

// Every accepted connection's kernel queues are bounded (Linux doubles
// what is asked for): a client reading slowly cannot grow the send queue
// to tcp_wmem's maximum. The segments sent are small enough for the queue
// to hold four, on loopback too.
func TestSocketBuffersBounded(t *testing.T) {
	_, dial, _ := acceptFrom(t, 0, 0)
	c := dial("127.0.0.1")
	rc, err := c.Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var snd, rcv, mss int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if snd, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF); serr == nil {
			rcv, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		}
		if serr == nil {
			mss, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG)
		}
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if snd != 2*sendBufferBytes || rcv != 2*receiveBufferBytes {
		t.Errorf("SO_SNDBUF %d, SO_RCVBUF %d; want %d and %d", snd, rcv, 2*sendBufferBytes, 2*receiveBufferBytes)
	}
	// The send queue holds several segments: loopback's 64 KiB ones, twice
	// the queue, left every answer larger than it waiting for the client's
	// delayed acknowledgement.
	if mss > maxSegmentBytes || snd < 4*mss {
		t.Errorf("segments of %d bytes sent through a send queue of %d; want at most %d, four to the queue", mss, snd, maxSegmentBytes)
	}
}

// A connection the kernel completed before the exporter wrapped its
// listener (a scraper polling from the exporter's start) has the bounded
// segment size too: listenTCP sets it before listen(2).
func TestConnectionBeforeServingHasTheSegmentClamp(t *testing.T) {
	l, err := listenTCP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	early, err := net.Dial("tcp", l.Addr().String()) // in the accept queue before anything serves
	if err != nil {
		t.Fatal(err)
	}
	defer early.Close()
	ll := newTracker(0).listen(l, 0, false)
	defer ll.Close()
	c, err := ll.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rc, err := c.(*trackedConn).Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mss int
	var serr error
	if err := rc.Control(func(fd uintptr) { mss, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG) }); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if mss > maxSegmentBytes {
		t.Errorf("a connection accepted by the kernel before serving sends segments of %d bytes; want at most %d", mss, maxSegmentBytes)
	}
}

// With basic auth, a login being checked has requestGrace before a
// newcomer without credentials may push its connection out: at a cap full
// of such logins the newcomer is refused; past the grace the login that
// has waited longest goes.
func TestLoginsBeingCheckedGetTheirGrace(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 2, 0)
	tr.auth.Store(true)
	first := dial("127.0.0.2") // a scraper's first login, waiting for bcrypt
	tr.startRequest(first, requestBytes, false)
	clock.add(10 * time.Millisecond)
	other := dial("127.0.0.3")
	tr.startRequest(other, requestBytes, false)
	clock.add(10 * time.Millisecond)
	refused := tr.stats().refused
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.4")}}).Dial("tcp", first.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedByServer(c) || tr.stats().refused != refused+1 || !open(tr, first) || !open(tr, other) {
		t.Errorf("a newcomer without credentials at a cap of logins being checked within their grace: refused %v; first login open %v, other open %v; want the newcomer refused",
			tr.stats().refused > refused, open(tr, first), open(tr, other))
	}
	clock.add(requestGrace)
	dial("127.0.0.5")
	if open(tr, first) || !open(tr, other) {
		t.Errorf("past the grace: the login waiting longest open %v, the other open %v; want the former shed", open(tr, first), open(tr, other))
	}
}

// An address whose credentials were accepted lately is trusted: its new
// connection counts as having credentials, so at a cap full of logins
// being checked it gets in (a scraper reconnecting during a flood of
// logins) where another newcomer is refused; a refused login on it ends
// that, and so does trustFor without an accepted login.
func TestTrustedAddressReconnects(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 2, 0)
	tr.auth.Store(true)
	login := func(c *trackedConn, ok bool) {
		markLogin(httptest.NewRequest("GET", "/metrics", nil).WithContext(withConn(context.Background(), c)), "prometheus", ok)
	}
	first := dial("127.0.0.2")
	login(first, true)
	first.Close() // the scraper's keep-alive connection ends
	a := dial("127.0.0.3")
	tr.startRequest(a, requestBytes, false)
	clock.add(10 * time.Millisecond)
	b := dial("127.0.0.4")
	tr.startRequest(b, requestBytes, false)
	clock.add(10 * time.Millisecond)
	reconnect := dial("127.0.0.2") // at the cap of logins being checked
	if !open(tr, reconnect) || open(tr, a) || !open(tr, b) {
		t.Errorf("trusted address's new connection open %v; oldest login being checked open %v (want shed), newer open %v", open(tr, reconnect), open(tr, a), open(tr, b))
	}
	login(reconnect, false)
	dial("127.0.0.5")
	if open(tr, reconnect) {
		t.Error("a connection of a trusted address whose login was refused was not shed first")
	}
	clock.add(trustFor)
	b.Close()
	if c := dial("127.0.0.2"); c.trusted {
		t.Errorf("an address trusted %s after its last accepted login", trustFor)
	}
}

// The memory budget binds every request, credentials or not: a request
// that finds no room (nothing to shed but the connections of its own
// address) is refused; one with credentials makes room by shedding what
// it may, and is refused too when the budget holds only requests being
// served.
func TestMemoryBudget(t *testing.T) {
	tr, dial, _ := acceptFrom(t, 0, 3*connBytes)
	scraper := dial("127.0.0.2")
	login(scraper, "prometheus", true)
	a, b := dial("127.0.0.3"), dial("127.0.0.3")
	if tr.startRequest(a, requestBytes, false) {
		t.Error("a request without credentials served over the budget")
	}
	if !open(tr, b) || !open(tr, scraper) {
		t.Error("a request without credentials pushed out its own address's connection, or one with credentials")
	}
	if !tr.startRequest(scraper, requestBytes, false) {
		t.Error("a request with credentials refused while connections without could make room")
	}
	if open(tr, a) && open(tr, b) {
		t.Error("the request with credentials did not make room: both connections without credentials still open")
	}
	if tr.startRequest(scraper, 3*connBytes, false) { // past the budget, beside the request being served
		t.Error("a request with credentials served over the budget, which holds only requests being served")
	}
	if used := tr.stats().used; used > tr.budget {
		t.Errorf("%d bytes charged, budget %d", used, tr.budget)
	}
}

// On the probe listener the oldest connection without a whole request
// gives way to a new one whatever its address: the kubelet's address may
// be an attacker's too.
func TestProbeListenerNewcomerPushesOutTheOldestIdle(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newTracker(probeMemoryBudget)
	clock := newTestClock()
	tr.now = clock.now
	pl := tr.listen(l, 2, false)
	pl.noAuth = true
	defer pl.Close()
	accepted := make(chan *trackedConn, 8)
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*trackedConn)
		}
	}()
	dial := func() *trackedConn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		select {
		case tc := <-accepted:
			clock.add(time.Millisecond)
			return tc
		case <-time.After(30 * time.Second): // liveness bound only
			t.Fatal("connection not accepted")
			return nil
		}
	}
	oldest, other := dial(), dial()
	kubelet := dial() // at the cap, from the same address
	if open(tr, oldest) || !open(tr, other) || !open(tr, kubelet) {
		t.Errorf("the oldest idle connection open %v (want shed), the other open %v, the newcomer open %v", open(tr, oldest), open(tr, other), open(tr, kubelet))
	}
}

// Progress: writes that wait and have fallen stallGrace behind a pace of
// progressBytes a stallGrace make no progress, however many small writes
// end; writes that follow a pause start the clock again.
func TestProgress(t *testing.T) {
	var p progress
	t0 := time.Unix(1e9, 0)
	if p.stalled(t0.Add(time.Hour)) {
		t.Error("stalled with no write")
	}
	p.start(t0)
	if p.stalled(t0.Add(stallGrace / 2)) {
		t.Error("stalled within the grace")
	}
	if !p.stalled(t0.Add(stallGrace)) {
		t.Error("not stalled after the grace with no write done")
	}
	p.start(t0.Add(stallGrace))                   // another write beside it: the clock goes on
	p.done(t0.Add(2*stallGrace), 2*progressBytes) // caught up
	if p.stalled(t0.Add(2*stallGrace + stallGrace/2)) {
		t.Error("stalled right after the writes caught up")
	}
	if !p.stalled(t0.Add(3 * stallGrace)) {
		t.Error("the write still waiting: not stalled a grace after the last progress")
	}
	p.done(t0.Add(3*stallGrace), 0)
	if p.stalled(t0.Add(time.Hour)) {
		t.Error("stalled with no write waiting")
	}
	// A trickle: one small write after another, each ending at once.
	t1 := t0.Add(time.Hour)
	for i := 0; i < 20; i++ {
		at := t1.Add(time.Duration(i) * stallGrace / 10)
		p.start(at)
		p.done(at.Add(time.Millisecond), 1024)
	}
	p.start(t1.Add(2 * stallGrace))
	if !p.stalled(t1.Add(2 * stallGrace)) {
		t.Errorf("writes of 1 KiB every tenth of the grace (%d KiB in all): not stalled", 20)
	}
	p.done(t1.Add(2*stallGrace), 1024)
	// After a pause, a new answer starts the clock again.
	p.start(t1.Add(4 * stallGrace))
	if p.stalled(t1.Add(4*stallGrace + stallGrace/2)) {
		t.Error("stalled within the grace of writes that began after a pause")
	}
}
