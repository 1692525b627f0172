package state

import (
	"slices"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// The MIG devices' XID counts served are those of the devices the sample
// shows, and those no device could be named for; a destroyed device's
// count is not served under the IDs a new device took over.
func TestMIGXIDsOfTheDevicesShown(t *testing.T) {
	s := &sample.NodeSample{GPUs: []sample.GPUState{{
		DeviceState: sample.DeviceState{GPU: 0, UUID: "GPU-a"},
		MIG: []sample.DeviceState{
			{GPU: 0, GPUInstance: 1, ComputeInstance: 0, MIGUUID: "MIG-new"},
			{GPU: 0, GPUInstance: 2, ComputeInstance: 0, MIGUUID: "MIG-b"},
		},
	}}}
	in := []xid.InstanceCount{
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 1, ComputeInstance: 0}, MIGUUID: "MIG-gone", Code: 13, Total: 4},
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 1, ComputeInstance: 0}, MIGUUID: "MIG-new", Code: 43, Total: 1},
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 2, ComputeInstance: 0}, MIGUUID: "MIG-b", Code: 31, Total: 2},
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 9, ComputeInstance: -1}, Code: 43, Total: 1},
	}
	var got []string
	for _, x := range migXIDs(s, in) {
		got = append(got, x.MIGUUID)
	}
	if want := []string{"MIG-new", "MIG-b", ""}; !slices.Equal(got, want) {
		t.Errorf("served the counts of %q, want %q", got, want)
	}
}

// A board's XID counts follow it by UUID to its index in the sample: the
// counts taken under its old index and under its new one are one series,
// their totals added, first and last the earliest and the latest; a board
// not in the sample keeps the index it was counted under.
func TestXIDCountsFollowTheBoardsIndex(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	in := []xid.Count{
		{GPU: 2, UUID: "GPU-c", Code: 13, Total: 1, First: t0, Last: t0},
		{GPU: 1, UUID: "GPU-c", Code: 13, Total: 2, First: t0.Add(time.Minute), Last: t0.Add(2 * time.Minute)},
		{GPU: 1, UUID: "GPU-b", Code: 79, Total: 1, First: t0, Last: t0},
	}
	got := currentXIDCounts(in, map[string]int{"GPU-c": 1})
	want := []xid.Count{
		{GPU: 1, UUID: "GPU-c", Code: 13, Total: 3, First: t0, Last: t0.Add(2 * time.Minute)},
		{GPU: 1, UUID: "GPU-b", Code: 79, Total: 1, First: t0, Last: t0},
	}
	if !slices.Equal(got, want) {
		t.Errorf("counts %+v, want %+v", got, want)
	}
	last := currentXIDLast([]xid.DeviceLast{{GPU: 2, UUID: "GPU-c", Code: 13, At: t0}, {GPU: 1, UUID: "GPU-c", Code: 43, At: t0.Add(time.Minute)}},
		map[string]int{"GPU-c": 1})
	if len(last) != 1 || last[0] != (xid.DeviceLast{GPU: 1, UUID: "GPU-c", Code: 43, At: t0.Add(time.Minute)}) {
		t.Errorf("last XIDs %+v, want GPU-c's XID 43 at index 1", last)
	}
}
