package sample

import "time"

// NodeSample is what one sampling pass saw of the node.
type NodeSample struct {
	Time     time.Time
	Duration time.Duration
	Driver   DriverInfo
	GPUs     []GPUState
	// NVML is the library's state: whether it can be read at all.
	NVML NVMLStatus
}

// NVMLStatus says whether NVML could be read in a sample, and if not why.
type NVMLStatus struct {
	// Down says why NVML cannot be read (waiting for nvmlInit, the driver
	// went away); "" when it can.
	Down string
	// DownSince is when NVML became unusable (the process start for a first
	// nvmlInit that has not returned); zero when it is usable.
	DownSince time.Time
	// Inits counts the successful nvmlInit calls: more than one means the
	// library was initialised again, after a driver reload or after NVML
	// could not list the GPUs.
	Inits int
}

// DriverInfo is the node's driver stack.
type DriverInfo struct {
	DriverVersion     string
	CUDADriverVersion string
	NVMLVersion       string
}

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
	// Rates are the current per-second rates of the counter fields whose
	// source reports rates (DCGM's PCIe and NVLink bytes), which Values
	// holds integrated into counters: set whenever the counter is.
	Rates Values
	// Processes are the device's processes from NVML's process lists;
	// Known is false unless process accounting is on.
	Processes DeviceProcesses
	// Taints are the device taints a DRA driver put on the device in its
	// ResourceSlice (its health check's verdict), joined in by the
	// exporter before anything else reads the sample; nil without the
	// ResourceSlice watch.
	Taints []DeviceTaint
}

// DeviceTaint is a taint on a DRA device (resource.k8s.io/v1
// DeviceTaint) and the device it was published as.
type DeviceTaint struct {
	Key, Value string
	// Effect is None, NoSchedule or NoExecute.
	Effect string
	// Driver, Pool and Device name the DRA device the taint is on.
	Driver, Pool, Device string
}

// Blocks reports whether the taint keeps new work off the device: the
// scheduler places no claim on it (NoSchedule) or evicts its pods
// (NoExecute). A None taint is informational (the NVIDIA DRA driver's
// application XIDs, an unmonitored device).
func (t DeviceTaint) Blocks() bool { return t.Effect == "NoSchedule" || t.Effect == "NoExecute" }

// Quarantined reports whether a DRA driver keeps new work off the device
// (a taint that blocks it).
func (d *DeviceState) Quarantined() bool {
	for _, t := range d.Taints {
		if t.Blocks() {
			return true
		}
	}
	return false
}

// IsMIG reports whether the device is a MIG instance.
func (d *DeviceState) IsMIG() bool { return d.GPUInstance >= 0 }

// GPUState is a physical GPU with its MIG instances, if any.
type GPUState struct {
	DeviceState
	Health Health
	// DCGMHealth is DCGM's health watch result per system (pass, warn or
	// fail), merged in before rendering; nil where DCGM does not run.
	DCGMHealth map[string]string
	MIG        []DeviceState
	MIGLayout  *MIGLayout // nil unless MIG is enabled
	// Hung: driver calls on the GPU did not return within the device
	// timeout (unlike a lost GPU, which answers with an error).
	Hung bool
	// MIGPending is the MIG mode ("enabled" or "disabled") NVML holds for
	// the GPU's next reset, when it differs from the current one: the
	// change waits for a GPU reset or a reboot. "" when none is pending.
	MIGPending string
	// DCGMGPUInstances are DCGM's values of the GPU instances split into
	// several compute instances, by GPU instance ID: each of their compute
	// instances carries only what DCGM measures for it, and what is labelled
	// by GPU instance (the dcgm-exporter compatibility families) reads
	// these. Nil where there are none.
	DCGMGPUInstances map[int]Values
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
	Placements   []Placement
}

// Placement is a span of NVML's placement space (memory slices).
type Placement struct {
	Start, Size int
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

// GPUProcess is one process on one device (a GPU or a MIG instance), as
// NVML reports it.
type GPUProcess struct {
	PID uint32
	// MemoryBytes is the framebuffer memory the process uses; MemoryKnown
	// is false where NVML cannot say (NVML_VALUE_NOT_AVAILABLE).
	MemoryBytes uint64
	MemoryKnown bool
	// SM is the process's share of the device's SM time over the last
	// sample period, 0-1.
	SM float64
}

// DeviceProcesses is what NVML said about one device's processes.
type DeviceProcesses struct {
	// Known: the process lists could be read.
	Known     bool
	Processes []GPUProcess
	// SMKnown: per-process SM utilization could be read (not on MIG
	// instances, nor on drivers without it); a listed process without a
	// sample was idle.
	SMKnown bool
}
