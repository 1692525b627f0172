package fleet

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/prometheus/common/model"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/promapi"
)

// The recorded series `fleet` reads. It reads nothing else, so it works
// wherever the rules run: one Prometheus, Thanos Query, GMP's frontend.
const (
	FreeSeries    = "nodepool_zone:gpu_free_devices:sum"
	GroupSeries   = "nodepool_zone:gpu_free_devices_largest_group:max"
	FittingSeries = "nodepool_zone:gpu_fitting_jobs:sum"
	IdleSeries    = "nodepool_zone:gpu_idle_allocated_devices:sum"
	// QuarantinedSeries are the devices of nodes a remediator holds (GKE's
	// XidCriticalError, NVSentinel's quarantine: alerts/remediators.yml),
	// per remediator; sparse: no series while nobody holds a node.
	QuarantinedSeries = "nodepool_zone:gpu_quarantined_devices:sum"
	IdleCostSeries    = "allocation:gpu_idle_cost_dollars_per_hour:share"
	ReplaceSeries     = "gpu:gpu_replacement_recommended:reason"
)

// rulesHint says which rules record the capacity series.
const rulesHint = "load gpu-pool-exporter.rules.yml (or, sharded, gpu-pool-exporter.global.rules.yml where the query goes and gpu-pool-exporter.shard.rules.yml in every shard), and give kube-state-metrics' kube_node_labels and the exporters a minute to be recorded"

// Snapshot is what `gpupool fleet` prints: where jobs fit, who holds
// GPUs idle at the highest cost, and which GPUs should be replaced.
type Snapshot struct {
	Capacity     []Capacity    `json:"capacity"`
	IdleHolders  []IdleHolder  `json:"idle_holders"`
	Replacements []Replacement `json:"replacements"`
}

// Capacity is one node pool in one zone.
type Capacity struct {
	NodePool    string `json:"nodepool"`
	Zone        string `json:"zone"`
	Accelerator string `json:"accelerator"`
	// FreeGPUs are free schedulable units (whole GPUs and MIG instances) on
	// schedulable nodes.
	FreeGPUs float64 `json:"free_gpus"`
	// LargestFreeGroup is the most free whole GPUs in one NVLink domain on
	// one node; nil when not recorded.
	LargestFreeGroup *float64 `json:"largest_free_group,omitempty"`
	// IdleAllocated are allocated units whose holders are all idle.
	IdleAllocated *float64 `json:"idle_allocated,omitempty"`
	// FittingJobs maps each task shape to how many more jobs of it fit.
	FittingJobs map[string]float64 `json:"fitting_jobs"`
	// Quarantined maps each remediator to the units of the nodes it holds:
	// out of service, in none of the figures above; empty when it holds
	// none.
	Quarantined map[string]float64 `json:"quarantined"`
}

// IdleHolder is one idle holder and what its share of the GPU costs.
type IdleHolder struct {
	Namespace      string  `json:"namespace"`
	Pod            string  `json:"pod"`
	Container      string  `json:"container"`
	Node           string  `json:"node"`
	GPU            string  `json:"gpu"`
	MIGProfile     string  `json:"mig_profile,omitempty"`
	DollarsPerHour float64 `json:"dollars_per_hour"`
}

// Replacement is a GPU recommended for replacement, with every reason
// recorded for it.
type Replacement struct {
	Node    string   `json:"node"`
	GPU     string   `json:"gpu"`
	UUID    string   `json:"uuid"`
	Reasons []string `json:"reasons"`
}

// label is the value of label name in m.
func label(m model.Metric, name string) string { return string(m[model.LabelName(name)]) }

// Read reads the recorded series. The free-capacity series must be
// there (the rules are loaded); the others may be empty: no idle holder
// with a price, no GPU to replace.
func Read(ctx context.Context, c *promapi.Client, top int) (*Snapshot, error) {
	free, err := c.Vector(ctx, FreeSeries)
	if err != nil {
		return nil, err
	}
	if len(free) == 0 {
		return nil, fmt.Errorf("no series %s in Prometheus: the recording rules are not loaded or have not run yet; %s", FreeSeries, rulesHint)
	}
	key := func(m model.Metric) [3]string {
		return [3]string{label(m, "nodepool"), label(m, "zone"), label(m, "accelerator")}
	}
	byKey := map[[3]string]*Capacity{}
	f := &Snapshot{Capacity: []Capacity{}, IdleHolders: []IdleHolder{}, Replacements: []Replacement{}}
	for _, s := range free {
		k := key(s.Metric)
		byKey[k] = &Capacity{NodePool: k[0], Zone: k[1], Accelerator: k[2], FreeGPUs: float64(s.Value), FittingJobs: map[string]float64{}, Quarantined: map[string]float64{}}
	}
	quarantined, err := c.Vector(ctx, QuarantinedSeries)
	if err != nil {
		return nil, err
	}
	for _, s := range quarantined {
		if fc := byKey[key(s.Metric)]; fc != nil {
			fc.Quarantined[label(s.Metric, "remediator")] += float64(s.Value)
		}
	}
	groups, err := c.Vector(ctx, GroupSeries+`{domain="nvlink"}`)
	if err != nil {
		return nil, err
	}
	for _, s := range groups {
		if fc := byKey[key(s.Metric)]; fc != nil {
			v := float64(s.Value)
			fc.LargestFreeGroup = &v
		}
	}
	idle, err := c.Vector(ctx, IdleSeries)
	if err != nil {
		return nil, err
	}
	for _, s := range idle {
		if fc := byKey[key(s.Metric)]; fc != nil {
			v := float64(s.Value)
			fc.IdleAllocated = &v
		}
	}
	fitting, err := c.Vector(ctx, FittingSeries)
	if err != nil {
		return nil, err
	}
	if len(fitting) == 0 {
		return nil, fmt.Errorf("series %s but no %s in Prometheus: the exporters predate gpu_fitting_jobs, or the rules file is older than the command; %s", FreeSeries, FittingSeries, rulesHint)
	}
	for _, s := range fitting {
		if fc := byKey[key(s.Metric)]; fc != nil {
			fc.FittingJobs[label(s.Metric, "shape")] = float64(s.Value)
		}
	}
	for _, fc := range byKey {
		f.Capacity = append(f.Capacity, *fc)
	}
	sort.Slice(f.Capacity, func(i, j int) bool {
		a, b := f.Capacity[i], f.Capacity[j]
		if a.NodePool != b.NodePool {
			return a.NodePool < b.NodePool
		}
		if a.Zone != b.Zone {
			return a.Zone < b.Zone
		}
		return a.Accelerator < b.Accelerator
	})

	holders, err := c.Vector(ctx, fmt.Sprintf("topk(%d, %s)", top, IdleCostSeries))
	if err != nil {
		return nil, err
	}
	for _, s := range holders {
		l := func(name string) string { return label(s.Metric, name) }
		f.IdleHolders = append(f.IdleHolders, IdleHolder{Namespace: l("namespace"), Pod: l("pod"), Container: l("container"),
			Node: l("node"), GPU: l("gpu"), MIGProfile: l("mig_profile"), DollarsPerHour: float64(s.Value)})
	}
	sort.SliceStable(f.IdleHolders, func(i, j int) bool {
		a, b := f.IdleHolders[i], f.IdleHolders[j]
		if a.DollarsPerHour != b.DollarsPerHour {
			return a.DollarsPerHour > b.DollarsPerHour
		}
		return a.Namespace+"/"+a.Pod+"/"+a.Container+"/"+a.Node+"/"+a.GPU < b.Namespace+"/"+b.Pod+"/"+b.Container+"/"+b.Node+"/"+b.GPU
	})

	repl, err := c.Vector(ctx, ReplaceSeries)
	if err != nil {
		return nil, err
	}
	byGPU := map[[3]string]*Replacement{}
	for _, s := range repl {
		k := [3]string{label(s.Metric, "node"), label(s.Metric, "gpu"), label(s.Metric, "uuid")}
		r := byGPU[k]
		if r == nil {
			r = &Replacement{Node: k[0], GPU: k[1], UUID: k[2]}
			byGPU[k] = r
		}
		if reason := label(s.Metric, "reason"); reason != "" && !slices.Contains(r.Reasons, reason) {
			r.Reasons = append(r.Reasons, reason)
		}
	}
	for _, r := range byGPU {
		sort.Strings(r.Reasons)
		f.Replacements = append(f.Replacements, *r)
	}
	sort.Slice(f.Replacements, func(i, j int) bool {
		a, b := f.Replacements[i], f.Replacements[j]
		if a.Node != b.Node {
			return a.Node < b.Node
		}
		return a.GPU < b.GPU
	})
	return f, nil
}

// Text prints the fleet as aligned tables.
func (f *Snapshot) Text(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPACITY (free GPUs on schedulable nodes; jobs of each task shape that fit now; GPUs quarantined by a remediator, by remediator)")
	fmt.Fprintln(tw, "NODEPOOL\tZONE\tACCELERATOR\tFREE\tLARGEST GROUP\tIDLE ALLOCATED\tQUARANTINED\tJOBS THAT FIT")
	for _, c := range f.Capacity {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.NodePool, c.Zone, c.Accelerator, num(c.FreeGPUs),
			optNum(c.LargestFreeGroup), optNum(c.IdleAllocated), quarantinedText(c.Quarantined), fitting(c.FittingJobs))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "IDLE HOLDERS (the most costly first)")
	if len(f.IdleHolders) == 0 {
		fmt.Fprintln(tw, "none (or no GPU price configured: --idle.price-file, --idle.price)")
	} else {
		fmt.Fprintln(tw, "NAMESPACE\tPOD\tCONTAINER\tNODE\tGPU\t$/HOUR")
		for _, h := range f.IdleHolders {
			gpu := h.GPU
			if h.MIGProfile != "" {
				gpu += " (" + h.MIGProfile + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\n", h.Namespace, h.Pod, h.Container, h.Node, gpu, h.DollarsPerHour)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "REPLACEMENT RECOMMENDED")
	if len(f.Replacements) == 0 {
		fmt.Fprintln(tw, "none")
	} else {
		fmt.Fprintln(tw, "NODE\tGPU\tUUID\tREASONS")
		for _, r := range f.Replacements {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Node, r.GPU, r.UUID, strings.Join(r.Reasons, ", "))
		}
	}
	return tw.Flush()
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// quarantinedText is the units quarantined, in total and by remediator
// ("4 (gke:3 nvsentinel:1)"), or 0.
func quarantinedText(m map[string]float64) string {
	if len(m) == 0 {
		return "0"
	}
	var total float64
	parts := make([]string, 0, len(m))
	for _, r := range slices.Sorted(maps.Keys(m)) {
		total += m[r]
		parts = append(parts, r+":"+num(m[r]))
	}
	return num(total) + " (" + strings.Join(parts, " ") + ")"
}

func optNum(v *float64) string {
	if v == nil {
		return "-"
	}
	return num(*v)
}

// fitting lists "shape:jobs" with whole-GPU shapes by size, then MIG shapes.
func fitting(m map[string]float64) string {
	shapes := make([]string, 0, len(m))
	for s := range m {
		shapes = append(shapes, s)
	}
	sort.Slice(shapes, func(i, j int) bool {
		a, aerr := strconv.Atoi(shapes[i])
		b, berr := strconv.Atoi(shapes[j])
		switch {
		case aerr == nil && berr == nil:
			return a < b
		case aerr == nil || berr == nil:
			return aerr == nil
		}
		return shapes[i] < shapes[j]
	})
	parts := make([]string, len(shapes))
	for i, s := range shapes {
		parts[i] = s + ":" + num(m[s])
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}
