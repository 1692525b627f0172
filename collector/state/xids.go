package state

import (
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

// joinXIDs puts the XID reader's counts, coverage and the ECC events of
// the sample's GPUs into st. Counts and registrations follow each GPU by
// UUID to its index in this sample: after a re-init that lists fewer or
// more GPUs the indices move, and a count kept under the index it had
// when it was counted would name another board.
func joinXIDs(st *State, r *xid.Reader) {
	s := st.Sample
	boards := make([]xid.Board, len(s.GPUs))
	index := map[string]int{}
	for i, g := range s.GPUs {
		boards[i] = xid.Board{GPU: g.GPU, UUID: g.UUID, Up: g.Up}
		if g.UUID != "" {
			index[g.UUID] = g.GPU
		}
	}
	r.Follow(boards)
	st.XIDs = currentXIDCounts(r.Counter().Snapshot(), index)
	st.XIDLast = currentXIDLast(r.Counter().LastPerDevice(), index)
	st.XIDRecent = currentRecentXIDs(r.Counter().Recent(), index)
	st.XIDInstances = currentInstanceXIDs(migXIDs(s, r.InstanceCounts()), index)
	st.ECCEvents = make([]xid.ECCEventCount, len(s.GPUs))
	for i, g := range s.GPUs {
		st.ECCEvents[i] = r.ECCEvents(g.GPU, g.UUID)
	}
	supported := !r.Unsupported()
	st.XIDEventsSupported = &supported
	st.Collectors = append(st.Collectors, CollectorStatus{Name: "xid", Up: r.Up() || !supported})
	st.XIDOn, st.XIDUp = true, r.Up()
	st.XIDCoverage = sampleCoverage(s, r.Coverage())
	st.XIDUncoveredSeconds = r.UncoveredSeconds()
}

// sampleCoverage is the set's coverage per GPU of the sample, matched by
// UUID (by index for a GPU that never told its UUID): every GPU on the page
// has its registration, 0 when the set has no registered slot for it (a
// GPU NVML no longer lists, one the set was created without). Nil when the
// source cannot tell.
func sampleCoverage(s *sample.NodeSample, set []xid.Coverage) []xid.Coverage {
	if set == nil {
		return nil
	}
	out := make([]xid.Coverage, 0, len(s.GPUs))
	for _, g := range s.GPUs {
		c := xid.Coverage{GPU: g.GPU, UUID: g.UUID}
		for _, x := range set {
			if (g.UUID != "" && x.UUID == g.UUID) || (g.UUID == "" && x.UUID == "" && x.GPU == g.GPU) {
				c.Registered = c.Registered || x.Registered
				c.Unsupported = c.Unsupported || x.Unsupported
				c.Types |= x.Types
			}
		}
		out = append(out, c)
	}
	return out
}

// currentXIDCounts serves each count under its GPU's index now; counts of
// one board taken under two indices (before and after a move) are one.
func currentXIDCounts(in []xid.Count, index map[string]int) []xid.Count {
	type key struct {
		gpu  int
		uuid string
		code int
	}
	at := map[key]int{}
	out := in[:0:0]
	for _, x := range in {
		if i, ok := index[x.UUID]; ok {
			x.GPU = i
		}
		k := key{x.GPU, x.UUID, x.Code}
		j, seen := at[k]
		if !seen {
			at[k] = len(out)
			out = append(out, x)
			continue
		}
		m := &out[j]
		m.Total += x.Total
		if x.First.Before(m.First) {
			m.First = x.First
		}
		if x.Last.After(m.Last) {
			m.Last = x.Last
		}
	}
	return out
}

// currentXIDLast serves each GPU's latest XID under its index now.
func currentXIDLast(in []xid.DeviceLast, index map[string]int) []xid.DeviceLast {
	type key struct {
		gpu  int
		uuid string
	}
	at := map[key]int{}
	out := in[:0:0]
	for _, x := range in {
		if i, ok := index[x.UUID]; ok {
			x.GPU = i
		}
		k := key{x.GPU, x.UUID}
		j, seen := at[k]
		switch {
		case !seen:
			at[k] = len(out)
			out = append(out, x)
		case x.At.After(out[j].At):
			out[j] = x
		}
	}
	return out
}

// currentInstanceXIDs serves each MIG device's count under its GPU's index
// now.
func currentInstanceXIDs(in []xid.InstanceCount, index map[string]int) []xid.InstanceCount {
	type key struct {
		gpu      int
		uuid     string
		instance xid.Instance
		migUUID  string
		code     int
	}
	at := map[key]int{}
	out := in[:0:0]
	for _, x := range in {
		if i, ok := index[x.UUID]; ok {
			x.GPU = i
		}
		k := key{x.GPU, x.UUID, x.Instance, x.MIGUUID, x.Code}
		j, seen := at[k]
		if !seen {
			at[k] = len(out)
			out = append(out, x)
			continue
		}
		out[j].Total += x.Total
		if x.Last.After(out[j].Last) {
			out[j].Last = x.Last
		}
	}
	return out
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

// currentRecentXIDs serves each recent event under its GPU's index now, as
// the counts are.
func currentRecentXIDs(in []xid.RecentEvent, index map[string]int) []xid.RecentEvent {
	out := make([]xid.RecentEvent, 0, len(in))
	for _, e := range in {
		if i, ok := index[e.UUID]; ok {
			e.GPU = i
		}
		out = append(out, e)
	}
	return out
}
