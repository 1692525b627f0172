package simnode

import (
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakedcgm"
)

// DCGM returns a fake DCGM host engine for the node: profiling fields per
// GPU, per MIG GPU instance and per MIG compute instance, derived from the
// workload curves, so that the simulated node shows what a DCGM node shows. Like
// DCGM, it lists every compute instance as an entity of its own, and the
// compute instances of one GPU instance each have their own activity.
func (n *Node) DCGM() *fakedcgm.Fake {
	var devs []fakedcgm.SimDevice
	for _, d := range n.devices {
		sd := fakedcgm.SimDevice{GPU: d.index, UUID: d.UUID()}
		for _, m := range d.migs {
			if m.ci == 0 {
				sd.GPUInstances = append(sd.GPUInstances, m.gi)
			}
			if sd.ComputeInstances == nil {
				sd.ComputeInstances = map[int][]int{}
			}
			sd.ComputeInstances[m.gi] = append(sd.ComputeInstances[m.gi], m.ci)
		}
		devs = append(devs, sd)
	}
	f := fakedcgm.NewSimulated(devs, n.activity)
	f.SetClock(func() time.Time { return n.now() })
	f.SetHealthSource(n.dcgmHealth)
	return f
}

// dcgmHealth is DCGM's health watch of a GPU now, from dcgmHealth faults.
func (n *Node) dcgmHealth(uuid string) map[string]string {
	for _, d := range n.devices {
		if d.UUID() == uuid {
			return n.faultsAt(d.index, n.elapsed()).dcgmHealth
		}
	}
	return nil
}

// activity is SM activity: the workload's smActive curve where the scenario
// sets one, else its busy ratio a bit lower, as SM activity trails NVML's
// coarse "a kernel ran" figure. A compute instance has its own; a GPU
// instance's is the mean over its compute instances (they hold equal shares
// of its SMs).
func (n *Node) activity(gpu, gi, ci int) (float64, bool) {
	if gpu < 0 || gpu >= len(n.devices) {
		return 0, false
	}
	d := n.devices[gpu]
	t := n.elapsed()
	if f := n.faultsAt(gpu, t); f.lost || f.hang {
		return 0, false
	}
	if gi < 0 {
		if c := d.workload.smActive; c != nil && len(d.migs) == 0 && !d.hasProcs {
			return c.at(n.Scenario, d.key("sm_active"), t), true
		}
		return 0.85 * d.utilAt(t), true
	}
	smActive := func(m *MIGDevice) float64 {
		if c := m.workload.smActive; c != nil {
			return c.at(n.Scenario, m.key("sm_active"), t)
		}
		return 0.85 * m.utilAt(t)
	}
	var sum float64
	k := 0
	for _, m := range d.migs {
		if m.gi != gi {
			continue
		}
		if ci >= 0 && m.ci == ci {
			return smActive(m), true
		}
		sum += smActive(m)
		k++
	}
	if ci >= 0 || k == 0 {
		return 0, false
	}
	return sum / float64(k), true
}
