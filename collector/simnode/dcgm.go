package simnode

import (
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
)

// DCGM returns a fake DCGM host engine for the node: profiling fields per
// GPU and per MIG instance, derived from the workload curves, so that
// --simulate shows what a DCGM node shows.
func (n *Node) DCGM() *dcgm.Fake {
	var devs []dcgm.SimDevice
	for _, d := range n.devices {
		sd := dcgm.SimDevice{GPU: d.index, UUID: d.UUID()}
		for _, m := range d.migs {
			sd.GPUInstances = append(sd.GPUInstances, m.gi)
		}
		devs = append(devs, sd)
	}
	f := dcgm.NewSimulated(devs, n.activity)
	f.SetClock(func() time.Time { return n.now() })
	return f
}

// activity is SM activity: the workload's busy ratio, a bit lower, as SM
// activity trails NVML's coarse "a kernel ran" figure.
func (n *Node) activity(gpu, gi int) (float64, bool) {
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
	for _, m := range d.migs {
		if m.gi == gi {
			return 0.85 * m.utilAt(t), true
		}
	}
	return 0, false
}
