package alerts

import (
	"bytes"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// GlobalGroupPrefix starts the name of every global group: pool, namespace
// and cluster roll-ups, and alerts that compare nodes or read
// kube-state-metrics' pods. They need every shard's series and run once (in
// Thanos Ruler, Mimir's ruler, as GMP GlobalRules, or in the one
// Prometheus). Every other group is node level and safe in each shard.
const GlobalGroupPrefix = "gpu-pool-exporter.global."

// The rule files generated from RulesFileName by Split (go run ./alerts/gen),
// and from GMPRulesFileName's content for GKE Managed Prometheus.
const (
	ShardRulesFileName     = "gpu-pool-exporter.shard.rules.yml"
	GlobalRulesFileName    = "gpu-pool-exporter.global.rules.yml"
	GMPShardRulesFileName  = "gpu-pool-exporter.gmp.shard.rules.yml"
	GMPGlobalRulesFileName = "gpu-pool-exporter.gmp.global.rules.yml"
)

// IsGlobalGroup says whether a group of the rules file is global.
func IsGlobalGroup(name string) bool { return strings.HasPrefix(name, GlobalGroupPrefix) }

var groupStartRE = regexp.MustCompile(`^  - name: *(\S+)\s*$`)

// Split makes the shard-safe and the global rule files from the one rules
// file (or from its GMP variant), keeping each group's text (comments, annotations) as it is: a group
// is its "  - name:" line, the lines after it up to the next group, and the
// comment lines just above it.
func Split(src []byte) (shard, global []byte, err error) {
	lines := strings.SplitAfter(string(src), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.TrimRight(l, "\r\n") == "groups:" })
	if start < 0 {
		return nil, nil, fmt.Errorf("%s: no top-level groups: line", RulesFileName)
	}
	type block struct {
		name string
		text strings.Builder
	}
	var blocks []*block
	var pending strings.Builder // comments and blank lines between groups
	for _, l := range lines[start+1:] {
		if m := groupStartRE.FindStringSubmatch(strings.TrimRight(l, "\r\n")); m != nil {
			b := &block{name: m[1]}
			b.text.WriteString(pending.String())
			pending.Reset()
			b.text.WriteString(l)
			blocks = append(blocks, b)
			continue
		}
		trimmed := strings.TrimSpace(l)
		if len(blocks) == 0 || trimmed == "" || strings.HasPrefix(l, "  #") {
			// Between groups (a group's own lines are indented further).
			pending.WriteString(l)
			continue
		}
		if pending.Len() > 0 {
			blocks[len(blocks)-1].text.WriteString(pending.String())
			pending.Reset()
		}
		blocks[len(blocks)-1].text.WriteString(l)
	}
	var sb, gb bytes.Buffer
	header := func(w *bytes.Buffer, what string) {
		fmt.Fprintf(w, "# Generated from %s by `go run ./alerts/gen` (deploy/sync.sh runs it); do not edit.\n#\n", RulesFileName)
		w.WriteString(what)
		w.WriteString("\n\ngroups:\n")
	}
	header(&sb, `# The node-level (shard-safe) rules of gpu-pool-exporter: recording rules
# with at most one series per node and dimension, and the per-node alerts.
# Load this file in every Prometheus that scrapes gpu-pool-exporter (one per
# node pool, region or hash shard); `+GlobalRulesFileName+` runs once,
# where every shard's series are visible. See docs/sharded.md.`)
	header(&gb, `# The global rules of gpu-pool-exporter: pool, namespace and cluster
# roll-ups of the node-level series, and the alerts that compare nodes or
# read kube-state-metrics' pods. Load this file once, where the series of
# every shard are visible: Thanos Ruler, Mimir's or Cortex's ruler, GKE
# Managed Prometheus GlobalRules (or ClusterRules for one cluster). The shards
# load `+ShardRulesFileName+`. See docs/sharded.md.`)
	var ns, ng int
	for _, b := range blocks {
		if IsGlobalGroup(b.name) {
			gb.WriteString(b.text.String())
			ng++
		} else {
			sb.WriteString(b.text.String())
			ns++
		}
	}
	if ns == 0 || ng == 0 {
		return nil, nil, fmt.Errorf("%s: %d node-level and %d global groups; want both (global groups are named %s*)", RulesFileName, ns, ng, GlobalGroupPrefix)
	}
	return trimTrailingBlank(sb.Bytes()), trimTrailingBlank(gb.Bytes()), nil
}

func trimTrailingBlank(b []byte) []byte {
	return append(bytes.TrimRight(b, "\n"), '\n')
}

// SplitGMP is Split of the GMP variant (GMPRules) of the rules file: the
// ClusterRules and GlobalRules of a sharded setup on GKE Managed Prometheus.
func SplitGMP(src []byte) (shard, global []byte, err error) {
	shard, global, err = Split(GMPRules(src))
	if err != nil {
		return nil, nil, err
	}
	note := []byte("# For GKE Managed Prometheus: every namespace label of the source is " + GMPNamespaceLabel + " here.\n")
	withNote := func(b []byte) []byte {
		i := bytes.IndexByte(b, '\n') + 1
		return append(append(append([]byte{}, b[:i]...), note...), b[i:]...)
	}
	return withNote(shard), withNote(global), nil
}
