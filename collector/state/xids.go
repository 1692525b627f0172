package state

import (
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// joinXIDs puts the XID reader's counts, coverage and the ECC events of
// the sample's GPUs into st.
func joinXIDs(st *State, r *xid.Reader) {
	s := st.Sample
	st.XIDs = r.Counter().Snapshot()
	st.XIDLast = r.Counter().LastPerDevice()
	st.XIDRecent = r.Counter().Recent()
	st.XIDInstances = migXIDs(s, r.InstanceCounts())
	st.ECCEvents = make([]xid.ECCEventCount, len(s.GPUs))
	for i, g := range s.GPUs {
		st.ECCEvents[i] = r.ECCEvents(g.GPU)
	}
	supported := !r.Unsupported()
	st.XIDEventsSupported = &supported
	st.Collectors = append(st.Collectors, CollectorStatus{Name: "xid", Up: r.Up() || !supported})
	st.XIDOn, st.XIDUp = true, r.Up()
	st.XIDCoverage = r.Coverage()
	st.XIDUncoveredSeconds = r.UncoveredSeconds()
}

// migXIDs are the per-MIG-device XID counts as served: those of the MIG
// devices the sample shows, and those no device could be named for (kept
// with NVML's IDs). A destroyed device's count leaves with it: the GPU and
// compute instance IDs of a new instance created in its place are not its
// identity.
func migXIDs(s *sample.NodeSample, in []xid.InstanceCount) []xid.InstanceCount {
	present := map[string]bool{}
	for i := range s.GPUs {
		for j := range s.GPUs[i].MIG {
			present[s.GPUs[i].MIG[j].MIGUUID] = true
		}
	}
	out := in[:0:0]
	for _, x := range in {
		if x.MIGUUID == "" || present[x.MIGUUID] {
			out = append(out, x)
		}
	}
	return out
}
