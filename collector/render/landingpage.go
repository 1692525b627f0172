package render

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
)

// StatusInfo is what the landing page says about the exporter itself.
type StatusInfo struct {
	Version   string
	Node      string
	Simulated bool
}

// buildStatus turns one sample's state into the landing page's table.
func buildStatus(st *state.State, info StatusInfo, podMap, processes bool) *status.Node {
	s := st.Sample
	n := &status.Node{Version: info.Version, Node: info.Node, Simulated: info.Simulated, SampleTime: s.Time,
		Driver: s.Driver.DriverVersion, CUDA: s.Driver.CUDADriverVersion, Processes: "off", PodMap: "off", GPUs: []status.GPU{}}
	n.NVML = "ok"
	if s.NVML.Down != "" {
		n.NVML = s.NVML.Down
	}
	n.XIDEvents = xidEventsLine(st)
	if podMap {
		n.PodMap = "on"
		if st.Allocations == nil || !st.Allocations.Up {
			n.PodMap = "down"
			if st.Allocations != nil && st.Allocations.Down != "" {
				n.PodMap = "down: " + st.Allocations.Down
			}
		}
	}
	if processes && st.Usage != nil {
		n.Processes = "on"
		if st.Usage.IdentityErr != "" {
			n.Processes = "no container names: " + st.Usage.IdentityErr
		}
		if st.Usage.RootErr != "" {
			n.Processes = "down: " + st.Usage.RootErr
		}
	}
	idle := map[fragmentation.HolderKey]fragmentation.IdleStatus{}
	if st.Derived != nil {
		for _, is := range st.Derived.Idle {
			idle[is.Key] = is
		}
	}
	a := st.Allocations
	if a == nil {
		a = &state.Allocations{}
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		sg := status.GPU{Index: g.GPU, UUID: g.UUID, Model: g.Model, Up: g.Up, Health: gpuHealth(st, g)}
		if g.Minor >= 0 {
			sg.Device = "nvidia" + strconv.Itoa(g.Minor)
		}
		units := []*sample.DeviceState{&g.DeviceState}
		if len(g.MIG) > 0 {
			units = units[:0]
			for j := range g.MIG {
				units = append(units, &g.MIG[j])
			}
		}
		for _, d := range units {
			key := sample.UnitKey{GPU: g.GPU, GPUInstance: d.GPUInstance, ComputeInstance: d.ComputeInstance}
			sg.Units = append(sg.Units, buildUnit(st, a, d, key, idle))
		}
		n.GPUs = append(n.GPUs, sg)
	}
	return n
}

// xidEventsLine says which GPUs' XIDs are seen.
func xidEventsLine(st *state.State) string {
	if !st.XIDOn {
		return "off"
	}
	if st.XIDCoverage == nil {
		if st.XIDUp {
			return "listening"
		}
		return "no event set open: XIDs are not seen"
	}
	var missing []string
	unsupported := 0
	for _, c := range st.XIDCoverage {
		switch {
		case c.Unsupported:
			unsupported++
		case !c.Registered:
			missing = append(missing, strconv.Itoa(c.GPU))
		}
	}
	switch {
	case len(st.XIDCoverage) == 0:
		return "no event set open: XIDs are not seen"
	case len(missing) == 0 && unsupported > 0:
		return fmt.Sprintf("%d of %d GPUs registered; the others support no XID events", len(st.XIDCoverage)-unsupported, len(st.XIDCoverage))
	case len(missing) == 0:
		return fmt.Sprintf("all %d GPUs registered", len(st.XIDCoverage))
	case len(missing) == len(st.XIDCoverage):
		return "no GPU registered: XIDs are not seen"
	}
	return "not registered (XIDs not seen): GPU " + strings.Join(missing, ", ")
}

func buildUnit(st *state.State, a *state.Allocations, d *sample.DeviceState, key sample.UnitKey, idle map[fragmentation.HolderKey]fragmentation.IdleStatus) status.Unit {
	u := status.Unit{GPUInstance: d.GPUInstance, MIGProfile: d.MIGProfile, Holders: []status.Holder{}}
	if !d.IsMIG() {
		u.GPUInstance = -1
	}
	if d.Up {
		u.MemoryUsedBytes = value(d, sample.FieldMemoryUsed)
		u.MemoryTotalBytes = value(d, sample.FieldMemoryTotal)
		if v, _, ok := statusActivity(nil, d, nil); ok {
			u.Activity = &v
		}
	}
	holders := a.ByDevice[key]
	du := st.Usage.Device(key)
	u.Shared = a.Shared[key] || len(holders) > 1 || (du != nil && du.Shared)
	if du != nil && du.Known && d.Up {
		v := du.OutsidePods.MemoryBytes
		u.OutsidePodsMemoryBytes, u.OutsidePodsProcesses = &v, du.OutsidePods.Processes
		if du.MPSServer.Processes > 0 {
			m := du.MPSServer.MemoryBytes
			u.MPSServerMemoryBytes = &m
		}
	}
	add := func(h state.Holder, holding bool, cu *state.ContainerUse) {
		sh := status.Holder{Namespace: h.Namespace, Pod: h.Pod, Container: h.Container, Resource: h.Resource, Holding: holding,
			Replicas: a.Replicas[state.HolderOn{Holder: h, Key: key}]}
		switch {
		case !d.Up:
		case du != nil && du.Known && du.Shared:
			if cu != nil {
				sh.Processes = cu.Use.Processes
				if cu.Use.MemoryKnown {
					v := cu.Use.MemoryBytes
					sh.MemoryUsedBytes = &v
				}
			}
			if v, src, ok := statusActivity(du, d, cu); ok {
				sh.Activity, sh.ActivitySource = &v, src
			}
		case len(holders) == 1 && holding:
			sh.MemoryUsedBytes = value(d, sample.FieldMemoryUsed)
			if v, src, ok := statusActivity(nil, d, nil); ok {
				sh.Activity, sh.ActivitySource = &v, src
			}
			if cu != nil {
				sh.Processes = cu.Use.Processes
			}
		}
		if is, ok := idle[fragmentation.HolderKey{Namespace: h.Namespace, Pod: h.Pod, Container: h.Container, Resource: h.Resource, GPU: key.GPU, GPUInstance: key.GPUInstance, ComputeInstance: key.ComputeInstance}]; ok {
			sh.Idle = is.Idle
			if !is.QuietSince.IsZero() {
				sh.QuietSeconds = st.Sample.Time.Sub(is.QuietSince).Seconds()
			}
		}
		u.Holders = append(u.Holders, sh)
	}
	for _, h := range holders {
		var cu *state.ContainerUse
		if du != nil {
			cu = du.Container(h)
		}
		add(h, true, cu)
	}
	if du != nil {
		for i := range du.Containers {
			if cu := &du.Containers[i]; !cu.Holding {
				add(cu.Holder, false, cu)
			}
		}
	}
	return u
}

func value(d *sample.DeviceState, f sample.Field) *float64 {
	if v, ok := d.Values.Get(f); ok {
		return &v
	}
	return nil
}

// gpuHealth is the GPU's health at a glance: XIDs since start, throttling,
// uncorrected ECC errors.
func gpuHealth(st *state.State, g *sample.GPUState) status.Health {
	var h status.Health
	for _, x := range st.XIDs {
		if x.GPU == g.GPU && x.UUID == g.UUID {
			h.XIDs += x.Total
		}
	}
	for _, x := range st.XIDLast {
		if x.GPU == g.GPU && x.UUID == g.UUID {
			h.LastXID = x.Code
		}
	}
	var problems []string
	if h.XIDs > 0 {
		problems = append(problems, fmt.Sprintf("%d XIDs (last %d)", h.XIDs, h.LastXID))
	}
	if !g.Up {
		return h
	}
	if r := g.Health.ClockReasons; r.OK {
		for _, cr := range sample.ClockEventReasons {
			if r.V&cr.Bit&slowdownReasons != 0 { // throttling: heat or power
				h.Throttle = append(h.Throttle, cr.Name)
			}
		}
	}
	if len(h.Throttle) > 0 {
		problems = append(problems, "throttled: "+strings.Join(h.Throttle, ", "))
	}
	if e := g.Health.ECC[1][0]; e.OK {
		h.ECCUncorrected = e.V
		if e.V > 0 {
			problems = append(problems, fmt.Sprintf("%d uncorrected ECC errors", e.V))
		}
	}
	h.Problems = strings.Join(problems, "; ")
	return h
}
