package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
)

// shardOutputPage turns one node's exporter page into what a shard hands the
// global layer for that node: a real Prometheus (cfg.prometheus) scrapes the
// page with the -shard-rules file, every group's interval set to
// shardInterval, and once the shard's recordings have settled its
// /federate output is read. Kept are the series whose names the measured
// rule files (cfg.rules) read, plus gpu_allocation_info (the synthetic
// kube-state-metrics' pods follow its holders); the node, instance and job
// labels and the timestamps are cut, as the fleet's scrape adds its own.
// The series without a node label (partial sums over the shard's nodes,
// shard_namespace:...) come back apart: the fleet serves them once per
// shard of cfg.shardNodes nodes (shardPartialsPage).
func shardOutputPage(ctx context.Context, work string, cfg config, page []byte) (nodePage, partials []byte, err error) {
	reads, err := namesRead(cfg.rules)
	if err != nil {
		return nil, nil, err
	}
	reads["gpu_allocation_info"] = true
	one, err := newFleet(page, 1, 1, 0, time.Now())
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: one, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	dir := filepath.Join(work, "shard")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	data, err := os.ReadFile(cfg.shardRules)
	if err != nil {
		return nil, nil, err
	}
	rules := regexp.MustCompile(`(?m)^(    interval:\s*)\S+\s*$`).ReplaceAll(data, []byte("${1}"+shardInterval.String()))
	rulesFile := filepath.Join(dir, "shard.rules.yml")
	if err := os.WriteFile(rulesFile, rules, 0o644); err != nil {
		return nil, nil, err
	}
	scfg := cfg
	scfg.nodes, scfg.clusterNodes, scfg.interval, scfg.rules, scfg.shardRules = 1, 0, shardInterval, []string{rulesFile}, ""
	if err := writeConfig(dir, ln.Addr().String(), scfg); err != nil {
		return nil, nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	prom, err := startPrometheus(ctx, dir, addr, scfg)
	if err != nil {
		return nil, nil, err
	}
	defer prom.stop()
	api := &apiClient{base: "http://" + addr, hc: &http.Client{Timeout: 30 * time.Second}}
	if err := waitTargets(ctx, api, prom, 2); err != nil {
		return nil, nil, fmt.Errorf("shard Prometheus: %w", err)
	}
	// Every group evaluates a few times; then the page must come out the
	// same twice in a row (same series; values may move).
	if err := sleep(ctx, prom, 6*shardInterval); err != nil {
		return nil, nil, err
	}
	var out, part, prev, prevPart []byte
	for range 30 {
		if out, part, err = federate(ctx, api.base, reads); err != nil {
			return nil, nil, err
		}
		if prev != nil && seriesOf(out) == seriesOf(prev) && seriesOf(part) == seriesOf(prevPart) {
			fmt.Fprintf(os.Stderr, "bench-rules: node page from the shard's output: %d series (%s), and %d partial sums per shard\n",
				strings.Count(string(out), "\n"), filepath.Join(work, "node-page.prom"), strings.Count(string(part), "\n"))
			return out, part, os.WriteFile(filepath.Join(work, "node-page.prom"), out, 0o644)
		}
		prev, prevPart = out, part
		if err := sleep(ctx, prom, shardInterval); err != nil {
			return nil, nil, err
		}
	}
	return nil, nil, errors.New("the shard's recordings did not settle within 30 evaluations")
}

// shardInterval is how often the shard Prometheus scrapes and evaluates
// while the node page is derived.
const shardInterval = 2 * time.Second

// namesRead are the identifiers in the rule files' expressions (metric
// names among them; the rest never match a series).
func namesRead(files []string) (map[string]bool, error) {
	names := map[string]bool{}
	recorded := map[string]bool{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		rf, err := alerts.ParseRules(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				for _, id := range identRE.FindAllString(r.Expr, -1) {
					names[id] = true
				}
				if r.Record != "" {
					recorded[r.Record] = true
				}
			}
		}
	}
	// What the measured rules record themselves, and the scrape's own up,
	// are not part of a node's page.
	for r := range recorded {
		delete(names, r)
	}
	delete(names, "up")
	return names, nil
}

var (
	identRE     = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	fedLineRE   = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)(?: \S+)?$`)
	fedLabelRE  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	scrapeAdded = map[string]bool{"node": true, "instance": true, "job": true}
)

// federate reads the shard's series of the node whose names are in keep,
// as a node page: no timestamps, no node/instance/job labels. Not
// kube-state-metrics' series (the fleet serves its own); the node-level
// recordings have no job label, so the match excludes rather than selects.
// Series without a node label are the shard's sums over its nodes: they
// come back in partials, not in the node page.
func federate(ctx context.Context, base string, keep map[string]bool) (page, partials []byte, err error) {
	var names []string
	for n := range keep {
		names = append(names, regexp.QuoteMeta(n))
	}
	sort.Strings(names)
	u := base + "/federate?match[]=" + url.QueryEscape(fmt.Sprintf(`{job!~"kube-state-metrics.*",__name__=~%q}`, strings.Join(names, "|")))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("/federate: %s %v", resp.Status, err)
	}
	var b, pb strings.Builder
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := fedLineRE.FindStringSubmatch(line)
		if m == nil {
			return nil, nil, fmt.Errorf("/federate: not a sample line: %q", line)
		}
		var ls []string
		w := &pb
		for _, l := range fedLabelRE.FindAllStringSubmatch(m[2], -1) {
			if l[1] == "node" {
				w = &b
			}
			if !scrapeAdded[l[1]] {
				ls = append(ls, l[0])
			}
		}
		w.WriteString(m[1])
		if len(ls) > 0 {
			w.WriteString("{" + strings.Join(ls, ",") + "}")
		}
		w.WriteString(" " + m[3] + "\n")
	}
	return []byte(b.String()), []byte(pb.String()), nil
}

// shardPartialsPage is the page of partial figures a shard records when
// every node's page is the simulated node's and the shard's nodes spread
// over pools (pools: nodes per pool index). The simulated shard has one
// node, in pool benchPool(0) and zone benchZone(0): a series with that
// nodepool label is one pool's figure and comes out once per pool of the
// shard, its nodepool and zone renamed; any other series covers all the
// shard's nodes. A sum or count over nodes (the name's last part :sum or
// :count) is the one node's value times the nodes it covers; any other
// (:max, :info, ...) is the one node's value.
func shardPartialsPage(partials []byte, pools map[int]int) ([]byte, error) {
	n := 0
	for _, c := range pools {
		n += c
	}
	idx := slices.Sorted(maps.Keys(pools))
	poolLabel := `nodepool="` + benchPool(0) + `"`
	zoneLabel := `zone="` + benchZone(0) + `"`
	var b bytes.Buffer
	for _, line := range strings.Split(string(partials), "\n") {
		if line == "" {
			continue
		}
		m := lineRE.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("partial sums: not a sample line: %q", line)
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			return nil, fmt.Errorf("partial sums: %q: %w", line, err)
		}
		op := m[1][strings.LastIndexByte(m[1], ':')+1:]
		scaled := strings.Count(m[1], ":") >= 2 && (op == "sum" || op == "count")
		write := func(labels string, nodes int) {
			w := v
			if scaled {
				w *= float64(nodes)
			}
			b.WriteString(m[1] + labels + " " + strconv.FormatFloat(w, 'g', -1, 64) + "\n")
		}
		if !strings.Contains(m[2], poolLabel) {
			write(m[2], n)
			continue
		}
		for _, p := range idx {
			labels := strings.Replace(m[2], poolLabel, `nodepool="`+benchPool(p)+`"`, 1)
			labels = strings.Replace(labels, zoneLabel, `zone="`+benchZone(p)+`"`, 1)
			write(labels, pools[p])
		}
	}
	return b.Bytes(), nil
}

// seriesOf is a page without its values.
func seriesOf(page []byte) string {
	var s []string
	for _, line := range strings.Split(string(page), "\n") {
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			s = append(s, line[:i])
		}
	}
	sort.Strings(s)
	return strings.Join(s, "\n")
}
