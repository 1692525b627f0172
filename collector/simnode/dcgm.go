package simnode

import (
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
)

// DCGM returns a fake DCGM host engine for the node: profiling fields per
// GPU, per MIG GPU instance and per MIG compute instance, derived from the
// workload curves, so that --simulate shows what a DCGM node shows. Like
// DCGM, it lists every compute instance as an entity of its own, and the
// compute instances of one GPU instance each have their own activity.
func (n *Node) DCGM() *dcgm.Fake {
	var devs []dcgm.SimDevice
	for _, d := range n.devices {
		sd := dcgm.SimDevice{GPU: d.index, UUID: d.UUID()}
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
	f := dcgm.NewSimulated(devs, n.activity)
	f.SetClock(func() time.Time { return n.now() })
	return f
}

// activity is SM activity: the workload's busy ratio, a bit lower, as SM
// activity trails NVML's coarse "a kernel ran" figure. A compute instance
// has its own; a GPU instance's is the mean over its compute instances (they
// hold equal shares of its SMs).
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
		return 0.85 * d.utilAt(t), true
	}
	var sum float64
	k := 0
	for _, m := range d.migs {
		if m.gi != gi {
			continue
		}
		if ci >= 0 && m.ci == ci {
			return 0.85 * m.utilAt(t), true
		}
		sum += m.utilAt(t)
		k++
	}
	if ci >= 0 || k == 0 {
		return 0, false
	}
	return 0.85 * sum / float64(k), true
}
