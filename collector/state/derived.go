package state

import (
	"maps"
	"slices"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// DerivedConfig configures the gauges computed from a sample and its
// allocations: idle allocations, their price, and fragmentation.
type DerivedConfig struct {
	Idle   fragmentation.IdleConfig
	Prices *fragmentation.PriceList // nil: nothing is priced
	Shapes []fragmentation.Shape
}

// withDefaults fills what the zero value leaves to the defaults.
func (c DerivedConfig) withDefaults() DerivedConfig {
	if c.Idle.Threshold == 0 {
		c.Idle.Threshold = fragmentation.DefaultIdleThreshold
	}
	if c.Idle.Window == 0 {
		c.Idle.Window = fragmentation.DefaultIdleWindow
	}
	if c.Shapes == nil {
		c.Shapes = fragmentation.DefaultShapes
	}
	return c
}

// Derived is what one sample's derived gauges are.
type Derived struct {
	Idle         []fragmentation.IdleStatus
	IdleDevices  int
	Frag         fragmentation.Result
	Prices       map[sample.UnitKey]float64 // $/hour per schedulable unit
	HasTopology  bool
	IdleResource map[fragmentation.HolderKey]string
}

// computeDerived runs the idle tracker and the fragmentation model over
// the sample's units.
func computeDerived(cfg *DerivedConfig, tracker *fragmentation.IdleTracker, s *sample.NodeSample, units []sample.Unit, a *Allocations, u *Usage, now time.Time) *Derived {
	d := &Derived{Prices: map[sample.UnitKey]float64{}}
	var obs []fragmentation.Observation
	for _, un := range units {
		dev, key := un.Device, un.Key
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
				if g := un.GPU; dev.IsMIG() && g.MIGLayout != nil {
					if pl, ok := g.MIGLayout.Instances[dev.GPUInstance]; ok {
						// Placements are in memory slices (8 on A100/H100);
						// the share is in compute slices, NVML's SliceCount.
						price = fragmentation.SliceShare(price, pl.Slices, g.MIGLayout.TotalSlices)
						// Compute instances of one GPU instance split its
						// price: the GPU instance is priced once.
						if n := g.ComputeInstances(dev.GPUInstance); n > 1 {
							price /= float64(n)
						}
					}
				}
				d.Prices[key] = price
			}
		}
	}
	if tracker != nil {
		d.Idle = tracker.Observe(now, obs)
		d.IdleDevices = fragmentation.IdleDevices(d.Idle)
	}
	d.Frag = fragmentation.Compute(fragInput(s, a), cfg.Shapes)
	return d
}

// idleActivity is what idleness is judged on: DCGM's SM activity where
// present (it sees kernels that barely use the GPU), else NVML's busy ratio.
func idleActivity(d *sample.DeviceState) (float64, bool) {
	if v, ok := d.Values.Get(sample.FieldSMActive); ok {
		return v, true
	}
	return d.Values.Get(sample.FieldUtilization)
}

// holderIdleActivity is what a holder's idleness is judged on: on a shared
// unit its own processes' SM utilization where NVML gives it, else the
// device's activity (an idle device means every holder is idle; a busy one
// keeps them all from counting as idle, which is the safe side).
func holderIdleActivity(u *Usage, d *sample.DeviceState, key sample.UnitKey, h Holder) (float64, bool) {
	if du := u.Device(key); du != nil && du.Shared {
		if cu := du.Container(h); cu != nil && cu.Use.SMKnown {
			return cu.Use.SM, true
		}
	}
	return idleActivity(d)
}

// fragInput turns the sample and its allocations into the model's input.
func fragInput(s *sample.NodeSample, a *Allocations) []fragmentation.GPU {
	out := make([]fragmentation.GPU, 0, len(s.GPUs))
	shared := a.sharedFree()
	for i := range s.GPUs {
		g := &s.GPUs[i]
		fg := fragmentation.GPU{Index: g.GPU, UUID: g.UUID, Healthy: g.Healthy(), NVLinkDomain: -1, NUMANode: -1,
			SharedFree: shared[sample.GPUKey(g.GPU)]}
		fg.MemoryTotal = g.UsableMemory()
		fg.MemoryUsed, _ = g.Values.Get(sample.FieldMemoryUsed)
		if g.Health.NVLinkActive.V > 0 {
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
			// One entry per GPU instance of the layout NVML reports (its
			// placement): its compute instances are MIG devices of their
			// own (units to allocate) that share its slices and memory, and
			// one created without a compute instance has none, yet holds
			// its slices.
			for _, gi := range slices.Sorted(maps.Keys(l.Instances)) {
				pl := l.Instances[gi]
				mi := fragmentation.MIGInstance{Profile: pl.Profile, Start: pl.Start, Size: pl.Size, Slices: pl.Slices}
				for j := range g.MIG {
					m := &g.MIG[j]
					if m.GPUInstance != gi {
						continue
					}
					if mi.ComputeInstances == 0 {
						mi.MemoryTotal = m.UsableMemory()
						mi.MemoryUsed, _ = m.Values.Get(sample.FieldMemoryUsed)
					}
					mi.ComputeInstances++
					if len(a.ByDevice[sample.MIGKey(g.GPU, m)]) > 0 {
						mi.AllocatedUnits++
						mi.Allocated = true
					}
				}
				mi.NoComputeInstances = mi.ComputeInstances == 0
				ms.Instances = append(ms.Instances, mi)
			}
			fg.MIG = ms
		} else {
			fg.Allocated = len(a.ByDevice[sample.GPUKey(g.GPU)]) > 0
		}
		out = append(out, fg)
	}
	return out
}
