package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// exporterProc is a started exporter binary.
type exporterProc struct {
	cmd    *exec.Cmd
	addr   string
	logs   bytes.Buffer
	exited chan error
}

// startExporter starts the binary on a free port with args and waits until
// the request ready makes (given the address) is answered 200, over
// transport (nil: the default one).
func startExporter(cfg config, args []string, ready func(addr string) (*http.Request, error), transport *http.Transport) (*exporterProc, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &exporterProc{addr: addr, exited: make(chan error, 1)}
	p.cmd = exec.Command(cfg.bin, append([]string{"--web.listen-address=" + addr,
		"--collect-interval=" + cfg.interval.String(), "--log.level=warn"}, append(args, pprofArgs(cfg)...)...)...)
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	if cfg.goMemLimit != "" {
		p.cmd.Env = append(os.Environ(), "GOMEMLIMIT="+cfg.goMemLimit)
	}
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.exited <- p.cmd.Wait() }()
	c := &http.Client{Timeout: 2 * time.Second}
	if transport != nil {
		c.Transport = transport
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := ready(addr)
		if err != nil {
			p.stop()
			return nil, err
		}
		if resp, err := c.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p, nil
			}
		}
		select {
		case err := <-p.exited:
			p.exited <- err
			return nil, fmt.Errorf("the exporter exited (%v):\n%s", err, p.logs.String())
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("not ready within 30s:\n%s", p.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *exporterProc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// pollRSS records the process's peak RSS until ctx is done.
func pollRSS(ctx context.Context, pid int, peak *atomic.Int64) {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if v, err := procRSS(pid); err == nil && v > peak.Load() {
			peak.Store(v)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type slowResult struct {
	conns, reopened       int64
	rssIdle, rssMax       int64
	scrapes, scrapeFailed int
	scrapeP50, scrapeMax  time.Duration
}

// measureSlowConns holds cfg.slowConns slowloris connections (a request
// whose headers never end, a line a second, reopened whenever the server
// closes it) from 127.0.0.1 against the exporter and records its peak RSS,
// while one client from 127.0.0.2 scrapes once a second.
func measureSlowConns(cfg config) (slowResult, error) {
	var r slowResult
	raiseFileLimit()
	p, err := startExporter(cfg, nil, func(addr string) (*http.Request, error) { return http.NewRequest("GET", "http://"+addr+"/readyz", nil) }, nil)
	if err != nil {
		return r, err
	}
	defer p.stop()
	time.Sleep(3 * cfg.interval)
	r.rssIdle, _ = procRSS(p.cmd.Process.Pid)
	ctx, cancel := context.WithTimeout(context.Background(), cfg.slowFor)
	defer cancel()
	var peak atomic.Int64
	rssDone := make(chan struct{})
	go func() { defer close(rssDone); pollRSS(ctx, p.cmd.Process.Pid, &peak) }()

	var open, reopened atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < cfg.slowConns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := true; ctx.Err() == nil; first = false {
				d := net.Dialer{Timeout: 3 * time.Second}
				c, err := d.DialContext(ctx, "tcp", p.addr)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				if first {
					open.Add(1)
				} else {
					reopened.Add(1)
				}
				go func() { <-ctx.Done(); c.Close() }()
				if _, err := c.Write([]byte("GET /metrics HTTP/1.1\r\nHost: bench\r\n")); err != nil {
					c.Close()
					continue
				}
				for ctx.Err() == nil {
					time.Sleep(time.Second)
					if _, err := c.Write([]byte("X-Slow: 1\r\n")); err != nil {
						break
					}
				}
				c.Close()
			}
		}()
	}
	// One scrape a second beside them.
	// The scraper comes from an address of its own (127.0.0.2), as
	// Prometheus comes from another host than an attacker.
	scraperDialer := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	client := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: scraperDialer.DialContext}}
	var lat []time.Duration
	time.Sleep(time.Second)
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := client.Get("http://" + p.addr + "/metrics")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				lat = append(lat, time.Since(start))
			} else {
				r.scrapeFailed++
			}
		} else if ctx.Err() == nil {
			r.scrapeFailed++
		}
		time.Sleep(time.Second)
	}
	wg.Wait()
	<-rssDone
	r.conns, r.reopened, r.rssMax = open.Load(), reopened.Load(), peak.Load()
	r.scrapes = len(lat)
	r.scrapeP50, r.scrapeMax = pct(lat, 50), pct(lat, 100)
	return r, nil
}

func raiseFileLimit() {
	var l syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l) == nil && l.Cur < l.Max {
		l.Cur = l.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	}
}

type floodResult struct {
	clients                  int
	before, during           []time.Duration
	floodRequests, refused   int64
	unauthorized, floodError int64
	cpuPerRequest            time.Duration // the exporter's CPU per flood request
}

// measureAuthFlood runs the exporter with basic auth (bcrypt cost 10; with
// -flood-tls, over TLS) and measures a scraper's latency alone, then beside
// cfg.floodClients clients sending unique wrong passwords.
func measureAuthFlood(cfg config) (floodResult, error) {
	r := floodResult{clients: cfg.floodClients}
	dir, err := os.MkdirTemp("", "bench-auth")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("bench-secret"), bcrypt.DefaultCost)
	if err != nil {
		return r, err
	}
	web, scheme, transport := "basic_auth_users:\n  prometheus: "+string(hash)+"\n", "http", func() *http.Transport { return &http.Transport{} }
	if cfg.floodTLS {
		certFile, keyFile, pool, err := tlsFiles(dir)
		if err != nil {
			return r, err
		}
		web += "tls_server_config:\n  cert_file: " + certFile + "\n  key_file: " + keyFile + "\n"
		scheme = "https"
		transport = func() *http.Transport { return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}} }
	}
	webCfg := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webCfg, []byte(web), 0o600); err != nil {
		return r, err
	}
	authed := func(addr string) (*http.Request, error) {
		req, err := http.NewRequest("GET", scheme+"://"+addr+"/metrics", nil)
		if err == nil {
			req.SetBasicAuth("prometheus", "bench-secret")
		}
		return req, err
	}
	p, err := startExporter(cfg, []string{"--web.config.file=" + webCfg}, authed, transport())
	if err != nil {
		return r, err
	}
	defer p.stop()
	scraper := &http.Client{Timeout: 30 * time.Second, Transport: transport()}
	scrape := func() (time.Duration, error) {
		req, _ := authed(p.addr)
		start := time.Now()
		resp, err := scraper.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("scraper got %d", resp.StatusCode)
		}
		return time.Since(start), nil
	}
	for i := 0; i < 50; i++ {
		d, err := scrape()
		if err != nil {
			return r, err
		}
		r.before = append(r.before, d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.floodFor)
	defer cancel()
	var wg sync.WaitGroup
	var wrong wrongPasswords
	cpu0, _ := procCPU(p.cmd.Process.Pid)
	for w := 0; w < cfg.floodClients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wrong.send(ctx, &http.Client{Timeout: 30 * time.Second, Transport: transport()}, scheme+"://"+p.addr, w)
		}()
	}
	time.Sleep(500 * time.Millisecond)
	for ctx.Err() == nil {
		d, err := scrape()
		if err != nil {
			cancel()
			wg.Wait()
			return r, err
		}
		r.during = append(r.during, d)
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	cpu1, _ := procCPU(p.cmd.Process.Pid)
	r.floodRequests, r.refused, r.unauthorized, r.floodError = wrong.requests.Load(), wrong.throttled.Load(), wrong.unauthorized.Load(), wrong.errs.Load()
	if r.floodRequests > 0 {
		r.cpuPerRequest = (cpu1 - cpu0) / time.Duration(r.floodRequests)
	}
	return r, nil
}

// hostile runs the hostile-client runs chosen by cfg.runs, prints their
// table and returns what failed: RSS above the limit, a scrape or probe
// lost beside an attack.
func hostile(w io.Writer, cfg config) (fails []string) {
	var rows [][2]string
	row := func(run, figure string) { rows = append(rows, [2]string{run, figure}) }
	if cfg.runs["slow-conns"] {
		fmt.Fprintf(os.Stderr, "bench: %d slow connections ...\n", cfg.slowConns)
		s, err := measureSlowConns(cfg)
		if err != nil {
			fatalf("slow connections: %v", err)
		}
		row(fmt.Sprintf("%d slow connections for %s (%d opened, %d reopened)", cfg.slowConns, cfg.slowFor, s.conns, s.reopened),
			fmt.Sprintf("RSS %.1f MiB idle, %.1f MiB max (limit %d MiB); scrapes beside them p50 %s ms, max %s ms, %d ok, %d failed",
				float64(s.rssIdle)/(1<<20), float64(s.rssMax)/(1<<20), cfg.memLimit, ms(s.scrapeP50), ms(s.scrapeMax), s.scrapes, s.scrapeFailed))
		if s.rssMax > cfg.memLimit<<20 {
			fails = append(fails, fmt.Sprintf("RSS %.1f MiB under %d slow connections is above the %d MiB limit", float64(s.rssMax)/(1<<20), cfg.slowConns, cfg.memLimit))
		}
	}
	if cfg.runs["auth-flood"] {
		fmt.Fprintf(os.Stderr, "bench: wrong-password flood ...\n")
		f, err := measureAuthFlood(cfg)
		if err != nil {
			fatalf("auth flood: %v", err)
		}
		over := ""
		if cfg.floodTLS {
			over = ", over TLS"
		}
		row(fmt.Sprintf("%d clients sending wrong passwords for %s (bcrypt cost 10%s)", f.clients, cfg.floodFor, over),
			fmt.Sprintf("scraper p50/p99 %s / %s ms alone, %s / %s ms beside the flood; %d flood requests, %d refused before bcrypt (429), %d checked (401); exporter CPU %s µs per flood request",
				ms(pct(f.before, 50)), ms(pct(f.before, 99)), ms(pct(f.during, 50)), ms(pct(f.during, 99)), f.floodRequests, f.refused, f.unauthorized, us(f.cpuPerRequest)))
	}
	if cfg.runs["slow-body"] {
		fmt.Fprintf(os.Stderr, "bench: %d slow request bodies ...\n", cfg.bodyConns)
		b, err := measureSlowBodies(cfg)
		if err != nil {
			fatalf("slow bodies: %v", err)
		}
		row(fmt.Sprintf("%d clients sending `GET /metrics` with a 200 KB body at 1 byte/s for %s (reconnecting 1 s after each answer)", cfg.bodyConns, cfg.attackFor),
			fmt.Sprintf("%s; a scraper every 100 ms beside them: %s", b.bodies, b.scraper))
		if n := b.scraper.failed(); n > 0 {
			fails = append(fails, fmt.Sprintf("%d of %d scrapes lost beside %d slow request bodies", n, n+len(b.scraper.lat), cfg.bodyConns))
		}
	}
	if cfg.runs["probe-port"] {
		fmt.Fprintf(os.Stderr, "bench: %d slow bodies on the probe port ...\n", cfg.probeConns)
		p, err := measureProbePort(cfg)
		if err != nil {
			fatalf("probe port: %v", err)
		}
		row(fmt.Sprintf("%d clients sending `POST /healthz` with a 200 KB body at 1 byte/s to the probe port for %s", cfg.probeConns, cfg.attackFor),
			fmt.Sprintf("%s; a prober every 100 ms (new connection, 1 s timeout): /healthz %s; /readyz %s; a scraper on the web port every 100 ms: %s",
				p.bodies, p.healthz, p.readyz, p.scraper))
		for _, x := range []struct {
			what string
			s    *clientStats
		}{{"/healthz probes", p.healthz}, {"/readyz probes", p.readyz}, {"scrapes", p.scraper}} {
			if n := x.s.failed(); n > 0 {
				fails = append(fails, fmt.Sprintf("%d of %d %s lost beside %d slow bodies on the probe port", n, n+len(x.s.lat), x.what, cfg.probeConns))
			}
		}
	}
	if cfg.runs["auth-addrs"] {
		fmt.Fprintf(os.Stderr, "bench: wrong passwords from %d addresses ...\n", cfg.authAddrs)
		a, err := measureManyAddrAuth(cfg)
		if err != nil {
			fatalf("wrong passwords from many addresses: %v", err)
		}
		row(fmt.Sprintf("%d clients sending wrong passwords from %d addresses for %s (bcrypt cost 10), each request from the next address", a.clients, a.addrs, cfg.attackFor),
			fmt.Sprintf("%d requests: %d checked (401), %d refused before bcrypt (429), %d refused with bcrypt busy (503), %d unanswered; exporter CPU %.2f cores; "+
				"a scraper logged in before, every 100 ms: %s; a scraper logging in for the first time, every 1 s: %s",
				a.requests, a.unauthorized, a.throttled, a.busy, a.errs, a.cpuCores, a.scraper, a.fresh))
		fails = append(fails, atLeast(a.scraper, "logged-in scrapes", fmt.Sprintf("wrong passwords from %d addresses", a.addrs))...)
		fails = append(fails, atLeast(a.fresh, "first logins", fmt.Sprintf("wrong passwords from %d addresses", a.addrs))...)
		if slowest := pct(a.fresh.lat, 100); slowest >= firstLoginLimit {
			fails = append(fails, fmt.Sprintf("a first login beside wrong passwords from %d addresses took %s ms, want under %s", a.addrs, ms(slowest), firstLoginLimit))
		}
	}
	for _, run := range []struct {
		name string
		auth bool
	}{{"h2-auth", true}, {"h2-tls", false}} {
		if !cfg.runs[run.name] {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s: %d HTTP/2 connections x %d streams at window 0 ...\n", run.name, cfg.h2Conns, cfg.h2Streams)
		h, err := measureH2Stall(cfg, run.auth)
		if err != nil {
			fatalf("%s: %v", run.name, err)
		}
		against, scraper := "TLS", "a scraper over HTTP/2"
		if run.auth {
			against, scraper = "TLS and basic auth, without credentials", "a scraper with the password, over HTTP/2"
		}
		row(fmt.Sprintf("%s: %d TLS HTTP/2 connections x %d streams for /metrics held at window 0, against %s, for %s", run.name, cfg.h2Conns, cfg.h2Streams, against, cfg.attackFor),
			fmt.Sprintf("%d connections, %d streams opened, %d answered, %d reset; exporter RSS %.1f MiB idle, %.1f MiB max (limit %d MiB); %s every 100 ms: %s",
				h.attack.conns.Load(), h.attack.streams.Load(), h.attack.ended.Load(), h.attack.resets.Load(),
				float64(h.rssIdle)/(1<<20), float64(h.rssMax)/(1<<20), cfg.memLimit, scraper, h.scraper))
		fails = append(fails, underLimit(cfg, h.rssMax, run.name)...)
		fails = append(fails, atLeast(h.scraper, "scrapes", run.name)...)
	}
	if cfg.runs["probe-pipeline"] {
		fmt.Fprintf(os.Stderr, "bench: %d connections pipelining to the probe port ...\n", cfg.probePipeConns)
		p, err := measureProbePipeline(cfg)
		if err != nil {
			fatalf("probe pipeline: %v", err)
		}
		row(fmt.Sprintf("%d connections pipelining %d `GET /healthz` each to the probe port, never reading, for %s", cfg.probePipeConns, cfg.probePipeRequests, cfg.attackFor),
			fmt.Sprintf("%d connections, %d requests sent; exporter RSS max %.1f MiB; a prober every 100 ms (new connection, 1 s timeout): /healthz %s; /readyz %s",
				p.attack.conns.Load(), p.attack.requests.Load(), float64(p.rssMax)/(1<<20), p.healthz, p.readyz))
		fails = append(fails, atLeast(p.healthz, "/healthz probes", "probe-pipeline")...)
		fails = append(fails, atLeast(p.readyz, "/readyz probes", "probe-pipeline")...)
	}
	if cfg.runs["slow-readers"] {
		fmt.Fprintf(os.Stderr, "bench: %d slow readers pipelining /metrics ...\n", cfg.slowReaders)
		s, err := measureSlowReaders(cfg)
		if err != nil {
			fatalf("slow readers: %v", err)
		}
		row(fmt.Sprintf("%d connections pipelining %d `GET /metrics` each, reading 1 KiB every 100 ms, for %s", cfg.slowReaders, cfg.slowReaderRequests, cfg.attackFor),
			fmt.Sprintf("%d connections, %d requests sent; exporter RSS max %.1f MiB; a scraper every 100 ms: %s",
				s.attack.conns.Load(), s.attack.requests.Load(), float64(s.rssMax)/(1<<20), s.scraper))
		fails = append(fails, underLimit(cfg, s.rssMax, "slow-readers")...)
		fails = append(fails, atLeast(s.scraper, "scrapes", "slow-readers")...)
	}
	fails = append(fails, attackersChoices(cfg, row)...)
	if len(rows) == 0 {
		return fails
	}
	fmt.Fprintf(w, "\nHostile clients (built gpu-pool-exporter-sim, loopback, default flags):\n\n")
	fmt.Fprintln(w, "| run | figure |")
	fmt.Fprintln(w, "|---|---|")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s |\n", r[0], r[1])
	}
	return fails
}

// Beside an attack that holds answers, a well-behaved client must get
// minAnswered of its requests answered; a first login must take under
// firstLoginLimit.
const (
	minAnswered     = 0.95
	firstLoginLimit = 2 * time.Second
)

// atLeast fails a run whose client got less than minAnswered answered.
func atLeast(s *clientStats, what, run string) []string {
	if n := len(s.lat) + s.failed(); n == 0 || answered(s) < minAnswered {
		return []string{fmt.Sprintf("%s: %d of %d %s answered, want at least %.0f%%", run, len(s.lat), n, what, 100*minAnswered)}
	}
	return nil
}

// underLimit fails a run whose exporter's RSS passed the memory limit.
func underLimit(cfg config, rss int64, run string) []string {
	if rss > cfg.memLimit<<20 {
		return []string{fmt.Sprintf("%s: RSS %.1f MiB, above the %d MiB limit", run, float64(rss)/(1<<20), cfg.memLimit)}
	}
	return nil
}

// wrongPasswords counts what clients logging in with wrong passwords got.
type wrongPasswords struct {
	requests, unauthorized, throttled, busy, errs atomic.Int64
}

// send logs in as prometheus at base (scheme://host:port) from c with a new wrong password each time
// (worker w's), until ctx ends; a failed request waits 100ms before the
// next, so that a refusing exporter is not met with a spin.
func (wp *wrongPasswords) send(ctx context.Context, c *http.Client, base string, w int) {
	for i := 0; ctx.Err() == nil; i++ {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/metrics", nil)
		req.SetBasicAuth("prometheus", fmt.Sprintf("wrong-%d-%d", w, i))
		resp, err := c.Do(req)
		if err != nil {
			if ctx.Err() == nil {
				wp.errs.Add(1)
				sleepCtx(ctx, 100*time.Millisecond)
			}
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		wp.requests.Add(1)
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			wp.unauthorized.Add(1)
		case http.StatusTooManyRequests:
			wp.throttled.Add(1)
		case http.StatusServiceUnavailable:
			wp.busy.Add(1)
		}
	}
}

// pprofArgs serves the profiler when -profile-dir asks for profiles.
func pprofArgs(cfg config) []string {
	if cfg.profileDir == "" {
		return nil
	}
	return []string{"--web.enable-pprof"}
}
