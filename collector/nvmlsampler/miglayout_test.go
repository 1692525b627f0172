package nvmlsampler

import (
	"fmt"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// NVML's placements are in memory slices on A100 (8:
// 7g at {0,8}, 3g at {0,4} and {4,4}) while go-nvml's H100 mock uses
// compute slices (7). The layout must carry each profile's own slice count
// (SliceCount), not the placement size, and the placement space's width.
// And each profile's per-GPU instance limit (InstanceCount).
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
			_, _ = d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
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
			l := discoverMIGLayout(realDevice{d}, probes{})
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

// MIG profile names are NVIDIA's. Rounding a profile's
// own MiB names A30's 4g profile (23344 MiB of 24 GB) 4g.23gb; NVIDIA names
// it by its share of the GPU's memory: 4g.24gb.
func TestMIGProfileNamesAreNVIDIAs(t *testing.T) {
	for _, tc := range []struct {
		cfg  gpus.Config
		id   int
		want string
	}{
		{gpus.A30_PCIE_24GB, nvml.GPU_INSTANCE_PROFILE_4_SLICE, "4g.24gb"},
		{gpus.A30_PCIE_24GB, nvml.GPU_INSTANCE_PROFILE_1_SLICE, "1g.6gb"},
		{gpus.A30_PCIE_24GB, nvml.GPU_INSTANCE_PROFILE_2_SLICE, "2g.12gb"},
		{gpus.A100_SXM4_40GB, nvml.GPU_INSTANCE_PROFILE_1_SLICE, "1g.5gb"},
		{gpus.A100_SXM4_40GB, nvml.GPU_INSTANCE_PROFILE_7_SLICE, "7g.40gb"},
		{gpus.H100_SXM5_80GB, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, "1g.10gb+me"},
		{gpus.H100_SXM5_80GB, nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, "1g.20gb"},
		{gpus.H100_SXM5_80GB, nvml.GPU_INSTANCE_PROFILE_7_SLICE, "7g.80gb"},
	} {
		t.Run(fmt.Sprintf("%s/%s", tc.cfg.Name, tc.want), func(t *testing.T) {
			info, ok := tc.cfg.MIGProfiles.GpuInstanceProfiles[tc.id]
			if !ok {
				t.Fatalf("%s has no profile %d", tc.cfg.Name, tc.id)
			}
			if got := MIGProfileName(tc.id, info, tc.cfg.MemoryMB<<20); got != tc.want {
				t.Errorf("%s profile %d: %s, want %s", tc.cfg.Name, tc.id, got, tc.want)
			}
		})
	}
	// The suffixes of the newer profiles (nvml.h's GPU_INSTANCE_PROFILE_*).
	info := nvml.GpuInstanceProfileInfo{SliceCount: 1, MemorySizeMB: 9856}
	for id, want := range map[int]string{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "1g.10gb-me",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "1g.10gb+me.all",
		nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "1g.10gb+gfx",
	} {
		t.Run(want, func(t *testing.T) {
			if got := MIGProfileName(id, info, 81559<<20); got != want {
				t.Errorf("profile %d: %s, want %s", id, got, want)
			}
		})
	}
}

// namedDevice is a go-nvml mock device whose driver names its profiles.
type namedDevice struct {
	realDevice
	names map[int]string
}

func (d namedDevice) GetGpuInstanceProfileInfoV2(id int) (nvml.GpuInstanceProfileInfo_v2, nvml.Return) {
	n, ok := d.names[id]
	if !ok {
		return nvml.GpuInstanceProfileInfo_v2{}, nvml.ERROR_NOT_SUPPORTED
	}
	var v nvml.GpuInstanceProfileInfo_v2
	for i := 0; i < len(n); i++ {
		v.Name[i] = int8(n[i])
	}
	return v, nvml.SUCCESS
}

// Where the driver names its profiles (R510+, probed), its names win.
func TestMIGProfileNamesFromNVML(t *testing.T) {
	d := dgxh100.New().Devices[0]
	_, _ = d.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	h := namedDevice{realDevice{d}, map[int]string{nvml.GPU_INSTANCE_PROFILE_1_SLICE: "MIG 1g.10gb", nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1: "MIG 1g.10gb+me"}}
	l := discoverMIGLayout(h, probes{profileInfoV: true})
	names := map[string]bool{}
	for _, p := range l.Profiles {
		names[p.Name] = true
	}
	if !names["1g.10gb"] || !names["1g.10gb+me"] {
		t.Errorf("profile names %v: want the driver's 1g.10gb and 1g.10gb+me", names)
	}
	// Without the probe the call is never made (R470 lacks it).
	l = discoverMIGLayout(namedDevice{realDevice{d}, map[int]string{nvml.GPU_INSTANCE_PROFILE_1_SLICE: "MIG bogus"}}, probes{})
	for _, p := range l.Profiles {
		if p.Name == "bogus" {
			t.Error("profile info V called although not probed")
		}
	}
}

// Where the driver cannot name a profile (R470), the exporter names it from
// its slices and memory: every name it makes agrees with NVIDIA's table.
func TestMIGProfileNamesMatchGeometryTable(t *testing.T) {
	for _, m := range miggeometry.All() {
		t.Run(m.Model, func(t *testing.T) {
			for _, p := range m.Profiles {
				info := nvml.GpuInstanceProfileInfo{Id: uint32(p.ID), SliceCount: uint32(p.Compute), InstanceCount: uint32(p.Count), MemorySizeMB: p.MemoryMiB}
				if got := MIGProfileName(p.Index, info, m.MemoryMiB<<20); got != p.Name {
					t.Errorf("profile index %d (ID %d, %d MiB): %s, table says %s", p.Index, p.ID, p.MemoryMiB, got, p.Name)
				}
			}
		})
	}
}
