package render

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
)

var (
	allocLabels   = []string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance", "namespace", "pod", "container", "resource"}
	allocInfoDesc = groupDesc(GroupAllocation, "gpu_allocation_info",
		"A container holding a GPU or MIG instance, from the kubelet; value 1. A time-sliced GPU has one series per holder.",
		allocLabels)
	containerLabels  = []string{"namespace", "pod", "container", "gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance"}
	containerMemDesc = groupDesc(GroupContainer, "gpu_container_memory_used_bytes",
		"Framebuffer memory the container uses on the device: the device's used memory when it holds the device alone; on a shared device (time-sliced, MPS, or a compute instance of a GPU instance that holds several) the sum of its own processes' memory from NVML's process lists, 0 when it runs nothing there.",
		containerLabels)
	containerUtilDesc = groupDesc(GroupContainer, "gpu_container_utilization_ratio",
		"The container's activity on the device, 0-1, from the source the label names: device (NVML busy ratio of a whole GPU it holds alone; absent on MIG instances, which have none: see gpu_container_sm_active_ratio), processes (on a shared device: the SM utilization of its own processes, NVML per-process accounting; 0 when it runs nothing).",
		append(append([]string(nil), containerLabels...), "source"))
	allocShareDesc = groupDesc(GroupAllocation, "gpu_allocation_share_ratio",
		"The holder's share of the device of its gpu_allocation_info series (whole GPU or MIG device; a compute instance is a device of its own): 1 for a device it holds alone, 1/n for each of the n holders of a shared one (time-slicing, MPS). A namespace's shares summed are gpu_namespace_allocated_devices.",
		allocLabels)
	allocActivityDesc = groupDesc(GroupContainer, "gpu_allocation_activity_ratio",
		"The holder's activity on the device, 0-1: DCGM's SM activity of the device (gpu_sm_active_ratio) where it holds it alone and DCGM measures it, else gpu_container_utilization_ratio (its own processes on a shared device, the busy ratio of a whole GPU it holds alone). Absent where neither is measured (a MIG device without DCGM, a shared device without process accounting).",
		containerLabels)
	containerSMDesc = groupDesc(GroupDCGMDetail, "gpu_container_sm_active_ratio", "SM active ratio (DCGM) of a device the container holds alone.", containerLabels)
	outsidePodsDesc = groupDesc(GroupContainer, "gpu_memory_used_outside_pods_bytes",
		"Framebuffer memory used by processes that run in no pod (host processes, containers of other runtimes) on a shared device (time-sliced, MPS, or used by a pod that does not hold it), from NVML's process lists; only where process accounting is on.",
		deviceLabels)
	allocatableDesc = groupDesc(GroupAllocation, "gpu_kubelet_allocatable_devices",
		"Devices the kubelet can allocate, by resource (GetAllocatableResources). Falls below gpu_healthy_devices when the device plugin loses its devices.",
		[]string{"resource"})
	devicesDesc = groupDesc(GroupAllocation, "gpu_devices",
		"Schedulable devices (whole GPUs and MIG instances) by state: free, allocated (held by at least one container) or unhealthy (lost by NVML, row remapping failed, a reset pending: rows to remap, pages to retire, a recovery action; or tainted NoSchedule/NoExecute by a DRA driver, gpu_dra_device_taint). free and allocated are absent while the pod map is unknown.",
		[]string{"state"})
	healthyDesc = groupDesc(GroupAllocation, "gpu_healthy_devices",
		"Healthy schedulable devices the exporter sees: whole GPUs not in MIG mode plus the MIG instances of healthy GPUs.", nil)
	allocatableHealthyDesc = groupDesc(GroupAllocation, "gpu_kubelet_allocatable_healthy_devices",
		"Healthy schedulable devices (as in gpu_healthy_devices) that the kubelet can allocate: replicas of a time-sliced GPU count once. Below gpu_healthy_devices, the device plugin lost devices.",
		nil)
	freeIDsDesc = groupDesc(GroupAllocation, "gpu_kubelet_free_devices",
		"Device IDs of the resource that the kubelet can allocate, that no container holds and whose device is healthy: what the scheduler can still place here (each time-slicing replica counts). Absent while the pod map is unknown.",
		[]string{"resource"})
	nsAllocatedDesc = groupDesc(GroupAllocation, "gpu_namespace_allocated_devices",
		"Devices (whole GPUs and MIG devices) the namespace's containers hold on this node, a device held by n containers counting 1/n for each (as gpu_allocation_info lists them). Absent while the pod map is unknown.",
		[]string{"namespace"})
	nsBusyDesc = groupDesc(GroupAllocation, "gpu_namespace_busy_devices",
		"NVML busy ratio (gpu_utilization_ratio) of the devices the namespace's containers hold on this node, each weighted by the holder's share of it (as in gpu_namespace_allocated_devices): 2 GPUs held alone at 50% busy are 1. MIG devices have no busy ratio and add nothing.",
		[]string{"namespace"})
	nsMeasuredDesc = groupDesc(GroupAllocation, "gpu_namespace_utilization_measured_devices",
		"The devices of gpu_namespace_allocated_devices that have an NVML busy ratio: gpu_namespace_busy_devices over this is the namespace's average utilization of them. Absent, as gpu_namespace_busy_devices, where none has one (MIG devices only).",
		[]string{"namespace"})
	sharedLabels      = []string{"gpu", "uuid", "gpu_instance"}
	sharedHoldersDesc = groupDesc(GroupAllocation, "gpu_shared_device_holders",
		"Containers holding a device that several hold (a time-sliced or MPS GPU, or a GPU instance whose compute instances several hold): one series per such whole GPU or GPU instance, none for a device with one holder or none. Absent while the pod map is unknown.",
		sharedLabels)
	sharedMemUsedDesc = groupDesc(GroupAllocation, "gpu_shared_device_memory_used_bytes",
		"Framebuffer memory in use on a device of gpu_shared_device_holders (the GPU instance's, which each of its compute instances reports), in bytes: the few series the shared-device alerts read instead of every device's gpu_memory_used_bytes.",
		sharedLabels)
	sharedMemTotalDesc = groupDesc(GroupAllocation, "gpu_shared_device_memory_total_bytes",
		"Framebuffer memory in total of a device of gpu_shared_device_holders, in bytes.",
		sharedLabels)
	unheldGPUDesc = groupDesc(GroupAllocation, "gpu_unallocated_info",
		"A physical GPU no container holds (neither the GPU nor any of its MIG devices), healthy or not; value 1, no series for a GPU something holds. Absent while the pod map is unknown.",
		[]string{"gpu", "uuid"})
	unmatchedDesc = groupDesc(GroupAllocation, "gpu_kubelet_unmatched_device_ids",
		"Device IDs the kubelet reports that match no device NVML sees (stale, foreign or malformed), by resource.", []string{"resource"})
)

// collectAllocations renders who holds which unit, the units' states, the
// kubelet's capacity and each container's use of the units it holds.
func collectAllocations(st *state.State, ch chan<- prometheus.Metric) {
	a := st.Allocations
	var free, allocated, unhealthy, healthy, allocatableHealthy int
	ns := map[string]*namespaceDevices{}
	var shared sharedDevices
	held := map[int]bool{}
	for _, u := range st.Units {
		d, key, ok := u.Device, u.Key, u.Healthy
		holders := a.ByDevice[key]
		if len(holders) > 0 {
			held[key.GPU] = true
		}
		shared.add(key, d, len(holders))
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
		util, measured := d.Values.Get(sample.FieldUtilization)
		share := 1 / float64(len(holders))
		for _, h := range holders {
			ch <- prometheus.MustNewConstMetric(allocInfoDesc, prometheus.GaugeValue, 1, lv[0], lv[1], lv[2], lv[3], lv[4], h.Namespace, h.Pod, h.Container, h.Resource)
			ch <- prometheus.MustNewConstMetric(allocShareDesc, prometheus.GaugeValue, share, lv[0], lv[1], lv[2], lv[3], lv[4], h.Namespace, h.Pod, h.Container, h.Resource)
			nd := ns[h.Namespace]
			if nd == nil {
				nd = &namespaceDevices{}
				ns[h.Namespace] = nd
			}
			nd.allocated += share
			if measured {
				nd.busy += share * util
				nd.measured += share
				nd.anyMeasured = true
			}
		}
		// A holder alone on its device: the device's SM activity (DCGM) is
		// its activity, whether or not the device is up or its processes
		// are known, as gpu_sm_active_ratio says.
		sm, smOK := d.Values.Get(sample.FieldSMActive)
		smAlone := smOK && len(holders) == 1
		if smAlone {
			h := holders[0]
			ch <- prometheus.MustNewConstMetric(allocActivityDesc, prometheus.GaugeValue, sm, h.Namespace, h.Pod, h.Container, lv[0], lv[1], lv[2], lv[3], lv[4])
		}
		if !d.Up {
			continue
		}
		du := st.Usage.Device(key)
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
					if cu.Holding && !smAlone {
						ch <- prometheus.MustNewConstMetric(allocActivityDesc, prometheus.GaugeValue, v, cl...)
					}
				}
			}
			continue
		}
		if len(holders) != 1 || a.SharedGPUInstance[key] {
			// Shared devices without process accounting: per-container use
			// is unknown, so absent rather than duplicated; a compute
			// instance's figures are its GPU instance's, not its holder's.
			continue
		}
		h := holders[0]
		cl := []string{h.Namespace, h.Pod, h.Container, lv[0], lv[1], lv[2], lv[3], lv[4]}
		if v, ok := d.Values.Get(sample.FieldMemoryUsed); ok {
			ch <- prometheus.MustNewConstMetric(containerMemDesc, prometheus.GaugeValue, v, cl...)
		}
		if v, src, ok := containerActivity(nil, d, nil); ok {
			ch <- prometheus.MustNewConstMetric(containerUtilDesc, prometheus.GaugeValue, v, append(cl, src)...)
			if !smAlone {
				ch <- prometheus.MustNewConstMetric(allocActivityDesc, prometheus.GaugeValue, v, cl...)
			}
		}
		if smOK {
			ch <- prometheus.MustNewConstMetric(containerSMDesc, prometheus.GaugeValue, sm, cl...)
		}
	}
	if a.Known {
		for name, nd := range ns {
			ch <- prometheus.MustNewConstMetric(nsAllocatedDesc, prometheus.GaugeValue, nd.allocated, name)
			if nd.anyMeasured {
				// None where no device it holds has a busy ratio (MIG
				// devices only): 0 of 0 is no utilization, not 0%.
				ch <- prometheus.MustNewConstMetric(nsBusyDesc, prometheus.GaugeValue, nd.busy, name)
				ch <- prometheus.MustNewConstMetric(nsMeasuredDesc, prometheus.GaugeValue, nd.measured, name)
			}
		}
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(free), "free")
		ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(allocated), "allocated")
		shared.collect(ch)
		if st.Sample != nil {
			for i := range st.Sample.GPUs {
				if g := &st.Sample.GPUs[i]; !held[g.GPU] {
					ch <- prometheus.MustNewConstMetric(unheldGPUDesc, prometheus.GaugeValue, 1, strconv.Itoa(g.GPU), g.UUID)
				}
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(devicesDesc, prometheus.GaugeValue, float64(unhealthy), "unhealthy")
	ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, float64(healthy))
	if a.AllocatableUnits != nil {
		ch <- prometheus.MustNewConstMetric(allocatableHealthyDesc, prometheus.GaugeValue, float64(allocatableHealthy))
	}
	for r, n := range a.Allocatable {
		ch <- prometheus.MustNewConstMetric(allocatableDesc, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range a.FreeIDs {
		ch <- prometheus.MustNewConstMetric(freeIDsDesc, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range a.Unmatched {
		ch <- prometheus.MustNewConstMetric(unmatchedDesc, prometheus.GaugeValue, float64(n), r)
	}
}

// sharedDevices are the whole GPUs and GPU instances several containers
// hold, in unit order: their holders (a GPU instance's are those of all its
// compute instances) and their memory (a GPU instance's, which each of its
// compute instances reports). The shared-device alerts read these few
// series instead of counting every device's holders and reading every
// device's memory.
type sharedDevices struct {
	list []*sharedDevice
	by   map[sharedKey]*sharedDevice
}

type sharedKey struct{ gpu, gpuInstance int }

type sharedDevice struct {
	labels        []string
	holders       int
	used, total   float64
	usedOK, totOK bool
}

func (s *sharedDevices) add(key sample.UnitKey, d *sample.DeviceState, holders int) {
	k := sharedKey{key.GPU, key.GPUInstance}
	sd := s.by[k]
	if sd == nil {
		if s.by == nil {
			s.by = map[sharedKey]*sharedDevice{}
		}
		lv := labelValues(d)
		sd = &sharedDevice{labels: lv[:3]}
		s.by[k] = sd
		s.list = append(s.list, sd)
	}
	sd.holders += holders
	if v, ok := d.Values.Get(sample.FieldMemoryUsed); ok && (!sd.usedOK || v > sd.used) {
		sd.used, sd.usedOK = v, true
	}
	if v, ok := d.Values.Get(sample.FieldMemoryTotal); ok && (!sd.totOK || v > sd.total) {
		sd.total, sd.totOK = v, true
	}
}

func (s *sharedDevices) collect(ch chan<- prometheus.Metric) {
	for _, sd := range s.list {
		if sd.holders < 2 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(sharedHoldersDesc, prometheus.GaugeValue, float64(sd.holders), sd.labels...)
		if sd.usedOK {
			ch <- prometheus.MustNewConstMetric(sharedMemUsedDesc, prometheus.GaugeValue, sd.used, sd.labels...)
		}
		if sd.totOK {
			ch <- prometheus.MustNewConstMetric(sharedMemTotalDesc, prometheus.GaugeValue, sd.total, sd.labels...)
		}
	}
}

// namespaceDevices are a namespace's figures on the node: the devices its
// containers hold (a device's n holders 1/n each), their NVML busy ratio
// weighted alike, and how many of them have one. The rules' namespace
// figures read these few series per node instead of joining every
// holder's series with every device's busy ratio.
type namespaceDevices struct {
	allocated, busy, measured float64
	anyMeasured               bool
}

// Sources of gpu_container_utilization_ratio.
const (
	sourceDevice    = "device"         // the held whole GPU's NVML busy ratio
	sourceDCGM      = "dcgm_sm_active" // DCGM SM activity (MIG instances; landing page only)
	sourceProcesses = "processes"      // the container's own processes (NVML per-process SM utilization)
)

// containerActivity is gpu_container_utilization_ratio and its source: on
// a shared unit the container's own processes (absent where NVML has no
// per-process utilization), on a unit held alone the device's figure.
func containerActivity(du *state.DeviceUsage, d *sample.DeviceState, cu *state.ContainerUse) (float64, string, bool) {
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
func statusActivity(du *state.DeviceUsage, d *sample.DeviceState, cu *state.ContainerUse) (float64, string, bool) {
	if v, src, ok := containerActivity(du, d, cu); ok || (du != nil && du.Shared) {
		return v, src, ok
	}
	if v, ok := d.Values.Get(sample.FieldSMActive); ok {
		return v, sourceDCGM, true
	}
	return 0, "", false
}
