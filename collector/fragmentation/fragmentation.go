package fragmentation

import (
	"math"
	"math/bits"
	"strings"
)

// Domain names used as keys of [Result.LargestFreeGroup] (the "domain" label
// of gpu_free_devices_largest_group).
const (
	DomainNVLink = "nvlink"
	DomainNUMA   = "numa"
)

// maxSlots is the number of MIG slots the slot bitmap can represent.
const maxSlots = 64

// GPU is one physical GPU of the node, as the collector sees it in one sample.
type GPU struct {
	Index   int    // NVML index
	UUID    string // physical GPU UUID
	Healthy bool
	// Allocated says whether a holder has the GPU in whole-GPU mode. It is
	// ignored when MIG is on: holders then hold instances
	// (MIGInstance.Allocated).
	Allocated bool
	// SharedFree: an allocated, time-sliced GPU that still has free
	// replicas. It is not free (a whole-GPU task cannot have it), but its
	// free memory is not stranded either: the next replica's pod can use it.
	SharedFree bool
	// MemoryTotal and MemoryUsed are in bytes; used for stranded memory of an
	// allocated whole GPU. Ignored when MIG is on (instances carry their own).
	MemoryTotal, MemoryUsed float64
	// NVLinkDomain groups GPUs that share one NVLink domain (an NVSwitch
	// fabric, or a clique). Negative: unknown.
	NVLinkDomain int
	// NUMANode is the GPU's host NUMA node. Negative: unknown.
	NUMANode int
	// MIG is the GPU's MIG state; nil when MIG is off.
	MIG *MIGState
}

// MIGState is the MIG configuration of one GPU.
type MIGState struct {
	// TotalSlices is the number of compute slices (7 on A100 and H100).
	// Values above 64 are treated as 64.
	TotalSlices int
	// Instances are the existing GPU instances.
	Instances []MIGInstance
	// Profiles are the GPU instance profiles the GPU supports, with the
	// placements NVML lists for each.
	Profiles []MIGProfile
}

// MIGInstance is one existing GPU instance.
type MIGInstance struct {
	Profile string // e.g. "1g.10gb"
	// Start and Size are the instance's placement in slots, as NVML reports
	// it. An instance with Size <= 0, Start < 0 or Start+Size > 64 covers no
	// slots (it still counts as a schedulable unit).
	Start, Size int
	// Slices is the instance's compute slices (its profile's SliceCount).
	// Placements are in memory slots, which can be wider than the compute
	// slices (1g.20gb on an A100-80GB covers 2 slots, 1 slice; a 1g on an
	// RTX PRO 6000 covers 3 of 12); free slices and capacity count compute
	// slices. 0: its profile's Slices stand in, else the slots it covers in
	// [0, TotalSlices).
	Slices int
	// ComputeInstances is how many schedulable units (MIG devices) the GPU
	// instance holds, 1 when 0; AllocatedUnits how many of them are held.
	// Compute instances share their GPU instance's memory, which counts
	// once. Allocated is set when any of them is held.
	ComputeInstances, AllocatedUnits int
	Allocated                        bool
	// NoComputeInstances: the GPU instance was created without a compute
	// instance. It covers its slots and counts against its profile's
	// per-GPU limit, but is no unit (no MIG device stands for it) and no
	// task fits in it until a compute instance is created; its slices stay
	// unallocated capacity, which no task shape can use.
	NoComputeInstances bool
	// MemoryTotal and MemoryUsed are in bytes.
	MemoryTotal, MemoryUsed float64
}

// MIGProfile is one GPU instance profile and where it can be placed.
type MIGProfile struct {
	Name   string // e.g. "3g.40gb"
	Slices int    // compute slices
	// MaxInstances is how many instances of the profile one GPU can hold
	// (NVML's InstanceCount; one for +me profiles); 0 means no limit
	// beyond the placements.
	MaxInstances int
	MemoryBytes  float64 // instance memory
	// Placements are the possible placements in slots, in NVML's order.
	Placements []Placement
}

// Placement is a possible placement of a profile: Size slots from Start.
type Placement struct{ Start, Size int }

// Shape is a task shape of the workload mix.
//
// A shape with GPUs > 0 is a whole-GPU task of that many GPUs (MIGProfile is
// then ignored); otherwise a shape with a MIGProfile is a one-instance MIG
// task; a shape with neither never fits anywhere.
type Shape struct {
	Name       string  // label value of gpu_fragmentation_gpus{shape}
	GPUs       int     // whole GPUs; 0 for a MIG task
	MIGProfile string  // MIG profile for a MIG task, compared case-insensitively
	Weight     float64 // popularity; only relative values matter
}

// Result is the fragmentation picture of one node.
type Result struct {
	// Free, Allocated and Unhealthy count schedulable units: whole non-MIG
	// GPUs and MIG instances. Every unit of an unhealthy GPU is unhealthy.
	Free, Allocated, Unhealthy int
	// StrandedMemoryBytes is the free VRAM (total - used) on allocated,
	// healthy devices, whole GPUs and MIG instances: under whole-device
	// scheduling nobody else can use it. Unhealthy devices are left out:
	// their memory is lost to health, not to allocation; so are time-sliced
	// GPUs with free replicas (GPU.SharedFree).
	StrandedMemoryBytes float64
	// LargestFreeGroup maps DomainNVLink and DomainNUMA to the size of the
	// largest set of free, healthy, non-MIG GPUs sharing one domain. A GPU
	// whose domain is unknown (negative) is a group of its own.
	LargestFreeGroup map[string]int
	// MIG has one entry per MIG GPU, in input order.
	MIG []MIGResult
	// UnallocatedGPUs is sum_g R_g, the node's unallocated capacity in GPUs
	// (see the package documentation).
	UnallocatedGPUs float64
	// PerShape maps each shape's Name to F_n(m), in GPUs.
	PerShape map[string]float64
	// Fitting maps each shape's Name to how many more tasks of that shape
	// the node can take now, each shape on its own (counts of different
	// shapes are alternatives, not additive): a whole-GPU task of k GPUs
	// takes k free whole GPUs; a MIG task takes an unallocated instance of
	// its profile or a free placement for a new one.
	Fitting map[string]int
	// Weighted is F_n(M) = sum_m w_m F_n(m) / sum_m w_m over shapes with a
	// finite, non-negative weight; 0 when the weights sum to 0.
	Weighted float64
}

// MIGResult is the MIG picture of one MIG GPU.
type MIGResult struct {
	GPU  int
	UUID string
	// FreeSlices is the compute slices no existing instance uses:
	// TotalSlices less the instances' slices; 0 on an unhealthy GPU.
	FreeSlices int
	// Placeable maps every profile of the GPU to how many more instances of
	// that profile alone fit in the free slots, placing greedily in NVML's
	// placement order. Counts of different profiles are alternatives, not
	// additive. NVML's placements of one profile do not overlap, so greedy
	// placement is optimal for them. All 0 on an unhealthy GPU.
	Placeable map[string]int
	// LargestPlaceableSlices and LargestPlaceableProfile describe the
	// placeable profile with the most slices (ties: more memory, then the
	// smaller name); 0 and "" when nothing fits.
	LargestPlaceableSlices  int
	LargestPlaceableProfile string
}

// gpuState is what Compute derives per GPU before looking at shapes.
type gpuState struct {
	capacity  float64 // R_g
	wholeFree bool    // healthy, MIG off, unallocated: serves whole-GPU tasks
	occupied  uint64  // MIG: slots covered by existing instances
	// freeSlices (MIG): compute slices no existing instance uses.
	freeSlices int
}

// stackGPUs is how many GPUs Compute handles without a heap allocation for
// its per-GPU scratch state.
const stackGPUs = 16

// Compute computes the fragmentation picture of one node from its GPUs and
// the workload's task shapes. It does not modify its inputs.
func Compute(gpus []GPU, shapes []Shape) Result {
	var buf [stackGPUs]gpuState
	st := buf[:0]
	if len(gpus) > len(buf) {
		st = make([]gpuState, 0, len(gpus))
	}

	nMIG := 0
	for i := range gpus {
		if gpus[i].MIG != nil {
			nMIG++
		}
	}
	res := Result{
		LargestFreeGroup: map[string]int{DomainNVLink: 0, DomainNUMA: 0},
		PerShape:         make(map[string]float64, len(shapes)),
		Fitting:          make(map[string]int, len(shapes)),
	}
	if nMIG > 0 {
		res.MIG = make([]MIGResult, 0, nMIG)
	}

	for i := range gpus {
		g := &gpus[i]
		var s gpuState
		if g.MIG == nil {
			switch {
			case !g.Healthy:
				res.Unhealthy++
			case g.Allocated:
				res.Allocated++
				if !g.SharedFree {
					res.StrandedMemoryBytes += freeMemory(g.MemoryTotal, g.MemoryUsed)
				}
			default:
				res.Free++
				s.capacity = 1
				s.wholeFree = true
			}
		} else {
			m := g.MIG
			total := clampSlices(m.TotalSlices)
			totalMask := slotMask(0, total)
			var allocatedSlices, usedSlices int
			for j := range m.Instances {
				in := &m.Instances[j]
				mask := slotMask(in.Start, in.Size)
				s.occupied |= mask
				slices := instanceSlices(in, m, mask, totalMask)
				usedSlices += slices
				units := max(1, in.ComputeInstances)
				held := in.AllocatedUnits
				if in.Allocated && held == 0 {
					held = units
				}
				held = min(held, units)
				switch {
				case in.NoComputeInstances:
					// No unit to count, free or not.
				case !g.Healthy:
					res.Unhealthy += units
				case held > 0:
					res.Allocated += held
					res.Free += units - held
					allocatedSlices += slices
					// Compute instances share the GPU instance's memory:
					// what is free of it counts once.
					res.StrandedMemoryBytes += freeMemory(in.MemoryTotal, in.MemoryUsed)
				default:
					res.Free += units
				}
			}
			if g.Healthy && total > 0 {
				s.capacity = float64(max(0, total-allocatedSlices)) / float64(total)
			}
			s.freeSlices = max(0, total-usedSlices)
			res.MIG = append(res.MIG, migResult(g, s.occupied, s.freeSlices))
		}
		res.UnallocatedGPUs += s.capacity
		st = append(st, s)
	}

	res.LargestFreeGroup[DomainNVLink] = largestGroup(gpus, st, func(g *GPU) int { return g.NVLinkDomain })
	res.LargestFreeGroup[DomainNUMA] = largestGroup(gpus, st, func(g *GPU) int { return g.NUMANode })

	var weighted, weights float64
	for i := range shapes {
		f := shapeFragmentation(gpus, st, &shapes[i], res.UnallocatedGPUs)
		res.PerShape[shapes[i].Name] = f
		res.Fitting[shapes[i].Name] = shapeFitting(gpus, st, &shapes[i])
		if w := shapes[i].Weight; w >= 0 && !math.IsInf(w, 1) {
			weighted += w * f
			weights += w
		}
	}
	if weights > 0 {
		res.Weighted = weighted / weights
	}
	return res
}

// shapeFragmentation is F_n(m) for one shape; total is sum_g R_g.
func shapeFragmentation(gpus []GPU, st []gpuState, sh *Shape, total float64) float64 {
	var fits bool
	var unusable float64 // sum of R_g over GPUs that cannot serve the shape
	switch {
	case sh.GPUs > 0:
		free := 0
		for i := range st {
			if st[i].wholeFree {
				free++
			} else {
				unusable += st[i].capacity
			}
		}
		fits = free >= sh.GPUs
	case sh.MIGProfile != "":
		for i := range gpus {
			if canServeMIG(&gpus[i], st[i].occupied, st[i].freeSlices, sh.MIGProfile) {
				fits = true
			} else {
				unusable += st[i].capacity
			}
		}
	}
	if !fits {
		return total
	}
	return unusable
}

// shapeFitting is how many more tasks of one shape fit on the node.
func shapeFitting(gpus []GPU, st []gpuState, sh *Shape) int {
	n := 0
	switch {
	case sh.GPUs > 0:
		free := 0
		for i := range st {
			if st[i].wholeFree {
				free++
			}
		}
		n = free / sh.GPUs
	case sh.MIGProfile != "":
		for i := range gpus {
			n += migFitting(&gpus[i], st[i].occupied, st[i].freeSlices, sh.MIGProfile)
		}
	}
	return n
}

// migFitting is how many one-instance tasks of profile GPU g can take: its
// unallocated instances of the profile plus the new instances its free slots
// and free compute slices can hold (0 on a GPU that is not a healthy MIG GPU).
func migFitting(g *GPU, occupied uint64, freeSlices int, profile string) int {
	if g.MIG == nil || !g.Healthy {
		return 0
	}
	n := 0
	for j := range g.MIG.Instances {
		if takesTask(&g.MIG.Instances[j], profile) {
			n++
		}
	}
	best := 0
	for j := range g.MIG.Profiles {
		p := &g.MIG.Profiles[j]
		if strings.EqualFold(p.Name, profile) {
			best = max(best, placeable(p, occupied, existing(g.MIG, p.Name), freeSlices))
		}
	}
	return n + best
}

// canServeMIG reports whether GPU g can take one more instance of profile:
// it is a healthy MIG GPU with an unallocated instance of the profile or a
// free placement for it.
func canServeMIG(g *GPU, occupied uint64, freeSlices int, profile string) bool {
	if g.MIG == nil || !g.Healthy {
		return false
	}
	for j := range g.MIG.Instances {
		if takesTask(&g.MIG.Instances[j], profile) {
			return true
		}
	}
	for j := range g.MIG.Profiles {
		p := &g.MIG.Profiles[j]
		if strings.EqualFold(p.Name, profile) && placeable(p, occupied, existing(g.MIG, p.Name), freeSlices) > 0 {
			return true
		}
	}
	return false
}

// takesTask reports whether an existing instance can take a task of
// profile: it is of that profile, unallocated, and has a compute instance
// to run it.
func takesTask(in *MIGInstance, profile string) bool {
	return !in.Allocated && !in.NoComputeInstances && strings.EqualFold(in.Profile, profile)
}

// migResult computes the MIG picture of GPU g whose existing instances cover
// the slots in occupied.
func migResult(g *GPU, occupied uint64, freeSlices int) MIGResult {
	m := g.MIG
	r := MIGResult{GPU: g.Index, UUID: g.UUID, Placeable: make(map[string]int, len(m.Profiles))}
	if !g.Healthy {
		for j := range m.Profiles {
			r.Placeable[m.Profiles[j].Name] = 0
		}
		return r
	}
	r.FreeSlices = freeSlices
	var best *MIGProfile
	for j := range m.Profiles {
		p := &m.Profiles[j]
		n := placeable(p, occupied, existing(m, p.Name), freeSlices)
		// A profile listed twice keeps its larger count.
		if old, ok := r.Placeable[p.Name]; !ok || n > old {
			r.Placeable[p.Name] = n
		}
		if n > 0 && largerProfile(p, best) {
			best = p
		}
	}
	if best != nil {
		r.LargestPlaceableSlices = best.Slices
		r.LargestPlaceableProfile = best.Name
	}
	return r
}

// largerProfile orders placeable profiles: more slices, then more memory,
// then the smaller name. A nil b is smaller than anything.
func largerProfile(a, b *MIGProfile) bool {
	switch {
	case b == nil:
		return true
	case a.Slices != b.Slices:
		return a.Slices > b.Slices
	case a.MemoryBytes != b.MemoryBytes:
		return a.MemoryBytes > b.MemoryBytes
	default:
		return a.Name < b.Name
	}
}

// placeable counts how many instances of p fit in the slots not in occupied,
// taking free placements greedily in order, and no more than the profile's
// per-GPU limit allows beside the n instances of it that exist, nor than
// the free compute slices hold.
func placeable(p *MIGProfile, occupied uint64, n, freeSlices int) int {
	count := 0
	for _, pl := range p.Placements {
		if p.MaxInstances > 0 && n+count >= p.MaxInstances {
			break
		}
		if p.Slices > 0 && (count+1)*p.Slices > freeSlices {
			break
		}
		mask := slotMask(pl.Start, pl.Size)
		if mask == 0 || occupied&mask != 0 {
			continue
		}
		occupied |= mask
		count++
	}
	return count
}

// instanceSlices is an instance's compute slices: its own count, else its
// profile's, else the slots it covers inside the compute range (a guess
// that only holds where slots and compute slices line up, as on A100/H100;
// an RTX PRO 6000 places on 12 units for 4 compute slices). An instance
// whose placement covers no slot counts none.
func instanceSlices(in *MIGInstance, m *MIGState, mask, totalMask uint64) int {
	if in.Slices > 0 {
		return in.Slices
	}
	if mask == 0 {
		return 0
	}
	for j := range m.Profiles {
		if p := &m.Profiles[j]; p.Slices > 0 && strings.EqualFold(p.Name, in.Profile) {
			return p.Slices
		}
	}
	return bits.OnesCount64(mask & totalMask)
}

// existing counts the GPU's instances of a profile.
func existing(m *MIGState, profile string) int {
	n := 0
	for j := range m.Instances {
		if strings.EqualFold(m.Instances[j].Profile, profile) {
			n++
		}
	}
	return n
}

// slotMask is the bitmap of slots [start, start+size); 0 when the range is
// empty, negative or does not fit in 64 slots.
func slotMask(start, size int) uint64 {
	if start < 0 || size <= 0 || size > maxSlots || start > maxSlots-size {
		return 0
	}
	return (uint64(1)<<uint(size) - 1) << uint(start)
}

func clampSlices(n int) int {
	switch {
	case n < 0:
		return 0
	case n > maxSlots:
		return maxSlots
	}
	return n
}

// freeMemory is total-used when both are sane, else 0.
func freeMemory(total, used float64) float64 {
	f := total - used
	if !(f > 0) || math.IsInf(f, 0) {
		return 0 // negative, NaN or infinite
	}
	return f
}

// largestGroup is the size of the largest set of free whole GPUs with the
// same (known) domain; each GPU with an unknown domain is its own group. The
// quadratic scan is allocation-free and nodes have at most a few dozen GPUs.
func largestGroup(gpus []GPU, st []gpuState, domain func(*GPU) int) int {
	best := 0
	for i := range gpus {
		if !st[i].wholeFree {
			continue
		}
		d := domain(&gpus[i])
		n := 1
		if d >= 0 {
			n = 0
			for j := range gpus {
				if st[j].wholeFree && domain(&gpus[j]) == d {
					n++
				}
			}
		}
		if n > best {
			best = n
		}
	}
	return best
}
