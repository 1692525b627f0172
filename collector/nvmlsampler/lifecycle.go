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
	inits      int
	downReason string
	downSince  time.Time
	initCh     chan nvml.Return // non-nil while an nvmlInit runs
	initStart  time.Time
	warned     bool // the InitTimeout warning was logged for this nvmlInit
	nextTry    time.Time
	backoff    time.Duration
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

// driverGone reports whether NVML says the driver went away under it: the
// library must be initialised again before any call can succeed.
func driverGone(ret nvml.Return) bool {
	return ret == nvml.ERROR_UNINITIALIZED || ret == nvml.ERROR_DRIVER_NOT_LOADED
}

// ensureInit waits up to DeviceTimeout for the nvmlInit in flight (starting
// one when none runs and the backoff has passed) and, when it succeeds,
// discovers the GPUs. It reports whether NVML is usable.
func (s *Sampler) ensureInit(ctx interface{ Done() <-chan struct{} }) bool {
	l := &s.life
	now := time.Now()
	l.mu.Lock()
	waiting := l.initCh == nil && now.Before(l.nextTry)
	l.mu.Unlock()
	if waiting {
		return false
	}
	l.startInit(s.lib, now)
	l.mu.Lock()
	ch, started := l.initCh, l.initStart
	l.mu.Unlock()

	t := time.NewTimer(s.cfg.DeviceTimeout)
	defer t.Stop()
	var ret nvml.Return
	select {
	case ret = <-ch:
	case <-t.C:
		running := time.Since(started)
		if running < s.cfg.InitTimeout {
			l.setDown(fmt.Sprintf("waiting for nvmlInit (running for %s)", running.Round(time.Second)))
			return false
		}
		l.setDown(fmt.Sprintf("nvmlInit has not returned for %s (deadline %s): the driver does not answer (still loading, or a GPU hung in it)",
			running.Round(time.Second), s.cfg.InitTimeout))
		l.mu.Lock()
		warn := !l.warned
		l.warned = true
		l.mu.Unlock()
		if warn {
			s.cfg.Log.Warn().Dur("running", running.Round(time.Millisecond)).Dur("deadline", s.cfg.InitTimeout).
				Msg("nvmlInit has not returned: waiting for the NVIDIA driver; /healthz and the page are served meanwhile, /readyz stays not ready")
		}
		return false
	case <-ctx.Done():
		return false
	}
	took := time.Since(started)
	l.mu.Lock()
	l.initCh = nil
	l.mu.Unlock()
	if ret != nvml.SUCCESS {
		l.mu.Lock()
		l.backoff = min(max(l.backoff*2, s.cfg.MinBackoff), s.cfg.MaxBackoff)
		l.nextTry = time.Now().Add(l.backoff)
		l.downReason = fmt.Sprintf("nvmlInit failed: %v; next try in %s", ret.Error(), l.backoff)
		b := l.backoff
		l.mu.Unlock()
		s.cfg.Log.Warn().Str("error", ret.Error()).Dur("retry_in", b).Msg("nvmlInit failed; trying again with backoff")
		return false
	}
	if err := s.discover(); err != nil {
		var r nvml.Return
		if errors.As(err, &r) && driverGone(r) {
			l.mu.Lock()
			l.ready = true // so that lost() releases what this nvmlInit took
			l.mu.Unlock()
			s.lost(err)
			return false
		}
		l.setDown(err.Error())
		return false
	}
	l.mu.Lock()
	l.ready = true
	l.gen++
	l.inits++
	l.downReason, l.downSince, l.backoff, l.nextTry = "", time.Time{}, 0, time.Time{}
	inits := l.inits
	l.mu.Unlock()
	d := s.Driver()
	s.mu.Lock()
	n := len(s.workers)
	s.mu.Unlock()
	ev := s.cfg.Log.Info().Str("driver", d.DriverVersion).Str("cuda", d.CUDADriverVersion).Int("gpus", n).Dur("took", took.Round(time.Millisecond))
	if inits > 1 {
		ev.Int("inits", inits).Msg("NVML initialised again after the driver went away")
	} else {
		ev.Msg("NVML initialised")
	}
	return true
}

// lost marks NVML unusable after a call said the driver went away, and
// releases the library (nvmlShutdown) so that this process holds nothing
// of the old driver: the next nvmlInit, with backoff, opens the new one.
func (s *Sampler) lost(err error) {
	l := &s.life
	l.mu.Lock()
	if !l.ready {
		l.mu.Unlock()
		return
	}
	l.ready = false
	l.downSince = s.cfg.Now()
	l.downReason = fmt.Sprintf("the driver went away (%v): initialising NVML again", err)
	l.backoff, l.nextTry = 0, time.Time{}
	l.mu.Unlock()
	s.cfg.Log.Error().Err(err).Msg("NVML answers that the driver went away (reloaded, upgraded or unloaded): releasing NVML, then initialising it again with backoff")
	s.mu.Lock()
	busy := false
	for _, w := range s.workers {
		busy = busy || w.busy.Load()
	}
	s.mu.Unlock()
	l.release(s.lib, busy)
}

// release shuts NVML down unless a call is in flight in it: a hung worker,
// or an event-set call that does not finish within a couple of seconds.
func (l *lifecycle) release(lib NVML, busy bool) {
	l.mu.Lock()
	initRunning := l.initCh != nil
	registering := l.registering
	l.mu.Unlock()
	if busy || initRunning || (registering != nil && registering() > 0) {
		return
	}
	deadline := time.Now().Add(2 * time.Second)
	for !l.inUse.TryLock() {
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	defer l.inUse.Unlock()
	_ = lib.Shutdown()
}

// Status says whether NVML is usable now, and if not why and since when.
func (s *Sampler) Status() sample.NVMLStatus { return s.life.status() }

// downSample is the sample while NVML is unusable: every GPU known from
// before is down (so its series stay, at gpu_up 0), and the sample says why.
func (s *Sampler) downSample() *sample.NodeSample {
	s.mu.Lock()
	out := &sample.NodeSample{Time: s.cfg.Now(), Driver: s.driver}
	for _, w := range s.workers {
		out.GPUs = append(out.GPUs, w.staleState())
	}
	s.mu.Unlock()
	out.NVML = s.life.status()
	return out
}

// XIDSource returns the NVML event source of the sampler's library, gated
// by its life cycle: no set is opened before nvmlInit returned, a set is
// dropped when the driver goes away, and the library is never released
// under a wait in flight. The second result is false when the library
// provides no events.
func (s *Sampler) XIDSource() (xid.EventSource, bool) {
	src, ok := XIDSource(s.lib)
	if !ok {
		return nil, false
	}
	if _, isReal := s.lib.(*realNVML); !isReal {
		return src, true // a simulated library has no life cycle
	}
	if n, ok := src.(*xid.NVMLEventSource); ok {
		s.life.mu.Lock()
		s.life.registering = n.Registering
		s.life.mu.Unlock()
	}
	return &gatedSource{src: src, life: &s.life}, true
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
