package procs

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

// Use is what a set of processes uses on a device.
type Use struct {
	Processes   int
	MemoryBytes float64
	// MemoryKnown is false if any process's memory was unknown.
	MemoryKnown bool
	SM          float64
	SMKnown     bool
}

func (u *Use) add(p GPUProcess) {
	u.Processes++
	if !p.MemoryKnown {
		u.MemoryKnown = false
	}
	u.MemoryBytes += float64(p.MemoryBytes)
	u.SM += p.SM
	if u.SM > 1 {
		u.SM = 1 // time-slices of one device add up to at most all of it
	}
}

// DeviceUse is a device's processes grouped by the pod container they run in.
type DeviceUse struct {
	ByContainer map[Identity]*Use
	// OutsidePods is what host processes and containers of no pod use.
	OutsidePods Use
}

// NewUse is the use of a container that runs nothing on a device whose
// processes could be read: zero, and as known as the device's figures.
func NewUse(d *DeviceProcesses) Use {
	return Use{MemoryKnown: true, SMKnown: d.SMKnown}
}

// Attribute groups a device's processes by owner.
func Attribute(d *DeviceProcesses, owners map[uint32]Owner) DeviceUse {
	u := DeviceUse{OutsidePods: NewUse(d)}
	for _, p := range d.Processes {
		o := owners[p.PID]
		if !o.InPod() {
			u.OutsidePods.add(p)
			continue
		}
		if u.ByContainer == nil {
			u.ByContainer = map[Identity]*Use{}
		}
		cu := u.ByContainer[o.Identity]
		if cu == nil {
			nu := NewUse(d)
			cu = &nu
			u.ByContainer[o.Identity] = cu
		}
		cu.add(p)
	}
	return u
}
