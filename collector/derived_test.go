package collector_test

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
)

func num(t *testing.T, p *collector.Page, name string, match ...string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(value(t, p, name, match...), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6*math.Max(1, math.Abs(b)) }

// On the default node: GPUs 0-4 held alone, 5 free, 6 time-sliced by three
// pods, 7 in MIG mode with 3g.40gb (slices 0-2), 2g.20gb (4-5) and 1g.10gb
// (3) held and 1g.10gb (6) free. Every slice of GPU 7 is covered.
func TestFragmentationOnSimulatedNode(t *testing.T) {
	pn := newDerivedNode(t, nil, state.DerivedConfig{})
	p := pn.step(t, time.Second)

	// Stranded: free VRAM of every allocated device, summed by hand; memory
	// the driver reserves is not free, and not GPU 6's: one of its four
	// time-slicing replicas is free, so the next gpu.shared pod can use that
	// memory.
	var want float64
	for _, dev := range [][2]string{{"0", ""}, {"1", ""}, {"2", ""}, {"3", ""}, {"4", ""}, {"7", "2"}, {"7", "3"}, {"7", "9"}} { // GPU 7's held instances, by GPU instance ID
		m := []string{`gpu="` + dev[0] + `"`, `gpu_instance="` + dev[1] + `"`}
		want += num(t, p, "gpu_memory_total_bytes", m...) - num(t, p, "gpu_memory_reserved_bytes", m...) - num(t, p, "gpu_memory_used_bytes", m...)
	}
	if got := num(t, p, "gpu_memory_stranded_bytes"); !near(got, want) {
		t.Errorf("stranded %v, want %v", got, want)
	}
	// Only GPU 5 is free and whole: groups of one.
	if v := num(t, p, "gpu_free_devices_largest_group", `domain="nvlink"`); v != 1 {
		t.Errorf("largest free NVLink group %v, want 1", v)
	}
	if v := num(t, p, "gpu_free_devices_largest_group", `domain="numa"`); v != 1 {
		t.Errorf("largest free NUMA group %v, want 1", v)
	}
	if v := num(t, p, "gpu_mig_free_slices", `gpu="7"`); v != 0 {
		t.Errorf("GPU 7 free slices %v, want 0", v)
	}
	if v := num(t, p, "gpu_mig_largest_placeable_slices", `gpu="7"`); v != 0 {
		t.Errorf("GPU 7 largest placeable %v, want 0", v)
	}
	// Unallocated: GPU 5 whole, plus GPU 7's free 1g instance (1 of 7 slices).
	if v := num(t, p, "gpu_unallocated_capacity_gpus"); !near(v, 1+1.0/7) {
		t.Errorf("unallocated %v, want 8/7", v)
	}
	// Weng et al.: a 1-GPU task fits GPU 5, so only GPU 7's 1/7 is lost to it;
	// 2-, 4- and 8-GPU tasks fit nowhere, so all 8/7 is fragmented for them;
	// a 1g.10gb task fits GPU 7's free instance, and GPU 5 (not MIG) cannot
	// serve it, so its 1 is lost.
	for shape, want := range map[string]float64{"1": 1.0 / 7, "2": 8.0 / 7, "4": 8.0 / 7, "8": 8.0 / 7, "mig-1g.10gb": 1} {
		t.Run(shape, func(t *testing.T) {
			if v := num(t, p, "gpu_fragmentation_gpus", `shape="`+shape+`"`); !near(v, want) {
				t.Errorf("F(%s) = %v, want %v", shape, v, want)
			}
		})
	}
	// Jobs that fit now: GPU 5 takes one 1-GPU job and no larger one; GPU
	// 7's free 1g.10gb instance takes one 1g job and its slices are all
	// covered, so no new instance.
	for shape, want := range map[string]float64{"1": 1, "2": 0, "4": 0, "8": 0, "mig-1g.10gb": 1} {
		if v := num(t, p, "gpu_fitting_jobs", `shape="`+shape+`"`); v != want {
			t.Errorf("fitting %s jobs = %v, want %v", shape, v, want)
		}
	}
	weighted := (0.5*(1.0/7) + 0.2*(8.0/7) + 0.15*(8.0/7) + 0.1*(8.0/7) + 0.05*1) / 1.0
	if v := num(t, p, "gpu_fragmentation_weighted_gpus"); !near(v, weighted) {
		t.Errorf("F(M) = %v, want %v", v, weighted)
	}
	if s := series(p, "gpu_price_dollars_per_hour"); len(s) != 0 {
		t.Errorf("prices without a price list: %v", s)
	}
}

func TestMIGPlacementOnPartlyFilledGPU(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 1g.10gb}, {profile: 1g.10gb}]
pods:
  - {namespace: a, name: p, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
`)
	pn := newDerivedNode(t, sc, state.DerivedConfig{})
	p := pn.step(t, time.Second)
	// Instances at slices 0 and 1; slices 2-6 free. On H100: 1g fits at 2..6
	// (5 more), 2g at 2 and 4 (2 more), 3g at 4 (1 more), 4g and 7g only at 0
	// (none). Largest placeable: 3g, 3 slices.
	if v := num(t, p, "gpu_mig_free_slices", `gpu="0"`); v != 5 {
		t.Errorf("free slices %v, want 5", v)
	}
	for prof, want := range map[string]float64{"1g.10gb": 5, "2g.20gb": 2, "3g.40gb": 1, "4g.40gb": 0, "7g.80gb": 0} {
		t.Run(prof, func(t *testing.T) {
			if v := num(t, p, "gpu_mig_placeable_instances", `mig_profile="`+prof+`"`); v != want {
				t.Errorf("placeable %s = %v, want %v", prof, v, want)
			}
		})
	}
	if v := num(t, p, "gpu_mig_largest_placeable_slices"); v != 3 {
		t.Errorf("largest placeable %v slices, want 3", v)
	}
	if v := num(t, p, "gpu_devices", `state="free"`); v != 1 {
		t.Errorf("free devices %v, want 1 (the second instance)", v)
	}
}

func TestIdleAllocationFlipsAfterWindow(t *testing.T) {
	prices := &fragmentation.PriceList{PerGPUHour: map[string]float64{"NVIDIA H100 80GB HBM3": 7}}
	pn := newDerivedNode(t, nil, state.DerivedConfig{Idle: fragmentation.IdleConfig{Threshold: 0.05, Window: 30 * time.Second}, Prices: prices})
	idle := func(p *collector.Page, pod string) string {
		return value(t, p, "gpu_allocation_idle", `pod="`+pod+`"`)
	}
	p := pn.step(t, time.Second)
	if v := idle(p, "notebook-alice"); v != "0" {
		t.Fatalf("idle before the window passed: %s", v)
	}
	for i := 0; i < 4; i++ {
		p = pn.step(t, 10*time.Second)
	}
	if v := idle(p, "notebook-alice"); v != "1" {
		t.Errorf("notebook-alice (GPU 4, nothing running) idle = %s after 40s, want 1", v)
	}
	for _, busy := range []string{"llm-pretrain-0", "llm-pretrain-1", "chat-api-0", "chat-api-1", "chat-api-2"} {
		for _, l := range series(p, "gpu_allocation_idle", `pod="`+busy+`"`) {
			if l[len(l)-1] != '0' {
				t.Errorf("busy holder reported idle: %s", l)
			}
		}
	}
	if v := num(t, p, "gpu_idle_allocated_devices"); v != 1 {
		t.Errorf("idle allocated devices %v, want 1", v)
	}
	s1 := num(t, p, "gpu_allocation_idle_seconds_total", `pod="notebook-alice"`)
	p = pn.step(t, 10*time.Second)
	if s2 := num(t, p, "gpu_allocation_idle_seconds_total", `pod="notebook-alice"`); s2 != s1+10 {
		t.Errorf("idle seconds went from %v to %v over 10s", s1, s2)
	}
	// Prices: whole GPUs at list price, MIG instances by their slices.
	if v := num(t, p, "gpu_price_dollars_per_hour", `gpu="4"`); v != 7 {
		t.Errorf("GPU 4 price %v, want 7", v)
	}
	if v := num(t, p, "gpu_price_dollars_per_hour", `gpu="7"`, `gpu_instance="2"`); !near(v, 3) {
		t.Errorf("3g.40gb price %v, want 7*3/7 = 3", v)
	}
}

func TestReplacedPodStartsFreshWindow(t *testing.T) {
	sc := scenario(t, `
node: {count: 1}
gpus: [{index: 0, workload: {preset: idle-held}}]
pods:
  - {namespace: a, name: first, stop: 60s, containers: [{name: c, devices: [{gpu: 0}]}]}
  - {namespace: a, name: second, start: 60s, containers: [{name: c, devices: [{gpu: 0}]}]}
`)
	pn := newDerivedNode(t, sc, state.DerivedConfig{Idle: fragmentation.IdleConfig{Threshold: 0.05, Window: 30 * time.Second}})
	var p *collector.Page
	for i := 0; i < 5; i++ {
		p = pn.step(t, 10*time.Second)
	}
	if v := value(t, p, "gpu_allocation_idle", `pod="first"`); v != "1" {
		t.Fatalf("first pod idle = %s", v)
	}
	p = pn.step(t, 20*time.Second) // t=70s: the second pod holds the GPU
	if v := value(t, p, "gpu_allocation_idle", `pod="second"`); v != "0" {
		t.Errorf("the replacing pod inherited the idle window: idle = %s", v)
	}
	if v := value(t, p, "gpu_allocation_idle_seconds_total", `pod="second"`); v != "0" {
		t.Errorf("the replacing pod inherited idle seconds: %s", v)
	}
}

// On A100 a 7g instance's placement spans 8 memory
// slices; its price share is by compute slices, so it costs the whole GPU,
// and a 3g instance 3/7 of it (its placement spans 4 memory slices).
func TestMIGPriceByComputeSlicesOnA100(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-40GB, count: 2}
gpus:
  - {index: 0, mig: [{profile: 7g.40gb}]}
  - {index: 1, mig: [{profile: 3g.20gb}, {profile: 3g.20gb}]}
`)
	model := "Mock NVIDIA A100-SXM4-40GB"
	prices := &fragmentation.PriceList{PerGPUHour: map[string]float64{model: 7}}
	pn := newDerivedNode(t, sc, state.DerivedConfig{Prices: prices})
	p := pn.step(t, time.Second)
	if v := num(t, p, "gpu_price_dollars_per_hour", `gpu="0"`, `gpu_instance="0"`); !near(v, 7) {
		t.Errorf("7g.40gb price %v, want 7 (the whole GPU)", v)
	}
	if v := num(t, p, "gpu_price_dollars_per_hour", `gpu="1"`, `gpu_instance="2"`); !near(v, 3) {
		t.Errorf("3g.20gb price %v, want 3 (3 of 7 compute slices)", v)
	}
	if v := num(t, p, "gpu_mig_free_slices", `gpu="0"`); v != 0 {
		t.Errorf("free slices beside a 7g instance: %v, want 0", v)
	}
	// Two 3g instances use 6 of 7 compute slices and cover all 8 memory
	// slices: one compute slice is free, yet nothing more fits.
	if v := num(t, p, "gpu_mig_free_slices", `gpu="1"`); v != 1 {
		t.Errorf("free slices beside two 3g instances: %v, want 1", v)
	}
	if v := num(t, p, "gpu_mig_largest_placeable_slices", `gpu="1"`); v != 0 {
		t.Errorf("largest placeable beside two 3g instances: %v, want 0", v)
	}
}

// A profile's per-GPU instance limit caps what is
// placeable: H100's 1g.10gb+me allows one instance, not one per free slice.
func TestMIGPlaceableHonoursInstanceLimits(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 2}
gpus:
  - {index: 0, mig: [{profile: 1g.10gb}]}
  - {index: 1, mig: [{profile: 1g.10gb+me}]}
`)
	pn := newDerivedNode(t, sc, state.DerivedConfig{})
	p := pn.step(t, time.Second)
	if v := num(t, p, "gpu_mig_placeable_instances", `gpu="0"`, `mig_profile="1g.10gb+me"`); v != 1 {
		t.Errorf("1g.10gb+me placeable on GPU 0: %v, want 1 (InstanceCount)", v)
	}
	if v := num(t, p, "gpu_mig_placeable_instances", `gpu="1"`, `mig_profile="1g.10gb+me"`); v != 0 {
		t.Errorf("1g.10gb+me placeable beside one: %v, want 0", v)
	}
	if v := num(t, p, "gpu_mig_placeable_instances", `gpu="0"`, `mig_profile="1g.10gb"`); v != 6 {
		t.Errorf("1g.10gb placeable beside one: %v, want 6", v)
	}
}

// A GPU instance split into two compute instances (nvidia-smi mig -cci) is
// two MIG devices that share its slices and its memory: its free memory is
// stranded once, its price is split between them, and each is a unit.
func TestComputeInstancesShareTheirGPUInstance(t *testing.T) {
	sc := scenario(t, `
node: {model: A100-SXM4-80GB, count: 1}
gpus:
  - {index: 0, mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 1g.10gb}]}
pods:
  - {namespace: a, name: p1, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: a, name: p2, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
`)
	prices := &fragmentation.PriceList{PerGPUHour: map[string]float64{"NVIDIA A100-SXM4-80GB": 7}}
	pn := newDerivedNode(t, sc, state.DerivedConfig{Prices: prices})
	p := pn.step(t, time.Second)
	for _, ci := range []string{"0", "1"} {
		if v := num(t, p, "gpu_price_dollars_per_hour", `gpu_instance="1"`, `compute_instance="`+ci+`"`); !near(v, 1.5) {
			t.Errorf("compute instance %s of the 3g.40gb: price %v, want 1.5 (half of 3/7 of $7)", ci, v)
		}
	}
	if v := num(t, p, "gpu_price_dollars_per_hour", `gpu_instance="11"`); !near(v, 1) {
		t.Errorf("1g.10gb price %v, want 1", v)
	}
	m := []string{`gpu_instance="1"`, `compute_instance="0"`}
	free := num(t, p, "gpu_memory_total_bytes", m...) - num(t, p, "gpu_memory_used_bytes", m...)
	if got := num(t, p, "gpu_memory_stranded_bytes"); !near(got, free) {
		t.Errorf("stranded %v, want %v: the GPU instance's free memory once", got, free)
	}
	if v := num(t, p, "gpu_devices", `state="allocated"`); v != 2 {
		t.Errorf("allocated devices %v, want 2 (two compute instances)", v)
	}
	if v := num(t, p, "gpu_devices", `state="free"`); v != 1 {
		t.Errorf("free devices %v, want 1 (the 1g.10gb)", v)
	}
	if v := num(t, p, "gpu_mig_free_slices", `gpu="0"`); v != 3 {
		t.Errorf("free slices %v, want 3 (7 less 3g and 1g)", v)
	}
	if v := value(t, p, "gpu_mig_info", `compute_instance="1"`, `gpu_instance="1"`); v != "1" {
		t.Errorf("second compute instance missing from gpu_mig_info")
	}
	if !strings.Contains(string(p.Plain), `mig_profile="1c.3g.40gb"`) {
		t.Errorf("compute instances not named as NVML names them (1c.3g.40gb)")
	}
}
