package state

import (
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// DCGMSource gives the latest DCGM values without calling DCGM.
type DCGMSource interface {
	Snapshot() *dcgm.Snapshot
}

// XIDSink is a DCGM source that hands the XIDs it records to the XID log
// (dcgm.Sampler does); NewJoiner connects the two, so XIDs flow from source
// to source and the sample pass only reads.
type XIDSink interface {
	SetXIDSink(func(gpu int, uuid string, code int, at time.Time))
}

// dcgmFields maps DCGM's fields to ours. Each of our fields has one
// documented source (the render package's fieldSpecs): DCGM fields are
// never read from NVML, so the merge never has two values to choose from.
var dcgmFields = map[dcgm.Field]sample.Field{
	dcgm.SMActive:       sample.FieldSMActive,
	dcgm.SMOccupancy:    sample.FieldSMOccupancy,
	dcgm.TensorActive:   sample.FieldTensorActive,
	dcgm.DRAMActive:     sample.FieldDRAMActive,
	dcgm.GraphicsActive: sample.FieldGraphicsActive,
	dcgm.FP64Active:     sample.FieldFP64Active,
	dcgm.FP32Active:     sample.FieldFP32Active,
	dcgm.FP16Active:     sample.FieldFP16Active,
	dcgm.PCIeTxBytes:    sample.FieldPCIeTxBytes,
	dcgm.PCIeRxBytes:    sample.FieldPCIeRxBytes,
	dcgm.NVLinkTxBytes:  sample.FieldNVLinkTxBytes,
	dcgm.NVLinkRxBytes:  sample.FieldNVLinkRxBytes,
}

// mergeDCGM adds DCGM's fields and health to the sample's devices, one way:
// nothing flows back into a source. A device NVML reports down gets
// nothing: DCGM values of a lost GPU would be stale.
//
// A MIG device that is its GPU instance's only compute instance gets the GPU
// instance's values. The compute instances of a GPU instance split in
// several get only what DCGM measures for each of them (DCGM's compute
// instance entities: SM, engine and pipe activity), never the GPU
// instance's values: those are the sum of the neighbours' work, which would
// hide an idle holder behind a busy one. DCGM's DRAM ratio, measured for the
// GPU instance only, is therefore absent on them. Byte counters come only
// from whole GPUs (the dcgm sampler takes no GPU-level field from a MIG
// entity), so summing a GPU's series never counts its traffic twice.
func mergeDCGM(snap *dcgm.Snapshot, s *sample.NodeSample) {
	if snap == nil || !snap.Up {
		return
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if !g.Up {
			continue
		}
		if dv, ok := snap.Find(g.UUID, -1); ok {
			setDCGM(&g.DeviceState, dv)
			g.DCGMHealth = dv.Health
		}
		for j := range g.MIG {
			m := &g.MIG[j]
			if !m.Up {
				continue
			}
			var dv dcgm.DeviceValues
			var ok bool
			if g.ComputeInstances(m.GPUInstance) > 1 {
				dv, ok = snap.FindComputeInstance(g.UUID, m.GPUInstance, m.ComputeInstance)
				if _, done := g.DCGMGPUInstances[m.GPUInstance]; !done {
					if gv, found := snap.Find(g.UUID, m.GPUInstance); found {
						if g.DCGMGPUInstances == nil {
							g.DCGMGPUInstances = map[int]sample.Values{}
						}
						var v sample.DeviceState
						setDCGM(&v, gv)
						g.DCGMGPUInstances[m.GPUInstance] = v.Values
					}
				}
			} else {
				dv, ok = snap.Find(g.UUID, m.GPUInstance)
			}
			if ok {
				setDCGM(m, dv)
			}
		}
	}
}

// GPUInstanceDCGM returns d, or where d is a compute instance of a GPU
// instance split into several, a copy of d with the GPU instance's DCGM
// values in place of its own: DCGM's GPU instance entity, which
// dcgm-exporter's families describe.
func GPUInstanceDCGM(g *sample.GPUState, d *sample.DeviceState) *sample.DeviceState {
	v, ok := g.DCGMGPUInstances[d.GPUInstance]
	if !ok || !d.IsMIG() {
		return d
	}
	c := *d
	for _, f := range dcgmFields {
		c.Values.Clear(f)
		c.Rates.Clear(f)
		if x, ok := v.Get(f); ok {
			c.Values.Set(f, x)
		}
	}
	return &c
}

func setDCGM(d *sample.DeviceState, dv dcgm.DeviceValues) {
	for df, f := range dcgmFields {
		if v, ok := dv.Value(df); ok {
			d.Values.Set(f, v)
		}
		if v, ok := dv.Rate(df); ok {
			d.Rates.Set(f, v)
		}
	}
}
