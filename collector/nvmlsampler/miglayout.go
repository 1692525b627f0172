package nvmlsampler

import (
	"fmt"
	"math"
	"strings"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIGProfileName is NVIDIA's name of a GPU instance profile (1g.10gb,
// 4g.24gb on A30, 1g.10gb+me, 1g.20gb+gfx, 1g.18gb-me, 1g.18gb+me.all) for
// drivers that cannot say it themselves (R470 lacks the profile info V call).
//
// The memory figure follows NVIDIA's naming (nvidia-smi, go-nvlib): the
// profile's share of the GPU's memory, rounded up to eighths, times the GPU's
// memory in whole GB. Rounding the profile's own MiB instead names A30's
// 4g profile (23344 MiB) 4g.23gb. deviceMemory 0 (unknown) falls back to
// that rounding.
func MIGProfileName(id int, info nvml.GpuInstanceProfileInfo, deviceMemory uint64) string {
	gb := (info.MemorySizeMB + 1023) / 1024
	if deviceMemory > 0 {
		const gib = 1 << 30
		share := math.Ceil(float64(info.MemorySizeMB<<20)/float64(deviceMemory)*8) / 8
		gb = uint64(math.Round(share * float64((deviceMemory+gib-1)/gib)))
	}
	n := fmt.Sprintf("%dg.%dgb", info.SliceCount, gb)
	switch id {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:
		n += "+me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME:
		n += "+me.all"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME, nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:
		n += "-me"
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX,
		nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:
		n += "+gfx"
	}
	return n
}

// nvmlProfileName is the profile's name as the driver gives it (R510+,
// "MIG 1g.10gb" or "1g.10gb"), "" when it cannot.
func nvmlProfileName(h Device, p probes, id int) string {
	if !p.profileInfoV {
		return ""
	}
	info, ret := h.GetGpuInstanceProfileInfoV2(id)
	if ret != nvml.SUCCESS {
		return ""
	}
	b := make([]byte, 0, len(info.Name))
	for _, c := range info.Name {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return strings.TrimSpace(strings.TrimPrefix(validUTF8(string(b)), "MIG "))
}

// discoverMIGLayout reads a MIG GPU's profiles, placements and instances.
// Profile names are NVML's own where the driver gives them.
func discoverMIGLayout(h Device, p probes) *sample.MIGLayout {
	l, _ := readMIGLayout(h, p)
	return l
}

// readMIGLayout is discoverMIGLayout, also returning the profiles the GPU
// supports as NVML describes them, to list their GPU instances again
// (gpuInstancesChanged).
func readMIGLayout(h Device, p probes) (*sample.MIGLayout, []nvml.GpuInstanceProfileInfo) {
	l := &sample.MIGLayout{Instances: map[int]sample.MIGPlacement{}}
	var infos []nvml.GpuInstanceProfileInfo
	var deviceMemory uint64
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		deviceMemory = m.Total
	}
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := h.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue // not supported on this GPU
		}
		name := nvmlProfileName(h, p, id)
		if name == "" {
			name = MIGProfileName(id, info, deviceMemory)
		}
		p := sample.MIGProfileInfo{Name: name, Slices: int(info.SliceCount), MaxInstances: int(info.InstanceCount),
			MemoryBytes: float64(info.MemorySizeMB) * (1 << 20)}
		if pl, ret := h.GetGpuInstancePossiblePlacements(&info); ret == nvml.SUCCESS {
			for _, x := range pl {
				p.Placements = append(p.Placements, sample.Placement{Start: int(x.Start), Size: int(x.Size)})
			}
			for _, x := range pl {
				l.MemorySlices = max(l.MemorySlices, int(x.Start+x.Size))
			}
		}
		l.Profiles = append(l.Profiles, p)
		infos = append(infos, info)
		if int(info.SliceCount) > l.TotalSlices {
			l.TotalSlices = int(info.SliceCount)
		}
		gis, ret := h.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			continue
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				continue
			}
			l.Instances[int(gii.Id)] = sample.MIGPlacement{Profile: name, Start: int(gii.Placement.Start), Size: int(gii.Placement.Size),
				Slices: int(info.SliceCount), ProfileID: int(info.Id)}
		}
	}
	if len(l.Profiles) == 0 {
		return nil, nil
	}
	return l, infos
}

// gpuInstancesChanged reports whether the GPU instances differ from the
// layout's: one created or destroyed (with or without compute instances:
// one without has no MIG device, so the MIG device UUIDs cannot tell), or
// moved. It costs one call per profile and one per GPU instance.
func gpuInstancesChanged(h Device, layout *sample.MIGLayout, profiles []nvml.GpuInstanceProfileInfo) bool {
	if layout == nil {
		return false
	}
	seen := 0
	for i := range profiles {
		gis, ret := h.GetGpuInstances(&profiles[i])
		if ret != nvml.SUCCESS {
			continue // as discovery skips it
		}
		for _, gi := range gis {
			info, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				continue
			}
			in, ok := layout.Instances[int(info.Id)]
			if !ok || in.ProfileID != int(profiles[i].Id) || in.Start != int(info.Placement.Start) || in.Size != int(info.Placement.Size) {
				return true
			}
			seen++
		}
	}
	return seen != len(layout.Instances)
}
