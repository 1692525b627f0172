package collector_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakedcgm"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

func TestDCGMProfilingPerGPUAndMIG(t *testing.T) {
	d := newDCGMNode(t, nil, nil)
	p := d.until(t, "DCGM values", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio")) > 0 })
	for _, m := range []string{"gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_tensor_active_ratio", "gpu_dram_active_ratio"} {
		if n := len(series(p, m, `gpu_instance=""`)); n != 8 {
			t.Errorf("%s: %d whole-GPU series, want 8", m, n)
		}
		for _, gi := range []string{"2", "3", "9", "10"} { // GPU 7's instances, numbered by placement
			if n := len(series(p, m, `gpu="7"`, `gpu_instance="`+gi+`"`)); n != 1 {
				t.Errorf("%s: MIG instance %s has %d series, want 1", m, gi, n)
			}
		}
	}
	// NVML's fields keep their source: one series each, NVML's values.
	if n := len(series(p, "gpu_utilization_ratio")); n != 7 {
		t.Errorf("gpu_utilization_ratio: %d series, want 7 (NVML, not MIG)", n)
	}
	if v := value(t, p, "gpu_exporter_collector_up", `collector="dcgm"`); v != "1" {
		t.Errorf("dcgm up = %s", v)
	}
	if n := len(series(p, "gpu_dcgm_health_status", `gpu="0"`)); n != len(dcgm.HealthSystems) {
		t.Errorf("%d health systems for GPU 0", n)
	}
}

func TestDCGMSkipsBlankAndUnsupported(t *testing.T) {
	d := newDCGMNode(t, nil, nil, func(f *fakedcgm.Fake, n *simnode.Node) {
		uuid := n.Devices()[2].UUID()
		f.SetBlank(uuid, -1, dcgm.TensorActive)
		f.SetNotSupported(uuid, -1, dcgm.FP64Active)
	})
	p := d.until(t, "DCGM values", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio", `gpu="2"`)) == 1 })
	if s := series(p, "gpu_tensor_active_ratio", `gpu="2"`, `gpu_instance=""`); len(s) != 0 {
		t.Errorf("blank value exported: %v", s)
	}
	if s := series(p, "gpu_fp64_active_ratio", `gpu="2"`, `gpu_instance=""`); len(s) != 0 {
		t.Errorf("not-supported value exported: %v", s)
	}
	if s := series(p, "gpu_tensor_active_ratio", `gpu="3"`, `gpu_instance=""`); len(s) != 1 {
		t.Errorf("other GPUs lost their tensor values: %v", s)
	}
}

func TestDCGMHostEngineLostAndBack(t *testing.T) {
	d := newDCGMNode(t, nil, nil)
	d.until(t, "DCGM up", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio")) > 0 })
	d.fake.SetLost(true)
	p := d.until(t, "DCGM down", func(p *collector.Page) bool {
		return value(t, p, "gpu_exporter_collector_up", `collector="dcgm"`) == "0"
	})
	if s := series(p, "gpu_sm_active_ratio"); len(s) != 0 {
		t.Errorf("DCGM values served while the host engine is gone: %d series", len(s))
	}
	if n := len(series(p, "gpu_memory_used_bytes")); n != 12 {
		t.Errorf("NVML metrics stopped with DCGM: %d memory series", n)
	}
	d.fake.SetLost(false)
	d.until(t, "DCGM back", func(p *collector.Page) bool {
		return value(t, p, "gpu_exporter_collector_up", `collector="dcgm"`) == "1" && len(series(p, "gpu_sm_active_ratio")) > 0
	})
}

func TestNoLibDCGMFallsBackToNVML(t *testing.T) {
	// The real opener: there is no libdcgm.so.4 on this machine.
	d := newTestExporter(t, withRealTime(), withDCGM(dcgm.DefaultOpen), withDCGMConfig(func(c *dcgm.Config) {
		c.Mode, c.MaxMissed, c.MaxBackoff = dcgm.ModeAuto, 0, 0
	}))
	waitFor(t, "auto mode without libdcgm to settle on off", func() bool {
		return d.ds.Snapshot() != nil && d.ds.Snapshot().Mode == dcgm.ModeOff
	})
	e := d.e
	e.SampleOnce(context.Background())
	p := e.Page()
	if s := series(p, "gpu_exporter_collector_up", `collector="dcgm"`); len(s) != 0 {
		t.Errorf("DCGM off by absence reports a collector status: %v", s)
	}
	if n := len(series(p, "gpu_utilization_ratio")); n != 7 {
		t.Errorf("NVML metrics without DCGM: %d utilisation series", n)
	}
	if strings.Contains(string(p.Plain), "gpu_sm_active_ratio{") {
		t.Error("profiling metrics without DCGM")
	}
}

func TestDCGMXIDNotCountedTwice(t *testing.T) {
	reader := xid.NewReader(nil, nil)
	d := newDCGMNode(t, nil, reader)
	uuid := d.node.Devices()[5].UUID()
	at := time.Now()
	reader.Counter().Add(5, uuid, 48, at) // NVML's event
	d.fake.SetXID(uuid, 48, at)           // DCGM's last-XID field says the same
	d.until(t, "DCGM up", func(p *collector.Page) bool { return len(series(p, "gpu_sm_active_ratio")) > 0 })
	for i := 0; i < 5; i++ { // DCGM's field is read again and again
		d.e.SampleOnce(context.Background())
	}
	p := d.e.Page()
	if v := value(t, p, "gpu_xid_errors_total", `gpu="5"`, `xid="48"`); v != "1" {
		t.Errorf("XID 48 counted %s times, want 1", v)
	}
	d.fake.SetXID(uuid, 48, at.Add(time.Minute)) // a new occurrence only DCGM saw
	d.until(t, "the DCGM-only XID", func(p *collector.Page) bool {
		return value(t, p, "gpu_xid_errors_total", `gpu="5"`, `xid="48"`) == "2"
	})
}

// Two pods on the two compute instances of one GPU instance, one busy and
// one idle: each holder is judged on its own compute instance's DCGM
// activity, not on the GPU instance's (which mixes in its neighbour's), and
// a byte counter that DCGM also answers for the GPU instance is not served
// once per compute instance: the series of the GPU sum to the GPU's own.
func TestDCGMComputeInstancesJudgedApart(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]
pods:
  - {namespace: a, name: busy, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: a, name: idle, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
`)
	// DCGM samples on the wall clock, every 20ms; the exporter's clock is
	// the test's. MaxMissed keeps DCGM's values fresh through a stall of
	// the sampler's goroutine on a loaded machine: a step that found none
	// would leave the idle holder unmeasured for that sample, and its idle
	// window would start again.
	tn := newTestExporter(t, withScenario(sc), withKubelet(), withGroups(fullGroups()),
		withDerived(state.DerivedConfig{Idle: fragmentation.IdleConfig{Threshold: 0.05, Window: time.Minute}}),
		withDCGM(nil, splitGPUInstanceActivity), withDCGMConfig(func(c *dcgm.Config) { c.MaxMissed = 500 }))
	gi1 := `gpu_instance="1"` // the 3g.40gb at 0:4
	waitFor(t, "DCGM values on both compute instances", func() bool {
		p := tn.step(t, 0)
		return len(series(p, "gpu_sm_active_ratio", gi1)) == 2 && len(series(p, "gpu_pcie_transmit_bytes_total", `gpu_instance=""`)) == 1
	})
	uuid := tn.node.Devices()[0].UUID()
	var p *collector.Page
	for range 5 {
		waitFor(t, "DCGM's values of both compute instances", func() bool {
			snap := tn.ds.Snapshot()
			_, busy := snap.FindComputeInstance(uuid, 1, 0)
			_, idle := snap.FindComputeInstance(uuid, 1, 1)
			return busy && idle
		})
		p = tn.step(t, 20*time.Second)
	}
	for ci, want := range map[string]float64{"0": 0.9, "1": 0} {
		if v := num(t, p, "gpu_sm_active_ratio", gi1, `compute_instance="`+ci+`"`); !near(v, want) {
			t.Errorf("compute instance %s: SM active %v, want %v (its own, not its GPU instance's)", ci, v, want)
		}
		if s := series(p, "gpu_dram_active_ratio", gi1, `compute_instance="`+ci+`"`); len(s) != 0 {
			t.Errorf("compute instance %s serves its GPU instance's DRAM ratio: %v", ci, s)
		}
	}
	if v := value(t, p, "gpu_allocation_idle", `pod="idle"`); v != "1" {
		t.Errorf("the idle holder's gpu_allocation_idle = %s, want 1: judged on its neighbour's activity", v)
	}
	if v := value(t, p, "gpu_allocation_idle", `pod="busy"`); v != "0" {
		t.Errorf("the busy holder's gpu_allocation_idle = %s, want 0", v)
	}
	// The whole GPU and the undivided 1g.10gb keep what they had.
	if v := num(t, p, "gpu_sm_active_ratio", `gpu_instance="11"`); !near(v, 0.3) {
		t.Errorf("1g.10gb SM active %v, want 0.3", v)
	}
	if s := series(p, "gpu_dram_active_ratio", `gpu_instance="11"`); len(s) != 1 {
		t.Errorf("1g.10gb lost its DRAM ratio: %v", s)
	}
	for _, m := range []string{"gpu_pcie_transmit_bytes_total", "gpu_pcie_receive_bytes_total", "gpu_nvlink_transmit_bytes_total"} {
		gpu := num(t, p, m, `gpu="0"`, `gpu_instance=""`)
		var sum float64
		for _, l := range series(p, m, `gpu="0"`) {
			v, err := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
			if err != nil {
				t.Fatal(err)
			}
			sum += v
		}
		if !near(sum, gpu) {
			t.Errorf("%s: the GPU's series sum to %v, the GPU's own is %v: traffic counted twice", m, sum, gpu)
		}
	}
}

// splitGPUInstanceActivity sets a fake DCGM for a GPU whose GPU instance 1
// (a 3g.40gb at 0:4) is split into a busy compute instance 0 and an idle compute instance 1.
// The fake runs on real time (the DCGM sampler does) while the node's
// clock stands still between steps, and its profiling back-end answers
// byte rates for the GPU instance too.
func splitGPUInstanceActivity(f *fakedcgm.Fake, n *simnode.Node) {
	f.SetClock(time.Now)
	f.SetActivity(func(_, gi, ci int) (float64, bool) {
		switch {
		case gi < 0:
			return 0.2, true
		case gi == 1 && ci == 0:
			return 0.9, true
		case gi == 1 && ci == 1:
			return 0, true
		case gi == 1:
			return 0.45, true // the GPU instance: the mean of the two
		}
		return 0.3, true
	})
	f.SetValue(n.Devices()[0].UUID(), 0, dcgm.PCIeTxBytes, 5e8)
}

// dcgm-exporter's families are labelled by GPU instance: a GPU instance
// split into compute instances is served with its own DCGM values, not
// with those of the compute instance it is served on.
func TestCompatSplitGPUInstanceDCGMValues(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]
`)
	tn := newTestExporter(t, withScenario(sc), withRealTime(), withGroups(fullGroups()), withDCGM(nil, splitGPUInstanceActivity),
		withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{Hostname: "n"} }))
	p := tn.until(t, "DCGM values", func(p *collector.Page) bool {
		return len(series(p, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", `GPU_I_ID="1"`)) == 1
	})
	if v := num(t, p, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", `GPU_I_ID="1"`); !near(v, fakedcgm.SimValue(dcgm.GraphicsActive, 0.45)) {
		t.Errorf("GPU instance 1 engine activity %v, want the GPU instance's %v", v, fakedcgm.SimValue(dcgm.GraphicsActive, 0.45))
	}
	if v := num(t, p, "DCGM_FI_PROF_DRAM_ACTIVE", `GPU_I_ID="1"`); !near(v, fakedcgm.SimValue(dcgm.DRAMActive, 0.45)) {
		t.Errorf("GPU instance 1 DRAM activity %v, want the GPU instance's %v", v, fakedcgm.SimValue(dcgm.DRAMActive, 0.45))
	}
}

// DCGM's numbering of a GPU need not be NVML's (DCGM falls back to its own
// GPU ID where it reports no NVML index): an XID DCGM hands over is placed
// by the GPU's UUID, on the GPU NVML knows by that UUID, and is not counted
// a second time beside NVML's event of it.
func TestDCGMXIDPlacedByUUID(t *testing.T) {
	// The default node's UUIDs are the same on every run.
	probe, err := simnode.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	uuid := probe.Devices()[5].UUID()
	probe.Close()
	// DCGM knows NVML's GPU 5 as its GPU 0.
	fake := fakedcgm.NewFake(fakedcgm.SimDevice{GPU: 0, UUID: uuid})
	reader := xid.NewReader(nil, nil)
	d := newDCGMNode(t, fake.Open, reader)
	if got := d.node.Devices()[5].UUID(); got != uuid {
		t.Fatalf("GPU 5 is %s, was %s", got, uuid)
	}
	d.e.SampleOnce(context.Background()) // the exporter learns NVML's UUIDs
	at := time.Now()
	reader.Counter().Add(5, uuid, 48, at) // NVML's event
	calls := fake.Calls("Latest")
	fake.SetXID(uuid, 48, at) // DCGM's last-XID field says the same
	waitFor(t, "DCGM to read the XID", func() bool { return fake.Calls("Latest") >= calls+2 })
	d.e.SampleOnce(context.Background())
	p := d.e.Page()
	if v := value(t, p, "gpu_xid_errors_total", `gpu="5"`, `xid="48"`); v != "1" {
		t.Errorf("XID 48 on GPU 5 counted %s times, want 1", v)
	}
	if s := series(p, "gpu_xid_errors_total", `gpu="0"`); len(s) != 0 {
		t.Errorf("DCGM's XID placed on DCGM's GPU number: %v", s)
	}
	fake.SetXID(uuid, 48, at.Add(time.Minute)) // a new occurrence only DCGM saw
	d.until(t, "the DCGM-only XID on GPU 5", func(p *collector.Page) bool {
		return value(t, p, "gpu_xid_errors_total", `gpu="5"`, `xid="48"`) == "2"
	})
}
