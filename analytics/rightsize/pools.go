package rightsize

import (
	"sort"
	"strconv"
	"strings"
)

// whole: the pool serves whole GPUs (no MIG device, no time-slicing).
func (p *nodePool) whole() bool { return len(p.profiles) == 0 && p.replicas < 2 }

// pools are the cluster's GPU node pools at the window's end.
func (o *Observation) pools() []*nodePool {
	if o.poolList == nil {
		o.poolList = o.readPools()
	}
	return o.poolList
}

func (o *Observation) readPools() []*nodePool {
	byName := map[string]*nodePool{}
	nodes := map[string]bool{}
	for n := range o.nodeModel {
		nodes[n] = true
	}
	for n, l := range o.nodes {
		if l.capacity > 0 || l.accelerator != "" {
			nodes[n] = true
		}
	}
	for node := range nodes {
		l := o.nodes[node]
		name := l.pool
		if name == "" {
			name = "node/" + node
		}
		p := byName[name]
		if p == nil {
			p = &nodePool{name: name, label: l.poolLabel, gke: l.gke, profiles: map[string]bool{}}
			byName[name] = p
		}
		model := o.nodeModel[node]
		if p.model == "" {
			p.model = model
		}
		if a := o.AcceleratorOf(node, model); p.accelerator == "" {
			p.accelerator = a
		}
		if p.product == "" {
			p.product = l.product
		}
		p.replicas = max(p.replicas, l.replicas)
		if l.migStrategy != "" {
			p.migStrategy = l.migStrategy
		}
		for prof := range o.nodeProfiles[node] {
			p.profiles[prof] = true
		}
		if plainProfile.MatchString(l.partitionSize) {
			p.profiles[l.partitionSize] = true
		}
		if c, ok := strings.CutPrefix(l.migConfig, "all-"); ok && plainProfile.MatchString(c) {
			p.profiles[c] = true
		}
	}
	nodePools := map[string]*nodePool{}
	for node := range nodes {
		name := o.nodes[node].pool
		if name == "" {
			name = "node/" + node
		}
		nodePools[node] = byName[name]
	}
	for _, h := range o.Holdings {
		if p := nodePools[h.Node]; p != nil {
			p.sharedResource = p.sharedResource || strings.HasSuffix(h.Resource, ".shared")
			p.migResource = p.migResource || strings.HasPrefix(h.Resource, "nvidia.com/mig-")
		}
	}
	out := make([]*nodePool, 0, len(byName))
	for _, p := range byName {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// poolOf is the pool a node belongs to.
func (o *Observation) poolOf(node string) *nodePool {
	name := o.nodes[node].pool
	if name == "" {
		name = "node/" + node
	}
	for _, p := range o.pools() {
		if p.name == name {
			return p
		}
	}
	return nil
}

// serves says whether a pool serves a shape.
func (p *nodePool) serves(s Shape) bool {
	sameGPU := p.accelerator == s.Accelerator || s.Model != "" && p.model == s.Model
	switch s.Kind {
	case KindMIG:
		return sameGPU && p.profiles[s.Profile]
	case KindShare:
		return sameGPU && p.replicas == s.Replicas
	}
	return sameGPU && p.whole()
}

// servingPool is the first pool (by name) that serves a shape, or nil.
func servingPool(pools []*nodePool, s Shape) *nodePool {
	for _, p := range pools {
		if p.serves(s) {
			return p
		}
	}
	return nil
}

// gke says whether the cluster is GKE's (its nodes carry GKE's pool label).
func (o *Observation) gke() bool {
	for _, n := range o.nodes {
		if n.gke {
			return true
		}
	}
	return false
}

// gfdProduct is GPU Feature Discovery's nvidia.com/gpu.product for an
// NVML model name: spaces as "-".
func gfdProduct(model string) string { return strings.ReplaceAll(model, " ", "-") }

// newPoolLabels are the node labels of a pool that would serve a shape:
// on GKE its accelerator and partition size or time-sharing labels; else
// GPU Feature Discovery's product with the GPU Operator's MIG config or
// the device plugin's time-slicing replicas.
func (o *Observation) newPoolLabels(s Shape) [][2]string {
	if o.gke() {
		acc := s.Accelerator
		if f, ok := LookupFacts(s.Accelerator, s.Model); ok && len(f.GKE) > 0 && !strings.HasPrefix(acc, "nvidia-") {
			acc = f.GKE[0]
		}
		l := [][2]string{{"cloud.google.com/gke-accelerator", acc}}
		switch s.Kind {
		case KindMIG:
			l = append(l, [2]string{"cloud.google.com/gke-gpu-partition-size", s.Profile})
		case KindShare:
			l = append(l, [2]string{"cloud.google.com/gke-gpu-sharing-strategy", "time-sharing"},
				[2]string{"cloud.google.com/gke-max-shared-clients-per-gpu", strconv.Itoa(s.Replicas)})
		}
		return l
	}
	model := s.Model
	if model == "" {
		if f, ok := LookupFacts(s.Accelerator); ok && len(f.NVML) > 0 {
			model = f.NVML[0]
		} else {
			model = s.Accelerator
		}
	}
	l := [][2]string{{"nvidia.com/gpu.product", gfdProduct(model)}}
	switch s.Kind {
	case KindMIG:
		l = append(l, [2]string{"nvidia.com/mig.config", "all-" + s.Profile})
	case KindShare:
		l = append(l, [2]string{"nvidia.com/gpu.replicas", strconv.Itoa(s.Replicas)})
	}
	return l
}

func labelList(l [][2]string) string {
	parts := make([]string, len(l))
	for i, kv := range l {
		parts[i] = kv[0] + "=" + kv[1]
	}
	return strings.Join(parts, ", ")
}

// NewPoolPrefix starts a recommendation's pool where no pool serves it:
// the labels of the pool to create follow.
const NewPoolPrefix = "new pool: "

// resourceFor is the extended resource a pod asks for a shape with on a
// pool (nil pool: a new one): GKE gives MIG partitions and time-shared
// GPUs as nvidia.com/gpu; the GPU Operator MIG devices as
// nvidia.com/mig-<profile> under its mixed strategy (nvidia.com/gpu under
// single), and time-sliced replicas as nvidia.com/gpu unless renamed
// (nvidia.com/gpu.shared).
func (o *Observation) resourceFor(s Shape, p *nodePool) string {
	gke := o.gke()
	if p != nil {
		gke = p.gke
	}
	switch s.Kind {
	case KindMIG:
		switch {
		case p != nil && (p.migStrategy == "mixed" || p.migStrategy == "" && p.migResource):
			return "nvidia.com/mig-" + s.Profile
		case p == nil && !gke:
			return "nvidia.com/mig-" + s.Profile
		}
	case KindShare:
		if p != nil && p.sharedResource {
			return "nvidia.com/gpu.shared"
		}
	}
	return "nvidia.com/gpu"
}

// selectorFor is the nodeSelector that puts a pod on a pool (nil: a new
// pool, selected by its labels).
func (o *Observation) selectorFor(s Shape, p *nodePool) map[string]string {
	out := map[string]string{}
	if p != nil && p.label != "" {
		out[p.label] = p.name
		return out
	}
	for _, kv := range o.newPoolLabels(s) {
		out[kv[0]] = kv[1]
	}
	return out
}
