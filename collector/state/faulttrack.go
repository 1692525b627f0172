package state

import (
	"sort"
	"time"
)

// faultOrder lists a GPU's faults from the one that says most of what
// happened (an XID names the cause of a loss) to the least.
var faultOrder = map[string]int{FaultXID: 0, FaultRowRemapFailed: 1, FaultRecoveryAction: 2, FaultHung: 3, FaultLost: 4}

// faultTracker remembers, across samples, when each GPU was last seen
// reset: after an XID only a reset clears it, and NVML says nothing of a
// reset but what it implies (the GPU stopped answering and answers again,
// or NVML was initialised again after the driver went away).
type faultTracker struct {
	resetAt map[string]time.Time // by GPU UUID
	down    map[string]bool      // GPUs not answering in the last sample
	inits   int
}

// faults lists the sample's fatal faults, sorted by GPU and kind, and
// notes the resets the sample shows.
func (t *faultTracker) faults(st *State) []Fault {
	s := st.Sample
	if t.resetAt == nil {
		t.resetAt, t.down = map[string]time.Time{}, map[string]bool{}
	}
	if s.NVML.Inits > t.inits && t.inits > 0 {
		// NVML initialised again: the driver was reloaded, every GPU with it.
		for i := range s.GPUs {
			t.resetAt[s.GPUs[i].UUID] = s.Time
		}
	}
	t.inits = max(t.inits, s.NVML.Inits)
	var out []Fault
	if s.NVML.Down != "" {
		// The driver is away: no GPU can be judged (a reload is no fault of one).
		return nil
	}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		if g.UUID == "" {
			continue
		}
		if g.Up && t.down[g.UUID] {
			t.resetAt[g.UUID] = s.Time
		}
		t.down[g.UUID] = !g.Up
		h := &g.Health
		base := Fault{GPU: g.GPU, UUID: g.UUID, GPUInstance: -1}
		switch {
		case g.Hung:
			f := base
			f.Kind = FaultHung
			out = append(out, f)
		case !g.Up:
			f := base
			f.Kind = FaultLost
			out = append(out, f)
		}
		if h.RemapFailed.OK && h.RemapFailed.V {
			f := base
			f.Kind = FaultRowRemapFailed
			out = append(out, f)
		}
		if h.RecoveryAction.OK && h.RecoveryAction.V != 0 {
			f := base
			f.Kind, f.Action = FaultRecoveryAction, recoveryActionName(h.RecoveryAction.V)
			out = append(out, f)
		}
	}
	for _, c := range st.XIDs {
		if !fatalXID(c.Entry) || c.UUID == "" || !c.Last.After(t.resetAt[c.UUID]) {
			continue
		}
		f := Fault{GPU: c.GPU, UUID: c.UUID, Kind: FaultXID, XID: c.Entry, GPUInstance: -1, Since: c.Last}
		for _, m := range st.XIDInstances {
			if m.UUID == c.UUID && m.Code == c.Code && m.MIGUUID != "" {
				f.MIGUUID, f.GPUInstance = m.MIGUUID, m.Instance.GPUInstance
				break
			}
		}
		out = append(out, f)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GPU != b.GPU {
			return a.GPU < b.GPU
		}
		if faultOrder[a.Kind] != faultOrder[b.Kind] {
			return faultOrder[a.Kind] < faultOrder[b.Kind]
		}
		return a.XID.Code < b.XID.Code
	})
	return out
}
