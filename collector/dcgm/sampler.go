// Package dcgm samples NVIDIA DCGM in the background for the exporter: the
// profiling ratios (SM active and occupancy, tensor, DRAM, FP pipes, graphics
// engine) per GPU, per MIG GPU instance and per MIG compute instance, as far
// as DCGM measures each field there (Field.Level), PCIe and NVLink byte
// counters per GPU, health watches and the last XID.
//
// A Sampler runs one goroutine (Run) that connects (embedded host engine or
// a standalone nv-hostengine), watches the fields, reads them every
// Config.Interval and publishes an immutable Snapshot through an atomic
// pointer. Snapshot never blocks and never calls DCGM, so a scrape can never
// hang on DCGM. When the host engine goes away the snapshot turns down at
// once, and the sampler reconnects with capped exponential backoff until
// its context ends. DCGM is reached through the narrow Client interface;
// Fake implements it for tests and the simulated node.
package dcgm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Snapshot is the sampler's latest published state. It is shared and
// immutable: callers must not modify it or its maps.
type Snapshot struct {
	// Time is when the values were sampled (or when the sampler went
	// down). Zero before Run starts.
	Time time.Time
	// Up: connected, and the last sample is at most MaxMissed intervals
	// old. Devices is empty when Up is false.
	Up      bool
	Devices []DeviceValues
	// Mode is the effective mode: auto resolves to embedded once libdcgm
	// loads, or to off when it does not.
	Mode Mode
	// Reason says why the sampler is not up ("" when it is).
	Reason string
}

// Find returns the values of a whole GPU (gpuInstance -1) or of a MIG GPU
// instance, by physical GPU UUID.
func (s *Snapshot) Find(uuid string, gpuInstance int) (DeviceValues, bool) {
	return s.FindComputeInstance(uuid, gpuInstance, -1)
}

// FindComputeInstance returns the values of a MIG compute instance of a GPU
// instance (computeInstance -1: of the GPU instance itself), by physical GPU
// UUID.
func (s *Snapshot) FindComputeInstance(uuid string, gpuInstance, computeInstance int) (DeviceValues, bool) {
	if s == nil {
		return DeviceValues{}, false
	}
	for _, d := range s.Devices {
		if d.UUID == uuid && d.GPUInstance == gpuInstance && d.ComputeInstance == computeInstance {
			return d, true
		}
	}
	return DeviceValues{}, false
}

// DeviceValues are the fresh DCGM values of one whole GPU, MIG GPU instance
// or MIG compute instance. Fields DCGM gave no fresh value for (blank, not
// supported, not watched, older than MaxMissed intervals) are absent from
// Values, and so are fields DCGM does not measure for the entity itself
// (Field.MeasuredFor): a compute instance has no DRAM ratio and no byte
// counters, a GPU instance no byte counters.
type DeviceValues struct {
	GPU  int    // NVML index (the parent's for a MIG instance)
	UUID string // physical GPU UUID (the parent's for a MIG instance)
	// GPUInstance is the NVML GPU instance ID of a MIG instance, -1 for a
	// whole GPU.
	GPUInstance int
	// ComputeInstance is the NVML compute instance ID of a MIG compute
	// instance, -1 for a whole GPU or a GPU instance.
	ComputeInstance int
	// Values: ratios 0-1, and for the PCIe/NVLink fields monotonically
	// increasing byte counters (see PCIeTxBytes).
	Values map[Field]float64
	// Rates are the PCIe/NVLink fields as DCGM reports them: the current
	// rate in bytes per second, present whenever the counter in Values is.
	// One DCGM sample is enough for a rate, where a rate made from the
	// counters needs two in a row.
	Rates map[Field]float64
	// Health maps each of HealthSystems to pass, warn or fail; whole GPUs
	// only, nil when the health check failed or is not available.
	Health map[string]string
	// LastXID is the last XID DCGM recorded for a whole GPU (0: none) and
	// LastXIDTime when it happened. DCGM keeps only the latest XID; count
	// XIDs from NVML events, not from this.
	LastXID     int
	LastXIDTime time.Time
}

// Value returns one field's value.
func (d DeviceValues) Value(f Field) (float64, bool) {
	v, ok := d.Values[f]
	return v, ok
}

// Rate returns a PCIe/NVLink field's current rate, in bytes per second.
func (d DeviceValues) Rate(f Field) (float64, bool) {
	v, ok := d.Rates[f]
	return v, ok
}

type devKey struct {
	uuid string
	gi   int
	ci   int
}

// fieldState tracks one field of one entity during a connection.
type fieldState struct {
	value float64   // ratio, or the counter total
	rate  float64   // a counter's rate as DCGM reported it
	ts    time.Time // DCGM's timestamp of the last value
	fresh time.Time // local time at which ts last advanced
	ok    bool
}

// counterState is a byte counter integrated from a DCGM rate. It outlives
// connections so that counters stay monotonic across reconnects.
type counterState struct {
	total  float64
	lastTS time.Time // DCGM timestamp of the last rate integrated
}

type heldHealth struct {
	status string
	at     time.Time
}

type devState struct {
	info   DeviceInfo
	key    devKey
	fields [NumFields]fieldState
	xid    int
	xidAt  time.Time
}

// Sampler reads DCGM in the background; see the package documentation.
type Sampler struct {
	cfg    Config
	open   func(Config) (Client, error)
	maxAge time.Duration
	snap   atomic.Pointer[Snapshot]

	running atomic.Bool
	// onXID is told of each XID DCGM records for a whole GPU (SetXIDSink).
	onXID func(gpu int, uuid string, code int, at time.Time)

	// Owned by the Run goroutine.
	client       Client
	devs         []*devState
	byEntity     map[Entity]*devState
	entities     []Entity
	fieldIDs     []uint16
	failures     int
	lastDiscover time.Time
	counters     map[devKey]*[NumFields]counterState
	health       map[devKey]map[string]heldHealth
}

// NewSampler returns a sampler for cfg (defaults filled in). open connects
// to DCGM; nil means DefaultOpen. Tests pass a Fake's Open.
func NewSampler(cfg Config, open func(Config) (Client, error)) *Sampler {
	cfg = cfg.withDefaults()
	if open == nil {
		open = DefaultOpen
	}
	s := &Sampler{
		cfg:      cfg,
		open:     open,
		maxAge:   time.Duration(cfg.MaxMissed)*cfg.Interval + cfg.Interval/2,
		counters: map[devKey]*[NumFields]counterState{},
		health:   map[devKey]map[string]heldHealth{},
	}
	s.fieldIDs = make([]uint16, 0, NumFields+1)
	for f := range NumFields {
		s.fieldIDs = append(s.fieldIDs, Field(f).ID())
	}
	s.fieldIDs = append(s.fieldIDs, FieldIDXIDErrors)
	s.snap.Store(&Snapshot{Mode: cfg.Mode, Reason: "not started"})
	return s
}

// SetXIDSink hands each XID DCGM records for a whole GPU to sink (call it
// before Run), once, from the Run goroutine: DCGM keeps only the last XID, so
// the XID log (collector/xid) counts them as they come and drops what
// NVML's events already counted. gpu is the NVML index DCGM reports for the
// GPU (DCGM_FI_DEV_NVML_INDEX), or DCGM's own GPU ID where it reports none,
// which need not be NVML's: place the XID by uuid where it is known.
func (s *Sampler) SetXIDSink(sink func(gpu int, uuid string, code int, at time.Time)) {
	s.onXID = sink
}

// MaxAge is how old a value (or the whole snapshot) may get before it is
// dropped: MaxMissed intervals plus half an interval of scheduling slack.
func (s *Sampler) MaxAge() time.Duration { return s.maxAge }

// Snapshot returns the latest published state. It never blocks and never
// calls DCGM. If the sampler has not published for longer than MaxAge (a
// DCGM call hangs), it reports down without values rather than serving them
// stale.
func (s *Sampler) Snapshot() *Snapshot {
	p := s.snap.Load()
	if p.Up {
		if age := time.Since(p.Time); age > s.maxAge {
			return &Snapshot{
				Time:   p.Time,
				Mode:   p.Mode,
				Reason: fmt.Sprintf("no DCGM sample for %s", age.Round(time.Millisecond)),
			}
		}
	}
	return p
}

func (s *Sampler) publishDown(mode Mode, reason string) {
	s.snap.Store(&Snapshot{Time: time.Now(), Mode: mode, Reason: reason})
}

// effectiveMode is the mode while DCGM is reachable (or being retried).
func (s *Sampler) effectiveMode() Mode {
	if s.cfg.Mode == ModeAuto {
		return ModeEmbedded
	}
	return s.cfg.Mode
}

// Run samples until ctx ends: it connects, watches, samples every
// Interval, and when DCGM fails marks the snapshot down and reconnects with
// backoff (Interval doubling up to MaxBackoff). It returns only when ctx is
// done (or at once if another Run is active). In auto mode without
// libdcgm it logs one line, publishes mode off and waits for ctx.
func (s *Sampler) Run(ctx context.Context) {
	if !s.running.CompareAndSwap(false, true) {
		s.cfg.Log.Error().Msg("dcgm: Sampler.Run called twice")
		return
	}
	defer s.running.Store(false)
	defer s.disconnect()
	log := s.cfg.Log

	if s.cfg.Mode == ModeOff {
		s.publishDown(ModeOff, ErrDisabled.Error())
		<-ctx.Done()
		return
	}

	backoff := s.cfg.Interval
	reportedDown := false // one warning per outage, then debug lines
	wasUp := false
	for {
		if s.client == nil {
			err := s.connect(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				if s.cfg.Mode == ModeAuto && errors.Is(err, ErrLibraryNotFound) {
					log.Info().Str("library", LibraryName).Msg("DCGM not available (auto mode): " + err.Error() + "; DCGM fields off, NVML only")
					s.publishDown(ModeOff, err.Error())
					<-ctx.Done()
					return
				}
				s.publishDown(s.effectiveMode(), "connect: "+err.Error())
				ev := log.Debug()
				if !reportedDown {
					ev = log.Warn()
					reportedDown = true
				}
				ev.Err(err).Str("mode", string(s.effectiveMode())).Str("host_engine", s.cfg.HostEngine).
					Dur("retry_in", backoff).Msg("DCGM connect failed; DCGM fields down, retrying with backoff")
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(backoff*2, s.cfg.MaxBackoff)
				continue
			}
			msg := "DCGM connected"
			if wasUp {
				msg = "DCGM reconnected"
			}
			log.Info().Str("mode", string(s.effectiveMode())).Int("entities", len(s.entities)).Msg(msg)
			backoff, reportedDown, wasUp = s.cfg.Interval, false, true
		}

		start := time.Now()
		if err := s.sampleOnce(start); err != nil {
			s.failures++
			if errors.Is(err, ErrConnection) || s.failures >= s.cfg.MaxMissed {
				s.disconnect()
				s.publishDown(s.effectiveMode(), "lost: "+err.Error())
				log.Warn().Err(err).Int("failures", s.failures).Msg("DCGM sampling failed; DCGM fields down, reconnecting")
				reportedDown = true
				s.failures = 0
				if !sleepCtx(ctx, backoff) {
					return
				}
				backoff = min(backoff*2, s.cfg.MaxBackoff)
				continue
			}
			// A transient error: the last snapshot stands until it is
			// MaxAge old (Snapshot turns it down then).
			log.Debug().Err(err).Int("failures", s.failures).Msg("DCGM sample failed")
		}
		if !sleepCtx(ctx, time.Until(start.Add(s.cfg.Interval))) {
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type openResult struct {
	c   Client
	err error
}

// Step connects if need be and samples once at now, in the caller's
// goroutine, and returns the snapshot it published: for callers that drive
// a simulated clock themselves and need each page to hold the values of its
// own moment (alerts/pages). It must not run beside Run. A failure returns
// a down snapshot and the error; the next Step reconnects.
func (s *Sampler) Step(ctx context.Context, now time.Time) (*Snapshot, error) {
	if s.client == nil {
		if err := s.connect(ctx); err != nil {
			snap := &Snapshot{Time: now, Mode: s.effectiveMode(), Reason: "connect: " + err.Error()}
			s.snap.Store(snap)
			return snap, err
		}
		s.lastDiscover = time.Time{} // discover again on now's clock
	}
	if err := s.sampleOnce(now); err != nil {
		s.disconnect()
		snap := &Snapshot{Time: now, Mode: s.effectiveMode(), Reason: "lost: " + err.Error()}
		s.snap.Store(snap)
		return snap, err
	}
	return s.snap.Load(), nil
}

// connect opens a client, discovers the devices and sets the watches. The
// open itself runs in its own goroutine so that a connect that blocks (an
// unresponsive host engine) does not hold up ctx's cancellation; a client
// that arrives late is closed.
func (s *Sampler) connect(ctx context.Context) error {
	ch := make(chan openResult, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- openResult{err: fmt.Errorf("DCGM open panicked: %v", r)}
			}
		}()
		c, err := s.open(s.cfg)
		ch <- openResult{c, err}
	}()
	var r openResult
	select {
	case r = <-ch:
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				_ = r.c.Close()
			}
		}()
		return ctx.Err()
	}
	if r.err != nil {
		if r.c != nil {
			_ = r.c.Close()
		}
		return r.err
	}
	if r.c == nil {
		return errors.New("DCGM open returned no client")
	}
	s.client = r.c
	s.failures = 0
	if err := s.discover(time.Now()); err != nil {
		s.disconnect()
		return err
	}
	return nil
}

func (s *Sampler) disconnect() {
	if s.client == nil {
		return
	}
	if err := s.client.Close(); err != nil {
		s.cfg.Log.Debug().Err(err).Msg("DCGM close")
	}
	s.client = nil
	s.devs, s.byEntity, s.entities = nil, nil, nil
	s.lastDiscover = time.Time{}
}

// discover reads the GPU/MIG hierarchy and, when it changed, re-sets the
// watches. Field state of devices that stay is kept.
func (s *Sampler) discover(now time.Time) error {
	infos, err := s.client.Devices()
	if err != nil {
		return fmt.Errorf("discover: %w", err)
	}
	infos = dropLoneComputeInstances(infos)
	slices.SortFunc(infos, func(a, b DeviceInfo) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.GPUInstance, b.GPUInstance),
			cmp.Compare(a.ComputeInstance, b.ComputeInstance),
			cmp.Compare(a.Entity.Kind, b.Entity.Kind), cmp.Compare(a.Entity.ID, b.Entity.ID))
	})
	entities := make([]Entity, len(infos))
	for i, d := range infos {
		entities[i] = d.Entity
	}
	changed := !slices.Equal(entities, s.entities)
	old := s.byEntity
	s.devs = make([]*devState, 0, len(infos))
	s.byEntity = make(map[Entity]*devState, len(infos))
	for _, d := range infos {
		ci := d.ComputeInstance
		if d.Entity.Kind != EntityComputeInstance {
			ci = -1
		}
		k := devKey{d.UUID, d.GPUInstance, ci}
		if k.uuid == "" {
			k.uuid = fmt.Sprintf("dcgm-gpu-%d", d.Parent)
		}
		st := old[d.Entity]
		if st == nil || st.key != k {
			st = &devState{key: k}
		}
		st.info = d
		s.devs = append(s.devs, st)
		s.byEntity[d.Entity] = st
	}
	if changed || s.lastDiscover.IsZero() {
		keep := max(2*s.maxAge, time.Second)
		if err := s.client.Watch(entities, s.fieldIDs, s.cfg.Interval, keep); err != nil {
			s.entities = nil // watch again next time
			return fmt.Errorf("watch: %w", err)
		}
		s.entities = entities
		// Forget counters and health of devices that are gone (a MIG
		// instance destroyed): the maps stay bounded.
		live := make(map[devKey]bool, len(s.devs))
		for _, d := range s.devs {
			live[d.key] = true
		}
		for k := range s.counters {
			if !live[k] {
				delete(s.counters, k)
			}
		}
		for k := range s.health {
			if !live[k] {
				delete(s.health, k)
			}
		}
	}
	s.lastDiscover = now
	return nil
}

// dropLoneComputeInstances leaves out the compute instances that fill their
// GPU instance alone: their values are their GPU instance's, which is
// watched anyway, and most GPU instances are not split, so watching them
// would double what a MIG node reads from DCGM for nothing.
func dropLoneComputeInstances(infos []DeviceInfo) []DeviceInfo {
	type gi struct {
		uuid string
		gpu  int
		id   int
	}
	n := map[gi]int{}
	for _, d := range infos {
		if d.Entity.Kind == EntityComputeInstance {
			n[gi{d.UUID, d.GPU, d.GPUInstance}]++
		}
	}
	return slices.DeleteFunc(infos, func(d DeviceInfo) bool {
		return d.Entity.Kind == EntityComputeInstance && n[gi{d.UUID, d.GPU, d.GPUInstance}] < 2
	})
}

// sampleOnce reads every value and publishes a snapshot.
func (s *Sampler) sampleOnce(now time.Time) error {
	if now.Sub(s.lastDiscover) >= s.cfg.Rediscover {
		if err := s.discover(now); err != nil {
			return err
		}
	}
	raw, err := s.client.Latest(s.entities, s.fieldIDs)
	if err != nil {
		return fmt.Errorf("read values: %w", err)
	}
	incidents, herr := s.client.HealthCheck()
	if herr != nil {
		if errors.Is(herr, ErrConnection) {
			return fmt.Errorf("health check: %w", herr)
		}
		s.cfg.Log.Debug().Err(herr).Msg("DCGM health check failed")
	}
	s.merge(now, raw)
	snap := &Snapshot{Time: now, Up: true, Mode: s.effectiveMode()}
	snap.Devices = s.build(now, incidents, herr == nil)
	s.snap.Store(snap)
	s.failures = 0
	return nil
}

// merge folds DCGM's raw values into the field state: values with a status
// other than OK, DCGM's blank and not-supported sentinels, NaN, infinities
// and negative numbers are skipped; rates are integrated into counters.
func (s *Sampler) merge(now time.Time, raw []RawValue) {
	for i := range raw {
		rv := &raw[i]
		st := s.byEntity[rv.Entity]
		if st == nil || rv.Status != StatusOK {
			continue
		}
		var v float64
		switch rv.Type {
		case FieldTypeDouble:
			if isBlankFloat(rv.Float) {
				continue
			}
			v = rv.Float
		case FieldTypeInt64:
			if isBlankInt(rv.Int) {
				continue
			}
			v = float64(rv.Int)
		default:
			continue
		}
		ts := rv.Time
		if ts.IsZero() {
			ts = now
		}
		if rv.FieldID == FieldIDXIDErrors {
			if rv.Entity.Kind == EntityGPU && v > 0 {
				if (int(v) != st.xid || !ts.Equal(st.xidAt)) && s.onXID != nil {
					s.onXID(st.info.GPU, st.info.UUID, int(v), ts)
				}
				st.xid, st.xidAt = int(v), ts
			}
			continue
		}
		f, ok := FieldByID(rv.FieldID)
		if !ok || v < 0 || !f.MeasuredFor(rv.Entity.Kind) {
			// A field DCGM measures only for the GPU (instance) above
			// this entity: what it answers is the parent's value, which
			// served per child would count the parent once per child.
			continue
		}
		fs := &st.fields[f]
		advanced := ts.After(fs.ts)
		if !advanced {
			continue // the same DCGM sample as last time: nothing new
		}
		first := fs.ts.IsZero()
		fs.ts = ts
		// A value seen for the first time counts as fresh only if DCGM's
		// timestamp is recent; after that, fresh means "DCGM's timestamp
		// moved on", which needs no agreement between the clocks.
		if first && now.Sub(ts) > s.maxAge {
			continue
		}
		fs.fresh = now
		fs.ok = true
		if !f.IsCounter() {
			fs.value = v
			continue
		}
		cs := s.counters[st.key]
		if cs == nil {
			cs = new([NumFields]counterState)
			s.counters[st.key] = cs
		}
		fs.rate = v
		c := &cs[f]
		if dt := ts.Sub(c.lastTS); !c.lastTS.IsZero() && dt > 0 && dt <= s.maxAge {
			c.total += v * dt.Seconds()
		}
		if ts.After(c.lastTS) {
			c.lastTS = ts
		}
		fs.value = c.total
	}
}

// build makes the published device list: fresh values only; whole GPUs
// always (they carry health), MIG GPU and compute instances when they have
// values.
func (s *Sampler) build(now time.Time, incidents []HealthIncident, healthOK bool) []DeviceValues {
	var worst map[devKey]map[string]string
	if healthOK {
		worst = map[devKey]map[string]string{}
		for _, in := range incidents {
			st := s.byEntity[in.Entity]
			if st == nil {
				continue
			}
			if in.Entity.Kind != EntityGPU {
				if st = s.byEntity[Entity{EntityGPU, st.info.Parent}]; st == nil {
					continue
				}
			}
			m := worst[st.key]
			if m == nil {
				m = map[string]string{}
				worst[st.key] = m
			}
			if healthRank(in.Result) > healthRank(m[in.System]) {
				m[in.System] = in.Result
			}
		}
	}

	out := make([]DeviceValues, 0, len(s.devs))
	for _, st := range s.devs {
		d := DeviceValues{
			GPU:             st.info.GPU,
			UUID:            st.info.UUID,
			GPUInstance:     st.info.GPUInstance,
			ComputeInstance: st.key.ci,
			Values:          map[Field]float64{},
			Rates:           map[Field]float64{},
		}
		for f := range st.fields {
			fs := &st.fields[f]
			if !fs.ok {
				continue
			}
			if now.Sub(fs.fresh) > s.maxAge {
				fs.ok = false // dropped: never served stale
				continue
			}
			d.Values[Field(f)] = fs.value
			if Field(f).IsCounter() {
				d.Rates[Field(f)] = fs.rate
			}
		}
		if st.info.Entity.Kind != EntityGPU {
			if len(d.Values) > 0 {
				out = append(out, d)
			}
			continue
		}
		d.LastXID, d.LastXIDTime = st.xid, st.xidAt
		if healthOK {
			d.Health = s.healthOf(now, st.key, worst[st.key])
		}
		out = append(out, d)
	}
	return out
}

// healthOf combines this check's results with warn/fail results held from
// earlier checks (Config.HealthHold).
func (s *Sampler) healthOf(now time.Time, k devKey, cur map[string]string) map[string]string {
	held := s.health[k]
	if held == nil {
		held = map[string]heldHealth{}
		s.health[k] = held
	}
	out := make(map[string]string, len(HealthSystems))
	for _, sys := range HealthSystems {
		st := cur[sys]
		if st == "" {
			st = HealthPass
		}
		h, ok := held[sys]
		if ok && (s.cfg.HealthHold < 0 || now.Sub(h.at) > s.cfg.HealthHold) {
			delete(held, sys)
			ok = false
		}
		if healthRank(st) > 0 && (!ok || healthRank(st) >= healthRank(h.status)) {
			held[sys] = heldHealth{st, now}
		} else if ok && healthRank(h.status) > healthRank(st) {
			st = h.status
		}
		out[sys] = st
	}
	return out
}
