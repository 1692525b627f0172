package xid

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrTimeout is what Waiter.Wait returns when no event arrived in time. It is
// not a failure.
var ErrTimeout = errors.New("xid: no event before the timeout")

// ErrNotReady is what an EventSource's Open returns while the library
// cannot be used yet (nvmlInit has not returned, or the driver went away):
// the Reader tries again shortly, without counting a failure.
var ErrNotReady = errors.New("xid: NVML is not initialised yet")

// ErrNoDevices is returned by an EventSource whose Open could register no
// device for any event type it watches.
var ErrNoDevices = errors.New("xid: no device supports Xid or ECC events")

// ErrEventsNotSupported is returned by an EventSource whose driver cannot
// create an event set at all (NVML answers NOT_SUPPORTED: consumer boards,
// some vGPU guests).
var ErrEventsNotSupported = errors.New("xid: the driver does not support NVML event sets")

// EventSource opens a stream of device events. The real one is
// NewNVMLEventSource; the simulator and tests provide their own.
type EventSource interface {
	// Open creates an event set and registers the devices; it returns a
	// Waiter on that set.
	Open() (Waiter, error)
}

// StagedSource is an EventSource that can create a set before it registers
// the devices on it. The Reader replaces a broken set by creating the new
// one, reading what the old one still holds, registering the new one and
// closing the old one at once: NVML delivers an event to every set
// registered at that moment, so an event raised while both sets are
// registered would be read twice, and one raised while neither is, never.
type StagedSource interface {
	EventSource
	// Create makes an event set with no device registered on it.
	Create() (UnregisteredSet, error)
}

// UnregisteredSet is a set a StagedSource created, no device registered on
// it yet.
type UnregisteredSet interface {
	// Register registers the devices on the set and returns its Waiter;
	// when it fails the set is freed.
	Register() (Waiter, error)
	// Free frees the set unused.
	Free() error
}

// Waiter waits on one event set. Wait and Close are called from one
// goroutine, never concurrently.
type Waiter interface {
	// Wait returns the next event, or ErrTimeout when nothing happened for
	// timeout. Any other error means the set is broken: the Reader closes it
	// and opens a new one.
	Wait(timeout time.Duration) (Event, error)
	// Close frees the set.
	Close() error
}

// Coverage says whether one GPU is registered on the open event set: an
// XID of a GPU that is not registered is never seen.
type Coverage struct {
	GPU        int
	UUID       string
	Registered bool
	// Unsupported: the GPU supports none of the watched event types; it is
	// not registered, and never will be.
	Unsupported bool
	// Types are the event types the GPU is registered for (of
	// WatchedEventTypes, those it supports: no ECC events where ECC is
	// off); 0 where the source cannot say.
	Types uint64
}

// CoverageReporter is a Waiter that knows which GPUs its set covers.
type CoverageReporter interface {
	Covered() []Coverage
}

// MissingRetrier is a Waiter that can try again to register the GPUs left
// out of its set (a GPU that hung or failed at Open), on the same set.
type MissingRetrier interface {
	RetryMissing()
}

// BoardRegistrar is a Waiter that can register one GPU on its set again,
// by UUID (by index when uuid is ""), whatever its slot says: a board that
// fell off the bus and came back is a new device to the driver, and a
// registration made before it left does not deliver its events. It reports
// false when the set has no slot for the GPU (a GPU NVML did not list when
// the set was created).
type BoardRegistrar interface {
	RegisterAgain(gpu int, uuid string) bool
}

// Board is one GPU as the latest sample saw it, for Reader.Follow.
type Board struct {
	GPU  int
	UUID string
	// Up: the GPU answered NVML in the sample.
	Up bool
}

// Event is one device event.
type Event struct {
	// GPU is the NVML index, -1 when the device could not be identified.
	GPU  int
	UUID string
	// Type is the NVML event type bit: nvml.EventTypeXidCriticalError,
	// nvml.EventTypeSingleBitEccError or nvml.EventTypeDoubleBitEccError.
	Type uint64
	// Data is the Xid code for an Xid event (999: unknown Xid), else 0.
	Data uint64
	// Time is when the event was received; zero means "now" to the Reader.
	Time time.Time
	// Instance is the MIG instance the event is attributed to (NVML's
	// GpuInstanceId and ComputeInstanceId), nil for the whole GPU.
	Instance *Instance
}

// WatchedEventTypes are the NVML event types the NVML event source registers,
// on each device masked by what the device supports.
const WatchedEventTypes uint64 = nvml.EventTypeXidCriticalError |
	nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError

// Reader defaults.
const (
	DefaultWaitTimeout = time.Second
	DefaultMinBackoff  = time.Second
	DefaultMaxBackoff  = time.Minute
	// DefaultRetryMissing is how often GPUs left out of the set are tried
	// again.
	DefaultRetryMissing = 10 * time.Second
)

// Reader reads events from an EventSource in its own goroutine (Run) and
// counts them: Xid events into a Counter (source "nvml"), ECC events into
// per-GPU single- and double-bit counters. When the set fails (any Wait error
// other than ErrTimeout, or a failed Open) it is closed and re-opened with
// exponential backoff; the counts live in the Reader and its Counter, not in
// the set, so they stay monotonic across re-creation.
//
// Set the exported fields before Run.
type Reader struct {
	// WaitTimeout bounds each Wait. A Wait on the real library blocks in C
	// and cannot be interrupted, so this is also how long Run may take to
	// notice that its context ended. Zero means DefaultWaitTimeout.
	WaitTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before re-opening a failed
	// set; the wait doubles on each consecutive failure and resets after a
	// Wait succeeds or times out normally. Zero means the defaults.
	MinBackoff, MaxBackoff time.Duration
	// Logf, when set, is told about failures and recoveries.
	Logf func(format string, args ...any)
	// RetryMissing is how often GPUs left out of the set are registered
	// again; zero means DefaultRetryMissing.
	RetryMissing time.Duration
	// Now replaces time.Now in tests.
	Now func() time.Time
	// Instances names the MIG device behind an XID's instance IDs, so that
	// its count stays with that device (nil: counted by the IDs alone).
	Instances InstanceResolver

	src     EventSource
	counter *Counter

	up          atomic.Bool
	unsupported atomic.Bool
	recreated   atomic.Int64
	failures    atomic.Uint64
	events      atomic.Uint64

	mu        sync.Mutex
	ecc       map[string]*eccCount
	watched   map[string]uint64 // by GPU (boardKey): the event types it was ever registered for, or sent
	instances instanceCounts
	lastErr   error
	// cur is the open set (nil: none), for Follow and Coverage.
	cur Waiter
	// boards is whether each GPU (boardKey) answered in the latest sample
	// Follow saw.
	boards map[string]bool
	// renew asks Run to replace the set (a GPU the set has no slot for).
	renew chan struct{}
	// Coverage: the GPUs of the latest set, and the time with no set open.
	covered        []Coverage
	uncovered      time.Duration
	uncoveredSince time.Time // zero while a set is open
}

type eccCount struct{ single, double uint64 }

// NewReader returns a Reader of src that counts Xids into counter (a new
// Counter when nil).
func NewReader(src EventSource, counter *Counter) *Reader {
	if counter == nil {
		counter = NewCounter()
	}
	return &Reader{src: src, counter: counter, ecc: map[string]*eccCount{}, watched: map[string]uint64{},
		boards: map[string]bool{}, renew: make(chan struct{}, 1)}
}

// boardKey names a GPU by UUID, which follows it when NVML's indices move
// (a re-init that lists fewer or more GPUs), by index when NVML did not
// tell the UUID.
func boardKey(gpu int, uuid string) string {
	if uuid != "" {
		return uuid
	}
	return "#" + strconv.Itoa(gpu)
}

// Follow tells the Reader which GPUs the latest sample saw, and whether
// each answered. A GPU that answers again after it did not (a board back
// from a reset or from falling off the bus) is registered again on the
// open set at once, so its XIDs are seen from the next sample on; a GPU
// the set has no slot for makes Run replace the set. Boards that stay
// unregistered for other reasons are tried again every RetryMissing.
func (r *Reader) Follow(boards []Board) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range boards {
		k := boardKey(b.GPU, b.UUID)
		was, seen := r.boards[k]
		r.boards[k] = b.Up
		if !b.Up || (seen && was) || !seen {
			continue
		}
		reg, ok := r.cur.(BoardRegistrar)
		if !ok {
			continue
		}
		if !reg.RegisterAgain(b.GPU, b.UUID) {
			select {
			case r.renew <- struct{}{}:
			default:
			}
		}
	}
	if r.cur == nil || r.covered == nil {
		return
	}
	// A GPU that answers and that no slot of the set names (NVML lists
	// more GPUs than when the set was created) needs a new set.
	known := map[string]bool{}
	for _, c := range r.liveCoverage() {
		known[boardKey(c.GPU, c.UUID)] = true
	}
	slots := len(r.covered)
	for _, b := range boards {
		if b.Up && b.UUID != "" && !known[b.UUID] && b.GPU >= slots {
			select {
			case r.renew <- struct{}{}:
			default:
			}
			return
		}
	}
}

// liveCoverage is the open set's coverage now (r.mu held).
func (r *Reader) liveCoverage() []Coverage {
	if c, ok := r.cur.(CoverageReporter); ok {
		return c.Covered()
	}
	return r.covered
}

// Coverage returns, per GPU of the latest event set, whether it is
// registered now; every GPU is unregistered while no set is open.
func (r *Reader) Coverage() []Coverage {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cur != nil && r.covered != nil {
		r.covered = r.liveCoverage() // registrations that finished since
	}
	out := append([]Coverage(nil), r.covered...)
	if !r.uncoveredSince.IsZero() {
		for i := range out {
			out[i].Registered = false
		}
	}
	return out
}

// UncoveredSeconds returns how long, since Run started, no event set was
// open: XIDs raised then were lost (NVML keeps no history).
func (r *Reader) UncoveredSeconds() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.uncovered
	if !r.uncoveredSince.IsZero() {
		d += r.now().Sub(r.uncoveredSince)
	}
	return d.Seconds()
}

func (r *Reader) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// setOpen records that a set is open (w non-nil) or none is.
func (r *Reader) setOpen(w Waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	switch {
	case w != nil && !r.uncoveredSince.IsZero():
		r.uncovered += now.Sub(r.uncoveredSince)
		r.uncoveredSince = time.Time{}
	case w == nil && r.uncoveredSince.IsZero():
		r.uncoveredSince = now
	}
	r.cur = w
	if c, ok := w.(CoverageReporter); ok {
		r.covered = c.Covered()
		for _, g := range r.covered {
			if g.Registered {
				r.watched[boardKey(g.GPU, g.UUID)] |= g.Types
			}
		}
	} else if w != nil {
		r.covered = nil // the source cannot tell
	}
}

// Counter returns the Counter the Reader counts Xids into.
func (r *Reader) Counter() *Counter { return r.counter }

// Up reports whether an event set is open and its last Wait succeeded or
// timed out normally.
func (r *Reader) Up() bool { return r.up.Load() }

// Unsupported reports whether the node's boards do not support events (Open
// returned ErrNoDevices or ErrEventsNotSupported): Run then stops opening
// event sets, and the collector is not applicable rather than down.
func (r *Reader) Unsupported() bool { return r.unsupported.Load() }

// Recreated returns how many times the event set was opened again after a
// failure (the first successful Open is not counted).
func (r *Reader) Recreated() int { return int(r.recreated.Load()) }

// Failures returns how many Open or Wait failures Run has seen.
func (r *Reader) Failures() uint64 { return r.failures.Load() }

// Events returns how many events (of any type) Run has received.
func (r *Reader) Events() uint64 { return r.events.Load() }

// LastError returns the latest Open or Wait failure, nil if none.
func (r *Reader) LastError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// ECCEventCount is a GPU's single- and double-bit ECC error events
// received since the process started (both never decrease), and whether
// the GPU was ever registered for each type: a GPU with ECC off supports
// neither, and its 0 would mean nothing.
type ECCEventCount struct {
	Single, Double               uint64
	SingleWatched, DoubleWatched bool
}

// ECCEvents returns the ECC error events of the GPU with that uuid (at
// NVML index gpu when uuid is ""): the count follows the board when its
// index moves.
func (r *Reader) ECCEvents(gpu int, uuid string) ECCEventCount {
	r.mu.Lock()
	defer r.mu.Unlock()
	// A source that cannot name a GPU's UUID keys it by index.
	keys := []string{boardKey(gpu, "")}
	if uuid != "" {
		keys = append(keys, uuid)
	}
	var w uint64
	var c ECCEventCount
	for _, k := range keys {
		w |= r.watched[k]
		if n := r.ecc[k]; n != nil {
			c.Single += n.single
			c.Double += n.double
		}
	}
	c.SingleWatched, c.DoubleWatched = w&nvml.EventTypeSingleBitEccError != 0, w&nvml.EventTypeDoubleBitEccError != 0
	return c
}

// InstanceCounts returns the Xid counts per MIG device, ordered by GPU, GPU
// instance, compute instance, MIG device and code; totals never decrease.
// Events that came before their GPU's MIG devices were read are placed
// first, if the resolver can name them now.
func (r *Reader) InstanceCounts() []InstanceCount {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.instances.resolvePending(r.Instances, r.now())
	return r.instances.snapshot()
}

// Run reads events until ctx ends, then closes the set and returns ctx's
// error. It returns within about WaitTimeout of ctx ending.
//
// A set that fails is replaced without a gap and without an overlap (see
// replace): NVML delivers no event raised while no set is registered, and
// delivers one raised while two are to both.
func (r *Reader) Run(ctx context.Context) error {
	waitTimeout := r.WaitTimeout
	if waitTimeout <= 0 {
		waitTimeout = DefaultWaitTimeout
	}
	minB, maxB := r.MinBackoff, r.MaxBackoff
	if minB <= 0 {
		minB = DefaultMinBackoff
	}
	if maxB < minB {
		maxB = max(DefaultMaxBackoff, minB)
	}
	retryEvery := r.RetryMissing
	if retryEvery <= 0 {
		retryEvery = DefaultRetryMissing
	}
	defer r.up.Store(false)

	backoff := minB
	opened := false // whether Open ever succeeded
	var w Waiter
	r.setOpen(nil)
	closeSet := func() {
		if w != nil {
			r.mu.Lock()
			r.cur = nil // Follow must not register on a set being freed
			r.mu.Unlock()
			if err := w.Close(); err != nil {
				r.logf("xid: closing the event set: %v", err)
			}
			w = nil
			r.setOpen(nil)
		}
	}
	defer closeSet()
	lastRetry := time.Now()
	var lastRenew time.Time

	for ctx.Err() == nil {
		if w == nil {
			var err error
			w, err = r.src.Open()
			if errors.Is(err, ErrNotReady) {
				w = nil
				sleep(ctx, min(minB, waitTimeout))
				continue
			}
			if err != nil {
				w = nil
				if errors.Is(err, ErrNoDevices) || errors.Is(err, ErrEventsNotSupported) {
					// What the boards support does not change while the
					// driver is loaded: retrying would fail forever.
					r.unsupported.Store(true)
					r.mu.Lock()
					r.lastErr = err
					r.mu.Unlock()
					r.logf("xid: not watching XID and ECC events: %v (the boards do not support NVML events; XIDs are not counted on this node)", err)
					<-ctx.Done()
					return ctx.Err()
				}
				r.fail(fmt.Errorf("opening the event set: %w", err))
				sleep(ctx, backoff)
				backoff = min(backoff*2, maxB)
				continue
			}
			if opened {
				r.recreated.Add(1)
				r.logf("xid: event set re-created")
			}
			opened = true
			r.setOpen(w)
			lastRetry = time.Now()
		}
		if time.Since(lastRetry) >= retryEvery {
			lastRetry = time.Now()
			if m, ok := w.(MissingRetrier); ok {
				m.RetryMissing()
			}
		}
		select {
		case <-r.renew:
			if time.Since(lastRenew) < retryEvery {
				break // at most one set per RetryMissing for this
			}
			lastRenew = time.Now()
			// NVML lists a GPU the set has no slot for: a new set lists
			// the GPUs afresh.
			r.logf("xid: a GPU answers that the event set does not cover: creating a new set")
			r.setOpen(nil)
			nw, oerr := r.replace(w)
			w = nil
			if oerr != nil {
				if !errors.Is(oerr, ErrNotReady) {
					r.fail(fmt.Errorf("opening the event set: %w", oerr))
				}
				sleep(ctx, backoff)
				backoff = min(backoff*2, maxB)
				continue
			}
			w = nw
			r.recreated.Add(1)
			r.setOpen(w)
		default:
		}

		ev, err := w.Wait(waitTimeout)
		switch {
		case err == nil:
			r.up.Store(true)
			backoff = minB
			r.handle(ev)
		case errors.Is(err, ErrTimeout):
			r.up.Store(true)
			backoff = minB
		default:
			r.fail(fmt.Errorf("waiting for events: %w", err))
			r.mu.Lock()
			r.cur = nil // Follow must not register on a set being freed
			r.mu.Unlock()
			nw, oerr := r.replace(w)
			w = nil
			if oerr == nil {
				w = nw
				r.recreated.Add(1)
				r.logf("xid: event set re-created")
				r.setOpen(w)
				continue
			}
			r.setOpen(nil)
			if !errors.Is(oerr, ErrNotReady) {
				r.fail(fmt.Errorf("opening the event set: %w", oerr))
			}
			sleep(ctx, backoff)
			backoff = min(backoff*2, maxB)
		}
		r.setOpen(w) // registrations that finished late
	}
	return ctx.Err()
}

// replace closes the broken set old and opens the next one. A staged
// source creates the new set first (the slow part, during which old still
// receives events), then old is read until it holds nothing, the new set
// is registered and old closed at once: an event raised before the new
// set is registered is read from old, one raised after from the new set
// only, as old is closed unread. Only an event raised in the instant
// between old's last read and the registration is missed. A source that
// creates and registers in one call gets old read first, then its Open.
func (r *Reader) replace(old Waiter) (Waiter, error) {
	defer func() {
		if err := old.Close(); err != nil {
			r.logf("xid: closing the event set: %v", err)
		}
	}()
	st, ok := r.src.(StagedSource)
	if !ok {
		r.drain(old)
		return r.src.Open()
	}
	set, err := st.Create()
	r.drain(old)
	if err != nil {
		return nil, err
	}
	return set.Register()
}

// drain reads the events a failed set still holds, until it answers
// anything else.
func (r *Reader) drain(w Waiter) {
	for i := 0; i < 10000; i++ {
		ev, err := w.Wait(time.Millisecond)
		if err != nil {
			return
		}
		r.handle(ev)
	}
}

func (r *Reader) fail(err error) {
	r.up.Store(false)
	r.failures.Add(1)
	r.mu.Lock()
	r.lastErr = err
	r.mu.Unlock()
	r.logf("xid: %v", err)
}

func (r *Reader) handle(ev Event) {
	r.events.Add(1)
	at := ev.Time
	if at.IsZero() {
		at = time.Now()
	}
	switch {
	case ev.Type&nvml.EventTypeXidCriticalError != 0:
		r.counter.Add(ev.GPU, ev.UUID, int(ev.Data), at)
		if ev.Instance != nil {
			// A tenant's XID 13/31/43 on MIG points at its instance, and
			// so at its pod.
			r.mu.Lock()
			r.instances.add(r.Instances, instanceXID{gpu: ev.GPU, uuid: ev.UUID, in: *ev.Instance, code: int(ev.Data), at: at, received: time.Now()})
			r.mu.Unlock()
		}
	case ev.Type&(nvml.EventTypeSingleBitEccError|nvml.EventTypeDoubleBitEccError) != 0:
		r.mu.Lock()
		k := boardKey(ev.GPU, ev.UUID)
		c := r.ecc[k]
		if c == nil {
			c = &eccCount{}
			r.ecc[k] = c
		}
		r.watched[k] |= ev.Type // a GPU that sent one has them, whatever its source says
		if ev.Type&nvml.EventTypeSingleBitEccError != 0 {
			c.single++
		}
		if ev.Type&nvml.EventTypeDoubleBitEccError != 0 {
			c.double++
		}
		r.mu.Unlock()
	}
}

func (r *Reader) logf(format string, args ...any) {
	if r.Logf != nil {
		r.Logf(format, args...)
	}
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// NVMLLibrary is the part of the NVML library the NVML event source uses.
// nvml.Interface (the real library, or go-nvml's mock) satisfies it. NVML
// must be initialised (Init) before Open and stay so while the set is used.
type NVMLLibrary interface {
	EventSetCreate() (nvml.EventSet, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return)
}

// NVMLDevice is the part of an NVML device handle the NVML event source
// uses; nvml.Device satisfies it, and so does any type embedding one.
type NVMLDevice interface {
	GetIndex() (int, nvml.Return)
	GetUUID() (string, nvml.Return)
	GetSupportedEventTypes() (uint64, nvml.Return)
	RegisterEvents(eventTypes uint64, set nvml.EventSet) nvml.Return
}

// NVMLEventSource is the EventSource over the real NVML library.
type NVMLEventSource struct {
	lib     NVMLLibrary
	devices []NVMLDevice
	// Logf, when set, is told about devices skipped at Open.
	Logf func(format string, args ...any)
	// RegisterTimeout bounds how long Open waits for the GPUs to register;
	// zero means DefaultRegisterTimeout.
	RegisterTimeout time.Duration

	mu       sync.Mutex
	inFlight map[int]bool // GPUs (by position) whose registration has not returned
	// known is each GPU's (by position) index and UUID when it last told
	// them: a GPU lost from the bus cannot, and its coverage keeps them.
	known map[int]Coverage
}

// DefaultRegisterTimeout bounds the registration of all GPUs at Open.
const DefaultRegisterTimeout = 2 * time.Second

// NewNVMLEventSource returns an EventSource on lib. With devices nil, every
// Open enumerates all devices afresh (DeviceGetCount, DeviceGetHandleByIndex);
// otherwise it registers the given devices. On each device it registers the
// WatchedEventTypes the device supports: a device that supports none of them
// (NOT_SUPPORTED) is skipped, and so is one that fails (for example a GPU
// lost from the bus), so one bad GPU does not stop the others. Devices are
// registered in parallel, under RegisterTimeout: one whose calls hang is
// left out, joins the set when its registration returns, and is tried again
// by RetryMissing. Open fails only when the set cannot be created or no
// device could be registered; it returns ErrEventsNotSupported when the
// driver cannot create event sets and ErrNoDevices when every device
// answered that it supports none of the watched events (not when some
// failed: that is worth a retry).
func NewNVMLEventSource(lib NVMLLibrary, devices []NVMLDevice) *NVMLEventSource {
	return &NVMLEventSource{lib: lib, devices: devices}
}

type registered struct {
	dev  NVMLDevice
	gpu  int
	uuid string
}

// Open creates an NVML event set and registers the devices on it.
func (s *NVMLEventSource) Open() (Waiter, error) {
	set, err := s.Create()
	if err != nil {
		return nil, err
	}
	return set.Register()
}

// Create creates an NVML event set, no device registered on it yet.
func (s *NVMLEventSource) Create() (UnregisteredSet, error) {
	n := len(s.devices)
	if s.devices == nil {
		var ret nvml.Return
		if n, ret = s.lib.DeviceGetCount(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("counting devices: %w", ret)
		}
	}
	set, ret := s.lib.EventSetCreate()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		return nil, fmt.Errorf("creating an NVML event set: %w", ErrEventsNotSupported)
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("creating an NVML event set: %w", ret)
	}
	return &nvmlSet{src: s, set: set, n: n}, nil
}

// nvmlSet is an NVML event set created, its n devices not registered yet.
type nvmlSet struct {
	src *NVMLEventSource
	set nvml.EventSet
	n   int
}

// Free frees the set unused.
func (c *nvmlSet) Free() error {
	if ret := c.set.Free(); ret != nvml.SUCCESS {
		return fmt.Errorf("freeing the NVML event set: %w", ret)
	}
	return nil
}

// Register registers the devices on the set, in parallel and under
// RegisterTimeout.
func (c *nvmlSet) Register() (Waiter, error) {
	s, set, n := c.src, c.set, c.n
	w := &nvmlWaiter{set: set, src: s, slots: make([]Coverage, n)}
	s.mu.Lock()
	for i := range w.slots {
		// Until it tells them, a GPU has the identity it last had.
		w.slots[i] = Coverage{GPU: i}
		if k, ok := s.known[i]; ok {
			w.slots[i] = k
		}
	}
	s.mu.Unlock()
	done := make(chan struct{}, n)
	pending := 0
	for i := 0; i < n; i++ {
		if w.start(i, done) {
			pending++
		}
	}
	timeout := s.RegisterTimeout
	if timeout <= 0 {
		timeout = DefaultRegisterTimeout
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
wait:
	for ; pending > 0; pending-- {
		select {
		case <-done:
		case <-t.C:
			s.logf("xid: %d GPU(s) did not register for events within %s: their XIDs are not seen until they do (gpu_xid_events_registered)", pending, timeout)
			break wait
		}
	}
	w.mu.Lock()
	none := len(w.regs) == 0
	w.mu.Unlock()
	if none && pending == 0 {
		_ = set.Free()
		w.mu.Lock()
		failed := 0
		for _, c := range w.slots {
			if !c.Unsupported {
				failed++
			}
		}
		w.mu.Unlock()
		if failed > 0 {
			return nil, fmt.Errorf("no device registered for events: %d failed (see the log)", failed)
		}
		return nil, ErrNoDevices
	}
	return w, nil
}

// Registering returns how many device registrations have not returned (a
// GPU whose calls hang); the library must not be shut down under them.
func (s *NVMLEventSource) Registering() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inFlight)
}

// start registers device i on the waiter's set in its own goroutine,
// unless an earlier registration of that device has not returned: a hung
// GPU holds one goroutine, never one per attempt.
func (w *nvmlWaiter) start(i int, done chan<- struct{}) bool {
	s := w.src
	s.mu.Lock()
	if s.inFlight == nil {
		s.inFlight = map[int]bool{}
	}
	if s.inFlight[i] {
		s.mu.Unlock()
		return false
	}
	s.inFlight[i] = true
	s.mu.Unlock()
	go func() {
		defer func() {
			s.mu.Lock()
			delete(s.inFlight, i)
			s.mu.Unlock()
			if done != nil {
				done <- struct{}{}
			}
		}()
		w.register(i)
	}()
	return true
}

// register adds device i to the set, or says why not.
func (w *nvmlWaiter) register(i int) {
	s := w.src
	var d NVMLDevice
	if s.devices != nil {
		d = s.devices[i]
	} else {
		h, ret := s.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS || h == nil {
			s.logf("xid: skipping GPU %d: getting its handle: %v", i, ret)
			return
		}
		d = h
	}
	gpu, ret := d.GetIndex()
	if ret != nvml.SUCCESS {
		s.logf("xid: skipping a device: getting its index: %v", ret)
		return
	}
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		s.logf("xid: skipping GPU %d: getting its UUID: %v", gpu, ret)
		return
	}
	s.mu.Lock()
	if s.known == nil {
		s.known = map[int]Coverage{}
	}
	s.known[i] = Coverage{GPU: gpu, UUID: uuid}
	s.mu.Unlock()
	w.mu.Lock()
	w.slots[i].GPU, w.slots[i].UUID = gpu, uuid
	w.mu.Unlock()
	unsupported := func() {
		w.mu.Lock()
		w.slots[i].Unsupported = true
		w.mu.Unlock()
	}
	supported, ret := d.GetSupportedEventTypes()
	if ret == nvml.ERROR_NOT_SUPPORTED {
		unsupported()
		return
	}
	if ret != nvml.SUCCESS {
		s.logf("xid: skipping GPU %d: getting its event types: %v", gpu, ret)
		return
	}
	types := supported & WatchedEventTypes
	if types == 0 {
		unsupported()
		return
	}
	w.mu.Lock()
	closed := w.closed
	w.mu.Unlock()
	if closed {
		return
	}
	if ret := d.RegisterEvents(types, w.set); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_NOT_SUPPORTED {
			unsupported()
		} else {
			s.logf("xid: skipping GPU %d: registering events: %v", gpu, ret)
		}
		return
	}
	w.mu.Lock()
	// A GPU registered again replaces its earlier entry: its index may
	// have moved since.
	w.regs = slices.DeleteFunc(w.regs, func(r registered) bool { return r.uuid == uuid })
	w.regs = append(w.regs, registered{dev: d, gpu: gpu, uuid: uuid})
	w.slots[i].Registered, w.slots[i].Types = true, types
	w.mu.Unlock()
}

func (s *NVMLEventSource) logf(format string, args ...any) {
	if s.Logf != nil {
		s.Logf(format, args...)
	}
}

type nvmlWaiter struct {
	set nvml.EventSet
	src *NVMLEventSource

	mu     sync.Mutex // guards regs, slots and closed: registrations finish late
	regs   []registered
	slots  []Coverage // by device position
	closed bool
}

// Covered says which devices are registered on the set.
func (w *nvmlWaiter) Covered() []Coverage {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Coverage(nil), w.slots...)
}

// RetryMissing registers again, on the same set, the devices left out
// (failed or hung at Open), without waiting for them.
func (w *nvmlWaiter) RetryMissing() {
	w.mu.Lock()
	var missing []int
	for i, c := range w.slots {
		if !c.Registered && !c.Unsupported {
			missing = append(missing, i)
		}
	}
	w.mu.Unlock()
	for _, i := range missing {
		w.start(i, nil)
	}
}

// RegisterAgain registers the GPU's slot on the set again (BoardRegistrar),
// without waiting for it: by UUID, by index where the UUID is unknown.
func (w *nvmlWaiter) RegisterAgain(gpu int, uuid string) bool {
	w.mu.Lock()
	slot := -1
	for i, c := range w.slots {
		if (uuid != "" && c.UUID == uuid) || (slot < 0 && c.UUID == "" && c.GPU == gpu) {
			slot = i
		}
	}
	if slot >= 0 {
		w.slots[slot].Registered, w.slots[slot].Unsupported = false, false
	}
	w.mu.Unlock()
	if slot < 0 {
		return false
	}
	w.start(slot, nil)
	return true
}

// Wait blocks in NVML for up to timeout (rounded up to a millisecond).
func (w *nvmlWaiter) Wait(timeout time.Duration) (Event, error) {
	ms := timeout.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms > int64(^uint32(0)) {
		ms = int64(^uint32(0))
	}
	data, ret := w.set.Wait(uint32(ms))
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_TIMEOUT:
		return Event{}, ErrTimeout
	default:
		return Event{}, fmt.Errorf("NVML event set wait: %w", ret)
	}
	ev := Event{GPU: -1, Type: data.EventType, Data: data.EventData, Time: time.Now(),
		Instance: eventInstance(data.GpuInstanceId, data.ComputeInstanceId)}
	w.mu.Lock()
	r, ok := w.lookup(data.Device)
	w.mu.Unlock()
	if ok {
		ev.GPU, ev.UUID = r.gpu, r.uuid
	}
	return ev, nil
}

// lookup finds the registered device an event came from: by handle, or, when
// the handle's type differs from the registered one (a wrapped device), by
// UUID.
func (w *nvmlWaiter) lookup(d nvml.Device) (registered, bool) {
	if d == nil {
		return registered{}, false
	}
	for _, r := range w.regs {
		if sameHandle(d, r.dev) {
			return r, true
		}
	}
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		return registered{}, false
	}
	for _, r := range w.regs {
		if r.uuid == uuid {
			return r, true
		}
	}
	return registered{}, false
}

// sameHandle compares two device handles; a handle type that is not
// comparable compares unequal instead of panicking.
func sameHandle(a, b any) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// Close frees the NVML event set.
func (w *nvmlWaiter) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	if ret := w.set.Free(); ret != nvml.SUCCESS {
		return fmt.Errorf("freeing the NVML event set: %w", ret)
	}
	return nil
}
