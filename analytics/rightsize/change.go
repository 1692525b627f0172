package rightsize

import "sort"

// podChange is what a person would change in a workload's pod template
// to follow a recommendation: the GPU resource its containers ask for and
// the nodeSelector that puts it on the pool serving the new shape. The
// command prints it (-o yaml); it never applies it.
type podChange struct {
	containers   []string
	oldResource  string
	newResource  string // "" to release the GPUs
	count        int
	nodeSelector map[string]string
}

// changeFor is the change of a row's recommendation, nil where nothing
// changes (keep) or the data carry no recommendation.
func (o *Observation) changeFor(wh *workloadHoldings, current Shape, c Choice) *podChange {
	if c.Recommendation == RecommendKeep || c.Recommendation == InsufficientData {
		return nil
	}
	seen := map[string]bool{}
	ch := &podChange{}
	for _, h := range wh.current {
		if !seen[h.Container] {
			seen[h.Container] = true
			ch.containers = append(ch.containers, h.Container)
		}
		if ch.oldResource == "" {
			ch.oldResource = h.Resource
		}
	}
	sort.Strings(ch.containers)
	if ch.oldResource == "" {
		ch.oldResource = "nvidia.com/gpu"
	}
	if c.Recommendation == RecommendRelease {
		return ch
	}
	ch.count = c.Devices
	shape := current
	if c.Shape != nil {
		shape = *c.Shape
	}
	var pool *nodePool
	if !shape.NewPool {
		pool = servingPool(o.pools(), shape)
		if pool == nil {
			pool = o.poolOf(wh.current[0].Node)
		}
	}
	ch.newResource = o.resourceFor(shape, pool)
	ch.nodeSelector = o.selectorFor(shape, pool)
	return ch
}
