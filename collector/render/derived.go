package render

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
)

var (
	idleDesc = groupDesc(GroupIdle, "gpu_allocation_idle",
		"1 if the holder's device stayed below the idle threshold for the whole idle window (--idle.threshold, --idle.window).", allocLabels)
	idleSecondsDesc = groupDesc(GroupIdle, "gpu_allocation_idle_seconds_total",
		"Seconds the holder's device has been idle while held, counted once the idle window is met; like every counter here it never falls: a holder with the same labels within an hour goes on from its last value.", allocLabels)
	idleDevicesDesc = groupDesc(GroupIdle, "gpu_idle_allocated_devices",
		"Allocated devices all of whose holders are idle.", nil)
	priceDesc = groupDesc(GroupIdle, "gpu_price_dollars_per_hour",
		"Configured on-demand price of the device per hour (a MIG instance by its share of slices); only when a price list is configured.",
		[]string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance", "model"})
	strandedDesc = groupDesc(GroupFragmentation, "gpu_memory_stranded_bytes",
		"Free VRAM on allocated devices: under whole-device scheduling no other pod can use it.", nil)
	largestGroupDesc = groupDesc(GroupFragmentation, "gpu_free_devices_largest_group",
		"Largest set of free, healthy whole GPUs sharing one NVLink domain or NUMA node: the biggest multi-GPU job that still fits well.",
		[]string{"domain"})
	migFreeSlicesDesc = groupDesc(GroupFragmentation, "gpu_mig_free_slices",
		"MIG slices of the GPU not covered by any GPU instance.", []string{"gpu", "uuid"})
	migPlaceableDesc = groupDesc(GroupDetails, "gpu_mig_placeable_instances",
		"How many more GPU instances of the profile fit in the free slices (each profile on its own).", []string{"gpu", "uuid", "mig_profile"})
	migLargestDesc = groupDesc(GroupFragmentation, "gpu_mig_largest_placeable_slices",
		"Slices of the largest MIG profile that can still be placed on the GPU.", []string{"gpu", "uuid"})
	fragDesc = groupDesc(GroupFragmentation, "gpu_fragmentation_gpus",
		"Weng et al. (ATC'23) fragmentation F_n(m): unallocated GPU capacity (in GPUs) that a task of this shape cannot use on this node.",
		[]string{"shape"})
	fittingDesc = groupDesc(GroupFragmentation, "gpu_fitting_jobs",
		"How many more jobs of the task shape (--fragmentation.shapes) fit on this node now, each shape on its own: free whole GPUs over the shape's GPUs, or the MIG instances of its profile that are free or can be created.",
		[]string{"shape"})
	fragWeightedDesc = groupDesc(GroupFragmentation, "gpu_fragmentation_weighted_gpus",
		"Fragmentation F_n(M): F_n(m) weighted by the popularity of each task shape (--fragmentation.shapes).", nil)
	unallocatedDesc = groupDesc(GroupFragmentation, "gpu_unallocated_capacity_gpus",
		"Unallocated capacity of healthy GPUs, in GPUs (a free MIG slice counts its share).", nil)
)

// collectDerived renders idle allocations, prices and fragmentation.
func collectDerived(st *state.State, ch chan<- prometheus.Metric) {
	d := st.Derived
	if d == nil {
		return
	}
	s := st.Sample
	for _, is := range d.Idle {
		if !is.Known {
			continue // neither idle nor busy: left out rather than "not idle"
		}
		k := is.Key
		dev := s.UnitDevice(sample.UnitKey{GPU: k.GPU, GPUInstance: k.GPUInstance, ComputeInstance: k.ComputeInstance})
		if dev == nil {
			continue
		}
		lv := labelValues(dev)
		labels := []string{lv[0], lv[1], lv[2], lv[3], lv[4], k.Namespace, k.Pod, k.Container, k.Resource}
		ch <- prometheus.MustNewConstMetric(idleDesc, prometheus.GaugeValue, b2f(is.Idle), labels...)
		ch <- prometheus.MustNewConstMetric(idleSecondsDesc, prometheus.CounterValue, is.IdleSeconds, labels...)
	}
	known := st.Allocations != nil && st.Allocations.Known
	if known {
		ch <- prometheus.MustNewConstMetric(idleDevicesDesc, prometheus.GaugeValue, float64(d.IdleDevices))
	}
	for _, u := range st.Units {
		if p, ok := d.Prices[u.Key]; ok {
			lv := labelValues(u.Device)
			ch <- prometheus.MustNewConstMetric(priceDesc, prometheus.GaugeValue, p, lv[0], lv[1], lv[2], lv[3], lv[4], u.Device.Model)
		}
	}
	f := &d.Frag
	// MIG slices and placements depend on the GPU instances only.
	for _, m := range f.MIG {
		gpu := strconv.Itoa(m.GPU)
		ch <- prometheus.MustNewConstMetric(migFreeSlicesDesc, prometheus.GaugeValue, float64(m.FreeSlices), gpu, m.UUID)
		ch <- prometheus.MustNewConstMetric(migLargestDesc, prometheus.GaugeValue, float64(m.LargestPlaceableSlices), gpu, m.UUID)
		for prof, n := range m.Placeable {
			ch <- prometheus.MustNewConstMetric(migPlaceableDesc, prometheus.GaugeValue, float64(n), gpu, m.UUID, prof)
		}
	}
	if !known {
		// Who holds what is unknown: free capacity, stranded VRAM and
		// fragmentation would all say "everything is free".
		return
	}
	ch <- prometheus.MustNewConstMetric(strandedDesc, prometheus.GaugeValue, f.StrandedMemoryBytes)
	for dom, n := range f.LargestFreeGroup {
		ch <- prometheus.MustNewConstMetric(largestGroupDesc, prometheus.GaugeValue, float64(n), dom)
	}
	for shape, v := range f.PerShape {
		ch <- prometheus.MustNewConstMetric(fragDesc, prometheus.GaugeValue, v, shape)
	}
	for shape, n := range f.Fitting {
		ch <- prometheus.MustNewConstMetric(fittingDesc, prometheus.GaugeValue, float64(n), shape)
	}
	ch <- prometheus.MustNewConstMetric(fragWeightedDesc, prometheus.GaugeValue, f.Weighted)
	ch <- prometheus.MustNewConstMetric(unallocatedDesc, prometheus.GaugeValue, f.UnallocatedGPUs)
}
