package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/model"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/cmd/gpu-pool-exporter/internal/promapi"
)

// The recorded series `fleet` reads. It reads nothing else, so it works
// wherever the rules run: one Prometheus, Thanos Query, GMP's frontend.
const (
	fleetFreeSeries     = "nodepool_zone:gpu_free_devices:sum"
	fleetGroupSeries    = "nodepool_zone:gpu_free_devices_largest_group:max"
	fleetFittingSeries  = "nodepool_zone:gpu_fitting_jobs:sum"
	fleetIdleSeries     = "nodepool_zone:gpu_idle_allocated_devices:sum"
	fleetIdleCostSeries = "allocation:gpu_idle_cost_dollars_per_hour:share"
	fleetReplaceSeries  = "gpu:gpu_replacement_recommended:reason"
)

// fleetRulesHint says which rules record the capacity series.
const fleetRulesHint = "load gpu-pool-exporter.rules.yml (or, sharded, gpu-pool-exporter.global.rules.yml where the query goes and gpu-pool-exporter.shard.rules.yml in every shard), and give kube-state-metrics' kube_node_labels and the exporters a minute to be recorded"

// Fleet is what `gpu-pool-exporter fleet` prints: where jobs fit, who holds
// GPUs idle at the highest cost, and which GPUs should be replaced.
type Fleet struct {
	Capacity     []FleetCapacity    `json:"capacity"`
	IdleHolders  []FleetIdleHolder  `json:"idle_holders"`
	Replacements []FleetReplacement `json:"replacements"`
}

// FleetCapacity is one node pool in one zone.
type FleetCapacity struct {
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
}

// FleetIdleHolder is one idle holder and what its share of the GPU costs.
type FleetIdleHolder struct {
	Namespace      string  `json:"namespace"`
	Pod            string  `json:"pod"`
	Container      string  `json:"container"`
	Node           string  `json:"node"`
	GPU            string  `json:"gpu"`
	MIGProfile     string  `json:"mig_profile,omitempty"`
	DollarsPerHour float64 `json:"dollars_per_hour"`
}

// FleetReplacement is a GPU recommended for replacement, with every reason
// recorded for it.
type FleetReplacement struct {
	Node    string   `json:"node"`
	GPU     string   `json:"gpu"`
	UUID    string   `json:"uuid"`
	Reasons []string `json:"reasons"`
}

// runFleet is `gpu-pool-exporter fleet`: the fleet's capacity, idle cost and
// replacements from the recorded series of a Prometheus (or anything that
// serves its query API).
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := kingpin.New("gpu-pool-exporter fleet", "Print, from the recording rules in Prometheus, per node pool and zone the free GPUs and the jobs of each task shape that fit, the idle holders that cost most, and the GPUs recommended for replacement.")
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	var done bool
	app.Terminate(func(int) { done = true })
	prom := promapi.AddFlags(app, "30s")
	output := app.Flag("output", "Output format: table or json.").Short('o').Default("table").String()
	top := app.Flag("top", "How many idle holders to list, the most costly first.").Default("10").Int()
	if _, err := app.Parse(args); err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: %v (see --help)\n", err)
		return exitUsage
	}
	if done {
		return exitOK
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: --output=%s: want table or json\n", *output)
		return exitUsage
	}
	if *top < 1 {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: --top=%d: want at least 1\n", *top)
		return exitUsage
	}
	c, err := prom.NewClient()
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: %v\n", err)
		return exitUsage
	}
	c.Warnings = stderr
	ctx, cancel := prom.Context(ctx)
	defer cancel()
	f, err := queryFleet(ctx, c, *top)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: %v\n", err)
		return exitError
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(f)
	} else {
		err = f.Text(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: %v\n", err)
		return exitError
	}
	return exitOK
}

// label is the value of label name in m.
func label(m model.Metric, name string) string { return string(m[model.LabelName(name)]) }

// queryFleet reads the recorded series. The free-capacity series must be
// there (the rules are loaded); the others may be empty: no idle holder
// with a price, no GPU to replace.
func queryFleet(ctx context.Context, c *promapi.Client, top int) (*Fleet, error) {
	free, err := c.Vector(ctx, fleetFreeSeries)
	if err != nil {
		return nil, err
	}
	if len(free) == 0 {
		return nil, fmt.Errorf("no series %s in Prometheus: the recording rules are not loaded or have not run yet; %s", fleetFreeSeries, fleetRulesHint)
	}
	key := func(m model.Metric) [3]string {
		return [3]string{label(m, "nodepool"), label(m, "zone"), label(m, "accelerator")}
	}
	byKey := map[[3]string]*FleetCapacity{}
	f := &Fleet{Capacity: []FleetCapacity{}, IdleHolders: []FleetIdleHolder{}, Replacements: []FleetReplacement{}}
	for _, s := range free {
		k := key(s.Metric)
		byKey[k] = &FleetCapacity{NodePool: k[0], Zone: k[1], Accelerator: k[2], FreeGPUs: float64(s.Value), FittingJobs: map[string]float64{}}
	}
	groups, err := c.Vector(ctx, fleetGroupSeries+`{domain="nvlink"}`)
	if err != nil {
		return nil, err
	}
	for _, s := range groups {
		if fc := byKey[key(s.Metric)]; fc != nil {
			v := float64(s.Value)
			fc.LargestFreeGroup = &v
		}
	}
	idle, err := c.Vector(ctx, fleetIdleSeries)
	if err != nil {
		return nil, err
	}
	for _, s := range idle {
		if fc := byKey[key(s.Metric)]; fc != nil {
			v := float64(s.Value)
			fc.IdleAllocated = &v
		}
	}
	fitting, err := c.Vector(ctx, fleetFittingSeries)
	if err != nil {
		return nil, err
	}
	if len(fitting) == 0 {
		return nil, fmt.Errorf("series %s but no %s in Prometheus: the exporters predate gpu_fitting_jobs, or the rules file is older than the command; %s", fleetFreeSeries, fleetFittingSeries, fleetRulesHint)
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

	holders, err := c.Vector(ctx, fmt.Sprintf("topk(%d, %s)", top, fleetIdleCostSeries))
	if err != nil {
		return nil, err
	}
	for _, s := range holders {
		l := func(name string) string { return label(s.Metric, name) }
		f.IdleHolders = append(f.IdleHolders, FleetIdleHolder{Namespace: l("namespace"), Pod: l("pod"), Container: l("container"),
			Node: l("node"), GPU: l("gpu"), MIGProfile: l("mig_profile"), DollarsPerHour: float64(s.Value)})
	}
	sort.SliceStable(f.IdleHolders, func(i, j int) bool {
		a, b := f.IdleHolders[i], f.IdleHolders[j]
		if a.DollarsPerHour != b.DollarsPerHour {
			return a.DollarsPerHour > b.DollarsPerHour
		}
		return a.Namespace+"/"+a.Pod+"/"+a.Container+"/"+a.Node+"/"+a.GPU < b.Namespace+"/"+b.Pod+"/"+b.Container+"/"+b.Node+"/"+b.GPU
	})

	repl, err := c.Vector(ctx, fleetReplaceSeries)
	if err != nil {
		return nil, err
	}
	byGPU := map[[3]string]*FleetReplacement{}
	for _, s := range repl {
		k := [3]string{label(s.Metric, "node"), label(s.Metric, "gpu"), label(s.Metric, "uuid")}
		r := byGPU[k]
		if r == nil {
			r = &FleetReplacement{Node: k[0], GPU: k[1], UUID: k[2]}
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
func (f *Fleet) Text(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CAPACITY (free GPUs on schedulable nodes; jobs of each task shape that fit now)")
	fmt.Fprintln(tw, "NODEPOOL\tZONE\tACCELERATOR\tFREE\tLARGEST GROUP\tIDLE ALLOCATED\tJOBS THAT FIT")
	for _, c := range f.Capacity {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.NodePool, c.Zone, c.Accelerator, num(c.FreeGPUs),
			optNum(c.LargestFreeGroup), optNum(c.IdleAllocated), fitting(c.FittingJobs))
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
