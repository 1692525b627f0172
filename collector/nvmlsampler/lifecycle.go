package nvmlsampler

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// lifecycle is NVML's state across the node's life: initialised once in
// the background, released when the driver goes away and initialised
// again, with backoff, when it comes back.
type lifecycle struct {
	mu         sync.Mutex
	ready      bool
	gen        uint64 // bumped by every successful nvmlInit
	inits      int    // successful nvmlInit calls
	holding    bool   // a successful nvmlInit not yet paired with nvmlShutdown
	downReason string
	downSince  time.Time
	initCh     chan nvml.Return // non-nil while an nvmlInit runs
	initStart  time.Time
	warned     bool // the InitTimeout warning was logged for this nvmlInit
	nextTry    time.Time
	backoff    time.Duration
	listWarned bool // a failure to list the GPUs was logged since the last success
	// inUse is held (read) by the event set's calls, which run beside the
	// sampler; the release takes it, so that the library is never shut
	// down under a call in flight.
	inUse sync.RWMutex
	// registering, when set, counts the event registrations still in a
	// call (they run on their own, past Open's deadline).
	registering func() int
}

func (l *lifecycle) init(now time.Time) {
	l.downReason, l.downSince = "waiting for the first nvmlInit", now
}

// startInit calls nvmlInit in its own goroutine: a driver that is loading,
// or a GPU hung in it, can keep nvmlInit from returning for minutes, and
// nothing else must wait for it.
func (l *lifecycle) startInit(lib NVML, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.initCh != nil {
		return
	}
	ch := make(chan nvml.Return, 1)
	l.initCh, l.initStart, l.warned = ch, now, false
	go func() { ch <- safeInit(lib) }()
}

// safeInit turns a panic of go-nvml on a library it cannot load into the
// return code that says so.
func safeInit(lib NVML) (ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_LIBRARY_NOT_FOUND
		}
	}()
	return lib.Init()
}

func (l *lifecycle) usable() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ready
}

func (l *lifecycle) generation() (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen, l.ready
}

func (l *lifecycle) status() sample.NVMLStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return sample.NVMLStatus{Down: l.downReason, DownSince: l.downSince, Inits: l.inits}
}

func (l *lifecycle) setDown(reason string) {
	l.mu.Lock()
	l.downReason = reason
	l.mu.Unlock()
}

// retryLater schedules the next nvmlInit after the backoff, which doubles
// from minB to maxB, and says why NVML is down with reason (given the
// backoff). It returns the backoff.
func (l *lifecycle) retryLater(minB, maxB time.Duration, reason func(backoff time.Duration) string) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.backoff = min(max(l.backoff*2, minB), maxB)
	l.nextTry = time.Now().Add(l.backoff)
	l.downReason = reason(l.backoff)
	return l.backoff
}

// driverGone reports whether NVML says the driver went away under it: the
// library must be initialised again before any call can succeed.
func driverGone(ret nvml.Return) bool {
	return ret == nvml.ERROR_UNINITIALIZED || ret == nvml.ERROR_DRIVER_NOT_LOADED
}

// release shuts NVML down unless a call is in flight in it: a hung worker,
// or an event-set call that does not finish within a couple of seconds.
// It says why it did not, "" when it did or nothing was held.
func (l *lifecycle) release(lib NVML, busy bool) (kept string) {
	l.mu.Lock()
	holding, initRunning, registering := l.holding, l.initCh != nil, l.registering
	l.mu.Unlock()
	switch {
	case !holding:
		return ""
	case busy:
		return "NVML calls on a GPU have not returned"
	case initRunning:
		return "an nvmlInit has not returned"
	case registering != nil && registering() > 0:
		return "a GPU's event registration has not returned"
	}
	deadline := time.Now().Add(2 * time.Second)
	for !l.inUse.TryLock() {
		if time.Now().After(deadline) {
			return "an event set call has not returned within 2s"
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer l.inUse.Unlock()
	_ = lib.Shutdown()
	l.mu.Lock()
	l.holding = false
	l.mu.Unlock()
	return ""
}

type gatedSource struct {
	src  xid.EventSource
	life *lifecycle
}

// errDriverReloaded breaks a set opened before the driver went away.
var errDriverReloaded = errors.New("the NVML library was initialised again since the event set was created")

func (g *gatedSource) Open() (xid.Waiter, error) {
	gen, ok := g.life.generation()
	if !ok {
		return nil, xid.ErrNotReady
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	w, err := g.src.Open()
	if err != nil {
		return nil, err
	}
	return &gatedWaiter{w: w, gen: gen, life: g.life}, nil
}

// Create creates a set on the source, no device registered yet (see
// xid.StagedSource); on a source that cannot, the set is opened whole at
// Register.
func (g *gatedSource) Create() (xid.UnregisteredSet, error) {
	gen, ok := g.life.generation()
	if !ok {
		return nil, xid.ErrNotReady
	}
	st, ok := g.src.(xid.StagedSource)
	if !ok {
		return &gatedSet{gen: gen, life: g.life, open: g.src.Open}, nil
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	set, err := st.Create()
	if err != nil {
		return nil, err
	}
	return &gatedSet{set: set, gen: gen, life: g.life}, nil
}

// gatedSet is a set created but not registered, of one library instance.
type gatedSet struct {
	set  xid.UnregisteredSet // nil: open registers too
	open func() (xid.Waiter, error)
	gen  uint64
	life *lifecycle
}

func (g *gatedSet) current() bool {
	gen, ok := g.life.generation()
	return ok && gen == g.gen
}

func (g *gatedSet) Register() (xid.Waiter, error) {
	if !g.current() {
		return nil, fmt.Errorf("%w: %v", xid.ErrNotReady, errDriverReloaded) // the set went with its driver
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	var w xid.Waiter
	var err error
	if g.set != nil {
		w, err = g.set.Register()
	} else {
		w, err = g.open()
	}
	if err != nil {
		return nil, err
	}
	return &gatedWaiter{w: w, gen: g.gen, life: g.life}, nil
}

func (g *gatedSet) Free() error {
	if g.set == nil || !g.current() {
		return nil
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	return g.set.Free()
}

type gatedWaiter struct {
	w    xid.Waiter
	gen  uint64
	life *lifecycle
}

func (g *gatedWaiter) current() bool {
	gen, ok := g.life.generation()
	return ok && gen == g.gen
}

func (g *gatedWaiter) Wait(timeout time.Duration) (xid.Event, error) {
	if !g.current() {
		return xid.Event{}, errDriverReloaded
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	return g.w.Wait(timeout)
}

// Close frees the set, unless it belongs to a library instance released
// since: that set is gone with its driver.
func (g *gatedWaiter) Close() error {
	if !g.current() {
		return nil
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	return g.w.Close()
}

// Covered passes the set's coverage through, when it has one.
func (g *gatedWaiter) Covered() []xid.Coverage {
	if c, ok := g.w.(xid.CoverageReporter); ok {
		return c.Covered()
	}
	return nil
}

// RegisterAgain passes a GPU's new registration through.
func (g *gatedWaiter) RegisterAgain(gpu int, uuid string) bool {
	if !g.current() {
		return true // the set went with its driver: the next one lists the GPUs afresh
	}
	r, ok := g.w.(xid.BoardRegistrar)
	if !ok {
		return true
	}
	g.life.inUse.RLock()
	defer g.life.inUse.RUnlock()
	return r.RegisterAgain(gpu, uuid)
}

// RetryMissing passes a retry of the devices left out through.
func (g *gatedWaiter) RetryMissing() {
	if !g.current() {
		return
	}
	if r, ok := g.w.(xid.MissingRetrier); ok {
		g.life.inUse.RLock()
		defer g.life.inUse.RUnlock()
		r.RetryMissing()
	}
}
