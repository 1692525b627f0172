package collector

import (
	"context"
	"sort"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
)

// Usage is what each container uses of each unit, from NVML's per-process
// accounting joined with the host's /proc and the container names.
type Usage struct {
	Duration time.Duration
	// IdentityErr is why container names cannot be read, "" when they can.
	IdentityErr string
	// RootErr is why the proc root cannot be read, "" when it can: then no
	// unit's processes are known, and no per-container figure is served.
	RootErr  string
	ByDevice map[DeviceKey]*DeviceUsage
	// NotFound counts the PIDs NVML listed that the proc root does not
	// show: processes that just exited, or a proc root that is not the
	// host's (then every process counts as outside pods).
	NotFound, PIDs int
}

// DeviceUsage is one unit's processes by container.
type DeviceUsage struct {
	// Known: NVML listed the unit's processes.
	Known bool
	// Shared: the unit is handed out as replicas or held by several
	// containers, so its device figures are not any one container's.
	Shared bool
	// Containers are the unit's holders (in holder order), then the pod
	// containers that use it without holding it.
	Containers  []ContainerUse
	OutsidePods procs.Use
	// MPSServer is the MPS server's own use: in the device's used memory,
	// in no container's figure and not outside pods.
	MPSServer procs.Use
}

// ContainerUse is one container's use of one unit.
type ContainerUse struct {
	Holder
	Holding bool
	Use     procs.Use
}

// attributeProcesses resolves every PID NVML listed and groups each unit's
// processes by container. A holder that runs nothing gets a zero use.
func attributeProcesses(ctx context.Context, r *procs.Resolver, s *sample.NodeSample, a *Allocations) *Usage {
	start := time.Now()
	var pids []uint32
	eachUnit(s, func(d *sample.DeviceState, _ DeviceKey, _ bool) {
		if d.Up && d.Processes.Known {
			for _, p := range d.Processes.Processes {
				pids = append(pids, p.PID)
			}
		}
	})
	owners := r.Resolve(ctx, pids)
	u := &Usage{ByDevice: map[DeviceKey]*DeviceUsage{}, PIDs: len(owners)}
	for _, o := range owners {
		if !o.Found {
			u.NotFound++
		}
	}
	if err := r.Err(); err != nil {
		u.IdentityErr = err.Error()
	}
	if err := r.RootErr(); err != nil {
		u.RootErr = err.Error()
	}
	eachUnit(s, func(d *sample.DeviceState, key DeviceKey, _ bool) {
		holders := a.ByDevice[key]
		du := &DeviceUsage{Known: d.Up && d.Processes.Known && u.RootErr == "", Shared: a.Shared[key] || len(holders) > 1}
		u.ByDevice[key] = du
		if !du.Known {
			return
		}
		att := procs.Attribute(&d.Processes, owners)
		taken := map[procs.Identity]bool{}
		for _, h := range holders {
			id := procs.Identity{Namespace: h.Namespace, Pod: h.Pod, Container: h.Container}
			use := procs.NewUse(&d.Processes)
			if cu := att.ByContainer[id]; cu != nil && !taken[id] {
				use = *cu
			}
			taken[id] = true
			du.Containers = append(du.Containers, ContainerUse{Holder: h, Holding: true, Use: use})
		}
		var others []ContainerUse
		for id, cu := range att.ByContainer {
			if !taken[id] {
				others = append(others, ContainerUse{Holder: Holder{Namespace: validUTF8(id.Namespace), Pod: validUTF8(id.Pod), Container: validUTF8(id.Container)}, Use: *cu})
			}
		}
		sort.Slice(others, func(i, j int) bool { return holderLess(others[i].Holder, others[j].Holder) })
		du.Containers = append(du.Containers, others...)
		if len(others) > 0 {
			du.Shared = true // a container uses it without holding it: the device's figures are not the holder's alone
		}
		du.OutsidePods = att.OutsidePods
		du.MPSServer = att.MPSServer
	})
	u.Duration = time.Since(start)
	return u
}

// Sources of gpu_container_utilization_ratio.
const (
	sourceDevice    = "device"         // the held whole GPU's NVML busy ratio
	sourceDCGM      = "dcgm_sm_active" // DCGM SM activity (MIG instances; landing page only)
	sourceProcesses = "processes"      // the container's own processes (NVML per-process SM utilization)
)

var (
	outsidePodsDesc = prometheus.NewDesc("gpu_memory_used_outside_pods_bytes",
		"Framebuffer memory used by processes that run in no pod (host processes, containers of other runtimes) on a shared device (time-sliced, MPS, or used by a pod that does not hold it), from NVML's process lists; only where process accounting is on.",
		deviceLabels, nil)
)

// holderIdleActivity is what a holder's idleness is judged on: on a shared
// unit its own processes' SM utilization where NVML gives it, else the
// device's activity (an idle device means every holder is idle; a busy one
// keeps them all from counting as idle, which is the safe side).
func holderIdleActivity(u *Usage, d *sample.DeviceState, key DeviceKey, h Holder) (float64, bool) {
	if du := u.device(key); du != nil && du.Shared {
		if cu := du.container(h); cu != nil && cu.Use.SMKnown {
			return cu.Use.SM, true
		}
	}
	return idleActivity(d)
}

// containerActivity is gpu_container_utilization_ratio and its source: on
// a shared unit the container's own processes (absent where NVML has no
// per-process utilization), on a unit held alone the device's figure.
func containerActivity(du *DeviceUsage, d *sample.DeviceState, cu *ContainerUse) (float64, string, bool) {
	if du != nil && du.Shared {
		if cu != nil && cu.Use.SMKnown {
			return cu.Use.SM, sourceProcesses, true
		}
		return 0, "", false
	}
	if v, ok := d.Values.Get(sample.FieldUtilization); ok {
		return v, sourceDevice, true
	}
	return 0, "", false // MIG instances: see gpu_container_sm_active_ratio
}

// statusActivity is the landing page's activity of a unit or of a holder
// with no figure of its own: NVML's busy ratio, or on a MIG instance
// DCGM's SM activity, with its source.
func statusActivity(du *DeviceUsage, d *sample.DeviceState, cu *ContainerUse) (float64, string, bool) {
	if v, src, ok := containerActivity(du, d, cu); ok || (du != nil && du.Shared) {
		return v, src, ok
	}
	if v, ok := d.Values.Get(sample.FieldSMActive); ok {
		return v, sourceDCGM, true
	}
	return 0, "", false
}

func (u *Usage) device(key DeviceKey) *DeviceUsage {
	if u == nil {
		return nil
	}
	return u.ByDevice[key]
}

func (du *DeviceUsage) container(h Holder) *ContainerUse {
	for i := range du.Containers {
		if du.Containers[i].Holder == h {
			return &du.Containers[i]
		}
	}
	return nil
}
