package alerts

import (
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

// testDirs are the promtool test directories and the rules file each tests:
// tests/ the rules file, tests/gmp/ its GKE Managed Prometheus variant.
var testDirs = []struct{ dir, rules string }{
	{"tests", "../" + RulesFileName},
	{filepath.Join("tests", "gmp"), "../../" + GMPRulesFileName},
}

func testFilesIn(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no promtool tests in %s/*.yml", dir)
	}
	sort.Strings(files)
	return files
}

func testFiles(t *testing.T) []string {
	t.Helper()
	return testFilesIn(t, "tests")
}

func TestPromtoolCheckRules(t *testing.T) {
	for name, pt := range proctest.Promtools(t) {
		for _, f := range []string{RulesFileName, GMPRulesFileName} {
			out, err := proctest.PromtoolCommand(pt, "check", "rules", f).CombinedOutput()
			if err != nil {
				t.Errorf("%s check rules %s: %v\n%s", name, f, err, out)
			}
		}
	}
}

func TestPromtoolTestRules(t *testing.T) {
	for name, pt := range proctest.Promtools(t) {
		for _, td := range testDirs {
			for _, f := range testFilesIn(t, td.dir) {
				t.Run(name+"/"+filepath.ToSlash(f), func(t *testing.T) {
					t.Parallel()
					// promtool resolves rule_files relative to the test file.
					out, err := proctest.PromtoolCommand(pt, "test", "rules", f).CombinedOutput()
					if err != nil {
						t.Fatalf("%s test rules %s: %v\n%s", name, f, err, out)
					}
				})
			}
		}
	}
}

// TestGMPTestFiles checks that the GMP tests load the GMP rules in the rules
// file's group order.
func TestGMPTestFiles(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range testFilesIn(t, testDirs[1].dir) {
		tf := readTestFile(t, f)
		if !slices.Equal(tf.RuleFiles, []string{testDirs[1].rules}) {
			t.Errorf("%s: rule_files is %v, want [%s]", f, tf.RuleFiles, testDirs[1].rules)
		}
		if !slices.Equal(tf.GroupEvalOrder, rf.GroupNames()) {
			t.Errorf("%s: group_eval_order is %v, want %v", f, tf.GroupEvalOrder, rf.GroupNames())
		}
	}
}

var severities = []string{"critical", "warning", "info"}

func TestAlertsHaveSeverityAndAnnotations(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range rf.Alerts() {
		if seen[a.Alert] {
			t.Errorf("alert %s is defined twice", a.Alert)
		}
		seen[a.Alert] = true
		if !slices.Contains(severities, a.Labels["severity"]) && a.Labels["severity"] != RemediatorSeverity {
			t.Errorf("alert %s: labels.severity is %q, want one of %v", a.Alert, a.Labels["severity"], severities)
		}
		if strings.TrimSpace(a.Annotations["summary"]) == "" {
			t.Errorf("alert %s has no summary annotation", a.Alert)
		}
		d := a.Annotations["description"]
		if strings.TrimSpace(d) == "" {
			t.Errorf("alert %s has no description annotation", a.Alert)
		} else if !strings.Contains(d, "What to do") {
			t.Errorf("alert %s: the description should say what to do (a \"What to do\" part)", a.Alert)
		}
		if strings.Contains(a.Annotations["summary"], "\n") {
			t.Errorf("alert %s: the summary should be one line", a.Alert)
		}
	}
	if len(seen) == 0 {
		t.Fatal("no alerts in the rules file")
	}
}

// promtoolTestFile is the part of a promtool test file these checks read.
type promtoolTestFile struct {
	RuleFiles      []string `yaml:"rule_files"`
	GroupEvalOrder []string `yaml:"group_eval_order"`
	Tests          []struct {
		Name          string `yaml:"name"`
		AlertRuleTest []struct {
			Alertname string           `yaml:"alertname"`
			EvalTime  string           `yaml:"eval_time"`
			ExpAlerts []map[string]any `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
		PromQLExprTest []struct {
			Expr string `yaml:"expr"`
		} `yaml:"promql_expr_test"`
	} `yaml:"tests"`
}

func readTestFile(t *testing.T, f string) promtoolTestFile {
	t.Helper()
	data, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var tf promtoolTestFile
	if err := yaml.Unmarshal(data, &tf); err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	return tf
}

// TestEveryAlertIsTested checks, from the test files alone (no promtool
// needed), that every alert has at least one test case where it fires and
// one where it does not, that tests name only existing alerts, and that
// every test file loads the rules file and orders the groups as the file
// does (promtool otherwise evaluates groups in random order, and an alert
// could read a recording rule's previous value).
func TestEveryAlertIsTested(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]bool{}
	for _, a := range rf.Alerts() {
		alerts[a.Alert] = true
	}
	firing, quiet := map[string]int{}, map[string]int{}
	for _, f := range testFiles(t) {
		tf := readTestFile(t, f)
		if !slices.Equal(tf.RuleFiles, []string{"../" + RulesFileName}) {
			t.Errorf("%s: rule_files is %v, want [../%s]", f, tf.RuleFiles, RulesFileName)
		}
		if !slices.Equal(tf.GroupEvalOrder, rf.GroupNames()) {
			t.Errorf("%s: group_eval_order is\n  %v\nwant the rules file's groups in order:\n  %v", f, tf.GroupEvalOrder, rf.GroupNames())
		}
		for _, tc := range tf.Tests {
			for _, at := range tc.AlertRuleTest {
				if !alerts[at.Alertname] {
					t.Errorf("%s: test %q checks alert %q, which the rules file does not define", f, tc.Name, at.Alertname)
				}
				if len(at.ExpAlerts) > 0 {
					firing[at.Alertname]++
				} else {
					quiet[at.Alertname]++
				}
			}
		}
	}
	var names []string
	for n := range alerts {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if firing[n] == 0 {
			t.Errorf("alert %s has no test case where it fires (alert_rule_test with exp_alerts)", n)
		}
		if quiet[n] == 0 {
			t.Errorf("alert %s has no test case where it stays quiet (alert_rule_test with exp_alerts: [])", n)
		}
	}
}

// TestEveryRecordingRuleIsTested checks that every recording rule is the
// subject of at least one promql_expr_test.
func TestEveryRecordingRuleIsTested(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, f := range testFiles(t) {
		for _, tc := range readTestFile(t, f).Tests {
			for _, e := range tc.PromQLExprTest {
				exprs = append(exprs, e.Expr)
			}
		}
	}
	for _, name := range rf.RecordNames() {
		re := regexp.MustCompile(`(^|[^a-zA-Z0-9_:])` + regexp.QuoteMeta(name) + `($|[^a-zA-Z0-9_:])`)
		found := false
		for _, e := range exprs {
			if re.MatchString(e) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("recording rule %s has no promql_expr_test", name)
		}
	}
}

func TestRulesFileParses(t *testing.T) {
	data, err := os.ReadFile(RulesFileName)
	if err != nil {
		t.Fatal(err)
	}
	if string(data) != string(RulesYAML) {
		t.Fatal("embedded rules differ from the file: rebuild")
	}
	rf, err := ParseRules(data)
	if err != nil {
		t.Fatalf("%s: %v", RulesFileName, err)
	}
	groups := map[string]bool{}
	for _, g := range rf.Groups {
		if groups[g.Name] {
			t.Errorf("group %s is defined twice", g.Name)
		}
		groups[g.Name] = true
		for _, r := range g.Rules {
			if r.Alert != "" && r.KeepFiringFor != "" {
				// GKE Managed Prometheus' rule evaluator and older
				// Prometheus servers do not know keep_firing_for.
				t.Errorf("alert %s uses keep_firing_for", r.Alert)
			}
		}
	}
	// The exporter group and its first alert are what a minimal deployment
	// relies on (the Helm chart and the docs name them).
	if !groups["gpu-pool-exporter.exporter"] {
		t.Error("group gpu-pool-exporter.exporter is missing")
	}
	found := false
	for _, a := range rf.Alerts() {
		found = found || a.Alert == "GPUExporterDown"
	}
	if !found {
		t.Error("alert GPUExporterDown is missing")
	}
}

// fastReadsOfSlowRecords are the once-a-minute recordings that groups
// evaluated every cycle may read, and why.
var fastReadsOfSlowRecords = map[string]string{
	"node:gpu_nodepool:info":        "a node's pool changes when the node is relabelled or replaced, not from one minute to the next; the XID figure per pool (every cycle, sparse) joins it with the pool a minute old at most",
	"node:gpu_node_since:timestamp": "it only drops what an earlier exporter process saw, on a node that left or was re-created: read a minute late, such an XID ends up to a minute later, and its absence keeps every fault (no gap, so no second page)",
}

// TestGroupIntervals holds the rules' two speeds (docs/performance.md: "Rule evaluation
// at fleet size"): groups with an `interval:` of their own run at most once
// a minute, so that what they record stays well inside Prometheus' 5-minute
// lookback for the rules and dashboards that read it; a critical alert that
// fires within 5 minutes runs every cycle (a group without an interval), and
// so does everything such a group reads that rules record: a page must not
// wait for a slower group's recording.
func TestGroupIntervals(t *testing.T) {
	f, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	slowRecords := map[string]string{}
	slow := 0
	for _, g := range f.Groups {
		if g.Interval == "" {
			continue
		}
		slow++
		d, err := model.ParseDuration(g.Interval)
		if err != nil {
			t.Fatalf("group %s: interval %q: %v", g.Name, g.Interval, err)
		}
		if time.Duration(d) > time.Minute {
			t.Errorf("group %s: interval %s; at most 1m, so that its series stay inside the 5m lookback", g.Name, g.Interval)
		}
		for _, r := range g.Rules {
			if r.Record != "" {
				slowRecords[r.Record] = g.Name
			}
			if r.Alert == "" || r.Labels["severity"] != "critical" {
				continue
			}
			if r.For == "" {
				t.Errorf("alert %s (critical, no for) is in group %s, evaluated every %s: move it to a group without an interval", r.Alert, g.Name, g.Interval)
				continue
			}
			fd, err := model.ParseDuration(r.For)
			if err != nil {
				t.Fatalf("alert %s: for %q: %v", r.Alert, r.For, err)
			}
			if time.Duration(fd) < 5*time.Minute {
				t.Errorf("alert %s (critical, for %s) is in group %s, evaluated every %s: move it to a group without an interval", r.Alert, r.For, g.Name, g.Interval)
			}
		}
	}
	if slow == 0 {
		t.Fatal("no group has an interval of its own: every rule runs every cycle again")
	}
	for _, g := range f.Groups {
		if g.Interval != "" {
			continue
		}
		for _, r := range g.Rules {
			for rec, sg := range slowRecords {
				if _, ok := fastReadsOfSlowRecords[rec]; ok {
					continue
				}
				if regexp.MustCompile(`(^|[^a-zA-Z0-9_:])` + regexp.QuoteMeta(rec) + `($|[^a-zA-Z0-9_:])`).MatchString(r.Expr) {
					t.Errorf("%s in group %s (every cycle) reads %s, recorded once a minute by %s", r.Name(), g.Name, rec, sg)
				}
			}
		}
	}
}

// RecordingFile keeps each recording's record and expression, in order, in
// one group with the interval given, and refuses an alert.
func TestRecordingFile(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	names := rf.RecordNames()[:2]
	recs, err := rf.Recordings(names[1], names[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := RecordingFile("subset", "1s", recs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParseRules(b)
	if err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if len(got.Groups) != 1 || got.Groups[0].Name != "subset" || got.Groups[0].Interval != "1s" || len(got.Groups[0].Rules) != 2 {
		t.Fatalf("want one group subset, interval 1s, two rules:\n%s", b)
	}
	for i, r := range got.Groups[0].Rules {
		if r.Record != recs[i].Record || r.Expr != recs[i].Expr || len(r.Labels) != 0 {
			t.Errorf("rule %d: %+v, want %s: %s without labels", i, r, recs[i].Record, recs[i].Expr)
		}
	}
	if b, err := RecordingFile("default", "", recs); err != nil || strings.Contains(string(b), "interval") {
		t.Errorf("no interval given: %v\n%s", err, b)
	}
	if _, err := RecordingFile("x", "", rf.Alerts()[:1]); err == nil || !strings.Contains(err.Error(), rf.Alerts()[0].Alert) {
		t.Errorf("an alert: %v; want an error naming it", err)
	}
}
