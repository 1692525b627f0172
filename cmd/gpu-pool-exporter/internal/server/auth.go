package server

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"
)

// Basic auth is checked here, not by exporter-toolkit's handler: the
// toolkit checks every password it has not cached with bcrypt, one at a
// time under one lock, and evicts its cache of 100 logins at random, so a
// flood of wrong passwords queues the real scraper behind it for seconds
// and can evict its cached login. Here credentials accepted before skip
// bcrypt, a client address that keeps failing is refused before bcrypt
// runs, and bcrypt work waits in a bounded, fair queue. The toolkit still
// serves TLS, HTTP/2 and the configured headers (webconfig.go).

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

// authHandler applies the web config's rate limit and basic auth to every
// request (exporter-toolkit's handler around it sets the configured
// headers).
type authHandler struct {
	src     *webConfigSource
	auth    *authenticator
	limiter *rate.Limiter
	next    http.Handler
}

func (h *authHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.src.get()
	if h.limiter != nil && !h.limiter.Allow() {
		http.Error(w, http.StatusText(http.StatusTooManyRequests), http.StatusTooManyRequests)
		return
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
