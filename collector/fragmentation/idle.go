package fragmentation

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Idleness defaults.
//
// A 5% activity threshold sits above the background of an allocated but
// unused device (a CUDA context, a monitoring kernel, a stray health check)
// and below any real work. A 30-minute window keeps short quiet spells out:
// data loading between epochs, evaluation and checkpoint gaps, a notebook
// user reading output. Cost alerts want sustained idleness, not those.
const (
	DefaultIdleThreshold = 0.05
	DefaultIdleWindow    = 30 * time.Minute
)

// MinIdleWindow is the shortest window NewIdleTracker accepts: below it, one
// or two samples would decide idleness.
const MinIdleWindow = 10 * time.Second

// MaxIdleWindow is the longest window NewIdleTracker accepts: a holder idle
// for a week is long past any cost alert, and larger values are typos.
const MaxIdleWindow = 7 * 24 * time.Hour

// IdleConfig configures an IdleTracker.
type IdleConfig struct {
	// Threshold is the activity ratio (0-1) below which a device counts as
	// idle; it must be in (0, 1].
	Threshold float64
	// Window is how long activity must stay below Threshold before the holder
	// is idle; at least MinIdleWindow.
	Window time.Duration
}

// HolderKey identifies one holder of one device: the labels of
// gpu_allocation_idle. GPUInstance is -1 on a whole GPU.
type HolderKey struct {
	Namespace, Pod, Container, Resource string
	GPU                                 int
	GPUInstance                         int
	ComputeInstance                     int // MIG devices of one GPU instance differ here
}

// Observation is one holder's device activity in one sample.
type Observation struct {
	Key HolderKey
	// Activity is the device's activity ratio (0-1). It counts only when
	// Known; NaN or negative values are treated as unknown.
	Activity float64
	Known    bool
	// PodUID tells a replaced pod with the same namespace and name apart from
	// its predecessor.
	PodUID string
}

// IdleStatus is one holder's idleness after a sample.
type IdleStatus struct {
	Key  HolderKey
	Idle bool
	// Known: the holder's activity was known in this sample (every
	// observation of the key). An unknown holder is not idle, but it is not
	// busy either: the exporter leaves its gpu_allocation_idle out (a MIG
	// instance without DCGM, a GPU that stopped answering).
	Known bool
	// IdleSeconds is the idle time accrued by this holder
	// (gpu_allocation_idle_seconds_total): it never decreases while the
	// holder exists, and starts at 0 for a new holder.
	IdleSeconds float64
	// QuietSince is the first sample of the holder's current run below the
	// threshold (zero while it is busy or unknown): the landing page's "idle
	// for".
	QuietSince time.Time
}

// IdleTracker follows holders from sample to sample and decides which are
// idle. It is safe for concurrent use.
type IdleTracker struct {
	cfg     IdleConfig
	mu      sync.Mutex
	gen     uint64 // incremented per Observe; marks holders seen in it
	holders map[HolderKey]holderState
}

type holderState struct {
	podUID      string
	gen         uint64 // last Observe that saw the holder
	out         int    // index of its status in that Observe's result
	last        time.Time
	windowStart time.Time // first sample of the current below-threshold run
	inWindow    bool      // windowStart is set
	idle        bool
	idleSeconds float64
	before      float64 // idleSeconds before the current Observe
}

// NewIdleTracker returns a tracker for cfg, or an error that says what is
// wrong with it.
func NewIdleTracker(cfg IdleConfig) (*IdleTracker, error) {
	if !(cfg.Threshold > 0 && cfg.Threshold <= 1) {
		return nil, fmt.Errorf("idle threshold %v is out of range; want an activity ratio in (0, 1], e.g. %v", cfg.Threshold, DefaultIdleThreshold)
	}
	if cfg.Window < MinIdleWindow {
		return nil, fmt.Errorf("idle window %v is too short; want at least %v, e.g. %v", cfg.Window, MinIdleWindow, DefaultIdleWindow)
	}
	if cfg.Window > MaxIdleWindow {
		return nil, fmt.Errorf("idle window %v is too long; want at most %v, e.g. %v", cfg.Window, MaxIdleWindow, DefaultIdleWindow)
	}
	return &IdleTracker{cfg: cfg, holders: make(map[HolderKey]holderState)}, nil
}

// Observe records one sample taken at now: obs holds every current holder
// with its device's activity. It returns one status per distinct key of obs,
// in the order of first appearance.
//
// Semantics:
//
//   - A holder is idle when every sample of it for at least Window was Known
//     and below Threshold: the window starts at the first sample of an
//     uninterrupted below-threshold run, and the holder is idle from the
//     sample at which now - start >= Window.
//   - A sample at or above Threshold ends the run (the holder is busy), and
//     so does an unknown one: unknown activity is no evidence of idleness,
//     and the exporter must never claim idleness it cannot see.
//   - IdleSeconds accrues the time between two consecutive samples at both of
//     which the holder was idle. Counting starts when the holder becomes idle
//     (the window itself is not counted, so the counter measures time spent
//     past the alert condition), and the interval ending in a busy or unknown
//     sample is not counted, since when in it the device woke up is unknown.
//   - A holder missing from obs is forgotten: its series go away, and if it
//     comes back it starts afresh, counter at 0. So does a holder whose
//     PodUID changed (a replaced pod with the same name), while a different
//     pod on the same device has a different key anyway.
//   - A sample older than the holder's previous one (a clock step back)
//     restarts its window without accruing anything.
//   - Several observations with the same key in one sample are folded into
//     one: any busy or unknown one makes the holder not idle.
func (t *IdleTracker) Observe(now time.Time, obs []Observation) []IdleStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.gen++
	out := make([]IdleStatus, 0, len(obs))
	for i := range obs {
		o := &obs[i]
		known := o.Known && o.Activity >= 0 // false for NaN
		below := known && o.Activity < t.cfg.Threshold
		h, ok := t.holders[o.Key]
		if ok && h.gen == t.gen {
			out[h.out].Known = out[h.out].Known && known
			// Same key twice in one sample: busy evidence wins, and the
			// interval ending in this sample is not counted.
			if !below {
				h.inWindow, h.idle = false, false
				h.idleSeconds = h.before
				out[h.out].Idle = false
				out[h.out].IdleSeconds = h.idleSeconds
				out[h.out].QuietSince = time.Time{}
				t.holders[o.Key] = h
			}
			continue
		}
		if !ok || h.podUID != o.PodUID {
			h = holderState{podUID: o.PodUID}
		}
		h.before = h.idleSeconds
		t.step(&h, now, below)
		h.gen, h.out = t.gen, len(out)
		t.holders[o.Key] = h
		st := IdleStatus{Key: o.Key, Idle: h.idle, Known: known, IdleSeconds: h.idleSeconds}
		if h.inWindow {
			st.QuietSince = h.windowStart
		}
		out = append(out, st)
	}
	for k, h := range t.holders {
		if h.gen != t.gen {
			delete(t.holders, k)
		}
	}
	return out
}

// step advances one holder by one sample.
func (t *IdleTracker) step(h *holderState, now time.Time, below bool) {
	seen := !h.last.IsZero()
	if seen && now.Before(h.last) {
		h.inWindow, h.idle = false, false // clock stepped back: start over
	}
	wasIdle := h.idle
	if !below {
		h.inWindow, h.idle = false, false
	} else {
		if !h.inWindow {
			h.windowStart, h.inWindow = now, true
		}
		h.idle = now.Sub(h.windowStart) >= t.cfg.Window
		if wasIdle && h.idle {
			if dt := now.Sub(h.last).Seconds(); dt > 0 && !math.IsInf(dt, 0) {
				h.idleSeconds += dt
			}
		}
	}
	h.last = now
}

// Len is the number of holders the tracker currently follows.
func (t *IdleTracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.holders)
}

// IdleDevices counts the distinct devices (GPU, GPUInstance) among statuses
// all of whose holders are idle: the value of gpu_idle_allocated_devices. A
// time-sliced device with one idle and one busy (or newly arrived) holder is
// not counted.
func IdleDevices(statuses []IdleStatus) int {
	n := 0
	for i := range statuses {
		k := &statuses[i].Key
		first, allIdle := true, true
		for j := range statuses {
			if statuses[j].Key.GPU != k.GPU || statuses[j].Key.GPUInstance != k.GPUInstance {
				continue
			}
			if j < i {
				first = false
				break
			}
			allIdle = allIdle && statuses[j].Idle
		}
		if first && allIdle {
			n++
		}
	}
	return n
}
