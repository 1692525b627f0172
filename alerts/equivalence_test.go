package alerts

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/internal/proctest"
)

// flatRulesFile holds the rules as they were before the node-level
// pre-aggregation and the shard/global split: every pool,
// namespace and cluster figure computed straight from the raw series. It is
// the reference the restructured rules must agree with. When a rule's
// meaning changes on purpose, change it in both files.
const flatRulesFile = "testdata/flat.rules.yml"

// equivalencePrefix renames the flat file's recording rules (and the
// recording rules the test makes of its alerts), so that both sets live in
// one promtool run.
const equivalencePrefix = "flat__"

// alertRecordPrefix names the recording rule the test makes of an alert's
// expression.
const alertRecordPrefix = "alert__"

// TestRestructuredRulesEquivalent proves that every rule of the flat file
// gives the same series with the same values as the rule of the same name in
// gpu-pool-exporter.rules.yml, on the input series of every promtool fixture
// (tests/*.yml), at every evaluation time those tests check and at ten more
// points spread over each test. Alerts are compared by their expressions
// (turned into recording rules) and, statically, by their for, labels and
// annotations: the annotations' values are checked by the fixtures' own
// alert tests, which run on the restructured file.
func TestRestructuredRulesEquivalent(t *testing.T) {
	// One promtool is enough: the equivalence is of the rules, not of the
	// engine (TestPromtoolTestRules runs the fixtures on both). Prometheus
	// 3's evaluates these files (both rule sets and the long check) about
	// four times faster than 2.42's, so it goes first.
	var pt string
	for _, name := range []string{"promtool3", "promtool"} {
		if p, ok := proctest.Promtools(t)[name]; ok {
			pt = p
			break
		}
	}
	flatData, err := os.ReadFile(flatRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	flat, err := ParseRules(flatData)
	if err != nil {
		t.Fatalf("%s: %v", flatRulesFile, err)
	}
	cur, err := Rules()
	if err != nil {
		t.Fatal(err)
	}

	// Every flat rule must still exist, with the same for and labels.
	curAlerts := map[string]Rule{}
	for _, a := range cur.Alerts() {
		curAlerts[a.Alert] = a
	}
	var compared []string
	for _, a := range flat.Alerts() {
		c, ok := curAlerts[a.Alert]
		if !ok {
			t.Errorf("alert %s of %s is gone from %s", a.Alert, flatRulesFile, RulesFileName)
			continue
		}
		if c.For != a.For || c.KeepFiringFor != a.KeepFiringFor || !mapsEqual(c.Labels, a.Labels) {
			t.Errorf("alert %s: for/keep_firing_for/labels differ from %s", a.Alert, flatRulesFile)
		}
		if c.Annotations["summary"] != a.Annotations["summary"] {
			t.Errorf("alert %s: the summary differs from %s", a.Alert, flatRulesFile)
		}
		compared = append(compared, alertRecordPrefix+a.Alert)
	}
	curRecords := map[string]bool{}
	for _, n := range cur.RecordNames() {
		curRecords[n] = true
	}
	for _, n := range flat.RecordNames() {
		if !curRecords[n] {
			t.Errorf("recording rule %s of %s is gone from %s", n, flatRulesFile, RulesFileName)
			continue
		}
		compared = append(compared, n)
	}
	sort.Strings(compared)
	if t.Failed() {
		return
	}

	dir := t.TempDir()
	flatOut, flatGroups := asRecordingRules(flat, equivalencePrefix, flat.RecordNames())
	curOut, curGroups := asRecordingRules(cur, "", nil)
	writeYAML(t, filepath.Join(dir, "flat.yml"), flatOut)
	writeYAML(t, filepath.Join(dir, "restructured.yml"), curOut)
	check := equivalenceExpr(compared)

	for _, f := range testFiles(t) {
		t.Run(filepath.Base(f), func(t *testing.T) {
			t.Parallel()
			gen := equivalenceTests(t, f, check, append(slices.Clone(curGroups), flatGroups...))
			path := filepath.Join(dir, strings.TrimSuffix(filepath.Base(f), ".yml")+".equivalence.yml")
			writeYAML(t, path, gen)
			out, err := proctest.PromtoolCommand(pt, "test", "rules", path).CombinedOutput()
			if err != nil {
				t.Fatalf("the restructured rules differ from %s on the input series of %s; each series below names the rule in its equivalence_check label (the generated test is %s):\n%s",
					flatRulesFile, f, path, promtoolFailures(out))
			}
		})
	}
}

// promtoolFailures keeps, of promtool's output, the test names, evaluation
// times and the series it got (its expression is the long check).
func promtoolFailures(out []byte) string {
	var b strings.Builder
	for _, line := range strings.Split(string(out), "\n") {
		switch l := strings.TrimSpace(line); {
		case strings.HasPrefix(l, "expr:"):
			if i := strings.LastIndex(l, "time:"); i >= 0 {
				b.WriteString("  at " + strings.TrimSuffix(l[i+len("time:"):], ",") + "\n")
			}
		case len(l) > 200:
			b.WriteString(l[:200] + "...\n")
		case l != "":
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// asRecordingRules turns a rule file into recording rules only: alerts
// become alert__<name> records of their expression, and every name is
// prefixed (references to the renamed records in expressions too). It
// returns the file and its group names (prefixed alike).
func asRecordingRules(f *RuleFile, prefix string, rename []string) (map[string]any, []string) {
	type rec struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var groups []map[string]any
	var names []string
	for _, g := range f.Groups {
		var rules []rec
		for _, r := range g.Rules {
			name := r.Record
			if r.Alert != "" {
				name = alertRecordPrefix + r.Alert
			}
			rules = append(rules, rec{Record: prefix + name, Expr: renameMetrics(r.Expr, prefix, rename)})
		}
		groups = append(groups, map[string]any{"name": prefix + g.Name, "rules": rules})
		names = append(names, prefix+g.Name)
	}
	return map[string]any{"groups": groups}, names
}

// renameMetrics prefixes every whole-word occurrence of the given metric
// names in a PromQL expression.
func renameMetrics(expr, prefix string, names []string) string {
	if prefix == "" || len(names) == 0 {
		return expr
	}
	quoted := make([]string, len(names))
	for i, n := range names {
		quoted[i] = regexp.QuoteMeta(n)
	}
	// Longest first, so that no name matches inside a longer one.
	sort.Slice(quoted, func(i, j int) bool { return len(quoted[i]) > len(quoted[j]) })
	re := regexp.MustCompile(`(^|[^a-zA-Z0-9_:])(` + strings.Join(quoted, "|") + `)($|[^a-zA-Z0-9_:])`)
	// Matches may share a delimiter; repeat until nothing changes.
	for {
		next := re.ReplaceAllString(expr, "${1}"+prefix+"${2}${3}")
		if next == expr {
			return expr
		}
		expr = next
		// Already prefixed names no longer match (the prefix is a word part),
		// so the loop ends.
	}
}

// equivalenceExpr is one PromQL expression that returns nothing exactly
// when every compared rule has the same series and values (NaN equal to
// NaN, 1e-9 relative tolerance for sums taken in another order) in both
// files; a series it returns carries equivalence_check=<rule>.
func equivalenceExpr(names []string) string {
	var parts []string
	for _, n := range names {
		a, b := n, equivalencePrefix+n
		diff := fmt.Sprintf(`(%[1]s unless %[2]s) or (%[2]s unless %[1]s)`+
			` or (abs(%[1]s - %[2]s) > 1e-9 * abs(%[2]s) + 1e-12)`+
			` or ((%[1]s != %[1]s) unless (%[2]s != %[2]s)) or ((%[2]s != %[2]s) unless (%[1]s != %[1]s))`, a, b)
		parts = append(parts, fmt.Sprintf(`label_replace(%s, "equivalence_check", %q, "", "")`, diff, n))
	}
	return strings.Join(parts, "\nor\n")
}

// equivalenceTests builds a promtool test file with the input series of
// fixture f and, for each of its tests, the equivalence check at every
// evaluation time the test names and at ten more points up to its last.
func equivalenceTests(t *testing.T, f, check string, groupOrder []string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var fixture struct {
		EvaluationInterval string `yaml:"evaluation_interval"`
		Tests              []struct {
			Name          string           `yaml:"name"`
			Interval      string           `yaml:"interval"`
			InputSeries   []map[string]any `yaml:"input_series"`
			AlertRuleTest []struct {
				EvalTime string `yaml:"eval_time"`
			} `yaml:"alert_rule_test"`
			PromQLExprTest []struct {
				EvalTime string `yaml:"eval_time"`
			} `yaml:"promql_expr_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &fixture); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	evalInterval := fixture.EvaluationInterval
	if evalInterval == "" {
		evalInterval = "1m"
	}
	step, err := model.ParseDuration(evalInterval)
	if err != nil {
		t.Fatalf("%s: evaluation_interval: %v", f, err)
	}
	var tests []map[string]any
	for _, tc := range fixture.Tests {
		times := map[time.Duration]bool{}
		var last time.Duration
		add := func(s string) {
			d, err := model.ParseDuration(s)
			if err != nil {
				t.Fatalf("%s: test %q: eval_time %q: %v", f, tc.Name, s, err)
			}
			times[time.Duration(d)] = true
			last = max(last, time.Duration(d))
		}
		for _, a := range tc.AlertRuleTest {
			add(a.EvalTime)
		}
		for _, p := range tc.PromQLExprTest {
			add(p.EvalTime)
		}
		for i := 1; i <= 10; i++ {
			// Rounded to the evaluation interval, where the rules ran.
			at := last * time.Duration(i) / 10
			times[at.Truncate(time.Duration(step))] = true
		}
		var sorted []time.Duration
		for d := range times {
			sorted = append(sorted, d)
		}
		slices.Sort(sorted)
		var exprTests []map[string]any
		for _, d := range sorted {
			exprTests = append(exprTests, map[string]any{
				"expr":        check,
				"eval_time":   model.Duration(d).String(),
				"exp_samples": []any{},
			})
		}
		test := map[string]any{
			"name":             tc.Name + " (restructured = flat)",
			"input_series":     withUp(t, tc.InputSeries, last, seriesInterval(t, tc.Interval)),
			"promql_expr_test": exprTests,
		}
		if tc.Interval != "" {
			test["interval"] = tc.Interval
		}
		tests = append(tests, test)
	}
	return map[string]any{
		"rule_files":          []string{"flat.yml", "restructured.yml"},
		"evaluation_interval": evalInterval,
		"group_eval_order":    groupOrder,
		"tests":               tests,
	}
}

// withUp completes a test's input series with the up series that a real
// Prometheus writes for every scraped target: up=1 for each (instance, node)
// of a gpu-pool-exporter series that has none. Several fixtures leave up out
// where their alerts do not read it; the node pool figures count the nodes
// with an exporter target (node:gpu_nodepool:info), and so do the cluster
// figures now that they are sums of pool figures.
func withUp(t *testing.T, series []map[string]any, last, interval time.Duration) []map[string]any {
	t.Helper()
	type target struct{ instance, node string }
	seen := map[target]bool{}
	var order []target
	hasUp := map[target]bool{}
	for _, s := range series {
		desc, _ := s["series"].(string)
		name, labels, _ := strings.Cut(desc, "{")
		if upJobRE.FindStringSubmatch(labels) == nil {
			continue
		}
		tg := target{labelOf(labels, "instance"), labelOf(labels, "node")}
		if strings.TrimSpace(name) == "up" {
			hasUp[tg] = true
		}
		if !seen[tg] {
			seen[tg] = true
			order = append(order, tg)
		}
	}
	out := slices.Clone(series)
	for _, tg := range order {
		if hasUp[tg] {
			continue
		}
		out = append(out, map[string]any{
			"series": fmt.Sprintf(`up{job="gpu-pool-exporter", instance=%q, node=%q}`, tg.instance, tg.node),
			// Up to the last evaluation and a little after.
			"values": fmt.Sprintf("1x%d", int(last/interval)+5),
		})
	}
	return out
}

// seriesInterval is a test's input series interval (promtool's default: 1m).
func seriesInterval(t *testing.T, s string) time.Duration {
	if s == "" {
		return time.Minute
	}
	d, err := model.ParseDuration(s)
	if err != nil {
		t.Fatalf("interval %q: %v", s, err)
	}
	return time.Duration(d)
}

var upJobRE = regexp.MustCompile(`(^|[,\s])job\s*=\s*"gpu-pool-exporter"`)

func labelOf(labels, name string) string {
	m := regexp.MustCompile(`(^|[,\s])` + name + `\s*=\s*"([^"]*)"`).FindStringSubmatch(labels)
	if m == nil {
		return ""
	}
	return m[2]
}

func writeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
