package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The collector's golden page of the simulated node stands in for a fresh
// rendering; it carries no allocations, so add one holder.
func testPage(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../collector/testdata/simulated-node.prom")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, []byte(`gpu_allocation_info{container="main",gpu="0",gpu_instance="",mig_profile="",namespace="ml",pod="train-0",resource="nvidia.com/gpu",uuid="GPU-6ae6e70d-d6cb-4377-8620-101bd1a199a2"} 1
`)...)
}

func parse(t *testing.T, body string) map[string]*dto {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("not exposition text: %v", err)
	}
	out := map[string]*dto{}
	for name, f := range fams {
		d := &dto{}
		for _, m := range f.GetMetric() {
			ls := model.LabelSet{}
			for _, l := range m.GetLabel() {
				ls[model.LabelName(l.GetName())] = model.LabelValue(l.GetValue())
			}
			d.series = append(d.series, ls)
		}
		out[name] = d
	}
	return out
}

type dto struct{ series []model.LabelSet }

func get(t *testing.T, f *fleet, path string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	if rec.Code != 200 {
		t.Fatalf("GET %s: %d", path, rec.Code)
	}
	return rec.Body.String()
}

func TestFleetPagesAreDistinctNodes(t *testing.T) {
	f, err := newFleet(testPage(t), 20, 10, 10, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a, b := get(t, f, "/node/0/metrics"), get(t, f, "/node/7/metrics")
	pa, pb := parse(t, a), parse(t, b)
	// Node 0 carries the four XID families besides the page's (the
	// counter, its first and last event times, the last per GPU).
	if len(pa) != len(pb)+4 || len(pa["gpu_up"].series) != len(pb["gpu_up"].series) {
		t.Fatalf("nodes serve different families: %d and %d", len(pa), len(pb))
	}
	want := 0
	for _, l := range strings.Split(string(testPage(t)), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			want++
		}
	}
	if f.seriesPerNode != want {
		t.Errorf("%d series per node, want the page's %d", f.seriesPerNode, want)
	}
	uuidsA := map[model.LabelValue]bool{}
	for _, s := range pa["gpu_info"].series {
		uuidsA[s["uuid"]] = true
	}
	for _, s := range pb["gpu_info"].series {
		if uuidsA[s["uuid"]] {
			t.Errorf("uuid %s on two nodes", s["uuid"])
		}
	}
	if pa["gpu_allocation_info"].series[0]["pod"] == pb["gpu_allocation_info"].series[0]["pod"] {
		t.Error("the same pod name on two nodes")
	}
	// Node 0 has the old XID; node 7 not.
	if pa["gpu_xid_errors_total"] == nil || pb["gpu_xid_errors_total"] != nil {
		t.Error("want an XID counter on every tenth node only")
	}
	if got := pa["gpu_xid_errors_total"].series[0]["uuid"]; !uuidsA[got] {
		t.Errorf("the XID names uuid %s, not one of the node's GPUs", got)
	}
	// Sample timestamps are the time of the scrape.
	for _, l := range strings.Split(a, "\n") {
		if v, ok := strings.CutPrefix(l, "gpu_exporter_last_sample_timestamp_seconds "); ok {
			ts, err := strconv.ParseFloat(v, 64)
			if err != nil || math.Abs(ts-float64(time.Now().Unix())) > 60 {
				t.Errorf("gpu_exporter_last_sample_timestamp_seconds %s, want now", v)
			}
		}
	}
	rec := httptest.NewRecorder()
	f.ServeHTTP(rec, httptest.NewRequest("GET", "/node/20/metrics", nil))
	if rec.Code != 404 {
		t.Errorf("node 20 of 20: %d, want 404", rec.Code)
	}
}

func TestFleetKubeStateMetrics(t *testing.T) {
	f, err := newFleet(testPage(t), 20, 10, 12, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p := parse(t, get(t, f, "/ksm/metrics"))
	pools := map[model.LabelValue]int{}
	for _, s := range p["kube_node_labels"].series {
		pools[s["label_cloud_google_com_gke_nodepool"]]++
	}
	if len(p["kube_node_labels"].series) != 20 || len(pools) != 10 {
		t.Errorf("%d nodes in %d pools, want 20 in 10", len(p["kube_node_labels"].series), len(pools))
	}
	pending, running := 0, 0
	// Phases are a state set: count the pods per phase from the values.
	body := get(t, f, "/ksm/metrics")
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "kube_pod_status_phase{") && strings.HasSuffix(l, " 1") {
			switch {
			case strings.Contains(l, `phase="Pending"`):
				pending++
			case strings.Contains(l, `phase="Running"`):
				running++
			}
		}
	}
	if pending != 12 || running != 20 {
		t.Errorf("%d Pending and %d Running pods, want 12 and 20 (one holder per node)", pending, running)
	}
	gpuRequests := 0
	for _, s := range p["kube_pod_container_resource_requests"].series {
		if strings.HasPrefix(string(s["resource"]), "nvidia_com_") {
			gpuRequests++
		}
	}
	if gpuRequests != 32 {
		t.Errorf("%d GPU requests, want 32", gpuRequests)
	}
}

func TestKSMResource(t *testing.T) {
	for in, want := range map[string]string{
		"nvidia.com/gpu":         "nvidia_com_gpu",
		"nvidia.com/gpu.shared":  "nvidia_com_gpu_shared",
		"nvidia.com/mig-1g.10gb": "nvidia_com_mig_1g_10gb",
	} {
		t.Run(in, func(t *testing.T) {
			if got := ksmResource(in); got != want {
				t.Errorf("ksmResource(%q) = %q, want %q", in, got, want)
			}
		})
	}
}

// A group with `interval: 1m` costs a quarter of its evaluation time per
// 15 s cycle; the report's total is the sum of the scaled medians, and
// "every group at once" the plain sum.
func TestReportScalesGroupsByInterval(t *testing.T) {
	ev := func(file, name string, itv time.Duration, secs ...float64) []groupReading {
		var out []groupReading
		for i, s := range secs {
			out = append(out, groupReading{File: file, Name: name, Eval: s, Interval: itv,
				LastEvaluation: time.Unix(int64(i), 0), Rules: map[string]float64{name + "-rule": s}})
		}
		return out
	}
	evals := map[groupKey][]groupReading{
		{"r.yml", "fast"}: ev("r.yml", "fast", 15*time.Second, 0.1, 0.3, 0.2),
		{"r.yml", "slow"}: ev("r.yml", "slow", time.Minute, 0.9, 0.4, 1.2),
		// An interval Prometheus did not report counts as the global one.
		{"r.yml", "default"}: ev("r.yml", "default", 0, 0.05, 0.05, 0.05),
	}
	var b strings.Builder
	cfg := config{nodes: 100, pools: 10, pending: 10, interval: 15 * time.Second, cycles: 3, top: 3}
	report(&b, cfg, "test", 1234, &fleet{seriesPerNode: 470}, evals, cpuFigures{})
	out := b.String()
	// fast 0.2 + slow 0.9/4 + default 0.05 = 0.475 s per cycle; at once 1.15 s.
	for _, want := range []string{
		"| slow    | 1m0s     | 900.0 ms | 1200.0 ms | 225.0 ms",
		"| 100 | 1234 | 475.0 ms | 4750 µs | 1150.0 ms | - | - | - |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	// Measured: 0.1 of 0.3 cores is 1.5 s a 15 s cycle; 30 MB/s with the
	// rules and 10 MB/s without are 300 MB a cycle.
	b.Reset()
	sum := report(&b, cfg, "test", 1234, &fleet{seriesPerNode: 470}, evals, cpuFigures{withRules: 0.3, without: 0.2, allocWithRules: 30e6, allocWithout: 10e6, measured: true})
	if want := "| 1500.0 ms (0.10 of 0.30 cores) | 15000 µs | 300 MB |"; !strings.Contains(b.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, b.String())
	}
	if !sum.cpuMeasured || sum.cpuPerCycle < 1.499 || sum.cpuPerCycle > 1.501 {
		t.Errorf("summary %+v, want 1.5 s of rule CPU per cycle", sum)
	}
	// Rounds: each pair of windows is listed, as a share of the interval.
	b.Reset()
	report(&b, cfg, "test", 1234, &fleet{seriesPerNode: 470}, evals, cpuFigures{withRules: 0.3, without: 0.2, allocWithRules: 30e6, allocWithout: 10e6, measured: true,
		rounds:  []cpuRound{{0.12, 22e6}, {0.08, 18e6}},
		windows: []windowReading{{cpu: 60, alloc: 6e9, secs: 200, gcs: 5, aligned: true, withRules: true}, {cpu: 40, alloc: 2e9, secs: 200, gcs: 3, aligned: false}}})
	for _, want := range []string{"| 1 | with | 200 s | 5 | 0.300 cores | 450 MB | yes |", "| 2 | without | 200 s | 3 | 0.200 cores | 150 MB | no (none within the window's length) |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks window %q:\n%s", want, b.String())
		}
	}
	for _, want := range []string{"| 1 | 1800.0 ms (12.0%) | 330 MB |", "| 2 | 1200.0 ms (8.0%) | 270 MB |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks round %q:\n%s", want, b.String())
		}
	}
	if i, j := strings.Index(out, "| slow-rule"), strings.Index(out, "| fast-rule"); i < 0 || j < 0 || i > j {
		t.Errorf("costliest rules not ordered by cost per cycle (slow 225 ms before fast 200 ms):\n%s", out)
	}
}

// make bench-rules' default server (scripts/prometheus3.sh) is the same
// Prometheus 3.x as the promtool3 the rule tests run (install-tools.sh).
func TestPrometheus3VersionMatchesPromtool3(t *testing.T) {
	re := func(file, pattern string) string {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^` + pattern + `=(\S+)$`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("%s: no %s= line", file, pattern)
		}
		return string(m[1])
	}
	if a, b := re("../prometheus3.sh", "VERSION"), re("../install-tools.sh", "PROMTOOL3_VERSION"); a != b {
		t.Errorf("scripts/prometheus3.sh builds prometheus %s, scripts/install-tools.sh promtool3 %s: keep them one version", a, b)
	}
}

func TestFederateGivesANodePage(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.URL.Query().Get("match[]"); !strings.Contains(got, `job!~"kube-state-metrics.*"`) || !strings.Contains(got, "node:gpu_devices:sum") {
			t.Errorf("match[] %q: want every job but kube-state-metrics (recordings have none) and the names kept", got)
		}
		fmt.Fprint(w, `# TYPE node:gpu_devices:sum untyped
node:gpu_devices:sum{node="gpu-node-00000",state="free"} 2 1767225600000
# TYPE gpu_allocation_info untyped
gpu_allocation_info{gpu="0",instance="x:9947",job="gpu-pool-exporter",namespace="ml",node="gpu-node-00000",pod="train-0",uuid="GPU-1234abcd-x"} 1 1767225600000
# TYPE shard_namespace:gpu_allocated_devices:sum untyped
shard_namespace:gpu_allocated_devices:sum{namespace="ml"} 1.5 1767225600000
`)
	}))
	defer srv.Close()
	page, partials, err := federate(context.Background(), srv.URL, map[string]bool{"node:gpu_devices:sum": true, "gpu_allocation_info": true, "shard_namespace:gpu_allocated_devices:sum": true})
	if err != nil {
		t.Fatal(err)
	}
	want := `node:gpu_devices:sum{state="free"} 2
gpu_allocation_info{gpu="0",namespace="ml",pod="train-0",uuid="GPU-1234abcd-x"} 1
`
	if string(page) != want {
		t.Errorf("page:\n%s\nwant:\n%s", page, want)
	}
	if want := "shard_namespace:gpu_allocated_devices:sum{namespace=\"ml\"} 1.5\n"; string(partials) != want {
		t.Errorf("partial sums (the series without a node label):\n%s\nwant:\n%s", partials, want)
	}
	if _, err := newFleet(page, 3, 1, 0, time.Now()); err != nil {
		t.Errorf("the fleet does not take the federated page: %v", err)
	}
}

func TestNamesReadLeavesOutWhatTheRulesRecord(t *testing.T) {
	f := filepath.Join(t.TempDir(), "r.yml")
	if err := os.WriteFile(f, []byte(`groups:
  - name: g
    rules:
      - record: nodepool:x:sum
        expr: sum by (nodepool) (node:x:sum * on (node) group_left (nodepool) node:pool:info) and on () up
      - record: cluster:x:sum
        expr: sum(nodepool:x:sum)
`), 0o644); err != nil {
		t.Fatal(err)
	}
	names, err := namesRead([]string{f})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node:x:sum", "node:pool:info"} {
		if !names[n] {
			t.Errorf("%s is read by the rules: want it kept", n)
		}
	}
	for _, n := range []string{"nodepool:x:sum", "cluster:x:sum", "up"} {
		if names[n] {
			t.Errorf("%s is recorded by the rules (or the scrape's own): want it left out", n)
		}
	}
}

func TestKSMShardsHoldEverySampleOnce(t *testing.T) {
	page := []byte("# HELP a x\n# TYPE a gauge\na{n=\"1\"} 1\na{n=\"2\"} 1\nb 2\n")
	for _, n := range []int{1, 2, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			shards := splitKSM(page, n)
			if len(shards) != n {
				t.Fatalf("%d pages, want %d", len(shards), n)
			}
			var all []string
			for _, s := range shards {
				if strings.Contains(string(s), "#") {
					t.Errorf("page %q carries metadata", s)
				}
				all = append(all, strings.Split(strings.TrimSpace(string(s)), "\n")...)
			}
			all = slices.DeleteFunc(all, func(s string) bool { return s == "" })
			slices.Sort(all)
			if got := strings.Join(all, "|"); got != `a{n="1"} 1|a{n="2"} 1|b 2` {
				t.Errorf("samples over the pages: %s", got)
			}
		})
	}
	if ksmShards(200) != 1 || ksmShards(10000) != 20 {
		t.Errorf("ksmShards: %d at 200 nodes, %d at 10,000; want 1 and 20", ksmShards(200), ksmShards(10000))
	}
}

func TestShardPartialsScaleSumsToTheShard(t *testing.T) {
	partials := []byte("shard_namespace:gpu_allocated_devices:sum{namespace=\"ml\"} 1.5\n" +
		"shard:gpu_nodes:count 1\n" +
		"shard:gpu_free_devices_largest_group:max{domain=\"0\"} 4\n" +
		"gpu_sum 3\n" +
		"shard_nodepool:gpu_devices:sum{nodepool=\"pool-00\",state=\"free\"} 2\n" +
		"shard_nodepool_zone:gpu_free_devices_largest_group:max{accelerator=\"h100\",domain=\"0\",nodepool=\"pool-00\",zone=\"us-central1-a\"} 4\n")
	// Shard 1 of three shards of 1,000 nodes over ten pools (nodes
	// 1000-1999): 100 nodes in each pool.
	got, err := shardPartialsPage(partials, shardPools(1, 1000, 3000, 10))
	if err != nil {
		t.Fatal(err)
	}
	want := "shard_namespace:gpu_allocated_devices:sum{namespace=\"ml\"} 1500\n" +
		"shard:gpu_nodes:count 1000\n" +
		"shard:gpu_free_devices_largest_group:max{domain=\"0\"} 4\n" +
		"gpu_sum 3\n"
	for p := range 10 {
		want += fmt.Sprintf("shard_nodepool:gpu_devices:sum{nodepool=%q,state=\"free\"} 200\n", benchPool(p))
	}
	for p := range 10 {
		want += fmt.Sprintf("shard_nodepool_zone:gpu_free_devices_largest_group:max{accelerator=\"h100\",domain=\"0\",nodepool=%q,zone=%q} 4\n", benchPool(p), benchZone(p))
	}
	if string(got) != want {
		t.Errorf("a shard of 1,000 nodes in ten pools:\n%s\nwant (sums and counts times the nodes they cover, per pool where the series names one; maxima and raw series as they are):\n%s", got, want)
	}
	// The last shard of 2,500 nodes holds 500: 50 per pool.
	if c := shardPools(2, 1000, 2500, 10); len(c) != 10 || c[0] != 50 || c[9] != 50 {
		t.Errorf("shardPools(2, 1000, 2500, 10) = %v, want 50 nodes in each of ten pools", c)
	}
	// A shard of fewer nodes than pools holds only some pools.
	if c := shardPools(0, 3, 3, 10); len(c) != 3 {
		t.Errorf("shardPools(0, 3, 3, 10) = %v, want three pools", c)
	}
	if _, err := shardPartialsPage([]byte("not a sample\n"), map[int]int{0: 2}); err == nil || !strings.Contains(err.Error(), "not a sample line") {
		t.Errorf("a malformed line: error %v, want one that names it", err)
	}
	if _, err := shardPartialsPage(nil, map[int]int{0: 2}); err != nil {
		t.Errorf("no partial sums: %v, want an empty page", err)
	}
}

func TestShardTargetsCoverEveryNode(t *testing.T) {
	for _, c := range []struct{ nodes, per, want int }{{10000, 1000, 10}, {10001, 1000, 11}, {200, 1000, 1}} {
		cfg := config{nodes: c.nodes, shardNodes: c.per, shardRules: "x.yml"}
		if got := shardTargets(cfg); got != c.want {
			t.Errorf("%d nodes, %d per shard: %d shards, want %d", c.nodes, c.per, got, c.want)
		}
		if n := strings.Count(shardJobs(cfg, "127.0.0.1:1"), "job_name:"); n != c.want {
			t.Errorf("%d nodes, %d per shard: %d scrape jobs, want %d", c.nodes, c.per, n, c.want)
		}
	}
	if got := shardTargets(config{nodes: 10000, shardNodes: 1000}); got != 0 {
		t.Errorf("without -shard-rules: %d shard targets, want none", got)
	}
}

func TestClusterNodesAddNodeObjectsOnly(t *testing.T) {
	f, err := newFleet(testPage(t), 20, 10, 10, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before := parse(t, get(t, f, "/ksm/metrics"))
	f.addNodeObjects(50, 10)
	after := parse(t, get(t, f, "/ksm/metrics"))
	if n := len(after["kube_node_labels"].series); n != 50 {
		t.Errorf("%d kube_node_labels series in a cluster of 50 nodes, want 50", n)
	}
	for _, m := range []string{"kube_pod_status_phase", "kube_pod_container_resource_requests"} {
		if len(after[m].series) != len(before[m].series) {
			t.Errorf("%s: %d series after adding node objects, %d before: the nodes past -n have no pods", m, len(after[m].series), len(before[m].series))
		}
	}
	if len(f.nodes) != 20 {
		t.Errorf("%d exporter targets, want the fleet's 20", len(f.nodes))
	}
}

// The budget: each figure against a percentage of the interval, the run
// failing when one is over it, and naming which.
func TestBudgetChecksWallAndRuleCPU(t *testing.T) {
	cfg := config{interval: 15 * time.Second, budget: 7}
	for _, tc := range []struct {
		name string
		sum  costSummary
		over []string // figures the error names; none: within
	}{
		{"both within", costSummary{evalPerCycle: 1.0, cpuPerCycle: 1.05, cpuMeasured: true}, nil},
		{"wall over", costSummary{evalPerCycle: 1.06, cpuPerCycle: 0.5, cpuMeasured: true}, []string{"rule evaluation (wall) 1060.0 ms (7.1%)"}},
		{"CPU over", costSummary{evalPerCycle: 0.5, cpuPerCycle: 1.2, cpuMeasured: true}, []string{"rule CPU 1200.0 ms (8.0%)"}},
		{"both over", costSummary{evalPerCycle: 2, cpuPerCycle: 3, cpuMeasured: true}, []string{"rule evaluation (wall)", "rule CPU"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			err := checkBudget(&b, cfg, tc.sum)
			if (err != nil) != (len(tc.over) > 0) {
				t.Fatalf("error %v, want over for %v\n%s", err, tc.over, b.String())
			}
			for _, o := range tc.over {
				if !strings.Contains(err.Error(), o) {
					t.Errorf("error %q does not name %q", err, o)
				}
			}
			if !strings.Contains(b.String(), "| rule CPU |") || !strings.Contains(b.String(), "Budget: 7% of 15s (1050.0 ms)") {
				t.Errorf("budget table:\n%s", b.String())
			}
		})
	}
	var b strings.Builder
	if err := checkBudget(&b, config{interval: 15 * time.Second}, costSummary{evalPerCycle: 100}); err != nil || b.Len() != 0 {
		t.Errorf("no -budget: %v, printed %q; want nothing checked", err, b.String())
	}
	bad := config{nodes: 1, interval: 15 * time.Second, cycles: 1, shardNodes: 1000, rules: ruleFiles{"x"}, page: "p", budget: 5}
	if err := bad.check(); err == nil || !strings.Contains(err.Error(), "cpu-baseline") {
		t.Errorf("-budget without the CPU baseline: %v, want an error naming -cpu-baseline", err)
	}
}

// The CPU windows alternate with, without, without, with, ... so that a
// steady drift of the server's cost weighs on both sides alike: over each
// four windows, the with-windows' mean position equals the without-windows'.
func TestCPUWindowsOrder(t *testing.T) {
	var got []string
	for i := range 8 {
		if windowWithRules(i) {
			got = append(got, "W")
		} else {
			got = append(got, "N")
		}
	}
	if s := strings.Join(got, ""); s != "WNNWWNNW" {
		t.Errorf("windows %s, want WNNWWNNW", s)
	}
	for _, n := range []int{2, 4} {
		var w, wo float64
		for i := range 2 * n {
			if windowWithRules(i) {
				w += float64(i)
			} else {
				wo += float64(i)
			}
		}
		if w != wo {
			t.Errorf("%d rounds: with-windows at mean position %g, without %g: a linear drift would not cancel", n, w/float64(n), wo/float64(n))
		}
	}
}

func TestRuntimeFigures(t *testing.T) {
	gc := "# TYPE go_gc_duration_seconds summary\ngo_gc_duration_seconds{quantile=\"0.5\"} 0.001\ngo_gc_duration_seconds_sum 0.5\ngo_gc_duration_seconds_count 42\n"
	page := "# HELP go_memstats_alloc_bytes_total Total bytes.\n# TYPE go_memstats_alloc_bytes_total counter\ngo_memstats_alloc_bytes_total 1.2345e+10\n# TYPE go_memstats_alloc_bytes gauge\ngo_memstats_alloc_bytes 7\n" + gc
	alloc, gcs, err := runtimeFigures(strings.NewReader(page))
	if err != nil || alloc != 1.2345e10 || gcs != 42 {
		t.Errorf("runtimeFigures = %v, %v, %v; want 1.2345e10 bytes and 42 collections", alloc, gcs, err)
	}
	if _, _, err := runtimeFigures(strings.NewReader("# TYPE go_memstats_alloc_bytes gauge\ngo_memstats_alloc_bytes 7\n" + gc)); err == nil || !strings.Contains(err.Error(), "no counter go_memstats_alloc_bytes_total") {
		t.Errorf("a page without the counter: err %v, want one that names it", err)
	}
	if _, _, err := runtimeFigures(strings.NewReader("# TYPE go_memstats_alloc_bytes_total counter\ngo_memstats_alloc_bytes_total 5\n")); err == nil || !strings.Contains(err.Error(), "no summary go_gc_duration_seconds") {
		t.Errorf("a page without the collections: err %v, want one that names them", err)
	}
	if _, _, err := runtimeFigures(strings.NewReader("go_memstats_alloc_bytes_total abc\n")); err == nil {
		t.Error("a value that is not a number: no error")
	}
}
