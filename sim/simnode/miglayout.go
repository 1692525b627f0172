package simnode

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// The MIG layout calls answer from the model's profiles and the scenario's
// instances directly: the mock server records every call it serves, which
// would grow without bound in a long-running simulation.

// profileInfo is NVML's info of a profile of the geometry table.
func profileInfo(p miggeometry.Profile) nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{Id: uint32(p.ID), SliceCount: uint32(p.Compute), InstanceCount: uint32(p.Count),
		MultiprocessorCount: uint32(p.Compute * 16), CopyEngineCount: uint32(p.Compute), MemorySizeMB: p.MemoryMiB}
}

// GetGpuInstanceProfileInfo implements nvmlsampler.Device: index is the
// NVML profile constant (NVML_GPU_INSTANCE_PROFILE_*).
func (d *Device) GetGpuInstanceProfileInfo(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	d.node.count()
	if d.geo == nil {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.geo.ProfileByIndex(index)
	if !ok {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	return profileInfo(p), nvml.SUCCESS
}

// GetGpuInstancePossiblePlacements implements nvmlsampler.Device: info.Id
// is the profile ID.
func (d *Device) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	d.node.count()
	if d.geo == nil {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.geo.ProfileByID(int(info.Id))
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var out []nvml.GpuInstancePlacement
	for _, pl := range p.Placements() {
		out = append(out, nvml.GpuInstancePlacement{Start: uint32(pl.Start), Size: uint32(pl.Size)})
	}
	return out, nvml.SUCCESS
}

// GetGpuInstances implements nvmlsampler.Device: one GPU instance per
// group of compute instances.
func (d *Device) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	d.node.count()
	var out []nvml.GpuInstance
	for _, m := range d.migs {
		if m.ci == 0 && m.geo.ID == int(info.Id) {
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

// GetGpuInstanceProfileInfoV2 implements nvmlsampler.Device (R510 and
// later): the profile info with the name the driver gives it.
func (d *Device) GetGpuInstanceProfileInfoV2(id int) (nvml.GpuInstanceProfileInfo_v2, nvml.Return) {
	d.node.require("nvmlDeviceGetGpuInstanceProfileInfoV")
	info, ret := d.GetGpuInstanceProfileInfo(id)
	if ret != nvml.SUCCESS {
		return nvml.GpuInstanceProfileInfo_v2{}, ret
	}
	v2 := nvml.GpuInstanceProfileInfo_v2{Id: info.Id, IsP2pSupported: info.IsP2pSupported, SliceCount: info.SliceCount,
		InstanceCount: info.InstanceCount, MultiprocessorCount: info.MultiprocessorCount, CopyEngineCount: info.CopyEngineCount,
		DecoderCount: info.DecoderCount, EncoderCount: info.EncoderCount, JpegCount: info.JpegCount, OfaCount: info.OfaCount,
		MemorySizeMB: info.MemorySizeMB}
	p, _ := d.geo.ProfileByIndex(id)
	for i, c := range []byte("MIG " + p.Name) {
		if i < len(v2.Name)-1 {
			v2.Name[i] = int8(c)
		}
	}
	return v2, nvml.SUCCESS
}

// GetGpuInstanceProfileInfoV2 implements nvmlsampler.Device: not on MIG
// device handles.
func (m *MIGDevice) GetGpuInstanceProfileInfoV2(int) (nvml.GpuInstanceProfileInfo_v2, nvml.Return) {
	m.parent.node.require("nvmlDeviceGetGpuInstanceProfileInfoV")
	return nvml.GpuInstanceProfileInfo_v2{}, m.unsupported()
}
