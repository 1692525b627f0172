package nvml

import (
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
)

// DeviceState is one device in one sample: a whole GPU, or a MIG instance of
// one (GPUInstance >= 0).
type DeviceState struct {
	GPU             int // NVML index of the physical GPU
	UUID            string
	Model           string
	PCIBusID        string
	Minor           int // NVML minor number: /dev/nvidiaN, GKE's "nvidiaN" device IDs
	MIGEnabled      bool
	GPUInstance     int // -1 for a whole GPU
	ComputeInstance int // -1 for a whole GPU
	MIGProfile      string
	MIGUUID         string
	Up              bool
	Values          Values
	// Processes are the device's processes from NVML's process lists;
	// Known is false unless SamplerConfig.Processes is set.
	Processes procs.DeviceProcesses
}

// IsMIG reports whether the device is a MIG instance.
func (d *DeviceState) IsMIG() bool { return d.GPUInstance >= 0 }

// GPUState is a physical GPU with its MIG instances, if any.
type GPUState struct {
	DeviceState
	Health Health
	// DCGMHealth is filled by the orchestration from DCGM's health watches
	// (system -> pass|warn|fail); the NVML sampler leaves it nil.
	DCGMHealth map[string]string
	MIG        []DeviceState
	MIGLayout  *MIGLayout // nil unless MIG is enabled
	// Hung: NVML calls on the GPU did not return within the device timeout
	// (unlike a lost GPU, which answers with an error).
	Hung bool
}

// MIGLayout is a MIG GPU's profiles, their possible placements, and where
// each existing GPU instance sits.
type MIGLayout struct {
	// TotalSlices is the GPU's compute slices: the largest profile's
	// SliceCount (7 on A100 and H100, 4 on A30).
	TotalSlices int
	// MemorySlices is the width of NVML's placement space: placements are
	// in memory slices, 8 on A100 and H100 (7g at {0,8}, 3g at {0,4} and
	// {4,4}), so a placement's Size is not its compute slices.
	MemorySlices int
	Profiles     []MIGProfileInfo
	Instances    map[int]MIGPlacement // by GPU instance ID
}

// MIGProfileInfo is one GPU instance profile.
type MIGProfileInfo struct {
	Name string
	// Slices is NVML's SliceCount: the profile's compute slices.
	Slices int
	// MaxInstances is NVML's InstanceCount: how many instances of the
	// profile one GPU can hold (one for +me profiles).
	MaxInstances int
	MemoryBytes  float64
	Placements   []nvml.GpuInstancePlacement
}

// MIGPlacement is where a GPU instance sits.
type MIGPlacement struct {
	Profile string
	// Start and Size are in NVML's placement space (memory slices).
	Start, Size int
	// Slices is the profile's compute slices, for shares of the GPU.
	Slices int
	// ProfileID is NVML's profile ID (GpuInstanceProfileInfo.Id), part of
	// the DRA driver's MIG device names.
	ProfileID int
}

// DriverInfo is the node's driver stack.
type DriverInfo struct {
	DriverVersion     string
	CUDADriverVersion string
	NVMLVersion       string
}

// NodeSample is what one run of the NVML sampler saw.
type NodeSample struct {
	Time     time.Time
	Duration time.Duration
	Driver   DriverInfo
	GPUs     []GPUState
}

// cudaVersionString turns NVML's integer CUDA driver version (12040) into "12.4".
func cudaVersionString(v int) string {
	if v <= 0 {
		return ""
	}
	return strconv.Itoa(v/1000) + "." + strconv.Itoa((v%1000)/10)
}
