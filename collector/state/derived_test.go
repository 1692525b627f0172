package state

import (
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// a100Layout is an A100-80GB's MIG geometry (NVIDIA's MIG user guide, as
// sim/miggeometry lists it), with the GPU instances given.
func a100Layout(instances map[int]sample.MIGPlacement) *sample.MIGLayout {
	return &sample.MIGLayout{TotalSlices: 7, MemorySlices: 8, Instances: instances, Profiles: []sample.MIGProfileInfo{
		{Name: "1g.10gb", Slices: 1, MaxInstances: 7, Placements: []sample.Placement{pl(0, 1), pl(1, 1), pl(2, 1), pl(3, 1), pl(4, 1), pl(5, 1), pl(6, 1)}},
		{Name: "3g.40gb", Slices: 3, MaxInstances: 2, Placements: []sample.Placement{pl(0, 4), pl(4, 4)}},
		{Name: "4g.40gb", Slices: 4, MaxInstances: 1, Placements: []sample.Placement{pl(0, 4)}},
		{Name: "7g.80gb", Slices: 7, MaxInstances: 1, Placements: []sample.Placement{pl(0, 8)}},
	}}
}

func pl(start, size int) sample.Placement { return sample.Placement{Start: start, Size: size} }

// A GPU instance without compute instances (nvidia-smi mig -cgi without
// -C) is in the layout NVML reports (nvmlDeviceGetGpuInstances) but has
// no MIG device: its slices are taken, it is no unit to schedule, and no
// job fits in it. A 4g.40gb alone on an A100 leaves 3 slices free, no 4g
// or 7g placeable, one 3g; a job of 4g.40gb does not fit.
func TestGPUInstanceWithoutComputeInstances(t *testing.T) {
	s := &sample.NodeSample{GPUs: []sample.GPUState{{
		DeviceState: sample.DeviceState{GPU: 0, UUID: "GPU-a", Up: true, MIGEnabled: true, GPUInstance: -1, ComputeInstance: -1},
		MIGLayout:   a100Layout(map[int]sample.MIGPlacement{1: {Profile: "4g.40gb", Start: 0, Size: 4, Slices: 4, ProfileID: 5}}),
	}}}
	a := &Allocations{Known: true, ByDevice: map[sample.UnitKey][]Holder{}}
	shapes := []fragmentation.Shape{
		{Name: "mig-4g.40gb", MIGProfile: "4g.40gb", Weight: 1},
		{Name: "mig-3g.40gb", MIGProfile: "3g.40gb", Weight: 1},
		{Name: "mig-7g.80gb", MIGProfile: "7g.80gb", Weight: 1},
	}
	r := fragmentation.Compute(fragInput(s, a), shapes)
	if len(r.MIG) != 1 {
		t.Fatalf("%d MIG GPUs in the result, want 1", len(r.MIG))
	}
	m := r.MIG[0]
	if m.FreeSlices != 3 {
		t.Errorf("free slices %d, want 3", m.FreeSlices)
	}
	for p, want := range map[string]int{"4g.40gb": 0, "7g.80gb": 0, "3g.40gb": 1, "1g.10gb": 3} {
		if m.Placeable[p] != want {
			t.Errorf("placeable %s = %d, want %d", p, m.Placeable[p], want)
		}
	}
	for shape, want := range map[string]int{"mig-4g.40gb": 0, "mig-3g.40gb": 1, "mig-7g.80gb": 0} {
		if r.Fitting[shape] != want {
			t.Errorf("fitting %s = %d, want %d", shape, r.Fitting[shape], want)
		}
	}
	if r.Free != 0 || r.Allocated != 0 || r.Unhealthy != 0 {
		t.Errorf("units free %d, allocated %d, unhealthy %d; a GPU instance without compute instances is none", r.Free, r.Allocated, r.Unhealthy)
	}
	if units := s.Units(); len(units) != 0 {
		t.Errorf("%d schedulable units, want none", len(units))
	}
}
