package dcgm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

const (
	uuid0 = "GPU-00000000-0000-0000-0000-000000000000"
	uuid1 = "GPU-11111111-1111-1111-1111-111111111111"
)

// start runs s in the background and returns a stop function that cancels
// it and checks that Run returns promptly.
func start(t *testing.T, s *Sampler) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		s.Run(ctx)
		close(done)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatalf("Run did not return within 2s of cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func testConfig() Config {
	return Config{
		Mode:       ModeEmbedded,
		Interval:   10 * time.Millisecond,
		MaxMissed:  3,
		MaxBackoff: 40 * time.Millisecond,
		Log:        zerolog.Nop(),
	}
}

func upWith(s *Sampler, cond func(*Snapshot) bool) func() bool {
	return func() bool {
		snap := s.Snapshot()
		return snap.Up && cond(snap)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{"": ModeAuto, "auto": ModeAuto, "Embedded": ModeEmbedded, " standalone ": ModeStandalone, "OFF": ModeOff} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			got, err := ParseMode(in)
			if err != nil || got != want {
				t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
			}
		})
	}
	if _, err := ParseMode("remote"); err == nil {
		t.Error("ParseMode(remote): want error")
	}
}

func TestStandaloneAddress(t *testing.T) {
	for _, c := range []struct{ in, addr, sock string }{
		{"", "localhost:5555", "0"},
		{"nvidia-dcgm:5555", "nvidia-dcgm:5555", "0"},
		{"10.0.0.1", "10.0.0.1:5555", "0"},
		{"tcp://10.0.0.1:6000", "10.0.0.1:6000", "0"},
		{"[::1]:5555", "[::1]:5555", "0"},
		{"unix:///run/dcgm.sock", "/run/dcgm.sock", "1"},
	} {
		t.Run(fmt.Sprintf("%q", c.in), func(t *testing.T) {
			addr, sock, err := standaloneAddress(c.in)
			if err != nil || addr != c.addr || sock != c.sock {
				t.Errorf("standaloneAddress(%q) = %q, %q, %v; want %q, %q", c.in, addr, sock, err, c.addr, c.sock)
			}
		})
	}
}

func TestFieldIDs(t *testing.T) {
	want := map[Field]uint16{GraphicsActive: 1001, SMActive: 1002, SMOccupancy: 1003, TensorActive: 1004, DRAMActive: 1005,
		FP64Active: 1006, FP32Active: 1007, FP16Active: 1008, PCIeTxBytes: 1009, PCIeRxBytes: 1010, NVLinkTxBytes: 1011, NVLinkRxBytes: 1012}
	if len(want) != NumFields {
		t.Fatalf("NumFields = %d, want %d", NumFields, len(want))
	}
	for f, id := range want {
		if f.ID() != id {
			t.Errorf("%s.ID() = %d, want %d", f, f.ID(), id)
		}
		if g, ok := fieldByID(id); !ok || g != f {
			t.Errorf("fieldByID(%d) = %v, %v", id, g, ok)
		}
		if f.IsCounter() != (id >= 1009) {
			t.Errorf("%s.IsCounter() = %v", f, f.IsCounter())
		}
	}
	if _, ok := fieldByID(FieldIDXIDErrors); ok {
		t.Error("the XID field is not a Field")
	}
}

// TestMergeSkipsBlankAndNotSupported feeds raw values straight into merge.
func TestMergeSkipsBlankAndNotSupported(t *testing.T) {
	s := NewSampler(testConfig(), NewFake().Open)
	gpu := Entity{EntityGPU, 0}
	st := &devState{info: DeviceInfo{Entity: gpu, UUID: uuid0, GPUInstance: -1}, key: devKey{uuid0, -1, -1}}
	s.devs, s.byEntity = []*devState{st}, map[Entity]*devState{gpu: st}
	now := time.Now()
	d := func(f Field, v float64, status int) RawValue {
		return RawValue{Entity: gpu, FieldID: f.ID(), Status: status, Type: FieldTypeDouble, Float: v, Time: now}
	}
	i := func(f Field, v int64, status int) RawValue {
		return RawValue{Entity: gpu, FieldID: f.ID(), Status: status, Type: FieldTypeInt64, Int: v, Time: now}
	}
	s.merge(now, []RawValue{
		d(SMActive, 0.5, StatusOK),                          // kept
		d(SMOccupancy, FP64Blank, StatusOK),                 // blank
		d(TensorActive, FP64NotSupported, StatusOK),         // not-supported sentinel
		d(DRAMActive, 0.3, StatusNotSupported),              // not-supported status, plausible value
		d(GraphicsActive, math.NaN(), StatusOK),             // not a number
		d(FP64Active, -0.1, StatusOK),                       // negative
		d(FP32Active, 0.2, StatusNotWatched),                // not watched
		i(PCIeTxBytes, Int64Blank, StatusOK),                // int blank
		i(PCIeRxBytes, Int64NotSupported, StatusOK),         // int not supported
		i(NVLinkTxBytes, 1000, StatusProfilingNotSupported), // bad status
		{Entity: Entity{EntityGPU, 7}, FieldID: SMActive.ID(), Type: FieldTypeDouble, Float: 0.9, Time: now}, // unknown entity
		{Entity: gpu, FieldID: FieldIDXIDErrors, Type: FieldTypeInt64, Int: Int64Blank, Time: now},           // no XID
	})
	devs := s.build(now, nil, true)
	if len(devs) != 1 {
		t.Fatalf("devices = %+v", devs)
	}
	got := devs[0].Values
	if len(got) != 1 || got[SMActive] != 0.5 {
		t.Errorf("values = %v, want only sm_active 0.5", got)
	}
	if devs[0].LastXID != 0 {
		t.Errorf("LastXID = %d from a blank", devs[0].LastXID)
	}
}

// TestBlankAndNotSupportedThroughRun checks the same through the fake and
// the background loop: nothing DCGM marks empty ever reaches a snapshot.
func TestBlankAndNotSupportedThroughRun(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, SMActive, 0.75)
	f.SetBlank(uuid0, -1, SMOccupancy)
	f.SetNotSupported(uuid0, -1, TensorActive)
	f.SetBlank(uuid0, -1, PCIeTxBytes)
	f.SetValue(uuid0, -1, PCIeRxBytes, 1e6)
	s := NewSampler(testConfig(), f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "first sample", upWith(s, func(_ *Snapshot) bool { return f.Calls("Latest") >= 3 }))
	snap := s.Snapshot()
	if len(snap.Devices) != 1 {
		t.Fatalf("devices = %+v", snap.Devices)
	}
	v := snap.Devices[0].Values
	if v[SMActive] != 0.75 {
		t.Errorf("sm_active = %v, want 0.75", v[SMActive])
	}
	if _, ok := v[PCIeRxBytes]; !ok {
		t.Errorf("pcie rx counter missing: %v", v)
	}
	for fld, x := range v {
		if fld != SMActive && fld != PCIeRxBytes {
			t.Errorf("unexpected field %s = %v", fld, x)
		}
		if x >= FP64Blank || float64(x) >= float64(Int32Blank) && !fld.IsCounter() {
			t.Errorf("sentinel leaked: %s = %v", fld, x)
		}
	}
	if snap.Mode != ModeEmbedded || snap.Reason != "" {
		t.Errorf("mode %q reason %q", snap.Mode, snap.Reason)
	}
}

func TestStaleValuesDropped(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, SMActive, 0.5)
	f.SetValue(uuid0, -1, DRAMActive, 0.25)
	cfg := testConfig()
	cfg.Interval = 20 * time.Millisecond
	s := NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "values", upWith(s, func(snap *Snapshot) bool {
		d, ok := snap.Find(uuid0, -1)
		return ok && d.Values[DRAMActive] == 0.25
	}))
	// DCGM stops updating DRAM active: its timestamp stays put.
	frozen := time.Now()
	f.Freeze(uuid0, -1, DRAMActive, 0.25, frozen)
	waitFor(t, 2*time.Second, "stale value dropped", upWith(s, func(snap *Snapshot) bool {
		d, _ := snap.Find(uuid0, -1)
		_, ok := d.Values[DRAMActive]
		return !ok
	}))
	if el, least := time.Since(frozen), time.Duration(cfg.MaxMissed)*cfg.Interval; el < least {
		t.Errorf("dropped after %s, before %d intervals (%s)", el, cfg.MaxMissed, least)
	}
	d, _ := s.Snapshot().Find(uuid0, -1)
	if d.Values[SMActive] != 0.5 {
		t.Errorf("fresh value lost too: %v", d.Values)
	}
	// DCGM updates it again: it comes back.
	f.SetValue(uuid0, -1, DRAMActive, 0.125)
	waitFor(t, 2*time.Second, "value back", upWith(s, func(snap *Snapshot) bool {
		d, _ := snap.Find(uuid0, -1)
		return d.Values[DRAMActive] == 0.125
	}))
}

// TestFirstValueAlreadyStale: a value whose DCGM timestamp is already old
// when first seen is never served.
func TestFirstValueAlreadyStale(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, SMActive, 0.5)
	f.Freeze(uuid0, -1, TensorActive, 0.9, time.Now().Add(-time.Hour))
	cfg := testConfig()
	cfg.Interval = 50 * time.Millisecond // max age 175ms: longer than the check below
	s := NewSampler(cfg, f.Open)
	start(t, s)
	// Check every snapshot of the first samples: the value must never show.
	waitFor(t, 2*time.Second, "samples", func() bool {
		snap := s.Snapshot()
		if !snap.Up {
			return false
		}
		d, _ := snap.Find(uuid0, -1)
		if _, ok := d.Values[TensorActive]; ok || d.Values[SMActive] != 0.5 {
			t.Fatalf("values = %v, want sm_active only", d.Values)
		}
		return f.Calls("Latest") >= 3
	})
}

func TestReconnectAfterLostHostEngine(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0}, SimDevice{GPU: 1, UUID: uuid1})
	f.SetValue(uuid0, -1, SMActive, 0.5)
	f.SetValue(uuid0, -1, PCIeTxBytes, 1e9)
	cfg := testConfig()
	s := NewSampler(cfg, f.Open)
	start(t, s)
	var before float64
	waitFor(t, 2*time.Second, "up with a counter", upWith(s, func(snap *Snapshot) bool {
		d, _ := snap.Find(uuid0, -1)
		before = d.Values[PCIeTxBytes]
		return before > 0
	}))
	if n := f.Calls("Open"); n != 1 {
		t.Fatalf("opens = %d before the loss", n)
	}

	f.SetLost(true)
	lostAt := time.Now()
	waitFor(t, 2*time.Second, "down after loss", func() bool {
		snap := s.Snapshot()
		return !snap.Up && len(snap.Devices) == 0 && strings.Contains(snap.Reason, "lost")
	})
	if el := time.Since(lostAt); el > s.MaxAge()+250*time.Millisecond {
		t.Errorf("took %s to go down", el)
	}
	// It keeps retrying (with backoff) while the host engine is gone.
	opens := f.Calls("Open")
	waitFor(t, 2*time.Second, "retries", func() bool { return f.Calls("Open") >= opens+2 })
	if s.Snapshot().Up {
		t.Fatal("up while the host engine is lost")
	}
	if f.Calls("Close") < 1 {
		t.Error("the lost client was not closed")
	}

	f.SetLost(false)
	waitFor(t, 2*time.Second, "up again", upWith(s, func(snap *Snapshot) bool {
		d, ok := snap.Find(uuid0, -1)
		return ok && d.Values[SMActive] == 0.5
	}))
	d, _ := s.Snapshot().Find(uuid0, -1)
	if after := d.Values[PCIeTxBytes]; after < before {
		t.Errorf("counter went backwards across the reconnect: %v -> %v", before, after)
	}
}

func TestTransientErrors(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, SMActive, 0.5)
	cfg := testConfig()
	cfg.Interval = 5 * time.Millisecond
	s := NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "up", upWith(s, func(*Snapshot) bool { return true }))

	// Fewer than MaxMissed failures in a row: no reconnect.
	n := f.Calls("Latest")
	f.FailNext("Latest", cfg.MaxMissed-1)
	waitFor(t, 2*time.Second, "samples past the failures", func() bool { return f.Calls("Latest") >= n+cfg.MaxMissed+2 })
	if got := f.Calls("Open"); got != 1 {
		t.Errorf("opens = %d after %d transient failures, want 1", got, cfg.MaxMissed-1)
	}
	// MaxMissed failures in a row: reconnect.
	f.FailNext("Latest", cfg.MaxMissed)
	waitFor(t, 2*time.Second, "reconnect", func() bool { return f.Calls("Open") >= 2 })
	waitFor(t, 2*time.Second, "up again", upWith(s, func(*Snapshot) bool { return true }))
}

// blockingClient hangs in Latest until released: a stuck DCGM call.
type blockingClient struct {
	*Fake
	block   atomic.Bool
	release chan struct{}
}

func (b *blockingClient) Latest(e []Entity, ids []uint16) ([]RawValue, error) {
	if b.block.Load() {
		<-b.release
	}
	return b.Fake.Latest(e, ids)
}

func TestSnapshotNotStaleWhenSamplerHangs(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, SMActive, 0.5)
	bc := &blockingClient{Fake: f, release: make(chan struct{})}
	s := NewSampler(testConfig(), func(Config) (Client, error) { return bc, nil })
	stop := start(t, s)
	waitFor(t, 2*time.Second, "up", upWith(s, func(*Snapshot) bool { return true }))
	bc.block.Store(true)
	hungAt := time.Now()
	waitFor(t, 2*time.Second, "down while hung", func() bool {
		snap := s.Snapshot()
		return !snap.Up && len(snap.Devices) == 0 && strings.Contains(snap.Reason, "no DCGM sample")
	})
	if el := time.Since(hungAt); el > s.MaxAge()+250*time.Millisecond {
		t.Errorf("stale snapshot served for %s (max age %s)", el, s.MaxAge())
	}
	bc.block.Store(false)
	close(bc.release)
	waitFor(t, 2*time.Second, "up after release", upWith(s, func(*Snapshot) bool { return true }))
	stop()
}

func TestCounterIntegration(t *testing.T) {
	cfg := testConfig()
	cfg.Interval = time.Second // max age 3.5s
	s := NewSampler(cfg, NewFake().Open)
	gpu := Entity{EntityGPU, 0}
	st := &devState{info: DeviceInfo{Entity: gpu, UUID: uuid0, GPUInstance: -1}, key: devKey{uuid0, -1, -1}}
	s.devs, s.byEntity = []*devState{st}, map[Entity]*devState{gpu: st}
	t0 := time.Now()
	step := func(sec float64, rate int64, blank bool) (float64, float64) {
		ts := t0.Add(time.Duration(sec * float64(time.Second)))
		rv := RawValue{Entity: gpu, FieldID: PCIeTxBytes.ID(), Type: FieldTypeInt64, Int: rate, Time: ts}
		if blank {
			rv.Int = Int64Blank
		}
		s.merge(ts, []RawValue{rv})
		d := s.build(ts, nil, false)
		v, ok := d[0].Values[PCIeTxBytes]
		if !ok {
			t.Fatalf("t=%v: counter absent", sec)
		}
		r, ok := d[0].Rate(PCIeTxBytes)
		if !ok {
			t.Fatalf("t=%v: rate absent beside the counter", sec)
		}
		return v, r
	}
	steps := []struct {
		sec   float64
		rate  int64
		blank bool
		want  float64
		// wantRate: the rate beside the counter is DCGM's last one, from
		// the first value on and across gaps.
		wantRate float64
	}{
		{0, 100, false, 0, 100},    // first value: the counter starts at 0
		{1, 100, false, 100, 100},  // 100 B/s for 1 s
		{2, 300, false, 400, 300},  // 300 B/s for 1 s
		{2, 999, false, 400, 300},  // same DCGM timestamp: nothing new
		{3, 0, true, 400, 300},     // blank: skipped (the last value stays fresh)
		{4, 50, false, 500, 50},    // 50 B/s over the 2 s since the last rate
		{12, 70, false, 500, 70},   // an 8 s gap (> max age) is not integrated; its rate is current
		{13.5, 20, false, 530, 20}, // 20 B/s for 1.5 s
	}
	prev := -1.0
	for _, c := range steps {
		got, rate := step(c.sec, c.rate, c.blank)
		if math.Abs(got-c.want) > 1e-6 {
			t.Errorf("t=%v: counter = %v, want %v", c.sec, got, c.want)
		}
		if rate != c.wantRate {
			t.Errorf("t=%v: rate = %v, want %v", c.sec, rate, c.wantRate)
		}
		if got < prev {
			t.Errorf("t=%v: counter decreased %v -> %v", c.sec, prev, got)
		}
		prev = got
	}
	// Counters survive a reconnect (new field state, same device).
	s.devs[0] = &devState{info: st.info, key: st.key}
	s.byEntity[gpu] = s.devs[0]
	if got, _ := step(14, 10, false); got != 535 { // 10 B/s for the 0.5 s since 13.5
		t.Errorf("after reconnect: counter = %v, want 535", got)
	}
}

func TestCountersMonotonicThroughRun(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, NVLinkRxBytes, 5e8)
	s := NewSampler(testConfig(), f.Open)
	start(t, s)
	prev := -1.0
	seen := 0
	waitFor(t, 2*time.Second, "counter growth", func() bool {
		snap := s.Snapshot()
		d, ok := snap.Find(uuid0, -1)
		if !snap.Up || !ok {
			return false
		}
		v, ok := d.Values[NVLinkRxBytes]
		if !ok {
			return false
		}
		if v < prev {
			t.Fatalf("counter decreased %v -> %v", prev, v)
		}
		if v > prev {
			seen++
		}
		prev = v
		return seen >= 5
	})
}

func TestMIGInstanceValues(t *testing.T) {
	// GPU 0: GPU instance 1 whole (one compute instance, whose values are
	// the GPU instance's and which is not watched), GPU instance 2 split
	// into compute instances 0 (busy) and 1 (idle).
	act := map[[3]int]float64{{0, -1, -1}: 0.8, {0, 1, -1}: 0.2, {0, 2, -1}: 0.45, {0, 2, 0}: 0.9, {0, 2, 1}: 0, {1, -1, -1}: 0.4}
	f := NewSimulated([]SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{1, 2}, ComputeInstances: map[int][]int{2: {0, 1}}}, {GPU: 1, UUID: uuid1}},
		func(gpu, gi, ci int) (float64, bool) {
			a, ok := act[[3]int{gpu, gi, ci}]
			return a, ok
		})
	s := NewSampler(testConfig(), f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "all devices", upWith(s, func(snap *Snapshot) bool { return len(snap.Devices) == len(act) }))
	snap := s.Snapshot()
	for k, a := range act {
		d, ok := snap.FindComputeInstance(map[int]string{0: uuid0, 1: uuid1}[k[0]], k[1], k[2])
		if !ok {
			t.Errorf("gpu %d gi %d ci %d missing", k[0], k[1], k[2])
			continue
		}
		if d.GPU != k[0] || d.GPUInstance != k[1] || d.ComputeInstance != k[2] {
			t.Errorf("identity %d/%d/%d, want %v", d.GPU, d.GPUInstance, d.ComputeInstance, k)
		}
		for _, fld := range []Field{SMActive, SMOccupancy, TensorActive, DRAMActive} {
			got, has := d.Values[fld]
			if fld == DRAMActive && k[2] >= 0 {
				// DCGM measures DRAM per GPU instance: a compute
				// instance has none of its own.
				if has {
					t.Errorf("gpu %d gi %d ci %d has a DRAM ratio %v", k[0], k[1], k[2], got)
				}
				continue
			}
			if want := SimValue(fld, a); !has || math.Abs(got-want) > 1e-12 {
				t.Errorf("gpu %d gi %d ci %d %s = %v, want %v", k[0], k[1], k[2], fld, got, want)
			}
		}
		_, hasPCIe := d.Values[PCIeTxBytes]
		if hasPCIe != (k[1] == -1) {
			t.Errorf("gpu %d gi %d ci %d: PCIe counter present = %v", k[0], k[1], k[2], hasPCIe)
		}
		if (d.Health != nil) != (k[1] == -1) {
			t.Errorf("gpu %d gi %d ci %d: health = %v", k[0], k[1], k[2], d.Health)
		}
	}
	if d, _ := snap.Find(uuid0, 2); d.ComputeInstance != -1 {
		t.Errorf("Find gave compute instance %d, want the GPU instance", d.ComputeInstance)
	}
	// Order: by GPU, whole GPU first, each GPU instance before its compute
	// instances.
	if _, ok := snap.FindComputeInstance(uuid0, 1, 0); ok {
		t.Error("the compute instance that fills GPU instance 1 alone was read")
	}
	want := [][3]int{{0, -1, -1}, {0, 1, -1}, {0, 2, -1}, {0, 2, 0}, {0, 2, 1}, {1, -1, -1}}
	for i, d := range snap.Devices {
		if [3]int{d.GPU, d.GPUInstance, d.ComputeInstance} != want[i] {
			t.Errorf("device %d = %d/%d/%d, want %v", i, d.GPU, d.GPUInstance, d.ComputeInstance, want[i])
		}
	}
	ents, every := f.Watched()
	kinds := map[EntityKind]int{}
	for _, e := range ents {
		kinds[e.Kind]++
	}
	if kinds[EntityGPUInstance] != 2 || kinds[EntityComputeInstance] != 2 || every != testConfig().Interval {
		t.Errorf("watched %v every %s", ents, every)
	}
	// SimValue is deterministic and clamps ratios.
	if SimValue(SMOccupancy, 0.8) != 0.4 || SimValue(GraphicsActive, 1) != 1 || SimValue(PCIeRxBytes, 0.5) != 1e9 {
		t.Error("SimValue changed")
	}
}

// A field DCGM measures for a coarser entity is never taken from a finer
// one, whatever DCGM answers there: a DCGM whose profiling back-end copies a
// GPU instance's byte rates and DRAM ratio to its compute instances (and a
// GPU's to its GPU instances) must not have them counted once per child.
func TestParentValuesNotTakenFromChildren(t *testing.T) {
	f := NewSimulated([]SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{1}, ComputeInstances: map[int][]int{1: {0, 1}}}},
		func(_, _, _ int) (float64, bool) { return 0.5, true })
	f.SetValue(uuid0, 1, PCIeTxBytes, 1e9)
	f.SetValue(uuid0, 1, NVLinkRxBytes, 1e9)
	for _, ci := range []int{0, 1} {
		f.SetComputeInstanceValue(uuid0, 1, ci, DRAMActive, 0.7)
		f.SetComputeInstanceValue(uuid0, 1, ci, PCIeTxBytes, 1e9)
	}
	s := NewSampler(testConfig(), f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "MIG values", upWith(s, func(snap *Snapshot) bool {
		_, a := snap.FindComputeInstance(uuid0, 1, 1)
		_, b := snap.Find(uuid0, 1)
		return a && b
	}))
	snap := s.Snapshot()
	gi, _ := snap.Find(uuid0, 1)
	for _, fld := range []Field{PCIeTxBytes, NVLinkRxBytes} {
		if v, ok := gi.Values[fld]; ok {
			t.Errorf("GPU instance has %s %v: DCGM measures it per GPU", fld, v)
		}
	}
	if _, ok := gi.Values[DRAMActive]; !ok {
		t.Error("GPU instance lost its DRAM ratio")
	}
	for _, ci := range []int{0, 1} {
		d, _ := snap.FindComputeInstance(uuid0, 1, ci)
		for _, fld := range []Field{DRAMActive, PCIeTxBytes} {
			if v, ok := d.Values[fld]; ok {
				t.Errorf("compute instance %d has %s %v: DCGM measures it for a coarser entity", ci, fld, v)
			}
		}
		if _, ok := d.Values[SMActive]; !ok {
			t.Errorf("compute instance %d lost its SM ratio", ci)
		}
	}
	for _, f := range Fields() {
		if f.Level() == EntityGPU && !f.IsCounter() {
			t.Errorf("%s is measured per GPU only but is not a byte counter", f)
		}
	}
}

func TestMIGReconfiguration(t *testing.T) {
	f := NewSimulated([]SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{1}}},
		func(_, _, _ int) (float64, bool) { return 0.5, true })
	cfg := testConfig()
	cfg.Rediscover = 20 * time.Millisecond
	s := NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "gi 1", upWith(s, func(snap *Snapshot) bool { _, ok := snap.Find(uuid0, 1); return ok }))
	f.SetDevices([]SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{3, 4}}})
	waitFor(t, 2*time.Second, "gi 3 and 4, no gi 1", upWith(s, func(snap *Snapshot) bool {
		_, a := snap.Find(uuid0, 1)
		_, b := snap.Find(uuid0, 3)
		_, c := snap.Find(uuid0, 4)
		return !a && b && c
	}))
}

func TestHealthAndXID(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0}, SimDevice{GPU: 1, UUID: uuid1})
	xidAt := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	f.SetXID(uuid1, 79, xidAt)
	f.SetHealth(uuid1, HealthPCIe, HealthFail)
	f.SetHealth(uuid1, HealthThermal, HealthWarn)
	cfg := testConfig()
	cfg.HealthHold = -1 // no hold: DCGM's result as is
	s := NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "health", upWith(s, func(snap *Snapshot) bool { d, _ := snap.Find(uuid1, -1); return d.Health != nil }))
	snap := s.Snapshot()
	d0, _ := snap.Find(uuid0, -1)
	d1, _ := snap.Find(uuid1, -1)
	for _, sys := range HealthSystems {
		if d0.Health[sys] != HealthPass {
			t.Errorf("gpu0 %s = %q", sys, d0.Health[sys])
		}
		want := map[string]string{HealthPCIe: HealthFail, HealthThermal: HealthWarn}[sys]
		if want == "" {
			want = HealthPass
		}
		if d1.Health[sys] != want {
			t.Errorf("gpu1 %s = %q, want %q", sys, d1.Health[sys], want)
		}
	}
	if d0.LastXID != 0 || d1.LastXID != 79 || !d1.LastXIDTime.Equal(xidAt) {
		t.Errorf("xids: gpu0 %d, gpu1 %d at %v (want 79 at %v)", d0.LastXID, d1.LastXID, d1.LastXIDTime, xidAt)
	}
	f.SetHealth(uuid1, HealthPCIe, HealthPass)
	waitFor(t, 2*time.Second, "pcie pass", upWith(s, func(snap *Snapshot) bool {
		d, _ := snap.Find(uuid1, -1)
		return d.Health[HealthPCIe] == HealthPass
	}))
}

func TestHealthHold(t *testing.T) {
	cfg := testConfig()
	cfg.HealthHold = time.Hour
	s := NewSampler(cfg, nil)
	k := devKey{uuid0, -1, -1}
	now := time.Now()
	if h := s.healthOf(now, k, map[string]string{HealthMemory: HealthFail}); h[HealthMemory] != HealthFail {
		t.Fatalf("memory = %q", h[HealthMemory])
	}
	if h := s.healthOf(now.Add(time.Minute), k, nil); h[HealthMemory] != HealthFail || h[HealthPCIe] != HealthPass {
		t.Errorf("held: %v", h)
	}
	if h := s.healthOf(now.Add(2*time.Hour), k, nil); h[HealthMemory] != HealthPass {
		t.Errorf("after the hold: %v", h)
	}
}

// syncBuffer is a log sink safe for the sampler's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestAutoWithoutLibrary: with no libdcgm (this machine, and any machine
// without DCGM) DefaultOpen fails fast with ErrLibraryNotFound, and the
// sampler in auto mode turns DCGM off with one log line.
func TestAutoWithoutLibrary(t *testing.T) {
	begin := time.Now()
	c, err := DefaultOpen(Config{Mode: ModeAuto})
	if err == nil {
		_ = c.Close()
		t.Skip(LibraryName + " is installed here")
	}
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Skipf("DCGM present but not usable: %v", err)
	}
	if el := time.Since(begin); el > time.Second {
		t.Errorf("DefaultOpen took %s", el)
	}
	if !strings.Contains(err.Error(), LibraryName) {
		t.Errorf("error %q does not name the library", err)
	}

	var logs syncBuffer
	cfg := testConfig()
	cfg.Mode = ModeAuto
	cfg.Log = zerolog.New(&logs)
	var opens atomic.Int32
	s := NewSampler(cfg, func(c Config) (Client, error) { opens.Add(1); return DefaultOpen(c) })
	stop := start(t, s)
	waitFor(t, 2*time.Second, "mode off", func() bool { return s.Snapshot().Mode == ModeOff })
	time.Sleep(5 * cfg.Interval) // long enough for retries, if there were any
	snap := s.Snapshot()
	if snap.Up || !strings.Contains(snap.Reason, LibraryName) {
		t.Errorf("snapshot %+v", snap)
	}
	if n := opens.Load(); n != 1 {
		t.Errorf("opens = %d, want 1 (no retries without the library)", n)
	}
	stop()
	if lines := strings.Count(strings.TrimSpace(logs.String()), "\n") + 1; lines != 1 || !strings.Contains(logs.String(), LibraryName) {
		t.Errorf("want one log line naming %s, got:\n%s", LibraryName, logs.String())
	}
}

// TestStandaloneUnreachable: the real open against a host engine nobody
// listens on (and, here, without libdcgm): down, retrying, never exiting.
func TestStandaloneUnreachable(t *testing.T) {
	cfg := testConfig()
	cfg.Mode = ModeStandalone
	cfg.HostEngine = "127.0.0.1:1"
	cfg.MaxBackoff = 20 * time.Millisecond
	var opens atomic.Int32
	s := NewSampler(cfg, func(c Config) (Client, error) { opens.Add(1); return DefaultOpen(c) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	waitFor(t, 10*time.Second, "three connect attempts", func() bool { return opens.Load() >= 3 })
	select {
	case <-done:
		t.Fatal("Run exited while the host engine is unreachable")
	default:
	}
	snap := s.Snapshot()
	if snap.Up || snap.Mode != ModeStandalone || !strings.Contains(snap.Reason, "connect") {
		t.Errorf("snapshot %+v", snap)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop")
	}
}

func TestBackoffGrowsAndIsCapped(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	f.SetLost(true)
	cfg := testConfig()
	cfg.Interval = 2 * time.Millisecond
	cfg.MaxBackoff = 30 * time.Millisecond
	var mu sync.Mutex
	var at []time.Time
	s := NewSampler(cfg, func(c Config) (Client, error) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		return f.Open(c)
	})
	stop := start(t, s)
	waitFor(t, 3*time.Second, "attempts", func() bool { mu.Lock(); defer mu.Unlock(); return len(at) >= 9 })
	stop()
	mu.Lock()
	defer mu.Unlock()
	// 2, 4, 8, 16, 30, 30... ms: the first gaps are short, later ones
	// reach the cap but not much beyond it.
	first, last := at[1].Sub(at[0]), at[len(at)-1].Sub(at[len(at)-2])
	if last < 25*time.Millisecond || last > 500*time.Millisecond || first >= last {
		t.Errorf("first gap %s, last gap %s", first, last)
	}
}

func TestRunStopsPromptlyAndCloses(t *testing.T) {
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	cfg := testConfig()
	cfg.Interval = time.Hour // Run is asleep when cancelled
	s := NewSampler(cfg, f.Open)
	stop := start(t, s)
	waitFor(t, 2*time.Second, "first sample", func() bool { return f.Calls("Latest") >= 1 })
	begin := time.Now()
	stop()
	if el := time.Since(begin); el > 500*time.Millisecond {
		t.Errorf("Run took %s to stop", el)
	}
	if f.Calls("Close") != 1 {
		t.Errorf("closes = %d, want 1", f.Calls("Close"))
	}
}

func TestRunStopsWhileOpenHangs(t *testing.T) {
	release := make(chan struct{})
	f := NewFake(SimDevice{GPU: 0, UUID: uuid0})
	var entered atomic.Bool
	s := NewSampler(testConfig(), func(c Config) (Client, error) {
		entered.Store(true)
		<-release
		return f.Open(c)
	})
	stop := start(t, s)
	waitFor(t, 2*time.Second, "open entered", entered.Load)
	stop() // must not wait for the hung open
	close(release)
	waitFor(t, 2*time.Second, "late client closed", func() bool { return f.Calls("Close") == 1 })
}

func TestModeOff(t *testing.T) {
	var opens atomic.Int32
	cfg := testConfig()
	cfg.Mode = ModeOff
	s := NewSampler(cfg, func(Config) (Client, error) { opens.Add(1); return nil, errors.New("no") })
	stop := start(t, s)
	waitFor(t, 2*time.Second, "off", func() bool { return s.Snapshot().Reason == ErrDisabled.Error() })
	stop()
	if opens.Load() != 0 || s.Snapshot().Up || s.Snapshot().Mode != ModeOff {
		t.Errorf("opens %d snapshot %+v", opens.Load(), s.Snapshot())
	}
	if _, err := DefaultOpen(cfg); !errors.Is(err, ErrDisabled) {
		t.Errorf("DefaultOpen(off) = %v", err)
	}
}

func TestSnapshotBeforeRun(t *testing.T) {
	s := NewSampler(Config{}, nil)
	snap := s.Snapshot()
	if snap == nil || snap.Up || snap.Mode != ModeAuto || len(snap.Devices) != 0 {
		t.Errorf("initial snapshot %+v", snap)
	}
	if s.MaxAge() != 35*time.Second {
		t.Errorf("default max age %s", s.MaxAge())
	}
}
