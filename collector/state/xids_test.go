package state

import (
	"slices"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// An XID NVML attributes to a GPU instance but to none of its compute
// instances lands on each compute instance the sample shows in it, added
// to what NVML attributed to that compute instance itself; one on a GPU
// instance the sample no longer shows keeps compute instance -1.
func TestSpreadInstanceXIDs(t *testing.T) {
	s := &sample.NodeSample{GPUs: []sample.GPUState{{
		DeviceState: sample.DeviceState{GPU: 0, UUID: "GPU-a"},
		MIG: []sample.DeviceState{
			{GPU: 0, GPUInstance: 1, ComputeInstance: 0},
			{GPU: 0, GPUInstance: 1, ComputeInstance: 1},
			{GPU: 0, GPUInstance: 2, ComputeInstance: 0},
		},
	}}}
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	in := []xid.InstanceCount{
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 1, ComputeInstance: -1}, Code: 13, Total: 2, Last: t0},
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 1, ComputeInstance: 1}, Code: 13, Total: 1, Last: t0.Add(time.Minute)},
		{GPU: 0, UUID: "GPU-a", Instance: xid.Instance{GPUInstance: 9, ComputeInstance: -1}, Code: 43, Total: 1, Last: t0},
	}
	type row struct {
		gi, ci, code int
		total        uint64
		last         time.Time
	}
	var got []row
	for _, x := range spreadInstanceXIDs(s, in) {
		got = append(got, row{x.Instance.GPUInstance, x.Instance.ComputeInstance, x.Code, x.Total, x.Last})
	}
	want := []row{
		{1, 0, 13, 2, t0},
		{1, 1, 13, 3, t0.Add(time.Minute)},
		{9, -1, 43, 1, t0},
	}
	if !slices.Equal(got, want) {
		t.Errorf("spread = %+v, want %+v", got, want)
	}
}
