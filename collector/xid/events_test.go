package xid

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeSource is an EventSource driven by a script: Open number i fails with
// openErrs[i] when that is set; successful opens hand out the waiter scripts
// in turn. A waiter plays its steps and then times out forever.
type fakeSource struct {
	mu       sync.Mutex
	openErrs map[int]error
	scripts  [][]step
	opens    int
	used     int
	closes   int
	timeouts []time.Duration
	order    []string // "open N" and "close N", N the set's number
}

type step struct {
	ev  Event
	err error
}

func (s *fakeSource) Open() (Waiter, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.opens
	s.opens++
	if err := s.openErrs[i]; err != nil {
		return nil, err
	}
	var steps []step
	if s.used < len(s.scripts) {
		steps = s.scripts[s.used]
	}
	s.used++
	s.order = append(s.order, fmt.Sprintf("open %d", s.used))
	return &fakeWaiter{src: s, steps: steps, n: s.used}, nil
}

func (s *fakeSource) stats() (opens, closes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens, s.closes
}

type fakeWaiter struct {
	src    *fakeSource
	steps  []step
	closed bool
	n      int
}

func (w *fakeWaiter) Wait(timeout time.Duration) (Event, error) {
	if w.closed {
		panic("Wait on a closed set")
	}
	w.src.mu.Lock()
	w.src.timeouts = append(w.src.timeouts, timeout)
	w.src.mu.Unlock()
	if len(w.steps) > 0 {
		st := w.steps[0]
		w.steps = w.steps[1:]
		return st.ev, st.err
	}
	time.Sleep(timeout) // like NVML: blocks for the whole timeout
	return Event{}, ErrTimeout
}

func (w *fakeWaiter) Close() error {
	if w.closed {
		panic("double Close")
	}
	w.closed = true
	w.src.mu.Lock()
	w.src.order = append(w.src.order, fmt.Sprintf("close %d", w.n))
	w.src.closes++
	w.src.mu.Unlock()
	return nil
}

func xidEvent(gpu, code int) step {
	return step{ev: Event{GPU: gpu, UUID: "GPU-" + string(rune('a'+gpu)), Type: nvml.EventTypeXidCriticalError, Data: uint64(code)}}
}

func eccEvent(gpu int, typ uint64) step {
	return step{ev: Event{GPU: gpu, Type: typ}}
}

func fastReader(src EventSource) *Reader {
	r := NewReader(src, nil)
	r.WaitTimeout = 10 * time.Millisecond
	r.MinBackoff = time.Millisecond
	r.MaxBackoff = 5 * time.Millisecond
	return r
}

func start(t *testing.T, r *Reader) (cancel func() error) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return func() error {
		stop()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return after cancel")
			return nil
		}
	}
}

func TestReaderCountsMonotonicAcrossRecreation(t *testing.T) {
	lost := errors.New("GPU is lost")
	src := &fakeSource{
		openErrs: map[int]error{0: errors.New("driver not loaded yet"), 2: errors.New("still broken")},
		scripts: [][]step{
			{xidEvent(0, 13), xidEvent(0, 13), xidEvent(1, 79), {err: lost}},
			{xidEvent(0, 13), eccEvent(1, nvml.EventTypeDoubleBitEccError), {err: lost}},
			{xidEvent(1, 79), eccEvent(1, nvml.EventTypeSingleBitEccError), eccEvent(1, nvml.EventTypeSingleBitEccError)},
		},
	}
	r := fastReader(src)
	var logs []string
	var logMu sync.Mutex
	r.Logf = func(f string, _ ...any) { logMu.Lock(); logs = append(logs, f); logMu.Unlock() }
	cancel := start(t, r)

	var prev uint64
	eventually(t, "all events counted", func() bool {
		var sum uint64
		for _, s := range r.Counter().Snapshot() {
			sum += s.Total
		}
		if sum < prev {
			t.Fatalf("count went down: %d -> %d", prev, sum)
		}
		prev = sum
		return sum == 5 && r.ECCEvents(1, "").Single == 2 && r.Up()
	})
	if err := cancel(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v", err)
	}

	c := r.Counter()
	if got := total(c, 0, 13); got != 3 {
		t.Errorf("GPU 0 Xid 13: %d, want 3", got)
	}
	if got := total(c, 1, 79); got != 2 {
		t.Errorf("GPU 1 Xid 79: %d, want 2", got)
	}
	if e := r.ECCEvents(1, ""); e.Single != 2 || e.Double != 1 || !e.SingleWatched || !e.DoubleWatched {
		t.Errorf("ECCEvents(1) = %+v; want 2 and 1, both seen", e)
	}
	if e := r.ECCEvents(0, ""); e != (ECCEventCount{}) {
		t.Errorf("ECCEvents(0) = %+v: no event, and a source that cannot say what GPU 0 is registered for", e)
	}
	if r.Recreated() != 2 {
		t.Errorf("Recreated = %d, want 2", r.Recreated())
	}
	if r.Failures() != 4 {
		t.Errorf("Failures = %d, want 4 (2 opens, 2 waits)", r.Failures())
	}
	if r.LastError() == nil {
		t.Error("LastError is nil")
	}
	if r.Up() {
		t.Error("Up after Run returned")
	}
	opens, closes := src.stats()
	if opens != 5 || closes != 3 {
		t.Errorf("opens %d closes %d, want 5 and 3 (every opened set closed)", opens, closes)
	}
	src.mu.Lock()
	for _, to := range src.timeouts {
		// A failed set is drained with the shortest wait before it is closed.
		if to != r.WaitTimeout && to != time.Millisecond {
			t.Errorf("Wait timeout %v, want %v", to, r.WaitTimeout)
			break
		}
	}
	src.mu.Unlock()
	if len(logs) == 0 {
		t.Error("nothing logged")
	}
}

func TestReaderUpGoesDownWhileBroken(t *testing.T) {
	src := &fakeSource{openErrs: map[int]error{}}
	for i := 1; i < 1000; i++ {
		src.openErrs[i] = errors.New("broken")
	}
	src.scripts = [][]step{{xidEvent(0, 13), {err: errors.New("lost")}}}
	r := fastReader(src)
	cancel := start(t, r)
	eventually(t, "a failed re-open", func() bool { return r.Failures() >= 3 })
	if r.Up() {
		t.Error("Up while the set cannot be opened")
	}
	if total(r.Counter(), 0, 13) != 1 {
		t.Error("count lost while broken")
	}
	_ = cancel()
}

func TestReaderCancelIsPrompt(t *testing.T) {
	src := &fakeSource{}
	r := NewReader(src, NewCounter())
	r.WaitTimeout = 50 * time.Millisecond
	cancel := start(t, r)
	eventually(t, "up", r.Up)
	began := time.Now()
	_ = cancel()
	if d := time.Since(began); d > time.Second {
		t.Errorf("Run took %v to return after cancel", d)
	}
	if _, closes := src.stats(); closes != 1 {
		t.Errorf("set closed %d times on exit, want 1", closes)
	}
}

func TestReaderCancelDuringBackoff(t *testing.T) {
	src := &fakeSource{openErrs: map[int]error{0: errors.New("no driver")}}
	r := NewReader(src, nil)
	r.MinBackoff, r.MaxBackoff = time.Hour, time.Hour
	cancel := start(t, r)
	eventually(t, "first failure", func() bool { return r.Failures() == 1 })
	began := time.Now()
	_ = cancel()
	if d := time.Since(began); d > time.Second {
		t.Errorf("Run took %v to return during backoff", d)
	}
}

// --- the NVML event source, over go-nvml's mock ---

type mockGPU struct {
	*mock.Device
	registered uint64
}

func newMockGPU(index int, uuid string, supported uint64, supRet, regRet nvml.Return) *mockGPU {
	g := &mockGPU{}
	g.Device = &mock.Device{
		GetIndexFunc: func() (int, nvml.Return) { return index, nvml.SUCCESS },
		GetUUIDFunc:  func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetSupportedEventTypesFunc: func() (uint64, nvml.Return) {
			return supported, supRet
		},
		RegisterEventsFunc: func(types uint64, _ nvml.EventSet) nvml.Return {
			if regRet == nvml.SUCCESS {
				g.registered = types
			}
			return regRet
		},
	}
	return g
}

func TestNVMLEventSource(t *testing.T) {
	gpus := []*mockGPU{
		// Supports everything, including types we do not watch.
		newMockGPU(0, "GPU-0", nvml.EventTypeAll, nvml.SUCCESS, nvml.SUCCESS),
		// No ECC events on this one.
		newMockGPU(1, "GPU-1", nvml.EventTypeXidCriticalError|nvml.EventTypePState, nvml.SUCCESS, nvml.SUCCESS),
		// Events not supported at all.
		newMockGPU(2, "GPU-2", 0, nvml.ERROR_NOT_SUPPORTED, nvml.SUCCESS),
		// Fell off the bus: registration fails, the others carry on.
		newMockGPU(3, "GPU-3", nvml.EventTypeAll, nvml.SUCCESS, nvml.ERROR_GPU_IS_LOST),
	}
	queue := []nvml.EventData{
		{Device: gpus[1].Device, EventType: nvml.EventTypeXidCriticalError, EventData: 79},
		{Device: gpus[0].Device, EventType: nvml.EventTypeDoubleBitEccError},
	}
	var waits []uint32
	freed := 0
	set := &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			waits = append(waits, ms)
			if len(queue) == 0 {
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
			d := queue[0]
			queue = queue[1:]
			if d.Device == nil {
				return d, nvml.ERROR_GPU_IS_LOST
			}
			return d, nvml.SUCCESS
		},
		FreeFunc: func() nvml.Return { freed++; return nvml.SUCCESS },
	}
	lib := &mock.Interface{
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return gpus[i].Device, nvml.SUCCESS
		},
	}
	src := NewNVMLEventSource(lib, nil)
	w, err := src.Open()
	if err != nil {
		t.Fatal(err)
	}
	if gpus[0].registered != WatchedEventTypes {
		t.Errorf("GPU 0 registered %#x, want %#x", gpus[0].registered, WatchedEventTypes)
	}
	if gpus[1].registered != nvml.EventTypeXidCriticalError {
		t.Errorf("GPU 1 registered %#x, want Xid only", gpus[1].registered)
	}
	if len(gpus[2].RegisterEventsCalls()) != 0 {
		t.Error("GPU 2 (NOT_SUPPORTED) was registered")
	}
	cov := w.(CoverageReporter).Covered()
	wantCov := []Coverage{{GPU: 0, UUID: "GPU-0", Registered: true, Types: WatchedEventTypes},
		{GPU: 1, UUID: "GPU-1", Registered: true, Types: nvml.EventTypeXidCriticalError},
		{GPU: 2, UUID: "GPU-2", Unsupported: true}, {GPU: 3, UUID: "GPU-3"}}
	if !slices.Equal(cov, wantCov) {
		t.Errorf("coverage %+v, want %+v", cov, wantCov)
	}

	ev, err := w.Wait(1500 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if ev.GPU != 1 || ev.UUID != "GPU-1" || ev.Type != nvml.EventTypeXidCriticalError || ev.Data != 79 || ev.Time.IsZero() {
		t.Errorf("first event %+v", ev)
	}
	ev, err = w.Wait(time.Second)
	if err != nil || ev.GPU != 0 || ev.Type != nvml.EventTypeDoubleBitEccError {
		t.Errorf("second event %+v, %v", ev, err)
	}
	if _, err := w.Wait(time.Millisecond / 2); !errors.Is(err, ErrTimeout) {
		t.Errorf("empty set: %v, want ErrTimeout", err)
	}
	queue = append(queue, nvml.EventData{})
	if _, err := w.Wait(time.Second); err == nil || errors.Is(err, ErrTimeout) || !errors.Is(err, nvml.ERROR_GPU_IS_LOST) {
		t.Errorf("GPU lost: %v", err)
	}
	if len(waits) != 4 || waits[0] != 1500 || waits[2] != 1 {
		t.Errorf("Wait timeouts in ms: %v", waits)
	}
	if err := w.Close(); err != nil || freed != 1 {
		t.Errorf("Close: %v, freed %d", err, freed)
	}
}

// wrapped is a device handle wrapped in another type (as the collector's
// adapter does); events carry the raw handle, matched back by UUID.
type wrapped struct{ nvml.Device }

func TestNVMLEventSourceExplicitWrappedDevices(t *testing.T) {
	g := newMockGPU(5, "GPU-5", nvml.EventTypeXidCriticalError, nvml.SUCCESS, nvml.SUCCESS)
	set := &mock.EventSet{
		WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
			return nvml.EventData{Device: g.Device, EventType: nvml.EventTypeXidCriticalError, EventData: 31}, nvml.SUCCESS
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	lib := &mock.Interface{EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }}
	w, err := NewNVMLEventSource(lib, []NVMLDevice{wrapped{g.Device}}).Open()
	if err != nil {
		t.Fatal(err)
	}
	ev, err := w.Wait(time.Second)
	if err != nil || ev.GPU != 5 || ev.UUID != "GPU-5" || ev.Data != 31 {
		t.Errorf("event %+v, %v", ev, err)
	}
}

func TestNVMLEventSourceNoDevices(t *testing.T) {
	freed := 0
	set := &mock.EventSet{FreeFunc: func() nvml.Return { freed++; return nvml.SUCCESS }}
	g := newMockGPU(0, "GPU-0", 0, nvml.ERROR_NOT_SUPPORTED, nvml.SUCCESS)
	lib := &mock.Interface{EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }}
	if _, err := NewNVMLEventSource(lib, []NVMLDevice{g.Device}).Open(); !errors.Is(err, ErrNoDevices) {
		t.Errorf("Open = %v, want ErrNoDevices", err)
	}
	if freed != 1 {
		t.Errorf("set freed %d times, want 1", freed)
	}
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_UNINITIALIZED }
	if _, err := NewNVMLEventSource(lib, []NVMLDevice{g.Device}).Open(); !errors.Is(err, nvml.ERROR_UNINITIALIZED) {
		t.Errorf("Open = %v, want ERROR_UNINITIALIZED", err)
	}
}

// The real source under the Reader: a lost GPU breaks the set, the Reader
// re-creates it, and counts carry on.
func TestReaderOverNVMLSource(t *testing.T) {
	g := newMockGPU(0, "GPU-0", nvml.EventTypeAll, nvml.SUCCESS, nvml.SUCCESS)
	var mu sync.Mutex
	sets := 0
	lib := &mock.Interface{
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			sets++
			n, first := 0, sets == 1
			return &mock.EventSet{
				WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
					n++
					switch n {
					case 1:
						return nvml.EventData{Device: g.Device, EventType: nvml.EventTypeXidCriticalError, EventData: 13}, nvml.SUCCESS
					case 2:
						if first { // only the first set breaks
							return nvml.EventData{}, nvml.ERROR_UNKNOWN
						}
					}
					time.Sleep(time.Duration(ms) * time.Millisecond) // like NVML: an idle set blocks for the whole timeout
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				},
				FreeFunc: func() nvml.Return { return nvml.SUCCESS },
			}, nvml.SUCCESS
		},
	}
	r := fastReader(NewNVMLEventSource(lib, []NVMLDevice{g.Device}))
	cancel := start(t, r)
	eventually(t, "two sets, two events", func() bool {
		return total(r.Counter(), 0, 13) == 2 && r.Recreated() == 1 && r.Up()
	})
	_ = cancel()
	snap := r.Counter().Snapshot()
	if len(snap) != 1 || snap[0].UUID != "GPU-0" || snap[0].Entry.Action != ActionRestartApp {
		t.Errorf("Snapshot = %+v", snap)
	}
}

// On a source that creates and registers a set in one call, a set that
// fails is read empty, then the next one opened before the old one is
// closed (NVML delivers no event raised while no set is registered).
func TestReaderReplacesABrokenSetBeforeClosingIt(t *testing.T) {
	lost := errors.New("GPU is lost")
	src := &fakeSource{scripts: [][]step{
		{xidEvent(0, 13), {err: lost}, xidEvent(0, 31), xidEvent(1, 43)},
		{xidEvent(0, 48)},
	}}
	r := fastReader(src)
	r.MinBackoff = time.Hour // a close-then-back-off would never re-open in time
	r.MaxBackoff = time.Hour
	cancel := start(t, r)
	eventually(t, "the old set's queued events and the new set's counted", func() bool {
		c := r.Counter()
		return total(c, 0, 13) == 1 && total(c, 0, 31) == 1 && total(c, 1, 43) == 1 && total(c, 0, 48) == 1
	})
	if err := cancel(); !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v", err)
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if len(src.order) < 3 || src.order[0] != "open 1" || src.order[1] != "open 2" || src.order[2] != "close 1" {
		t.Errorf("sets opened and closed in the order %v, want open 1, open 2, close 1", src.order)
	}
	if r.Recreated() != 1 {
		t.Errorf("Recreated = %d, want 1", r.Recreated())
	}
}

// Coverage and the time without a set: every GPU unregistered while no set
// is open, and the time counted.
func TestReaderCoverage(t *testing.T) {
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	src := &fakeSource{openErrs: map[int]error{0: errors.New("no driver yet")}, scripts: [][]step{{}}}
	r := fastReader(coveredSource{src})
	r.Now = clock
	cancel := start(t, r)
	eventually(t, "a set open", func() bool { return r.Up() })
	mu.Lock()
	now = now.Add(5 * time.Second)
	mu.Unlock()
	if got := r.UncoveredSeconds(); got != 0 {
		t.Errorf("UncoveredSeconds = %v with a set open since the clock's start, want 0", got)
	}
	cov := r.Coverage()
	if len(cov) != 2 || !cov[0].Registered || cov[1].Registered {
		t.Errorf("Coverage = %+v, want GPU 0 registered, GPU 1 not", cov)
	}
	_ = cancel()
	mu.Lock()
	now = now.Add(7 * time.Second)
	mu.Unlock()
	if got := r.UncoveredSeconds(); got != 7 {
		t.Errorf("UncoveredSeconds = %v, 7 s after the set closed, want 7", got)
	}
	if cov := r.Coverage(); len(cov) != 2 || cov[0].Registered {
		t.Errorf("Coverage with no set open = %+v, want every GPU unregistered", cov)
	}
}

type coveredSource struct{ *fakeSource }

func (c coveredSource) Open() (Waiter, error) {
	w, err := c.fakeSource.Open()
	if err != nil {
		return nil, err
	}
	return coveredWaiter{w}, nil
}

type coveredWaiter struct{ Waiter }

func (coveredWaiter) Covered() []Coverage {
	return []Coverage{{GPU: 0, UUID: "GPU-a", Registered: true}, {GPU: 1, UUID: "GPU-b"}}
}

// A board without events is not a failure: the Reader says so once, stops
// opening sets and is Unsupported, not down.
func TestReaderStopsOnBoardsWithoutEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"no device supports events", ErrNoDevices},
		{"event sets not supported", fmt.Errorf("creating an NVML event set: %w", ErrEventsNotSupported)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &fakeSource{openErrs: map[int]error{}}
			for i := 0; i < 1000; i++ {
				src.openErrs[i] = tc.err
			}
			r := fastReader(src)
			var logged []string
			var mu sync.Mutex
			r.Logf = func(f string, a ...any) { mu.Lock(); logged = append(logged, fmt.Sprintf(f, a...)); mu.Unlock() }
			cancel := start(t, r)
			eventually(t, "unsupported", r.Unsupported)
			if err := cancel(); !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want context.Canceled", err)
			}
			if opens, _ := src.stats(); opens != 1 {
				t.Errorf("Open called %d times, want 1 (no retries on a board without events)", opens)
			}
			if r.Failures() != 0 || r.Up() {
				t.Errorf("failures %d, up %v; want 0, false", r.Failures(), r.Up())
			}
			mu.Lock()
			defer mu.Unlock()
			if len(logged) != 1 || !strings.Contains(logged[0], "do not support NVML events") {
				t.Errorf("log = %q, want one line saying the boards do not support events", logged)
			}
		})
	}
}

// Open tells a board without events from devices that failed.
func TestNVMLEventSourceUnsupportedOrFailed(t *testing.T) {
	set := &mock.EventSet{FreeFunc: func() nvml.Return { return nvml.SUCCESS }}
	lib := &mock.Interface{EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS }}
	failed := newMockGPU(0, "GPU-0", 0, nvml.ERROR_GPU_IS_LOST, nvml.SUCCESS)
	if _, err := NewNVMLEventSource(lib, []NVMLDevice{failed.Device}).Open(); err == nil || errors.Is(err, ErrNoDevices) {
		t.Errorf("Open with a lost GPU = %v, want a retryable error, not ErrNoDevices", err)
	}
	lib.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_NOT_SUPPORTED }
	if _, err := NewNVMLEventSource(lib, []NVMLDevice{failed.Device}).Open(); !errors.Is(err, ErrEventsNotSupported) {
		t.Errorf("Open = %v, want ErrEventsNotSupported", err)
	}
}

// stagedDriver is NVML's event delivery in miniature: an event raised goes
// to every set registered at that moment. Its source creates a set and
// registers it in two steps (StagedSource); onCreate and onRegister run
// inside those steps, to raise events there.
type stagedDriver struct {
	mu                   sync.Mutex
	sets                 []*stagedSet
	onCreate, onRegister func()
}

func (d *stagedDriver) raise(ev Event) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.sets {
		if s.registered && !s.closed {
			s.queue = append(s.queue, ev)
		}
	}
}

func (d *stagedDriver) Open() (Waiter, error) {
	set, err := d.Create()
	if err != nil {
		return nil, err
	}
	return set.Register()
}

func (d *stagedDriver) Create() (UnregisteredSet, error) {
	d.mu.Lock()
	s := &stagedSet{d: d}
	d.sets = append(d.sets, s)
	hook := d.onCreate
	d.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s, nil
}

type stagedSet struct {
	d                          *stagedDriver
	registered, closed, broken bool
	queue                      []Event
	waits                      int
}

func (s *stagedSet) Register() (Waiter, error) {
	s.d.mu.Lock()
	s.registered = true
	hook := s.d.onRegister
	s.d.mu.Unlock()
	if hook != nil {
		hook()
	}
	return s, nil
}

func (s *stagedSet) Free() error { return s.Close() }

func (s *stagedSet) Close() error {
	s.d.mu.Lock()
	defer s.d.mu.Unlock()
	s.closed = true
	return nil
}

// Wait answers queued events first, then the set's breakage, like NVML's
// wait on a set with a lost GPU.
func (s *stagedSet) Wait(timeout time.Duration) (Event, error) {
	s.d.mu.Lock()
	s.waits++
	if len(s.queue) > 0 {
		ev := s.queue[0]
		s.queue = s.queue[1:]
		s.d.mu.Unlock()
		return ev, nil
	}
	broken := s.broken
	s.d.mu.Unlock()
	if broken {
		return Event{}, errors.New("GPU is lost")
	}
	time.Sleep(timeout)
	return Event{}, ErrTimeout
}

// A set that breaks is replaced so that each event is counted once: one
// raised while the new set is being created reaches the old set only and
// is read from it; one raised once the new set is registered reaches both,
// and is read from the new one only.
func TestReaderCountsEachEventOnceAcrossReplacement(t *testing.T) {
	d := &stagedDriver{}
	r := fastReader(d)
	cancel := start(t, r)
	defer func() { _ = cancel() }()
	eventually(t, "the first set open", func() bool { return r.Up() })
	d.raise(xidEvent(0, 13).ev)
	eventually(t, "XID 13 counted", func() bool { return total(r.Counter(), 0, 13) == 1 })

	d.mu.Lock()
	d.onCreate = func() { d.raise(xidEvent(0, 31).ev) }
	d.onRegister = func() { d.raise(xidEvent(0, 43).ev) }
	first := d.sets[0]
	first.broken = true
	d.mu.Unlock()
	eventually(t, "the new set read empty twice", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.sets) == 2 && d.sets[1].waits >= 2 && len(d.sets[1].queue) == 0 && first.closed
	})
	for code, want := range map[int]uint64{13: 1, 31: 1, 43: 1} {
		if n := total(r.Counter(), 0, code); n != want {
			t.Errorf("XID %d counted %d times, want %d", code, n, want)
		}
	}
}
