// Package thanos runs the sharded rules on Thanos: the node-level layer in two
// Prometheus shards, the global layer in Thanos Ruler through Thanos Query,
// and checks that what comes out equals the flat rules on one Prometheus.
//
// The test starts
//   - four exporters on steady copies of alerts/e2e/scenario.yaml (the same
//     pods and faults, every curve held at its mean so that scrapers reading
//     at different moments see the same values), one of them on the lean
//     profile, one with another driver version and one whose device plugin
//     stays up, spread over two node pools that each span both shards;
//   - a fake kube-state-metrics: node labels and capacity, a node with GPUs
//     and no exporter, and two Pending GPU pods;
//   - shards "a" and "b" (Prometheus, alerts/gpu-pool-exporter.shard.rules.yml,
//     external labels cluster, shard and replica), each scraping two
//     exporters and kube-state-metrics' node objects; shard "a" scrapes all
//     of kube-state-metrics;
//   - a Thanos sidecar beside each shard, Thanos Query over both sidecars
//     and the ruler (--query.replica-label=replica), and Thanos Ruler with
//     alerts/gpu-pool-exporter.global.rules.yml querying through Query; its
//     results reach Query through the ruler's StoreAPI;
//   - a reference Prometheus scraping every exporter and kube-state-metrics
//     with alerts/gpu-pool-exporter.rules.yml (every group).
//
// Every `for:` is shortened and every group runs each second, as in
// alerts/e2e. It then waits until every global recording and every global
// alert (ALERTS) read through Query equals the reference's, external labels
// aside, and until every query of the dashboards that reads pool, namespace
// or cluster figures returns through Query what it returns from the
// reference.
//
// It needs a Thanos binary in $THANOS (skipped otherwise): `make test-thanos`
// builds one with scripts/thanos.sh and runs it. The Prometheus server is
// $PROMETHEUS, else `prometheus` on PATH.
package thanos

import (
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
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/internal/proctest"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/dashboards"
)

// externalLabels are the labels the shards and the ruler add; comparisons
// leave them out (the reference Prometheus has none).
var externalLabels = map[string]bool{"cluster": true, "shard": true, "replica": true, "ruler": true}

// node is one simulated exporter.
type node struct {
	name, pool, shard string
	lean              bool   // --collector.profile=lean
	driver            string // another driver version than scenario.yaml's
	pluginUp          bool   // leave out the device plugin's fault
	addr              string
}

// nodes: each pool spans both shards, so every pool figure sums series of
// two Prometheus servers.
var nodes = []*node{
	{name: "gpu-a0", pool: "pool-1", shard: "a"},
	{name: "gpu-a1", pool: "pool-2", shard: "a", lean: true},
	{name: "gpu-b0", pool: "pool-1", shard: "b", driver: "535.183.01"},
	{name: "gpu-b1", pool: "pool-2", shard: "b", pluginUp: true},
}

// missingNode has GPUs in kube-state-metrics and no exporter.
const missingNode = "gpu-no-exporter"

// cordonedNode is cordoned in kube-state-metrics (node:gpu_node_unschedulable:info):
// its free GPUs leave the pools' room for Pending pods.
const cordonedNode = "gpu-a1"

// heldNode is held by a remediator: GKE's XidCriticalError condition is
// True on it, so its devices count as quarantined, not free or idle.
const heldNode = "gpu-b0"

// wantGlobalAlerts must fire on the reference (and so through Thanos): the
// comparison would hold trivially if no global alert fired.
var wantGlobalAlerts = []string{
	"GPUDriverVersionSkew",     // pool-1: gpu-a0 on 550, gpu-b0 on 535
	"GPUExporterMissingOnNode", // gpu-no-exporter
	// Neither Pending pod fits a node's free nvidia.com/gpu IDs (the
	// scenario's free GPUs are time-sliced or lost), while VRAM is stranded.
	"GPUPodPendingWhileVRAMStranded",
}

const (
	forDuration  = "5s"
	startTimeout = 90 * time.Second
	// Global figures trail the shards by a few evaluations of each layer.
	settleTimeout = 4 * time.Minute
)

func TestGlobalRulesOnThanos(t *testing.T) {
	thanosBin := os.Getenv("THANOS")
	if thanosBin == "" {
		t.Skip("THANOS is not set: `make test-thanos` builds Thanos (scripts/thanos.sh) and runs this test")
	}
	promBin := os.Getenv("PROMETHEUS")
	if promBin == "" {
		var err error
		if promBin, err = exec.LookPath("prometheus"); err != nil {
			t.Fatal("no prometheus server on PATH: install it (`make tools`) or set PROMETHEUS")
		}
	}
	root := repoRoot(t)
	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var logs []string
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range logs {
				tailFile(t, f, 30)
			}
		}
	})
	start := func(name, bin string, args ...string) string {
		log := filepath.Join(tmp, name+".log")
		logs = append(logs, log)
		startProcess(t, ctx, log, bin, args...)
		return log
	}

	// 1. The exporters.
	gpe := proctest.ExporterBinary(t, ctx, root, filepath.Join(tmp, "gpe"))
	base, err := os.ReadFile(filepath.Join(root, "alerts", "e2e", "scenario.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		scenario := filepath.Join(tmp, n.name+".yaml")
		if err := os.WriteFile(scenario, steadyScenario(t, base, n), 0o644); err != nil {
			t.Fatal(err)
		}
		n.addr = freeAddr(t)
		args := []string{
			"--simulate.scenario=" + scenario, "--collect-interval=1s",
			"--web.listen-address=" + n.addr, "--node-name=" + n.name,
			"--idle.window=10s", "--idle.price=NVIDIA H100 80GB HBM3=11.06",
		}
		if n.lean {
			args = append(args, "--collector.profile=lean")
		}
		log := start("exporter-"+n.name, gpe, args...)
		waitHTTP(t, "http://"+n.addr+"/metrics", startTimeout, log)
	}

	// 2. kube-state-metrics.
	ksm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, fakeKubeStateMetrics())
	}))
	t.Cleanup(ksm.Close)
	ksmAddr := strings.TrimPrefix(ksm.URL, "http://")

	// 3. Rule files: every `for:` shortened, every group each second.
	shardRules := writeRules(t, tmp, "shard.rules.yml", filepath.Join(root, "alerts", "gpu-pool-exporter.shard.rules.yml"))
	globalRules := writeRules(t, tmp, "global.rules.yml", filepath.Join(root, "alerts", "gpu-pool-exporter.global.rules.yml"))
	flatRules := writeRules(t, tmp, "rules.yml", filepath.Join(root, "alerts", "gpu-pool-exporter.rules.yml"))

	// 4. The shards, their sidecars and the reference.
	var storeAddrs []string
	for _, shard := range []string{"a", "b"} {
		var targets []*node
		for _, n := range nodes {
			if n.shard == shard {
				targets = append(targets, n)
			}
		}
		// Every shard reads kube-state-metrics' node objects (its node-level
		// rules place its nodes in their pools and zones); shard "a" scrapes
		// all of kube-state-metrics, as the Prometheus that holds the
		// cluster's pods would, shard "b" only the node objects.
		ksm := ksmScrape{addr: ksmAddr, nodesOnly: shard != "a"}
		cfg := prometheusConfig(shardRules, fmt.Sprintf("cluster: sim\n    shard: %q\n    replica: \"0\"", shard), targets, ksm)
		promAddr, data := startPrometheus(t, tmp, "shard-"+shard, promBin, cfg, start)
		grpc := freeAddr(t)
		web := freeAddr(t)
		log := start("sidecar-"+shard, thanosBin, "sidecar",
			"--tsdb.path="+data,
			"--prometheus.url=http://"+promAddr,
			"--grpc-address="+grpc,
			"--http-address="+web,
		)
		waitHTTP(t, "http://"+web+"/-/ready", startTimeout, log)
		storeAddrs = append(storeAddrs, grpc)
	}
	refAddr, _ := startPrometheus(t, tmp, "reference", promBin, prometheusConfig(flatRules, "", nodes, ksmScrape{addr: ksmAddr}), start)
	ref := "http://" + refAddr

	// 5. Query over the sidecars and the ruler; the ruler queries Query.
	queryHTTP, queryGRPC := freeAddr(t), freeAddr(t)
	ruleHTTP, ruleGRPC := freeAddr(t), freeAddr(t)
	queryArgs := []string{"query",
		"--http-address=" + queryHTTP,
		"--grpc-address=" + queryGRPC,
		"--query.replica-label=replica",
		"--endpoint=" + ruleGRPC,
	}
	for _, s := range storeAddrs {
		queryArgs = append(queryArgs, "--endpoint="+s)
	}
	queryLog := start("query", thanosBin, queryArgs...)
	ruleLog := start("ruler", thanosBin, "rule",
		"--data-dir="+filepath.Join(tmp, "ruler"),
		"--rule-file="+globalRules,
		"--eval-interval=1s",
		"--query=http://"+queryHTTP,
		"--http-address="+ruleHTTP,
		"--grpc-address="+ruleGRPC,
		`--label=ruler="global"`,
		`--label=replica="0"`,
	)
	waitHTTP(t, "http://"+queryHTTP+"/-/ready", startTimeout, queryLog)
	waitHTTP(t, "http://"+ruleHTTP+"/-/ready", startTimeout, ruleLog)
	query := "http://" + queryHTTP

	// 6. The reference fires the global alerts the test relies on.
	globalFile, err := os.ReadFile(filepath.Join(root, "alerts", "gpu-pool-exporter.global.rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	global, err := alerts.ParseRules(globalFile)
	if err != nil {
		t.Fatal(err)
	}
	var globalAlerts []string
	for _, a := range global.Alerts() {
		globalAlerts = append(globalAlerts, a.Alert)
	}
	alertsExpr := fmt.Sprintf(`ALERTS{alertname=~%q}`, strings.Join(globalAlerts, "|"))
	firingExpr := fmt.Sprintf(`ALERTS{alertname=~%q,alertstate="firing"}`, strings.Join(globalAlerts, "|"))
	var firing []string
	deadline := time.Now().Add(settleTimeout)
	for {
		firing = alertNames(t, ref, firingExpr)
		if containsAll(firing, wantGlobalAlerts) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	if !containsAll(firing, wantGlobalAlerts) {
		t.Fatalf("the reference fires %v of the global alerts; the scenario should make %v fire", firing, wantGlobalAlerts)
	}

	// 7. Every global recording and alert through Query equals the
	// reference's, and so does every pool and cluster dashboard query.
	checks := []check{{name: "global alerts (ALERTS)", expr: alertsExpr}}
	for _, r := range global.RecordNames() {
		checks = append(checks, check{name: "recording " + r, expr: r, mustHaveData: mayBeEmpty[r] == ""})
	}
	qs, err := dashboards.AllQueries()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{"nodepool": ".*", "node": ".*", "namespace": ".*", "gpu": ".*"}
	dashboardChecks := 0
	for _, q := range qs {
		expr, unknown, ok := q.PromQL(values)
		if !ok || len(unknown) > 0 || q.Dashboard != "gpu-pool-overview.json" && !poolOrClusterQuery.MatchString(expr) {
			continue
		}
		checks = append(checks, check{name: q.String(), expr: expr})
		dashboardChecks++
	}
	if dashboardChecks < 10 {
		t.Fatalf("only %d dashboard queries of the pool overview or reading pool, namespace or cluster figures: the selection lost them", dashboardChecks)
	}
	var diffs []string
	deadline = time.Now().Add(settleTimeout)
	for {
		diffs = diffs[:0]
		for _, c := range checks {
			if d := c.compare(ref, query); d != "" {
				diffs = append(diffs, d)
			}
		}
		if len(diffs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	for _, d := range diffs {
		t.Error(d)
	}
	t.Logf("%d global recordings, the global alerts (%v firing) and %d dashboard queries compared", len(global.RecordNames()), firing, dashboardChecks)
}

// mayBeEmpty are global recordings the scenario gives no series, and why.
var mayBeEmpty = map[string]string{
	"pod:gpu_pending_requests_fitting:sum": "neither Pending pod fits a node's free nvidia.com/gpu IDs",
}

// poolOrClusterQuery picks, besides every query of the pool overview, the
// dashboard queries that read pool, namespace or cluster figures (or join
// nodes to their pool).
var poolOrClusterQuery = regexp.MustCompile(`\b((nodepool|namespace|cluster|accelerator|pod):[a-z_]+:[a-z0-9_]+|node:gpu_(nodepool|accelerator):info)\b`)

// check is one query run on the reference and through Thanos Query.
type check struct {
	name, expr   string
	mustHaveData bool
}

// compare returns "" when both give the same series (external labels aside)
// with the same values, else what differs.
func (c check) compare(ref, query string) string {
	want, err := instant(ref, c.expr, false)
	if err != nil {
		return fmt.Sprintf("%s: reference: %v", c.name, err)
	}
	got, err := instant(query, c.expr, true)
	if err != nil {
		return fmt.Sprintf("%s: Thanos Query: %v", c.name, err)
	}
	if c.mustHaveData && len(want) == 0 {
		return fmt.Sprintf("%s: no series on the reference", c.name)
	}
	var d []string
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			d = append(d, fmt.Sprintf("  missing through Query: %s = %g", k, w))
		case !near(w, g, c.expr):
			d = append(d, fmt.Sprintf("  %s: reference %g, Query %g", k, w, g))
		}
	}
	for k, g := range got {
		if _, ok := want[k]; !ok {
			d = append(d, fmt.Sprintf("  only through Query: %s = %g", k, g))
		}
	}
	if len(d) == 0 {
		return ""
	}
	sort.Strings(d)
	return fmt.Sprintf("%s differs (%s):\n%s", c.name, strings.Join(strings.Fields(c.expr), " "), strings.Join(d, "\n"))
}

// rateLike are functions whose value depends on where the samples fall in
// the window: two scrapers of the same steady counter differ by a sample's
// share of it.
var rateLike = regexp.MustCompile(`\b(rate|irate|increase|delta|idelta|deriv|changes|resets)\(`)

// near: equal, or within 5% for rate-like queries.
func near(a, b float64, expr string) bool {
	if a == b || math.IsNaN(a) && math.IsNaN(b) {
		return true
	}
	tol := 1e-9
	if rateLike.MatchString(expr) {
		tol = 0.05
	}
	return math.Abs(a-b) <= tol*math.Max(1, math.Max(math.Abs(a), math.Abs(b)))
}

// instant runs an instant query and returns each series (external labels
// left out) with its value; a scalar is one series named "scalar".
func instant(base, expr string, dedup bool) (map[string]float64, error) {
	u := base + "/api/v1/query?query=" + url.QueryEscape(expr)
	if dedup {
		u += "&dedup=true&partial_response=false"
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := getJSON(u, &r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query failed: %s", r.Error)
	}
	out := map[string]float64{}
	switch r.Data.ResultType {
	case "scalar":
		var v []any
		if err := json.Unmarshal(r.Data.Result, &v); err != nil {
			return nil, err
		}
		f, _ := strconv.ParseFloat(fmt.Sprint(v[1]), 64)
		out["scalar"] = f
	case "vector":
		var v []struct {
			Metric map[string]string `json:"metric"`
			Value  []any             `json:"value"`
		}
		if err := json.Unmarshal(r.Data.Result, &v); err != nil {
			return nil, err
		}
		for _, s := range v {
			var ls []string
			for k, x := range s.Metric {
				if !externalLabels[k] {
					ls = append(ls, fmt.Sprintf("%s=%q", k, x))
				}
			}
			sort.Strings(ls)
			key := "{" + strings.Join(ls, ",") + "}"
			f, _ := strconv.ParseFloat(fmt.Sprint(s.Value[1]), 64)
			if _, dup := out[key]; dup {
				return nil, fmt.Errorf("two series are %s once external labels are left out", key)
			}
			out[key] = f
		}
	default:
		return nil, fmt.Errorf("result type %s", r.Data.ResultType)
	}
	return out, nil
}

func alertNames(t *testing.T, base, expr string) []string {
	t.Helper()
	res, err := instant(base, expr, false)
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	seen := map[string]bool{}
	for k := range res {
		if m := regexp.MustCompile(`alertname="([^"]+)"`).FindStringSubmatch(k); m != nil {
			seen[m[1]] = true
		}
	}
	var out []string
	for a := range seen {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// steadyScenario is scenario.yaml for node n: steady, named n, with n's
// driver version, without the device plugin's fault where n keeps it up.
func steadyScenario(t *testing.T, base []byte, n *node) []byte {
	t.Helper()
	var s map[string]any
	if err := yaml.Unmarshal(base, &s); err != nil {
		t.Fatalf("alerts/e2e/scenario.yaml: %v", err)
	}
	s["steady"] = true
	spec, ok := s["node"].(map[string]any)
	if !ok {
		t.Fatal("alerts/e2e/scenario.yaml has no node section")
	}
	spec["name"] = n.name
	if n.driver != "" {
		spec["driverVersion"] = n.driver
	}
	if n.pluginUp {
		faults, _ := s["faults"].([]any)
		var kept []any
		for _, f := range faults {
			if m, ok := f.(map[string]any); ok && m["devicePlugin"] != nil {
				continue
			}
			kept = append(kept, f)
		}
		if len(kept) == len(faults) {
			t.Fatal("alerts/e2e/scenario.yaml has no devicePlugin fault any more: update this test")
		}
		s["faults"] = kept
	}
	out, err := yaml.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fakeKubeStateMetrics: every node's pool and accelerator, its GPU capacity,
// a GPU node without an exporter, a cordoned node (its free GPUs are no
// room for Pending pods), a node a remediator holds (its conditions: GKE's
// XidCriticalError True), and two Pending GPU pods: one that fits a node's
// free GPUs, one that fits nowhere.
func fakeKubeStateMetrics() string {
	var b strings.Builder
	b.WriteString("# TYPE kube_node_labels gauge\n")
	all := append([][2]string{}, [2]string{missingNode, "pool-1"})
	for _, n := range nodes {
		all = append(all, [2]string{n.name, n.pool})
	}
	for _, n := range all {
		fmt.Fprintf(&b, "kube_node_labels{node=%q,label_cloud_google_com_gke_nodepool=%q,label_cloud_google_com_gke_accelerator=\"nvidia-h100-80gb\"} 1\n", n[0], n[1])
	}
	b.WriteString("# TYPE kube_node_status_capacity gauge\n")
	for _, n := range all {
		fmt.Fprintf(&b, "kube_node_status_capacity{node=%q,resource=\"nvidia_com_gpu\",unit=\"integer\"} 8\n", n[0])
	}
	b.WriteString("# TYPE kube_node_spec_unschedulable gauge\n")
	for _, n := range all {
		cordoned := 0
		if n[0] == cordonedNode {
			cordoned = 1
		}
		fmt.Fprintf(&b, "kube_node_spec_unschedulable{node=%q} %d\n", n[0], cordoned)
	}
	b.WriteString("# TYPE kube_node_status_condition gauge\n")
	for _, n := range all {
		for _, c := range []string{"Ready", "XidCriticalError"} {
			for _, status := range []string{"true", "false", "unknown"} {
				v := 0
				if status == "true" && (c == "Ready" || n[0] == heldNode) || status == "false" && c == "XidCriticalError" && n[0] != heldNode {
					v = 1
				}
				fmt.Fprintf(&b, "kube_node_status_condition{node=%q,condition=%q,status=%q} %d\n", n[0], c, status, v)
			}
		}
	}
	b.WriteString("# TYPE kube_pod_status_phase gauge\n")
	for _, p := range []string{"wants-one", "wants-eight"} {
		for _, phase := range []string{"Pending", "Running", "Succeeded", "Failed", "Unknown"} {
			v := 0
			if phase == "Pending" {
				v = 1
			}
			fmt.Fprintf(&b, "kube_pod_status_phase{namespace=\"batch\",pod=%q,uid=\"uid-%s\",phase=%q} %d\n", p, p, phase, v)
		}
	}
	b.WriteString("# TYPE kube_pod_container_resource_requests gauge\n")
	for p, n := range map[string]int{"wants-one": 1, "wants-eight": 8} {
		fmt.Fprintf(&b, "kube_pod_container_resource_requests{namespace=\"batch\",pod=%q,uid=\"uid-%s\",container=\"main\",node=\"\",resource=\"nvidia_com_gpu\",unit=\"integer\"} %d\n", p, p, n)
		fmt.Fprintf(&b, "kube_pod_container_resource_requests{namespace=\"batch\",pod=%q,uid=\"uid-%s\",container=\"main\",node=\"\",resource=\"cpu\",unit=\"core\"} 1\n", p, p)
	}
	return b.String()
}

// writeRules copies a rules file with every `for:` shortened and every
// group's interval set to one second.
func writeRules(t *testing.T, dir, name, src string) string {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	rules := proctest.ShortenFor(string(data), forDuration)
	interval := regexp.MustCompile(`(?m)^(    interval:\s*)\S+\s*$`)
	if !interval.MatchString(rules) {
		t.Fatalf("%s: no rule group has an `interval:` any more: update this test's rewriting", src)
	}
	rules = interval.ReplaceAllString(rules, "${1}1s")
	out := filepath.Join(dir, name)
	if err := os.WriteFile(out, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// ksmScrape is how a Prometheus scrapes kube-state-metrics: all of it, or
// only the node objects' series that every shard needs (docs/sharded.md).
type ksmScrape struct {
	addr      string
	nodesOnly bool
}

// prometheusConfig scrapes targets (node label from file) and
// kube-state-metrics, with the rules file and external labels given.
func prometheusConfig(rules, external string, targets []*node, ksm ksmScrape) string {
	var b strings.Builder
	b.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n")
	if external != "" {
		fmt.Fprintf(&b, "  external_labels:\n    %s\n", external)
	}
	fmt.Fprintf(&b, "rule_files:\n  - %s\nscrape_configs:\n  - job_name: gpu-pool-exporter\n    honor_labels: true\n    static_configs:\n", rules)
	for _, n := range targets {
		fmt.Fprintf(&b, "      - targets: [%q]\n        labels: {node: %q, namespace: gpu-pool-exporter, pod: exporter-%s, container: exporter}\n", n.addr, n.name, n.name)
	}
	if ksm.nodesOnly {
		// As docs/sharded.md has it.
		fmt.Fprintf(&b, "  - job_name: kube-state-metrics-nodes\n    honor_labels: true\n    static_configs:\n      - targets: [%q]\n"+
			"    metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: kube_node_(labels|spec_unschedulable|spec_taint|status_condition|created|deletion_timestamp)\n        action: keep\n", ksm.addr)
	} else {
		fmt.Fprintf(&b, "  - job_name: kube-state-metrics\n    honor_labels: true\n    static_configs:\n      - targets: [%q]\n", ksm.addr)
	}
	return b.String()
}

// startPrometheus writes cfg and starts a server; it returns its address and
// data directory once it is ready.
func startPrometheus(t *testing.T, tmp, name, bin, cfg string, start func(string, string, ...string) string) (addr, data string) {
	t.Helper()
	file := filepath.Join(tmp, name+".yml")
	if err := os.WriteFile(file, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr = freeAddr(t)
	data = filepath.Join(tmp, name+"-data")
	log := start("prometheus-"+name, bin,
		"--config.file="+file,
		"--storage.tsdb.path="+data,
		"--web.listen-address="+addr,
		// As Thanos' sidecar asks: no local compaction.
		"--storage.tsdb.min-block-duration=2h",
		"--storage.tsdb.max-block-duration=2h",
	)
	waitHTTP(t, "http://"+addr+"/-/ready", startTimeout, log)
	return addr, data
}

func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// The servers' plumbing, shared with alerts/thanos.
var (
	freeAddr     = proctest.FreeAddr
	startProcess = proctest.Start
	waitHTTP     = proctest.WaitHTTP
	tailFile     = proctest.TailFile
	getJSON      = proctest.GetJSON
)
