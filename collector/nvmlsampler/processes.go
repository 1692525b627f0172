package nvmlsampler

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// ProcessDevice is what per-process accounting needs of a device. It is
// part of Device. Every call here is older than R470: go-nvml itself binds
// the newest of the _v3 (R510+), _v2 and _v1 process lists the driver has,
// so no probe is needed before them. nvmlDeviceGetProcessesUtilizationInfo
// (R550+) is not used: go-nvml v0.13's wrapper passes it no sample buffer,
// so it can only ever answer with a count.
type ProcessDevice interface {
	GetComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	GetMPSComputeRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	GetGraphicsRunningProcesses() ([]nvml.ProcessInfo, nvml.Return)
	GetProcessUtilization(lastSeenTimestamp uint64) ([]nvml.ProcessUtilizationSample, nvml.Return)
}

// valueNotAvailable is NVML_VALUE_NOT_AVAILABLE as an unsigned long long:
// the used memory of a process NVML cannot see (MIG without privileges, WDDM).
const valueNotAvailable = ^uint64(0)

// readProcesses reads one device's processes: compute (time-sliced), MPS
// clients and, on a whole GPU, graphics, merged by PID; and on a whole GPU
// each process's SM utilization since *lastSeen (microseconds), which it
// advances. A process with no sample ran no kernels: its share is 0. What
// the driver or a MIG instance cannot answer is left unknown.
func readProcesses(d ProcessDevice, whole bool, lastSeen *uint64) sample.DeviceProcesses {
	var out sample.DeviceProcesses
	compute, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return out
	}
	out.Known = true
	byPID := make(map[uint32]int, len(compute))
	add := func(list []nvml.ProcessInfo) {
		for _, p := range list {
			known := p.UsedGpuMemory != valueNotAvailable
			mem := p.UsedGpuMemory
			if !known {
				mem = 0
			}
			if i, ok := byPID[p.Pid]; ok {
				// One process in two lists (compute and graphics) has one
				// allocation, reported in both.
				q := &out.Processes[i]
				q.MemoryKnown = q.MemoryKnown && known
				q.MemoryBytes = max(q.MemoryBytes, mem)
				continue
			}
			byPID[p.Pid] = len(out.Processes)
			out.Processes = append(out.Processes, sample.GPUProcess{PID: p.Pid, MemoryBytes: mem, MemoryKnown: known})
		}
	}
	add(compute)
	if mps, ret := d.GetMPSComputeRunningProcesses(); ret == nvml.SUCCESS {
		add(mps)
	}
	if !whole {
		return out // MIG: no graphics, no per-process utilization (nvml.h)
	}
	if g, ret := d.GetGraphicsRunningProcesses(); ret == nvml.SUCCESS {
		add(g)
	}
	samples, ret := d.GetProcessUtilization(*lastSeen)
	switch ret {
	case nvml.SUCCESS:
		out.SMKnown = true
		latest := make(map[uint32]nvml.ProcessUtilizationSample, len(samples))
		newest := *lastSeen
		for _, s := range samples {
			if cur, ok := latest[s.Pid]; !ok || s.TimeStamp > cur.TimeStamp {
				latest[s.Pid] = s
			}
			newest = max(newest, s.TimeStamp)
		}
		*lastSeen = newest
		for i := range out.Processes {
			if s, ok := latest[out.Processes[i].PID]; ok {
				out.Processes[i].SM = min(1, float64(s.SmUtil)/100)
			}
		}
	case nvml.ERROR_NOT_FOUND:
		out.SMKnown = true // no process ran kernels since the last sample
	}
	return out
}
