package server

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"
)

func TestAuthenticatorLimitsFailuresPerAddress(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	users := map[string]string{"prometheus": string(hash)}
	a := newAuthenticator()
	now := time.Unix(1e9, 0)
	a.now = func() time.Time { return now }
	try := func(addr, pass string) int {
		req := httptest.NewRequest("GET", "/metrics", nil)
		req.RemoteAddr = addr
		req.SetBasicAuth("prometheus", pass)
		return a.check(users, req)
	}
	if code := try("10.0.0.1:1000", "right"); code != 0 {
		t.Fatalf("right password: %d", code)
	}
	for i := 0; i < failBurst; i++ {
		if code := try("10.0.0.9:1000", fmt.Sprint("wrong", i)); code != http.StatusUnauthorized {
			t.Fatalf("wrong password %d: %d, want 401", i, code)
		}
	}
	// The address is out of attempts, on any port; bcrypt is not run.
	if code := try("10.0.0.9:2000", "wrong-again"); code != http.StatusTooManyRequests || a.refused.Load() != 1 {
		t.Errorf("attempt past the burst: %d (refused %d), want 429", code, a.refused.Load())
	}
	// Other addresses are not affected, nor a login accepted before, even
	// from the limited address.
	if code := try("10.0.0.2:1000", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("another address: %d, want 401", code)
	}
	if code := try("10.0.0.9:1000", "right"); code != 0 {
		t.Errorf("known credentials from the limited address: %d, want 0", code)
	}
	// One more attempt per refill period.
	now = now.Add(failRefill)
	if code := try("10.0.0.9:1000", "wrong"); code != http.StatusUnauthorized {
		t.Errorf("after a refill: %d, want 401", code)
	}
	if code := try("10.0.0.9:1000", "wrong"); code != http.StatusTooManyRequests {
		t.Errorf("right after: %d, want 429", code)
	}
	// Unknown users count as failures; no user name is ever let in.
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.SetBasicAuth("nobody", "right")
	if code := a.check(users, req); code != http.StatusUnauthorized {
		t.Errorf("unknown user: %d", code)
	}
	// Memory is bounded under many addresses.
	for i := 0; i < 2*maxFailClients; i++ {
		a.mu.Lock()
		a.bucketLocked(fmt.Sprintf("10.1.%d.%d", i/256, i%256)).tokens = 0
		a.mu.Unlock()
	}
	if len(a.fails) > maxFailClients {
		t.Errorf("%d addresses remembered, want at most %d", len(a.fails), maxFailClients)
	}
}

// The connection cap: slow clients that never finish a request hold at
// most the cap of connections, and a scrape still gets through while they
// keep trying: at the cap the oldest connection without a request in
// flight gives way.
func TestConnectionCap(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }), zerolog.Nop())
	const limit = 8
	ll := newLimitListener(l, limit).(*limitListener)
	go func() { _ = srv.Serve(ll) }()
	defer srv.Close()

	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := 0; i < 5*limit; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")) // never finished
		slow = append(slow, c)
	}
	pollUntil(10*time.Second, func() bool { _, _, ev := ll.stats(); return ev >= 4*limit })
	open, peak, evicts := ll.stats()
	if peak > limit || open > limit {
		t.Errorf("%d slow clients: %d connections open, %d at most; want at most the cap of %d", len(slow), open, peak, limit)
	}
	if evicts < 4*limit {
		t.Errorf("%d evictions, want %d: the slow clients past the cap give way", evicts, 4*limit)
	}
	// One address with many connections gives way before one with few:
	// a scraper from another address keeps its connection while the slow
	// clients keep coming.
	scraperDialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	sc, err := scraperDialer.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	// Accepted (at the cap, so one slow client gave way), not yet asked anything.
	waitUntil(t, "the scraper's connection to be accepted", func() bool { _, _, ev := ll.stats(); return ev > evicts })
	for i := 0; i < 2*limit; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n"))
		slow = append(slow, c)
	}
	waitUntil(t, "the slow clients to be accepted", func() bool { _, _, ev := ll.stats(); return ev >= evicts+1+2*limit })
	_, _ = sc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
	_ = sc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, _ := io.ReadAll(sc); !strings.HasSuffix(string(b), "ok") {
		t.Errorf("the scraper from its own address lost its connection to %d slow ones from another: %q", 2*limit, b)
	}

	// The slow clients are still connected (from their side) and more keep
	// coming; a scrape gets through.
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n"))
			slow = append(slow, c)
		}
		code, body := get(t, &http.Client{Timeout: 20 * time.Second}, "http://"+l.Addr().String()+"/", "", "")
		if code != 200 || body != "ok" {
			t.Errorf("scrape %d beside %d slow clients: %d %q", i, len(slow), code, body)
		}
	}
	if _, peak, _ := ll.stats(); peak > limit {
		t.Errorf("peak %d connections, cap %d", peak, limit)
	}
}

// bcrypt work across many addresses: the queue for a bcrypt slot is
// bounded (the rest refused at once with 503 and Retry-After), a
// credential accepted before never waits behind bcrypt, and an address with
// no recent failure is served before the addresses that keep failing.
// blockedBcrypt is an authenticator on a stopped clock whose bcrypt
// compare blocks until the test lets it finish, for the tests of its queue.
type blockedBcrypt struct {
	t       *testing.T
	a       *authenticator
	users   map[string]string // user -> "hash:" + the right password
	started chan string       // each compare's password, as it starts
	release chan struct{}     // one value lets one compare finish
}

func newBlockedBcrypt(t *testing.T, users map[string]string, free, queue int) *blockedBcrypt {
	b := &blockedBcrypt{t: t, a: newAuthenticator(), users: users,
		started: make(chan string, 100), release: make(chan struct{}, 100)}
	b.a.free, b.a.queue, b.a.wait = free, queue, time.Hour
	now := time.Unix(1e9, 0)
	b.a.now = func() time.Time { return now }
	b.a.compare = func(hash, pass []byte) error {
		b.started <- string(pass)
		<-b.release
		if string(hash) == "hash:"+string(pass) {
			return nil
		}
		return bcrypt.ErrMismatchedHashAndPassword
	}
	return b
}

// try is one login attempt from addr; it returns the status check gives.
func (b *blockedBcrypt) try(addr, user, pass string) int {
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.RemoteAddr = addr + ":1000"
	req.SetBasicAuth(user, pass)
	return b.a.check(b.users, req)
}

func (b *blockedBcrypt) async(addr, user, pass string) chan int {
	c := make(chan int, 1)
	go func() { c <- b.try(addr, user, pass) }()
	return c
}

// result waits for an attempt's status. A liveness bound only (no latency
// is asserted): an attempt that should be answered at once but waits fails
// here instead of hanging.
func (b *blockedBcrypt) result(what string, c chan int) int {
	b.t.Helper()
	select {
	case code := <-c:
		return code
	case <-time.After(30 * time.Second):
		b.t.Fatalf("%s: still waiting for a bcrypt slot", what)
		return 0
	}
}

func TestAuthenticatorBcryptQueue(t *testing.T) {
	b := newBlockedBcrypt(t, map[string]string{"prometheus": "hash:right", "new-scraper": "hash:new-right"}, 2, 4)
	a, started, release := b.a, b.started, b.release
	try, async, result := b.try, b.async, b.result
	waitFor := func(what string, cond func() bool) {
		for i := 0; !cond(); i++ {
			if i > 30000 {
				t.Fatalf("never reached: %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	flood := func(i int) string { return fmt.Sprintf("10.2.0.%d", i) }

	// Ten flooding addresses have each failed once; the scraper logged in.
	for i := 1; i <= 10; i++ {
		release <- struct{}{}
		if code := try(flood(i), "prometheus", "wrong"); code != http.StatusUnauthorized {
			t.Fatalf("wrong password from %s: %d", flood(i), code)
		}
		<-started
	}
	release <- struct{}{}
	if code := try("10.9.0.1", "prometheus", "right"); code != 0 {
		t.Fatalf("scraper's first login: %d", code)
	}
	<-started

	// They keep trying: two hold the bcrypt slots, four wait, the rest are
	// refused at once, and their attempt is not counted against them.
	var flooding []chan int
	for i := 1; i <= 2; i++ {
		flooding = append(flooding, async(flood(i), "prometheus", "wrong"))
		<-started
	}
	for i := 3; i <= 6; i++ {
		flooding = append(flooding, async(flood(i), "prometheus", "wrong"))
		waitFor(fmt.Sprintf("%d attempts waiting", i-2), func() bool { return a.waiting() == i-2 })
	}
	for i := 7; i <= 10; i++ {
		if code := result("attempt past a full queue", async(flood(i), "prometheus", "wrong")); code != http.StatusServiceUnavailable {
			t.Errorf("attempt from %s past a full queue: %d, want 503", flood(i), code)
		}
	}
	if a.busy.Load() != 4 {
		t.Errorf("%d attempts refused as busy, want 4", a.busy.Load())
	}
	a.mu.Lock()
	if tok := a.fails[flood(8)].tokens; tok != failBurst-1 {
		t.Errorf("an attempt refused as busy cost the address a token: %v left, want %v", tok, failBurst-1)
	}
	a.mu.Unlock()

	// The logged-in scraper does not wait behind any of it.
	if code := result("known credential", async("10.9.0.1", "prometheus", "right")); code != 0 {
		t.Errorf("known credential while bcrypt is busy: %d, want 0", code)
	}

	// A scraper not logged in yet, from an address with no failure, takes
	// the place of the newest failing attempt and gets the next slot.
	newScraper := async("10.9.0.2", "new-scraper", "new-right")
	if code := result("pushed-out attempt", flooding[5]); code != http.StatusServiceUnavailable {
		t.Errorf("newest failing attempt, pushed out of the full queue: %d, want 503", code)
	}
	release <- struct{}{}
	if first := <-started; first != "new-right" {
		t.Errorf("the slot went to %q, want the new scraper's login first", first)
	}
	for i := 0; i < 10; i++ {
		release <- struct{}{}
	}
	if code := result("new scraper", newScraper); code != 0 {
		t.Errorf("new scraper: %d, want 0", code)
	}
	for i, c := range flooding[:5] {
		if code := result("flood", c); code != http.StatusUnauthorized {
			t.Errorf("flooding attempt %d: %d, want 401", i+1, code)
		}
	}

	// An attempt that gets no slot within the bound is refused; the web
	// handler answers 503 with Retry-After.
	a.free, a.wait = 0, time.Millisecond
	src := &webConfigSource{}
	src.cur.Store(&WebConfig{Config: &web.Config{}, users: b.users})
	h := &authHandler{src: src, auth: a, next: http.NotFoundHandler()}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.RemoteAddr = "10.9.0.3:1000"
	req.SetBasicAuth("prometheus", "not-cached")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Errorf("no slot within the bound: %d, Retry-After %q; want 503 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
}

// Addresses that come back at once after being turned away (bcrypt busy)
// lose their place among the addresses with no failure: a flood from many
// addresses that have not failed yet, only been refused, cannot keep a
// scraper that has not logged in yet out of the queue.
func TestAuthenticatorFirstLoginBeforeRetryingAddresses(t *testing.T) {
	b := newBlockedBcrypt(t, map[string]string{"prometheus": "hash:right"}, 1, 2)
	a, started, release, result := b.a, b.started, b.release, b.result
	async := func(addr, pass string) chan int { return b.async(addr, "prometheus", pass) }
	waiting := func(n int) {
		for i := 0; a.waiting() != n; i++ {
			if i > 30000 {
				t.Fatalf("never %d attempts waiting (%d)", n, a.waiting())
			}
			time.Sleep(time.Millisecond)
		}
	}
	// Three addresses with no failure take the slot and the queue; a
	// fourth is turned away (not counted as a failure).
	first := async("10.3.0.1", "wrong-1")
	if p := <-started; p != "wrong-1" {
		t.Fatalf("the slot went to %q", p)
	}
	second := async("10.3.0.2", "wrong-2")
	waiting(1)
	third := async("10.3.0.3", "wrong-3")
	waiting(2)
	if code := result("turned away", async("10.3.0.4", "wrong-4")); code != http.StatusServiceUnavailable {
		t.Fatalf("attempt past a full queue: %d, want 503", code)
	}
	release <- struct{}{}
	if p := <-started; p != "wrong-2" {
		t.Fatalf("the slot went to %q, want the first waiting", p)
	}
	// The turned-away address comes back at once: it waits behind, and
	// gives way to, a scraper logging in for the first time.
	retry := async("10.3.0.4", "wrong-4-again")
	waiting(2)
	scraper := async("10.9.0.9", "right")
	select {
	case code := <-scraper:
		t.Fatalf("scraper logging in for the first time: answered %d at once, while the address that came back "+
			"at once after being turned away kept its place in the queue; want the scraper queued and that address pushed out (503)", code)
	case code := <-retry:
		if code != http.StatusServiceUnavailable {
			t.Errorf("address that came back at once after being turned away: %d, want 503 (pushed out by the scraper)", code)
		}
	case <-time.After(30 * time.Second): // a liveness bound, no latency asserted
		t.Fatal("neither the scraper nor the retrying address was answered")
	}
	for i := 0; i < 10; i++ {
		release <- struct{}{}
	}
	if code := result("first login", scraper); code != 0 {
		t.Errorf("scraper logging in for the first time beside retrying addresses: %d, want 0", code)
	}
	for _, c := range []chan int{first, second, third} {
		if code := result("flood", c); code != http.StatusUnauthorized {
			t.Errorf("wrong password: %d, want 401", code)
		}
	}
}

// At the connection cap, a connection whose login was refused gives way
// first, even with a request in flight, before the scraper's idle
// keep-alive: a flood of wrong passwords from more clients than the cap
// closes its own connections.
func TestConnectionCapRefusedLoginsGiveWayFirst(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ll := newLimitListener(l, 2).(*limitListener)
	defer ll.Close()
	accepted := make(chan *limitedConn, 4)
	go func() {
		for {
			c, err := ll.Accept()
			if err != nil {
				return
			}
			accepted <- c.(*limitedConn)
		}
	}()
	dial := func(ip string) *limitedConn {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		select {
		case lc := <-accepted:
			return lc
		case <-time.After(30 * time.Second): // liveness bound only
			t.Fatal("connection not accepted")
			return nil
		}
	}
	scraper := dial("127.0.0.2")
	trackConnState(scraper, http.StateIdle) // a keep-alive between scrapes
	flood := dial("127.0.0.1")
	trackConnState(flood, http.StateActive) // waiting for its wrong password to be checked
	req := httptest.NewRequest("GET", "/metrics", nil)
	markLoginRefused(req.WithContext(withConn(req.Context(), flood)), true)
	dial("127.0.0.1") // at the cap
	ll.mu.Lock()
	_, scraperOpen := ll.conns[scraper]
	_, floodOpen := ll.conns[flood]
	ll.mu.Unlock()
	if !scraperOpen || floodOpen {
		t.Errorf("at the cap: scraper's idle keep-alive open %v, connection with a refused login open %v; want the latter closed", scraperOpen, floodOpen)
	}
}
