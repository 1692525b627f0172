package podmap

import (
	"strconv"
	"strings"
)

// Inventory is what NVML sees on the node; the collector supplies it.
type Inventory struct{ GPUs []InventoryGPU }

// InventoryGPU is one physical GPU.
type InventoryGPU struct {
	Index int    // NVML index
	UUID  string // "GPU-..."
	Minor int    // NVML minor number (/dev/nvidia<minor>); -1 if unknown
	MIG   []InventoryMIG
}

// InventoryMIG is one MIG instance (a GPU instance and compute instance) on a
// GPU.
type InventoryMIG struct {
	UUID            string // "MIG-..."
	GPUInstance     int
	ComputeInstance int
	Profile         string // e.g. "1g.10gb"
	// HasPlacement: ProfileID (NVML's GpuInstanceProfileInfo.Id) and
	// PlacementStart are known. NVIDIA's DRA driver names MIG devices
	// gpu-<minor>-mig-<profile>-<profileID>-<placementStart>.
	HasPlacement   bool
	ProfileID      int
	PlacementStart int
}

// Target is what a device ID resolved to: a GPU, or a MIG instance on it.
// UUID is always the (parent) GPU's UUID, the stable identity label of device
// series; a MIG instance is told apart by GPUInstance and MIGProfile.
type Target struct {
	GPU         int // NVML index of the (parent) GPU
	UUID        string
	GPUInstance int // -1 = whole GPU
	// ComputeInstance tells apart the MIG devices of a GPU instance that
	// holds several compute instances; -1 for a whole GPU.
	ComputeInstance int
	MIGProfile      string
}

// Resolve finds the GPU or MIG instance that ref names. It returns false if
// the inventory has no such device (a stale or foreign ID, an inventory taken
// before a MIG reconfiguration, a ref that failed to parse) or if the ref is
// ambiguous (a DRA MIG name whose instance cannot be told apart).
//
// Replicas (time-slicing, MPS, GKE vgpuK) resolve to the device they are a
// replica of, so every container sharing a GPU is credited with it. UUIDs
// compare case-insensitively.
func (inv *Inventory) Resolve(ref DeviceRef) (Target, bool) {
	if inv == nil {
		return Target{}, false
	}
	switch ref.Kind {
	case GPUUUID:
		if g := inv.gpuByUUID(ref.GPUUUID); g != nil {
			return wholeGPU(g), true
		}
	case MIGUUID:
		for gi := range inv.GPUs {
			g := &inv.GPUs[gi]
			for mi := range g.MIG {
				if strings.EqualFold(g.MIG[mi].UUID, ref.MIGUUID) {
					return migTarget(g, &g.MIG[mi]), true
				}
			}
		}
	case MIGLegacy:
		if g := inv.gpuByUUID(ref.GPUUUID); g != nil {
			if m := migByInstance(g, ref.GPUInstance, ref.ComputeInstance); m != nil {
				return migTarget(g, m), true
			}
		}
	case GKEMinor:
		if g := inv.gpuByMinor(ref.Minor); g != nil {
			if ref.GPUInstance < 0 {
				return wholeGPU(g), true
			}
			if m := migByInstance(g, ref.GPUInstance, -1); m != nil {
				return migTarget(g, m), true
			}
		}
	case DRADevice:
		return inv.resolveDRA(ref)
	}
	return Target{}, false
}

// resolveDRA resolves "gpu-<n>[-mig-<...>]". n is a minor number in current
// NVIDIA DRA driver releases and an index in early ones: look it up as a
// minor first, as an index only if no GPU has that minor.
func (inv *Inventory) resolveDRA(ref DeviceRef) (Target, bool) {
	n, mig, ok := splitDRAName(ref.Raw)
	if !ok {
		return Target{}, false
	}
	g := inv.gpuByMinor(n)
	if g == nil {
		g = inv.gpuByIndex(n)
	}
	if g == nil {
		return Target{}, false
	}
	if mig == "" {
		return wholeGPU(g), true
	}
	// Current names: "<profile without dots>-<placement...>". Pick the
	// instances whose normalised profile is the longest prefix of mig.
	var cands []*InventoryMIG
	best := 0
	for i := range g.MIG {
		p := normaliseMIGProfile(g.MIG[i].Profile)
		if p == "" || mig != p && !strings.HasPrefix(mig, p+"-") {
			continue
		}
		switch {
		case len(p) > best:
			best = len(p)
			cands = append(cands[:0], &g.MIG[i])
		case len(p) == best:
			cands = append(cands, &g.MIG[i])
		}
	}
	if best == 0 && startsWithDigitRun(mig) {
		// Early names: "<profileID>-<start>-<size>"; the profile is not
		// named, so only a GPU with a single MIG instance is unambiguous.
		for i := range g.MIG {
			cands = append(cands, &g.MIG[i])
		}
	}
	if pid, start, ok := draPlacement(mig); ok && best > 0 {
		// Current names end in <profileID>-<placementStart>: the one
		// instance at that placement, whatever else shares its profile
		// name (7 x 1g), and +me apart from -me (same name once dots and
		// signs are dropped, different profile IDs).
		var at []*InventoryMIG
		known := false
		for _, m := range cands {
			if m.HasPlacement {
				known = true
				if m.ProfileID == pid && m.PlacementStart == start {
					at = append(at, m)
				}
			}
		}
		if known {
			cands = at
		}
	}
	if len(cands) == 0 {
		return Target{}, false
	}
	// Several compute instances of one GPU instance share its placement;
	// the name names the GPU instance, held as a whole.
	for _, m := range cands[1:] {
		if m.GPUInstance != cands[0].GPUInstance {
			return Target{}, false
		}
	}
	return migTarget(g, cands[0]), true
}

// draPlacement reads the trailing "<profileID>-<placementStart>" of a DRA
// MIG device name's MIG part.
func draPlacement(mig string) (pid, start int, ok bool) {
	i := strings.LastIndexByte(mig, '-')
	if i <= 0 {
		return 0, 0, false
	}
	j := strings.LastIndexByte(mig[:i], '-')
	if j < 0 {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(mig[j+1 : i])
	s, err2 := strconv.Atoi(mig[i+1:])
	if err1 != nil || err2 != nil || p < 0 || s < 0 {
		return 0, 0, false
	}
	return p, s, true
}

// startsWithDigitRun reports whether s is "<digits>-..." or all digits.
func startsWithDigitRun(s string) bool {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return i > 0 && (i == len(s) || s[i] == '-')
}

func wholeGPU(g *InventoryGPU) Target {
	return Target{GPU: g.Index, UUID: g.UUID, GPUInstance: -1, ComputeInstance: -1}
}

func migTarget(g *InventoryGPU, m *InventoryMIG) Target {
	return Target{GPU: g.Index, UUID: g.UUID, GPUInstance: m.GPUInstance, ComputeInstance: m.ComputeInstance, MIGProfile: m.Profile}
}

func (inv *Inventory) gpuByUUID(uuid string) *InventoryGPU {
	for i := range inv.GPUs {
		if strings.EqualFold(inv.GPUs[i].UUID, uuid) {
			return &inv.GPUs[i]
		}
	}
	return nil
}

func (inv *Inventory) gpuByMinor(minor int) *InventoryGPU {
	if minor < 0 {
		return nil
	}
	for i := range inv.GPUs {
		if inv.GPUs[i].Minor == minor {
			return &inv.GPUs[i]
		}
	}
	return nil
}

func (inv *Inventory) gpuByIndex(index int) *InventoryGPU {
	for i := range inv.GPUs {
		if inv.GPUs[i].Index == index {
			return &inv.GPUs[i]
		}
	}
	return nil
}

// migByInstance finds the MIG instance with GPU instance gi. With ci >= 0 an
// exact (gi, ci) match wins; a GPU instance with a single compute instance
// of another ID still matches, since pod resources name the GPU instance.
func migByInstance(g *InventoryGPU, gi, ci int) *InventoryMIG {
	var first *InventoryMIG
	for i := range g.MIG {
		m := &g.MIG[i]
		if m.GPUInstance != gi {
			continue
		}
		if ci < 0 || m.ComputeInstance == ci {
			return m
		}
		if first == nil {
			first = m
		}
	}
	return first
}

// Allocation is a Holding resolved to a device on the node.
type Allocation struct {
	Holding
	Target Target
}

// Match resolves every holding of s against inv. Holdings whose ID did not
// parse, or that name no device of the inventory, come back as unmatched (see
// UnmatchedLogger). Match never calls the kubelet; it is cheap enough to run
// on every sample. A nil snapshot or inventory gives nothing matched.
func Match(s *Snapshot, inv *Inventory) (matched []Allocation, unmatched []Holding) {
	if s == nil {
		return nil, nil
	}
	matched = make([]Allocation, 0, len(s.Holdings))
	idx := newUUIDIndex(inv)
	for _, h := range s.Holdings {
		if h.ParseErr != nil {
			unmatched = append(unmatched, h)
			continue
		}
		t, ok := idx.resolve(inv, h.Ref)
		if !ok {
			unmatched = append(unmatched, h)
			continue
		}
		matched = append(matched, Allocation{Holding: h, Target: t})
	}
	return matched, unmatched
}

// uuidIndex speeds up Match on nodes with many MIG instances: UUID refs are
// looked up in maps built once per Match instead of scanning the inventory
// for every holding. Other kinds go to Resolve (a scan over a few GPUs).
type uuidIndex struct {
	gpus map[string]*InventoryGPU // uuidKey of the GPU UUID
	migs map[string]Target        // uuidKey of the MIG UUID
}

// uuidKey is a UUID without its "GPU-"/"MIG-" prefix, in lower case (which
// NVML uses already, so usually without allocating).
func uuidKey(u string) string {
	if len(u) > len(gpuPrefix) && u[len(gpuPrefix)-1] == '-' {
		u = u[len(gpuPrefix):]
	}
	return strings.ToLower(u)
}

func newUUIDIndex(inv *Inventory) *uuidIndex {
	if inv == nil {
		return nil
	}
	idx := &uuidIndex{gpus: make(map[string]*InventoryGPU, len(inv.GPUs)), migs: make(map[string]Target)}
	// Filled in reverse so that, as in Resolve, the first of duplicate UUIDs
	// wins.
	for gi := len(inv.GPUs) - 1; gi >= 0; gi-- {
		g := &inv.GPUs[gi]
		idx.gpus[uuidKey(g.UUID)] = g
	}
	for gi := len(inv.GPUs) - 1; gi >= 0; gi-- {
		g := &inv.GPUs[gi]
		for mi := len(g.MIG) - 1; mi >= 0; mi-- {
			idx.migs[uuidKey(g.MIG[mi].UUID)] = migTarget(g, &g.MIG[mi])
		}
	}
	return idx
}

func (idx *uuidIndex) resolve(inv *Inventory, ref DeviceRef) (Target, bool) {
	if idx == nil {
		return Target{}, false
	}
	switch ref.Kind {
	case GPUUUID:
		if g, ok := idx.gpus[uuidKey(ref.GPUUUID)]; ok {
			return wholeGPU(g), true
		}
		return Target{}, false
	case MIGUUID:
		t, ok := idx.migs[uuidKey(ref.MIGUUID)]
		return t, ok
	case MIGLegacy:
		if g, ok := idx.gpus[uuidKey(ref.GPUUUID)]; ok {
			if m := migByInstance(g, ref.GPUInstance, ref.ComputeInstance); m != nil {
				return migTarget(g, m), true
			}
		}
		return Target{}, false
	}
	return inv.Resolve(ref)
}
