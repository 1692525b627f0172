package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/exporter-toolkit/web"
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

// A flood of wrong passwords from many addresses (12,000 here, three times
// the addresses the failure budgets remember; the bench runs 60,000), each
// trying once (so none has failed, and none has been turned away before),
// fills the bcrypt slots and the queue. A scraper logging in for the first time still gets
// the next slot: from the flood's own /24 as another user, or from another
// network as the user the flood tries.
func TestFirstLoginBeforeAFloodFromManyAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, addr, user string
	}{
		{"same network, another user", "10.1.0.250", "new-scraper"},
		{"another network, the flooded user", "172.16.0.1", "prometheus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBlockedBcrypt(t, map[string]string{"prometheus": "hash:right", "new-scraper": "hash:new-right"}, 2, bcryptQueue)
			a := b.a
			// Address i of the flood: 250 /16 networks of 10.0.0.0/8, 240
			// addresses in the first /24 of each.
			flood := func(i int) string { return fmt.Sprintf("10.%d.%d.%d", 1+i%250, i/250/240, 1+i/250%240) }
			var held []chan int
			for i := 0; i < 2; i++ { // the bcrypt slots
				held = append(held, b.async(flood(i), "prometheus", "wrong"))
				<-b.started
			}
			for i := 2; i < 2+bcryptQueue; i++ { // the queue
				held = append(held, b.async(flood(i), "prometheus", "wrong"))
				for a.waiting() != i-1 {
					time.Sleep(time.Millisecond)
				}
			}
			busy := 0
			const addresses = 3 * maxFailClients
			for i := 2 + bcryptQueue; i < addresses; i++ { // turned away at once
				if code := b.try(flood(i), "prometheus", "wrong"); code == http.StatusServiceUnavailable {
					busy++
				}
			}
			if busy < addresses-100 {
				t.Fatalf("only %d of the flood's attempts were turned away with bcrypt busy", busy)
			}
			pass := map[string]string{"prometheus": "right", "new-scraper": "new-right"}[tc.user]
			login := b.async(tc.addr, tc.user, pass)
			select {
			case code := <-login:
				t.Fatalf("first login from %s as %s: answered %d at once; want it queued ahead of the flood", tc.addr, tc.user, code)
			case <-time.After(50 * time.Millisecond): // queued (no latency is asserted: it waits for a slot)
			}
			b.release <- struct{}{}
			if first := <-b.started; first != pass {
				t.Errorf("the freed bcrypt slot went to %q, want the first login", first)
			}
			for i := 0; i < len(held)+1; i++ {
				b.release <- struct{}{}
			}
			if code := b.result("first login", login); code != 0 {
				t.Errorf("first login from %s as %s beside the flood: %d, want 0", tc.addr, tc.user, code)
			}
		})
	}
}
