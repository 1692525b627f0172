package alerts

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// nodeLevelExporterMetrics are the exporter's series that are one per node
// and dimension already (no gpu, uuid or holder labels; docs/metrics.md's
// table): global rules may read them directly. Every other exporter series
// is per GPU, per MIG instance or per holder, and global rules read it only
// through a node-level recording rule.
var nodeLevelExporterMetrics = []string{
	"up",
	"gpu_devices",
	"gpu_healthy_devices",
	"gpu_kubelet_allocatable_devices",
	"gpu_kubelet_allocatable_healthy_devices",
	"gpu_kubelet_free_devices",
	"gpu_idle_allocated_devices",
	"gpu_memory_stranded_bytes",
	"gpu_unallocated_capacity_gpus",
	"gpu_fragmentation_gpus",
	"gpu_fragmentation_weighted_gpus",
	"gpu_fitting_jobs",
	"gpu_free_devices_largest_group",
	"gpu_mig_free_slices",
	"gpu_mig_largest_placeable_slices",
	"gpu_driver_info",
	"gpu_exporter_build_info",
	"gpu_exporter_collector_up",
	"gpu_exporter_last_sample_timestamp_seconds",
	"gpu_exporter_sample_age_seconds",
}

// nodeObjectMetrics are the kube-state-metrics series of node objects that
// every shard scrapes besides its exporters (docs/sharded.md), so that
// node-level rules can place each node in its pool, zone and accelerator.
// Pods' series stay global-only: a shard does not scrape them.
var nodeObjectMetrics = map[string]bool{
	"kube_node_labels":             true,
	"kube_node_spec_unschedulable": true,
	"kube_node_spec_taint":         true,
	"kube_node_status_condition":   true,
	"kube_node_created":            true,
	"kube_node_deletion_timestamp": true,
}

// placementRecords are node-level recordings with one series per node of the
// fleet that pool and zone figures would join: global rules read the shards'
// partial figures instead.
var placementRecords = map[string]bool{
	"node:gpu_nodepool:info":           true,
	"node:gpu_zone:info":               true,
	"node:gpu_accelerator:info":        true,
	"node:gpu_placement:info":          true,
	"node:gpu_schedulable:bool":        true,
	"node:gpu_node_unschedulable:info": true,
}

// TestSplitIsAPartition checks that the two generated files hold every group
// of the rules file exactly once, unchanged and in order, and nothing else.
func TestSplitIsAPartition(t *testing.T) {
	src, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	shardData, globalData, err := Split(RulesYAML)
	if err != nil {
		t.Fatal(err)
	}
	shard, err := ParseRules(shardData)
	if err != nil {
		t.Fatalf("%s: %v", ShardRulesFileName, err)
	}
	global, err := ParseRules(globalData)
	if err != nil {
		t.Fatalf("%s: %v", GlobalRulesFileName, err)
	}
	var wantShard, wantGlobal []Group
	for _, g := range src.Groups {
		if IsGlobalGroup(g.Name) {
			wantGlobal = append(wantGlobal, g)
		} else {
			wantShard = append(wantShard, g)
		}
	}
	if len(wantShard) == 0 || len(wantGlobal) == 0 {
		t.Fatalf("want node-level and global (%s*) groups, got %d and %d", GlobalGroupPrefix, len(wantShard), len(wantGlobal))
	}
	for _, c := range []struct {
		file      string
		got, want []Group
	}{{ShardRulesFileName, shard.Groups, wantShard}, {GlobalRulesFileName, global.Groups, wantGlobal}} {
		t.Run(c.file, func(t *testing.T) {
			if !slices.EqualFunc(c.got, c.want, groupsEqual) {
				t.Errorf("%s: groups %v, want %v, unchanged", c.file, (&RuleFile{Groups: c.got}).GroupNames(), (&RuleFile{Groups: c.want}).GroupNames())
			}
		})
	}
}

func groupsEqual(a, b Group) bool {
	return a.Name == b.Name && a.Interval == b.Interval && slices.EqualFunc(a.Rules, b.Rules, func(x, y Rule) bool {
		return x.Record == y.Record && x.Alert == y.Alert && x.Expr == y.Expr && x.For == y.For &&
			x.KeepFiringFor == y.KeepFiringFor && mapsEqual(x.Labels, y.Labels) && mapsEqual(x.Annotations, y.Annotations)
	})
}

// metricNames lists the metric names an expression selects.
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Fatalf("parse %q: %v", expr, err)
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// TestLayersReadTheRightSeries checks what makes the split safe and cheap:
//   - node-level rules read neither global recordings (a shard does not have
//     them) nor kube-state-metrics (a shard need not scrape it);
//   - global rules read node-level series only: recordings of the node-level
//     groups other than the per-holder allocation:* ones, global recordings,
//     kube-state-metrics, and the exporter series that are one per node
//     already; never raw per-GPU or per-holder series;
//   - global rules read the per-node-and-namespace node_namespace:* series
//     through the shards' partial sums (shard_namespace:*), a few series per
//     namespace and shard, not every node's.
func TestLayersReadTheRightSeries(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	shardRecords, globalRecords := map[string]bool{}, map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record == "" {
				continue
			}
			if IsGlobalGroup(g.Name) {
				globalRecords[r.Record] = true
			} else {
				shardRecords[r.Record] = true
			}
		}
	}
	nodeLevel := map[string]bool{}
	for _, m := range nodeLevelExporterMetrics {
		nodeLevel[m] = true
	}
	for _, g := range rf.Groups {
		global := IsGlobalGroup(g.Name)
		for _, r := range g.Rules {
			for _, m := range metricNames(t, r.Expr) {
				switch {
				case !global && globalRecords[m]:
					t.Errorf("node-level group %s: %s reads %s, recorded by a global group", g.Name, r.Name(), m)
				case !global && strings.HasPrefix(m, "kube_") && !nodeObjectMetrics[m]:
					t.Errorf("node-level group %s: %s reads kube-state-metrics' %s (not one of the node objects' series every shard scrapes, docs/sharded.md): move it to a %s* group", g.Name, r.Name(), m, GlobalGroupPrefix)
				case global && placementRecords[m]:
					t.Errorf("global group %s: %s reads %s, a series per node of the fleet: sum it per pool in a node-level group (shard_nodepool:...) and sum those", g.Name, r.Name(), m)
				case global && shardRecords[m] && strings.HasPrefix(m, "node_namespace:"):
					t.Errorf("global group %s: %s reads %s, a series per node and namespace: sum it per namespace in a node-level group (shard_namespace:...) and sum those", g.Name, r.Name(), m)
				case global && shardRecords[m] && strings.HasPrefix(m, "allocation:"):
					t.Errorf("global group %s: %s reads the per-holder %s: sum it per node in a node-level group", g.Name, r.Name(), m)
				case global && !shardRecords[m] && !globalRecords[m] && !strings.HasPrefix(m, "kube_") && !nodeLevel[m]:
					t.Errorf("global group %s: %s reads %s, a per-GPU or per-holder series: sum it per node in a node-level group", g.Name, r.Name(), m)
				}
			}
		}
	}
}

// annotationQueryRE finds the metric selectors of the queries in alert
// annotations (the backquoted strings passed to query).
var annotationQueryRE = regexp.MustCompile("`([^`]*)`")
var selectorRE = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}`)

// TestAnnotationQueriesAreScoped: an annotation's query runs once per alert
// and evaluation, so over raw exporter series it must name the node (a few
// series), and anything wider reads recorded pool or cluster figures.
func TestAnnotationQueriesAreScoped(t *testing.T) {
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{}
	for _, n := range rf.RecordNames() {
		recorded[n] = true
	}
	var bad []string
	for _, a := range rf.Alerts() {
		for key, text := range a.Annotations {
			for _, q := range annotationQueryRE.FindAllStringSubmatch(text, -1) {
				if !strings.Contains(q[1], "{") {
					continue // a command, not a query
				}
				for _, sel := range selectorRE.FindAllStringSubmatch(q[1], -1) {
					name, matchers := sel[1], sel[2]
					if recorded[name] || !strings.HasPrefix(name, "gpu_") {
						continue
					}
					if !regexp.MustCompile(`(^|[,\s])node\s*=\s*"`).MatchString(matchers) {
						bad = append(bad, a.Alert+" ("+key+"): "+sel[0])
					}
				}
			}
		}
	}
	sort.Strings(bad)
	for _, b := range bad {
		t.Errorf("annotation query over raw series without a node matcher (read a recorded pool or cluster figure instead): %s", b)
	}
}

// TestShardedDocsKeepWhatTheGlobalLayerReads: docs/sharded.md names, as one
// regular expression, the series a global ruler needs from the shards when
// they remote-write to it. Every series the global rules read (their
// expressions and their annotations' queries) that they do not record
// themselves, other than kube-state-metrics', must match it, or a user who
// copies it loses a figure.
func TestShardedDocsKeepWhatTheGlobalLayerReads(t *testing.T) {
	doc, err := os.ReadFile("../docs/sharded.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("the global layer needs only\\s+`([^`]+)`").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/sharded.md: no \"the global layer needs only `...`\" regular expression")
	}
	keep, err := regexp.Compile("^(?:" + string(m[1]) + ")$")
	if err != nil {
		t.Fatalf("docs/sharded.md: %q: %v", m[1], err)
	}
	rf, err := Rules()
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{}
	for _, g := range rf.Groups {
		if IsGlobalGroup(g.Name) {
			for _, r := range g.Rules {
				if r.Record != "" {
					recorded[r.Record] = true
				}
			}
		}
	}
	missing := map[string]bool{}
	check := func(name string) {
		if name != "" && !recorded[name] && !strings.HasPrefix(name, "kube_") && !keep.MatchString(name) {
			missing[name] = true
		}
	}
	for _, g := range rf.Groups {
		if !IsGlobalGroup(g.Name) {
			continue
		}
		for _, r := range g.Rules {
			for _, n := range metricNames(t, r.Expr) {
				check(n)
			}
			for _, text := range r.Annotations {
				for _, q := range annotationQueryRE.FindAllStringSubmatch(text, -1) {
					for _, sel := range selectorRE.FindAllStringSubmatch(q[1], -1) {
						check(sel[1])
					}
				}
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(missing)) {
		t.Errorf("the global rules read %s, which docs/sharded.md's remote-write regular expression %q drops", n, m[1])
	}
}
