package fragmentation

import (
	"fmt"
	"math"
	"reflect"
	"testing"
)

const gib = float64(1 << 30)

// h100Profiles are the GPU instance profiles of an H100 80GB with the
// placements NVML lists for them (nvidia-smi mig -lgipp): start and size in
// slots. NVML's slot space is 8 wide although the GPU has 7 compute slices:
// 3g takes 4 slots and 7g takes 8.
func h100Profiles() []MIGProfile {
	one := make([]Placement, 7)
	for i := range one {
		one[i] = Placement{Start: i, Size: 1}
	}
	return []MIGProfile{
		{Name: "1g.10gb", Slices: 1, MemoryBytes: 10 * gib, Placements: one},
		{Name: "2g.20gb", Slices: 2, MemoryBytes: 20 * gib, Placements: []Placement{{0, 2}, {2, 2}, {4, 2}}},
		{Name: "3g.40gb", Slices: 3, MemoryBytes: 40 * gib, Placements: []Placement{{0, 4}, {4, 4}}},
		{Name: "4g.40gb", Slices: 4, MemoryBytes: 40 * gib, Placements: []Placement{{0, 4}}},
		{Name: "7g.80gb", Slices: 7, MemoryBytes: 80 * gib, Placements: []Placement{{0, 8}}},
	}
}

// h100ProfilesSliceSized is the same table with every placement as wide as
// the profile's compute slices (the way the placements are often written
// down); the results must not depend on which form the caller uses.
func h100ProfilesSliceSized() []MIGProfile {
	ps := h100Profiles()
	for i := range ps {
		for j := range ps[i].Placements {
			ps[i].Placements[j].Size = ps[i].Slices
		}
	}
	return ps
}

func migGPU(index int, healthy bool, profiles []MIGProfile, instances ...MIGInstance) GPU {
	return GPU{
		Index: index, UUID: "GPU-" + string(rune('a'+index)), Healthy: healthy,
		NVLinkDomain: -1, NUMANode: -1,
		MIG: &MIGState{TotalSlices: 7, Instances: instances, Profiles: profiles},
	}
}

func wholeGPU(index int, healthy, allocated bool) GPU {
	return GPU{Index: index, UUID: "GPU-" + string(rune('a'+index)), Healthy: healthy, Allocated: allocated,
		MemoryTotal: 80 * gib, NVLinkDomain: -1, NUMANode: -1}
}

func approx(a, b float64) bool { return math.Abs(a-b) <= 1e-9 }

// checkResult compares every field of got with want, floats to 1e-9.
func checkResult(t *testing.T, got, want Result) {
	t.Helper()
	if got.Free != want.Free || got.Allocated != want.Allocated || got.Unhealthy != want.Unhealthy {
		t.Errorf("units free/allocated/unhealthy = %d/%d/%d, want %d/%d/%d",
			got.Free, got.Allocated, got.Unhealthy, want.Free, want.Allocated, want.Unhealthy)
	}
	if !approx(got.StrandedMemoryBytes, want.StrandedMemoryBytes) {
		t.Errorf("StrandedMemoryBytes = %v, want %v", got.StrandedMemoryBytes, want.StrandedMemoryBytes)
	}
	if !reflect.DeepEqual(got.LargestFreeGroup, want.LargestFreeGroup) {
		t.Errorf("LargestFreeGroup = %v, want %v", got.LargestFreeGroup, want.LargestFreeGroup)
	}
	if !reflect.DeepEqual(got.MIG, want.MIG) {
		t.Errorf("MIG =\n  %+v\nwant\n  %+v", got.MIG, want.MIG)
	}
	if !approx(got.UnallocatedGPUs, want.UnallocatedGPUs) {
		t.Errorf("UnallocatedGPUs = %v, want %v", got.UnallocatedGPUs, want.UnallocatedGPUs)
	}
	if len(got.PerShape) != len(want.PerShape) {
		t.Errorf("PerShape = %v, want %v", got.PerShape, want.PerShape)
	}
	for k, w := range want.PerShape {
		if g, ok := got.PerShape[k]; !ok || !approx(g, w) {
			t.Errorf("PerShape[%q] = %v (present %v), want %v", k, g, ok, w)
		}
	}
	if !approx(got.Weighted, want.Weighted) {
		t.Errorf("Weighted = %v, want %v", got.Weighted, want.Weighted)
	}
}

func groups(nvlink, numa int) map[string]int {
	return map[string]int{DomainNVLink: nvlink, DomainNUMA: numa}
}

func TestComputeMIGPlacement(t *testing.T) {
	// An H100 with 1g.10gb at slot 0 and 3g.40gb at slots 4-7,
	// both allocated. Covered slots: {0, 4, 5, 6, 7}; of the 7 compute slots
	// 0-6, slots 1, 2, 3 are free.
	//   1g {0..6}:   0 covered; 1, 2, 3 free; 4-6 covered        -> 3
	//   2g {0,2,4}:  0-1 has 0 covered; 2-3 free; 4-5 covered    -> 1
	//   3g {0,4}:    0-3 has 0; 4-7 covered                      -> 0
	//   4g {0}, 7g {0}: slot 0 covered                           -> 0
	// Largest placeable: 2g.20gb (2 slices).
	// R = slots not covered by allocated instances / 7 = 3/7.
	// Stranded: (10-4) GiB + (40-30) GiB = 16 GiB.
	// Shapes (defaults): no whole GPU is free, so "1".."8" do not fit and
	// F = all unallocated = 3/7; mig-1g.10gb fits on this GPU, and no other
	// GPU holds capacity, so F = 0.
	// Weighted = (0.5+0.2+0.15+0.1) * 3/7 + 0.05*0 = 0.95*3/7.
	allocated := []MIGInstance{
		{Profile: "1g.10gb", Start: 0, Size: 1, Allocated: true, MemoryTotal: 10 * gib, MemoryUsed: 4 * gib},
		{Profile: "3g.40gb", Start: 4, Size: 4, Allocated: true, MemoryTotal: 40 * gib, MemoryUsed: 30 * gib},
	}
	partlyFree := []MIGInstance{
		{Profile: "1g.10gb", Start: 0, Size: 1, Allocated: false, MemoryTotal: 10 * gib, MemoryUsed: 1 * gib},
		{Profile: "3g.40gb", Start: 4, Size: 4, Allocated: true, MemoryTotal: 40 * gib, MemoryUsed: 30 * gib},
	}
	sliceSized := []MIGInstance{
		{Profile: "1g.10gb", Start: 0, Size: 1, Allocated: true, MemoryTotal: 10 * gib, MemoryUsed: 4 * gib},
		{Profile: "3g.40gb", Start: 4, Size: 3, Allocated: true, MemoryTotal: 40 * gib, MemoryUsed: 30 * gib},
	}
	placeable := map[string]int{"1g.10gb": 3, "2g.20gb": 1, "3g.40gb": 0, "4g.40gb": 0, "7g.80gb": 0}
	mig := []MIGResult{{GPU: 0, UUID: "GPU-a", FreeSlices: 3, Placeable: placeable,
		LargestPlaceableSlices: 2, LargestPlaceableProfile: "2g.20gb"}}

	tests := []struct {
		name string
		gpus []GPU
		want Result
	}{
		{
			name: "both allocated, NVML placement sizes",
			gpus: []GPU{migGPU(0, true, h100Profiles(), allocated...)},
			want: Result{Allocated: 2, StrandedMemoryBytes: 16 * gib, LargestFreeGroup: groups(0, 0), MIG: mig,
				UnallocatedGPUs: 3.0 / 7,
				PerShape:        map[string]float64{"1": 3.0 / 7, "2": 3.0 / 7, "4": 3.0 / 7, "8": 3.0 / 7, "mig-1g.10gb": 0},
				Weighted:        0.95 * 3 / 7},
		},
		{
			// Same geometry written with slice-sized placements (3g at 4 is
			// slots 4-6): the same slots are free, so the same answers.
			name: "both allocated, slice-sized placements",
			gpus: []GPU{migGPU(0, true, h100ProfilesSliceSized(), sliceSized...)},
			want: Result{Allocated: 2, StrandedMemoryBytes: 16 * gib, LargestFreeGroup: groups(0, 0), MIG: mig,
				UnallocatedGPUs: 3.0 / 7,
				PerShape:        map[string]float64{"1": 3.0 / 7, "2": 3.0 / 7, "4": 3.0 / 7, "8": 3.0 / 7, "mig-1g.10gb": 0},
				Weighted:        0.95 * 3 / 7},
		},
		{
			// The 1g instance is unallocated: one free unit, and its slice
			// counts as unallocated capacity, R = (7-3)/7 = 4/7; free slices
			// and placements do not change (the instance still exists).
			// Stranded: only the allocated 3g, 40-30 = 10 GiB.
			// Weighted = 0.95 * 4/7.
			name: "1g instance unallocated",
			gpus: []GPU{migGPU(0, true, h100Profiles(), partlyFree...)},
			want: Result{Free: 1, Allocated: 1, StrandedMemoryBytes: 10 * gib, LargestFreeGroup: groups(0, 0), MIG: mig,
				UnallocatedGPUs: 4.0 / 7,
				PerShape:        map[string]float64{"1": 4.0 / 7, "2": 4.0 / 7, "4": 4.0 / 7, "8": 4.0 / 7, "mig-1g.10gb": 0},
				Weighted:        0.95 * 4 / 7},
		},
		{
			// No instances: 7 free slices; 1g x7, 2g x3 (0,2,4), 3g x2
			// (0-3, 4-7), 4g x1, 7g x1; largest 7g.80gb. R = 1.
			// Whole-GPU shapes cannot use a MIG GPU: F = 1 each; 1g fits: 0.
			// Weighted = 0.95.
			name: "empty MIG GPU",
			gpus: []GPU{migGPU(0, true, h100Profiles())},
			want: Result{LargestFreeGroup: groups(0, 0),
				MIG: []MIGResult{{GPU: 0, UUID: "GPU-a", FreeSlices: 7,
					Placeable:              map[string]int{"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
					LargestPlaceableSlices: 7, LargestPlaceableProfile: "7g.80gb"}},
				UnallocatedGPUs: 1,
				PerShape:        map[string]float64{"1": 1, "2": 1, "4": 1, "8": 1, "mig-1g.10gb": 0},
				Weighted:        0.95},
		},
		{
			// 4g.40gb at 0-3 allocated: slots 4-7 free, so one 3g (4-7),
			// one 2g (4-5), three 1g (4, 5, 6); largest 3g.40gb.
			// R = 3/7; weighted 0.95*3/7.
			name: "4g allocated leaves a 3g",
			gpus: []GPU{migGPU(0, true, h100Profiles(),
				MIGInstance{Profile: "4g.40gb", Start: 0, Size: 4, Allocated: true, MemoryTotal: 40 * gib, MemoryUsed: 40 * gib})},
			want: Result{Allocated: 1, LargestFreeGroup: groups(0, 0),
				MIG: []MIGResult{{GPU: 0, UUID: "GPU-a", FreeSlices: 3,
					Placeable:              map[string]int{"1g.10gb": 3, "2g.20gb": 1, "3g.40gb": 1, "4g.40gb": 0, "7g.80gb": 0},
					LargestPlaceableSlices: 3, LargestPlaceableProfile: "3g.40gb"}},
				UnallocatedGPUs: 3.0 / 7,
				PerShape:        map[string]float64{"1": 3.0 / 7, "2": 3.0 / 7, "4": 3.0 / 7, "8": 3.0 / 7, "mig-1g.10gb": 0},
				Weighted:        0.95 * 3 / 7},
		},
		{
			// 4g allocated at 0-3 and an unallocated 3g at 4-7: no free
			// slot, R = 3/7 (the idle 3g). A 1g task cannot use a 3g
			// instance and has no placement: mig-1g.10gb does not fit
			// anywhere, so its F is everything, 3/7. Weighted = 3/7.
			name: "unallocated instance of another profile does not serve",
			gpus: []GPU{migGPU(0, true, h100Profiles(),
				MIGInstance{Profile: "4g.40gb", Start: 0, Size: 4, Allocated: true},
				MIGInstance{Profile: "3g.40gb", Start: 4, Size: 4})},
			want: Result{Free: 1, Allocated: 1, LargestFreeGroup: groups(0, 0),
				MIG: []MIGResult{{GPU: 0, UUID: "GPU-a", FreeSlices: 0,
					Placeable: map[string]int{"1g.10gb": 0, "2g.20gb": 0, "3g.40gb": 0, "4g.40gb": 0, "7g.80gb": 0}}},
				UnallocatedGPUs: 3.0 / 7,
				PerShape:        map[string]float64{"1": 3.0 / 7, "2": 3.0 / 7, "4": 3.0 / 7, "8": 3.0 / 7, "mig-1g.10gb": 3.0 / 7},
				Weighted:        3.0 / 7},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkResult(t, Compute(tc.gpus, DefaultShapes), tc.want)
		})
	}
}

func TestComputeMIGShapeServedByExistingInstance(t *testing.T) {
	// Same GPU as the last case above; a 3g task can take the unallocated 3g
	// instance, so it fits and F = R of the GPUs that cannot serve it: none.
	gpus := []GPU{migGPU(0, true, h100Profiles(),
		MIGInstance{Profile: "4g.40gb", Start: 0, Size: 4, Allocated: true},
		MIGInstance{Profile: "3g.40gb", Start: 4, Size: 4})}
	shapes := []Shape{{Name: "mig-3g.40gb", MIGProfile: "3G.40GB", Weight: 1}} // case-insensitive
	r := Compute(gpus, shapes)
	if f := r.PerShape["mig-3g.40gb"]; f != 0 {
		t.Errorf("F(mig-3g.40gb) = %v, want 0", f)
	}

	// Allocated 1g instances at slots 0-3 and an unallocated 3g at 4-7:
	// every 1g placement is covered and the only 1g instances are taken, so
	// a 1g task does not fit; F = all unallocated = the idle 3g's 3/7 (an
	// allocated instance of the right profile must not count as serving).
	gpus = []GPU{migGPU(0, true, h100Profiles(),
		MIGInstance{Profile: "1g.10gb", Start: 0, Size: 1, Allocated: true},
		MIGInstance{Profile: "1g.10gb", Start: 1, Size: 1, Allocated: true},
		MIGInstance{Profile: "1g.10gb", Start: 2, Size: 1, Allocated: true},
		MIGInstance{Profile: "1g.10gb", Start: 3, Size: 1, Allocated: true},
		MIGInstance{Profile: "3g.40gb", Start: 4, Size: 4})}
	r = Compute(gpus, []Shape{{Name: "mig-1g.10gb", MIGProfile: "1g.10gb", Weight: 1}})
	if f := r.PerShape["mig-1g.10gb"]; !approx(f, 3.0/7) {
		t.Errorf("F(mig-1g.10gb) with only allocated 1g instances = %v, want 3/7", f)
	}
}

func TestComputeWorkedExample(t *testing.T) {
	// The package documentation's example, by hand:
	//   GPU 0 whole allocated R=0; GPU 1 whole free R=1;
	//   GPU 2 MIG, allocated 4g at slots 0-3, R = 3/7; GPU 3 unhealthy R=0.
	//   Unallocated = 10/7.
	//   "1": GPU 1 serves; F = R_2 = 3/7.
	//   "2": one GPU with R >= 1 < 2: F = 10/7.
	//   "mig-1g.10gb": GPU 2 has free 1g placements; F = R_1 = 1.
	//   F(M) = (0.5*3/7 + 0.3*10/7 + 0.2*1) / 1 = 5.9/7.
	// Units: GPU 0 allocated, GPU 1 free, GPU 2's 4g allocated, GPU 3
	// unhealthy. GPU 2: 3 free slices; 1g x3, 2g x1 (4-5), 3g x1 (4-7).
	gpus := []GPU{
		wholeGPU(0, true, true),
		wholeGPU(1, true, false),
		migGPU(2, true, h100Profiles(), MIGInstance{Profile: "4g.40gb", Start: 0, Size: 4, Allocated: true}),
		wholeGPU(3, false, false),
	}
	gpus[0].MemoryUsed = 80 * gib // nothing stranded
	shapes := []Shape{
		{Name: "1", GPUs: 1, Weight: 0.5},
		{Name: "2", GPUs: 2, Weight: 0.3},
		{Name: "mig-1g.10gb", MIGProfile: "1g.10gb", Weight: 0.2},
	}
	want := Result{
		Free: 1, Allocated: 2, Unhealthy: 1,
		LargestFreeGroup: groups(1, 1),
		MIG: []MIGResult{{GPU: 2, UUID: "GPU-c", FreeSlices: 3,
			Placeable:              map[string]int{"1g.10gb": 3, "2g.20gb": 1, "3g.40gb": 1, "4g.40gb": 0, "7g.80gb": 0},
			LargestPlaceableSlices: 3, LargestPlaceableProfile: "3g.40gb"}},
		UnallocatedGPUs: 10.0 / 7,
		PerShape:        map[string]float64{"1": 3.0 / 7, "2": 10.0 / 7, "mig-1g.10gb": 1},
		Weighted:        5.9 / 7,
	}
	checkResult(t, Compute(gpus, shapes), want)
}

func TestComputeTopology(t *testing.T) {
	// 8 GPUs, NVLink domains {0-3} and {4-7}, NUMA nodes by pairs
	// {0,1} {2,3} {4,5} {6,7}. GPUs 0 and 5 allocated, GPU 6 unhealthy.
	// Free: 1, 2, 3, 4, 7.
	//   NVLink: domain 0 has {1,2,3} = 3, domain 1 has {4,7} = 2 -> 3.
	//   NUMA: {1}, {2,3}, {4}, {7} -> 2.
	// Stranded: GPU 0 80-20 = 60 GiB, GPU 5 80-80 = 0; unhealthy GPU 6's
	// free memory is not counted.
	// Shapes: 5 whole free GPUs, so 1, 2, 4 fit with F = 0 (no other GPU
	// has capacity); 8 does not fit: F = 5; no MIG GPU, so mig-1g does not
	// fit: F = 5. Weighted = 0.1*5 + 0.05*5 = 0.75.
	gpus := make([]GPU, 8)
	for i := range gpus {
		gpus[i] = GPU{Index: i, Healthy: true, MemoryTotal: 80 * gib, NVLinkDomain: i / 4, NUMANode: i / 2}
	}
	gpus[0].Allocated, gpus[0].MemoryUsed = true, 20*gib
	gpus[5].Allocated, gpus[5].MemoryUsed = true, 80*gib
	gpus[6].Healthy, gpus[6].Allocated, gpus[6].MemoryUsed = false, true, 1*gib
	want := Result{
		Free: 5, Allocated: 2, Unhealthy: 1,
		StrandedMemoryBytes: 60 * gib,
		LargestFreeGroup:    groups(3, 2),
		UnallocatedGPUs:     5,
		PerShape:            map[string]float64{"1": 0, "2": 0, "4": 0, "8": 5, "mig-1g.10gb": 5},
		Weighted:            0.75,
	}
	checkResult(t, Compute(gpus, DefaultShapes), want)
}

func TestComputeUnknownDomains(t *testing.T) {
	tests := []struct {
		name         string
		nvlink, numa []int // per GPU; all GPUs free
		want         map[string]int
	}{
		// Unknown domains: every GPU is its own group.
		{"all unknown", []int{-1, -1, -1}, []int{-1, -1, -1}, groups(1, 1)},
		// Two GPUs in NVLink domain 2, one unknown: 2. NUMA: 0, 0, 0 -> 3.
		{"mixed", []int{2, 2, -1}, []int{0, 0, 0}, groups(2, 3)},
		// Unknown GPUs do not form a group with each other (-1 and -5
		// included: any negative value is unknown).
		{"negatives", []int{-1, -5, 7}, []int{-1, 3, -1}, groups(1, 1)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gpus := make([]GPU, len(tc.nvlink))
			for i := range gpus {
				gpus[i] = GPU{Index: i, Healthy: true, NVLinkDomain: tc.nvlink[i], NUMANode: tc.numa[i]}
			}
			if got := Compute(gpus, nil).LargestFreeGroup; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("LargestFreeGroup = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestComputeUnhealthy(t *testing.T) {
	// GPU 0: healthy free whole GPU (R = 1).
	// GPU 1: unhealthy MIG GPU with a free 1g and an allocated 3g: both
	//   units unhealthy, R = 0, nothing stranded, and its MIG result reports
	//   no free slices and nothing placeable (every profile listed as 0).
	// GPU 2: unhealthy, allocated whole GPU: unhealthy unit, not stranded.
	// Shapes: "1" fits on GPU 0: F = 0 (no other capacity). "2" does not
	//   fit: F = 1. mig-1g: the only MIG GPU is unhealthy: F = 1.
	gpus := []GPU{
		wholeGPU(0, true, false),
		migGPU(1, false, h100Profiles(),
			MIGInstance{Profile: "1g.10gb", Start: 0, Size: 1, MemoryTotal: 10 * gib},
			MIGInstance{Profile: "3g.40gb", Start: 4, Size: 4, Allocated: true, MemoryTotal: 40 * gib}),
		wholeGPU(2, false, true),
	}
	shapes := []Shape{
		{Name: "1", GPUs: 1, Weight: 1},
		{Name: "2", GPUs: 2, Weight: 1},
		{Name: "mig-1g.10gb", MIGProfile: "1g.10gb", Weight: 2},
	}
	want := Result{
		Free: 1, Unhealthy: 3,
		LargestFreeGroup: groups(1, 1),
		MIG: []MIGResult{{GPU: 1, UUID: "GPU-b",
			Placeable: map[string]int{"1g.10gb": 0, "2g.20gb": 0, "3g.40gb": 0, "4g.40gb": 0, "7g.80gb": 0}}},
		UnallocatedGPUs: 1,
		PerShape:        map[string]float64{"1": 0, "2": 1, "mig-1g.10gb": 1},
		// (1*0 + 1*1 + 2*1) / 4 = 0.75
		Weighted: 0.75,
	}
	checkResult(t, Compute(gpus, shapes), want)
}

func TestComputeEdgeCases(t *testing.T) {
	t.Run("no GPUs", func(t *testing.T) {
		// Nothing fits, and all unallocated capacity is 0: every F is 0.
		want := Result{LargestFreeGroup: groups(0, 0),
			PerShape: map[string]float64{"1": 0, "2": 0, "4": 0, "8": 0, "mig-1g.10gb": 0}}
		checkResult(t, Compute(nil, DefaultShapes), want)
	})
	t.Run("shape that never fits", func(t *testing.T) {
		// Neither GPUs nor a MIG profile: never fits, F = all = 2.
		// "1" fits on two free GPUs: F = 0, with weight 0. The NaN weight
		// is left out. Weighted = (1*2 + 0*0) / (1 + 0) = 2.
		gpus := []GPU{wholeGPU(0, true, false), wholeGPU(1, true, false)}
		shapes := []Shape{{Name: "bad", Weight: 1}, {Name: "1", GPUs: 1, Weight: 0}, {Name: "nan", GPUs: 1, Weight: math.NaN()}}
		r := Compute(gpus, shapes)
		if r.PerShape["bad"] != 2 || r.PerShape["1"] != 0 || r.Weighted != 2 {
			t.Errorf("PerShape = %v, Weighted = %v; want bad=2, 1=0, weighted 2", r.PerShape, r.Weighted)
		}
	})
	t.Run("all weights zero", func(t *testing.T) {
		r := Compute([]GPU{wholeGPU(0, true, true)}, []Shape{{Name: "1", GPUs: 1}})
		if r.Weighted != 0 {
			t.Errorf("Weighted = %v, want 0", r.Weighted)
		}
	})
	t.Run("bad instance and placement ranges", func(t *testing.T) {
		// An instance with a negative start covers nothing; a placement
		// past slot 64 is never free. TotalSlices 7, one bad instance:
		// 7 free slices, R = 1 (the bad instance is an allocated unit that
		// covers no slot).
		g := GPU{Index: 0, Healthy: true, MIG: &MIGState{TotalSlices: 7,
			Instances: []MIGInstance{{Profile: "1g.10gb", Start: -1, Size: 1, Allocated: true}},
			Profiles: []MIGProfile{
				{Name: "huge", Slices: 1, Placements: []Placement{{63, 2}, {0, 0}, {-1, 1}}},
				{Name: "1g.10gb", Slices: 1, Placements: []Placement{{6, 1}}},
			}}}
		r := Compute([]GPU{g}, nil)
		want := []MIGResult{{GPU: 0, FreeSlices: 7, Placeable: map[string]int{"huge": 0, "1g.10gb": 1},
			LargestPlaceableSlices: 1, LargestPlaceableProfile: "1g.10gb"}}
		if !reflect.DeepEqual(r.MIG, want) || r.Allocated != 1 || !approx(r.UnallocatedGPUs, 1) {
			t.Errorf("got MIG %+v, allocated %d, unallocated %v; want %+v, 1, 1", r.MIG, r.Allocated, r.UnallocatedGPUs, want)
		}
	})
	t.Run("does not modify input", func(t *testing.T) {
		gpus := []GPU{migGPU(0, true, h100Profiles(), MIGInstance{Profile: "1g.10gb", Start: 3, Size: 1, Allocated: true})}
		before := h100Profiles()
		Compute(gpus, DefaultShapes)
		if !reflect.DeepEqual(gpus[0].MIG.Profiles, before) {
			t.Error("Compute modified the profiles")
		}
	})
}

func TestSlotMask(t *testing.T) {
	tests := []struct {
		start, size int
		want        uint64
	}{
		{0, 1, 0b1},
		{4, 4, 0b1111_0000},
		{0, 8, 0xff},
		{0, 64, math.MaxUint64},
		{63, 1, 1 << 63},
		{63, 2, 0}, // past slot 63
		{0, 0, 0},  // empty
		{-1, 2, 0}, // negative start
		{1, 64, 0}, // too wide
		{0, 65, 0}, // too wide
		{70, 1, 0}, // out of range
		{2, -3, 0}, // negative size
		{60, 4, 0xf << 60},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("start%d/size%d", tc.start, tc.size), func(t *testing.T) {
			if got := slotMask(tc.start, tc.size); got != tc.want {
				t.Errorf("slotMask(%d, %d) = %#x, want %#x", tc.start, tc.size, got, tc.want)
			}
		})
	}
}

// benchMIGNode is 8 H100s, each split into seven 1g.10gb instances, every
// other instance allocated: 8 x 7 = 56 schedulable units.
func benchMIGNode() []GPU {
	gpus := make([]GPU, 8)
	for i := range gpus {
		inst := make([]MIGInstance, 7)
		for j := range inst {
			inst[j] = MIGInstance{Profile: "1g.10gb", Start: j, Size: 1, Allocated: j%2 == 0,
				MemoryTotal: 10 * gib, MemoryUsed: 2 * gib}
		}
		gpus[i] = GPU{Index: i, Healthy: true, NVLinkDomain: 0, NUMANode: i / 4,
			MIG: &MIGState{TotalSlices: 7, Instances: inst, Profiles: h100Profiles()}}
	}
	return gpus
}

func BenchmarkCompute(b *testing.B) {
	b.Run("mig-8x7", func(b *testing.B) {
		gpus := benchMIGNode()
		b.ReportAllocs()
		for b.Loop() {
			Compute(gpus, DefaultShapes)
		}
	})
	b.Run("whole-8", func(b *testing.B) {
		gpus := make([]GPU, 8)
		for i := range gpus {
			gpus[i] = GPU{Index: i, Healthy: true, Allocated: i%3 == 0, MemoryTotal: 80 * gib, MemoryUsed: gib,
				NVLinkDomain: 0, NUMANode: i / 4}
		}
		b.ReportAllocs()
		for b.Loop() {
			Compute(gpus, DefaultShapes)
		}
	})
}

func TestBenchMIGNodeValues(t *testing.T) {
	// Guards the benchmark input: 8 GPUs x 7 instances, instances 0, 2, 4, 6
	// allocated on each -> 32 allocated, 24 free; R = 3/7 per GPU, 24/7 in
	// all; stranded 32 x 8 GiB. Every slot is covered, so nothing is
	// placeable, but free 1g instances serve mig-1g: its F is 0, and whole
	// shapes do not fit: F = 24/7.
	r := Compute(benchMIGNode(), DefaultShapes)
	if r.Allocated != 32 || r.Free != 24 || !approx(r.UnallocatedGPUs, 24.0/7) ||
		!approx(r.StrandedMemoryBytes, 32*8*gib) || r.PerShape["mig-1g.10gb"] != 0 || !approx(r.PerShape["8"], 24.0/7) {
		t.Errorf("unexpected result %+v", r)
	}
	if r.MIG[3].FreeSlices != 0 || r.MIG[3].LargestPlaceableProfile != "" {
		t.Errorf("MIG[3] = %+v, want no free slices", r.MIG[3])
	}
}

// TestComputeFitting counts the jobs of each shape a node can take now: free
// whole GPUs over the shape's size, and free or creatable MIG instances.
func TestComputeFitting(t *testing.T) {
	shapes := []Shape{
		{Name: "1", GPUs: 1}, {Name: "2", GPUs: 2}, {Name: "4", GPUs: 4}, {Name: "8", GPUs: 8},
		{Name: "mig-1g.10gb", MIGProfile: "1g.10gb"}, {Name: "mig-3g.40gb", MIGProfile: "3G.40GB"},
		{Name: "none"},
	}
	tests := []struct {
		name string
		gpus []GPU
		want map[string]int
	}{
		{
			// 5 free whole GPUs: five 1-GPU jobs, two 2-GPU jobs, one 4-GPU.
			name: "free whole GPUs",
			gpus: []GPU{wholeGPU(0, true, false), wholeGPU(1, true, false), wholeGPU(2, true, true),
				wholeGPU(3, true, false), wholeGPU(4, true, false), wholeGPU(5, true, false), wholeGPU(6, false, false)},
			want: map[string]int{"1": 5, "2": 2, "4": 1, "8": 0, "mig-1g.10gb": 0, "mig-3g.40gb": 0, "none": 0},
		},
		{
			// 1g at 0 unallocated, 3g at 4-7 allocated: the free 1g instance
			// plus new ones at 1, 2 (slots 1-3 free; the 1g placements are
			// 0..6, 3 is free too) and no room for a 3g.
			name: "MIG free instance and free slots",
			gpus: []GPU{migGPU(0, true, h100Profiles(),
				MIGInstance{Profile: "1g.10gb", Start: 0, Size: 1},
				MIGInstance{Profile: "3g.40gb", Start: 4, Size: 4, Allocated: true})},
			want: map[string]int{"1": 0, "2": 0, "4": 0, "8": 0, "mig-1g.10gb": 4, "mig-3g.40gb": 0, "none": 0},
		},
		{
			// An empty MIG GPU takes seven 1g or two 3g; an unhealthy one none.
			name: "empty and unhealthy MIG GPUs",
			gpus: []GPU{migGPU(0, true, h100Profiles()), migGPU(1, false, h100Profiles())},
			want: map[string]int{"1": 0, "2": 0, "4": 0, "8": 0, "mig-1g.10gb": 7, "mig-3g.40gb": 2, "none": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Compute(tc.gpus, shapes).Fitting
			if len(got) != len(tc.want) {
				t.Errorf("Fitting = %v, want %v", got, tc.want)
			}
			for k, w := range tc.want {
				if g, ok := got[k]; !ok || g != w {
					t.Errorf("Fitting[%q] = %d (present %v), want %d", k, g, ok, w)
				}
			}
		})
	}
}

// rtxPro6000Profiles are the plain profiles of an RTX PRO 6000 Blackwell
// Server Edition as its driver lists them (nvidia-smi mig -lgipp on
// 610.43.02): four compute slices on a 12-unit placement grid, 1g at
// {0,3,6,9}:3, 2g at {0,6}:6, 4g at {0}:12.
func rtxPro6000Profiles() []MIGProfile {
	return []MIGProfile{
		{Name: "1g.24gb", Slices: 1, MaxInstances: 4, MemoryBytes: 24192 << 20, Placements: []Placement{{0, 3}, {3, 3}, {6, 3}, {9, 3}}},
		{Name: "2g.48gb", Slices: 2, MaxInstances: 2, MemoryBytes: 48512 << 20, Placements: []Placement{{0, 6}, {6, 6}}},
		{Name: "4g.96gb", Slices: 4, MaxInstances: 1, MemoryBytes: 97408 << 20, Placements: []Placement{{0, 12}}},
	}
}

// TestComputeMIGTwelveUnitGrid: free slices, placeable instances, the
// largest placeable profile and fitting jobs on a board whose placement
// units outnumber its compute slices three to one. Free slices count
// compute slices, never placement units, and a profile fits only where
// all the units of one of its placements are free.
func TestComputeMIGTwelveUnitGrid(t *testing.T) {
	shapes := []Shape{{Name: "mig-1g.24gb", MIGProfile: "1g.24gb", Weight: 1}, {Name: "mig-2g.48gb", MIGProfile: "2g.48gb", Weight: 1}}
	gpu := func(in ...MIGInstance) GPU {
		return GPU{Index: 0, UUID: "GPU-a", Healthy: true, NVLinkDomain: -1, NUMANode: -1,
			MIG: &MIGState{TotalSlices: 4, Instances: in, Profiles: rtxPro6000Profiles()}}
	}
	one := func(start int, slices int, allocated bool) MIGInstance {
		return MIGInstance{Profile: "1g.24gb", Start: start, Size: 3, Slices: slices, Allocated: allocated}
	}
	tests := []struct {
		name        string
		gpu         GPU
		mig         MIGResult
		unallocated float64
		fitting     map[string]int
		perShape    map[string]float64
	}{
		{
			name: "empty",
			gpu:  gpu(),
			mig: MIGResult{GPU: 0, UUID: "GPU-a", FreeSlices: 4, Placeable: map[string]int{"1g.24gb": 4, "2g.48gb": 2, "4g.96gb": 1},
				LargestPlaceableSlices: 4, LargestPlaceableProfile: "4g.96gb"},
			unallocated: 1,
			fitting:     map[string]int{"mig-1g.24gb": 4, "mig-2g.48gb": 2},
			perShape:    map[string]float64{"mig-1g.24gb": 0, "mig-2g.48gb": 0},
		},
		{
			// The driver's own layout (-lgi): 2g.48gb at 0:6, 1g.24gb at 6:3,
			// both held. Units 9-11 and one compute slice are left: one 1g.
			name: "2g at 0:6 and 1g at 6:3",
			gpu: gpu(MIGInstance{Profile: "2g.48gb", Start: 0, Size: 6, Slices: 2, Allocated: true},
				one(6, 1, true)),
			mig: MIGResult{GPU: 0, UUID: "GPU-a", FreeSlices: 1, Placeable: map[string]int{"1g.24gb": 1, "2g.48gb": 0, "4g.96gb": 0},
				LargestPlaceableSlices: 1, LargestPlaceableProfile: "1g.24gb"},
			unallocated: 0.25,
			fitting:     map[string]int{"mig-1g.24gb": 1, "mig-2g.48gb": 0},
			perShape:    map[string]float64{"mig-1g.24gb": 0, "mig-2g.48gb": 0.25},
		},
		{
			// 1g instances at 3:3 and 6:3 leave half the units (0-2, 9-11)
			// and two compute slices free, yet no six free units in a row:
			// no 2g fits, two 1g do.
			name: "1g at 3:3 and 6:3 strand a 2g",
			gpu:  gpu(one(3, 1, true), one(6, 1, true)),
			mig: MIGResult{GPU: 0, UUID: "GPU-a", FreeSlices: 2, Placeable: map[string]int{"1g.24gb": 2, "2g.48gb": 0, "4g.96gb": 0},
				LargestPlaceableSlices: 1, LargestPlaceableProfile: "1g.24gb"},
			unallocated: 0.5,
			fitting:     map[string]int{"mig-1g.24gb": 2, "mig-2g.48gb": 0},
			perShape:    map[string]float64{"mig-1g.24gb": 0, "mig-2g.48gb": 0.5},
		},
		{
			// One 1g at the last placement, 9:3: none of its units lies below
			// the compute-slice count (4), yet it takes a compute slice.
			// 2g fits at 0:6 only, 1g at 0, 3 and 6.
			name: "1g at 9:3",
			gpu:  gpu(one(9, 1, false)),
			mig: MIGResult{GPU: 0, UUID: "GPU-a", FreeSlices: 3, Placeable: map[string]int{"1g.24gb": 3, "2g.48gb": 1, "4g.96gb": 0},
				LargestPlaceableSlices: 2, LargestPlaceableProfile: "2g.48gb"},
			unallocated: 1,
			fitting:     map[string]int{"mig-1g.24gb": 4, "mig-2g.48gb": 1},
			perShape:    map[string]float64{"mig-1g.24gb": 0, "mig-2g.48gb": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := Compute([]GPU{tc.gpu}, shapes)
			if len(r.MIG) != 1 || !reflect.DeepEqual(r.MIG[0], tc.mig) {
				t.Errorf("MIG = %+v, want %+v", r.MIG, tc.mig)
			}
			if !approx(r.UnallocatedGPUs, tc.unallocated) {
				t.Errorf("UnallocatedGPUs = %v, want %v", r.UnallocatedGPUs, tc.unallocated)
			}
			if !reflect.DeepEqual(r.Fitting, tc.fitting) {
				t.Errorf("Fitting = %v, want %v", r.Fitting, tc.fitting)
			}
			for k, w := range tc.perShape {
				if !approx(r.PerShape[k], w) {
					t.Errorf("PerShape[%q] = %v, want %v", k, r.PerShape[k], w)
				}
			}
		})
	}
	// Without the instance's slice count its profile's compute slices stand
	// in, not the units it covers below the compute-slice count (none here).
	r := Compute([]GPU{gpu(one(9, 0, false))}, shapes)
	if len(r.MIG) != 1 || r.MIG[0].FreeSlices != 3 || r.MIG[0].LargestPlaceableProfile != "2g.48gb" {
		t.Errorf("1g at 9:3 without its slices: MIG = %+v, want 3 free slices, largest 2g.48gb", r.MIG)
	}
}
