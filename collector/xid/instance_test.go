package xid

import (
	"slices"
	"testing"
	"time"
)

// NVML marks an event not attributable to a MIG instance with 0xFFFFFFFF.
func TestEventInstance(t *testing.T) {
	if in := eventInstance(noInstance, noInstance); in != nil {
		t.Errorf("whole-GPU event attributed to %+v", in)
	}
	if in := eventInstance(3, 1); in == nil || *in != (Instance{3, 1}) {
		t.Errorf("GI 3 CI 1: %+v", in)
	}
	if in := eventInstance(3, noInstance); in == nil || *in != (Instance{3, -1}) {
		t.Errorf("GI 3 without CI: %+v", in)
	}
}

// devicesAt is a resolver over a fixed MIG layout: per GPU, the MIG
// devices by GPU instance; a GPU not listed is not read yet.
type devicesAt map[int]map[int][]MIGDevice

func (d devicesAt) MIGDevices(gpu int, _ string, in Instance, _ time.Time) ([]MIGDevice, bool) {
	gis, ok := d[gpu]
	if !ok {
		return nil, false
	}
	var out []MIGDevice
	for _, m := range gis[in.GPUInstance] {
		if in.ComputeInstance < 0 || m.ComputeInstance == in.ComputeInstance {
			out = append(out, m)
		}
	}
	return out, true
}

// A MIG XID is counted on the device the resolver names: the compute
// instance, or each compute instance of a GPU instance NVML names alone.
// An instance destroyed and created again under the same IDs is another
// device, with a count of its own. An XID that came before its GPU's MIG
// devices were read waits for them; one no device had the IDs of is kept
// with the IDs.
func TestInstanceCountsByDevice(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	res := devicesAt{0: {1: {{UUID: "MIG-a0", ComputeInstance: 0}, {UUID: "MIG-a1", ComputeInstance: 1}}}}
	var c instanceCounts
	x := func(gpu, gi, ci, code int) instanceXID {
		return instanceXID{gpu: gpu, uuid: "GPU-x", in: Instance{gi, ci}, code: code, at: t0}
	}
	c.add(res, x(0, 1, 1, 13))                                    // compute instance 1
	c.add(res, x(0, 1, -1, 31))                                   // the GPU instance: both compute instances
	c.add(res, x(0, 5, 0, 43))                                    // no such instance
	c.add(res, x(1, 1, 0, 48))                                    // GPU 1 not read yet
	res[0][1] = []MIGDevice{{UUID: "MIG-b0", ComputeInstance: 0}} // destroyed, created again
	c.add(res, x(0, 1, 0, 13))
	c.resolvePending(res, t0.Add(time.Second)) // GPU 1 still not read: waits
	if len(c.pending) != 1 {
		t.Fatalf("%d events waiting, want 1", len(c.pending))
	}
	res[1] = map[int][]MIGDevice{1: {{UUID: "MIG-c0", ComputeInstance: 0}}}
	c.resolvePending(res, t0.Add(2*time.Second))
	type row struct {
		gi, ci  int
		migUUID string
		code    int
		total   uint64
	}
	var got []row
	for _, n := range c.snapshot() {
		got = append(got, row{n.Instance.GPUInstance, n.Instance.ComputeInstance, n.MIGUUID, n.Code, n.Total})
	}
	want := []row{
		{1, 0, "MIG-a0", 31, 1},
		{1, 0, "MIG-b0", 13, 1},
		{1, 1, "MIG-a1", 13, 1},
		{1, 1, "MIG-a1", 31, 1},
		{5, 0, "", 43, 1},
		{1, 0, "MIG-c0", 48, 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}
