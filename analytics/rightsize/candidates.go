package rightsize

import (
	"sort"
	"strconv"
	"strings"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// mib is a mebibyte in bytes.
const mib = 1 << 20

// defaultComputeSlices is the compute slices of a GPU model the MIG table
// does not know: seven on every MIG-capable model but the A30 (which it
// knows).
const defaultComputeSlices = 7

// Prices answers what a GPU costs an hour.
type Prices struct {
	// List is the price list given on the command line (--idle.price-file,
	// --idle.price); nil: the exporters' configured prices.
	List *fragmentation.PriceList
	// Exporters are the exporters' prices by model.
	Exporters map[string]float64
}

// PerGPUHour is the price of one GPU of a model; failing that, of the
// accelerator by its name (a price list may key GKE's names) or the model
// names the accelerator table gives it.
func (p Prices) PerGPUHour(model, accelerator string) *float64 {
	keys := []string{model, accelerator}
	if f, ok := LookupFacts(accelerator); ok {
		keys = append(keys, f.NVML...)
	}
	if p.List != nil {
		for _, k := range keys {
			if k == "" {
				continue
			}
			if v, ok := p.List.Lookup(k); ok {
				return &v
			}
		}
		return nil
	}
	for _, k := range keys {
		if v, ok := p.Exporters[k]; ok && k != "" {
			return &v
		}
	}
	return nil
}

func scaled(p *float64, f float64) *float64 {
	if p == nil {
		return nil
	}
	v := *p * f
	return &v
}

// computeSlices is the compute slices of a model's GPU.
func computeSlices(model string) int {
	if m, ok := miggeometry.ByNVMLName(model); ok && m.ComputeSlices > 0 {
		return m.ComputeSlices
	}
	return defaultComputeSlices
}

// SliceShare is the part of a GPU a MIG device is: its compute slices over
// the GPU's. A compute instance ("1c.3g.40gb") is its compute slices of the
// GPU instance's. Names it cannot read count as the whole GPU instance of
// their "<n>g" part, or 0.
func SliceShare(model, profile string) float64 {
	total := float64(computeSlices(model))
	ci, gi := 0, profile
	if c, rest, ok := strings.Cut(profile, "c."); ok {
		if n, err := strconv.Atoi(c); err == nil {
			ci, gi = n, rest
		}
	}
	g := 0
	if m, ok := miggeometry.ByNVMLName(model); ok {
		if p, ok := m.ProfileByName(gi); ok {
			g = p.Compute
		}
	}
	if g == 0 {
		n, _, _ := strings.Cut(gi, "g")
		g, _ = strconv.Atoi(n)
	}
	if g <= 0 {
		return 0
	}
	share := float64(g) / total
	if ci > 0 && ci < g {
		share *= float64(ci) / float64(g)
	}
	return share
}

// CostShare is the part of a GPU a MIG device costs: the larger of its
// compute and memory slice fractions of the GPU (NVIDIA's profile table:
// a 3g.40gb takes 3 of an H100's 7 compute slices but 4 of its 8 memory
// slices, so only two fit on a GPU and each costs half of it). A compute
// instance ("1c.3g.40gb") costs its compute slices' part of its GPU
// instance's. A model or profile the table does not know costs its
// compute share (SliceShare).
func CostShare(model, profile string) float64 {
	ci, gi := 0, profile
	if c, rest, ok := strings.Cut(profile, "c."); ok {
		if n, err := strconv.Atoi(c); err == nil {
			ci, gi = n, rest
		}
	}
	m, ok := miggeometry.ByNVMLName(model)
	if !ok || m.ComputeSlices == 0 || m.MemorySlices == 0 {
		return SliceShare(model, profile)
	}
	p, ok := m.ProfileByName(gi)
	if !ok || p.Compute == 0 {
		return SliceShare(model, profile)
	}
	share := max(float64(p.Compute)/float64(m.ComputeSlices), float64(p.Memory)/float64(m.MemorySlices))
	if ci > 0 && ci < p.Compute {
		share *= float64(ci) / float64(p.Compute)
	}
	return share
}

// migProfiles are the plain GPU instance profiles of a model and their
// memory: the sizes the cluster's exporters serve where it has instances
// of the profile, else NVIDIA's documented ones.
func (o *Observation) migProfiles(model string) map[string]float64 {
	out := map[string]float64{}
	if m, ok := miggeometry.ByNVMLName(model); ok {
		for _, p := range m.Profiles {
			if plainProfile.MatchString(p.Name) {
				out[p.Name] = float64(p.MemoryMiB * mib)
			}
		}
	}
	for p, v := range o.migSizes[model] {
		out[p] = v
	}
	return out
}

// CurrentShape is the shape of a device a holding holds.
func (o *Observation) CurrentShape(h *Holding, sharedWith int, prices Prices) Shape {
	model := o.ModelOf(h.DeviceKey)
	s := Shape{Kind: KindGPU, Model: model, Accelerator: o.AcceleratorOf(h.Node, model), Compute: 1}
	gpuPrice := prices.PerGPUHour(model, s.Accelerator)
	gpuMemory := o.memory[DeviceKey{Node: h.Node, UUID: h.UUID}]
	if gpuMemory == 0 {
		gpuMemory = o.modelMem[model]
	}
	switch {
	case h.GPUInstance != "":
		s.Kind, s.Profile = KindMIG, h.MIGProfile
		s.Compute = SliceShare(model, h.MIGProfile)
		s.Memory = o.memory[DeviceKey{Node: h.Node, UUID: h.UUID, GPUInstance: h.GPUInstance}]
		if s.Memory == 0 {
			s.Memory = o.migProfiles(model)[h.MIGProfile]
		}
		s.PricePerHour = scaled(gpuPrice, CostShare(model, h.MIGProfile))
	case strings.HasSuffix(h.Resource, ".shared") || sharedWith > 1 || o.nodes[h.Node].replicas > 1:
		n := o.nodes[h.Node].replicas
		if n < 2 {
			n = max(sharedWith, 2)
		}
		s.Kind, s.Replicas = KindShare, n
		s.Compute = 1 / float64(n)
		s.Memory = gpuMemory / float64(n)
		s.PricePerHour = scaled(gpuPrice, 1/float64(n))
	default:
		s.Memory = gpuMemory
		s.PricePerHour = gpuPrice
	}
	return s
}

// ActivityScale converts a holding's measured activity into whole GPUs of
// its model: a MIG device's activity is of its own slices; a shared GPU's
// holder's (its processes' utilization) and a whole GPU's are of the GPU.
func ActivityScale(s Shape) float64 {
	if s.Kind == KindMIG {
		return s.Compute
	}
	return 1
}

// Candidates are the shapes instead of current that a pool of the
// cluster serves: MIG profiles of the same model a pool partitions its
// GPUs into, time-sliced shares of the same accelerator a pool offers, and
// whole GPUs of the other accelerators a pool has, whose throughput the
// accelerator table knows (relative to the current model's). With
// allowNew, also the shapes a new pool would serve: every plain MIG
// profile of the model (NVIDIA's table), shares of 2 to 8 replicas, and
// the table's accelerators the price list prices. Each names the pool
// that serves it (Pool), or the labels of the one to create.
func (o *Observation) Candidates(current Shape, prices Prices, allowNew bool) []Shape {
	pools := o.pools()
	var out []Shape
	offer := func(s Shape) {
		if p := servingPool(pools, s); p != nil {
			s.Pool = p.name
		} else if allowNew {
			s.Pool, s.NewPool = NewPoolPrefix+labelList(o.newPoolLabels(s)), true
		} else {
			return
		}
		out = append(out, s)
	}
	gpuPrice := prices.PerGPUHour(current.Model, current.Accelerator)
	for profile, mem := range o.migProfiles(current.Model) {
		if current.Kind == KindMIG && profile == current.Profile {
			continue
		}
		offer(Shape{Kind: KindMIG, Model: current.Model, Accelerator: current.Accelerator, Profile: profile,
			Memory: mem, Compute: SliceShare(current.Model, profile), PricePerHour: scaled(gpuPrice, CostShare(current.Model, profile))})
	}
	gpuMemory := o.modelMem[current.Model]
	if gpuMemory == 0 {
		if f, ok := LookupFacts(current.Accelerator, current.Model); ok {
			gpuMemory = f.MemoryGB * 1e9
		}
	}
	offered := map[int]bool{}
	for _, p := range pools {
		if p.replicas > 1 && p.accelerator == current.Accelerator {
			offered[p.replicas] = true
		}
	}
	if allowNew {
		for n := 2; n <= maxNewReplicas; n++ {
			offered[n] = true
		}
	}
	for n := range offered {
		if (current.Kind == KindShare && n == current.Replicas) || gpuMemory == 0 {
			continue
		}
		offer(Shape{Kind: KindShare, Model: current.Model, Accelerator: current.Accelerator, Replicas: n,
			Memory: gpuMemory / float64(n), Compute: 1 / float64(n), PricePerHour: scaled(gpuPrice, 1/float64(n))})
	}
	here, ok := LookupFacts(current.Accelerator, current.Model)
	if !ok {
		return sortShapes(out)
	}
	accels := o.accelerators()
	if allowNew {
		gke := o.gke()
		for _, f := range Facts() {
			name := ""
			if gke && len(f.GKE) > 0 {
				name = f.GKE[0]
			} else if len(f.NVML) > 0 {
				name = f.NVML[0]
			}
			if _, have := accels[name]; have || name == "" || hasAccelerator(accels, f) {
				continue
			}
			model := ""
			if len(f.NVML) > 0 {
				model = f.NVML[0]
			}
			if prices.PerGPUHour(model, name) != nil {
				accels[name] = model
			}
		}
	}
	for name, model := range accels {
		if name == current.Accelerator {
			continue
		}
		f, ok := LookupFacts(name, model)
		if !ok {
			continue
		}
		mem := o.modelMem[model]
		if mem == 0 {
			mem = f.MemoryGB * 1e9
		}
		if model == "" && len(f.NVML) > 0 {
			model = f.NVML[0]
		}
		offer(Shape{Kind: KindGPU, Model: model, Accelerator: name, Memory: mem,
			Compute: f.TFLOPS / here.TFLOPS, PricePerHour: prices.PerGPUHour(model, name)})
	}
	return sortShapes(out)
}

// maxNewReplicas is the most time-sliced replicas per GPU a new pool is
// proposed with.
const maxNewReplicas = 8

// hasAccelerator: the cluster has an accelerator of the table's row under
// another of its names.
func hasAccelerator(accels map[string]string, f AcceleratorFacts) bool {
	for name, model := range accels {
		if g, ok := LookupFacts(name, model); ok && sameFacts(g, f) {
			return true
		}
	}
	return false
}

func sameFacts(a, b AcceleratorFacts) bool {
	return strings.Join(a.GKE, ",") == strings.Join(b.GKE, ",") && strings.Join(a.NVML, ",") == strings.Join(b.NVML, ",")
}

// accelerators are the cluster's accelerators and their models: those of
// the nodes with an exporter, and those kube-state-metrics' node labels
// name on nodes with GPU capacity.
func (o *Observation) accelerators() map[string]string {
	out := map[string]string{}
	for node, a := range o.nodeAccel {
		if out[a] == "" {
			out[a] = o.nodeModel[node]
		}
	}
	for _, n := range o.nodes {
		if _, ok := out[n.accelerator]; !ok && n.accelerator != "" && n.capacity > 0 {
			out[n.accelerator] = ""
		}
	}
	return out
}

func sortShapes(s []Shape) []Shape {
	sort.Slice(s, func(i, j int) bool { return s[i].Name() < s[j].Name() })
	return s
}
