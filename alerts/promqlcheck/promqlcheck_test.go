package promqlcheck

import (
	"bufio"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/dashboards"
)

// kubeStateMetrics are the kube-state-metrics series the rules and
// dashboards may join (pool, phase, requests); extend when a query needs
// another one.
var kubeStateMetrics = []string{
	"kube_node_labels",
	"kube_node_info",
	"kube_node_created",
	"kube_node_deletion_timestamp",
	"kube_node_spec_taint",
	"kube_node_spec_unschedulable",
	"kube_node_status_condition",
	"kube_node_status_allocatable",
	"kube_node_status_capacity",
	"kube_pod_info",
	"kube_pod_status_phase",
	"kube_pod_container_resource_requests",
	"kube_pod_container_resource_limits",
	"kube_pod_nodeselectors",
}

// prometheusMetrics are Prometheus' own series.
var prometheusMetrics = []string{"up", "ALERTS", "ALERTS_FOR_STATE"}

// exporterJob is the job every exporter series is selected by.
const exporterJob = "gpu-pool-exporter"

// Values the dashboards' variables take for parsing.
var dashboardVars = map[string]string{
	"nodepool":  ".*",
	"node":      "gpu-node-a|gpu-node-b",
	"namespace": ".*",
	"gpu":       ".*",
}

type source int

const (
	exporterMetric source = iota + 1
	recordedMetric
	ksmMetric
	promMetric
)

type checker struct {
	t      *testing.T
	parser parser.Parser
	known  map[string]source
	used   map[string]bool
}

func newChecker(t *testing.T) *checker {
	t.Helper()
	c := &checker{t: t, parser: parser.NewParser(parser.Options{}), known: map[string]source{}, used: map[string]bool{}}
	f, err := os.Open("../known_metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	nameRE := regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		if !nameRE.MatchString(line) {
			t.Fatalf("known_metrics.txt:%d: %q is not a metric name", n, line)
		}
		if !strings.HasPrefix(line, "gpu_") {
			t.Errorf("known_metrics.txt:%d: %s lacks the gpu_ prefix", n, line)
		}
		c.known[line] = exporterMetric
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rf.RecordNames() {
		if c.known[r] == exporterMetric {
			t.Errorf("recording rule %s has the name of an exporter metric", r)
		}
		c.known[r] = recordedMetric
	}
	for _, m := range kubeStateMetrics {
		c.known[m] = ksmMetric
	}
	for _, m := range prometheusMetrics {
		c.known[m] = promMetric
	}
	return c
}

// check parses expr and checks its metric names. where names the
// expression in errors; requireJob asks for job="gpu-pool-exporter" on every
// exporter metric selector.
func (c *checker) check(where, expr string, requireJob bool) {
	c.t.Helper()
	for _, p := range c.problems(expr, requireJob) {
		c.t.Errorf("%s: %s", where, p)
	}
}

// problems lists what is wrong with expr.
func (c *checker) problems(expr string, requireJob bool) []string {
	e, err := c.parser.ParseExpr(expr)
	if err != nil {
		return []string{"does not parse: " + err.Error() + "\n" + expr}
	}
	var out []string
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
					name = m.Value
				}
			}
		}
		if name == "" {
			out = append(out, "selector "+vs.String()+" has no metric name: name the metric")
			return nil
		}
		c.used[name] = true
		src, ok := c.known[name]
		if !ok {
			out = append(out, "unknown metric "+name+" (not served by the exporter per known_metrics.txt, not a recording rule, not a listed kube-state-metrics metric)")
			return nil
		}
		jobMatcher := ""
		for _, m := range vs.LabelMatchers {
			if m.Name == "job" {
				jobMatcher = m.String()
			}
		}
		want := `job="` + exporterJob + `"`
		switch {
		case src == exporterMetric && requireJob && jobMatcher != want:
			out = append(out, "selector "+vs.String()+" should select "+want)
		case src != exporterMetric && src != promMetric && jobMatcher == want:
			out = append(out, "selector "+vs.String()+": "+name+" is not an exporter series, "+want+" selects nothing")
		}
		return nil
	})
	return out
}

// TestCheckerCatchesMistakes makes sure the checks above can fail.
func TestCheckerCatchesMistakes(t *testing.T) {
	c := newChecker(t)
	for expr, want := range map[string]string{
		`sum(gpu_utilisation_ratio{job="gpu-pool-exporter"})`:                                 "unknown metric gpu_utilisation_ratio",
		`gpu_up{node="a"} == 0`:                                                               "should select",
		`nodepool:gpu_devices:sum{job="gpu-pool-exporter"}`:                                   "is not an exporter series",
		`sum(rate(gpu_xid_errors_total{job="gpu-pool-exporter"}[5m])`:                         "does not parse",
		`{__name__=~"gpu_.*"}`:                                                                "has no metric name",
		`kube_pod_status_phase{phase="Pending"} * on (pod) gpu_nope{job="gpu-pool-exporter"}`: "unknown metric gpu_nope",
	} {
		t.Run(want, func(t *testing.T) {
			ps := c.problems(expr, true)
			if len(ps) == 0 || !strings.Contains(strings.Join(ps, "; "), want) {
				t.Errorf("%s: problems %q, want one saying %q", expr, ps, want)
			}
		})
	}
	if ps := c.problems(`sum by (node) (gpu_up{job="gpu-pool-exporter"}) * on (node) group_left (nodepool) node:gpu_nodepool:info and on () up`, true); len(ps) > 0 {
		t.Errorf("a good expression has problems: %q", ps)
	}
}

func TestRulesPromQL(t *testing.T) {
	c := newChecker(t)
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			where := alerts.RulesFileName + ": " + g.Name + ": " + r.Name()
			c.check(where, r.Expr, true)
			n++
			for _, key := range sortedKeys(r.Annotations) {
				text := r.Annotations[key]
				if !strings.Contains(text, "query") {
					continue
				}
				for _, m := range templateQueryRE.FindAllStringSubmatch(text, -1) {
					q := m[1]
					if !looksLikePromQL(q) {
						continue // a shell command in the description
					}
					q = fillPrintfVerbs(q)
					c.check(where+": annotation "+key+" query", q, false)
					n++
				}
			}
		}
	}
	if n < 50 {
		t.Errorf("only %d expressions checked; the rules file parser lost some", n)
	}
}

func TestDashboardsPromQL(t *testing.T) {
	c := newChecker(t)
	qs, err := dashboards.AllQueries()
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 50 {
		t.Fatalf("only %d dashboard queries found", len(qs))
	}
	for _, q := range qs {
		expr, unknown, ok := q.PromQL(dashboardVars)
		if !ok {
			continue
		}
		if len(unknown) > 0 {
			t.Errorf("%s: unknown Grafana variables %v", q, unknown)
			continue
		}
		c.check(q.String(), expr, true)
	}
}

// TestKnownMetricsAreUsed reports (as a log, not a failure) exporter metrics
// that no rule or dashboard uses: candidates for a panel.
func TestKnownMetricsAreUsed(t *testing.T) {
	c := newChecker(t)
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			c.check(r.Name(), r.Expr, true)
		}
	}
	qs, err := dashboards.AllQueries()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		expr := q.Expr
		if q.Kind == dashboards.KindVariable {
			if e, _, ok := dashboards.VariablePromQL(expr); ok {
				expr = e
			} else {
				continue
			}
		}
		expr, _ = dashboards.Substitute(expr, dashboardVars)
		c.check(q.String(), expr, true)
	}
	var unused []string
	for name, src := range c.known {
		if src == exporterMetric && !c.used[name] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Logf("exporter metrics no rule or dashboard uses: %s", strings.Join(unused, ", "))
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestProfilesServeEveryUsedMetric: every exporter metric an alert, a
// recording rule or a dashboard uses is in a metric group that the lean and
// the default profile serve, so trimming series never blinds an alert or a
// panel. (cmd/gpu-pool-exporter's budget test checks the same on the
// simulated node's real pages.)
func TestProfilesServeEveryUsedMetric(t *testing.T) {
	c := newChecker(t)
	used, err := UsedMetrics()
	if err != nil {
		t.Fatal(err)
	}
	families := render.FamilyGroups()
	n := 0
	for _, profile := range []string{render.ProfileLean, render.ProfileDefault} {
		groups, err := render.ProfileGroups(profile)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range sortedNames(used) {
			if c.known[name] != exporterMetric {
				continue
			}
			n++
			gs, ok := families[name]
			if !ok {
				t.Errorf("%s (used by %s) belongs to no metric group: declare it with its group in collector/render", name, used[name][0])
				continue
			}
			served := false
			for _, g := range gs {
				served = served || groups.On(g)
			}
			if !served {
				t.Errorf("profile %s leaves out %s (groups %v), which %s uses", profile, name, gs, strings.Join(used[name], "; "))
			}
		}
	}
	if n < 60 {
		t.Errorf("only %d exporter metrics checked; UsedMetrics lost some", n)
	}
	// And the other way: every family the exporter can serve is listed.
	for name := range families {
		if c.known[name] != exporterMetric {
			t.Errorf("%s is served (render.FamilyGroups) but not listed in known_metrics.txt", name)
		}
	}
}

func sortedNames(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestNoRuleReadsANodeSummaryFamily holds the lean profile's rule: the
// families node_summary serves once per node are those no alert or
// recording rule reads (an alert on one of them would see only the node's
// sum or mean on a lean node). Where only some series of a family fold
// (error="corrected" of the ECC counters), a rule may read the others if
// its selector says which.
func TestNoRuleReadsANodeSummaryFamily(t *testing.T) {
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	folds := render.NodeSummaryFolds()
	p := parser.NewParser(parser.Options{})
	n := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Fatalf("%s: %v", r.Name(), err)
			}
			parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
				vs, ok := node.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				n++
				how, folded := folds[vs.Name]
				if !folded {
					return nil
				}
				if _, only, partly := strings.Cut(how, " of "); partly {
					name, value, _ := strings.Cut(only, "=")
					value = strings.Trim(value, `"`)
					for _, m := range vs.LabelMatchers {
						if m.Name == name && m.Type == labels.MatchEqual && m.Value != value {
							return nil // reads only series that stay per GPU
						}
					}
				}
				t.Errorf("%s reads %s, which node_summary (on in the lean profile) serves once per node (%s): take the family out of node_summary or read it another way", r.Name(), vs, how)
				return nil
			})
		}
	}
	if n < 40 {
		t.Errorf("only %d selectors in the rules: parsing lost some", n)
	}
}
