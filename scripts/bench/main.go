// Command bench is the load half of `make bench`: it starts a built
// gpu-pool-exporter-sim binary (the agent on a simulated node), scrapes it over loopback and
// prints one markdown table with a row per node:
//
//   - scrape latency p50/p99, sequential (one client) / concurrent;
//   - the same for the same bytes served by a static Go handler of this
//     program, run as a child process so that, like the exporter, it has a
//     process of its own (the floor any /metrics handler can reach), and
//     the ratio;
//   - the exporter's CPU time per scrape and per sample, from
//     /proc/PID/stat (utime+stime): an idle period with no scrapes gives the
//     CPU per sample, a scrape burst less the idle share gives the CPU per
//     scrape;
//   - its RSS (VmRSS, max over the run), and bytes and series per scrape;
//
// and then, on the built-in node, hostile-client runs (hardening.go,
// attacks.go, stalls.go): peak RSS under -slow-conns slowloris connections
// (failing above -mem-limit-mib) with a scraper beside them; a scraper's
// latency beside -flood-clients clients sending wrong passwords from one
// address; and, each for -attack-for, with a well-behaved client beside
// them: -body-conns clients sending request bodies a byte a second to
// /metrics, -probe-conns doing so to the probe port while a prober polls it
// (these fail when a scrape or probe is lost); -auth-clients clients sending
// wrong passwords from -auth-addrs addresses beside a logged-in scraper and
// one that logs in for the first time; -h2-conns TLS HTTP/2 connections
// holding -h2-streams streams each at flow-control window 0, with basic auth
// and without credentials (h2-auth) and with TLS alone (h2-tls);
// -probe-pipeline-conns connections pipelining /healthz to the probe port
// and never reading; and -slow-readers connections pipelining /metrics and
// reading a trickle. These fail when the well-behaved client gets less than
// 95% answered, a first login takes 2 s or more, or (h2-auth, h2-tls,
// slow-readers) the RSS passes -mem-limit-mib. Then the attacker's own
// choices (mixed.go), each with every -gomemlimit value: the mixed attack,
// a stolen password, the attacker on the prober's or the scraper's
// address, and a 10-minute soak of every attack at once with GPU faults,
// recording peak RSS, RSS after, the sockets' send queues (ss -tm) and the
// load average. -runs chooses which parts run.
//
// Usage:
//
//	bench -bin ./gpu-pool-exporter -node default= -node mig-8x7-200pods=scripts/bench/mig-8x7-200pods.yaml
//
// Linux only (/proc). Loopback only.
package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type nodeFlag []struct{ name, scenario string }

func (n *nodeFlag) String() string { return fmt.Sprint(*n) }

func (n *nodeFlag) Set(v string) error {
	name, sc, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return errors.New("want NAME=SCENARIO_FILE (an empty file is the built-in node)")
	}
	*n = append(*n, struct{ name, scenario string }{name, sc})
	return nil
}

type config struct {
	bin         string
	interval    time.Duration
	idleSamples int
	seqScrapes  int
	conScrapes  int
	concurrency int

	slowConns     int
	slowFor       time.Duration
	memLimit      int64
	floodClients  int
	floodFor      time.Duration
	floodTLS      bool
	skipHardening bool

	attackFor          time.Duration
	bodyConns          int
	probeConns         int
	authAddrs          int
	authClients        int
	h2Conns            int
	h2Streams          int
	probePipeConns     int
	probePipeRequests  int
	slowReaders        int
	slowReaderRequests int

	goMemLimits      []string // each run of mixed.go once per value ("": none)
	goMemLimit       string   // the exporter's GOMEMLIMIT in the run under way ("": none)
	mixedFor         time.Duration
	stolenConns      int
	sharedProbeConns int
	soakFor          time.Duration
	minShare         float64
	settleFor        time.Duration
	profileDir       string // the exporter's heap profiles of the runs of mixed.go go here ("": none)
	runs             map[string]bool
}

// benchRuns are the parts of the bench, in the order they run.
var benchRuns = []string{"load", "slow-conns", "auth-flood", "slow-body", "probe-port", "auth-addrs", "h2-auth", "h2-tls", "probe-pipeline", "slow-readers",
	"mixed", "stolen-password", "shared-probe", "shared-scraper", "soak"}

// extraRuns run only when -runs names them: what the server is known not
// to hold, measured to show how far it is from holding it
// (docs/performance.md, "The attacker's choices").
var extraRuns = []string{"shared-scraper-cold"}

// result is one table row.
type result struct {
	name                    string
	seqP50, seqP99          time.Duration
	conP50, conP99          time.Duration
	statSeqP50, statSeqP99  time.Duration
	statConP50, statConP99  time.Duration
	cpuPerScrape            time.Duration
	cpuPerSample            time.Duration
	rssMax                  int64
	plainBytes, gzipBytes   int
	series                  int
	samplesIdle, scrapesAll int
}

func main() {
	var nodes nodeFlag
	cfg := config{}
	flag.StringVar(&cfg.bin, "bin", "./gpu-pool-exporter-sim", "the gpu-pool-exporter-sim binary (the agent on a simulated node)")
	flag.Var(&nodes, "node", "NAME=SCENARIO_FILE of a node to measure (repeatable; an empty file is the built-in 8-GPU node)")
	flag.DurationVar(&cfg.interval, "collect-interval", time.Second, "the exporter's --collect-interval")
	flag.IntVar(&cfg.idleSamples, "idle-samples", 15, "samples in the idle period (no scrapes) that gives the CPU per sample")
	flag.IntVar(&cfg.seqScrapes, "scrapes", 3000, "sequential scrapes (one client, one after another)")
	flag.IntVar(&cfg.conScrapes, "concurrent-scrapes", 6000, "scrapes in the concurrent burst")
	flag.IntVar(&cfg.concurrency, "concurrency", 16, "clients in the concurrent burst")
	flag.IntVar(&cfg.slowConns, "slow-conns", 8000, "slow connections (slowloris, reopened when closed) in the connection-cap run")
	flag.DurationVar(&cfg.slowFor, "slow-for", 15*time.Second, "how long the slow connections are held")
	flag.Int64Var(&cfg.memLimit, "mem-limit-mib", 100, "the chart's memory limit: the slow-connection run fails above it")
	flag.IntVar(&cfg.floodClients, "flood-clients", 128, "clients sending wrong passwords in the auth-flood run")
	flag.DurationVar(&cfg.floodFor, "flood-for", 10*time.Second, "how long the wrong-password flood lasts")
	flag.BoolVar(&cfg.floodTLS, "flood-tls", false, "run the wrong-password flood (auth-flood) over TLS")
	flag.BoolVar(&cfg.skipHardening, "skip-hardening", false, "skip the hostile-client runs (all but load)")
	flag.DurationVar(&cfg.attackFor, "attack-for", 10*time.Second, "how long each of the slow-body, probe-port, auth-addrs, h2-auth, h2-tls, probe-pipeline and slow-readers runs lasts")
	flag.IntVar(&cfg.bodyConns, "body-conns", 40, "clients sending GET /metrics with a body at a byte a second in the slow-body run")
	flag.IntVar(&cfg.probeConns, "probe-conns", 40, "clients sending POST /healthz with a body at a byte a second to the probe port in the probe-port run")
	flag.IntVar(&cfg.authAddrs, "auth-addrs", 60000, "loopback addresses (in 250 /16 networks of 127.0.0.0/8) the wrong passwords come from in the auth-addrs run, each request from the next")
	flag.IntVar(&cfg.authClients, "auth-clients", 400, "clients sending wrong passwords in the auth-addrs run")
	flag.IntVar(&cfg.h2Conns, "h2-conns", 300, "TLS HTTP/2 connections holding streams at window 0 in the h2-auth and h2-tls runs")
	flag.IntVar(&cfg.h2Streams, "h2-streams", 8, "streams each of them keeps open")
	flag.IntVar(&cfg.probePipeConns, "probe-pipeline-conns", 32, "connections pipelining /healthz to the probe port, never reading, in the probe-pipeline run")
	flag.IntVar(&cfg.probePipeRequests, "probe-pipeline-requests", 40000, "requests each of them pipelines")
	flag.IntVar(&cfg.slowReaders, "slow-readers", 300, "connections pipelining /metrics and reading 1 KiB every 100 ms in the slow-readers run")
	flag.IntVar(&cfg.slowReaderRequests, "slow-reader-requests", 300, "requests each of them pipelines")
	memLimits := flag.String("gomemlimit", "100MiB,off", "comma-separated GOMEMLIMIT values (off: none) the mixed, stolen-password, shared-probe, shared-scraper and soak runs each run with (the chart sets 100MiB)")
	flag.DurationVar(&cfg.mixedFor, "mixed-for", 30*time.Second, "how long the mixed run's attacks last")
	flag.IntVar(&cfg.stolenConns, "stolen-conns", 72, "HTTP/2 connections logged in with the scraper's own password, each holding -h2-streams streams at window 0, in the stolen-password and soak runs")
	flag.IntVar(&cfg.sharedProbeConns, "shared-probe-conns", 100, "connections sending headers a line a second to the probe port from the prober's own address in the shared-probe and soak runs")
	flag.DurationVar(&cfg.soakFor, "soak-for", 10*time.Minute, "how long the soak run's attacks last")
	flag.Float64Var(&cfg.minShare, "min-share", 0.90, "the share of requests the well-behaved clients of the mixed, stolen-password, shared-probe, shared-scraper and soak runs must get answered")
	flag.DurationVar(&cfg.settleFor, "settle-for", 30*time.Second, "how long after the attacks of the mixed, stolen-password, shared-probe, shared-scraper and soak runs the exporter's RSS is read again")
	flag.StringVar(&cfg.profileDir, "profile-dir", "", "write the exporter's heap profiles and goroutines, near the end of each attack of the mixed, stolen-password, shared-probe, shared-scraper and soak runs and after it, into this folder (the exporter then runs with --web.enable-pprof)")
	runs := flag.String("runs", strings.Join(benchRuns, ","), "comma-separated parts to run: "+strings.Join(benchRuns, ", ")+"; named only: "+strings.Join(extraRuns, ", "))
	serve := flag.String("serve-static", "", "internal: serve this file's bytes at -listen (the static floor)")
	listen := flag.String("listen", "", "internal: address for -serve-static")
	flag.Parse()
	if *serve != "" {
		fatalf("static server: %v", serveStatic(*serve, *listen))
	}
	for _, v := range strings.Split(*memLimits, ",") {
		switch v = strings.TrimSpace(v); v {
		case "":
		case "off":
			cfg.goMemLimits = append(cfg.goMemLimits, "")
		default:
			cfg.goMemLimits = append(cfg.goMemLimits, v)
		}
	}
	if len(cfg.goMemLimits) == 0 {
		cfg.goMemLimits = []string{""}
	}
	cfg.runs = map[string]bool{}
	for _, r := range strings.Split(*runs, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		if !slices.Contains(benchRuns, r) && !slices.Contains(extraRuns, r) {
			fatalf("-runs: unknown run %q; the runs are %s, and (named only) %s", r, strings.Join(benchRuns, ", "), strings.Join(extraRuns, ", "))
		}
		cfg.runs[r] = true
	}
	if cfg.skipHardening {
		cfg.runs = map[string]bool{"load": cfg.runs["load"]}
	}
	if len(nodes) == 0 {
		_ = nodes.Set("default=")
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		fatalf("bench needs Linux's /proc: %v", err)
	}
	if cfg.runs["load"] {
		var rows []result
		for _, n := range nodes {
			fmt.Fprintf(os.Stderr, "bench: node %s ...\n", n.name)
			r, err := measure(cfg, n.name, n.scenario)
			if err != nil {
				fatalf("node %s: %v", n.name, err)
			}
			rows = append(rows, r)
		}
		printTable(os.Stdout, cfg, rows)
	}
	if fails := hostile(os.Stdout, cfg); len(fails) > 0 {
		for _, f := range fails {
			fmt.Fprintf(os.Stderr, "bench: FAIL: %s\n", f)
		}
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(1)
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// procCPU is the process's user+system CPU time from /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields after ")" are plain.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bad utime/stime in /proc/%d/stat", pid)
	}
	// USER_HZ is 100 on every Linux this runs on (sysconf(_SC_CLK_TCK)).
	return time.Duration(ut+st) * (time.Second / 100), nil
}

// procRSS is VmRSS in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmRSS")
}

func measure(cfg config, name, scenario string) (result, error) {
	r := result{name: name}
	addr, err := freePort()
	if err != nil {
		return r, err
	}
	args := []string{"--web.listen-address=" + addr, "--collect-interval=" + cfg.interval.String(),
		"--log.level=warn"}
	if scenario != "" {
		abs, err := filepath.Abs(scenario)
		if err != nil {
			return r, err
		}
		args = append(args, "--simulate.scenario="+abs)
	}
	var logs bytes.Buffer
	cmd := exec.Command(cfg.bin, args...)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return r, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	pid := cmd.Process.Pid

	// RSS, polled over the whole run.
	rssCtx, rssStop := context.WithCancel(context.Background())
	var rssMu sync.Mutex
	var rssWG sync.WaitGroup
	rssWG.Add(1)
	go func() {
		defer rssWG.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := procRSS(pid); err == nil {
				rssMu.Lock()
				r.rssMax = max(r.rssMax, v)
				rssMu.Unlock()
			}
			select {
			case <-rssCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	defer func() { rssStop(); rssWG.Wait() }()

	base := "http://" + addr
	client := newClient(cfg.concurrency)
	defer client.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get(base + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		select {
		case err := <-exited:
			exited <- err
			return r, fmt.Errorf("the exporter exited (%v):\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("/readyz not 200 within 30s:\n%s", logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Let the kubelet view and DCGM fill in before measuring.
	time.Sleep(3 * cfg.interval)

	// The page: bytes and series, plain and gzip.
	plain, err := get(client, base+"/metrics", false)
	if err != nil {
		return r, err
	}
	gz, err := get(client, base+"/metrics", true)
	if err != nil {
		return r, err
	}
	r.plainBytes, r.gzipBytes = len(plain), len(gz)
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return r, err
	}
	if _, err := io.Copy(io.Discard, zr); err != nil {
		return r, fmt.Errorf("gzip body: %v", err)
	}
	for _, line := range strings.Split(string(plain), "\n") {
		if line != "" && !strings.HasPrefix(line, "#") {
			r.series++
		}
	}

	// Idle: K samples, no scrapes.
	c0, err := procCPU(pid)
	if err != nil {
		return r, err
	}
	t0 := time.Now()
	time.Sleep(time.Duration(cfg.idleSamples) * cfg.interval)
	c1, err := procCPU(pid)
	if err != nil {
		return r, err
	}
	idleWall := time.Since(t0)
	samples := idleWall.Seconds() / cfg.interval.Seconds()
	r.samplesIdle = int(samples + 0.5)
	r.cpuPerSample = time.Duration(float64(c1-c0) / samples)
	idleRate := float64(c1-c0) / float64(idleWall) // CPU seconds per second with no scrapes

	// Scrape bursts against the exporter.
	c2, _ := procCPU(pid)
	t2 := time.Now()
	seq, err := burst(client, base+"/metrics", cfg.seqScrapes, 1, len(plain))
	if err != nil {
		return r, err
	}
	con, err := burst(client, base+"/metrics", cfg.conScrapes, cfg.concurrency, 0)
	if err != nil {
		return r, err
	}
	c3, _ := procCPU(pid)
	burstWall := time.Since(t2)
	r.scrapesAll = cfg.seqScrapes + cfg.conScrapes
	scrapeCPU := float64(c3-c2) - idleRate*float64(burstWall)
	r.cpuPerScrape = time.Duration(max(0, scrapeCPU) / float64(r.scrapesAll))
	r.seqP50, r.seqP99 = pct(seq, 50), pct(seq, 99)
	r.conP50, r.conP99 = pct(con, 50), pct(con, 99)

	// The floor: the same bytes from a static handler on loopback.
	sseq, scon, err := static(cfg, plain)
	if err != nil {
		return r, err
	}
	r.statSeqP50, r.statSeqP99 = pct(sseq, 50), pct(sseq, 99)
	r.statConP50, r.statConP99 = pct(scon, 50), pct(scon, 99)

	rssStop()
	rssWG.Wait()
	return r, nil
}

func newClient(conns int) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableCompression: true, MaxIdleConns: conns * 2, MaxIdleConnsPerHost: conns * 2,
	}}
}

func get(c *http.Client, url string, gz bool) ([]byte, error) {
	req, _ := http.NewRequest("GET", url, nil)
	if gz {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	if gz && resp.Header.Get("Content-Encoding") != "gzip" {
		return nil, fmt.Errorf("%s: asked for gzip, got %q", url, resp.Header.Get("Content-Encoding"))
	}
	return b, nil
}

// burst runs n plain GETs over conc clients and returns each one's latency
// (request sent to last body byte read). wantLen > 0 checks the length.
func burst(c *http.Client, url string, n, conc int, wantLen int) ([]time.Duration, error) {
	lat := make([]time.Duration, n)
	var next sync.Mutex
	i := 0
	var firstErr error
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64<<10)
			for {
				next.Lock()
				if i >= n || firstErr != nil {
					next.Unlock()
					return
				}
				k := i
				i++
				next.Unlock()
				start := time.Now()
				resp, err := c.Get(url)
				if err == nil {
					var got int64
					got, err = io.CopyBuffer(io.Discard, resp.Body, buf)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
					if err == nil && wantLen > 0 && got < int64(wantLen)/2 {
						err = fmt.Errorf("short body: %d bytes", got)
					}
				}
				lat[k] = time.Since(start)
				if err != nil {
					next.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("%s: %v", url, err)
					}
					next.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return lat, firstErr
}

// static serves body from a static handler in a child process (this
// program again, with -serve-static), so that it runs, like the exporter, in
// a process of its own, and measures it like the exporter.
func static(cfg config, body []byte) (seq, con []time.Duration, err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "bench-static")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "metrics.txt")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		return nil, nil, err
	}
	addr, err := freePort()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(self, "-serve-static="+file, "-listen="+addr)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	c := newClient(cfg.concurrency)
	defer c.CloseIdleConnections()
	url := "http://" + addr + "/metrics"
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := get(c, url, false); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return nil, nil, fmt.Errorf("the static server did not answer within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if seq, err = burst(c, url, cfg.seqScrapes, 1, len(body)); err != nil {
		return nil, nil, err
	}
	con, err = burst(c, url, cfg.conScrapes, cfg.concurrency, 0)
	return seq, con, err
}

// serveStatic is the child of static: it serves file's bytes with the
// headers any /metrics handler sends, until killed.
func serveStatic(file, addr string) error {
	body, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	length := []string{strconv.Itoa(len(body))}
	ct := []string{"text/plain; version=0.0.4; charset=utf-8; escaping=underscores"}
	srv := &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		h := w.Header()
		h["Content-Type"] = ct
		h["Content-Length"] = length
		_, _ = w.Write(body)
	})}
	return srv.ListenAndServe()
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := int(float64(len(s)-1) * p / 100)
	return s[k]
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 3, 64) }

func us(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 0, 64) }

func printTable(w io.Writer, cfg config, rows []result) {
	fmt.Fprintf(w, "\nLoopback scrapes of /metrics, plain text; latency in ms as sequential / %d concurrent clients;\n", cfg.concurrency)
	fmt.Fprintf(w, "static = the same bytes from a static Go handler; ratio = exporter / static at p50 and p99 (sequential).\n")
	fmt.Fprintf(w, "--collect-interval=%s; CPU/sample from %d idle samples; CPU/scrape over %d scrapes less the idle share.\n\n",
		cfg.interval, cfg.idleSamples, cfg.seqScrapes+cfg.conScrapes)
	fmt.Fprintln(w, "| node | scrape p50 | scrape p99 | static p50 | static p99 | ratio p50 / p99 | CPU/scrape | CPU/sample | RSS max | bytes plain / gzip | series |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		ratio := func(a, b time.Duration) string {
			if b <= 0 {
				return "-"
			}
			return strconv.FormatFloat(float64(a)/float64(b), 'f', 2, 64)
		}
		fmt.Fprintf(w, "| %s | %s / %s | %s / %s | %s / %s | %s / %s | %s / %s | %s µs | %s ms | %.1f MiB | %d / %d | %d |\n",
			r.name,
			ms(r.seqP50), ms(r.conP50), ms(r.seqP99), ms(r.conP99),
			ms(r.statSeqP50), ms(r.statConP50), ms(r.statSeqP99), ms(r.statConP99),
			ratio(r.seqP50, r.statSeqP50), ratio(r.seqP99, r.statSeqP99),
			us(r.cpuPerScrape), ms(r.cpuPerSample), float64(r.rssMax)/(1<<20),
			r.plainBytes, r.gzipBytes, r.series)
	}
}
