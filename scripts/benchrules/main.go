// Command benchrules is `make bench-rules`: it measures what the shipped
// alert and recording rules cost a real Prometheus at fleet size.
//
// It starts a real Prometheus (the `prometheus` binary on PATH, which `make
// tools` installs: Debian's 2.42) with the given rule files, scraping N
// synthetic GPU nodes and one synthetic kube-state-metrics, all served by one
// in-process HTTP server on loopback:
//
//   - /node/<i>/metrics: a copy of the simulated node's page (rendered once by
//     the built gpu-pool-exporter-sim, or read from -page), with
//     node-specific GPU/MIG UUIDs and pod names, fresh sample timestamps, and
//     on every tenth node an old XID (so that the XID rules have series);
//     Prometheus adds node=<name> and instance=<name>:9947 from file_sd;
//   - /ksm/metrics: kube-state-metrics for ten node pools: kube_node_labels
//     (GKE pool and accelerator), kube_node_status_capacity/allocatable, and
//     for every pod on the node pages plus the Pending pods (5% of the node
//     count, at least ten, spread over pools and GPU resource names)
//     kube_pod_info, kube_pod_status_phase, kube_pod_nodeselectors and
//     kube_pod_container_resource_requests.
//
// Once every target is up it lets the rules run -warmup more cycles, then
// reads /api/v1/rules (evaluationTime and interval per group, time per rule)
// three times per cycle until every group has evaluated -cycles times (a
// group with `interval: 1m` evaluates once every four 15 s cycles), reads
// /api/v1/status/tsdb, and prints markdown tables: per group (interval,
// median and max per evaluation, and the median scaled to one cycle of the
// global interval), the total per cycle (the sum of the scaled medians) and
// per node, the sum of the unscaled medians (a cycle in which every group
// evaluates), head series, and the costliest rules. Evaluation times are wall-clock: on a machine with
// few cores, groups that run at once and the scrapes inflate each other. So
// it also reloads Prometheus without the rules (SIGHUP) and measures its
// CPU (/proc/PID/stat) for as long again: the difference, per cycle, is
// the rules' CPU, which overlap does not inflate. Every process and listener it started is stopped
// before it returns, also on error or Ctrl-C; the whole run is bounded by
// -timeout.
//
// Range windows cost in proportion to the samples they hold, and a short run
// holds only minutes of data: rules with `[1h]` windows over raw series are
// cheaper here than an hour into a real Prometheus. The shipped rules keep
// long windows off raw series for that reason.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

type ruleFiles []string

func (r *ruleFiles) String() string { return strings.Join(*r, ",") }
func (r *ruleFiles) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*r = append(*r, f)
		}
	}
	return nil
}

type config struct {
	nodes, pools, pending int
	interval              time.Duration
	warmup, cycles        int
	timeout               time.Duration
	prometheus, exporter  string
	exporterFlags         string
	page, shardRules      string
	shardNodes            int
	clusterNodes          int
	rules                 ruleFiles
	keep                  bool
	top                   int
	baseline              bool
	cpuRounds             int
	budget                float64 // percent of the interval; 0: none
	profile               string
}

func main() {
	var cfg config
	flag.IntVar(&cfg.nodes, "n", 200, "synthetic GPU nodes")
	flag.IntVar(&cfg.pools, "pools", 0, "node pools the nodes are spread over (0: ten, or one per node below ten nodes)")
	flag.IntVar(&cfg.pending, "pending", -1, "Pending GPU pods (-1: 5% of the nodes, at least ten)")
	flag.DurationVar(&cfg.interval, "interval", 15*time.Second, "scrape and evaluation interval")
	flag.IntVar(&cfg.warmup, "warmup", 2, "evaluation cycles to let pass after every target is up, before measuring")
	flag.IntVar(&cfg.cycles, "cycles", 5, "evaluations of each rule group to measure (the slowest group's interval times this is the measured window)")
	flag.DurationVar(&cfg.timeout, "timeout", 60*time.Minute, "give up (and stop everything) after this long (a shard run with the CPU windows takes 20-25 minutes)")
	flag.StringVar(&cfg.prometheus, "prometheus", "prometheus", "the Prometheus server binary")
	flag.StringVar(&cfg.exporter, "exporter", "", "a built gpu-pool-exporter-sim, run once to render the simulated node's page (or use -page)")
	flag.StringVar(&cfg.exporterFlags, "exporter-flags", "", "more flags for the simulated exporter, space-separated (--collector.profile=lean: the lean profile's page)")
	flag.StringVar(&cfg.page, "page", "", "a saved /metrics page of one node, used instead of -exporter")
	flag.Var(&cfg.rules, "rules", "rule files Prometheus loads (comma-separated or repeated)")
	flag.StringVar(&cfg.shardRules, "shard-rules", "", "measure a global layer: derive the node page from a shard Prometheus that scrapes the simulated node with this rules file (its output: the series the -rules read)")
	flag.IntVar(&cfg.clusterNodes, "cluster-nodes", 0, "kube-state-metrics serves the Node objects of this many nodes (at least -n): those past -n have no exporter target, as a shard of a bigger cluster sees it (0: -n)")
	flag.IntVar(&cfg.shardNodes, "shard-nodes", 1000, "with -shard-rules: nodes per shard; the shard's series without a node label (its partial sums, shard_namespace:...) are served once per this many nodes, as the shards of a fleet this size would hand them on")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the work directory (Prometheus config and TSDB) and print its path")
	flag.IntVar(&cfg.top, "top", 12, "costliest rules to list")
	flag.StringVar(&cfg.profile, "cpu-profile", "", "write a CPU profile of Prometheus over the measured cycles to this file (go tool pprof)")
	flag.BoolVar(&cfg.baseline, "cpu-baseline", true, "after the measured cycles, reload Prometheus without the rules and measure its CPU for as long again: the difference is the rules' CPU")
	flag.IntVar(&cfg.cpuRounds, "cpu-rounds", 2, "pairs of windows (one with the rules, one without, each as long as the measured cycles) the rules' CPU is pooled over, in the order with, without, without, with, ...: more rounds, less noise, a longer run")
	flag.Float64Var(&cfg.budget, "budget", 0, "fail (exit 1) unless the rules' evaluation per cycle (wall) and their CPU per cycle each stay within this percentage of the interval (0: report only)")
	flag.Parse()
	if err := cfg.check(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-rules: %v\n", err)
		flag.Usage()
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	err := run(ctx, cfg, os.Stdout)
	stop()
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench-rules: %v\n", err)
		os.Exit(1)
	}
}

func (c *config) check() error {
	if c.pools == 0 {
		c.pools = min(10, max(c.nodes, 1))
	}
	switch {
	case c.nodes < 1:
		return fmt.Errorf("-n %d: want at least one node", c.nodes)
	case c.pools < 1 || c.pools > c.nodes:
		return fmt.Errorf("-pools %d: want 1 to -n (%d)", c.pools, c.nodes)
	case c.interval < time.Second:
		return fmt.Errorf("-interval %s: want at least 1s", c.interval)
	case c.cycles < 1:
		return fmt.Errorf("-cycles %d: want at least 1", c.cycles)
	case c.baseline && c.cpuRounds < 1:
		return fmt.Errorf("-cpu-rounds %d: want at least 1 (one window with the rules and one without)", c.cpuRounds)
	case c.clusterNodes < 0:
		return fmt.Errorf("-cluster-nodes %d: want 0 (as -n) or more", c.clusterNodes)
	case c.shardNodes < 1:
		return fmt.Errorf("-shard-nodes %d: want at least 1", c.shardNodes)
	case len(c.rules) == 0:
		return errors.New("no -rules: name the rule files to measure, e.g. -rules alerts/gpu-pool-exporter.rules.yml")
	case c.budget < 0 || c.budget > 100:
		return fmt.Errorf("-budget %g: want a percentage of the interval, 0 (none) to 100", c.budget)
	case c.budget > 0 && !c.baseline:
		return errors.New("-budget checks the rules' CPU too, which the CPU baseline measures: drop -cpu-baseline=false")
	case (c.exporter == "") == (c.page == ""):
		return errors.New("give exactly one of -exporter (a built gpu-pool-exporter) and -page (a saved /metrics page)")
	}
	if c.pending < 0 {
		c.pending = max(10, c.nodes/20)
	}
	for i, f := range c.rules {
		abs, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		if _, err := os.Stat(abs); err != nil {
			return fmt.Errorf("rule file: %w", err)
		}
		c.rules[i] = abs
	}
	p, err := exec.LookPath(c.prometheus)
	if err != nil {
		return fmt.Errorf("no Prometheus server (%v): run `make tools` (Debian's prometheus 2.42) or pass -prometheus", err)
	}
	c.prometheus = p
	return nil
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	work, err := os.MkdirTemp("", "bench-rules-")
	if err != nil {
		return err
	}
	if cfg.keep {
		fmt.Fprintf(os.Stderr, "bench-rules: work directory %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}

	page, err := nodePage(ctx, cfg)
	if err != nil {
		return err
	}
	var partials []byte
	if cfg.shardRules != "" {
		if page, partials, err = shardOutputPage(ctx, work, cfg, page); err != nil {
			return err
		}
	}
	fleet, err := newFleet(page, cfg.nodes, cfg.pools, cfg.pending, time.Now())
	if err != nil {
		return err
	}
	fleet.addNodeObjects(cfg.clusterNodes, cfg.pools)
	for i := range shardTargets(cfg) {
		p, err := shardPartialsPage(partials, shardPools(i, cfg.shardNodes, cfg.nodes, cfg.pools))
		if err != nil {
			return err
		}
		fleet.shardPages = append(fleet.shardPages, p)
	}

	// One listener serves every node page and kube-state-metrics.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: fleet, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	promAddr, err := freePort()
	if err != nil {
		return err
	}
	if err := writeConfig(work, ln.Addr().String(), cfg); err != nil {
		return err
	}
	prom, err := startPrometheus(ctx, work, promAddr, cfg)
	if err != nil {
		return err
	}
	defer prom.stop()

	api := &apiClient{base: "http://" + promAddr, hc: &http.Client{Timeout: 30 * time.Second}}
	fmt.Fprintf(os.Stderr, "bench-rules: %s, %d nodes in %d pools, %d Pending pods, %d series per node page, interval %s\n",
		prom.version, cfg.nodes, cfg.pools, cfg.pending, fleet.seriesPerNode, cfg.interval)
	targets := cfg.nodes + ksmShards(max(cfg.nodes, cfg.clusterNodes)) + shardTargets(cfg)
	if err := waitTargets(ctx, api, prom, targets); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench-rules: all %d targets up; %d warm-up cycle(s), then %d measured\n", targets, cfg.warmup, cfg.cycles)
	if err := sleep(ctx, prom, time.Duration(cfg.warmup)*cfg.interval); err != nil {
		return err
	}
	// Groups with a longer interval: (`interval: 1m`) evaluate once every
	// few cycles; measure until each group has evaluated -cycles times.
	groups, err := api.rules(ctx)
	if err != nil {
		return err
	}
	window := time.Duration(cfg.cycles) * longestInterval(groups, cfg.interval)
	fmt.Fprintf(os.Stderr, "bench-rules: measuring for %s (%d evaluations of the slowest group)\n", window, cfg.cycles)
	var samples map[groupKey][]groupReading
	first, err := gcWindow(ctx, prom, api, window, func() error {
		profDone := make(chan error, 1)
		if cfg.profile != "" {
			go func() { profDone <- api.profile(ctx, cfg.profile, window) }()
		} else {
			profDone <- nil
		}
		var err error
		samples, err = collect(ctx, api, prom, cfg, window)
		if perr := <-profDone; perr != nil {
			fmt.Fprintf(os.Stderr, "bench-rules: CPU profile: %v\n", perr)
		}
		return err
	})
	if err != nil {
		return err
	}
	head, err := api.headSeries(ctx)
	if err != nil {
		return err
	}
	rss, peak := procMemory(prom.cmd.Process.Pid)
	fmt.Fprintf(os.Stderr, "bench-rules: Prometheus memory after the measured cycles: RSS %.2f GiB, peak %.2f GiB, %d head series\n", rss, peak, head)
	cpu := cpuFigures{withRules: first.cpu / first.secs, allocWithRules: first.alloc / first.secs, windows: []windowReading{first}}
	if cfg.baseline {
		// The same Prometheus, scraping the same targets, without rules,
		// for as long; over several rounds the windows alternate in the
		// order with, without, without, with (and so on), so that a drift
		// of the server's own cost over the run (its heap, the head's
		// series) weighs on both sides alike.
		cpu, err = cpuRounds(ctx, cfg, prom, api, work, ln.Addr().String(), window, first)
		if err != nil {
			return err
		}
	}
	sum := report(out, cfg, prom.version, head, fleet, samples, cpu)
	return checkBudget(out, cfg, sum)
}

// costSummary is a run's bottom line: the rules' evaluation per cycle
// (wall) and their CPU per cycle (with the rules less without them),
// in seconds.
type costSummary struct {
	evalPerCycle, cpuPerCycle float64
	cpuMeasured               bool
}

// checkBudget prints each figure against -budget (a percentage of the
// interval) and fails if one is over it.
func checkBudget(out io.Writer, cfg config, s costSummary) error {
	if cfg.budget <= 0 {
		return nil
	}
	limit := cfg.budget / 100 * cfg.interval.Seconds()
	var over []string
	fmt.Fprintf(out, "\nBudget: %g%% of %s (%s) per cycle, by wall time and by rule CPU:\n\n| figure | per cycle | share of %s | within %g%% |\n|---|---:|---:|---|\n",
		cfg.budget, cfg.interval, ms(limit), cfg.interval, cfg.budget)
	check := func(name string, v float64) {
		ok := v <= limit
		verdict := "yes"
		if !ok {
			verdict = "NO"
			over = append(over, fmt.Sprintf("%s %s (%.1f%%)", name, ms(v), 100*v/cfg.interval.Seconds()))
		}
		fmt.Fprintf(out, "| %s | %s | %.1f%% | %s |\n", name, ms(v), 100*v/cfg.interval.Seconds(), verdict)
	}
	check("rule evaluation (wall)", s.evalPerCycle)
	if s.cpuMeasured {
		check("rule CPU", s.cpuPerCycle)
	}
	if len(over) > 0 {
		return fmt.Errorf("over the budget of %g%% of %s (%s): %s", cfg.budget, cfg.interval, ms(limit), strings.Join(over, ", "))
	}
	return nil
}

// cpuFigures: Prometheus' CPU (cores) with the rules and without them,
// and the bytes it allocates a second with and without them (Go's
// go_memstats_alloc_bytes_total). The allocation is the steadier figure
// between runs of one file: it depends on what the rules read and write
// more than on what else runs on the machine (though the server's own
// background work moves it too), and the garbage collector's share of the
// CPU follows it.
type cpuFigures struct {
	withRules, without           float64
	allocWithRules, allocWithout float64
	measured                     bool
	// rounds are the rule CPU (cores) and allocation (bytes a second) of
	// each pair of windows, with less without, in the order measured.
	rounds []cpuRound
	// windows are the windows measured, in order.
	windows []windowReading
}

type cpuRound struct{ cores, alloc float64 }

// windowWithRules says whether CPU window i (0: the first, with the rules)
// runs with the rules: with, without, without, with, and again.
func windowWithRules(i int) bool { return i%4 == 0 || i%4 == 3 }

// cpuRounds measures the windows after the first one (with the rules,
// measured by the caller): -cpu-rounds pairs of windows in all, each pair
// one with and one without the rules, in the order W N N W W N ...,
// Prometheus reloaded between windows that differ. The rates are pooled
// over every window of each kind.
func cpuRounds(ctx context.Context, cfg config, prom *promProc, api *apiClient, work, fleetAddr string, window time.Duration, first windowReading) (cpuFigures, error) {
	with, without := first, windowReading{}
	windows := []windowReading{first}
	withNow := true
	var rounds []cpuRound
	lastWith, lastWithout := first, windowReading{}
	for i := 1; i < 2*cfg.cpuRounds; i++ {
		wantWith := windowWithRules(i)
		if wantWith != withNow {
			c := cfg
			what := "with the rules"
			if !wantWith {
				c.rules = nil
				what = "without rules for the CPU baseline"
			}
			fmt.Fprintf(os.Stderr, "bench-rules: reloading %s (%s, window %d of %d)\n", what, window, i+1, 2*cfg.cpuRounds)
			if err := writeConfig(work, fleetAddr, c); err != nil {
				return cpuFigures{}, err
			}
			if err := prom.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				return cpuFigures{}, err
			}
			withNow = wantWith
			if err := sleep(ctx, prom, cfg.interval); err != nil {
				return cpuFigures{}, err
			}
		}
		w, err := gcWindow(ctx, prom, api, window, func() error { return sleep(ctx, prom, window) })
		if err != nil {
			return cpuFigures{}, err
		}
		w.withRules = wantWith
		windows = append(windows, w)
		if wantWith {
			with = with.add(w)
			lastWith = w
		} else {
			without = without.add(w)
			lastWithout = w
		}
		// A pair is complete after every second window.
		if i%2 == 1 {
			r := cpuRound{lastWith.cpu/lastWith.secs - lastWithout.cpu/lastWithout.secs, lastWith.alloc/lastWith.secs - lastWithout.alloc/lastWithout.secs}
			rounds = append(rounds, r)
			fmt.Fprintf(os.Stderr, "bench-rules: round %d: rule CPU %s a cycle, rule allocation %.0f MB a cycle\n", len(rounds), ms(r.cores*cfg.interval.Seconds()), r.alloc*cfg.interval.Seconds()/1e6)
		}
	}
	return cpuFigures{
		withRules: with.cpu / with.secs, without: without.cpu / without.secs,
		allocWithRules: with.alloc / with.secs, allocWithout: without.alloc / without.secs,
		measured: true, rounds: rounds, windows: windows,
	}, nil
}

// windowReading is what one CPU window measured: the server's CPU seconds,
// bytes allocated and garbage collections over secs seconds; aligned when
// it starts and ends as a collection ends.
type windowReading struct {
	cpu, alloc, secs float64
	gcs              int
	aligned          bool
	withRules        bool
}

// add pools two windows' readings (what the pooled rates need).
func (w windowReading) add(o windowReading) windowReading {
	return windowReading{cpu: w.cpu + o.cpu, alloc: w.alloc + o.alloc, secs: w.secs + o.secs, gcs: w.gcs + o.gcs}
}

// gcWindow measures the server over body, from the end of a garbage
// collection to the end of the first one after body returns. The server's
// heap is gigabytes, so one collection is seconds of CPU (marking it), a
// few in a window of minutes: a window cut anywhere would count a part of
// the cycle the window's allocation led to, or of the one before, and
// move the rules' CPU (a difference of two windows) by a collection's
// worth. Waits at most limit for each collection; a window that did not
// get one is measured as it is, and says so.
func gcWindow(ctx context.Context, prom *promProc, api *apiClient, limit time.Duration, body func() error) (windowReading, error) {
	start, okStart, err := nextGC(ctx, prom, api, limit)
	if err != nil {
		return windowReading{}, err
	}
	if err := body(); err != nil {
		return windowReading{}, err
	}
	end, okEnd, err := nextGC(ctx, prom, api, limit)
	if err != nil {
		return windowReading{}, err
	}
	return windowReading{
		cpu: (end.cpu - start.cpu).Seconds(), alloc: end.alloc - start.alloc, secs: end.at.Sub(start.at).Seconds(),
		gcs: int(end.gcs - start.gcs), aligned: okStart && okEnd, withRules: true,
	}, nil
}

// serverReading is the server's CPU (from /proc), bytes allocated and
// garbage collections (its /metrics) at one time.
type serverReading struct {
	cpu        time.Duration
	alloc, gcs float64
	at         time.Time
}

// nextGC polls the server until a garbage collection ends (its count
// grows) and returns the reading of that poll; after limit, the reading of
// the last poll and false.
func nextGC(ctx context.Context, prom *promProc, api *apiClient, limit time.Duration) (serverReading, bool, error) {
	read := func() (serverReading, error) {
		alloc, gcs, err := api.runtime(ctx)
		return serverReading{procCPU(prom.cmd.Process.Pid), alloc, gcs, time.Now()}, err
	}
	r0, err := read()
	if err != nil {
		return r0, false, err
	}
	deadline := time.Now().Add(limit)
	for {
		if err := sleep(ctx, prom, 250*time.Millisecond); err != nil {
			return r0, false, err
		}
		r, err := read()
		if err != nil {
			return r, false, err
		}
		if r.gcs > r0.gcs {
			return r, true, nil
		}
		if time.Now().After(deadline) {
			return r, false, nil
		}
	}
}

// procCPU is a process's user+system CPU time (/proc/PID/stat; 0 where
// unreadable, e.g. not Linux).
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	// USER_HZ is 100 on every Linux this runs on.
	return time.Duration(ut+st) * (time.Second / 100)
}

// procMemory is a process's resident memory now and at its peak, in GiB
// (/proc/PID/status VmRSS and VmHWM; 0 where unreadable).
func procMemory(pid int) (rss, peak float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kib, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = kib / (1 << 20)
		case "VmHWM:":
			peak = kib / (1 << 20)
		}
	}
	return rss, peak
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// nodePage is one node's /metrics page: -page, or the simulated node's
// page, fetched from the built exporter once it shows allocations and its
// DCGM collector is up.
func nodePage(ctx context.Context, cfg config) ([]byte, error) {
	if cfg.page != "" {
		return os.ReadFile(cfg.page)
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	var logs bytes.Buffer
	args := append([]string{"--web.listen-address=" + addr, "--collect-interval=1s", "--log.level=warn"}, strings.Fields(cfg.exporterFlags)...)
	cmd := exec.Command(cfg.exporter, args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.exporter, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			return nil, fmt.Errorf("%s exited: %v\n%s", cfg.exporter, err, logs.String())
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK &&
			bytes.Contains(b, []byte("\ngpu_allocation_info{")) && bytes.Contains(b, []byte("\n"+`gpu_exporter_collector_up{collector="dcgm"} 1`)) {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%s served no page with allocations and DCGM up within 60s\n%s", cfg.exporter, logs.String())
}

// ---------------------------------------------------------------------------
// The synthetic fleet.

// A segment of the node page template: literal text, then (kind) a value
// that depends on the node or the time.
type segment struct {
	text []byte
	kind int    // one of the seg* constants
	orig string // the original value (uuid, pod name)
}

const (
	segEnd  = iota // nothing follows
	segUUID        // a GPU-/MIG- UUID: its first 8 hex digits become the node index
	segPod         // a pod name: suffixed with the node's name
	segNow         // a *_timestamp_seconds sample value: the time of the scrape
)

type pod struct {
	namespace, name, container, node, resource, nodepool string
	count                                                float64
	pending                                              bool
}

type fleet struct {
	tmpl          []segment
	seriesPerNode int
	nodes         []string
	ksm           []byte
	ksmShards     [][]byte // ksm split as kube-state-metrics' --total-shards splits it
	shardPages    [][]byte // the partial sums of each shard (-shard-rules)
}

var (
	uuidRE = regexp.MustCompile(`(?:GPU|MIG)-[0-9a-fA-F]{8}`)
	podRE  = regexp.MustCompile(`\bpod="([^"]*)"`)
	lineRE = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$`)
)

func nodeName(i int) string { return fmt.Sprintf("gpu-node-%05d", i) }

// benchPool and benchZone name the node pool of index p (node i is in pool
// i mod pools) and its zone: pools are zonal, spread over three zones.
func benchPool(p int) string { return fmt.Sprintf("pool-%02d", p) }
func benchZone(p int) string { return fmt.Sprintf("us-central1-%c", 'a'+p%3) }

// shardPools counts the nodes of shard i (nodes per shard, n in all) per
// pool index.
func shardPools(i, per, n, pools int) map[int]int {
	c := map[int]int{}
	for j := i * per; j < min(n, (i+1)*per); j++ {
		c[j%pools]++
	}
	return c
}

func newFleet(page []byte, n, pools, pending int, start time.Time) (*fleet, error) {
	f := &fleet{}
	var lit bytes.Buffer
	emit := func(kind int, orig string) {
		f.tmpl = append(f.tmpl, segment{text: bytes.Clone(lit.Bytes()), kind: kind, orig: orig})
		lit.Reset()
	}
	type holder struct{ namespace, pod, container, resource string }
	var holders []holder
	seen := map[holder]bool{}
	var firstUUID string
	for _, line := range strings.Split(strings.TrimRight(string(page), "\n"), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			lit.WriteString(line + "\n")
			continue
		}
		m := lineRE.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("node page: not a sample line: %q", line)
		}
		f.seriesPerNode++
		if m[1] == "gpu_allocation_info" {
			h := holder{labelValue(m[2], "namespace"), labelValue(m[2], "pod"), labelValue(m[2], "container"), labelValue(m[2], "resource")}
			if !seen[h] {
				seen[h] = true
				holders = append(holders, h)
			}
		}
		// Cut the line at every UUID and pod label value.
		body := m[1] + m[2]
		type cut struct {
			at, end, kind int
		}
		var cuts []cut
		for _, loc := range uuidRE.FindAllStringIndex(body, -1) {
			cuts = append(cuts, cut{loc[0] + 4, loc[1], segUUID})
			if firstUUID == "" {
				firstUUID = body[loc[0]:]
			}
		}
		for _, loc := range podRE.FindAllStringSubmatchIndex(body, -1) {
			if loc[3] > loc[2] {
				cuts = append(cuts, cut{loc[2], loc[3], segPod})
			}
		}
		sort.Slice(cuts, func(i, j int) bool { return cuts[i].at < cuts[j].at })
		pos := 0
		for _, c := range cuts {
			lit.WriteString(body[pos:c.at])
			emit(c.kind, body[c.at:c.end])
			pos = c.end
		}
		lit.WriteString(body[pos:] + " ")
		if strings.HasSuffix(m[1], "_timestamp_seconds") && m[1] != "gpu_last_xid_timestamp_seconds" {
			emit(segNow, "")
		} else {
			lit.WriteString(m[3])
		}
		lit.WriteString("\n")
	}
	if f.seriesPerNode == 0 {
		return nil, errors.New("node page has no samples")
	}
	if len(holders) == 0 {
		return nil, errors.New("node page has no gpu_allocation_info: the kube-state-metrics pods follow its holders")
	}
	// An old XID on every tenth node, in the exporter's shape (the counter,
	// the first and last event times per code, the last per GPU), so that
	// the XID rules read series: application XID 13, three times, from
	// three to two hours ago.
	xidLines := ""
	if firstUUID != "" {
		uuid := firstUUID
		if i := strings.IndexByte(uuid, '"'); i >= 0 {
			uuid = uuid[:i]
		}
		uuid = uuid[:4] + "@IDX@" + uuid[12:] // the node index goes where the page's UUIDs get it
		old := strconv.FormatInt(start.Add(-2*time.Hour).Unix(), 10)
		first := strconv.FormatInt(start.Add(-3*time.Hour).Unix(), 10)
		xid := `action="restart_app",category="application",gpu="0",uuid="` + uuid + `",xid="13"`
		xidLines = "gpu_xid_errors_total{" + xid + "} 3\n" +
			"gpu_xid_first_timestamp_seconds{" + xid + "} " + first + "\n" +
			"gpu_xid_last_timestamp_seconds{" + xid + "} " + old + "\n" +
			`gpu_last_xid_timestamp_seconds{gpu="0",uuid="` + uuid + `"} ` + old + "\n"
	}
	emit(segEnd, xidLines)

	// kube-state-metrics.
	var ksm bytes.Buffer
	pool := func(i int) string { return benchPool(i % pools) }
	var pods []pod
	for i := range n {
		node := nodeName(i)
		f.nodes = append(f.nodes, node)
		writeNodeObject(&ksm, i, pools)
		for _, h := range holders {
			pods = append(pods, pod{namespace: h.namespace, name: h.pod + "-" + node, container: h.container,
				node: node, resource: ksmResource(h.resource), nodepool: pool(i), count: 1})
		}
	}
	resources := []string{"nvidia_com_gpu", "nvidia_com_gpu_shared", "nvidia_com_mig_1g_10gb"}
	for i := range pending {
		pods = append(pods, pod{namespace: "batch", name: fmt.Sprintf("pending-%05d", i), container: "main",
			resource: resources[i%len(resources)], nodepool: pool(i), count: float64(1 + i%2), pending: true})
	}
	// One series set per pod (a pod with several holder rows requests per
	// container; the page's holders are per device, so sum them).
	type podKey struct{ ns, name string }
	done := map[podKey]bool{}
	requests := map[string]float64{}
	for _, p := range pods {
		requests[p.namespace+"\x00"+p.name+"\x00"+p.container+"\x00"+p.resource] += p.count
	}
	for _, p := range pods {
		k := podKey{p.namespace, p.name}
		if done[k] {
			continue
		}
		done[k] = true
		uid := fmt.Sprintf("uid-%s-%s", p.namespace, p.name)
		fmt.Fprintf(&ksm, "kube_pod_info{namespace=%q,pod=%q,uid=%q,node=%q,host_ip=\"\",pod_ip=\"\",created_by_kind=\"Job\",created_by_name=%q,priority_class=\"\",host_network=\"false\"} 1\n",
			p.namespace, p.name, uid, p.node, p.name)
		for _, phase := range []string{"Pending", "Running", "Succeeded", "Failed", "Unknown"} {
			v := 0
			if (phase == "Pending") == p.pending && (phase == "Running") == !p.pending {
				v = 1
			}
			fmt.Fprintf(&ksm, "kube_pod_status_phase{namespace=%q,pod=%q,uid=%q,phase=%q} %d\n", p.namespace, p.name, uid, phase, v)
		}
		fmt.Fprintf(&ksm, "kube_pod_nodeselectors{namespace=%q,pod=%q,uid=%q,nodeselector_cloud_google_com_gke_nodepool=%q} 1\n", p.namespace, p.name, uid, p.nodepool)
	}
	for _, p := range pods {
		key := p.namespace + "\x00" + p.name + "\x00" + p.container + "\x00" + p.resource
		v, ok := requests[key]
		if !ok {
			continue
		}
		delete(requests, key)
		uid := fmt.Sprintf("uid-%s-%s", p.namespace, p.name)
		fmt.Fprintf(&ksm, "kube_pod_container_resource_requests{namespace=%q,pod=%q,uid=%q,container=%q,node=%q,resource=%q,unit=\"integer\"} %g\n",
			p.namespace, p.name, uid, p.container, p.node, p.resource, v)
		fmt.Fprintf(&ksm, "kube_pod_container_resource_requests{namespace=%q,pod=%q,uid=%q,container=%q,node=%q,resource=\"cpu\",unit=\"core\"} 4\n",
			p.namespace, p.name, uid, p.container, p.node)
	}
	f.ksm = ksm.Bytes()
	f.ksmShards = splitKSM(f.ksm, ksmShards(n))
	return f, nil
}

// The node objects' states, one node in every so many: a node the cluster
// autoscaler is removing (its ToBeDeletedByClusterAutoscaler taint), one
// cordoned, and one a remediator holds (GKE's XidCriticalError condition),
// so that the rules about departing, cordoned and quarantined nodes read
// series as in a big fleet, where some nodes always are.
const (
	leavingEvery     = 200
	cordonedEvery    = 100
	quarantinedEvery = 100
)

// nodeConditions are the node conditions every kubelet reports, and the
// value of each for a healthy node (kube-state-metrics serves one series
// per condition and status, the true one 1).
var nodeConditions = []struct{ condition, status string }{
	{"Ready", "true"}, {"MemoryPressure", "false"}, {"DiskPressure", "false"},
	{"PIDPressure", "false"}, {"NetworkUnavailable", "false"},
}

// writeNodeObject writes kube-state-metrics' series of node i's Node object:
// its labels (pool, accelerator, zone), info, capacity and allocatable,
// cordon, creation time, taints (GKE's nvidia.com/gpu on every GPU node) and
// conditions.
func writeNodeObject(ksm *bytes.Buffer, i, pools int) {
	node := nodeName(i)
	fmt.Fprintf(ksm, "kube_node_labels{node=%q,label_cloud_google_com_gke_nodepool=%q,label_cloud_google_com_gke_accelerator=\"nvidia-h100-80gb\",label_cloud_google_com_gke_accelerator_count=\"8\",label_topology_kubernetes_io_zone=%q} 1\n", node, benchPool(i%pools), benchZone(i%pools))
	fmt.Fprintf(ksm, "kube_node_info{node=%q,kernel_version=\"6.1.0\",kubelet_version=\"v1.31.1\",container_runtime_version=\"containerd://1.7.0\",provider_id=\"gce://bench/%s\"} 1\n", node, node)
	for _, kind := range []string{"kube_node_status_capacity", "kube_node_status_allocatable"} {
		fmt.Fprintf(ksm, "%s{node=%q,resource=\"cpu\",unit=\"core\"} 208\n", kind, node)
		fmt.Fprintf(ksm, "%s{node=%q,resource=\"memory\",unit=\"byte\"} 1.9e+12\n", kind, node)
		fmt.Fprintf(ksm, "%s{node=%q,resource=\"nvidia_com_gpu\",unit=\"integer\"} 8\n", kind, node)
	}
	cordoned := 0
	if i%cordonedEvery == cordonedEvery/2 {
		cordoned = 1
	}
	fmt.Fprintf(ksm, "kube_node_spec_unschedulable{node=%q} %d\n", node, cordoned)
	// Created a day ago (a fixed time: the page is rendered once).
	fmt.Fprintf(ksm, "kube_node_created{node=%q} %d\n", node, time.Now().Add(-24*time.Hour).Unix())
	fmt.Fprintf(ksm, "kube_node_spec_taint{node=%q,key=\"nvidia.com/gpu\",value=\"present\",effect=\"NoSchedule\"} 1\n", node)
	if i%leavingEvery == leavingEvery/2 {
		fmt.Fprintf(ksm, "kube_node_spec_taint{node=%q,key=\"ToBeDeletedByClusterAutoscaler\",value=\"1700000000\",effect=\"NoSchedule\"} 1\n", node)
	}
	conditions := nodeConditions
	if i%quarantinedEvery == quarantinedEvery/4 {
		conditions = append(slices.Clone(conditions), struct{ condition, status string }{"XidCriticalError", "true"})
	}
	for _, c := range conditions {
		for _, status := range []string{"true", "false", "unknown"} {
			v := 0
			if status == c.status {
				v = 1
			}
			fmt.Fprintf(ksm, "kube_node_status_condition{node=%q,condition=%q,status=%q} %d\n", node, c.condition, status, v)
		}
	}
}

// addNodeObjects makes the fleet's kube-state-metrics a cluster of total
// nodes: the Node objects of the nodes past the fleet's own (no exporter
// target, no pods), as a shard of a bigger cluster sees kube-state-metrics.
func (f *fleet) addNodeObjects(total, pools int) {
	if total <= len(f.nodes) {
		return
	}
	ksm := bytes.NewBuffer(f.ksm)
	for i := len(f.nodes); i < total; i++ {
		writeNodeObject(ksm, i, pools)
	}
	f.ksm = ksm.Bytes()
	f.ksmShards = splitKSM(f.ksm, ksmShards(total))
}

// labelValue reads one label's value from a {a="x",b="y"} string.
func labelValue(labels, name string) string {
	i := strings.Index(labels, name+`="`)
	if i < 0 || (i > 0 && labels[i-1] != '{' && labels[i-1] != ',') {
		return ""
	}
	v := labels[i+len(name)+2:]
	if j := strings.IndexByte(v, '"'); j >= 0 {
		return v[:j]
	}
	return v
}

// ksmShards is how many kube-state-metrics targets serve the fleet: one per
// 500 nodes, as a big cluster shards kube-state-metrics (--total-shards);
// one page of a million lines does not get scraped in time.
func ksmShards(nodes int) int { return max(1, nodes/500) }

// splitKSM deals the sample lines of a kube-state-metrics page out to n
// pages (metadata lines left out: the rules need no types).
func splitKSM(page []byte, n int) [][]byte {
	out := make([]bytes.Buffer, n)
	i := 0
	for _, l := range bytes.SplitAfter(page, []byte("\n")) {
		if len(l) == 0 || l[0] == '#' {
			continue
		}
		out[i%n].Write(l)
		i++
	}
	pages := make([][]byte, n)
	for j := range out {
		pages[j] = out[j].Bytes()
	}
	return pages
}

// ksmResource is kube-state-metrics' spelling of a resource name
// (nvidia.com/mig-1g.10gb -> nvidia_com_mig_1g_10gb).
func ksmResource(r string) string {
	return strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			return c
		}
		return '_'
	}, r)
}

func (f *fleet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if r.URL.Path == "/ksm/metrics" {
		_, _ = w.Write(f.ksm)
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/shard/"); ok {
		i, err := strconv.Atoi(strings.TrimSuffix(rest, "/metrics"))
		if err != nil || i < 0 || i >= len(f.shardPages) {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(f.shardPages[i])
		return
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/ksm/"); ok {
		i, err := strconv.Atoi(strings.TrimSuffix(rest, "/metrics"))
		if err != nil || i < 0 || i >= len(f.ksmShards) {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(f.ksmShards[i])
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/node/")
	idx, err := strconv.Atoi(strings.TrimSuffix(rest, "/metrics"))
	if !ok || err != nil || idx < 0 || idx >= len(f.nodes) {
		http.NotFound(w, r)
		return
	}
	node := f.nodes[idx]
	now := strconv.FormatFloat(float64(time.Now().UnixNano())/1e9, 'f', 3, 64)
	var b bytes.Buffer
	b.Grow(64 << 10)
	for _, s := range f.tmpl {
		b.Write(s.text)
		switch s.kind {
		case segUUID:
			fmt.Fprintf(&b, "%08x", idx)
		case segPod:
			b.WriteString(s.orig + "-" + node)
		case segNow:
			b.WriteString(now)
		case segEnd:
			if idx%10 == 0 && s.orig != "" {
				b.WriteString(strings.ReplaceAll(s.orig, "@IDX@", fmt.Sprintf("%08x", idx)))
			}
		}
	}
	_, _ = w.Write(b.Bytes())
}

// ---------------------------------------------------------------------------
// Prometheus.

// ksmJobs are the scrape configs of the kube-state-metrics shards.
// Their pages are big: a scrape may take the whole interval. Each has an
// instance of its own, or their up series would be one.
func ksmJobs(nodes int, addr string, interval time.Duration) string {
	var b strings.Builder
	for i := range ksmShards(nodes) {
		fmt.Fprintf(&b, "  - job_name: kube-state-metrics-%d\n    honor_labels: true\n    scrape_timeout: %s\n    metrics_path: /ksm/%d/metrics\n    static_configs:\n      - targets: [%q]\n        labels: {job: kube-state-metrics, instance: ksm-%d}\n", i, interval, i, addr, i)
	}
	return b.String()
}

// shardTargets is the number of shards whose partial sums the measured
// Prometheus scrapes: with -shard-rules, one per -shard-nodes nodes.
func shardTargets(cfg config) int {
	if cfg.shardRules == "" {
		return 0
	}
	return (cfg.nodes + cfg.shardNodes - 1) / cfg.shardNodes
}

// shardJobs are the scrape configs of the shards' partial sums, one target
// per shard (a shard's sidecar, or its remote write, hands them on with the
// shard's external labels; the instance tells them apart here).
func shardJobs(cfg config, addr string) string {
	var b strings.Builder
	for i := range shardTargets(cfg) {
		fmt.Fprintf(&b, "  - job_name: shard-%d\n    metrics_path: /shard/%d/metrics\n    static_configs:\n      - targets: [%q]\n        labels: {job: shard, instance: shard-%d}\n", i, i, addr, i)
	}
	return b.String()
}

func writeConfig(work, addr string, cfg config) error {
	type target struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	var targets []target
	for i := range cfg.nodes {
		node := nodeName(i)
		targets = append(targets, target{Targets: []string{addr}, Labels: map[string]string{
			"node": node, "instance": node + ":9947", "__metrics_path__": fmt.Sprintf("/node/%d/metrics", i),
		}})
	}
	b, err := json.Marshal(targets)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "nodes.json"), b, 0o644); err != nil {
		return err
	}
	rules := strings.Builder{}
	for _, r := range cfg.rules {
		fmt.Fprintf(&rules, "  - %q\n", r)
	}
	if len(cfg.rules) == 0 {
		rules.WriteString("  []\n")
	}
	timeout := min(cfg.interval, 10*time.Second)
	conf := fmt.Sprintf(`global:
  scrape_interval: %s
  scrape_timeout: %s
  evaluation_interval: %s
rule_files:
%sscrape_configs:
  - job_name: gpu-pool-exporter
    file_sd_configs:
      - files: [%q]
%s%s`, cfg.interval, timeout, cfg.interval, rules.String(), filepath.Join(work, "nodes.json"), ksmJobs(max(cfg.nodes, cfg.clusterNodes), addr, cfg.interval), shardJobs(cfg, addr))
	return os.WriteFile(filepath.Join(work, "prometheus.yml"), []byte(conf), 0o644)
}

type promProc struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	err     error
	logs    *tailBuffer
	version string
}

func startPrometheus(ctx context.Context, work, addr string, cfg config) (*promProc, error) {
	v, err := exec.CommandContext(ctx, cfg.prometheus, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %v\n%s", cfg.prometheus, err, v)
	}
	version := strings.TrimSpace(strings.SplitN(string(v), "\n", 2)[0])
	if strings.Contains(version, "version  ") {
		// Built by `go install` (no version stamped in): name the module.
		if m, err := exec.CommandContext(ctx, "go", "version", "-m", cfg.prometheus).Output(); err == nil {
			if f := regexp.MustCompile(`(?m)^\s+mod\s+github.com/prometheus/prometheus\s+(\S+)`).FindSubmatch(m); f != nil {
				version = "prometheus, module github.com/prometheus/prometheus " + string(f[1])
			}
		}
	}
	p := &promProc{exited: make(chan struct{}), logs: &tailBuffer{max: 8 << 10}, version: version}
	p.cmd = exec.Command(cfg.prometheus,
		"--config.file="+filepath.Join(work, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(work, "data"),
		"--storage.tsdb.retention.time=3h",
		"--web.listen-address="+addr,
		"--log.level=warn")
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.prometheus, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	return p, nil
}

func (p *promProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func (p *promProc) dead() error {
	select {
	case <-p.exited:
		return fmt.Errorf("prometheus exited: %v\n%s", p.err, p.logs.String())
	default:
		return nil
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return string(t.b) }

func sleep(ctx context.Context, p *promProc, d time.Duration) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("stopped: %w", ctx.Err())
	case <-p.exited:
		return p.dead()
	case <-time.After(d):
		return nil
	}
}

type apiClient struct {
	base string
	hc   *http.Client
}

func (a *apiClient) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %s", path, env.Error)
	}
	return json.Unmarshal(env.Data, v)
}

func waitTargets(ctx context.Context, api *apiClient, p *promProc, want int) error {
	// Thousands of targets take minutes to be scraped once on a busy machine.
	wait := 5*time.Minute + time.Duration(want)*30*time.Millisecond
	deadline := time.Now().Add(wait)
	last := ""
	for time.Now().Before(deadline) {
		if err := sleep(ctx, p, 2*time.Second); err != nil {
			return err
		}
		// count(up == 1) rather than /api/v1/targets: at 10,000 targets
		// the list takes longer to render than a query.
		var r struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		}
		if err := api.get(ctx, "/api/v1/query?query="+url.QueryEscape("count(up == 1)"), &r); err != nil {
			last = err.Error()
			continue
		}
		up := 0
		if len(r.Result) == 1 {
			f, _ := strconv.ParseFloat(fmt.Sprint(r.Result[0].Value[1]), 64)
			up = int(f)
		}
		if up == want {
			return nil
		}
		last = fmt.Sprintf("%d of %d targets up", up, want)
	}
	return fmt.Errorf("targets not up within %s: %s (their errors: /api/v1/targets)", wait, last)
}

// One reading of /api/v1/rules.
type groupReading struct {
	File, Name     string
	Eval           float64
	Interval       time.Duration
	LastEvaluation time.Time
	Rules          map[string]float64
}

func (g groupReading) key() groupKey { return groupKey{g.File, g.Name} }

type groupKey struct{ file, group string }

// longestInterval is the longest evaluation interval of the groups (at least
// def, the global one).
func longestInterval(gs []groupReading, def time.Duration) time.Duration {
	l := def
	for _, g := range gs {
		l = max(l, g.Interval)
	}
	return l
}

func (a *apiClient) rules(ctx context.Context) ([]groupReading, error) {
	var d struct {
		Groups []struct {
			Name           string    `json:"name"`
			File           string    `json:"file"`
			EvaluationTime float64   `json:"evaluationTime"`
			Interval       float64   `json:"interval"`
			LastEvaluation time.Time `json:"lastEvaluation"`
			Rules          []struct {
				Name           string  `json:"name"`
				EvaluationTime float64 `json:"evaluationTime"`
				Health         string  `json:"health"`
				LastError      string  `json:"lastError"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := a.get(ctx, "/api/v1/rules", &d); err != nil {
		return nil, err
	}
	var out []groupReading
	for _, g := range d.Groups {
		r := groupReading{File: filepath.Base(g.File), Name: g.Name, Eval: g.EvaluationTime,
			Interval: time.Duration(g.Interval * float64(time.Second)), LastEvaluation: g.LastEvaluation, Rules: map[string]float64{}}
		for _, x := range g.Rules {
			if x.Health == "err" {
				return nil, fmt.Errorf("rule %s in group %s fails: %s", x.Name, g.Name, x.LastError)
			}
			r.Rules[x.Name] += x.EvaluationTime
		}
		out = append(out, r)
	}
	return out, nil
}

// profile saves Prometheus' CPU profile over d.
func (a *apiClient) profile(ctx context.Context, file string, d time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", a.base, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: d + time.Minute}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// allocated is the bytes the Prometheus process has allocated since it
// started, from its own /metrics.
// runtime is the server's bytes allocated and garbage collections so far.
func (a *apiClient) runtime(ctx context.Context) (alloc, gcs float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.base+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return runtimeFigures(resp.Body)
}

// runtimeFigures are go_memstats_alloc_bytes_total and the count of
// go_gc_duration_seconds (garbage collections ended) of a text exposition.
func runtimeFigures(r io.Reader) (alloc, gcs float64, err error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return 0, 0, fmt.Errorf("the server's /metrics: %w", err)
	}
	const allocName, gcName = "go_memstats_alloc_bytes_total", "go_gc_duration_seconds"
	f, ok := fams[allocName]
	if !ok || len(f.GetMetric()) != 1 || f.GetMetric()[0].GetCounter() == nil {
		return 0, 0, fmt.Errorf("the server's /metrics has no counter %s", allocName)
	}
	g, ok := fams[gcName]
	if !ok || len(g.GetMetric()) != 1 || g.GetMetric()[0].GetSummary() == nil {
		return 0, 0, fmt.Errorf("the server's /metrics has no summary %s", gcName)
	}
	return f.GetMetric()[0].GetCounter().GetValue(), float64(g.GetMetric()[0].GetSummary().GetSampleCount()), nil
}

func (a *apiClient) headSeries(ctx context.Context) (int, error) {
	var d struct {
		HeadStats struct {
			NumSeries int `json:"numSeries"`
		} `json:"headStats"`
	}
	err := a.get(ctx, "/api/v1/status/tsdb", &d)
	return d.HeadStats.NumSeries, err
}

// collect reads the rules every third of a cycle for window and keeps
// every group's distinct evaluations (a group evaluates once per its own
// interval), until each group has evaluated cfg.cycles times.
func collect(ctx context.Context, api *apiClient, p *promProc, cfg config, window time.Duration) (map[groupKey][]groupReading, error) {
	evals := map[groupKey][]groupReading{}
	seen := map[groupKey]time.Time{}
	deadline := time.Now().Add(3 * window)
	for start := time.Now(); ; {
		if err := sleep(ctx, p, cfg.interval/3); err != nil {
			return nil, err
		}
		rs, err := api.rules(ctx)
		if err != nil {
			return nil, err
		}
		done := true
		for _, g := range rs {
			k := g.key()
			if !g.LastEvaluation.IsZero() && g.LastEvaluation.After(seen[k]) {
				if !seen[k].IsZero() { // the first reading may predate the window
					evals[k] = append(evals[k], g)
				}
				seen[k] = g.LastEvaluation
			}
			if len(evals[k]) < cfg.cycles {
				done = false
			}
		}
		if done && time.Since(start) >= window {
			return evals, nil
		}
		if time.Now().After(deadline) {
			var slow []string
			for _, g := range rs {
				if n := len(evals[g.key()]); n < cfg.cycles {
					slow = append(slow, fmt.Sprintf("%s (%d)", g.Name, n))
				}
			}
			return nil, fmt.Errorf("rule groups %s evaluated fewer than %d times in %s: they do not finish within their interval", strings.Join(slow, ", "), cfg.cycles, 3*window)
		}
	}
}

// ---------------------------------------------------------------------------
// Report.

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func ms(s float64) string { return strconv.FormatFloat(s*1000, 'f', 1, 64) + " ms" }

// perCycle scales a group's evaluation time to one cycle of the global
// interval: a group evaluated every minute costs a quarter of its time per
// 15 s cycle.
func perCycle(eval float64, groupInterval, cycle time.Duration) float64 {
	if groupInterval <= 0 {
		groupInterval = cycle
	}
	return eval * cycle.Seconds() / groupInterval.Seconds()
}

func report(out io.Writer, cfg config, version string, head int, f *fleet, evals map[groupKey][]groupReading, cpu cpuFigures) costSummary {
	keys := make([]groupKey, 0, len(evals))
	for k := range evals {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].file != keys[j].file {
			return keys[i].file < keys[j].file
		}
		return keys[i].group < keys[j].group
	})
	type ruleCost struct {
		name, group    string
		median, scaled float64
	}
	var rules []ruleCost
	fileTotals := map[string]float64{}
	var total, allAtOnce float64
	fmt.Fprintf(out, "Rule evaluation: %s, %d nodes (%d series per node page) in %d pools, %d Pending GPU pods, interval %s, %d evaluations of each group measured.\n\n",
		version, cfg.nodes, f.seriesPerNode, cfg.pools, cfg.pending, cfg.interval, cfg.cycles)
	tw := tabwriter.NewWriter(out, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintf(tw, "| file\t group\t interval\t median\t max\t per %s cycle\t\n", cfg.interval)
	fmt.Fprintln(tw, "|---\t---\t---:\t---:\t---:\t---:\t")
	for _, k := range keys {
		es := evals[k]
		var ts []float64
		ruleTimes := map[string][]float64{}
		for _, e := range es {
			ts = append(ts, e.Eval)
			for r, x := range e.Rules {
				ruleTimes[r] = append(ruleTimes[r], x)
			}
		}
		itv := es[0].Interval
		if itv <= 0 {
			itv = cfg.interval
		}
		m := median(ts)
		scaled := perCycle(m, itv, cfg.interval)
		total += scaled
		allAtOnce += m
		fileTotals[k.file] += scaled
		fmt.Fprintf(tw, "| %s\t %s\t %s\t %s\t %s\t %s\t\n", k.file, k.group, itv, ms(m), ms(slices.Max(ts)), ms(scaled))
		for r, x := range ruleTimes {
			rm := median(x)
			rules = append(rules, ruleCost{r, k.group, rm, perCycle(rm, itv, cfg.interval)})
		}
	}
	tw.Flush()
	if len(fileTotals) > 1 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 0, 0, 1, ' ', tabwriter.Debug)
		fmt.Fprintf(tw, "| file\t per %s cycle\t per node\t\n", cfg.interval)
		fmt.Fprintln(tw, "|---\t---:\t---:\t")
		files := make([]string, 0, len(fileTotals))
		for file := range fileTotals {
			files = append(files, file)
		}
		sort.Strings(files)
		for _, file := range files {
			m := fileTotals[file]
			fmt.Fprintf(tw, "| %s\t %s\t %s\t\n", file, ms(m), strconv.FormatFloat(m*1e6/float64(cfg.nodes), 'f', 0, 64)+" µs")
		}
		tw.Flush()
	}

	fmt.Fprintf(out, "\nCostliest rules (per %s cycle; median per evaluation):\n\n", cfg.interval)
	sort.Slice(rules, func(i, j int) bool {
		if rules[i].scaled != rules[j].scaled {
			return rules[i].scaled > rules[j].scaled
		}
		return rules[i].name < rules[j].name
	})
	tw = tabwriter.NewWriter(out, 0, 0, 1, ' ', tabwriter.Debug)
	fmt.Fprintln(tw, "| rule\t group\t per cycle\t per evaluation\t")
	fmt.Fprintln(tw, "|---\t---\t---:\t---:\t")
	for _, r := range rules[:min(cfg.top, len(rules))] {
		fmt.Fprintf(tw, "| %s\t %s\t %s\t %s\t\n", r.name, r.group, ms(r.scaled), ms(r.median))
	}
	tw.Flush()

	cpuCol, cpuNode, allocCol := "-", "-", "-"
	sum := costSummary{evalPerCycle: total, cpuMeasured: cpu.measured}
	if cpu.measured {
		// Rule CPU per evaluation cycle: the extra cores times the interval.
		perCycle := (cpu.withRules - cpu.without) * cfg.interval.Seconds()
		sum.cpuPerCycle = perCycle
		cpuCol = fmt.Sprintf("%s (%.2f of %.2f cores)", ms(perCycle), cpu.withRules-cpu.without, cpu.withRules)
		cpuNode = strconv.FormatFloat(perCycle*1e6/float64(cfg.nodes), 'f', 0, 64) + " µs"
		allocCol = fmt.Sprintf("%.0f MB", (cpu.allocWithRules-cpu.allocWithout)*cfg.interval.Seconds()/1e6)
	}
	fmt.Fprintf(out, "\nRule evaluation per cycle: the sum over groups of each group's median evaluation time, times %s over its interval; \"every group at once\": the plain sum, a cycle in which every group evaluates. Rule allocation: the bytes Prometheus allocates per cycle with the rules less without them (go_memstats_alloc_bytes_total); steadier than the CPU between runs of one file, though it also moves with what the server does besides the rules.\n", cfg.interval)
	fmt.Fprintf(out, "\n| nodes | head series | rule evaluation per cycle | per node | every group at once | rule CPU per cycle | CPU per node | rule allocation per cycle |\n|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(out, "| %d | %d | %s | %s µs | %s | %s | %s | %s |\n", cfg.nodes, head, ms(total),
		strconv.FormatFloat(total*1e6/float64(cfg.nodes), 'f', 0, 64), ms(allAtOnce), cpuCol, cpuNode, allocCol)
	if len(cpu.windows) > 1 {
		// Each window from the end of a garbage collection to the end of
		// another (gcWindow), so each holds whole collections.
		fmt.Fprintf(out, "\nCPU windows, in the order measured (each from the end of a garbage collection of the server to the end of another):\n\n| window | rules | length | collections | CPU | allocation per cycle | bounded by collections |\n|---|---|---|---|---|---|---|\n")
		for i, w := range cpu.windows {
			rules, aligned := "without", "yes"
			if w.withRules {
				rules = "with"
			}
			if !w.aligned {
				aligned = "no (none within the window's length)"
			}
			fmt.Fprintf(out, "| %d | %s | %.0f s | %d | %.3f cores | %.0f MB | %s |\n", i+1, rules, w.secs, w.gcs, w.cpu/w.secs, w.alloc/w.secs*cfg.interval.Seconds()/1e6, aligned)
		}
	}
	if len(cpu.rounds) > 1 {
		// The pooled figure above, and each pair of windows on its own:
		// their spread is the measurement's noise.
		fmt.Fprintf(out, "\nRule CPU and allocation per cycle of each pair of windows (with the rules less without, in the order measured; the figures above pool every window):\n\n| round | rule CPU per cycle | rule allocation per cycle |\n|---|---|---|\n")
		for i, r := range cpu.rounds {
			fmt.Fprintf(out, "| %d | %s (%.1f%%) | %.0f MB |\n", i+1, ms(r.cores*cfg.interval.Seconds()), 100*r.cores, r.alloc*cfg.interval.Seconds()/1e6)
		}
	}
	return sum
}
