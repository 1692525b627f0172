package state

import (
	"cmp"
	"slices"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// joinXIDs puts the XID reader's counts, coverage and the ECC events of
// the sample's GPUs into st.
func joinXIDs(st *State, r *xid.Reader) {
	s := st.Sample
	st.XIDs = r.Counter().Snapshot()
	st.XIDLast = r.Counter().LastPerDevice()
	st.XIDInstances = spreadInstanceXIDs(s, r.InstanceCounts())
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

// spreadInstanceXIDs are the per-MIG-device XID counts as served: an XID
// NVML attributes to a GPU instance but to none of its compute instances is
// added to each compute instance the sample shows in that GPU instance (a
// GPU instance not split has one), so that it joins the allocation of every
// pod on the GPU instance; only a GPU instance the sample no longer shows
// keeps compute_instance "" (-1). The result is ordered like
// xid.Reader.InstanceCounts.
func spreadInstanceXIDs(s *sample.NodeSample, in []xid.InstanceCount) []xid.InstanceCount {
	type key struct {
		gpu      int
		uuid     string
		instance xid.Instance
		code     int
	}
	var out []xid.InstanceCount
	at := map[key]int{}
	add := func(x xid.InstanceCount, ci int) {
		x.Instance.ComputeInstance = ci
		k := key{x.GPU, x.UUID, x.Instance, x.Code}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, x)
			return
		}
		out[i].Total += x.Total
		if x.Last.After(out[i].Last) {
			out[i].Last = x.Last
		}
	}
	for _, x := range in {
		if x.Instance.ComputeInstance >= 0 {
			add(x, x.Instance.ComputeInstance)
			continue
		}
		spread := false
		for i := range s.GPUs {
			g := &s.GPUs[i]
			if (x.UUID != "" && g.UUID != x.UUID) || (x.UUID == "" && g.GPU != x.GPU) {
				continue
			}
			for j := range g.MIG {
				if g.MIG[j].GPUInstance == x.Instance.GPUInstance {
					add(x, g.MIG[j].ComputeInstance)
					spread = true
				}
			}
		}
		if !spread {
			add(x, -1)
		}
	}
	slices.SortFunc(out, func(a, b xid.InstanceCount) int {
		return cmp.Or(cmp.Compare(a.GPU, b.GPU), cmp.Compare(a.UUID, b.UUID),
			cmp.Compare(a.Instance.GPUInstance, b.Instance.GPUInstance),
			cmp.Compare(a.Instance.ComputeInstance, b.Instance.ComputeInstance), cmp.Compare(a.Code, b.Code))
	})
	return out
}
