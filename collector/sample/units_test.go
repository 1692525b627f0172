package sample

import (
	"slices"
	"testing"
)

// unitsNode is a whole GPU, a GPU in MIG mode without instances, a GPU
// with a GPU instance split in two compute instances and one more
// instance, and a GPU whose row remapping failed.
func unitsNode() *NodeSample {
	whole := GPUState{DeviceState: DeviceState{GPU: 0, Up: true, GPUInstance: -1, ComputeInstance: -1}}
	empty := GPUState{DeviceState: DeviceState{GPU: 1, Up: true, MIGEnabled: true, GPUInstance: -1, ComputeInstance: -1}}
	mig := GPUState{DeviceState: DeviceState{GPU: 2, Up: true, MIGEnabled: true, GPUInstance: -1, ComputeInstance: -1},
		MIG: []DeviceState{
			{GPU: 2, GPUInstance: 1, ComputeInstance: 0, Up: true},
			{GPU: 2, GPUInstance: 1, ComputeInstance: 1, Up: false},
			{GPU: 2, GPUInstance: 5, ComputeInstance: 0, Up: true},
		}}
	failed := GPUState{DeviceState: DeviceState{GPU: 3, Up: true, GPUInstance: -1, ComputeInstance: -1}}
	failed.Health.RemapFailed = Some(true)
	return &NodeSample{GPUs: []GPUState{whole, empty, mig, failed}}
}

func TestUnits(t *testing.T) {
	s := unitsNode()
	type unit struct {
		key     UnitKey
		healthy bool
	}
	var got []unit
	for _, u := range s.Units() {
		if u.GPU != s.GPUByIndex(u.Key.GPU) || u.Device != s.UnitDevice(u.Key) {
			t.Errorf("unit %+v: its GPU or device is not the sample's", u.Key)
		}
		got = append(got, unit{u.Key, u.Healthy})
	}
	want := []unit{
		{GPUKey(0), true},
		// GPU 1: MIG mode without instances, nothing to schedule.
		{UnitKey{2, 1, 0}, true},
		{UnitKey{2, 1, 1}, false}, // the MIG device does not answer
		{UnitKey{2, 5, 0}, true},
		{GPUKey(3), false}, // row remapping failed
	}
	if !slices.Equal(got, want) {
		t.Errorf("Units() = %+v, want %+v", got, want)
	}
}

func TestUnitLookups(t *testing.T) {
	s := unitsNode()
	if g := s.GPUByIndex(2); g == nil || g.GPU != 2 {
		t.Errorf("GPUByIndex(2) = %v", g)
	}
	if g := s.GPUByIndex(7); g != nil {
		t.Errorf("GPUByIndex(7) = %v, want nil", g)
	}
	if d := s.UnitDevice(UnitKey{2, 5, 0}); d != &s.GPUs[2].MIG[2] {
		t.Errorf("UnitDevice(2/5/0) = %v, want the second GPU instance", d)
	}
	if d := s.UnitDevice(UnitKey{2, 5, 1}); d != nil {
		t.Errorf("UnitDevice(2/5/1) = %v, want nil: no such compute instance", d)
	}
	if d := s.UnitDevice(GPUKey(0)); d != &s.GPUs[0].DeviceState {
		t.Errorf("UnitDevice(GPU 0) = %v, want the whole GPU", d)
	}
	for gi, want := range map[int]int{1: 2, 5: 1, 3: 0} {
		if n := s.GPUs[2].ComputeInstances(gi); n != want {
			t.Errorf("ComputeInstances(%d) = %d, want %d", gi, n, want)
		}
	}
}

func TestHealthy(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(g *GPUState)
		want bool
	}{
		{"answering", func(*GPUState) {}, true},
		{"lost", func(g *GPUState) { g.Up = false }, false},
		{"remap failed", func(g *GPUState) { g.Health.RemapFailed = Some(true) }, false},
		{"remap pending", func(g *GPUState) { g.Health.RemapPending = Some(true) }, false},
		{"retirement pending", func(g *GPUState) { g.Health.RetiredPending = Some(true) }, false},
		{"recovery action", func(g *GPUState) { g.Health.RecoveryAction = Some(1) }, false},
		{"no recovery action", func(g *GPUState) { g.Health.RecoveryAction = Some(0) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &GPUState{DeviceState: DeviceState{Up: true}}
			tc.set(g)
			if got := g.Healthy(); got != tc.want {
				t.Errorf("Healthy() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAnyUpAndUsableMemory(t *testing.T) {
	if !(&NodeSample{}).AnyUp() {
		t.Error("a node without GPUs is up")
	}
	s := unitsNode()
	for i := range s.GPUs {
		s.GPUs[i].Up = false
	}
	if s.AnyUp() {
		t.Error("AnyUp with every GPU down")
	}
	var d DeviceState
	d.Values.Set(FieldMemoryTotal, 80)
	d.Values.Set(FieldMemoryReserved, 2)
	if got := d.UsableMemory(); got != 78 {
		t.Errorf("UsableMemory() = %v, want 78", got)
	}
}
