package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// MIGProfileName is NVIDIA's name of a GPU instance profile, e.g. 1g.10gb.
func MIGProfileName(id int, info nvml.GpuInstanceProfileInfo) string {
	n := fmt.Sprintf("%dg.%dgb", info.SliceCount, (info.MemorySizeMB+1023)/1024)
	if id == nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1 || id == nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1 {
		n += "+me"
	}
	return n
}

// discoverMIGLayout reads a MIG GPU's profiles, placements and instances.
func discoverMIGLayout(h Device) *MIGLayout {
	l := &MIGLayout{Instances: map[int]MIGPlacement{}}
	for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
		info, ret := h.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue // not supported on this GPU
		}
		name := MIGProfileName(id, info)
		p := MIGProfileInfo{Name: name, Slices: int(info.SliceCount), MaxInstances: int(info.InstanceCount),
			MemoryBytes: float64(info.MemorySizeMB) * (1 << 20)}
		if pl, ret := h.GetGpuInstancePossiblePlacements(&info); ret == nvml.SUCCESS {
			p.Placements = pl
			for _, x := range pl {
				l.MemorySlices = max(l.MemorySlices, int(x.Start+x.Size))
			}
		}
		l.Profiles = append(l.Profiles, p)
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
			l.Instances[int(gii.Id)] = MIGPlacement{Profile: name, Start: int(gii.Placement.Start), Size: int(gii.Placement.Size),
				Slices: int(info.SliceCount), ProfileID: int(info.Id)}
		}
	}
	if len(l.Profiles) == 0 {
		return nil
	}
	return l
}
