package nvml

import (
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
)

// Issue 12 defect 3: NVML's placements are in memory slices on A100 (8:
// 7g at {0,8}, 3g at {0,4} and {4,4}) while go-nvml's H100 mock uses
// compute slices (7). The layout must carry each profile's own slice count
// (SliceCount), not the placement size, and the placement space's width.
// Issue 13 item 9: each profile's per-GPU instance limit (InstanceCount).
func TestMIGLayoutFromGoNVMLMocks(t *testing.T) {
	for _, tc := range []struct {
		name         string
		dev          nvml.Device
		memorySlices int
		size7g       int
	}{
		{"dgxa100", dgxa100.New().Devices[0], 8, 8},
		{"dgxh100", dgxh100.New().Devices[0], 7, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.dev
			d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
			create := func(profile int) int {
				info, ret := d.GetGpuInstanceProfileInfo(profile)
				if ret != nvml.SUCCESS {
					t.Fatalf("profile %d: %v", profile, ret)
				}
				pl, _ := d.GetGpuInstancePossiblePlacements(&info)
				gi, ret := d.CreateGpuInstanceWithPlacement(&info, &pl[0])
				if ret != nvml.SUCCESS {
					t.Fatal(ret)
				}
				gii, _ := gi.GetInfo()
				return int(gii.Id)
			}
			id7 := create(nvml.GPU_INSTANCE_PROFILE_7_SLICE)
			l := discoverMIGLayout(realDevice{d})
			if l == nil {
				t.Fatal("no layout")
			}
			if l.TotalSlices != 7 || l.MemorySlices != tc.memorySlices {
				t.Errorf("compute slices %d (want 7), memory slices %d (want %d)", l.TotalSlices, l.MemorySlices, tc.memorySlices)
			}
			in := l.Instances[id7]
			if in.Slices != 7 || in.Size != tc.size7g {
				t.Errorf("7g instance: %d compute slices (want 7), placement size %d (want %d)", in.Slices, in.Size, tc.size7g)
			}
			limits := map[int]int{}
			for id := 0; id < nvml.GPU_INSTANCE_PROFILE_COUNT; id++ {
				if info, ret := d.GetGpuInstanceProfileInfo(id); ret == nvml.SUCCESS {
					limits[int(info.SliceCount)*1000+int(info.MemorySizeMB)] = int(info.InstanceCount)
				}
			}
			for _, p := range l.Profiles {
				if p.MaxInstances == 0 {
					t.Errorf("%s: no instance limit", p.Name)
				}
				if p.Name == "1g.10gb+me" || p.Name == "1g.5gb+me" {
					if p.MaxInstances != 1 {
						t.Errorf("%s: limit %d, want 1", p.Name, p.MaxInstances)
					}
				}
			}
		})
	}
}
