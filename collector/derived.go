package collector

import (
	"strconv"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
)

// DerivedConfig configures the gauges computed from a sample and its
// allocations: idle allocations, their price, and fragmentation.
type DerivedConfig struct {
	Idle   fragmentation.IdleConfig
	Prices *fragmentation.PriceList // nil: nothing is priced
	Shapes []fragmentation.Shape
}

// Derived is what one sample's derived gauges are.
type Derived struct {
	Idle         []fragmentation.IdleStatus
	IdleDevices  int
	Frag         fragmentation.Result
	Prices       map[DeviceKey]float64 // $/hour per schedulable unit
	HasTopology  bool
	IdleResource map[fragmentation.HolderKey]string
}

// idleActivity is what idleness is judged on: DCGM's SM activity where
// present (it sees kernels that barely use the GPU), else NVML's busy ratio.
func idleActivity(d *sample.DeviceState) (float64, bool) {
	if v, ok := d.Values.Get(sample.FieldSMActive); ok {
		return v, true
	}
	return d.Values.Get(sample.FieldUtilization)
}

// computeDerived runs the idle tracker and the fragmentation model.
func computeDerived(cfg *DerivedConfig, tracker *fragmentation.IdleTracker, s *sample.NodeSample, a *Allocations, u *Usage, now time.Time) *Derived {
	d := &Derived{Prices: map[DeviceKey]float64{}}
	var obs []fragmentation.Observation
	eachUnit(s, func(dev *sample.DeviceState, key DeviceKey, _ bool) {
		for _, h := range a.ByDevice[key] {
			act, known := holderIdleActivity(u, dev, key, h)
			if !dev.Up {
				known = false
			}
			obs = append(obs, fragmentation.Observation{
				Key:      fragmentation.HolderKey{Namespace: h.Namespace, Pod: h.Pod, Container: h.Container, Resource: h.Resource, GPU: key.GPU, GPUInstance: key.GPUInstance, ComputeInstance: key.ComputeInstance},
				Activity: act, Known: known,
			})
		}
		if cfg.Prices != nil {
			if price, ok := cfg.Prices.Lookup(dev.Model); ok {
				if dev.IsMIG() {
					if g := gpuOf(s, key.GPU); g != nil && g.MIGLayout != nil {
						if pl, ok := g.MIGLayout.Instances[dev.GPUInstance]; ok {
							// Placements are in memory slices (8 on A100/H100);
							// the share is in compute slices, NVML's SliceCount.
							price = fragmentation.SliceShare(price, pl.Slices, g.MIGLayout.TotalSlices)
							// Compute instances of one GPU instance split its
							// price: the GPU instance is priced once.
							if n := computeInstances(g, dev.GPUInstance); n > 1 {
								price /= float64(n)
							}
						}
					}
				}
				d.Prices[key] = price
			}
		}
	})
	if tracker != nil {
		d.Idle = tracker.Observe(now, obs)
		d.IdleDevices = fragmentation.IdleDevices(d.Idle)
	}
	d.Frag = fragmentation.Compute(fragInput(s, a), cfg.Shapes)
	return d
}

// computeInstances counts the MIG devices of GPU instance gi on g.
func computeInstances(g *sample.GPUState, gi int) int {
	n := 0
	for i := range g.MIG {
		if g.MIG[i].GPUInstance == gi {
			n++
		}
	}
	return n
}

func gpuOf(s *sample.NodeSample, gpu int) *sample.GPUState {
	for i := range s.GPUs {
		if s.GPUs[i].GPU == gpu {
			return &s.GPUs[i]
		}
	}
	return nil
}

// fragInput turns the sample and its allocations into the model's input.
func fragInput(s *sample.NodeSample, a *Allocations) []fragmentation.GPU {
	out := make([]fragmentation.GPU, 0, len(s.GPUs))
	shared := a.sharedFree()
	for i := range s.GPUs {
		g := &s.GPUs[i]
		fg := fragmentation.GPU{Index: g.GPU, UUID: g.UUID, Healthy: healthy(g), NVLinkDomain: -1, NUMANode: -1,
			SharedFree: shared[gpuKey(g.GPU)]}
		fg.MemoryTotal = usableMemory(&g.Values)
		fg.MemoryUsed, _ = g.Values.Get(sample.FieldMemoryUsed)
		if g.Health.NVLinkActive > 0 {
			// GPUs with NVLinks up sit on one NVSwitch baseboard (HGX/DGX):
			// one domain. NVLink-bridged PCIe pairs would need topology
			// queries this does not make; they count as one domain too.
			fg.NVLinkDomain = 0
		}
		if g.Health.NUMANode.OK {
			fg.NUMANode = g.Health.NUMANode.V
		}
		if g.MIGEnabled && g.MIGLayout != nil {
			l := g.MIGLayout
			ms := &fragmentation.MIGState{TotalSlices: l.TotalSlices}
			for _, p := range l.Profiles {
				mp := fragmentation.MIGProfile{Name: p.Name, Slices: p.Slices, MaxInstances: p.MaxInstances, MemoryBytes: p.MemoryBytes}
				for _, pl := range p.Placements {
					mp.Placements = append(mp.Placements, fragmentation.Placement{Start: int(pl.Start), Size: int(pl.Size)})
				}
				ms.Profiles = append(ms.Profiles, mp)
			}
			// One entry per GPU instance: its compute instances are MIG
			// devices of their own (units to allocate) that share its
			// slices and memory.
			byGI := map[int]int{}
			for _, m := range g.MIG {
				pl, ok := l.Instances[m.GPUInstance]
				if !ok {
					continue
				}
				held := len(a.ByDevice[migKey(g.GPU, &m)]) > 0
				if j, ok := byGI[m.GPUInstance]; ok {
					mi := &ms.Instances[j]
					mi.ComputeInstances++
					if held {
						mi.AllocatedUnits++
						mi.Allocated = true
					}
					continue
				}
				mi := fragmentation.MIGInstance{Profile: pl.Profile, Start: pl.Start, Size: pl.Size, Slices: pl.Slices,
					ComputeInstances: 1, Allocated: held}
				if held {
					mi.AllocatedUnits = 1
				}
				mi.MemoryTotal = usableMemory(&m.Values)
				mi.MemoryUsed, _ = m.Values.Get(sample.FieldMemoryUsed)
				byGI[m.GPUInstance] = len(ms.Instances)
				ms.Instances = append(ms.Instances, mi)
			}
			fg.MIG = ms
		} else {
			fg.Allocated = len(a.ByDevice[gpuKey(g.GPU)]) > 0
		}
		out = append(out, fg)
	}
	return out
}

var (
	idleDesc = prometheus.NewDesc("gpu_allocation_idle",
		"1 if the holder's device stayed below the idle threshold for the whole idle window (--idle.threshold, --idle.window).", allocLabels, nil)
	idleSecondsDesc = prometheus.NewDesc("gpu_allocation_idle_seconds_total",
		"Seconds the holder's device has been idle while held, counted once the idle window is met; like every counter here it never falls: a holder with the same labels within an hour goes on from its last value.", allocLabels, nil)
	idleDevicesDesc = prometheus.NewDesc("gpu_idle_allocated_devices",
		"Allocated devices all of whose holders are idle.", nil, nil)
	priceDesc = prometheus.NewDesc("gpu_price_dollars_per_hour",
		"Configured on-demand price of the device per hour (a MIG instance by its share of slices); only when a price list is configured.",
		[]string{"gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance", "model"}, nil)
	strandedDesc = prometheus.NewDesc("gpu_memory_stranded_bytes",
		"Free VRAM on allocated devices: under whole-device scheduling no other pod can use it.", nil, nil)
	largestGroupDesc = prometheus.NewDesc("gpu_free_devices_largest_group",
		"Largest set of free, healthy whole GPUs sharing one NVLink domain or NUMA node: the biggest multi-GPU job that still fits well.",
		[]string{"domain"}, nil)
	migFreeSlicesDesc = prometheus.NewDesc("gpu_mig_free_slices",
		"MIG slices of the GPU not covered by any GPU instance.", []string{"gpu", "uuid"}, nil)
	migPlaceableDesc = prometheus.NewDesc("gpu_mig_placeable_instances",
		"How many more GPU instances of the profile fit in the free slices (each profile on its own).", []string{"gpu", "uuid", "mig_profile"}, nil)
	migLargestDesc = prometheus.NewDesc("gpu_mig_largest_placeable_slices",
		"Slices of the largest MIG profile that can still be placed on the GPU.", []string{"gpu", "uuid"}, nil)
	fragDesc = prometheus.NewDesc("gpu_fragmentation_gpus",
		"Weng et al. (ATC'23) fragmentation F_n(m): unallocated GPU capacity (in GPUs) that a task of this shape cannot use on this node.",
		[]string{"shape"}, nil)
	fittingDesc = prometheus.NewDesc("gpu_fitting_jobs",
		"How many more jobs of the task shape (--fragmentation.shapes) fit on this node now, each shape on its own: free whole GPUs over the shape's GPUs, or the MIG instances of its profile that are free or can be created.",
		[]string{"shape"}, nil)
	fragWeightedDesc = prometheus.NewDesc("gpu_fragmentation_weighted_gpus",
		"Fragmentation F_n(M): F_n(m) weighted by the popularity of each task shape (--fragmentation.shapes).", nil, nil)
	unallocatedDesc = prometheus.NewDesc("gpu_unallocated_capacity_gpus",
		"Unallocated capacity of healthy GPUs, in GPUs (a free MIG slice counts its share).", nil, nil)
)

func collectDerived(st *State, ch chan<- prometheus.Metric) {
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
		lv := unitLabels(s, DeviceKey{k.GPU, k.GPUInstance, k.ComputeInstance})
		if lv == nil {
			continue
		}
		labels := []string{lv[0], lv[1], lv[2], lv[3], lv[4], k.Namespace, k.Pod, k.Container, k.Resource}
		ch <- prometheus.MustNewConstMetric(idleDesc, prometheus.GaugeValue, b2f(is.Idle), labels...)
		ch <- prometheus.MustNewConstMetric(idleSecondsDesc, prometheus.CounterValue, is.IdleSeconds, labels...)
	}
	known := st.Allocations != nil && st.Allocations.Known
	if known {
		ch <- prometheus.MustNewConstMetric(idleDevicesDesc, prometheus.GaugeValue, float64(d.IdleDevices))
	}
	eachUnit(s, func(dev *sample.DeviceState, key DeviceKey, _ bool) {
		if p, ok := d.Prices[key]; ok {
			lv := labelValues(dev)
			ch <- prometheus.MustNewConstMetric(priceDesc, prometheus.GaugeValue, p, lv[0], lv[1], lv[2], lv[3], lv[4], dev.Model)
		}
	})
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

// unitLabels are the device labels of a GPU or MIG instance of the sample.
func unitLabels(s *sample.NodeSample, k DeviceKey) []string {
	g := gpuOf(s, k.GPU)
	if g == nil {
		return nil
	}
	if k.GPUInstance < 0 {
		return labelValues(&g.DeviceState)
	}
	for j := range g.MIG {
		if migKey(k.GPU, &g.MIG[j]) == k {
			return labelValues(&g.MIG[j])
		}
	}
	return nil
}

// usableMemory is the memory pods can allocate: the total less what the
// driver reserves for itself (known from NVML memory v2).
func usableMemory(v *sample.Values) float64 {
	total, _ := v.Get(sample.FieldMemoryTotal)
	reserved, _ := v.Get(sample.FieldMemoryReserved)
	return total - reserved
}
