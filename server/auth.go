package server

import (
	"crypto/sha256"
	"math"
	"math/bits"
	"net"
	"net/http"
	"runtime"
	"strconv"
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
// runs, and bcrypt work waits in a bounded queue that serves first the
// attempts whose networks and user name have asked least, and keeps one
// slot from a flood for a first login from a quiet network. The toolkit
// still serves TLS, HTTP/2 and the configured headers (webconfig.go).

// authenticator checks basic auth against the web config's bcrypt hashes.
// What cannot cost bcrypt is served first: credentials accepted before
// never wait for a bcrypt slot. Attempts that are not quiet (quietLocked:
// their networks or user name made other attempts lately, or their address
// is failing) hold at most every slot but one (maxLoudLocked): a flood,
// which piles load on its networks or the user names it tries, waits for
// its own slots while a scraper's first login from a network of its own
// takes the last at once. A slot that frees goes to the waiting attempt of
// the lowest rank (the loads of its networks and user name, and a penalty
// for an address that keeps failing) that may take it, the oldest of
// equals; a full queue makes room for an attempt of lower rank than its
// highest by refusing that one (the newest of equals).
type authenticator struct {
	now     func() time.Time
	compare func(hash, pass []byte) error // bcrypt.CompareHashAndPassword; a fake in tests
	wait    time.Duration                 // longest wait for a bcrypt slot
	queue   int                           // most attempts waiting for a slot

	mu     sync.Mutex
	good   map[[sha256.Size]byte]struct{} // credentials (with the hash they matched) accepted before
	fails  map[string]*failBucket         // client address -> failed attempts
	loads  map[string]*load               // network or user -> attempts, decaying
	slots  int                            // bcrypt slots in all
	free   int                            // bcrypt slots free
	loud   int                            // slots held by attempts that were not quiet (quietLocked) when they got them
	queued []*bcryptWaiter
	seq    uint64

	refused atomic.Int64 // attempts refused before bcrypt, for tests and logs
	busy    atomic.Int64 // attempts refused because bcrypt was busy
}

// bcryptWaiter is one attempt waiting for a bcrypt slot; done is closed
// when it is given a slot (granted) or pushed out of the queue.
type bcryptWaiter struct {
	done    chan struct{}
	granted bool
	loud    bool // granted as an attempt that was not quiet
	seq     uint64
	client  string
	keys    [3]string // its networks and user name (loadKeys)
}

type failBucket struct {
	tokens float64
	at     time.Time
	busyAt time.Time // an attempt was last turned away with bcrypt busy
}

type load struct {
	v  float64
	at time.Time
}

// valueAt is l's value decayed to now (halved every loadHalfLife).
func (l *load) valueAt(now time.Time) float64 {
	return l.v * math.Exp2(-float64(now.Sub(l.at))/float64(loadHalfLife))
}

// cleanLocked: b has no recent failure and was not turned away within
// busyCooldown.
func (a *authenticator) cleanLocked(b *failBucket) bool {
	return b.tokens >= failBurst && a.now().Sub(b.busyAt) >= busyCooldown
}

func newAuthenticator() *authenticator {
	slots := max(1, min(bcryptSlots, runtime.GOMAXPROCS(0)))
	return &authenticator{now: time.Now, compare: bcrypt.CompareHashAndPassword,
		wait: bcryptWait, queue: bcryptQueue, slots: slots, free: slots,
		good: map[[sha256.Size]byte]struct{}{}, fails: map[string]*failBucket{}, loads: map[string]*load{}}
}

// loadKeys are the networks of client (IPv4 /16 and /24, IPv6 /48 and
// /64) and the user name (one key for every unknown name).
func loadKeys(client, user string, known bool) [3]string {
	u := "user?"
	if known {
		u = "user:" + user
	}
	ip := net.ParseIP(client)
	if ip == nil {
		return [3]string{"net:" + client, "net:" + client, u}
	}
	if v4 := ip.To4(); v4 != nil {
		return [3]string{"net:" + v4.Mask(net.CIDRMask(16, 32)).String() + "/16", "net:" + v4.Mask(net.CIDRMask(24, 32)).String() + "/24", u}
	}
	return [3]string{"net:" + ip.Mask(net.CIDRMask(48, 128)).String() + "/48", "net:" + ip.Mask(net.CIDRMask(64, 128)).String() + "/64", u}
}

// loadLocked is key's load, decayed to now.
func (a *authenticator) loadLocked(key string) *load {
	now := a.now()
	l := a.loads[key]
	if l == nil {
		if len(a.loads) >= maxLoads {
			a.forgetLoadsLocked()
		}
		l = &load{at: now}
		a.loads[key] = l
	}
	l.v, l.at = l.valueAt(now), now
	return l
}

// forgetLoadsLocked makes room: the loads that have decayed go first, then
// any, down to three quarters of maxLoads.
func (a *authenticator) forgetLoadsLocked() {
	for k := range a.loads {
		if l := a.loadLocked(k); l.v < 2 {
			delete(a.loads, k)
		}
	}
	for k := range a.loads {
		if len(a.loads) < maxLoads*3/4 {
			break
		}
		delete(a.loads, k)
	}
}

// networkLoad is how many login attempts client's networks (IPv4 /16 and
// /24, IPv6 /48 and /64) have made lately, in orders of magnitude, as the
// bcrypt queue counts them: what tells a password flood's connections from
// a scraper's before either has sent a request.
func (a *authenticator) networkLoad(client string) int {
	keys := loadKeys(client, "", false)
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	n := 0
	for _, k := range keys[:2] {
		if l := a.loads[k]; l != nil {
			n += bits.Len(uint(l.valueAt(now)))
		}
	}
	return n
}

func (a *authenticator) addLoadLocked(keys [3]string, n float64) {
	for _, k := range keys {
		l := a.loadLocked(k)
		l.v = max(0, l.v+n)
	}
}

// rankLocked orders waiting attempts: lower goes first. Each load counts by
// its order of magnitude (bits.Len), so that a scraper's few attempts tie
// with none, and a flood's thousands weigh as such.
func (a *authenticator) rankLocked(w *bcryptWaiter) int {
	r := 0
	for _, k := range w.keys {
		r += bits.Len(uint(a.loadLocked(k).v))
	}
	if a.failingLocked(w.client) {
		r += addressPenalty
	}
	return r
}

// failingLocked: client, which has an attempt under way (and has paid a
// token for it), failed recently or came back within busyCooldown of being
// turned away. The attempt's own token does not count: a first attempt is
// not a failure.
func (a *authenticator) failingLocked(client string) bool {
	b := a.fails[client]
	if b == nil {
		return false
	}
	a.refillLocked(b)
	return b.tokens+1 < failBurst || a.now().Sub(b.busyAt) < busyCooldown
}

// quietLocked: w's networks and user name have made no other attempt
// lately (each load, its own included, under 2) and its address is not
// failing: a scraper's first login from a network of its own, not a flood
// from any number of addresses, which piles load on its networks or on the
// user names it tries.
func (a *authenticator) quietLocked(w *bcryptWaiter) bool {
	for _, k := range w.keys {
		if a.loadLocked(k).v >= 2 {
			return false
		}
	}
	return !a.failingLocked(w.client)
}

// maxLoudLocked is how many slots attempts that are not quiet may hold at
// once: all but one, which is kept for a quiet one, or the only one.
func (a *authenticator) maxLoudLocked() int { return max(1, a.slots-1) }

// grantLocked gives w a slot.
func (a *authenticator) grantLocked(w *bcryptWaiter, loud bool) {
	a.free--
	if loud {
		a.loud++
	}
	w.granted, w.loud = true, loud
}

// acquireLocked waits for a bcrypt slot; false if none came within a.wait,
// the queue was full of attempts of lower or equal rank, or the request
// ended. Under a.mu on entry; returns with a.mu unlocked. loud: the slot is
// one of those attempts that are not quiet may hold (release takes it).
func (a *authenticator) acquireLocked(r *http.Request, client string, keys [3]string) (granted, loud bool) {
	a.seq++
	w := &bcryptWaiter{done: make(chan struct{}), seq: a.seq, client: client, keys: keys}
	if a.free > 0 {
		quiet := a.quietLocked(w)
		if quiet || (a.loud < a.maxLoudLocked() && len(a.queued) == 0) {
			a.grantLocked(w, !quiet)
			a.mu.Unlock()
			return true, w.loud
		}
	}
	if len(a.queued) >= a.queue {
		worst, wr := -1, 0
		for i, x := range a.queued {
			if xr := a.rankLocked(x); worst < 0 || xr > wr || (xr == wr && x.seq > a.queued[worst].seq) {
				worst, wr = i, xr
			}
		}
		if a.rankLocked(w) >= wr {
			a.mu.Unlock()
			return false, false
		}
		close(a.queued[worst].done) // pushed out
		a.queued = append(a.queued[:worst], a.queued[worst+1:]...)
	}
	a.queued = append(a.queued, w)
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
		return true, w.loud
	}
	for i, x := range a.queued {
		if x == w {
			a.queued = append(a.queued[:i], a.queued[i+1:]...)
			break
		}
	}
	return false, false
}

// release frees a slot (loud: one held by an attempt that was not quiet)
// and hands the free slots to the waiting attempts that may take them:
// the lowest rank first (the oldest of equals), one that is not quiet only
// while such attempts hold fewer than maxLoudLocked.
func (a *authenticator) release(loud bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.free++
	if loud {
		a.loud--
	}
	for a.free > 0 {
		best, br, bestQuiet := -1, 0, false
		for i, x := range a.queued {
			quiet := a.quietLocked(x)
			if !quiet && a.loud >= a.maxLoudLocked() {
				continue
			}
			if xr := a.rankLocked(x); best < 0 || xr < br || (xr == br && x.seq < a.queued[best].seq) {
				best, br, bestQuiet = i, xr, quiet
			}
		}
		if best < 0 {
			return
		}
		w := a.queued[best]
		a.queued = append(a.queued[:best], a.queued[best+1:]...)
		a.grantLocked(w, !bestQuiet)
		close(w.done)
	}
}

// waiting is how many attempts wait for a bcrypt slot (for tests).
func (a *authenticator) waiting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.queued)
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
	b.tokens--
	keys := loadKeys(client, user, known)
	a.addLoadLocked(keys, 1)
	granted, loud := a.acquireLocked(r, client, keys)
	if !granted {
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
	a.release(loud)

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
		a.addLoadLocked(keys, -1)
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
// headers). Its refusals carry no body (refuse): the status and
// Retry-After say it all, and nothing waits on the client to read.
type authHandler struct {
	src     *webConfigSource
	auth    *authenticator
	limiter *rate.Limiter
	next    http.Handler
}

func (h *authHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.src.get()
	if h.limiter != nil && !h.limiter.Allow() {
		refuse(w, http.StatusTooManyRequests)
		return
	}
	if c.authOn() {
		code := h.auth.check(c.users, r)
		user, _, _ := r.BasicAuth()
		markLogin(r, user, code == 0)
		switch code {
		case 0:
		case http.StatusTooManyRequests: // too many failed logins from this address
			w.Header().Set("Retry-After", strconv.Itoa(int(failRefill.Seconds())))
			refuse(w, code)
			return
		case http.StatusServiceUnavailable: // too many logins being checked
			w.Header().Set("Retry-After", strconv.Itoa(bcryptRetryAfter))
			refuse(w, code)
			return
		default:
			w.Header().Set("WWW-Authenticate", "Basic")
			refuse(w, code)
			return
		}
	}
	h.next.ServeHTTP(w, r)
}
