package state

import (
	"slices"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// kinds are the faults' reasons.
func reasons(fs []Fault) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Reason())
	}
	return out
}

func equal(a, b []string) bool { return slices.Equal(a, b) }

// A fatal XID holds until the GPU is seen reset (it stops answering and
// answers again, or NVML is initialised again), whatever its age; an
// application XID is no fault; a lost, hung or row-remap-failed GPU and a
// recovery action are faults while they last; a MIG device's XID names
// the device; nothing is judged while the driver is away.
func TestFaults(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	gpu := func(i int, up bool) sample.GPUState {
		return sample.GPUState{DeviceState: sample.DeviceState{GPU: i, UUID: "GPU-" + string(rune('a'+i)), Up: up}}
	}
	var tr faultTracker
	step := func(at time.Duration, inits int, gpus []sample.GPUState, xids []xid.Count, inst []xid.InstanceCount) []string {
		st := &State{Sample: &sample.NodeSample{Time: t0.Add(at), GPUs: gpus, NVML: sample.NVMLStatus{Inits: inits}}, XIDs: xids, XIDInstances: inst}
		return reasons(tr.faults(st))
	}
	x79 := xid.Count{GPU: 1, UUID: "GPU-b", Code: 79, Entry: xid.Lookup(79), Last: t0.Add(time.Second)}
	x13 := xid.Count{GPU: 0, UUID: "GPU-a", Code: 13, Entry: xid.Lookup(13), Last: t0.Add(time.Second)}
	x94 := xid.Count{GPU: 0, UUID: "GPU-a", Code: 95, Entry: xid.Lookup(95), Last: t0.Add(time.Second)}

	if got := step(0, 1, []sample.GPUState{gpu(0, true), gpu(1, true)}, nil, nil); len(got) != 0 {
		t.Errorf("healthy: %v", got)
	}
	if got := step(2*time.Second, 1, []sample.GPUState{gpu(0, true), gpu(1, true)}, []xid.Count{x13, x79}, nil); !equal(got, []string{"GPU1Xid79"}) {
		t.Errorf("XID 13 and 79: %v, want GPU1Xid79 alone (13 is the application's)", got)
	}
	if got := step(3*time.Second, 1, []sample.GPUState{gpu(0, true), gpu(1, false)}, []xid.Count{x79}, nil); !equal(got, []string{"GPU1Xid79", "GPU1Lost"}) {
		t.Errorf("GPU 1 lost after its XID: %v", got)
	}
	if got := step(time.Hour, 1, []sample.GPUState{gpu(0, true), gpu(1, false)}, []xid.Count{x79}, nil); !equal(got, []string{"GPU1Xid79", "GPU1Lost"}) {
		t.Errorf("an hour later, still lost: %v (an XID holds until a reset, not for an hour)", got)
	}
	if got := step(time.Hour+time.Second, 1, []sample.GPUState{gpu(0, true), gpu(1, true)}, []xid.Count{x79}, nil); len(got) != 0 {
		t.Errorf("GPU 1 answers again: %v, want no fault", got)
	}

	// A MIG device's uncontained ECC error (XID 95, reset_gpu), cleared by
	// NVML initialised again.
	mig := xid.InstanceCount{GPU: 0, UUID: "GPU-a", Code: 95, MIGUUID: "MIG-x", Instance: xid.Instance{GPUInstance: 3, ComputeInstance: 0}}
	x94.Last = t0.Add(2 * time.Hour)
	st := &State{Sample: &sample.NodeSample{Time: t0.Add(2*time.Hour + time.Second), GPUs: []sample.GPUState{gpu(0, true), gpu(1, true)}, NVML: sample.NVMLStatus{Inits: 1}},
		XIDs: []xid.Count{x79, x94}, XIDInstances: []xid.InstanceCount{mig}}
	fs := tr.faults(st)
	if len(fs) != 1 || fs[0].Reason() != "GPU0Xid95" || fs[0].MIGUUID != "MIG-x" || fs[0].GPUInstance != 3 {
		t.Fatalf("XID 95 on a MIG device: %+v", fs)
	}
	if m := fs[0].Message(); m != "GPU 0 (GPU-a): XID 95 (Uncontained ECC error (all applications affected)) on MIG device MIG-x (GPU instance 3) at 2026-12-06T12:00:00Z, not followed by a GPU reset: reset the GPU" {
		t.Errorf("message: %s", m)
	}
	if got := step(3*time.Hour, 2, []sample.GPUState{gpu(0, true), gpu(1, true)}, []xid.Count{x79, x94}, []xid.InstanceCount{mig}); len(got) != 0 {
		t.Errorf("after NVML was initialised again: %v", got)
	}

	// Hung, row remapping failed, a recovery action; the driver away.
	g0 := gpu(0, false)
	g0.Hung = true
	g1 := gpu(1, true)
	g1.Health.RemapFailed = sample.Some(true)
	g1.Health.RecoveryAction = sample.Some(1)
	if got := step(4*time.Hour, 2, []sample.GPUState{g0, g1}, nil, nil); !equal(got, []string{"GPU0Hung", "GPU1RowRemapFailed", "GPU1RecoveryActionGpuReset"}) {
		t.Errorf("hung, remap failed, recovery action: %v", got)
	}
	st = &State{Sample: &sample.NodeSample{Time: t0.Add(5 * time.Hour), GPUs: []sample.GPUState{gpu(0, false)}, NVML: sample.NVMLStatus{Inits: 2, Down: "the driver went away"}}}
	if fs := tr.faults(st); len(fs) != 0 {
		t.Errorf("the driver away: %v", reasons(fs))
	}
}

// A taint a DRA driver put on a slice's device lands on the device it
// names (by UUID, by gpu-<minor>, a MIG device on every compute instance of
// its GPU instance) and a NoSchedule one makes it unhealthy; a device of
// no GPU of the node is left out.
func TestJoinDeviceTaints(t *testing.T) {
	s := &sample.NodeSample{GPUs: []sample.GPUState{
		{DeviceState: sample.DeviceState{GPU: 0, UUID: "GPU-0", Minor: 4, Up: true}},
		{DeviceState: sample.DeviceState{GPU: 1, UUID: "GPU-1", Minor: 5, Up: true, MIGEnabled: true},
			MIG: []sample.DeviceState{
				{GPU: 1, UUID: "GPU-1", GPUInstance: 7, ComputeInstance: 0, MIGProfile: "1c.2g.20gb", MIGUUID: "MIG-a", Up: true},
				{GPU: 1, UUID: "GPU-1", GPUInstance: 7, ComputeInstance: 1, MIGProfile: "1c.2g.20gb", MIGUUID: "MIG-b", Up: true},
				{GPU: 1, UUID: "GPU-1", GPUInstance: 9, ComputeInstance: 0, MIGProfile: "1g.10gb", MIGUUID: "MIG-c", Up: true},
			}},
	}}
	xid48 := []podmap.SliceTaint{{Key: "gpu.nvidia.com/xid", Value: "48", Effect: "NoSchedule"}}
	joinDeviceTaints(s, []podmap.SliceDevice{
		{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-4", Type: "gpu", UUID: "GPU-0", Taints: xid48},
		{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-5-mig-1g10gb-19-0", Type: "mig", UUID: "MIG-a", Taints: []podmap.SliceTaint{{Key: "k", Effect: "None"}}},
		{Driver: "gpu.nvidia.com", Pool: "n", Name: "gpu-9", Type: "gpu", UUID: "GPU-gone", Taints: xid48},
	})
	if g := &s.GPUs[0]; len(g.Taints) != 1 || g.Taints[0].Device != "gpu-4" || g.Healthy() {
		t.Errorf("GPU 0: taints %+v healthy %v; want the XID 48 taint and unhealthy", g.Taints, g.Healthy())
	}
	g := &s.GPUs[1]
	if len(g.MIG[0].Taints) != 1 || len(g.MIG[1].Taints) != 1 || len(g.MIG[2].Taints) != 0 || len(g.Taints) != 0 {
		t.Errorf("MIG taints: %+v %+v %+v", g.MIG[0].Taints, g.MIG[1].Taints, g.MIG[2].Taints)
	}
	for _, u := range s.Units() {
		if want := u.Key.GPU == 1; u.Healthy != want {
			t.Errorf("unit %+v healthy %v, want %v (a None taint keeps a device healthy)", u.Key, u.Healthy, want)
		}
	}
	// A second join starts from nothing: taints lifted leave.
	joinDeviceTaints(s, nil)
	if len(s.GPUs[0].Taints) != 0 || len(s.GPUs[1].MIG[0].Taints) != 0 {
		t.Error("taints kept after they left the slice")
	}
}
