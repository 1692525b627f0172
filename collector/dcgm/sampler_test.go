package dcgm_test

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

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakedcgm"

	"github.com/rs/zerolog"
)

const (
	uuid0 = "GPU-00000000-0000-0000-0000-000000000000"
	uuid1 = "GPU-11111111-1111-1111-1111-111111111111"
)

// start runs s in the background and returns a stop function that cancels
// it and checks that Run returns promptly.
func start(t *testing.T, s *dcgm.Sampler) (stop func()) {
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

func testConfig() dcgm.Config {
	return dcgm.Config{
		Mode:       dcgm.ModeEmbedded,
		Interval:   10 * time.Millisecond,
		MaxMissed:  3,
		MaxBackoff: 40 * time.Millisecond,
		Log:        zerolog.Nop(),
	}
}

func upWith(s *dcgm.Sampler, cond func(*dcgm.Snapshot) bool) func() bool {
	return func() bool {
		snap := s.Snapshot()
		return snap.Up && cond(snap)
	}
}

func TestParseMode(t *testing.T) {
	for in, want := range map[string]dcgm.Mode{"": dcgm.ModeAuto, "auto": dcgm.ModeAuto, "Embedded": dcgm.ModeEmbedded, " standalone ": dcgm.ModeStandalone, "OFF": dcgm.ModeOff} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			got, err := dcgm.ParseMode(in)
			if err != nil || got != want {
				t.Errorf("ParseMode(%q) = %q, %v; want %q", in, got, err, want)
			}
		})
	}
	if _, err := dcgm.ParseMode("remote"); err == nil {
		t.Error("ParseMode(remote): want error")
	}
}

func TestFieldIDs(t *testing.T) {
	want := map[dcgm.Field]uint16{dcgm.GraphicsActive: 1001, dcgm.SMActive: 1002, dcgm.SMOccupancy: 1003, dcgm.TensorActive: 1004, dcgm.DRAMActive: 1005,
		dcgm.FP64Active: 1006, dcgm.FP32Active: 1007, dcgm.FP16Active: 1008, dcgm.PCIeTxBytes: 1009, dcgm.PCIeRxBytes: 1010, dcgm.NVLinkTxBytes: 1011, dcgm.NVLinkRxBytes: 1012}
	if len(want) != dcgm.NumFields {
		t.Fatalf("NumFields = %d, want %d", dcgm.NumFields, len(want))
	}
	for f, id := range want {
		if f.ID() != id {
			t.Errorf("%s.ID() = %d, want %d", f, f.ID(), id)
		}
		if g, ok := dcgm.FieldByID(id); !ok || g != f {
			t.Errorf("dcgm.FieldByID(%d) = %v, %v", id, g, ok)
		}
		if f.IsCounter() != (id >= 1009) {
			t.Errorf("%s.IsCounter() = %v", f, f.IsCounter())
		}
	}
	if _, ok := dcgm.FieldByID(dcgm.FieldIDXIDErrors); ok {
		t.Error("the XID field is not a Field")
	}
}

// TestBlankAndNotSupportedThroughRun checks the same through the fake and
// the background loop: nothing DCGM marks empty ever reaches a snapshot.
func TestBlankAndNotSupportedThroughRun(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, dcgm.SMActive, 0.75)
	f.SetBlank(uuid0, -1, dcgm.SMOccupancy)
	f.SetNotSupported(uuid0, -1, dcgm.TensorActive)
	f.SetBlank(uuid0, -1, dcgm.PCIeTxBytes)
	f.SetValue(uuid0, -1, dcgm.PCIeRxBytes, 1e6)
	s := dcgm.NewSampler(testConfig(), f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "first sample", upWith(s, func(_ *dcgm.Snapshot) bool { return f.Calls("Latest") >= 3 }))
	snap := s.Snapshot()
	if len(snap.Devices) != 1 {
		t.Fatalf("devices = %+v", snap.Devices)
	}
	v := snap.Devices[0].Values
	if v[dcgm.SMActive] != 0.75 {
		t.Errorf("sm_active = %v, want 0.75", v[dcgm.SMActive])
	}
	if _, ok := v[dcgm.PCIeRxBytes]; !ok {
		t.Errorf("pcie rx counter missing: %v", v)
	}
	for fld, x := range v {
		if fld != dcgm.SMActive && fld != dcgm.PCIeRxBytes {
			t.Errorf("unexpected field %s = %v", fld, x)
		}
		if x >= dcgm.FP64Blank || float64(x) >= float64(dcgm.Int32Blank) && !fld.IsCounter() {
			t.Errorf("sentinel leaked: %s = %v", fld, x)
		}
	}
	if snap.Mode != dcgm.ModeEmbedded || snap.Reason != "" {
		t.Errorf("mode %q reason %q", snap.Mode, snap.Reason)
	}
}

func TestStaleValuesDropped(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, dcgm.SMActive, 0.5)
	f.SetValue(uuid0, -1, dcgm.DRAMActive, 0.25)
	cfg := testConfig()
	cfg.Interval = 20 * time.Millisecond
	s := dcgm.NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "values", upWith(s, func(snap *dcgm.Snapshot) bool {
		d, ok := snap.Find(uuid0, -1)
		return ok && d.Values[dcgm.DRAMActive] == 0.25
	}))
	// DCGM stops updating DRAM active: its timestamp stays put.
	frozen := time.Now()
	f.Freeze(uuid0, -1, dcgm.DRAMActive, 0.25, frozen)
	waitFor(t, 2*time.Second, "stale value dropped", upWith(s, func(snap *dcgm.Snapshot) bool {
		d, _ := snap.Find(uuid0, -1)
		_, ok := d.Values[dcgm.DRAMActive]
		return !ok
	}))
	if el, least := time.Since(frozen), time.Duration(cfg.MaxMissed)*cfg.Interval; el < least {
		t.Errorf("dropped after %s, before %d intervals (%s)", el, cfg.MaxMissed, least)
	}
	d, _ := s.Snapshot().Find(uuid0, -1)
	if d.Values[dcgm.SMActive] != 0.5 {
		t.Errorf("fresh value lost too: %v", d.Values)
	}
	// DCGM updates it again: it comes back.
	f.SetValue(uuid0, -1, dcgm.DRAMActive, 0.125)
	waitFor(t, 2*time.Second, "value back", upWith(s, func(snap *dcgm.Snapshot) bool {
		d, _ := snap.Find(uuid0, -1)
		return d.Values[dcgm.DRAMActive] == 0.125
	}))
}

// TestFirstValueAlreadyStale: a value whose DCGM timestamp is already old
// when first seen is never served.
func TestFirstValueAlreadyStale(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, dcgm.SMActive, 0.5)
	f.Freeze(uuid0, -1, dcgm.TensorActive, 0.9, time.Now().Add(-time.Hour))
	cfg := testConfig()
	cfg.Interval = 50 * time.Millisecond // max age 175ms: longer than the check below
	s := dcgm.NewSampler(cfg, f.Open)
	start(t, s)
	// Check every snapshot of the first samples: the value must never show.
	waitFor(t, 2*time.Second, "samples", func() bool {
		snap := s.Snapshot()
		if !snap.Up {
			return false
		}
		d, _ := snap.Find(uuid0, -1)
		if _, ok := d.Values[dcgm.TensorActive]; ok || d.Values[dcgm.SMActive] != 0.5 {
			t.Fatalf("values = %v, want sm_active only", d.Values)
		}
		return f.Calls("Latest") >= 3
	})
}

func TestReconnectAfterLostHostEngine(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0}, fakedcgm.SimDevice{GPU: 1, UUID: uuid1})
	f.SetValue(uuid0, -1, dcgm.SMActive, 0.5)
	f.SetValue(uuid0, -1, dcgm.PCIeTxBytes, 1e9)
	cfg := testConfig()
	s := dcgm.NewSampler(cfg, f.Open)
	start(t, s)
	var before float64
	waitFor(t, 2*time.Second, "up with a counter", upWith(s, func(snap *dcgm.Snapshot) bool {
		d, _ := snap.Find(uuid0, -1)
		before = d.Values[dcgm.PCIeTxBytes]
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
	waitFor(t, 2*time.Second, "up again", upWith(s, func(snap *dcgm.Snapshot) bool {
		d, ok := snap.Find(uuid0, -1)
		return ok && d.Values[dcgm.SMActive] == 0.5
	}))
	d, _ := s.Snapshot().Find(uuid0, -1)
	if after := d.Values[dcgm.PCIeTxBytes]; after < before {
		t.Errorf("counter went backwards across the reconnect: %v -> %v", before, after)
	}
}

func TestTransientErrors(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, dcgm.SMActive, 0.5)
	cfg := testConfig()
	cfg.Interval = 5 * time.Millisecond
	s := dcgm.NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "up", upWith(s, func(*dcgm.Snapshot) bool { return true }))

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
	waitFor(t, 2*time.Second, "up again", upWith(s, func(*dcgm.Snapshot) bool { return true }))
}

// blockingClient hangs in Latest until released: a stuck DCGM call.
type blockingClient struct {
	*fakedcgm.Fake
	block   atomic.Bool
	release chan struct{}
}

func (b *blockingClient) Latest(e []dcgm.Entity, ids []uint16) ([]dcgm.RawValue, error) {
	if b.block.Load() {
		<-b.release
	}
	return b.Fake.Latest(e, ids)
}

func TestSnapshotNotStaleWhenSamplerHangs(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, dcgm.SMActive, 0.5)
	bc := &blockingClient{Fake: f, release: make(chan struct{})}
	s := dcgm.NewSampler(testConfig(), func(dcgm.Config) (dcgm.Client, error) { return bc, nil })
	stop := start(t, s)
	waitFor(t, 2*time.Second, "up", upWith(s, func(*dcgm.Snapshot) bool { return true }))
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
	waitFor(t, 2*time.Second, "up after release", upWith(s, func(*dcgm.Snapshot) bool { return true }))
	stop()
}

func TestCountersMonotonicThroughRun(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetValue(uuid0, -1, dcgm.NVLinkRxBytes, 5e8)
	s := dcgm.NewSampler(testConfig(), f.Open)
	start(t, s)
	prev := -1.0
	seen := 0
	waitFor(t, 2*time.Second, "counter growth", func() bool {
		snap := s.Snapshot()
		d, ok := snap.Find(uuid0, -1)
		if !snap.Up || !ok {
			return false
		}
		v, ok := d.Values[dcgm.NVLinkRxBytes]
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
	f := fakedcgm.NewSimulated([]fakedcgm.SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{1, 2}, ComputeInstances: map[int][]int{2: {0, 1}}}, {GPU: 1, UUID: uuid1}},
		func(gpu, gi, ci int) (float64, bool) {
			a, ok := act[[3]int{gpu, gi, ci}]
			return a, ok
		})
	s := dcgm.NewSampler(testConfig(), f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "all devices", upWith(s, func(snap *dcgm.Snapshot) bool { return len(snap.Devices) == len(act) }))
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
		for _, fld := range []dcgm.Field{dcgm.SMActive, dcgm.SMOccupancy, dcgm.TensorActive, dcgm.DRAMActive} {
			got, has := d.Values[fld]
			if fld == dcgm.DRAMActive && k[2] >= 0 {
				// DCGM measures DRAM per GPU instance: a compute
				// instance has none of its own.
				if has {
					t.Errorf("gpu %d gi %d ci %d has a DRAM ratio %v", k[0], k[1], k[2], got)
				}
				continue
			}
			if want := fakedcgm.SimValue(fld, a); !has || math.Abs(got-want) > 1e-12 {
				t.Errorf("gpu %d gi %d ci %d %s = %v, want %v", k[0], k[1], k[2], fld, got, want)
			}
		}
		_, hasPCIe := d.Values[dcgm.PCIeTxBytes]
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
	kinds := map[dcgm.EntityKind]int{}
	for _, e := range ents {
		kinds[e.Kind]++
	}
	if kinds[dcgm.EntityGPUInstance] != 2 || kinds[dcgm.EntityComputeInstance] != 2 || every != testConfig().Interval {
		t.Errorf("watched %v every %s", ents, every)
	}
	// SimValue is deterministic and clamps ratios.
	if fakedcgm.SimValue(dcgm.SMOccupancy, 0.8) != 0.4 || fakedcgm.SimValue(dcgm.GraphicsActive, 1) != 1 || fakedcgm.SimValue(dcgm.PCIeRxBytes, 0.5) != 1e9 {
		t.Error("SimValue changed")
	}
}

// A field DCGM measures for a coarser entity is never taken from a finer
// one, whatever DCGM answers there: a DCGM whose profiling back-end copies a
// GPU instance's byte rates and DRAM ratio to its compute instances (and a
// GPU's to its GPU instances) must not have them counted once per child.
func TestParentValuesNotTakenFromChildren(t *testing.T) {
	f := fakedcgm.NewSimulated([]fakedcgm.SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{1}, ComputeInstances: map[int][]int{1: {0, 1}}}},
		func(_, _, _ int) (float64, bool) { return 0.5, true })
	f.SetValue(uuid0, 1, dcgm.PCIeTxBytes, 1e9)
	f.SetValue(uuid0, 1, dcgm.NVLinkRxBytes, 1e9)
	for _, ci := range []int{0, 1} {
		f.SetComputeInstanceValue(uuid0, 1, ci, dcgm.DRAMActive, 0.7)
		f.SetComputeInstanceValue(uuid0, 1, ci, dcgm.PCIeTxBytes, 1e9)
	}
	s := dcgm.NewSampler(testConfig(), f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "MIG values", upWith(s, func(snap *dcgm.Snapshot) bool {
		_, a := snap.FindComputeInstance(uuid0, 1, 1)
		_, b := snap.Find(uuid0, 1)
		return a && b
	}))
	snap := s.Snapshot()
	gi, _ := snap.Find(uuid0, 1)
	for _, fld := range []dcgm.Field{dcgm.PCIeTxBytes, dcgm.NVLinkRxBytes} {
		if v, ok := gi.Values[fld]; ok {
			t.Errorf("GPU instance has %s %v: DCGM measures it per GPU", fld, v)
		}
	}
	if _, ok := gi.Values[dcgm.DRAMActive]; !ok {
		t.Error("GPU instance lost its DRAM ratio")
	}
	for _, ci := range []int{0, 1} {
		d, _ := snap.FindComputeInstance(uuid0, 1, ci)
		for _, fld := range []dcgm.Field{dcgm.DRAMActive, dcgm.PCIeTxBytes} {
			if v, ok := d.Values[fld]; ok {
				t.Errorf("compute instance %d has %s %v: DCGM measures it for a coarser entity", ci, fld, v)
			}
		}
		if _, ok := d.Values[dcgm.SMActive]; !ok {
			t.Errorf("compute instance %d lost its SM ratio", ci)
		}
	}
	for _, f := range dcgm.Fields() {
		if f.Level() == dcgm.EntityGPU && !f.IsCounter() {
			t.Errorf("%s is measured per GPU only but is not a byte counter", f)
		}
	}
}

func TestMIGReconfiguration(t *testing.T) {
	f := fakedcgm.NewSimulated([]fakedcgm.SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{1}}},
		func(_, _, _ int) (float64, bool) { return 0.5, true })
	cfg := testConfig()
	cfg.Rediscover = 20 * time.Millisecond
	s := dcgm.NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "gi 1", upWith(s, func(snap *dcgm.Snapshot) bool { _, ok := snap.Find(uuid0, 1); return ok }))
	f.SetDevices([]fakedcgm.SimDevice{{GPU: 0, UUID: uuid0, GPUInstances: []int{3, 4}}})
	waitFor(t, 2*time.Second, "gi 3 and 4, no gi 1", upWith(s, func(snap *dcgm.Snapshot) bool {
		_, a := snap.Find(uuid0, 1)
		_, b := snap.Find(uuid0, 3)
		_, c := snap.Find(uuid0, 4)
		return !a && b && c
	}))
}

func TestHealthAndXID(t *testing.T) {
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0}, fakedcgm.SimDevice{GPU: 1, UUID: uuid1})
	xidAt := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	f.SetXID(uuid1, 79, xidAt)
	f.SetHealth(uuid1, dcgm.HealthPCIe, dcgm.HealthFail)
	f.SetHealth(uuid1, dcgm.HealthThermal, dcgm.HealthWarn)
	cfg := testConfig()
	cfg.HealthHold = -1 // no hold: DCGM's result as is
	s := dcgm.NewSampler(cfg, f.Open)
	start(t, s)
	waitFor(t, 2*time.Second, "health", upWith(s, func(snap *dcgm.Snapshot) bool { d, _ := snap.Find(uuid1, -1); return d.Health != nil }))
	snap := s.Snapshot()
	d0, _ := snap.Find(uuid0, -1)
	d1, _ := snap.Find(uuid1, -1)
	for _, sys := range dcgm.HealthSystems {
		if d0.Health[sys] != dcgm.HealthPass {
			t.Errorf("gpu0 %s = %q", sys, d0.Health[sys])
		}
		want := map[string]string{dcgm.HealthPCIe: dcgm.HealthFail, dcgm.HealthThermal: dcgm.HealthWarn}[sys]
		if want == "" {
			want = dcgm.HealthPass
		}
		if d1.Health[sys] != want {
			t.Errorf("gpu1 %s = %q, want %q", sys, d1.Health[sys], want)
		}
	}
	if d0.LastXID != 0 || d1.LastXID != 79 || !d1.LastXIDTime.Equal(xidAt) {
		t.Errorf("xids: gpu0 %d, gpu1 %d at %v (want 79 at %v)", d0.LastXID, d1.LastXID, d1.LastXIDTime, xidAt)
	}
	f.SetHealth(uuid1, dcgm.HealthPCIe, dcgm.HealthPass)
	waitFor(t, 2*time.Second, "pcie pass", upWith(s, func(snap *dcgm.Snapshot) bool {
		d, _ := snap.Find(uuid1, -1)
		return d.Health[dcgm.HealthPCIe] == dcgm.HealthPass
	}))
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
	c, err := dcgm.DefaultOpen(dcgm.Config{Mode: dcgm.ModeAuto})
	if err == nil {
		_ = c.Close()
		t.Skip(dcgm.LibraryName + " is installed here")
	}
	if !errors.Is(err, dcgm.ErrLibraryNotFound) {
		t.Skipf("DCGM present but not usable: %v", err)
	}
	if el := time.Since(begin); el > time.Second {
		t.Errorf("DefaultOpen took %s", el)
	}
	if !strings.Contains(err.Error(), dcgm.LibraryName) {
		t.Errorf("error %q does not name the library", err)
	}

	var logs syncBuffer
	cfg := testConfig()
	cfg.Mode = dcgm.ModeAuto
	cfg.Log = zerolog.New(&logs)
	var opens atomic.Int32
	s := dcgm.NewSampler(cfg, func(c dcgm.Config) (dcgm.Client, error) { opens.Add(1); return dcgm.DefaultOpen(c) })
	stop := start(t, s)
	waitFor(t, 2*time.Second, "mode off", func() bool { return s.Snapshot().Mode == dcgm.ModeOff })
	time.Sleep(5 * cfg.Interval) // long enough for retries, if there were any
	snap := s.Snapshot()
	if snap.Up || !strings.Contains(snap.Reason, dcgm.LibraryName) {
		t.Errorf("snapshot %+v", snap)
	}
	if n := opens.Load(); n != 1 {
		t.Errorf("opens = %d, want 1 (no retries without the library)", n)
	}
	stop()
	if lines := strings.Count(strings.TrimSpace(logs.String()), "\n") + 1; lines != 1 || !strings.Contains(logs.String(), dcgm.LibraryName) {
		t.Errorf("want one log line naming %s, got:\n%s", dcgm.LibraryName, logs.String())
	}
}

// TestStandaloneUnreachable: the real open against a host engine nobody
// listens on (and, here, without libdcgm): down, retrying, never exiting.
func TestStandaloneUnreachable(t *testing.T) {
	cfg := testConfig()
	cfg.Mode = dcgm.ModeStandalone
	cfg.HostEngine = "127.0.0.1:1"
	cfg.MaxBackoff = 20 * time.Millisecond
	var opens atomic.Int32
	s := dcgm.NewSampler(cfg, func(c dcgm.Config) (dcgm.Client, error) { opens.Add(1); return dcgm.DefaultOpen(c) })
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
	if snap.Up || snap.Mode != dcgm.ModeStandalone || !strings.Contains(snap.Reason, "connect") {
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
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	f.SetLost(true)
	cfg := testConfig()
	cfg.Interval = 2 * time.Millisecond
	cfg.MaxBackoff = 30 * time.Millisecond
	var mu sync.Mutex
	var at []time.Time
	s := dcgm.NewSampler(cfg, func(c dcgm.Config) (dcgm.Client, error) {
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
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	cfg := testConfig()
	cfg.Interval = time.Hour // Run is asleep when cancelled
	s := dcgm.NewSampler(cfg, f.Open)
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
	f := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid0})
	var entered atomic.Bool
	s := dcgm.NewSampler(testConfig(), func(c dcgm.Config) (dcgm.Client, error) {
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
	cfg.Mode = dcgm.ModeOff
	s := dcgm.NewSampler(cfg, func(dcgm.Config) (dcgm.Client, error) { opens.Add(1); return nil, errors.New("no") })
	stop := start(t, s)
	waitFor(t, 2*time.Second, "off", func() bool { return s.Snapshot().Reason == dcgm.ErrDisabled.Error() })
	stop()
	if opens.Load() != 0 || s.Snapshot().Up || s.Snapshot().Mode != dcgm.ModeOff {
		t.Errorf("opens %d snapshot %+v", opens.Load(), s.Snapshot())
	}
	if _, err := dcgm.DefaultOpen(cfg); !errors.Is(err, dcgm.ErrDisabled) {
		t.Errorf("DefaultOpen(off) = %v", err)
	}
}

func TestSnapshotBeforeRun(t *testing.T) {
	s := dcgm.NewSampler(dcgm.Config{}, nil)
	snap := s.Snapshot()
	if snap == nil || snap.Up || snap.Mode != dcgm.ModeAuto || len(snap.Devices) != 0 {
		t.Errorf("initial snapshot %+v", snap)
	}
	if s.MaxAge() != 35*time.Second {
		t.Errorf("default max age %s", s.MaxAge())
	}
}
