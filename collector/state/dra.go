package state

import (
	"strings"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// SliceSource gives the devices of this node's DRA ResourceSlices, as
// podmap.SliceWatcher keeps them: the list, whether the first list came,
// and the watch's last error ("" when none).
type SliceSource interface {
	Devices() (devices []podmap.SliceDevice, synced bool, lastErr string)
}

// joinDeviceTaints puts the taints of the slices' devices on the sample's
// devices they name: by the uuid attribute (a whole GPU's GPU-..., a
// static MIG device's MIG-...), else by the driver's device name
// (gpu-<minor>, gpu-<minor>-mig-<profile>-<profile id>-<placement start>),
// as a claim's device is resolved. A MIG device's taint is on every
// compute instance of its GPU instance (the driver names the GPU
// instance). Devices that name nothing on the node (a dynamic MIG
// placement no claim has, a VFIO device) are left out.
func joinDeviceTaints(s *sample.NodeSample, devs []podmap.SliceDevice) {
	for i := range s.GPUs {
		g := &s.GPUs[i]
		g.Taints = nil
		for j := range g.MIG {
			g.MIG[j].Taints = nil
		}
	}
	var inv *podmap.Inventory
	for _, d := range devs {
		if len(d.Taints) == 0 {
			continue
		}
		if inv == nil {
			inv = inventory(s)
		}
		t, ok := resolveSliceDevice(inv, d)
		if !ok {
			continue
		}
		g := s.GPUByIndex(t.GPU)
		if g == nil {
			continue
		}
		add := func(dev *sample.DeviceState) {
			for _, x := range d.Taints {
				dev.Taints = append(dev.Taints, sample.DeviceTaint{Key: validUTF8(x.Key), Value: validUTF8(x.Value), Effect: validUTF8(x.Effect),
					Driver: validUTF8(d.Driver), Pool: validUTF8(d.Pool), Device: validUTF8(d.Name)})
			}
		}
		if t.GPUInstance < 0 {
			add(&g.DeviceState)
			continue
		}
		for j := range g.MIG {
			if g.MIG[j].GPUInstance == t.GPUInstance {
				add(&g.MIG[j])
			}
		}
	}
}

// resolveSliceDevice finds the GPU or MIG device a slice's device is.
func resolveSliceDevice(inv *podmap.Inventory, d podmap.SliceDevice) (podmap.Target, bool) {
	switch {
	case strings.HasPrefix(d.UUID, "MIG-"):
		return inv.Resolve(podmap.DeviceRef{Kind: podmap.MIGUUID, MIGUUID: d.UUID, Raw: d.UUID})
	case strings.HasPrefix(d.UUID, "GPU-") && d.Type != "mig":
		return inv.Resolve(podmap.DeviceRef{Kind: podmap.GPUUUID, GPUUUID: d.UUID, Raw: d.UUID})
	}
	ref, err := podmap.ParseDRADevice(d.Name, nil)
	if err != nil {
		return podmap.Target{}, false
	}
	return inv.Resolve(ref)
}
