// Package e2e runs the alert rules and the dashboards' queries in a real
// Prometheus server against the exporter on a simulated node.
//
// The test builds ./cmd/gpu-pool-exporter, starts it on scenario.yaml with a
// 1s sample interval, starts a fake kube-state-metrics (kube_node_labels for
// the node pool), writes a prometheus.yml that scrapes both every second and
// loads a copy of alerts/gpu-pool-exporter.rules.yml with every `for:`
// shortened to forDuration, starts Prometheus, and then checks that
//   - exactly expectedAlerts fire (and no other alert), and
//   - every dashboard query (panel targets, variables, annotations) returns
//     data, except those listed in mayBeEmpty.
//
// A second exporter runs the same scenario with --collector.profile=lean, as
// node leanNodeName in its own pool, scraped by the same Prometheus: every
// dashboard query, every selector of every rule and every recorded series
// that has data for the default node must have data for the lean one, and
// expectedAlerts must fire for it too.
//
// The default exporter serves dcgm-exporter's families from a user's own
// counters file (dcgm-exporter's default list with the double-bit ECC total
// turned on). Prometheus scrapes them twice: as dcgm-exporter's chart does
// (honor_labels false, job gpu-pool-exporter) and with honor_labels true,
// relabeled to dcgm-exporter's job as docs/migration-dcgm-exporter.md says
// (job nvidia-dcgm-exporter, DCGM_FI_* only). dcgm-exporter's dashboard runs
// on each, pinned to its job, and a user's alert on
// DCGM_FI_DEV_ECC_DBE_VOL_TOTAL fires on each, naming the holder as that
// scrape names it. The test logs the Prometheus version it ran on.
//
// It needs the prometheus server binary: on PATH or /usr/bin/prometheus
// (Debian's `apt-get install -y prometheus`). Without it the test is skipped,
// unless CI is set: then it fails.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/internal/proctest"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/dashboards"
)

// expectedAlerts are the alerts scenario.yaml must make fire, and the only
// ones allowed to.
var expectedAlerts = []string{
	"GPUXIDNodeRebootRequired",    // XID 79 on GPU 3: reboot the node
	"GPUDevicePluginCapacityLoss", // kubelet allocatable 0, GPUs healthy
	"GPUAllocationIdle",           // research/notebook-0 idles on GPU 2
	"GPUReplacementRecommended",   // GPU 6's banks run short of spare rows
	"GPUUncorrectableECCErrors",   // GPU 0 counts double-bit ECC errors
}

// userAlerts are a dcgm-exporter user's own alerts on the counters file's
// families (userRules), which must fire for both scrapes of the default
// node, and which alone besides expectedAlerts may fire.
var userAlerts = []string{"DCGMDoubleBitECCErrors"}

// userRules are a dcgm-exporter user's own rules: an alert on a family the
// default counters leave out and the user's file lists.
const userRules = `groups:
  - name: dcgm-exporter-user
    rules:
      - alert: DCGMDoubleBitECCErrors
        expr: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0
        labels:
          severity: critical
`

// The two scrapes of the default exporter's DCGM_FI_* families: as
// dcgm-exporter's chart scrapes (honor_labels false: holders in
// exported_*), and with honor_labels true under dcgm-exporter's job name.
var dcgmScrapes = []dcgmScrape{
	{job: "gpu-pool-exporter", holder: "exported_"},
	{job: dcgmExporterJob, holder: "", honorLabels: true},
}

// dcgmExporterJob is the job of the GPU Operator's dcgm-exporter Service.
const dcgmExporterJob = "nvidia-dcgm-exporter"

// dcgmScrape is one scrape of the DCGM_FI_* families: its job and the
// prefix of the holder labels it gives them.
type dcgmScrape struct {
	job, holder string
	honorLabels bool
}

func (s dcgmScrape) String() string {
	return fmt.Sprintf("job %s (honor_labels %v)", s.job, s.honorLabels)
}

// nodeName is the node label the scrape config gives the exporter's series;
// scenario.yaml names its node the same.
const nodeName = "sim-gpu-node-0"

// nodePool is the GKE node pool the fake kube-state-metrics puts the node in.
const nodePool = "sim-pool"

// leanNodeName and leanPool are the node and pool of the exporter that runs
// the lean profile.
const (
	leanNodeName = "sim-gpu-node-lean"
	leanPool     = "sim-pool-lean"
)

// The zones the fake kube-state-metrics puts the two nodes in, and their
// GKE accelerator label.
const (
	nodeZone    = "us-central1-a"
	leanZone    = "us-central1-b"
	accelerator = "nvidia-h100-80gb"
)

// forDuration replaces every `for:` of the rules: a test cannot wait 2h.
const forDuration = "5s"

// exporterFlags are added to the exporter's command line when its --help
// lists them: the idle window must be short for GPUAllocationIdle to fire
// within the test, and a price makes the cost queries return data (the
// simulated GPUs are "NVIDIA H100 80GB HBM3").
var exporterFlags = []string{
	"--idle.window=10s",
	"--idle.price=NVIDIA H100 80GB HBM3=11.06",
	// dcgm-exporter's names beside ours: its dashboard is checked too,
	// with the 4.8 release line's contract (the dashboard's names), and
	// the time-sliced GPU's holders named as a dcgm-exporter on such a
	// node names them.
	"--compat.dcgm-exporter",
	"--compat.dcgm-exporter.release=4.8",
	"--compat.dcgm-exporter.nvidia-resource-names=nvidia.com/gpu.shared",
}

// mayBeEmpty are dashboard panels (or variables) with a query that needs what
// the scenario does not produce (Pending pods, throttled GPUs), by
// "<dashboard>: <panel title>". The test logs entries that no longer need
// to be here.
// Keep this list short: every entry is a panel the e2e test cannot vouch for.
var mayBeEmpty = map[string]string{
	"gpu-workloads.json: Pending GPU pods by request":                           "no Pending pods: fake kube-state-metrics serves none",
	"gpu-pool-overview.json: Uncorrectable ECC errors, lost and throttled GPUs": "only the ECC series exist, the others are counts of none",
	// Panels that show 0 (or vector(0)) when nothing is wrong:
	"gpu-pool-overview.json: Pending GPU pods":    "no Pending pods: a Pending GPU pod would fire GPUPodPendingWhileGPUsFree",
	"gpu-workloads.json: Pending GPU pods":        "no Pending pods: a Pending GPU pod would fire GPUPodPendingWhileGPUsFree",
	"gpu-node.json: Unmatched kubelet device IDs": "every simulated device ID matches a device",
}

// Timeouts.
const (
	startTimeout = 60 * time.Second
	alertTimeout = 120 * time.Second
)

func TestAlertsAndDashboardsEndToEnd(t *testing.T) {
	t.Parallel() // beside TestRightsizingEndToEnd, which waits minutes for its window
	promBin := prometheusBinary(t)
	root := repoRoot(t)
	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	// 1. The exporter on the simulated node.
	gpe := proctest.ExporterBinary(t, ctx, root, filepath.Join(tmp, "gpe"))
	help, _ := exec.CommandContext(ctx, gpe, "--help").CombinedOutput()
	exporterAddr := freeAddr(t)
	args := []string{
		"--simulate.scenario=" + filepath.Join(root, "alerts", "e2e", "scenario.yaml"),
		"--collect-interval=1s",
		"--web.listen-address=" + exporterAddr,
		"--node-name=" + nodeName,
		"--log.level=info",
	}
	for _, f := range exporterFlags {
		name := strings.SplitN(f, "=", 2)[0]
		// Boolean flags show as --[no-]name in --help.
		if regexp.MustCompile(`(--|\[no-\])` + regexp.QuoteMeta(strings.TrimPrefix(name, "--")) + `[=\s]`).Match(help) {
			args = append(args, f)
		} else {
			t.Logf("exporter has no %s flag; not passing %s", name, f)
		}
	}
	args = append(args, "--compat.dcgm-exporter.collectors="+userCounters(t, root, tmp))
	startProcess(t, ctx, filepath.Join(tmp, "exporter.log"), gpe, args...)
	// The same node on the lean profile, without dcgm-exporter's names.
	leanAddr := freeAddr(t)
	var leanArgs []string
	for _, a := range args {
		switch {
		case a == "--compat.dcgm-exporter", strings.HasPrefix(a, "--compat.dcgm-exporter."):
		case strings.HasPrefix(a, "--web.listen-address="):
			leanArgs = append(leanArgs, "--web.listen-address="+leanAddr)
		case strings.HasPrefix(a, "--node-name="):
			leanArgs = append(leanArgs, "--node-name="+leanNodeName)
		default:
			leanArgs = append(leanArgs, a)
		}
	}
	startProcess(t, ctx, filepath.Join(tmp, "exporter-lean.log"), gpe, append(leanArgs, "--collector.profile=lean")...)
	waitHTTP(t, "http://"+exporterAddr+"/metrics", startTimeout, filepath.Join(tmp, "exporter.log"))
	waitHTTP(t, "http://"+leanAddr+"/metrics", startTimeout, filepath.Join(tmp, "exporter-lean.log"))

	// 2. A fake kube-state-metrics: the node's pool and accelerator.
	ksm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# HELP kube_node_labels Kubernetes labels converted to Prometheus labels.\n# TYPE kube_node_labels gauge\n")
		for _, n := range [][3]string{{nodeName, nodePool, nodeZone}, {leanNodeName, leanPool, leanZone}} {
			fmt.Fprintf(w, "kube_node_labels{node=%q,label_cloud_google_com_gke_nodepool=%q,label_cloud_google_com_gke_accelerator=%q,label_topology_kubernetes_io_zone=%q} 1\n", n[0], n[1], accelerator, n[2])
		}
		fmt.Fprintf(w, "# HELP kube_node_spec_unschedulable Whether a node can schedule new pods.\n# TYPE kube_node_spec_unschedulable gauge\n")
		for _, n := range []string{nodeName, leanNodeName} {
			fmt.Fprintf(w, "kube_node_spec_unschedulable{node=%q} 0\n", n)
		}
	}))
	t.Cleanup(ksm.Close)

	// 3. Prometheus with the rules, every `for:` shortened and every group
	// evaluated each second (the slow groups' `interval: 1m` would make the
	// test wait minutes).
	rules := shortenFor(string(alerts.RulesYAML), forDuration)
	if !groupIntervalRE.MatchString(rules) {
		t.Fatal("no rule group has an `interval:` any more: update this test's rewriting")
	}
	rules = groupIntervalRE.ReplaceAllString(rules, "${1}1s")
	if err := os.WriteFile(filepath.Join(tmp, "rules.yml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "user-rules.yml"), []byte(userRules), 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := freeAddr(t)
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %s
  - %s
scrape_configs:
  - job_name: gpu-pool-exporter
    # As the chart's ServiceMonitor with exporter.compatDCGMExporter=true,
    # which is how dcgm-exporter's chart scrapes: honor_labels false, so
    # the DCGM_FI_* holder labels arrive as exported_namespace/pod/container
    # and the target's namespace/pod/container stay; the metric relabelings
    # give the gpu_* families their own back, and the shipped rules read
    # them unchanged.
    honor_labels: false
    metric_relabel_configs:
      - source_labels: [__name__, exported_namespace]
        regex: "gpu_.*;(.+)"
        target_label: namespace
        replacement: "$1"
      - source_labels: [__name__]
        regex: "gpu_.*"
        target_label: exported_namespace
        replacement: ""
      - source_labels: [__name__, exported_pod]
        regex: "gpu_.*;(.+)"
        target_label: pod
        replacement: "$1"
      - source_labels: [__name__]
        regex: "gpu_.*"
        target_label: exported_pod
        replacement: ""
      - source_labels: [__name__, exported_container]
        regex: "gpu_.*;(.+)"
        target_label: container
        replacement: "$1"
      - source_labels: [__name__]
        regex: "gpu_.*"
        target_label: exported_container
        replacement: ""
    static_configs:
      - targets: [%q]
        labels: &x7k2p
          node: %q
          namespace: gpu-pool-exporter
          pod: gpu-pool-exporter-x7k2p
          container: exporter
      - targets: [%q]
        labels:
          node: %q
          namespace: gpu-pool-exporter
          pod: gpu-pool-exporter-l3an5
          container: exporter
  - job_name: dcgm-exporter-honor-labels
    # As a ServiceMonitor with honorLabels: true: the holder labels the
    # DCGM_FI_* series carry replace the target's namespace/pod/container.
    # Only DCGM_FI_* are kept (the shipped rules read gpu_* from the job
    # above), given dcgm-exporter's job by docs/migration-dcgm-exporter.md's
    # relabeling.
    honor_labels: true
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: "DCGM_FI_.*"
        action: keep
%s
    static_configs:
      - targets: [%q]
        labels: *x7k2p
  - job_name: kube-state-metrics
    honor_labels: true
    static_configs:
      - targets: [%q]
`, filepath.Join(tmp, "rules.yml"), filepath.Join(tmp, "user-rules.yml"), exporterAddr, nodeName, leanAddr, leanNodeName,
		docsJobRelabeling(t, root), exporterAddr, strings.TrimPrefix(ksm.URL, "http://"))
	configFile := filepath.Join(tmp, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	promLog := filepath.Join(tmp, "prometheus.log")
	startProcess(t, ctx, promLog, promBin,
		"--config.file="+configFile,
		"--storage.tsdb.path="+filepath.Join(tmp, "data"),
		"--web.listen-address="+promAddr,
	)
	prom := "http://" + promAddr
	waitHTTP(t, prom+"/-/ready", startTimeout, promLog)
	var build struct {
		Data struct {
			Version string `json:"version"`
		} `json:"data"`
	}
	if err := getJSON(prom+"/api/v1/status/buildinfo", &build); err != nil {
		t.Fatalf("/api/v1/status/buildinfo: %v", err)
	}
	t.Logf("Prometheus %s (%s)", build.Data.Version, promBin)

	// 4. The expected alerts fire, and no other.
	deadline := time.Now().Add(alertTimeout)
	var firing, leanFiring []string
	for {
		firing, leanFiring = firingAlerts(t, prom), firingAlerts(t, prom, leanNodeName)
		if containsAll(firing, expectedAlerts) && containsAll(leanFiring, expectedAlerts) && userAlertsFiring(prom) == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if err := userAlertsFiring(prom); err != nil {
		t.Errorf("after %s: %v", alertTimeout, err)
	}
	if !containsAll(firing, expectedAlerts) {
		t.Errorf("after %s, firing: %v; want %v firing", alertTimeout, firing, expectedAlerts)
		dumpState(t, prom)
	}
	if !containsAll(leanFiring, expectedAlerts) {
		t.Errorf("after %s, firing on the lean node: %v; want %v firing", alertTimeout, leanFiring, expectedAlerts)
	}
	// Give late alerts a chance to show up before the "no other" check.
	time.Sleep(3 * time.Second)
	firing = firingAlerts(t, prom)
	for _, a := range firing {
		if !slices.Contains(expectedAlerts, a) && !slices.Contains(userAlerts, a) {
			t.Errorf("alert %s fires but scenario.yaml should not cause it", a)
		}
	}

	// 5. Every dashboard query returns data, on the lean node too.
	checkDashboards(t, prom)

	// 6. Every rule reads on the lean node what it reads on the default.
	checkLeanRules(t, prom)

	// 7. So does every query of dcgm-exporter's own dashboard, on each
	// scrape, and every family of its default counter list is there with
	// its type.
	for _, sc := range dcgmScrapes {
		checkDCGMExporterDashboard(t, prom, sc)
	}

	// 8. The zone recordings agree with the nodes' own series, and `fleet`
	// prints what the recordings hold.
	checkZones(t, prom)
	checkFleet(t, prom, proctest.GpupoolBinary(t, ctx, root, filepath.Join(tmp, "gpupool")))

	if t.Failed() {
		for _, f := range []string{filepath.Join(tmp, "exporter.log"), filepath.Join(tmp, "exporter-lean.log"), promLog} {
			tailFile(t, f, 40)
		}
	}
}

// diagnostics are the series behind expectedAlerts, logged when they do
// not fire.
var diagnostics = []string{
	`ALERTS`,
	`gpu_xid_errors_total`,
	`gpu_xid:gpu_xid_errors:increase1h`,
	`gpu_kubelet_allocatable_devices`,
	`gpu_healthy_devices`,
	`gpu_exporter_collector_up`,
	`gpu_allocation_idle`,
	`gpu_sm_active_ratio{gpu="2"}`,
	`gpu_utilization_ratio{gpu="2"}`,
}

func dumpState(t *testing.T, prom string) {
	t.Helper()
	for _, q := range diagnostics {
		var r struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
					Value  []any             `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if err := getJSON(prom+"/api/v1/query?query="+url.QueryEscape(q), &r); err != nil {
			t.Logf("%s: %v", q, err)
			continue
		}
		var lines []string
		for _, s := range r.Data.Result {
			lines = append(lines, fmt.Sprintf("  %v = %v", s.Metric, s.Value[1:]))
		}
		t.Logf("%s:\n%s", q, strings.Join(lines, "\n"))
	}
}

func checkDashboards(t *testing.T, prom string) {
	t.Helper()
	qs, err := dashboards.AllQueries()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{"nodepool": nodePool, "node": nodeName, "namespace": ".*", "gpu": ".*"}
	leanValues := map[string]string{"nodepool": leanPool, "node": leanNodeName, "namespace": ".*", "gpu": ".*"}
	var empty, leanEmpty []string
	excused := map[string]bool{}
	for _, q := range qs {
		expr, unknown, ok := q.PromQL(values)
		if !ok {
			continue
		}
		// "or vector(0)" makes a panel show 0 rather than nothing; the
		// check is about the query before it.
		expr = orVectorZero.ReplaceAllString(expr, "")
		if len(unknown) > 0 {
			t.Errorf("%s: unknown variables %v", q, unknown)
			continue
		}
		n, err := queryCount(prom, expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", q, err, expr)
			continue
		}
		if n > 0 {
			leanExpr, _, _ := q.PromQL(leanValues)
			leanExpr = orVectorZero.ReplaceAllString(leanExpr, "")
			if m, err := queryCount(prom, leanExpr); err != nil || m == 0 {
				leanEmpty = append(leanEmpty, fmt.Sprintf("%s (%s; %v)\n    %s", q, q.Kind, err, strings.Join(strings.Fields(leanExpr), " ")))
			}
		}
		key := q.Dashboard + ": " + q.Panel
		if n == 0 {
			if _, ok := mayBeEmpty[key]; !ok {
				empty = append(empty, fmt.Sprintf("%s (%s)\n    %s", q, q.Kind, strings.Join(strings.Fields(expr), " ")))
			}
			excused[key] = true
		}
	}
	sort.Strings(empty)
	for _, e := range empty {
		t.Errorf("dashboard query returns no data: %s", e)
	}
	sort.Strings(leanEmpty)
	for _, e := range leanEmpty {
		t.Errorf("dashboard query returns data for the default profile's node, none for the lean one: %s", e)
	}
	for key := range mayBeEmpty {
		if !excused[key] {
			t.Logf("mayBeEmpty lists %q, but all its queries return data now: remove it from the list", key)
		}
	}
}

// checkLeanRules: every selector of every rule, narrowed to one node,
// selects series on the lean node wherever it does on the default one, and
// so does every recorded series that carries the node or its pool.
func checkLeanRules(t *testing.T, prom string) {
	t.Helper()
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	p := parser.NewParser(parser.Options{})
	selectors := map[string]string{} // selector -> the first rule using it
	var records []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				records = append(records, r.Record)
			}
			e, err := p.ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", r.Name(), err)
				continue
			}
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				if vs, ok := n.(*parser.VectorSelector); ok {
					if sel := vs.String(); selectors[sel] == "" {
						selectors[sel] = r.Name()
					}
				}
				return nil
			})
		}
	}
	if len(selectors) < 40 || len(records) < 20 {
		t.Fatalf("only %d selectors and %d records in the rules: parsing lost some", len(selectors), len(records))
	}
	count := func(expr string) int {
		n, err := queryCount(prom, expr)
		if err != nil {
			t.Errorf("%s: %v", expr, err)
		}
		return n
	}
	checked := 0
	for sel, rule := range selectors {
		onNode := func(node string) string {
			vs, _ := p.ParseExpr(sel)
			m, _ := labels.NewMatcher(labels.MatchEqual, "node", node)
			vs.(*parser.VectorSelector).LabelMatchers = append(vs.(*parser.VectorSelector).LabelMatchers, m)
			return vs.String()
		}
		if count(onNode(nodeName)) == 0 {
			continue
		}
		checked++
		if count(onNode(leanNodeName)) == 0 {
			t.Errorf("rule %s: %s selects series on the default profile's node, none on the lean one", rule, onNode(leanNodeName))
		}
	}
	for _, r := range records {
		for _, x := range [][3]string{{"node", nodeName, leanNodeName}, {"nodepool", nodePool, leanPool}} {
			if count(fmt.Sprintf(`%s{%s=%q}`, r, x[0], x[1])) == 0 {
				continue
			}
			checked++
			if count(fmt.Sprintf(`%s{%s=%q}`, r, x[0], x[2])) == 0 {
				t.Errorf("recording rule %s has series for %s=%q, none for the lean profile's %q", r, x[0], x[1], x[2])
			}
		}
	}
	t.Logf("lean profile: %d rule selectors and recorded series checked against the default profile", checked)
}

// groupIntervalRE matches a rule group's `interval:` line.
var groupIntervalRE = regexp.MustCompile(`(?m)^(    interval:\s*)\S+\s*$`)

// shortenFor rewrites every `for: <duration>` in a rules file.
func shortenFor(rules, d string) string {
	return regexp.MustCompile(`(?m)^(\s+for:\s*)\S+\s*$`).ReplaceAllString(rules, "${1}"+d)
}

// prometheusBinary finds the Prometheus server: on PATH, else
// /usr/bin/prometheus. Missing: skip, or fail when CI is set.
func prometheusBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/prometheus"); err == nil {
		return "/usr/bin/prometheus"
	}
	msg := "the prometheus server is not installed (not on PATH, no /usr/bin/prometheus): install it with `apt-get install -y prometheus`"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// firingAlerts lists the names of the alerts firing now: all of them, or,
// given a node, those with that node label.
func firingAlerts(t *testing.T, prom string, node ...string) []string {
	t.Helper()
	var r struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := getJSON(prom+"/api/v1/alerts", &r); err != nil {
		t.Fatalf("/api/v1/alerts: %v", err)
	}
	var out []string
	for _, a := range r.Data.Alerts {
		if a.State != "firing" || len(node) > 0 && a.Labels["node"] != node[0] || slices.Contains(out, a.Labels["alertname"]) {
			continue
		}
		out = append(out, a.Labels["alertname"])
	}
	sort.Strings(out)
	return out
}

// queryCount runs an instant query and counts the result's series.
var orVectorZero = regexp.MustCompile(`\s*or\s+vector\(0\)\s*$`)

func queryCount(prom, expr string) (int, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(prom+"/api/v1/query?query="+url.QueryEscape(expr), &r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("query failed: %s", r.Error)
	}
	switch r.Data.ResultType {
	case "scalar", "string":
		return 1, nil
	default:
		var v []json.RawMessage
		if err := json.Unmarshal(r.Data.Result, &v); err != nil {
			return 0, err
		}
		return len(v), nil
	}
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// dcgmExporter is testdata/dcgm-exporter.json: the queries of dcgm-exporter's
// Grafana dashboard and its default counter list, copied from its repository
// at the commit named in the file.
type dcgmExporter struct {
	Source string `json:"source"`
	Commit string `json:"commit"`
	Panels []struct {
		Title string `json:"title"`
		Expr  string `json:"expr"`
	} `json:"panels"`
	Variables []struct {
		Name  string `json:"name"`
		Query string `json:"query"`
	} `json:"variables"`
	DefaultCounters struct {
		Fields []struct {
			Field string `json:"field"`
			Type  string `json:"type"`
		} `json:"fields"`
	} `json:"defaultCounters"`
}

// notServed are the default counters gpu-pool-exporter does not serve, and why.
var notServed = map[string]string{
	"DCGM_FI_DRIVER_VERSION": "a label on every family, as dcgm-exporter serves it",
}

// labelValuesRE is Grafana's label_values(metric, label) variable query.
var labelValuesRE = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)

func checkDCGMExporterDashboard(t *testing.T, prom string, sc dcgmScrape) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "dcgm-exporter.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dcgmExporter
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("testdata/dcgm-exporter.json: %v", err)
	}
	if len(d.Panels) < 8 || len(d.Variables) < 2 || len(d.DefaultCounters.Fields) < 20 || d.Commit == "" {
		t.Fatalf("testdata/dcgm-exporter.json lost its content: %d panels, %d variables, %d counters", len(d.Panels), len(d.Variables), len(d.DefaultCounters.Fields))
	}
	// The variables: each must list at least one value; the panels then
	// run with the variable matching everything it listed.
	values := map[string]string{}
	for _, v := range d.Variables {
		m := labelValuesRE.FindStringSubmatch(v.Query)
		if m == nil {
			t.Errorf("dcgm-exporter variable %s: %q is not label_values(metric, label)", v.Name, v.Query)
			continue
		}
		var r struct {
			Data []map[string]string `json:"data"`
		}
		if err := getJSON(prom+"/api/v1/series?match[]="+url.QueryEscape(m[1]+`{job="`+sc.job+`"}`), &r); err != nil {
			t.Errorf("dcgm-exporter variable %s: %v", v.Name, err)
			continue
		}
		seen := map[string]bool{}
		for _, s := range r.Data {
			if x := s[m[2]]; x != "" {
				seen[x] = true
			}
		}
		if len(seen) == 0 {
			t.Errorf("dcgm-exporter variable %s (%s) lists no value", v.Name, v.Query)
			continue
		}
		var alts []string
		for x := range seen {
			// As Grafana does: regex-escaped, then escaped for a PromQL string.
			alts = append(alts, strings.ReplaceAll(regexp.QuoteMeta(x), `\`, `\\`))
		}
		sort.Strings(alts)
		values[v.Name] = strings.Join(alts, "|")
	}
	for _, p := range d.Panels {
		expr := p.Expr
		for name, v := range values {
			expr = strings.ReplaceAll(expr, "$"+name, v)
		}
		if strings.Contains(expr, "$") {
			t.Errorf("dcgm-exporter panel %q: unknown variable in %s", p.Title, expr)
			continue
		}
		expr = scopeToJob(t, expr, sc.job)
		n, err := queryCount(prom, expr)
		switch {
		case err != nil:
			t.Errorf("%s: dcgm-exporter panel %q: %v\n%s", sc, p.Title, err, expr)
		case n == 0:
			t.Errorf("%s: dcgm-exporter panel %q returns no data: %s", sc, p.Title, expr)
		}
	}
	// Scraped as dcgm-exporter is (honor_labels false): the holder is in
	// exported_pod, the exporter pod in pod; gpu_* keep their own pod.
	// With honor_labels true the holder is in pod, and a device nobody
	// holds keeps the target's own namespace and pod.
	want := map[string]bool{
		`DCGM_FI_DEV_GPU_TEMP{exported_pod="train-0", pod="gpu-pool-exporter-x7k2p"}`: true,
		// GPU 3, lost to XID 79 and held by nobody, keeps its XID series.
		`DCGM_FI_DEV_XID_ERRORS{gpu="3", err_code="79", err_msg="GPU has fallen off the bus", exported_pod="", pod="gpu-pool-exporter-x7k2p"} == 79`: true,
		`gpu_allocation_info{pod="train-0"}`:           true,
		`gpu_allocation_info{exported_pod!=""}`:        false,
		`{__name__=~"gpu_.*", exported_namespace!=""}`: false,
	}
	if sc.honorLabels {
		want = map[string]bool{
			`DCGM_FI_DEV_GPU_TEMP{namespace="ml-training", pod="train-0", container="trainer"}`:                                                                        true,
			`DCGM_FI_DEV_XID_ERRORS{gpu="3", err_code="79", err_msg="GPU has fallen off the bus", namespace="gpu-pool-exporter", pod="gpu-pool-exporter-x7k2p"} == 79`: true,
			`DCGM_FI_DEV_GPU_TEMP{exported_pod!=""}`:                  false,
			`{job="` + sc.job + `", __name__!~"DCGM_FI_.*|ALERTS.*"}`: false,
		}
	}
	for expr, want := range want {
		expr = scopeToJob(t, expr, sc.job)
		if n, err := queryCount(prom, expr); err != nil || (n > 0) != want {
			t.Errorf("%s: %s: %d series (%v), want some: %v", sc, expr, n, err, want)
		}
	}
	checkDCGMExporterValues(t, prom, d, values, sc)
	// Every default counter is served under its name, with its type.
	var meta struct {
		Data map[string][]struct {
			Type string `json:"type"`
		} `json:"data"`
	}
	if err := getJSON(prom+"/api/v1/metadata", &meta); err != nil {
		t.Fatalf("/api/v1/metadata: %v", err)
	}
	for _, f := range d.DefaultCounters.Fields {
		if why, ok := notServed[f.Field]; ok {
			if f.Field == "DCGM_FI_DRIVER_VERSION" {
				if n, err := queryCount(prom, `DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION!=""}`); err != nil || n == 0 {
					t.Errorf("DCGM_FI_DRIVER_VERSION is not a label of DCGM_FI_DEV_GPU_TEMP (%d series, %v)", n, err)
				}
			}
			t.Logf("%s not served as a family: %s", f.Field, why)
			continue
		}
		n, err := queryCount(prom, f.Field+`{job="`+sc.job+`"}`)
		if f.Field == "DCGM_FI_DEV_FB_RESERVED" {
			// From NVML's memory info v2 (R510+), as gpu_memory_reserved_bytes.
			if ours, _ := queryCount(prom, "gpu_memory_reserved_bytes"); ours == 0 && n == 0 {
				t.Logf("%s not served: the driver reports no reserved memory (gpu_memory_reserved_bytes absent too)", f.Field)
				continue
			}
		}
		if err != nil || n == 0 {
			t.Errorf("%s: default counter %s: %d series (%v)", sc, f.Field, n, err)
			continue
		}
		if ms := meta.Data[f.Field]; len(ms) == 0 || ms[0].Type != f.Type {
			t.Errorf("default counter %s: Prometheus has type %v, dcgm-exporter's list says %s", f.Field, ms, f.Type)
		}
	}
}

// dcgmPanelNative is, for each panel of dcgm-exporter's dashboard, the
// query over gpu-pool-exporter's own families that must give the same
// values, GPU by GPU (or the same aggregate), with its tolerance.
var dcgmPanelNative = map[string]struct {
	native string
	tol    float64
}{
	"GPU Temperature":          {`gpu_temperature_celsius{instance=~"$instance", gpu=~"$gpu"}`, 0},
	"GPU Avg. Temp":            {`avg(gpu_temperature_celsius{instance=~"$instance", gpu=~"$gpu"})`, 1e-9},
	"GPU Power Usage":          {`gpu_power_watts{instance=~"$instance", gpu=~"$gpu"}`, 1e-9},
	"GPU Power Total":          {`sum(gpu_power_watts{instance=~"$instance", gpu=~"$gpu"})`, 1e-6},
	"GPU SM Clocks":            {`gpu_sm_clock_hertz{instance=~"$instance", gpu=~"$gpu"}`, 1e-3},
	"GPU Utilization":          {`100 * gpu_utilization_ratio{instance=~"$instance", gpu=~"$gpu"}`, 1e-9},
	"GPU Framebuffer Mem Used": {`floor(gpu_memory_used_bytes{instance=~"$instance", gpu=~"$gpu", gpu_instance=""} / 2^20)`, 0},
	"Tensor Core Utilization":  {`gpu_tensor_active_ratio{instance=~"$instance", gpu=~"$gpu", gpu_instance=""}`, 1e-9},
}

// exportedDashboard are queries of a dashboard written for dcgm-exporter
// scraped by the Prometheus Operator (holders in exported_*), each with
// the query over gpu-pool-exporter's own families that must give the same
// values, keyed by the label named.
var exportedDashboard = []struct {
	title, compat, native, compatKey, nativeKey string
	// exportedOnly: the query needs the holders apart from the target's
	// own labels (with honor_labels true a device nobody holds keeps the
	// target's namespace).
	exportedOnly bool
}{
	{"GPUs per namespace",
		`count by (exported_namespace) (DCGM_FI_DEV_FB_USED{exported_namespace!=""})`,
		`count by (namespace) (count by (namespace, uuid, gpu_instance) (gpu_allocation_info{instance=~"$instance"}))`,
		"exported_namespace", "namespace", true},
	{"VRAM used by train-0 (MiB)",
		`sum by (exported_pod) (DCGM_FI_DEV_FB_USED{exported_pod="train-0"})`,
		`sum by (pod) (floor(gpu_memory_used_bytes{instance=~"$instance", gpu_instance=""} / 2^20) * on (uuid) group_left (pod) gpu_allocation_info{instance=~"$instance", pod="train-0"})`,
		"exported_pod", "pod", false},
	{"Average utilization of ml-training (%)",
		`avg by (exported_namespace) (DCGM_FI_DEV_GPU_UTIL{exported_namespace="ml-training"})`,
		`100 * avg by (namespace) (gpu_utilization_ratio{instance=~"$instance"} * on (uuid) group_left (namespace) gpu_allocation_info{instance=~"$instance", namespace="ml-training"})`,
		"exported_namespace", "namespace", false},
}

// checkDCGMExporterValues runs dcgm-exporter's dashboard panels (on the
// whole GPUs that answer: a MIG GPU's board values repeat per instance, as
// dcgm-exporter's do) and the holder dashboard's queries, and compares
// each value with our own families' at the same instant (one scrape holds
// both); on the other scrape, which keeps no gpu_* family, it compares
// which GPUs and holders the answers name.
func checkDCGMExporterValues(t *testing.T, prom string, d dcgmExporter, values map[string]string, sc dcgmScrape) {
	t.Helper()
	at := strconv.FormatFloat(float64(time.Now().Add(-2*time.Second).UnixMilli())/1000, 'f', 3, 64)
	subst := func(expr string) string {
		expr = strings.ReplaceAll(expr, "$instance", values["instance"])
		return strings.ReplaceAll(expr, "$gpu", "0|1|2|4|5|6")
	}
	compare := func(what, compat, native, ck, nk string, tol float64) {
		what = sc.String() + ": " + what
		if sc.job != "gpu-pool-exporter" {
			// Another scrape than our families', at another moment:
			// the same series (GPUs, holders), their values unchecked.
			tol = math.Inf(1)
		}
		a, err := queryByLabel(prom, scopeToJob(t, subst(compat), sc.job), ck, at)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		b, err := queryByLabel(prom, subst(native), nk, at)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if len(a) == 0 || len(a) != len(b) {
			t.Errorf("%s: %v from %s, %v from %s", what, a, compat, b, native)
			return
		}
		for k, v := range a {
			if w, ok := b[k]; !ok || math.Abs(v-w) > tol {
				t.Errorf("%s{%s=%q}: %v, our families say %v (%s)", what, ck, k, v, w, native)
			}
		}
	}
	for _, p := range d.Panels {
		n, ok := dcgmPanelNative[p.Title]
		if !ok {
			t.Errorf("dcgm-exporter panel %q: no query of our families to compare its values with", p.Title)
			continue
		}
		compare("dcgm-exporter panel "+p.Title, p.Expr, n.native, "gpu", "gpu", n.tol)
	}
	for _, q := range exportedDashboard {
		if q.exportedOnly && sc.holder != "exported_" {
			continue
		}
		compat := strings.ReplaceAll(q.compat, "exported_", sc.holder)
		compare("holder panel "+q.title, compat, q.native, strings.ReplaceAll(q.compatKey, "exported_", sc.holder), q.nativeKey, 1e-9)
	}
	// DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is the current rate: it falls as
	// well as rises (kept from falling it would only climb).
	if n, err := queryCount(prom, `resets(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{job="`+sc.job+`"}[1m]) > 0`); err != nil || n == 0 {
		t.Errorf("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL never fell in a minute (%d series, %v): it ratchets", n, err)
	}
}

// queryByLabel runs expr at time at and returns each series' value by its
// label key ("" for a scalar or a series without it); two series with one
// key are an error.
func queryByLabel(prom, expr, key, at string) (map[string]float64, error) {
	vs, err := queryVectorAt(prom, expr, at)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, v := range vs {
		k := v.Labels[key]
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("%s: two series with %s=%q", expr, key, k)
		}
		out[k] = v.Value
	}
	return out, nil
}

// The servers' plumbing, shared with alerts/thanos.
var (
	freeAddr     = proctest.FreeAddr
	startProcess = proctest.Start
	waitHTTP     = proctest.WaitHTTP
	tailFile     = proctest.TailFile
	getJSON      = proctest.GetJSON
)

// scopeToJob adds job="<job>" to every DCGM_FI_* selector of expr: the
// same families come from two scrapes (dcgmScrapes), and a dashboard pinned
// to one job reads that scrape's alone.
func scopeToJob(t *testing.T, expr, job string) string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok && strings.HasPrefix(vs.Name, "DCGM_FI_") {
			vs.LabelMatchers = append(vs.LabelMatchers, labels.MustNewMatcher(labels.MatchEqual, "job", job))
		}
		return nil
	})
	return e.String()
}

// userCounters writes a dcgm-exporter user's own counters file: the
// default list dcgm-exporter ships (deploy/dcgm-exporter) with the
// double-bit volatile ECC total turned on.
func userCounters(t *testing.T, root, dir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "dcgm-exporter", "4.8.2", "default-counters.csv"))
	if err != nil {
		t.Fatal(err)
	}
	const line = "# DCGM_FI_DEV_ECC_DBE_VOL_TOTAL,"
	if !bytes.Contains(b, []byte(line)) {
		t.Fatalf("deploy/dcgm-exporter/4.8.2/default-counters.csv has no %q line to turn on", line)
	}
	path := filepath.Join(dir, "my-counters.csv")
	if err := os.WriteFile(path, bytes.Replace(b, []byte(line), []byte(line[2:]), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// docsJobRelabeling is docs/migration-dcgm-exporter.md's relabeling to
// dcgm-exporter's job, as items of this test's metric_relabel_configs.
func docsJobRelabeling(t *testing.T, root string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docs", "migration-dcgm-exporter.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, block := range strings.Split(string(b), "```yaml\n")[1:] {
		block, _, _ = strings.Cut(block, "```")
		head, items, ok := strings.Cut(block, "\n")
		if !ok || head != "metric_relabel_configs:" || !strings.Contains(items, dcgmExporterJob) {
			continue
		}
		var out []string
		for _, l := range strings.Split(strings.TrimRight(items, "\n"), "\n") {
			out = append(out, "    "+l)
		}
		return strings.Join(out, "\n")
	}
	t.Fatal("docs/migration-dcgm-exporter.md has no metric_relabel_configs block naming " + dcgmExporterJob)
	return ""
}

// userAlertsFiring reports which user alert does not fire as each scrape
// names the holder: DCGMDoubleBitECCErrors on GPU 0, held by train-0.
func userAlertsFiring(prom string) error {
	for _, sc := range dcgmScrapes {
		expr := `ALERTS{alertname="DCGMDoubleBitECCErrors", alertstate="firing", gpu="0", job="` + sc.job + `", ` + sc.holder + `pod="train-0"}`
		if n, err := queryCount(prom, expr); err != nil || n != 1 {
			return fmt.Errorf("%s: %s: %d series (%v), want 1", sc, expr, n, err)
		}
	}
	return nil
}
