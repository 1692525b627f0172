package simnode

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The MIG layout calls answer from the model's profiles and the scenario's
// instances directly: the mock server records every call it serves, which
// would grow without bound in a long-running simulation.

// GetGpuInstanceProfileInfo implements nvmlsampler.Device.
func (d *Device) GetGpuInstanceProfileInfo(id int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	d.node.count()
	info, ok := d.cfg.MIGProfiles.GpuInstanceProfiles[id]
	if !ok {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return info, nvml.SUCCESS
}

// GetGpuInstancePossiblePlacements implements nvmlsampler.Device.
func (d *Device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	d.node.count()
	return d.cfg.MIGProfiles.GpuInstancePlacements[int(info.Id)], nvml.SUCCESS
}

// GetGpuInstances implements nvmlsampler.Device.
func (d *Device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	d.node.count()
	var out []nvml.GpuInstance
	for _, m := range d.migs {
		if m.profileID == int(info.Id) {
			out = append(out, simGPUInstance{info: nvml.GpuInstanceInfo{Id: uint32(m.gi), ProfileId: info.Id, Placement: m.placement}})
		}
	}
	return out, nvml.SUCCESS
}

// simGPUInstance answers GetInfo; other GPU instance calls are not used.
type simGPUInstance struct {
	nvml.GpuInstance
	info nvml.GpuInstanceInfo
}

func (g simGPUInstance) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) { return g.info, nvml.SUCCESS }

// GetGpuInstanceProfileInfo implements nvmlsampler.Device.
func (m *MIGDevice) GetGpuInstanceProfileInfo(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	return nvml.GpuInstanceProfileInfo{}, m.unsupported()
}

// GetGpuInstancePossiblePlacements implements nvmlsampler.Device.
func (m *MIGDevice) GetGpuInstancePossiblePlacements(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	return nil, m.unsupported()
}

// GetGpuInstances implements nvmlsampler.Device.
func (m *MIGDevice) GetGpuInstances(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	return nil, m.unsupported()
}
