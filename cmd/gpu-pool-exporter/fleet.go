package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/alecthomas/kingpin/v2"
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
	promURL := app.Flag("prometheus", "Base URL of the Prometheus query API: Prometheus, Thanos Query, GMP's frontend (http[s]://host:port[/prefix]).").Required().String()
	tokenFile := app.Flag("prometheus.bearer-token-file", "File holding a bearer token sent to Prometheus (read on every run).").String()
	timeout := app.Flag("timeout", "How long to wait for Prometheus, all queries together.").Default("30s").Duration()
	output := app.Flag("output", "Output format: table or json.").Short('o').Default("table").String()
	top := app.Flag("top", "How many idle holders to list, the most costly first.").Default("10").Int()
	insecure := app.Flag("tls.insecure-skip-verify", "Do not verify Prometheus' TLS certificate.").Bool()
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
	c, err := newPromClient(*promURL, *tokenFile, *insecure)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter fleet: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
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

// promClient queries Prometheus' HTTP API.
type promClient struct {
	base   *url.URL
	token  string
	client *http.Client
}

func newPromClient(raw, tokenFile string, insecure bool) (*promClient, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--prometheus=%s: want a URL such as http://prometheus:9090 (or Thanos Query's, or GMP frontend's)", raw)
	}
	c := &promClient{base: u, client: &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure}}, //nolint:gosec // the user asked for it
	}}
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--prometheus.bearer-token-file: %w", err)
		}
		c.token = strings.TrimSpace(string(b))
		if c.token == "" {
			return nil, fmt.Errorf("--prometheus.bearer-token-file=%s is empty", tokenFile)
		}
	}
	return c, nil
}

// promSample is one series of an instant vector.
type promSample struct {
	Labels map[string]string
	Value  float64
}

// query runs an instant query and returns its vector.
func (c *promClient) query(ctx context.Context, expr string) ([]promSample, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/api/v1/query"
	u.RawQuery = url.Values{"query": {expr}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, fmt.Errorf("no answer from Prometheus at %s within --timeout (query %s)", c.base.Redacted(), expr)
		}
		return nil, fmt.Errorf("cannot reach Prometheus at %s: %v (check --prometheus)", c.base.Redacted(), err)
	}
	defer resp.Body.Close()
	var r struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading Prometheus' answer to %s: %w", expr, err)
	}
	if jerr := json.Unmarshal(body, &r); jerr != nil || r.Status == "" {
		msg := strings.TrimSpace(string(body))
		if len(msg) > 200 {
			msg = msg[:200] + "..."
		}
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return nil, fmt.Errorf("%s answered %s: pass a token with --prometheus.bearer-token-file (%s)", u.Redacted(), resp.Status, msg)
		}
		return nil, fmt.Errorf("%s answered %s, not Prometheus' query API (is --prometheus the API's base URL?): %s", u.Redacted(), resp.Status, msg)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s rejected by Prometheus: %s: %s", expr, r.ErrorType, r.Error)
	}
	if r.Data.ResultType != "vector" {
		return nil, fmt.Errorf("the answer to %s is a %s, want a vector", expr, r.Data.ResultType)
	}
	out := make([]promSample, 0, len(r.Data.Result))
	for _, s := range r.Data.Result {
		str, _ := s.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("the answer to %s has value %v: %w", expr, s.Value[1], err)
		}
		out = append(out, promSample{Labels: s.Metric, Value: v})
	}
	return out, nil
}

// queryFleet reads the recorded series. The free-capacity series must be
// there (the rules are loaded); the others may be empty: no idle holder
// with a price, no GPU to replace.
func queryFleet(ctx context.Context, c *promClient, top int) (*Fleet, error) {
	free, err := c.query(ctx, fleetFreeSeries)
	if err != nil {
		return nil, err
	}
	if len(free) == 0 {
		return nil, fmt.Errorf("no series %s in Prometheus: the recording rules are not loaded or have not run yet; %s", fleetFreeSeries, fleetRulesHint)
	}
	key := func(l map[string]string) [3]string { return [3]string{l["nodepool"], l["zone"], l["accelerator"]} }
	byKey := map[[3]string]*FleetCapacity{}
	f := &Fleet{Capacity: []FleetCapacity{}, IdleHolders: []FleetIdleHolder{}, Replacements: []FleetReplacement{}}
	for _, s := range free {
		k := key(s.Labels)
		byKey[k] = &FleetCapacity{NodePool: k[0], Zone: k[1], Accelerator: k[2], FreeGPUs: s.Value, FittingJobs: map[string]float64{}}
	}
	groups, err := c.query(ctx, fleetGroupSeries+`{domain="nvlink"}`)
	if err != nil {
		return nil, err
	}
	for _, s := range groups {
		if fc := byKey[key(s.Labels)]; fc != nil {
			v := s.Value
			fc.LargestFreeGroup = &v
		}
	}
	idle, err := c.query(ctx, fleetIdleSeries)
	if err != nil {
		return nil, err
	}
	for _, s := range idle {
		if fc := byKey[key(s.Labels)]; fc != nil {
			v := s.Value
			fc.IdleAllocated = &v
		}
	}
	fitting, err := c.query(ctx, fleetFittingSeries)
	if err != nil {
		return nil, err
	}
	if len(fitting) == 0 {
		return nil, fmt.Errorf("series %s but no %s in Prometheus: the exporters predate gpu_fitting_jobs, or the rules file is older than the command; %s", fleetFreeSeries, fleetFittingSeries, fleetRulesHint)
	}
	for _, s := range fitting {
		if fc := byKey[key(s.Labels)]; fc != nil {
			fc.FittingJobs[s.Labels["shape"]] = s.Value
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

	holders, err := c.query(ctx, fmt.Sprintf("topk(%d, %s)", top, fleetIdleCostSeries))
	if err != nil {
		return nil, err
	}
	for _, s := range holders {
		l := s.Labels
		f.IdleHolders = append(f.IdleHolders, FleetIdleHolder{Namespace: l["namespace"], Pod: l["pod"], Container: l["container"],
			Node: l["node"], GPU: l["gpu"], MIGProfile: l["mig_profile"], DollarsPerHour: s.Value})
	}
	sort.SliceStable(f.IdleHolders, func(i, j int) bool {
		a, b := f.IdleHolders[i], f.IdleHolders[j]
		if a.DollarsPerHour != b.DollarsPerHour {
			return a.DollarsPerHour > b.DollarsPerHour
		}
		return a.Namespace+"/"+a.Pod+"/"+a.Container+"/"+a.Node+"/"+a.GPU < b.Namespace+"/"+b.Pod+"/"+b.Container+"/"+b.Node+"/"+b.GPU
	})

	repl, err := c.query(ctx, fleetReplaceSeries)
	if err != nil {
		return nil, err
	}
	byGPU := map[[3]string]*FleetReplacement{}
	for _, s := range repl {
		l := s.Labels
		k := [3]string{l["node"], l["gpu"], l["uuid"]}
		r := byGPU[k]
		if r == nil {
			r = &FleetReplacement{Node: k[0], GPU: k[1], UUID: k[2]}
			byGPU[k] = r
		}
		if reason := l["reason"]; reason != "" && !slices.Contains(r.Reasons, reason) {
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
