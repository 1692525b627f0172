package xid

import (
	"sort"
	"sync"
	"time"
)

// Sources of Xid observations, for AddFrom.
const (
	// SourceNVML: the NVML event set. Every event is one occurrence; repeats
	// of the same code are all counted.
	SourceNVML = "nvml"
	// SourceDCGM: DCGM's Xid field (DCGM_FI_DEV_XID_ERRORS), which holds the
	// last Xid seen on a GPU and its timestamp. It is a last-value source:
	// reading the same (code, timestamp) again is the same event.
	SourceDCGM = "dcgm"
)

// DefaultDedupWindow is the Counter's de-duplication window when
// Counter.Window is zero.
const DefaultDedupWindow = 2 * time.Second

const (
	// recentRetention bounds how far back an observation may be matched by
	// one from another source. A DCGM sample reaches the counter up to one
	// collection interval after the event; ten minutes is far beyond that.
	recentRetention = 10 * time.Minute
	// recentCap bounds the observations kept per (gpu, code).
	recentCap = 64
)

// Count is one series of the Xid counter: the events of one code on one
// device since the process started.
type Count struct {
	GPU   int
	UUID  string
	Code  int
	Entry Entry     // Lookup(Code)
	Total uint64    // never decreases
	First time.Time // time of the earliest counted event: the series did not exist before
	Last  time.Time // time of the latest counted event
}

// DeviceLast is the latest counted Xid of one device.
type DeviceLast struct {
	GPU  int
	UUID string
	Code int
	At   time.Time
}

// Counter counts Xid events per (gpu, uuid, code). It is safe for concurrent
// use, its totals never decrease while the process lives (nothing resets or
// removes a series; the event reader keeps the Counter across event-set
// re-creation), and the zero value is ready to use. NewCounter additionally
// sets the start time that drops stale last-value observations.
//
// De-duplication between sources (AddFrom):
//
//  1. Observations from one source are never merged with each other: every
//     NVML event counts, so Xid 13 twice is 2. The one exception is a
//     last-value source (SourceDCGM): an observation with the same code and
//     timestamp as that source's previous one for the GPU is a re-read of the
//     same value and is dropped, and so is one timestamped before the
//     counter's start (the last Xid from before the process started).
//  2. An observation of (gpu, code) at time t from source A is the same event
//     as an already counted, not yet matched observation of the same (gpu,
//     code) from another source B whose time is within Window of t (either
//     side). It is then not counted again; the earlier one is marked matched,
//     so it absorbs at most one observation from each other source. This
//     works in both orders: NVML usually sees the event first, but a DCGM
//     sample may win the race.
//
// So an Xid seen by NVML and, a sample later, as DCGM's last value counts
// once; an Xid that NVML missed (its event set was being re-created) is
// counted from DCGM; a burst that DCGM collapses into one last value is
// counted in full from NVML.
type Counter struct {
	// Window is the de-duplication window; zero means DefaultDedupWindow.
	// Set it before first use.
	Window time.Duration

	mu       sync.Mutex
	start    time.Time
	counts   map[seriesKey]*series
	recent   map[matchKey][]observation
	lastSeen map[sourceKey]observation // last-value sources only
	deduped  uint64
	// keep is how long the times of counted events are kept (KeepEvents);
	// events are those times, per series, oldest first.
	keep   time.Duration
	events map[seriesKey][]time.Time
}

// maxKeptEvents bounds the event times kept per series: a storm of one XID
// on one GPU beyond it within the kept time counts only the newest.
const maxKeptEvents = 1 << 12

// RecentEvent is one counted Xid event whose time the counter keeps.
type RecentEvent struct {
	GPU  int
	UUID string
	Code int
	At   time.Time
}

type seriesKey struct {
	gpu  int
	uuid string
	code int
}

type series struct {
	total       uint64
	first, last time.Time
}

type matchKey struct{ gpu, code int }

type sourceKey struct {
	source string
	gpu    int
}

type observation struct {
	source  string
	code    int
	at      time.Time
	matched bool
}

// NewCounter returns a Counter whose start is now: last-value observations
// (SourceDCGM) timestamped before it are not counted.
func NewCounter() *Counter {
	return &Counter{start: time.Now()}
}

// Add counts one Xid event from the NVML event set; it is
// AddFrom(SourceNVML, ...). A zero at means now.
func (c *Counter) Add(gpu int, uuid string, code int, at time.Time) {
	c.AddFrom(SourceNVML, gpu, uuid, code, at)
}

// AddFrom records an observation of Xid code on a device from source and
// reports whether it was counted as a new event (see Counter for the rules).
// A zero at means now. Sources other than SourceNVML and SourceDCGM are
// treated like SourceNVML: every observation is an event.
func (c *Counter) AddFrom(source string, gpu int, uuid string, code int, at time.Time) bool {
	if at.IsZero() {
		at = time.Now()
	}
	window := c.Window
	if window <= 0 {
		window = DefaultDedupWindow
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[seriesKey]*series{}
		c.recent = map[matchKey][]observation{}
		c.lastSeen = map[sourceKey]observation{}
	}

	if source == SourceDCGM {
		sk := sourceKey{source, gpu}
		prev, seen := c.lastSeen[sk]
		if seen && prev.code == code && prev.at.Equal(at) {
			return false // the same last value, read again
		}
		c.lastSeen[sk] = observation{source: source, code: code, at: at}
		if !c.start.IsZero() && at.Before(c.start) {
			return false // happened before this process started
		}
	}

	mk := matchKey{gpu, code}
	recent := c.recent[mk]
	for i := range recent {
		o := &recent[i]
		if o.source != source && !o.matched && absDuration(o.at.Sub(at)) <= window {
			o.matched = true
			c.deduped++
			return false
		}
	}

	key := seriesKey{gpu, uuid, code}
	s := c.counts[key]
	if s == nil {
		s = &series{}
		c.counts[key] = s
	}
	s.total++
	if at.After(s.last) {
		s.last = at
	}
	if s.first.IsZero() || at.Before(s.first) {
		s.first = at
	}

	c.recent[mk] = prune(append(recent, observation{source: source, code: code, at: at}), at)
	if c.keep > 0 {
		c.keepEvent(key, at)
	}
	return true
}

// KeepEvents keeps the time of every event counted from now on for d after
// the newest of its series (at most maxKeptEvents per series), for Recent;
// the longest d asked for wins.
func (c *Counter) KeepEvents(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keep = max(c.keep, d)
}

func (c *Counter) keepEvent(key seriesKey, at time.Time) {
	if c.events == nil {
		c.events = map[seriesKey][]time.Time{}
	}
	ts := append(c.events[key], at)
	// In time order: a DCGM observation may come after a later NVML one.
	for i := len(ts) - 1; i > 0 && ts[i].Before(ts[i-1]); i-- {
		ts[i], ts[i-1] = ts[i-1], ts[i]
	}
	newest := ts[len(ts)-1]
	drop := 0
	for drop < len(ts) && (newest.Sub(ts[drop]) > c.keep || len(ts)-drop > maxKeptEvents) {
		drop++
	}
	c.events[key] = append(ts[:0:0], ts[drop:]...)
}

// Recent returns the counted events whose times are kept (KeepEvents),
// sorted by GPU, UUID, code and time.
func (c *Counter) Recent() []RecentEvent {
	c.mu.Lock()
	var out []RecentEvent
	for k, ts := range c.events {
		for _, t := range ts {
			out = append(out, RecentEvent{GPU: k.gpu, UUID: k.uuid, Code: k.code, At: t})
		}
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.UUID != b.UUID {
			return a.UUID < b.UUID
		}
		if a.Code != b.Code {
			return a.Code < b.Code
		}
		return a.At.Before(b.At)
	})
	return out
}

// prune drops matched observations and those too old to match anything, and
// keeps at most recentCap of the newest.
func prune(obs []observation, now time.Time) []observation {
	out := obs[:0]
	for _, o := range obs {
		if o.matched || now.Sub(o.at) > recentRetention {
			continue
		}
		out = append(out, o)
	}
	if len(out) > recentCap {
		out = append(out[:0:0], out[len(out)-recentCap:]...)
	}
	return out
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Snapshot returns every series counted so far, sorted by GPU, UUID and code.
func (c *Counter) Snapshot() []Count {
	c.mu.Lock()
	out := make([]Count, 0, len(c.counts))
	for k, s := range c.counts {
		out = append(out, Count{GPU: k.gpu, UUID: k.uuid, Code: k.code, Total: s.total, First: s.first, Last: s.last})
	}
	c.mu.Unlock()
	for i := range out {
		out[i].Entry = Lookup(out[i].Code)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if a.UUID != b.UUID {
			return a.UUID < b.UUID
		}
		return a.Code < b.Code
	})
	return out
}

// LastPerDevice returns, for every device with at least one counted Xid, the
// latest one (by event time; on a tie, the lower code), sorted by GPU and
// UUID. It feeds gpu_last_xid_timestamp_seconds.
func (c *Counter) LastPerDevice() []DeviceLast {
	type dev struct {
		gpu  int
		uuid string
	}
	c.mu.Lock()
	latest := map[dev]DeviceLast{}
	for k, s := range c.counts {
		d := dev{k.gpu, k.uuid}
		cur, ok := latest[d]
		if !ok || s.last.After(cur.At) || (s.last.Equal(cur.At) && k.code < cur.Code) {
			latest[d] = DeviceLast{GPU: k.gpu, UUID: k.uuid, Code: k.code, At: s.last}
		}
	}
	c.mu.Unlock()
	out := make([]DeviceLast, 0, len(latest))
	for _, l := range latest {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].GPU != out[j].GPU {
			return out[i].GPU < out[j].GPU
		}
		return out[i].UUID < out[j].UUID
	})
	return out
}

// Deduplicated returns how many observations were dropped as the same event
// already counted from another source (rule 2; re-reads of a last value are
// not included).
func (c *Counter) Deduplicated() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deduped
}
