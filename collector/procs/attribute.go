package procs

import "github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

// Use is what a set of processes uses on a device.
type Use struct {
	Processes   int
	MemoryBytes float64
	// MemoryKnown is false if any process's memory was unknown.
	MemoryKnown bool
	// MemoryMiB is each process's memory in whole MiB, summed: DCGM's
	// per-process figures (dcgm-exporter's per-pod DCGM_FI_DEV_FB_USED)
	// count it so.
	MemoryMiB float64
	SM        float64
	SMKnown   bool
	// PodUID is the pod UID the processes' cgroup paths name ("" for none).
	PodUID string
}

func (u *Use) add(p sample.GPUProcess) {
	u.Processes++
	if !p.MemoryKnown {
		u.MemoryKnown = false
	}
	u.MemoryBytes += float64(p.MemoryBytes)
	u.MemoryMiB += float64(p.MemoryBytes >> 20)
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
	// MPSServer is what the device's MPS server uses: the shared context
	// its clients run in, counted apart from every workload.
	MPSServer Use
}

// NewUse is the use of a container that runs nothing on a device whose
// processes could be read: zero, and as known as the device's figures.
func NewUse(d *sample.DeviceProcesses) Use {
	return Use{MemoryKnown: true, SMKnown: d.SMKnown}
}

// Attribute groups a device's processes by owner.
func Attribute(d *sample.DeviceProcesses, owners map[uint32]Owner) DeviceUse {
	u := DeviceUse{OutsidePods: NewUse(d), MPSServer: NewUse(d)}
	for _, p := range d.Processes {
		o := owners[p.PID]
		if o.MPSServer {
			u.MPSServer.add(p)
			continue
		}
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
		if cu.PodUID == "" {
			cu.PodUID = o.Cgroup.PodUID
		}
	}
	return u
}
