package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	config_util "github.com/prometheus/common/config"
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

// blockedBcrypt is an authenticator on a stopped clock whose bcrypt
// compare blocks until the test lets it finish, for the tests of its queue.
type blockedBcrypt struct {
	t       *testing.T
	a       *authenticator
	users   map[string]string // user -> "hash:" + the right password
	started chan string       // each compare's password, as it starts
	release chan struct{}     // one value lets one compare finish
}

// newBlockedBcrypt has slots bcrypt slots (0: as many as newAuthenticator
// gives) and a queue of queue attempts.
func newBlockedBcrypt(t *testing.T, users map[string]string, slots, queue int) *blockedBcrypt {
	b := &blockedBcrypt{t: t, a: newAuthenticator(), users: users,
		started: make(chan string, 100), release: make(chan struct{}, 100)}
	if slots > 0 {
		b.a.slots, b.a.free = slots, slots
	}
	b.a.queue, b.a.wait = queue, time.Hour
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

// next is the password of the next compare to start. A liveness bound
// only: a compare that should start at once but does not fails here
// instead of hanging.
func (b *blockedBcrypt) next(what string) string {
	b.t.Helper()
	select {
	case p := <-b.started:
		return p
	case <-time.After(30 * time.Second):
		b.t.Fatalf("%s: no bcrypt compare started", what)
		return ""
	}
}

// waiting waits until n attempts wait for a bcrypt slot (a liveness bound
// only).
func (b *blockedBcrypt) waiting(n int) {
	b.t.Helper()
	for i := 0; b.a.waiting() != n; i++ {
		if i > 30000 {
			b.t.Fatalf("never %d attempts waiting for a bcrypt slot (%d)", n, b.a.waiting())
		}
		time.Sleep(time.Millisecond)
	}
}

// settled checks, once every attempt has been answered, that every slot
// came back: all free, none counted as held by an attempt that was not
// quiet, none waiting.
func (b *blockedBcrypt) settled() {
	b.t.Helper()
	a := b.a
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.free != a.slots || a.loud != 0 || len(a.queued) != 0 {
		b.t.Errorf("every attempt answered: %d of %d bcrypt slots free, %d held by attempts that were not quiet, %d waiting; want all free, 0, 0",
			a.free, a.slots, a.loud, len(a.queued))
	}
}

// finish lets every check run, then wants the first login accepted, each
// of the flood's attempts refused (401) and every slot back (settled).
func (b *blockedBcrypt) finish(login chan int, flooding []chan int) {
	b.t.Helper()
	for range len(flooding) + 1 {
		b.release <- struct{}{}
	}
	if code := b.result("first login", login); code != 0 {
		b.t.Errorf("first login: %d, want 0", code)
	}
	for i, c := range flooding {
		if code := b.result("the flood", c); code != http.StatusUnauthorized {
			b.t.Errorf("flooding attempt %d: %d, want 401", i+1, code)
		}
	}
	b.settled()
}

// bcrypt work across many addresses: a flood holds at most every slot but
// one, the queue for a slot is bounded (the rest refused at once with 503
// and Retry-After, not counted as failures), a credential accepted before
// never waits behind bcrypt, a first login from a network of its own takes
// the slot kept from the flood, and one that finds every slot busy takes
// the place of the newest failing attempt in the full queue and gets the
// next slot.
func TestAuthenticatorBcryptQueue(t *testing.T) {
	b := newBlockedBcrypt(t, map[string]string{"prometheus": "hash:right", "new-scraper": "hash:new-right", "other-scraper": "hash:other-right"}, 2, 4)
	a, release := b.a, b.release
	try, async, result := b.try, b.async, b.result
	flood := func(i int) string { return fmt.Sprintf("10.2.0.%d", i) }

	// Ten flooding addresses have each failed once; the scraper logged in.
	for i := 1; i <= 10; i++ {
		release <- struct{}{}
		if code := result("wrong password", async(flood(i), "prometheus", "wrong")); code != http.StatusUnauthorized {
			t.Fatalf("wrong password from %s: %d", flood(i), code)
		}
		b.next("wrong password")
	}
	release <- struct{}{}
	if code := try("10.9.0.1", "prometheus", "right"); code != 0 {
		t.Fatalf("scraper's first login: %d", code)
	}
	b.next("scraper's first login")

	// They keep trying: one holds a bcrypt slot, the other is kept for a
	// quiet attempt; four wait, the rest are refused at once, and their
	// attempt is not counted against them.
	var flooding []chan int
	flooding = append(flooding, async(flood(1), "prometheus", "wrong"))
	b.next("the flood's first attempt")
	for i := 2; i <= 5; i++ {
		flooding = append(flooding, async(flood(i), "prometheus", "wrong"))
		b.waiting(i - 1)
	}
	a.mu.Lock()
	if a.free != 1 || a.loud != 1 {
		t.Errorf("the flood waiting: %d bcrypt slots free, %d held by it; want 1 and 1", a.free, a.loud)
	}
	a.mu.Unlock()
	for i := 6; i <= 9; i++ {
		if code := result("attempt past a full queue", async(flood(i), "prometheus", "wrong")); code != http.StatusServiceUnavailable {
			t.Errorf("attempt from %s past a full queue: %d, want 503", flood(i), code)
		}
	}
	if a.busy.Load() != 4 {
		t.Errorf("%d attempts refused as busy, want 4", a.busy.Load())
	}
	a.mu.Lock()
	if tok := a.fails[flood(7)].tokens; tok != failBurst-1 {
		t.Errorf("an attempt refused as busy cost the address a token: %v left, want %v", tok, failBurst-1)
	}
	a.mu.Unlock()

	// The logged-in scraper does not wait behind any of it.
	if code := result("known credential", async("10.9.0.1", "prometheus", "right")); code != 0 {
		t.Errorf("known credential while bcrypt is busy: %d, want 0", code)
	}

	// A scraper not logged in yet, from a network of its own, takes the
	// slot kept from the flood at once (nothing of the flood finishes
	// first) and pushes nothing out of the queue.
	newScraper := async("10.9.0.2", "new-scraper", "new-right")
	if first := b.next("first login beside the flood"); first != "new-right" {
		t.Errorf("the free slot went to %q, want the new scraper's login", first)
	}
	if n := a.waiting(); n != 4 {
		t.Errorf("%d of the flood's attempts waiting after the first login took its slot, want 4", n)
	}

	// Another, with both slots busy, takes the place of the newest failing
	// attempt in the full queue and gets the next slot, whichever frees.
	otherScraper := async("10.8.0.1", "other-scraper", "other-right")
	if code := result("pushed-out attempt", flooding[4]); code != http.StatusServiceUnavailable {
		t.Errorf("newest failing attempt, pushed out of the full queue: %d, want 503", code)
	}
	release <- struct{}{}
	if next := b.next("a slot freed"); next != "other-right" {
		t.Errorf("the freed slot went to %q, want the other scraper's first login", next)
	}
	for i := 0; i < 10; i++ {
		release <- struct{}{}
	}
	for name, c := range map[string]chan int{"new scraper": newScraper, "other scraper": otherScraper} {
		if code := result(name, c); code != 0 {
			t.Errorf("%s: %d, want 0", name, code)
		}
	}
	for i, c := range flooding[:4] {
		if code := result("flood", c); code != http.StatusUnauthorized {
			t.Errorf("flooding attempt %d: %d, want 401", i+1, code)
		}
	}
	b.settled()

	// An attempt that gets no slot within the bound is refused; the web
	// handler answers 503 with Retry-After.
	a.free, a.wait = 0, time.Millisecond
	src := &webConfigSource{}
	named := map[string]config_util.Secret{}
	for u, h := range b.users {
		named[u] = config_util.Secret(h)
	}
	src.cur.Store(&WebConfig{Config: &web.Config{Users: named}, users: b.users})
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
	b.settled()
}

// A flood of wrong passwords from many addresses (12,000 here, three times
// the addresses the failure budgets remember; the bench runs 60,000), each
// trying once (so none has failed, and none has been turned away before),
// fills the bcrypt slots (its first attempt, which nothing tells from a
// first login, takes the slot kept for a quiet one) and the queue. A
// scraper logging in for the first time, from the flood's own /24 as
// another user or from another network as the user the flood tries (not
// quiet either: its network or its user name is the flood's), gets the
// first slot it may take, before any of the flood's waiting attempts.
func TestFirstLoginBeforeAFloodFromManyAddresses(t *testing.T) {
	for _, tc := range []struct {
		name, addr, user string
	}{
		{"same network, another user", "10.1.0.250", "new-scraper"},
		{"another network, the flooded user", "172.16.0.1", "prometheus"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBlockedBcrypt(t, map[string]string{"prometheus": "hash:right", "new-scraper": "hash:new-right"}, 2, bcryptQueue)
			// Address i of the flood: 250 /16 networks of 10.0.0.0/8, 240
			// addresses in the first /24 of each.
			flood := func(i int) string { return fmt.Sprintf("10.%d.%d.%d", 1+i%250, i/250/240, 1+i/250%240) }
			var held []chan int
			for i := 0; i < 2; i++ { // the bcrypt slots
				held = append(held, b.async(flood(i), "prometheus", "wrong"))
				b.next("the flood's attempt taking a free slot")
			}
			for i := 2; i < 2+bcryptQueue; i++ { // the queue
				held = append(held, b.async(flood(i), "prometheus", "wrong"))
				b.waiting(i - 1)
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
			// The two attempts holding the slots finish (in either order):
			// the first slot the login may take is its, not a waiting
			// attempt's of the flood.
			b.release <- struct{}{}
			b.release <- struct{}{}
			if first := b.next("slots freed"); first != pass {
				t.Errorf("the freed bcrypt slot went to %q, want the first login", first)
			}
			for i := 0; i < len(held)+1; i++ {
				b.release <- struct{}{}
			}
			if code := b.result("first login", login); code != 0 {
				t.Errorf("first login from %s as %s beside the flood: %d, want 0", tc.addr, tc.user, code)
			}
			for _, c := range held {
				b.result("the flood", c)
			}
			b.settled()
		})
	}
}

// One bcrypt slot is kept from attempts that are not quiet (their networks
// or user name made other attempts lately, or their address is failing): a
// flood whose attempts wait holds every slot but one, and a scraper's first
// login from a network of its own takes that one at once, without waiting
// for any of the flood's checks to finish. With one slot only (GOMAXPROCS
// 1) the flood may still hold it: its attempts go on being checked, and a
// quiet attempt gets the slot next.
func TestBcryptSlotKeptForAQuietAttempt(t *testing.T) {
	users := map[string]string{"prometheus": "hash:right", "new-scraper": "hash:new-right"}
	flood := func(i int) string { return fmt.Sprintf("10.2.0.%d", i) }
	// Ten flooding addresses have each failed once: their network and the
	// user name they try have a load, so none of their attempts is quiet.
	failedOnce := func(b *blockedBcrypt) {
		for i := 1; i <= 10; i++ {
			b.release <- struct{}{}
			if code := b.result("wrong password", b.async(flood(i), "prometheus", "wrong")); code != http.StatusUnauthorized {
				b.t.Fatalf("wrong password from %s: %d", flood(i), code)
			}
			b.next("wrong password")
		}
	}

	// The flood's attempts 1 to n: the first takes a slot, the others
	// queue behind it.
	startFlood := func(b *blockedBcrypt, n int, what string) []chan int {
		flooding := []chan int{b.async(flood(1), "prometheus", "wrong-1")}
		if p := b.next(what); p != "wrong-1" {
			b.t.Fatalf("the slot went to %q", p)
		}
		for i := 2; i <= n; i++ {
			flooding = append(flooding, b.async(flood(i), "prometheus", fmt.Sprint("wrong-", i)))
			b.waiting(i - 1)
		}
		return flooding
	}

	t.Run("two slots", func(t *testing.T) {
		b := newBlockedBcrypt(t, users, 2, 8)
		failedOnce(b)
		flooding := startFlood(b, 6, "the flood's first attempt")
		b.a.mu.Lock()
		free, loud := b.a.free, b.a.loud
		b.a.mu.Unlock()
		if free != 1 || loud != 1 {
			t.Errorf("five of the flood's attempts waiting: %d slots free, %d held by the flood; want 1 and 1", free, loud)
		}
		login := b.async("172.16.0.1", "new-scraper", "new-right")
		if p := b.next("a first login from a quiet network"); p != "new-right" {
			t.Errorf("the kept slot went to %q, want the first login", p)
		}
		if n := b.a.waiting(); n != 5 {
			t.Errorf("%d of the flood's attempts waiting after the first login took the kept slot, want 5 (none pushed out)", n)
		}
		b.finish(login, flooding)
	})

	t.Run("one slot", func(t *testing.T) {
		procs := runtime.GOMAXPROCS(1)
		b := newBlockedBcrypt(t, users, 0, 8) // as many slots as newAuthenticator gives under GOMAXPROCS 1
		runtime.GOMAXPROCS(procs)
		failedOnce(b)
		flooding := startFlood(b, 3, "the flood's attempt, the only slot free")
		b.release <- struct{}{}
		if p := b.next("the flood's next attempt"); p != "wrong-2" {
			t.Errorf("the freed slot went to %q, want the flood's oldest waiting attempt", p)
		}
		login := b.async("172.16.0.1", "new-scraper", "new-right")
		b.waiting(2)
		b.release <- struct{}{}
		if p := b.next("a first login from a quiet network"); p != "new-right" {
			t.Errorf("the freed slot went to %q, want the first login before the flood's waiting attempt", p)
		}
		b.finish(login, flooding)
	})
}

// Every way an attempt ends gives its bcrypt slot, or its place in the
// queue, back: checked, pushed out of the full queue, its request ended
// while it waited. Afterwards the flood again holds at most every slot but
// one.
func TestBcryptSlotsComeBackWhateverEndsAnAttempt(t *testing.T) {
	b := newBlockedBcrypt(t, map[string]string{"prometheus": "hash:right", "new-scraper": "hash:new-right"}, 2, 2)
	flood := func(i int) string { return fmt.Sprintf("10.2.0.%d", i) }
	for i := 1; i <= 6; i++ { // the flood has failed once from each address
		b.release <- struct{}{}
		b.result("wrong password", b.async(flood(i), "prometheus", "wrong"))
		b.next("wrong password")
	}
	holder := b.async(flood(1), "prometheus", "wrong-1")
	b.next("the flood's attempt")
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan int, 1)
	go func() {
		req := httptest.NewRequest("GET", "/metrics", nil).WithContext(ctx)
		req.RemoteAddr = flood(2) + ":1000"
		req.SetBasicAuth("prometheus", "wrong-2")
		ended <- b.a.check(b.users, req)
	}()
	b.waiting(1)
	pushedOut := b.async(flood(3), "prometheus", "wrong-3")
	b.waiting(2)
	first := b.async("172.16.0.1", "new-scraper", "new-right") // quiet: the kept slot
	b.next("first login")
	second := b.async("172.17.0.1", "other", "wrong") // quiet, every slot busy: pushes out the newest of the flood
	if code := b.result("pushed out", pushedOut); code != http.StatusServiceUnavailable {
		t.Errorf("the flood's attempt pushed out of the full queue: %d, want 503", code)
	}
	cancel()
	if code := b.result("request ended", ended); code != http.StatusServiceUnavailable {
		t.Errorf("an attempt whose request ended while it waited: %d, want 503", code)
	}
	for range 3 { // the three checks left: the flood's, the first login's, the unknown user's
		b.release <- struct{}{}
	}
	for what, c := range map[string]chan int{"the flood's attempt": holder, "first login": first, "an unknown user": second} {
		b.result(what, c)
	}
	b.next("the unknown user's check")
	b.settled()

	// The flood again holds one slot, never both.
	again := b.async(flood(4), "prometheus", "wrong-4")
	b.next("the flood's attempt")
	waits := b.async(flood(5), "prometheus", "wrong-5")
	b.waiting(1)
	b.a.mu.Lock()
	free, loud := b.a.free, b.a.loud
	b.a.mu.Unlock()
	if free != 1 || loud != 1 {
		t.Errorf("after every kind of end, the flood waiting: %d slots free, %d held by it; want 1 and 1", free, loud)
	}
	for range 4 {
		b.release <- struct{}{}
	}
	b.result("the flood", again)
	b.result("the flood", waits)
	b.settled()
}
