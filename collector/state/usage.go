package state

import (
	"context"
	"sort"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/procs"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
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
	ByDevice map[sample.UnitKey]*DeviceUsage
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

// attributeProcesses resolves every PID NVML listed on the units and
// groups each unit's processes by container. A holder that runs nothing
// gets a zero use.
func attributeProcesses(ctx context.Context, r *procs.Resolver, units []sample.Unit, a *Allocations) *Usage {
	start := time.Now()
	var pids []uint32
	for _, un := range units {
		if d := un.Device; d.Up && d.Processes.Known {
			for _, p := range d.Processes.Processes {
				pids = append(pids, p.PID)
			}
		}
	}
	owners := r.Resolve(ctx, pids)
	u := &Usage{ByDevice: map[sample.UnitKey]*DeviceUsage{}, PIDs: len(owners)}
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
	for _, un := range units {
		d, key := un.Device, un.Key
		holders := a.ByDevice[key]
		du := &DeviceUsage{Known: d.Up && d.Processes.Known && u.RootErr == "", Shared: a.Shared[key] || len(holders) > 1}
		u.ByDevice[key] = du
		if !du.Known {
			continue
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
	}
	u.Duration = time.Since(start)
	return u
}

// Device is the unit's usage, nil when process accounting is off or did
// not see the unit.
func (u *Usage) Device(key sample.UnitKey) *DeviceUsage {
	if u == nil {
		return nil
	}
	return u.ByDevice[key]
}

// Container is the holder's use of the unit, nil when it has none listed.
func (du *DeviceUsage) Container(h Holder) *ContainerUse {
	for i := range du.Containers {
		if du.Containers[i].Holder == h {
			return &du.Containers[i]
		}
	}
	return nil
}
