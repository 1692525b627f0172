package collector

import (
	"sort"
	"strings"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// PodSource gives the latest kubelet view without calling the kubelet.
type PodSource interface {
	Snapshot() *podmap.Snapshot
}

// staleAllocations: when the kubelet has not answered for this long, the
// last known holders are dropped rather than shown as current.
const staleAllocations = 5 * time.Minute

// Holder is a container holding a device.
type Holder struct {
	Namespace, Pod, Container, Resource string
}

// DeviceKey names a schedulable unit: a whole GPU or a MIG instance.
type DeviceKey struct {
	GPU         int
	GPUInstance int // -1 for a whole GPU
	// ComputeInstance tells apart the MIG devices of one GPU instance that
	// holds several compute instances; -1 for a whole GPU.
	ComputeInstance int
}

// migKey is the key of a MIG device.
func migKey(gpu int, m *sample.DeviceState) DeviceKey {
	return DeviceKey{gpu, m.GPUInstance, m.ComputeInstance}
}

// gpuKey is the key of a whole GPU.
func gpuKey(gpu int) DeviceKey { return DeviceKey{gpu, -1, -1} }

// Allocations is who holds what, resolved against one sample's devices.
type Allocations struct {
	Up bool
	// Known: the kubelet answered within staleAllocations, so who holds what
	// is known. Otherwise (no pod source, socket missing, kubelet down for
	// longer) the gauges that depend on it are left out rather than showing
	// every device free.
	Known    bool
	Duration time.Duration
	// Holders per device, sorted.
	ByDevice    map[DeviceKey][]Holder
	Allocatable map[string]int
	// AllocatableUnits are the schedulable units (whole GPUs, MIG
	// instances) that at least one allocatable device ID names: replicas of
	// a time-sliced GPU count once. nil when the kubelet gives no
	// allocatable list.
	AllocatableUnits map[DeviceKey]bool
	// allocatableRefs are the units the kubelet's allocatable device IDs
	// name, per resource and ID; unresolvable IDs are left out.
	allocatableRefs map[string]map[string]DeviceKey
	// heldIDs are the device IDs containers hold, per resource.
	heldIDs   map[string]map[string]bool
	Unmatched map[string]int // resource -> device IDs matching no device
	// Shared are the units the device plugin hands out as replicas
	// (time-slicing, MPS, GKE vgpuK), held or allocatable, and the compute
	// instances of a GPU instance that holds several.
	Shared map[DeviceKey]bool
	// SharedGPUInstance are those compute instances: their memory and DCGM
	// activity are their GPU instance's.
	SharedGPUInstance map[DeviceKey]bool
	// Replicas are the replica numbers each holder holds on a shared unit.
	Replicas map[HolderOn][]int
}

// HolderOn is a holder of one unit.
type HolderOn struct {
	Holder
	Key DeviceKey
}

// inventory is the sample's devices as podmap wants them.
func inventory(s *sample.NodeSample) *podmap.Inventory {
	inv := &podmap.Inventory{GPUs: make([]podmap.InventoryGPU, 0, len(s.GPUs))}
	for _, g := range s.GPUs {
		ig := podmap.InventoryGPU{Index: g.GPU, UUID: g.UUID, Minor: g.Minor}
		for _, m := range g.MIG {
			im := podmap.InventoryMIG{UUID: m.MIGUUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance, Profile: m.MIGProfile}
			if g.MIGLayout != nil {
				if pl, ok := g.MIGLayout.Instances[m.GPUInstance]; ok {
					im.HasPlacement, im.ProfileID, im.PlacementStart = true, pl.ProfileID, pl.Start
				}
			}
			ig.MIG = append(ig.MIG, im)
		}
		inv.GPUs = append(inv.GPUs, ig)
	}
	return inv
}

// resolveAllocations matches the kubelet's holdings to the sample's devices.
func resolveAllocations(snap *podmap.Snapshot, s *sample.NodeSample, now time.Time, unmatchedLog *podmap.UnmatchedLogger) *Allocations {
	a := &Allocations{ByDevice: map[DeviceKey][]Holder{}, Unmatched: map[string]int{}, Shared: map[DeviceKey]bool{}, Replicas: map[HolderOn][]int{}}
	if snap == nil {
		return a
	}
	a.Up, a.Duration = snap.Up, snap.RefreshDuration
	if snap.Time.IsZero() || now.Sub(snap.Time) > staleAllocations {
		return a
	}
	a.Known = true
	a.Allocatable = snap.Allocatable
	inv := inventory(s)
	if snap.AllocatableIDs != nil {
		a.AllocatableUnits = map[DeviceKey]bool{}
		a.allocatableRefs = map[string]map[string]DeviceKey{}
		for res, ids := range snap.AllocatableIDs {
			refs := map[string]DeviceKey{}
			a.allocatableRefs[res] = refs
			for _, id := range ids {
				ref, err := podmap.ParseDeviceID(id)
				if err != nil {
					continue
				}
				if t, ok := inv.Resolve(ref); ok {
					k := targetKey(t)
					a.AllocatableUnits[k] = true
					refs[id] = k
					if ref.IsShared() {
						a.Shared[k] = true
					}
				}
			}
		}
		a.heldIDs = map[string]map[string]bool{}
		for _, h := range snap.Holdings {
			if a.heldIDs[h.Resource] == nil {
				a.heldIDs[h.Resource] = map[string]bool{}
			}
			a.heldIDs[h.Resource][h.DeviceID] = true
		}
	}
	matched, unmatched := podmap.Match(snap, inv)
	add := func(k DeviceKey, h Holder) {
		hs := a.ByDevice[k]
		for _, x := range hs { // two replicas of one GPU in one container are one holder
			if x == h {
				return
			}
		}
		a.ByDevice[k] = append(hs, h)
	}
	for _, m := range matched {
		k := targetKey(m.Target)
		h := Holder{Namespace: validUTF8(m.Namespace), Pod: validUTF8(m.Pod), Container: validUTF8(m.Container), Resource: validUTF8(m.Resource)}
		if m.Ref.IsShared() {
			a.Shared[k] = true
			a.Replicas[HolderOn{h, k}] = append(a.Replicas[HolderOn{h, k}], m.Ref.Replica)
		}
		if g := gpuOf(s, k.GPU); k.GPUInstance < 0 && g != nil && len(g.MIG) > 0 {
			// A whole MIG-mode GPU, held by its GPU UUID (the device
			// plugin's migStrategy none): its holder holds every
			// instance, and the devices are only counted per instance.
			for j := range g.MIG {
				add(migKey(k.GPU, &g.MIG[j]), h)
			}
			continue
		}
		add(k, h)
	}
	for k, hs := range a.ByDevice {
		sort.Slice(hs, func(i, j int) bool { return holderLess(hs[i], hs[j]) })
		a.ByDevice[k] = hs
	}
	a.SharedGPUInstance = markSharedGPUInstances(s, a.Shared)
	for _, h := range unmatched {
		a.Unmatched[h.Resource]++
	}
	if unmatchedLog != nil {
		unmatchedLog.Log(unmatched)
	}
	return a
}

// markSharedGPUInstances marks the compute instances of a GPU instance
// that holds several as shared: NVML reports the GPU instance's memory on
// each of them and DCGM its activity, so a holder of one compute instance
// is credited with its own processes (as on a time-sliced GPU), not with
// what its neighbours in the GPU instance use.
func markSharedGPUInstances(s *sample.NodeSample, shared map[DeviceKey]bool) map[DeviceKey]bool {
	out := map[DeviceKey]bool{}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		cis := map[int]int{}
		for j := range g.MIG {
			cis[g.MIG[j].GPUInstance]++
		}
		for j := range g.MIG {
			if cis[g.MIG[j].GPUInstance] > 1 {
				shared[migKey(g.GPU, &g.MIG[j])] = true
				out[migKey(g.GPU, &g.MIG[j])] = true
			}
		}
	}
	return out
}

// targetKey is the device a kubelet device ID resolved to.
func targetKey(t podmap.Target) DeviceKey {
	if t.GPUInstance < 0 {
		return gpuKey(t.GPU)
	}
	return DeviceKey{t.GPU, t.GPUInstance, t.ComputeInstance}
}

func holderLess(a, b Holder) bool {
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	if a.Pod != b.Pod {
		return a.Pod < b.Pod
	}
	if a.Container != b.Container {
		return a.Container < b.Container
	}
	return a.Resource < b.Resource
}

var (
	allocLabels   = []string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance", "namespace", "pod", "container", "resource"}
	allocInfoDesc = prometheus.NewDesc("gpu_allocation_info",
		"A container holding a GPU or MIG instance, from the kubelet; value 1. A time-sliced GPU has one series per holder.",
		allocLabels, nil)
	containerLabels  = []string{"namespace", "pod", "container", "gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance"}
	containerMemDesc = prometheus.NewDesc("gpu_container_memory_used_bytes",
		"Framebuffer memory the container uses on the device: the device's used memory when it holds the device alone; on a shared device (time-sliced, MPS, or a compute instance of a GPU instance that holds several) the sum of its own processes' memory from NVML's process lists, 0 when it runs nothing there.",
		containerLabels, nil)
	containerUtilDesc = prometheus.NewDesc("gpu_container_utilization_ratio",
		"The container's activity on the device, 0-1, from the source the label names: device (NVML busy ratio of a whole GPU it holds alone; absent on MIG instances, which have none: see gpu_container_sm_active_ratio), processes (on a shared device: the SM utilization of its own processes, NVML per-process accounting; 0 when it runs nothing).",
		append(append([]string(nil), containerLabels...), "source"), nil)
	containerSMDesc = prometheus.NewDesc("gpu_container_sm_active_ratio", "SM active ratio (DCGM) of a device the container holds alone.", containerLabels, nil)
	allocatableDesc = prometheus.NewDesc("gpu_kubelet_allocatable_devices",
		"Devices the kubelet can allocate, by resource (GetAllocatableResources). Falls below gpu_healthy_devices when the device plugin loses its devices.",
		[]string{"resource"}, nil)
	devicesDesc = prometheus.NewDesc("gpu_devices",
		"Schedulable devices (whole GPUs and MIG instances) by state: free, allocated (held by at least one container) or unhealthy (lost by NVML, row remapping failed, or a reset pending: rows to remap, pages to retire, a recovery action). free and allocated are absent while the pod map is unknown.",
		[]string{"state"}, nil)
	healthyDesc = prometheus.NewDesc("gpu_healthy_devices",
		"Healthy schedulable devices the exporter sees: whole GPUs not in MIG mode plus the MIG instances of healthy GPUs.", nil, nil)
	allocatableHealthyDesc = prometheus.NewDesc("gpu_kubelet_allocatable_healthy_devices",
		"Healthy schedulable devices (as in gpu_healthy_devices) that the kubelet can allocate: replicas of a time-sliced GPU count once. Below gpu_healthy_devices, the device plugin lost devices.",
		nil, nil)
	freeIDsDesc = prometheus.NewDesc("gpu_kubelet_free_devices",
		"Device IDs of the resource that the kubelet can allocate, that no container holds and whose device is healthy: what the scheduler can still place here (each time-slicing replica counts). Absent while the pod map is unknown.",
		[]string{"resource"}, nil)
	unmatchedDesc = prometheus.NewDesc("gpu_kubelet_unmatched_device_ids",
		"Device IDs the kubelet reports that match no device NVML sees (stale, foreign or malformed), by resource.", []string{"resource"}, nil)
)

// healthy says whether a GPU can take new work: NVML answers, its memory can
// still be repaired, and no reset is pending. A GPU whose row remapping
// failed (GPURowRemapFailed: replace it), or that waits for a reset (rows to
// remap, pages to retire, an NVML recovery action) is unhealthy: never free
// capacity, even though NVML answers and pods may still run on it.
func healthy(g *sample.GPUState) bool {
	h := &g.Health
	switch {
	case !g.Up,
		h.RemapFailed.OK && h.RemapFailed.V,
		h.RemapPending.OK && h.RemapPending.V,
		h.RetiredPending.OK && h.RetiredPending.V,
		h.RecoveryAction.OK && h.RecoveryAction.V != 0:
		return false
	}
	return true
}

// eachUnit calls f for each schedulable unit of the sample (whole GPUs, MIG
// instances) with its health (see healthy).
func eachUnit(s *sample.NodeSample, f func(d *sample.DeviceState, key DeviceKey, healthy bool)) {
	for i := range s.GPUs {
		g := &s.GPUs[i]
		ok := healthy(g)
		if len(g.MIG) == 0 {
			if g.MIGEnabled {
				// MIG mode without instances: no pod can get the GPU
				// (device plugins advertise MIG devices only) until
				// instances are created.
				continue
			}
			f(&g.DeviceState, gpuKey(g.GPU), ok)
			continue
		}
		for j := range g.MIG {
			m := &g.MIG[j]
			f(m, migKey(g.GPU, m), ok && m.Up)
		}
	}
}

// sharedFree lists the units that have at least one free allocatable
// device ID while held: time-sliced GPUs with free replicas.
func (a *Allocations) sharedFree() map[DeviceKey]bool {
	out := map[DeviceKey]bool{}
	for res, refs := range a.allocatableRefs {
		for id, k := range refs {
			if !a.heldIDs[res][id] && len(a.ByDevice[k]) > 0 {
				out[k] = true
			}
		}
	}
	return out
}

func collectAllocations(st *State, ch chan<- prometheus.Metric) {
	a := st.Allocations
	s := st.Sample
	var free, allocated, unhealthy, healthy, allocatableHealthy int
	eachUnit(s, func(d *sample.DeviceState, key DeviceKey, ok bool) {
		holders := a.ByDevice[key]
		switch {
		case !ok:
			unhealthy++
		case len(holders) > 0:
			allocated++
		default:
			free++
		}
		if ok {
			healthy++
			if a.AllocatableUnits[key] {
				allocatableHealthy++
			}
		}
		lv := labelValues(d)
		for _, h := range holders {
			ch <- prometheus.MustNewConstMetric(allocInfoDesc, prometheus.GaugeValue, 1, lv[0], lv[1], lv[2], lv[3], lv[4], h.Namespace, h.Pod, h.Container, h.Resource)
		}
		if !d.Up {
			return
		}
		du := st.Usage.device(key)
		if du != nil && du.Known && du.Shared {
			// On a device held alone its holder's series is the device's.
			ch <- prometheus.MustNewConstMetric(outsidePodsDesc, prometheus.GaugeValue, du.OutsidePods.MemoryBytes, lv...)
			// Shared: each container's own processes, 0 for a holder running nothing.
			for i := range du.Containers {
				cu := &du.Containers[i]
				cl := []string{cu.Namespace, cu.Pod, cu.Container, lv[0], lv[1], lv[2], lv[3], lv[4]}
				if cu.Use.MemoryKnown {
					ch <- prometheus.MustNewConstMetric(containerMemDesc, prometheus.GaugeValue, cu.Use.MemoryBytes, cl...)
				}
				if v, src, ok := containerActivity(du, d, cu); ok {
					ch <- prometheus.MustNewConstMetric(containerUtilDesc, prometheus.GaugeValue, v, append(cl, src)...)
				}
			}
			return
		}
		if len(holders) != 1 || a.SharedGPUInstance[key] {
			// Shared devices without process accounting: per-container use
			// is unknown, so absent rather than duplicated; a compute
			// instance's figures are its GPU instance's, not its holder's.
			return
		}
		h := holders[0]
		cl := []string{h.Namespace, h.Pod, h.Container, lv[0], lv[1], lv[2], lv[3], lv[4]}
		if v, ok := d.Values.Get(sample.FieldMemoryUsed); ok {
			ch <- prometheus.MustNewConstMetric(containerMemDesc, prometheus.GaugeValue, v, cl...)
		}
		if v, src, ok := containerActivity(nil, d, nil); ok {
			ch <- prometheus.MustNewConstMetric(containerUtilDesc, prometheus.GaugeValue, v, append(cl, src)...)
		}
		if v, ok := d.Values.Get(sample.FieldSMActive); ok {
			ch <- prometheus.MustNewConstMetric(containerSMDesc, prometheus.GaugeValue, v, cl...)
		}
	})
	if a.Known {
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(free), "free")
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(allocated), "allocated")
	}
	ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(unhealthy), "unhealthy")
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, float64(healthy))
	if a.AllocatableUnits != nil {
		ch <- prometheus.MustNewConstMetric(allocatableHealthyDesc, prometheus.GaugeValue, float64(allocatableHealthy))
	}
	for r, n := range a.Allocatable {
		ch <- prometheus.MustNewConstMetric(allocatableDesc, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range a.freeIDs(s) {
		ch <- prometheus.MustNewConstMetric(freeIDsDesc, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range a.Unmatched {
		ch <- prometheus.MustNewConstMetric(unmatchedDesc, prometheus.GaugeValue, float64(n), r)
	}
}

// freeIDs counts, per resource, the allocatable device IDs that no
// container holds and that name a healthy unit; nil when the kubelet gave no
// allocatable list.
func (a *Allocations) freeIDs(s *sample.NodeSample) map[string]int {
	if a.allocatableRefs == nil {
		return nil
	}
	healthy := map[DeviceKey]bool{}
	eachUnit(s, func(_ *sample.DeviceState, key DeviceKey, ok bool) { healthy[key] = ok })
	out := make(map[string]int, len(a.allocatableRefs))
	for res, refs := range a.allocatableRefs {
		n := 0
		for id, k := range refs {
			if healthy[k] && !a.heldIDs[res][id] {
				n++
			}
		}
		out[res] = n
	}
	return out
}

// validUTF8 keeps a label value that a kubelet or driver bug made invalid
// from panicking the metrics registry.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
