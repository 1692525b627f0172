package state

import (
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// eccWatch remembers, per GPU (by UUID), the last volatile uncorrected ECC
// count and when it last grew; a Joiner's own, used one sample at a time.
type eccWatch struct {
	gpus map[string]*eccWatchGPU
}

type eccWatchGPU struct {
	last uint64
	seen bool
	grew time.Time
}

// ECCIncrease is a GPU whose uncorrected ECC count grew while the exporter
// ran, and when it last did.
type ECCIncrease struct {
	GPU  int
	UUID string
	At   time.Time
}

// observe takes one sample's counts and returns every GPU that has grown
// since the exporter started, in sample order. A GPU without a reading
// (lost, ECC off, not supported) keeps what it had.
func (w *eccWatch) observe(s *sample.NodeSample) []ECCIncrease {
	if w.gpus == nil {
		w.gpus = map[string]*eccWatchGPU{}
	}
	var out []ECCIncrease
	for i := range s.GPUs {
		g := &s.GPUs[i]
		st := w.gpus[g.UUID]
		if st == nil {
			st = &eccWatchGPU{}
			w.gpus[g.UUID] = st
		}
		if v := g.Health.ECC[1][0]; g.Up && v.OK {
			// A fall is a reset (driver reload, GPU reset): errors since
			// then are new ones.
			if st.seen && (v.V > st.last || (v.V < st.last && v.V > 0)) {
				st.grew = s.Time
			}
			st.last, st.seen = v.V, true
		}
		if !st.grew.IsZero() {
			out = append(out, ECCIncrease{GPU: g.GPU, UUID: g.UUID, At: st.grew})
		}
	}
	return out
}
