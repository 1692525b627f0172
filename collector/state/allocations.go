package state

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// PodSource gives the latest kubelet view without calling the kubelet.
type PodSource interface {
	Snapshot() *podmap.Snapshot
}

// PodMetaSource gives a pod's UID and labels from a cache of the API
// server's, without calling it.
type PodMetaSource interface {
	Lookup(namespace, name string) (podmap.PodMeta, bool)
}

// PodRef names a pod.
type PodRef struct {
	Namespace, Pod string
}

// holdersMeta are the UIDs and labels of the pods that hold a device, as
// the source's cache has them (a pod it does not know yet is left out).
func holdersMeta(src PodMetaSource, a *Allocations) map[PodRef]podmap.PodMeta {
	out := map[PodRef]podmap.PodMeta{}
	for _, hs := range a.ByDevice {
		for _, h := range hs {
			ref := PodRef{h.Namespace, h.Pod}
			if _, done := out[ref]; done {
				continue
			}
			if m, ok := src.Lookup(h.Namespace, h.Pod); ok {
				out[ref] = m
			}
		}
	}
	return out
}

// staleAllocations: when the kubelet has not answered for this long, the
// last known holders are dropped rather than shown as current.
const staleAllocations = 5 * time.Minute

// Holder is a container holding a device.
type Holder struct {
	Namespace, Pod, Container, Resource string
}

// Allocations is who holds what, resolved against one sample's devices.
type Allocations struct {
	Up bool
	// Down says why the pod map is down ("" when Up): the kubelet's last
	// failure, or that it has not answered yet.
	Down string
	// Known: the kubelet answered within staleAllocations, so who holds what
	// is known. Otherwise (no pod source, socket missing, kubelet down for
	// longer) the gauges that depend on it are left out rather than showing
	// every device free.
	Known    bool
	Duration time.Duration
	// Holders per device, sorted.
	ByDevice    map[sample.UnitKey][]Holder
	Allocatable map[string]int
	// AllocatableUnits are the schedulable units (whole GPUs, MIG
	// instances) that at least one allocatable device ID names: replicas of
	// a time-sliced GPU count once. nil when the kubelet gives no
	// allocatable list.
	AllocatableUnits map[sample.UnitKey]bool
	// FreeIDs counts, per resource, the allocatable device IDs that no
	// container holds and that name a healthy unit; nil when the kubelet
	// gives no allocatable list.
	FreeIDs map[string]int
	// allocatableRefs are the units the kubelet's allocatable device IDs
	// name, per resource and ID; unresolvable IDs are left out.
	allocatableRefs map[string]map[string]sample.UnitKey
	// heldIDs are the device IDs containers hold, per resource.
	heldIDs   map[string]map[string]bool
	Unmatched map[string]int // resource -> device IDs matching no device
	// Shared are the units the device plugin hands out as replicas
	// (time-slicing, MPS, GKE vgpuK), held or allocatable, and the compute
	// instances of a GPU instance that holds several.
	Shared map[sample.UnitKey]bool
	// SharedGPUInstance are those compute instances: their memory and DCGM
	// activity are their GPU instance's.
	SharedGPUInstance map[sample.UnitKey]bool
	// Replicas are the replica numbers each holder holds on a shared unit.
	Replicas map[HolderOn][]int
	// Claims are the DRA ResourceClaims through which each holder holds a
	// unit (none for a device plugin's devices).
	Claims map[HolderOn][]DRAClaim
}

// DRAClaim is a device of a ResourceClaim, as the kubelet reports it in
// PodResources' DynamicResources.
type DRAClaim struct {
	ClaimName, ClaimNamespace string
	Driver, Pool, Device      string
}

// HolderOn is a holder of one unit.
type HolderOn struct {
	Holder
	Key sample.UnitKey
}

// inventory is the sample's devices as podmap wants them.
func inventory(s *sample.NodeSample) *podmap.Inventory {
	inv := &podmap.Inventory{GPUs: make([]podmap.InventoryGPU, 0, len(s.GPUs))}
	for _, g := range s.GPUs {
		ig := podmap.InventoryGPU{Index: g.GPU, UUID: g.UUID, Minor: g.Minor}
		for _, m := range g.MIG {
			im := podmap.InventoryMIG{UUID: m.MIGUUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance, Profile: m.MIGProfile}
			if g.MIGLayout != nil {
				if pl, ok := g.MIGLayout.Instances[m.GPUInstance]; ok {
					im.HasPlacement, im.ProfileID, im.PlacementStart = true, pl.ProfileID, pl.Start
				}
			}
			ig.MIG = append(ig.MIG, im)
		}
		inv.GPUs = append(inv.GPUs, ig)
	}
	return inv
}

// resolveAllocations matches the kubelet's holdings to the sample's devices
// (units are the sample's).
func resolveAllocations(snap *podmap.Snapshot, s *sample.NodeSample, units []sample.Unit, now time.Time, unmatchedLog *podmap.UnmatchedLogger) *Allocations {
	a := &Allocations{ByDevice: map[sample.UnitKey][]Holder{}, Unmatched: map[string]int{}, Shared: map[sample.UnitKey]bool{}, Replicas: map[HolderOn][]int{},
		Claims: map[HolderOn][]DRAClaim{}}
	if snap == nil {
		return a
	}
	a.Up, a.Duration = snap.Up, snap.RefreshDuration
	switch {
	case snap.Up:
	case snap.Err != nil:
		a.Down = snap.Err.Error()
	default:
		a.Down = "the kubelet has not answered yet"
	}
	if snap.Time.IsZero() || now.Sub(snap.Time) > staleAllocations {
		return a
	}
	a.Known = true
	a.Allocatable = snap.Allocatable
	inv := inventory(s)
	if snap.AllocatableIDs != nil {
		a.AllocatableUnits = map[sample.UnitKey]bool{}
		a.allocatableRefs = map[string]map[string]sample.UnitKey{}
		for res, ids := range snap.AllocatableIDs {
			refs := map[string]sample.UnitKey{}
			a.allocatableRefs[res] = refs
			for _, id := range ids {
				ref, err := podmap.ParseDeviceID(id)
				if err != nil {
					continue
				}
				if t, ok := inv.Resolve(ref); ok {
					k := targetKey(t)
					a.AllocatableUnits[k] = true
					refs[id] = k
					if ref.IsShared() {
						a.Shared[k] = true
					}
				}
			}
		}
		a.heldIDs = map[string]map[string]bool{}
		for _, h := range snap.Holdings {
			if a.heldIDs[h.Resource] == nil {
				a.heldIDs[h.Resource] = map[string]bool{}
			}
			a.heldIDs[h.Resource][h.DeviceID] = true
		}
	}
	matched, unmatched := podmap.Match(snap, inv)
	add := func(k sample.UnitKey, h Holder, dyn *podmap.DynamicRef) {
		if dyn != nil {
			c := DRAClaim{ClaimName: validUTF8(dyn.ClaimName), ClaimNamespace: validUTF8(dyn.ClaimNamespace),
				Driver: validUTF8(dyn.DriverName), Pool: validUTF8(dyn.PoolName), Device: validUTF8(dyn.DeviceName)}
			on := HolderOn{h, k}
			if !slices.Contains(a.Claims[on], c) {
				a.Claims[on] = append(a.Claims[on], c)
			}
		}
		hs := a.ByDevice[k]
		for _, x := range hs { // two replicas of one GPU in one container are one holder
			if x == h {
				return
			}
		}
		a.ByDevice[k] = append(hs, h)
	}
	for _, m := range matched {
		k := targetKey(m.Target)
		h := Holder{Namespace: validUTF8(m.Namespace), Pod: validUTF8(m.Pod), Container: validUTF8(m.Container), Resource: validUTF8(m.Resource)}
		if m.Ref.IsShared() {
			a.Shared[k] = true
			a.Replicas[HolderOn{h, k}] = append(a.Replicas[HolderOn{h, k}], m.Ref.Replica)
		}
		if g := s.GPUByIndex(k.GPU); k.GPUInstance < 0 && g != nil && len(g.MIG) > 0 {
			// A whole MIG-mode GPU, held by its GPU UUID (the device
			// plugin's migStrategy none): its holder holds every
			// instance, and the devices are only counted per instance.
			for j := range g.MIG {
				add(sample.MIGKey(k.GPU, &g.MIG[j]), h, m.Dynamic)
			}
			continue
		}
		add(k, h, m.Dynamic)
	}
	for k, hs := range a.ByDevice {
		sort.Slice(hs, func(i, j int) bool { return holderLess(hs[i], hs[j]) })
		a.ByDevice[k] = hs
	}
	a.SharedGPUInstance = markSharedGPUInstances(s, a.Shared)
	a.FreeIDs = a.freeIDs(units)
	for _, h := range unmatched {
		a.Unmatched[h.Resource]++
	}
	if unmatchedLog != nil {
		unmatchedLog.Log(unmatched)
	}
	return a
}

// markSharedGPUInstances marks the compute instances of a GPU instance
// that holds several as shared: NVML reports the GPU instance's memory on
// each of them and DCGM its activity, so a holder of one compute instance
// is credited with its own processes (as on a time-sliced GPU), not with
// what its neighbours in the GPU instance use.
func markSharedGPUInstances(s *sample.NodeSample, shared map[sample.UnitKey]bool) map[sample.UnitKey]bool {
	out := map[sample.UnitKey]bool{}
	for i := range s.GPUs {
		g := &s.GPUs[i]
		for j := range g.MIG {
			if g.ComputeInstances(g.MIG[j].GPUInstance) > 1 {
				shared[sample.MIGKey(g.GPU, &g.MIG[j])] = true
				out[sample.MIGKey(g.GPU, &g.MIG[j])] = true
			}
		}
	}
	return out
}

// targetKey is the device a kubelet device ID resolved to.
func targetKey(t podmap.Target) sample.UnitKey {
	if t.GPUInstance < 0 {
		return sample.GPUKey(t.GPU)
	}
	return sample.UnitKey{GPU: t.GPU, GPUInstance: t.GPUInstance, ComputeInstance: t.ComputeInstance}
}

func holderLess(a, b Holder) bool {
	if a.Namespace != b.Namespace {
		return a.Namespace < b.Namespace
	}
	if a.Pod != b.Pod {
		return a.Pod < b.Pod
	}
	if a.Container != b.Container {
		return a.Container < b.Container
	}
	return a.Resource < b.Resource
}

// sharedFree lists the units that have at least one free allocatable
// device ID while held: time-sliced GPUs with free replicas.
func (a *Allocations) sharedFree() map[sample.UnitKey]bool {
	out := map[sample.UnitKey]bool{}
	for res, refs := range a.allocatableRefs {
		for id, k := range refs {
			if !a.heldIDs[res][id] && len(a.ByDevice[k]) > 0 {
				out[k] = true
			}
		}
	}
	return out
}

// freeIDs counts, per resource, the allocatable device IDs that no
// container holds and that name a healthy unit; nil when the kubelet gave no
// allocatable list.
func (a *Allocations) freeIDs(units []sample.Unit) map[string]int {
	if a.allocatableRefs == nil {
		return nil
	}
	healthy := make(map[sample.UnitKey]bool, len(units))
	for _, u := range units {
		healthy[u.Key] = u.Healthy
	}
	out := make(map[string]int, len(a.allocatableRefs))
	for res, refs := range a.allocatableRefs {
		n := 0
		for id, k := range refs {
			if healthy[k] && !a.heldIDs[res][id] {
				n++
			}
		}
		out[res] = n
	}
	return out
}

// validUTF8 keeps a label value that a kubelet or driver bug made invalid
// from panicking the metrics registry.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
