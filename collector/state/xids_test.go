package state

import (
	"slices"
	"testing"

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
