// Package fakedcgm is a fake DCGM host engine: an in-memory
// collector/dcgm Client whose fields are set by a test or derived from a
// simulated node's activity, with blanks, not-supported fields, health
// incidents, XIDs and a host engine that can be lost.
package fakedcgm

import (
	"errors"
	"sync"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
)

// SimDevice is one GPU of a Fake: its NVML index, physical UUID and, for a
// MIG-enabled GPU, the NVML GPU instance IDs of its MIG instances and their
// compute instances.
type SimDevice struct {
	GPU          int
	UUID         string
	GPUInstances []int
	// ComputeInstances lists the NVML compute instance IDs of a GPU
	// instance, by GPU instance ID; a GPU instance not listed has one,
	// compute instance 0. DCGM lists every compute instance as an entity of
	// its own (DCGM_FE_GPU_CI), one that fills its GPU instance included.
	ComputeInstances map[int][]int
}

// ActivityFunc gives the SM active ratio (0-1) of a whole GPU (gpuInstance
// and computeInstance -1), of a MIG GPU instance (computeInstance -1) or of
// a MIG compute instance at the moment the fake is read; ok false means "no
// data" (DCGM returns blanks). The simulated node derives it from its
// utilisation curves.
type ActivityFunc func(gpu, gpuInstance, computeInstance int) (smActive float64, ok bool)

// How a Fake derives the other fields from the SM active ratio a
// (deterministic, so tests and the simulated node can predict them). The
// byte fields are rates in bytes per second, as DCGM reports them.
var simDerived = [dcgm.NumFields]float64{
	dcgm.GraphicsActive: 1.1, // min(1, 1.1a)
	dcgm.SMActive:       1,
	dcgm.SMOccupancy:    0.5,
	dcgm.TensorActive:   0.3,
	dcgm.DRAMActive:     0.4,
	dcgm.FP64Active:     0.02,
	dcgm.FP32Active:     0.2,
	dcgm.FP16Active:     0.1,
	dcgm.PCIeTxBytes:    1e9, // B/s at a = 1
	dcgm.PCIeRxBytes:    2e9,
	dcgm.NVLinkTxBytes:  10e9,
	dcgm.NVLinkRxBytes:  10e9,
}

// SimValue returns the value a Fake built by NewSimulated gives field f for
// SM active ratio a (for the byte fields: the rate in bytes/s).
func SimValue(f dcgm.Field, a float64) float64 {
	if f < 0 || int(f) >= dcgm.NumFields {
		return 0
	}
	v := simDerived[f] * a
	if !f.IsCounter() {
		v = min(1, max(0, v))
	}
	return v
}

// fieldType is the DCGM type of each field: the ratios are doubles, the
// byte rates and XIDs are int64.
func fieldType(id uint16) byte {
	switch id {
	case dcgm.FieldIDPCIeTxBytes, dcgm.FieldIDPCIeRxBytes, dcgm.FieldIDNVLinkTxBytes, dcgm.FieldIDNVLinkRxBytes, dcgm.FieldIDXIDErrors:
		return dcgm.FieldTypeInt64
	}
	return dcgm.FieldTypeDouble
}

type fakeKey struct {
	uuid string
	gi   int
	ci   int
	f    dcgm.Field
}

type fakeValue struct {
	kind   int // fakeSet, fakeBlank, fakeNotSupported
	v      float64
	frozen time.Time // non-zero: DCGM's timestamp stays here (a stale field)
}

const (
	fakeSet = iota
	fakeBlank
	fakeNotSupported
)

type fakeEntity struct {
	info dcgm.DeviceInfo
}

type fakeXID struct {
	code int
	at   time.Time
}

// Fake is an in-memory Client for tests and the simulated node. Values
// are set per device (UUID, GPU instance; -1 whole GPU) and field, or
// derived from an ActivityFunc (NewSimulated); a field with neither comes
// back blank. It can return blanks and not-supported fields, report health
// incidents and XIDs, fail like a lost host engine (SetLost) and counts
// every call. It is safe for concurrent use; Open hands out the Fake
// itself, so pass f.Open to NewSampler.
type Fake struct {
	mu       sync.Mutex
	ents     []fakeEntity
	byEntity map[dcgm.Entity]dcgm.DeviceInfo
	values   map[fakeKey]fakeValue
	activity ActivityFunc
	health   map[string]map[string]string // uuid -> system -> warn|fail
	// healthOf, when set, adds results that change over time (a simulated
	// node's faults) to those SetHealth set.
	healthOf func(uuid string) map[string]string
	xids     map[string]fakeXID
	lost     bool
	closed   bool
	failNext map[string]int
	calls    map[string]int
	watched  []dcgm.Entity
	every    time.Duration
	now      func() time.Time
}

// NewFake returns a Fake with the given GPUs. With no values set every
// field is blank.
func NewFake(devices ...SimDevice) *Fake {
	f := &Fake{
		values:   map[fakeKey]fakeValue{},
		health:   map[string]map[string]string{},
		xids:     map[string]fakeXID{},
		failNext: map[string]int{},
		calls:    map[string]int{},
		now:      time.Now,
	}
	f.setDevices(devices)
	return f
}

// NewSimulated returns a Fake whose fields follow activity: SM active is
// activity's value and the other fields are derived from it (SimValue),
// per whole GPU, MIG GPU instance and MIG compute instance, as far as DCGM
// measures the field there (Field.Level): like DCGM, the fake answers a
// field read from a finer entity than its level with no data, so a compute
// instance has no DRAM ratio and no MIG instance has PCIe or NVLink bytes.
func NewSimulated(devices []SimDevice, activity ActivityFunc) *Fake {
	f := NewFake(devices...)
	f.activity = activity
	return f
}

// SetDevices replaces the GPUs (a MIG reconfiguration); the sampler picks
// the change up at its next rediscovery or reconnect.
func (f *Fake) SetDevices(devices []SimDevice) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.setDevices(devices)
}

func (f *Fake) setDevices(devices []SimDevice) {
	f.ents = nil
	f.byEntity = map[dcgm.Entity]dcgm.DeviceInfo{}
	var giID, ciID uint
	for i, d := range devices {
		// DCGM's entity IDs are its own: GPUs by position, GPU and compute
		// instances numbered across the node, none equal to NVML's numbers.
		g := dcgm.DeviceInfo{Entity: dcgm.Entity{Kind: dcgm.EntityGPU, ID: uint(i)}, GPU: d.GPU, UUID: d.UUID, GPUInstance: -1, ComputeInstance: -1, Parent: uint(i)}
		f.ents = append(f.ents, fakeEntity{g})
		f.byEntity[g.Entity] = g
		for _, gi := range d.GPUInstances {
			e := dcgm.DeviceInfo{Entity: dcgm.Entity{Kind: dcgm.EntityGPUInstance, ID: giID}, GPU: d.GPU, UUID: d.UUID, GPUInstance: gi, ComputeInstance: -1, Parent: uint(i)}
			giID++
			f.ents = append(f.ents, fakeEntity{e})
			f.byEntity[e.Entity] = e
			cis, ok := d.ComputeInstances[gi]
			if !ok {
				cis = []int{0}
			}
			for _, ci := range cis {
				c := e
				c.Entity, c.ComputeInstance = dcgm.Entity{Kind: dcgm.EntityComputeInstance, ID: ciID}, ci
				ciID++
				f.ents = append(f.ents, fakeEntity{c})
				f.byEntity[c.Entity] = c
			}
		}
	}
}

// SetActivity replaces the activity function (nil: none).
func (f *Fake) SetActivity(a ActivityFunc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.activity = a
}

// SetClock replaces the clock the fake timestamps values with.
func (f *Fake) SetClock(now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// SetValue sets a field of a whole GPU (gi -1) or MIG GPU instance; for
// the byte fields v is a rate in bytes/s. It overrides the activity
// function, and is answered even where DCGM would have no data (a byte
// rate on a GPU instance), as older DCGM profiling back-ends do.
func (f *Fake) SetValue(uuid string, gi int, field dcgm.Field, v float64) {
	f.set(fakeKey{uuid, gi, -1, field}, fakeValue{kind: fakeSet, v: v})
}

// SetComputeInstanceValue is SetValue for compute instance ci of GPU
// instance gi.
func (f *Fake) SetComputeInstanceValue(uuid string, gi, ci int, field dcgm.Field, v float64) {
	f.set(fakeKey{uuid, gi, ci, field}, fakeValue{kind: fakeSet, v: v})
}

// SetBlank makes a field come back as DCGM's blank sentinel.
func (f *Fake) SetBlank(uuid string, gi int, field dcgm.Field) {
	f.set(fakeKey{uuid, gi, -1, field}, fakeValue{kind: fakeBlank})
}

// SetNotSupported makes a field come back not supported (status and
// sentinel value, as DCGM does).
func (f *Fake) SetNotSupported(uuid string, gi int, field dcgm.Field) {
	f.set(fakeKey{uuid, gi, -1, field}, fakeValue{kind: fakeNotSupported})
}

// Freeze sets a field's value with a DCGM timestamp that stays at `at`:
// DCGM stopped updating it.
func (f *Fake) Freeze(uuid string, gi int, field dcgm.Field, v float64, at time.Time) {
	f.set(fakeKey{uuid, gi, -1, field}, fakeValue{kind: fakeSet, v: v, frozen: at})
}

// ClearValue removes what SetValue, SetBlank, SetNotSupported or Freeze
// set for a field.
func (f *Fake) ClearValue(uuid string, gi int, field dcgm.Field) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.values, fakeKey{uuid, gi, -1, field})
}

func (f *Fake) set(k fakeKey, v fakeValue) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[k] = v
}

// SetHealthSource adds health results that change over time: of reports a
// GPU's results now (system -> warn or fail), ahead of SetHealth's.
func (f *Fake) SetHealthSource(of func(uuid string) map[string]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.healthOf = of
}

// SetHealth sets a GPU's health result for a system (HealthPCIe, ...);
// HealthPass clears it.
func (f *Fake) SetHealth(uuid, system, result string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.health[uuid]
	if m == nil {
		m = map[string]string{}
		f.health[uuid] = m
	}
	if result == dcgm.HealthPass || result == "" {
		delete(m, system)
		return
	}
	m[system] = result
}

// SetXID records an XID on a GPU at time at (DCGM keeps the last one).
func (f *Fake) SetXID(uuid string, xid int, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.xids[uuid] = fakeXID{xid, at}
}

// SetLost simulates a lost host engine: while lost, Open and every method
// fail with an error wrapping ErrConnection.
func (f *Fake) SetLost(lost bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost = lost
}

// FailNext makes the next n calls of method ("Latest", "Devices", "Watch",
// "HealthCheck", "Open") fail with a transient error (not ErrConnection).
func (f *Fake) FailNext(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext[method] = n
}

// Calls returns how often a method ("Open", "Devices", "Watch", "Latest",
// "HealthCheck", "Close") was called.
func (f *Fake) Calls(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

// Watched returns the entities and update period of the last Watch.
func (f *Fake) Watched() ([]dcgm.Entity, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]dcgm.Entity(nil), f.watched...), f.every
}

// ErrFakeTransient is the error FailNext injects.
var ErrFakeTransient = errors.New("fake DCGM: transient error")

// enter counts a call and returns the error it should fail with. f.mu held.
func (f *Fake) enter(method string) error {
	f.calls[method]++
	if f.lost {
		return errors.Join(dcgm.ErrConnection, errors.New("fake DCGM: host engine lost"))
	}
	if n := f.failNext[method]; n > 0 {
		f.failNext[method] = n - 1
		return ErrFakeTransient
	}
	if f.closed && method != "Open" {
		return errors.Join(dcgm.ErrConnection, errors.New("fake DCGM: client closed"))
	}
	return nil
}

// Open is a func(Config) (Client, error) for NewSampler: it returns the
// Fake itself, or fails while the host engine is lost.
func (f *Fake) Open(dcgm.Config) (dcgm.Client, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Open"); err != nil {
		return nil, err
	}
	f.closed = false
	return f, nil
}

// Devices implements Client.
func (f *Fake) Devices() ([]dcgm.DeviceInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Devices"); err != nil {
		return nil, err
	}
	out := make([]dcgm.DeviceInfo, len(f.ents))
	for i, e := range f.ents {
		out[i] = e.info
	}
	return out, nil
}

// Watch implements Client.
func (f *Fake) Watch(entities []dcgm.Entity, _ []uint16, every, _ time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Watch"); err != nil {
		return err
	}
	f.watched = append([]dcgm.Entity(nil), entities...)
	f.every = every
	return nil
}

// Latest implements Client.
func (f *Fake) Latest(entities []dcgm.Entity, fieldIDs []uint16) ([]dcgm.RawValue, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("Latest"); err != nil {
		return nil, err
	}
	now := f.now()
	out := make([]dcgm.RawValue, 0, len(entities)*len(fieldIDs))
	for _, e := range entities {
		info, known := f.byEntity[e]
		var act float64
		actOK := false
		if known && f.activity != nil {
			act, actOK = f.activity(info.GPU, info.GPUInstance, info.ComputeInstance)
		}
		for _, id := range fieldIDs {
			rv := dcgm.RawValue{Entity: e, FieldID: id, Type: fieldType(id), Time: now}
			if !known {
				rv.Status = dcgm.StatusNoData
				out = append(out, rv)
				continue
			}
			if id == dcgm.FieldIDXIDErrors {
				if e.Kind != dcgm.EntityGPU {
					setNotSupported(&rv)
				} else if x, ok := f.xids[info.UUID]; ok {
					rv.Int, rv.Time = int64(x.code), x.at
				} else {
					setBlank(&rv)
				}
				out = append(out, rv)
				continue
			}
			field, ok := dcgm.FieldByID(id)
			if !ok {
				rv.Status = dcgm.StatusNotWatched
				out = append(out, rv)
				continue
			}
			fv, set := f.values[fakeKey{info.UUID, info.GPUInstance, info.ComputeInstance, field}]
			switch {
			case set && fv.kind == fakeBlank:
				setBlank(&rv)
			case set && fv.kind == fakeNotSupported:
				setNotSupported(&rv)
			case set:
				setNumber(&rv, fv.v)
				if !fv.frozen.IsZero() {
					rv.Time = fv.frozen
				}
			case !field.MeasuredFor(e.Kind):
				// Measured only for the entity above (DRAM per GPU
				// instance, bytes per GPU): DCGM has no data here.
				rv.Status = dcgm.StatusNoData
				setBlank(&rv)
			case actOK:
				setNumber(&rv, SimValue(field, act))
			default:
				setBlank(&rv)
			}
			out = append(out, rv)
		}
	}
	return out, nil
}

func setNumber(rv *dcgm.RawValue, v float64) {
	if rv.Type == dcgm.FieldTypeInt64 {
		rv.Int = int64(v)
	} else {
		rv.Float = v
	}
}

func setBlank(rv *dcgm.RawValue) {
	rv.Int, rv.Float = dcgm.Int64Blank, dcgm.FP64Blank
}

func setNotSupported(rv *dcgm.RawValue) {
	rv.Status = dcgm.StatusNotSupported
	rv.Int, rv.Float = dcgm.Int64NotSupported, dcgm.FP64NotSupported
}

// HealthCheck implements Client.
func (f *Fake) HealthCheck() ([]dcgm.HealthIncident, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("HealthCheck"); err != nil {
		return nil, err
	}
	var out []dcgm.HealthIncident
	for _, e := range f.ents {
		if e.info.Entity.Kind != dcgm.EntityGPU {
			continue
		}
		var now map[string]string
		if f.healthOf != nil {
			now = f.healthOf(e.info.UUID)
		}
		for _, sys := range dcgm.HealthSystems {
			r := now[sys]
			if r == "" {
				r = f.health[e.info.UUID][sys]
			}
			if r != "" {
				out = append(out, dcgm.HealthIncident{Entity: e.info.Entity, System: sys, Result: r, Message: "fake incident"})
			}
		}
	}
	return out, nil
}

// Close implements Client; the Fake can be opened again.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["Close"]++
	f.closed = true
	return nil
}
