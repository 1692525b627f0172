// Package pages turns what the exporter really serves into promtool test
// input: it runs the exporter in-process on a simulated node (a scenario of
// sim/simnode) under a simulated clock, takes its page every minute,
// and writes the series the shipped rules read as promtool input_series.
//
// A fixture source (testdata/*.yml) names a scenario, how long to run it,
// when the exporter restarts, and the promtool assertions; Render writes the
// whole promtool test file, alerts/tests/pages_<name>_test.yml, with the
// generated input and, at every check time, an assertion that each alert the
// source does not name there stays quiet. `make generate` (scripts/generate,
// through Generate) rewrites the committed files, and `make test` fails
// while one is stale.
//
// What the simulated exporter serves here: NVML (devices, MIG instances and
// compute instances, health, ECC, XIDs through the event set) and the
// kubelet's pod map through a fake kubelet on a private socket; where the
// source asks, DCGM (the simulated node's host engine, sampled at each of
// the exporter's samples) and per-process accounting (NVML's process lists
// over the simulated host's /proc and /var/log/containers), as the binary
// runs them with --dcgm.mode and --procs.enabled.
package pages

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakedcgm"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/rs/zerolog"
	"go.yaml.in/yaml/v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
	simwing "github.com/gpu-pool-exporter/gpu-pool-exporter/sim"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// Source is a fixture source: testdata/<name>.yml.
type Source struct {
	// Comment is written at the top of the test, as its description.
	Comment string `yaml:"comment"`
	// Scenario is a simulated node's scenario (sim/simnode), inline;
	// empty: the built-in default node.
	Scenario string `yaml:"scenario"`
	// Minutes is how long the exporter runs; a page every minute.
	Minutes int `yaml:"minutes"`
	// Restarts are the minutes at which the exporter restarts: that
	// minute's scrape fails (up 0, the old series go stale) and a new
	// process, which counts XIDs and ECC growth from nothing, serves the
	// next.
	Restarts []int `yaml:"restarts"`
	// KubeStateMetrics are series of kube-state-metrics (nodes, Pending
	// pods) beside the exporter's pages, in promtool's input_series form
	// over the whole run, with job="kube-state-metrics".
	KubeStateMetrics []InputSeries `yaml:"kubeStateMetrics"`
	// DCGM: the node runs a DCGM host engine; the exporter reads it.
	DCGM bool `yaml:"dcgm"`
	// Processes: per-process accounting is on (the simulated host's /proc).
	Processes bool `yaml:"processes"`
	// IdleWindow is the exporter's --idle.window (default 30m).
	IdleWindow string `yaml:"idleWindow"`
	// QuietEvery: every this many minutes (and at the end), each alert the
	// source's alert_rule_test does not check at that time must be quiet.
	QuietEvery int `yaml:"quietEvery"`
	// Firing are the alerts that fire, each from one check time to another
	// (until: the end when empty): at every quiet check time in between (or
	// at the times of at, where an annotation changes with time), exactly
	// exp_alerts fire (promtool's exp_alerts); the alert is not checked
	// quiet inside the span.
	Firing []Firing `yaml:"firing"`
	// Tests are further promtool assertions: alert_rule_test and
	// promql_expr_test, as in a promtool test file.
	AlertRuleTest  []AlertTest `yaml:"alert_rule_test"`
	PromQLExprTest []yaml.Node `yaml:"promql_expr_test"`
}

// InputSeries is one promtool input series.
type InputSeries struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

// KubeStateMetricsNamespace is the namespace kube-state-metrics runs in on
// GKE Managed Prometheus (its managed collection).
const KubeStateMetricsNamespace = "gmp-public"

// Firing is an alert that fires over a span of the run.
type Firing struct {
	Alertname string      `yaml:"alertname"`
	From      string      `yaml:"from"`
	Until     string      `yaml:"until"`
	At        []string    `yaml:"at"`
	ExpAlerts []yaml.Node `yaml:"exp_alerts"`
}

// Span returns the firing span in minutes.
func (f Firing) Span(minutes int) (from, until int, err error) {
	d, err := model.ParseDuration(f.From)
	if err != nil {
		return 0, 0, fmt.Errorf("firing %s: from %q: %w", f.Alertname, f.From, err)
	}
	from, until = int(time.Duration(d)/time.Minute), minutes
	if f.Until != "" {
		u, err := model.ParseDuration(f.Until)
		if err != nil {
			return 0, 0, fmt.Errorf("firing %s: until %q: %w", f.Alertname, f.Until, err)
		}
		until = int(time.Duration(u) / time.Minute)
	}
	return from, until, nil
}

// AlertTest is one promtool alert_rule_test.
type AlertTest struct {
	EvalTime  string      `yaml:"eval_time"`
	Alertname string      `yaml:"alertname"`
	ExpAlerts []yaml.Node `yaml:"exp_alerts"`
}

// Target labels the scrape configuration adds to the exporter's series.
const (
	Job      = "gpu-pool-exporter"
	Instance = "10.0.0.1:9947"
	// sampleEvery is the exporter's sample interval under the simulated
	// clock; a page is kept every minute.
	sampleEvery = 15 * time.Second
)

// LoadSource reads a fixture source.
func LoadSource(path string) (*Source, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Source
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if s.Minutes <= 0 || s.Minutes > 240 {
		return nil, fmt.Errorf("%s: minutes is %d: give 1 to 240", path, s.Minutes)
	}
	if s.QuietEvery <= 0 {
		return nil, fmt.Errorf("%s: quietEvery is %d: give the minutes between quiet checks (e.g. 5)", path, s.QuietEvery)
	}
	if s.IdleWindow != "" {
		if d, err := model.ParseDuration(s.IdleWindow); err != nil || d <= 0 {
			return nil, fmt.Errorf("%s: idleWindow %q: give a duration such as 5m", path, s.IdleWindow)
		}
	}
	for _, r := range s.Restarts {
		if r <= 0 || r >= s.Minutes {
			return nil, fmt.Errorf("%s: restart at minute %d: give one between 1 and %d", path, r, s.Minutes-1)
		}
	}
	return &s, nil
}

// Series is one series over the run: a value per minute, or none.
type Series struct {
	Labels string // {name="value",...} with the metric name in front
	Values []*float64
	// Stale marks the minutes at which Prometheus writes a stale marker (the
	// scrape failed, or the series left the page).
	Stale []bool
}

// Run runs the exporter over the scenario for src.Minutes and returns every
// series whose metric name is in keep (all when keep is nil), sorted, with
// the target labels job, instance and node (the scenario's node name).
func Run(src *Source, keep map[string]bool) ([]*Series, error) {
	var sc *simnode.Scenario
	if strings.TrimSpace(src.Scenario) == "" {
		sc = simnode.DefaultScenario()
	} else {
		var err error
		if sc, err = simnode.ParseScenario("fixture", []byte(src.Scenario)); err != nil {
			return nil, err
		}
	}
	node := sc.Node.Name // the scrape configuration's node label
	if node == "" {
		return nil, fmt.Errorf("the scenario names no node (node.name): the series' node label comes from it")
	}
	clk := &clock{t: time.Unix(0, 0).UTC()}
	dir, err := os.MkdirTemp("", "gpe-pages-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	sim, err := simnode.New(sc, simnode.WithClock(clk.Now), simnode.WithHostDir(filepath.Join(dir, "host")))
	if err != nil {
		return nil, err
	}
	defer sim.Close()
	opts := processOptions{procs: src.Processes}
	if src.DCGM {
		opts.dcgm = sim.DCGM() // the host engine outlives exporter restarts
	}
	if src.IdleWindow != "" {
		d, _ := model.ParseDuration(src.IdleWindow)
		opts.idleWindow = time.Duration(d)
	}
	socket := filepath.Join(dir, "kubelet.sock")
	kubelet := fakekubelet.New(socket)
	kubelet.SetPods(sim.KubeletPods())
	kubelet.SetAllocatable(sim.KubeletAllocatable())
	if err := kubelet.Start(); err != nil {
		return nil, err
	}
	defer kubelet.Stop()

	restarts := map[int]bool{}
	for _, r := range src.Restarts {
		restarts[r] = true
	}
	var (
		proc    *process
		series  = map[string]*Series{}
		minutes = src.Minutes + 1
	)
	defer func() {
		if proc != nil {
			proc.stop()
		}
	}()
	record := func(m int, up float64) error {
		var page []byte
		if up == 1 {
			page = proc.node.Exporter.Page().Plain
		}
		if err := addPage(series, page, m, minutes, node, up, keep); err != nil {
			return fmt.Errorf("minute %d: %w", m, err)
		}
		return nil
	}
	if proc, err = startProcess(sim, clk, kubelet, opts); err != nil {
		return nil, err
	}
	if err := proc.sample(sim); err != nil {
		return nil, err
	}
	if err := record(0, 1); err != nil {
		return nil, err
	}
	for m := 1; m < minutes; m++ {
		if restarts[m] {
			// The process dies after the last scrape; this minute's scrape
			// finds none, and a new one starts (its event set sees only
			// what comes after it).
			proc.stop()
			clk.Advance(time.Minute)
			if proc, err = startProcess(sim, clk, kubelet, opts); err != nil {
				return nil, err
			}
			if err := record(m, 0); err != nil {
				return nil, err
			}
			continue
		}
		for i := 0; i < int(time.Minute/sampleEvery); i++ {
			clk.Advance(sampleEvery)
			if err := proc.sample(sim); err != nil {
				return nil, err
			}
		}
		if err := record(m, 1); err != nil {
			return nil, err
		}
	}
	out := make([]*Series, 0, len(series))
	for _, s := range series {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Labels < out[j].Labels })
	return out, nil
}

// clock is the simulated clock every part of the exporter reads.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// process is one exporter process: its own XID reader (an event set opened
// when it starts, which sees only later events), pod map and collector state.
type process struct {
	node    *collector.Node
	kubelet *fakekubelet.Server
	started time.Duration // of the node's time
	cancel  context.CancelFunc
	done    <-chan struct{}
	clk     *clock
}

// processOptions are the exporter's optional sources and settings.
type processOptions struct {
	procs      bool
	dcgm       *fakedcgm.Fake
	idleWindow time.Duration
}

// startProcess assembles an exporter over sim as the binary does, stepped
// on the simulated clock: its sources are the node, the fake kubelet's
// socket, the fake host engine and the simulated host.
func startProcess(sim *simnode.Node, clk *clock, srv *fakekubelet.Server, opts processOptions) (*process, error) {
	started := clk.Now().Sub(time.Unix(0, 0))
	src := collector.Sources{NVML: sim, KubeletSocket: srv.Socket(),
		XIDEvents: &afterSource{src: sim.XIDSource(), from: clk.Now()}}
	cfg := collector.NodeConfig{Log: zerolog.Nop(), Now: clk.Now, Stepped: true,
		Exporter: collector.Config{Interval: sampleEvery},
		Sampler:  nvmlsampler.SamplerConfig{DeviceTimeout: time.Second},
		XID:      true, XIDWaitTimeout: 20 * time.Millisecond,
		Kubelet: &podmap.Config{}}
	cfg.Exporter.Derived.Idle.Window = opts.idleWindow
	if opts.procs {
		r, err := simwing.HostResolver(sim, clk.Now)
		if err != nil {
			return nil, err
		}
		src.Processes = r
	}
	if opts.dcgm != nil {
		src.OpenDCGM = opts.dcgm.Open
		cfg.DCGM = &dcgm.Config{Mode: dcgm.ModeEmbedded, Interval: sampleEvery}
	}
	node, err := collector.Assemble(cfg, src)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &process{node: node, kubelet: srv, started: started, cancel: cancel, done: node.StartXID(ctx), clk: clk}
	// The event set opens within microseconds of a real start; wait for it,
	// so that the first page does not depend on the goroutines' timing.
	deadline := time.Now().Add(30 * time.Second)
	for !node.XID.Up() {
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("the XID reader did not open its event set in 30 s")
		}
		time.Sleep(time.Millisecond)
	}
	return p, nil
}

func (p *process) stop() {
	p.cancel()
	<-p.done
	p.node.Close()
}

// sample brings the kubelet up to the scenario, waits until the XID reader
// has every event raised since the process started up to now, and steps the
// exporter once.
func (p *process) sample(sim *simnode.Node) error {
	now := p.clk.Now().Sub(time.Unix(0, 0))
	want := uint64(len(sim.XIDsBetween(p.started, now)))
	deadline := time.Now().Add(30 * time.Second)
	for p.node.XID.Events() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("the XID reader has %d of %d events after 30 s", p.node.XID.Events(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.kubelet.SetPods(sim.KubeletPods()) // the kubelet follows the scenario
	p.kubelet.SetAllocatable(sim.KubeletAllocatable())
	p.node.Step(context.Background())
	return nil
}

// afterSource is an event set opened at from: earlier events were raised
// while it did not exist, and are lost, as on a real node.
type afterSource struct {
	src  xid.EventSource
	from time.Time
}

func (a *afterSource) Open() (xid.Waiter, error) {
	w, err := a.src.Open()
	if err != nil {
		return nil, err
	}
	return &afterWaiter{w: w, from: a.from}, nil
}

type afterWaiter struct {
	w    xid.Waiter
	from time.Time
}

func (a *afterWaiter) Close() error { return a.w.Close() }

func (a *afterWaiter) Wait(timeout time.Duration) (xid.Event, error) {
	for {
		ev, err := a.w.Wait(timeout)
		if err != nil || !ev.Time.Before(a.from) {
			return ev, err
		}
	}
}

// addPage records one minute's page (nil: the scrape failed) into series.
func addPage(series map[string]*Series, page []byte, m, minutes int, node string, up float64, keep map[string]bool) error {
	seen := map[string]bool{}
	put := func(name string, labels map[string]string, v float64) {
		if keep != nil && !keep[name] {
			return
		}
		key := SeriesKey(name, labels)
		s := series[key]
		if s == nil {
			s = &Series{Labels: key, Values: make([]*float64, minutes), Stale: make([]bool, minutes)}
			series[key] = s
		}
		s.Values[m] = &v
		seen[key] = true
	}
	target := map[string]string{"job": Job, "instance": Instance, "node": node}
	put("up", target, up)
	if page != nil {
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
		if err != nil {
			return err
		}
		for name, f := range fams {
			for _, mt := range f.GetMetric() {
				labels := map[string]string{}
				for _, l := range mt.GetLabel() {
					if l.GetValue() != "" { // Prometheus drops empty labels
						labels[l.GetName()] = l.GetValue()
					}
				}
				for k, v := range target {
					labels[k] = v // honor_labels: the exporter sets none of these
				}
				switch f.GetType() {
				case dto.MetricType_COUNTER:
					put(name, labels, mt.GetCounter().GetValue())
				case dto.MetricType_GAUGE:
					put(name, labels, mt.GetGauge().GetValue())
				case dto.MetricType_UNTYPED:
					put(name, labels, mt.GetUntyped().GetValue())
				default:
					// Histograms and summaries: no rule reads one.
				}
			}
		}
	}
	// A series that was on the last page and is not on this one: Prometheus
	// writes a stale marker.
	for key, s := range series {
		if !seen[key] && m > 0 && s.Values[m-1] != nil {
			s.Stale[m] = true
		}
	}
	return nil
}

// SeriesKey writes a series as promtool's input names it:
// name{label="value", ...}, labels sorted, values Go-quoted.
func SeriesKey(name string, labels map[string]string) string {
	names := make([]string, 0, len(labels))
	for k := range labels {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(name)
	b.WriteString("{")
	for i, k := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%s", k, strconv.Quote(labels[k]))
	}
	b.WriteString("}")
	return b.String()
}

// ValuesString writes a series' values in promtool's notation: runs of one
// value as vxN, runs of four or more that grow by one whole step (a
// timestamp the exporter serves) as a+bxN, gaps as _xN, stale markers as
// stale.
func (s *Series) ValuesString() string {
	var parts []string
	i := 0
	for i < len(s.Values) {
		switch {
		case s.Stale[i]:
			parts = append(parts, "stale")
			i++
		case s.Values[i] == nil:
			j := i
			for j < len(s.Values) && s.Values[j] == nil && !s.Stale[j] {
				j++
			}
			if j-i == 1 {
				parts = append(parts, "_")
			} else {
				parts = append(parts, fmt.Sprintf("_x%d", j-i))
			}
			i = j
		default:
			v := *s.Values[i]
			j := i + 1
			for j < len(s.Values) && !s.Stale[j] && s.Values[j] != nil && sameFloat(*s.Values[j], v) {
				j++
			}
			if k := s.arithmeticRun(i); j-i == 1 && k-i >= 4 {
				step := *s.Values[i+1] - v
				parts = append(parts, fmt.Sprintf("%s+%sx%d", formatFloat(v), formatFloat(step), k-i-1))
				i = k
				continue
			}
			f := formatFloat(v)
			if j-i == 1 {
				parts = append(parts, f)
			} else {
				parts = append(parts, fmt.Sprintf("%sx%d", f, j-i-1))
			}
			i = j
		}
	}
	return strings.Join(parts, " ")
}

// arithmeticRun returns the end of the run from i whose values are whole
// numbers growing by one positive whole step, i + 1 where there is none:
// whole numbers below 2^53, so that promtool's a+bxN expands to exactly
// them.
func (s *Series) arithmeticRun(i int) int {
	whole := func(k int) (float64, bool) {
		if k >= len(s.Values) || s.Stale[k] || s.Values[k] == nil {
			return 0, false
		}
		v := *s.Values[k]
		return v, v == math.Trunc(v) && math.Abs(v) < 1<<53
	}
	a, ok := whole(i)
	b, ok2 := whole(i + 1)
	if !ok || !ok2 || b <= a {
		return i + 1
	}
	k := i + 1
	for {
		v, ok := whole(k)
		if !ok || v != a+float64(k-i)*(b-a) {
			return k
		}
		k++
	}
}

func sameFloat(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }

func formatFloat(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// SourceDir holds the fixture sources (*.yml), relative to the repository
// root.
const SourceDir = "alerts/pages/testdata"

// ReferenceRulesFile is the flat reference rules file, relative to the
// repository root.
const ReferenceRulesFile = "alerts/testdata/flat.rules.yml"

// GeneratedPaths are the promtool test files of the fixture source name
// (its base name without .yml), relative to the repository root: the
// vanilla rules' and the GKE Managed Prometheus rules'.
func GeneratedPaths(name string) (vanilla, gmp string) {
	base := "pages_" + strings.ReplaceAll(name, "-", "_") + "_test.yml"
	return "alerts/tests/" + base, "alerts/tests/gmp/" + base
}

// Generate runs every fixture source under root's SourceDir against the
// rules rf (the vanilla file; the GMP variant names its own) and returns the
// promtool test files, keyed by their GeneratedPaths, slash-separated.
func Generate(root string, rf *alerts.RuleFile) (map[string][]byte, error) {
	keep, err := RuleMetrics(rf)
	if err != nil {
		return nil, err
	}
	// The fixtures also keep what the reference rules read
	// (alerts/equivalence_test.go compares the rules with them on these
	// inputs): the dense families the rules now read through the
	// exporter's sparse faults, among others, so that both readings of
	// the same pages are compared.
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(ReferenceRulesFile)))
	if err != nil {
		return nil, err
	}
	ref, err := alerts.ParseRules(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ReferenceRulesFile, err)
	}
	refKeep, err := RuleMetrics(ref)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ReferenceRulesFile, err)
	}
	for m := range refKeep {
		keep[m] = true
	}
	files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(SourceDir), "*.yml"))
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yml")
		src, err := LoadSource(f)
		if err != nil {
			return nil, err
		}
		series, err := Run(src, keep)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		vp, gp := GeneratedPaths(name)
		for _, x := range []struct {
			path string
			v    Variant
		}{{vp, Vanilla}, {gp, GMP}} {
			if out[x.path], err = Render(name, src, series, rf, x.v); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return out, nil
}

// annotationMetricRE finds the metric names the annotations' queries read.
var annotationMetricRE = regexp.MustCompile(`\b(gpu_[a-z0-9_]+|kube_[a-z0-9_]+)\b`)

// RuleMetrics are the metric names the rules file's expressions and its
// annotations' queries read: the series a fixture needs.
func RuleMetrics(rf *alerts.RuleFile) (map[string]bool, error) {
	out := map[string]bool{"up": true}
	for _, a := range rf.Alerts() {
		for _, v := range a.Annotations {
			for _, m := range annotationMetricRE.FindAllString(v, -1) {
				out[m] = true
			}
		}
	}
	p := parser.NewParser(parser.Options{})
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", r.Name(), err)
			}
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok && vs.Name != "" {
					out[vs.Name] = true
				}
				return nil
			})
		}
	}
	return out, nil
}

// Variant is the label shape a fixture is rendered for.
type Variant int

const (
	// Vanilla is Prometheus (or the Prometheus Operator with honorLabels):
	// the exporter's own namespace label (the workload's) is namespace, and
	// series without one get the target's namespace.
	Vanilla Variant = iota
	// GMP is GKE Managed Prometheus: every series carries its monitored
	// resource's labels, namespace is the target's, a metric's own
	// namespace label is exported_namespace; the GMP rules are tested.
	GMP
)

// ExporterNamespace is the namespace the exporter runs in, the target
// namespace of its series.
const ExporterNamespace = "gpu-pool-exporter"

// gmpResource are the labels GKE Managed Prometheus adds besides namespace.
var gmpResource = [][2]string{{"project_id", "proj-1"}, {"location", "us-central1"}, {"cluster", "gpu-cluster"}}

// Render writes the promtool test file of a fixture source: name is the
// source's base name, series what Run returned (in the vanilla shape).
func Render(name string, src *Source, series []*Series, rf *alerts.RuleFile, v Variant) ([]byte, error) {
	rules := "../" + alerts.RulesFileName
	if v == GMP {
		rules = "../../" + alerts.GMPRulesFileName
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Generated by make generate from alerts/pages/testdata/%s.yml; do not edit.\n", name)
	b.WriteString("# Input: the pages the exporter served on a simulated node, every minute\n# (alerts/pages).")
	if v == GMP {
		b.WriteString(" In GKE Managed Prometheus' label shape, for its rules.")
	}
	b.WriteString("\n")
	for _, l := range strings.Split(strings.TrimSpace(src.Comment), "\n") {
		b.WriteString(strings.TrimRight("# "+l, " ") + "\n")
	}
	type test struct {
		Name           string        `yaml:"name"`
		Interval       string        `yaml:"interval"`
		InputSeries    []InputSeries `yaml:"input_series"`
		AlertRuleTest  []AlertTest   `yaml:"alert_rule_test"`
		PromQLExprTest []yaml.Node   `yaml:"promql_expr_test,omitempty"`
	}
	type file struct {
		RuleFiles          []string `yaml:"rule_files"`
		EvaluationInterval string   `yaml:"evaluation_interval"`
		GroupEvalOrder     []string `yaml:"group_eval_order"`
		Tests              []test   `yaml:"tests"`
	}
	t := test{Name: name, Interval: "1m"}
	for _, s := range series {
		t.InputSeries = append(t.InputSeries, InputSeries{Series: shapeSeries(s.Labels, v), Values: s.ValuesString()})
	}
	for _, k := range src.KubeStateMetrics {
		metric, rest, _ := strings.Cut(k.Series, "{")
		labels := map[string]string{}
		for _, kv := range splitLabels(strings.TrimSuffix(strings.TrimSpace(rest), "}")) {
			labels[kv[0]] = kv[1]
		}
		if labels["job"] != "kube-state-metrics" {
			return nil, fmt.Errorf("%s: kubeStateMetrics series %q: want the label job=\"kube-state-metrics\"", name, k.Series)
		}
		t.InputSeries = append(t.InputSeries, InputSeries{Series: shapeSeries(SeriesKey(metric, labels), v), Values: k.Values})
	}
	checked := map[string]bool{}
	tests := append([]AlertTest(nil), src.AlertRuleTest...)
	for _, f := range src.Firing {
		from, until, err := f.Span(src.Minutes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		for m := from; m <= until; m++ {
			checked[f.Alertname+"@"+(time.Duration(m)*time.Minute).String()] = true // firing: not quiet
		}
		if len(f.At) > 0 {
			for _, at := range f.At {
				tests = append(tests, AlertTest{Alertname: f.Alertname, EvalTime: at, ExpAlerts: f.ExpAlerts})
			}
			continue
		}
		for m := 0; m <= src.Minutes; m += src.QuietEvery {
			if m >= from && m <= until {
				tests = append(tests, AlertTest{Alertname: f.Alertname, EvalTime: fmt.Sprintf("%dm", m), ExpAlerts: f.ExpAlerts})
			}
		}
	}
	for _, at := range tests {
		d, err := model.ParseDuration(at.EvalTime)
		if err != nil {
			return nil, fmt.Errorf("%s: alert %s: eval_time %q: %w", name, at.Alertname, at.EvalTime, err)
		}
		checked[at.Alertname+"@"+time.Duration(d).String()] = true
		at.ExpAlerts = shapeAlerts(at.ExpAlerts, v)
		t.AlertRuleTest = append(t.AlertRuleTest, at)
	}
	var names []string
	for _, a := range rf.Alerts() {
		names = append(names, a.Alert)
	}
	sort.Strings(names)
	for m := 0; m <= src.Minutes; m += src.QuietEvery {
		for _, n := range names {
			if !checked[n+"@"+(time.Duration(m)*time.Minute).String()] {
				t.AlertRuleTest = append(t.AlertRuleTest, AlertTest{Alertname: n, EvalTime: fmt.Sprintf("%dm", m), ExpAlerts: []yaml.Node{}})
			}
		}
	}
	for _, n := range src.PromQLExprTest {
		c := n
		if v == GMP {
			c = *shapeNode(&n)
		}
		t.PromQLExprTest = append(t.PromQLExprTest, c)
	}
	out, err := yaml.Marshal(file{RuleFiles: []string{rules}, EvaluationInterval: "1m", GroupEvalOrder: rf.GroupNames(), Tests: []test{t}})
	if err != nil {
		return nil, err
	}
	b.Write(out)
	return b.Bytes(), nil
}

// shapeSeries gives a vanilla series its labels in variant v: the target's
// namespace where the series has none of its own; on GMP that is
// namespace, the series' own is exported_namespace, and the monitored
// resource's labels come along.
func shapeSeries(s string, v Variant) string {
	name, rest, _ := strings.Cut(s, "{")
	labels := map[string]string{}
	for _, kv := range splitLabels(strings.TrimSuffix(rest, "}")) {
		labels[kv[0]] = kv[1]
	}
	if name == "up" || labels["job"] == Job {
		if own, ok := labels["namespace"]; ok && v == GMP {
			labels["exported_namespace"] = own
			labels["namespace"] = ExporterNamespace
		} else if !ok {
			labels["namespace"] = ExporterNamespace
		}
	}
	if labels["job"] == "kube-state-metrics" && v == GMP {
		if own, ok := labels["namespace"]; ok {
			labels["exported_namespace"] = own
		}
		labels["namespace"] = KubeStateMetricsNamespace
	}
	if v == GMP {
		for _, kv := range gmpResource {
			labels[kv[0]] = kv[1]
		}
	}
	return SeriesKey(name, labels)
}

// splitLabels splits name="value", name="value" (values Go-quoted).
func splitLabels(s string) [][2]string {
	var out [][2]string
	for s = strings.TrimSpace(s); s != ""; {
		k, rest, _ := strings.Cut(s, "=")
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return out
		}
		val, _ := strconv.Unquote(q)
		out = append(out, [2]string{strings.TrimSpace(k), val})
		s = strings.TrimPrefix(strings.TrimSpace(rest[len(q):]), ",")
		s = strings.TrimSpace(s)
	}
	return out
}

// shapeAlerts gives expected alerts the labels the GMP rules give the same
// alert: the monitored resource's labels, and exporter_namespace where the
// alert's namespace is a workload's. namespace itself is the same: that is
// what routes.
func shapeAlerts(exp []yaml.Node, v Variant) []yaml.Node {
	if exp == nil {
		return []yaml.Node{}
	}
	if v != GMP {
		return exp
	}
	out := make([]yaml.Node, 0, len(exp))
	for _, n := range exp {
		out = append(out, *shapeNode(&n))
	}
	return out
}

// shapeNode rewrites an exp_alerts entry (or any mapping holding
// exp_labels) for GMP; other nodes are copied.
func shapeNode(n *yaml.Node) *yaml.Node {
	c := *n
	if c.Kind != yaml.MappingNode {
		return &c
	}
	c.Content = append([]*yaml.Node(nil), n.Content...)
	for i := 0; i+1 < len(c.Content); i += 2 {
		if c.Content[i].Value != "exp_labels" {
			continue
		}
		labels := *c.Content[i+1]
		labels.Content = append([]*yaml.Node(nil), labels.Content...)
		ns := ""
		fromExporter := false
		for j := 0; j+1 < len(labels.Content); j += 2 {
			switch labels.Content[j].Value {
			case "namespace":
				ns = labels.Content[j+1].Value
			case "job":
				fromExporter = labels.Content[j+1].Value == Job
			}
		}
		add := func(k, val string) {
			labels.Content = append(labels.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: k}, &yaml.Node{Kind: yaml.ScalarNode, Value: val})
		}
		if fromExporter {
			for _, kv := range gmpResource {
				add(kv[0], kv[1])
			}
		}
		if ns != "" && ns != ExporterNamespace && fromExporter {
			add("exporter_namespace", ExporterNamespace)
		}
		c.Content[i+1] = &labels
	}
	return &c
}
