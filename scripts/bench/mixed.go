package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// The runs here are the attacker's choices rather than one attack beside a
// client on an address of its own: several attacks at once (mixed), a
// stolen password (stolen-password), an attacker on the prober's or the
// scraper's own address (shared-probe, shared-scraper), and every attack
// at once for minutes while the simulated node's GPUs fail (soak). Each
// runs once per -gomemlimit value (the chart sets GOMEMLIMIT=100MiB), and
// records the exporter's peak RSS and the kernel memory of its sockets'
// send queues besides what the well-behaved clients got.

// Addresses of the well-behaved clients (the attackers' are 127.0.0.1 and,
// for the password flood, floodAddress's).
const (
	scraperAddr    = "127.0.0.2" // a Prometheus that logged in before the attack
	proberAddr     = "127.0.0.3" // the kubelet
	newScraperAddr = "127.0.0.4" // a Prometheus logging in for the first time, as a new user each time
)

// benchPassword is the scraper's password, and the stolen one.
const benchPassword = "bench-secret"

// securedExporter is an exporter with TLS, basic auth (user prometheus and
// fresh-0..fresh-N-1, bcrypt cost 10) and a probe port.
type securedExporter struct {
	*exporterProc
	probe string
	pool  *x509.CertPool
	dir   string
	fresh int
}

// startSecured starts the exporter with TLS, basic auth (the scraper's
// user and fresh users for first logins) and a probe port, plus args.
func startSecured(cfg config, fresh int, args ...string) (*securedExporter, error) {
	dir, err := os.MkdirTemp("", "bench-mixed")
	if err != nil {
		return nil, err
	}
	certFile, keyFile, pool, err := tlsFiles(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	var web strings.Builder
	fmt.Fprintf(&web, "tls_server_config:\n  cert_file: %s\n  key_file: %s\nbasic_auth_users:\n", certFile, keyFile)
	for i := -1; i < fresh; i++ {
		name, pass := "prometheus", benchPassword
		if i >= 0 {
			name, pass = "fresh-"+strconv.Itoa(i), "fresh-secret-"+strconv.Itoa(i)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		fmt.Fprintf(&web, "  %s: %s\n", name, hash)
	}
	webFile := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webFile, []byte(web.String()), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	probe, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &securedExporter{probe: probe, pool: pool, dir: dir, fresh: fresh}
	// The scraper logs in before the attack, from its own address.
	ready := func(addr string) (*http.Request, error) {
		req, err := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		if err == nil {
			req.SetBasicAuth("prometheus", benchPassword)
		}
		return req, err
	}
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(scraperAddr)}}
	s.exporterProc, err = startExporter(cfg, append([]string{"--web.config.file=" + webFile, "--web.probe-address=" + probe}, args...), ready,
		&http.Transport{DialContext: d.DialContext, TLSClientConfig: &tls.Config{RootCAs: pool}})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// fetch fetches from the exporter with the scraper's password, from an
// address of its own.
func (s *securedExporter) fetch() func(path string) ([]byte, error) {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
	return fetcher(&http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: s.pool}}}, "https://"+s.addr, true)
}

func (s *securedExporter) stop() {
	s.exporterProc.stop()
	os.RemoveAll(s.dir)
}

// scraper is a Prometheus with the password over HTTP/2 from ip, keeping
// its connection between scrapes.
func (s *securedExporter) scraper(ip string) (*http.Client, func() *http.Request) {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: s.pool}, ForceAttemptHTTP2: true}}
	return c, func() *http.Request {
		req, _ := http.NewRequest("GET", "https://"+s.addr+"/metrics", nil)
		req.SetBasicAuth("prometheus", benchPassword)
		return req
	}
}

// firstLogins logs in every `every` from newScraperAddr on a new TLS
// connection, each time as the next fresh user (so that each runs bcrypt),
// until ctx ends.
func (s *securedExporter) firstLogins(ctx context.Context, every time.Duration) *clientStats {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(newScraperAddr)}}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: s.pool}, DisableKeepAlives: true}}
	n := 0
	return poll(ctx, c, every, func() *http.Request {
		i := n % s.fresh
		n++
		req, _ := http.NewRequest("GET", "https://"+s.addr+"/metrics", nil)
		req.SetBasicAuth("fresh-"+strconv.Itoa(i), "fresh-secret-"+strconv.Itoa(i))
		return req
	})
}

// prober asks /healthz and /readyz every 100 ms from ip, as the kubelet
// does (a new connection each, 1 s timeout), until ctx ends.
func prober(ctx context.Context, wg *sync.WaitGroup, ip, probeAddr string, healthz, readyz **clientStats) {
	c := clientFrom(ip, false, time.Second)
	for _, x := range []struct {
		path string
		out  **clientStats
	}{{"/healthz", healthz}, {"/readyz", readyz}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			*x.out = poll(ctx, c, 100*time.Millisecond, func() *http.Request {
				req, _ := http.NewRequest("GET", "http://"+probeAddr+x.path, nil)
				return req
			})
		}()
	}
}

// basicAuth is the Authorization header value of user:pass.
func basicAuth(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// memWatch is what a run watches of the exporter while it lasts: its peak
// RSS, and the peak over time of the memory the kernel holds in the send
// queues of the exporter's sockets (ss's skmem w, sk_wmem_queued: what
// cgroup v2 charges the pod for data the clients have not taken), summed
// over every socket whose local port is one of the exporter's.
type memWatch struct {
	rss, sendQueue, recvQueue atomic.Int64
}

// watchMemory records into m until ctx is done: RSS every 50 ms, the
// sockets' queues every 500 ms.
func watchMemory(ctx context.Context, pid int, ports []string, m *memWatch) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); pollRSS(ctx, pid, &m.rss) }()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if w, r, err := socketQueues(ports); err == nil {
			m.sendQueue.Store(max(m.sendQueue.Load(), w))
			m.recvQueue.Store(max(m.recvQueue.Load(), r))
		}
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
		}
	}
}

var skmem = regexp.MustCompile(`skmem:\(r(\d+),rb\d+,t\d+,tb\d+,f\d+,w(\d+),`)

// socketQueues sums, over the TCP sockets whose local port is one of
// ports, the kernel's send-queue memory (sk_wmem_queued) and receive-queue
// memory (sk_rmem_alloc), as `ss -tmn` shows them.
func socketQueues(ports []string) (send, recv int64, err error) {
	var filter []string
	for _, p := range ports {
		filter = append(filter, "sport = :"+p)
	}
	out, err := exec.Command("ss", "-tmnH", "state", "all", "( "+strings.Join(filter, " or ")+" )").Output()
	if err != nil {
		return 0, 0, fmt.Errorf("ss -tm: %w", err)
	}
	for _, m := range skmem.FindAllSubmatch(out, -1) {
		r, _ := strconv.ParseInt(string(m[1]), 10, 64)
		w, _ := strconv.ParseInt(string(m[2]), 10, 64)
		send += w
		recv += r
	}
	return send, recv, nil
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// memFigures is a run's memory: peak RSS, peak socket queues, and RSS
// once the attack has been over for settleFor.
type memFigures struct {
	rssIdle, rssMax, rssAfter int64
	sendMax, recvMax          int64
	settle                    time.Duration // how long after the attack rssAfter was read
}

func (m memFigures) String() string {
	return fmt.Sprintf("RSS %.1f MiB idle, %.1f MiB max, %.1f MiB %s after; socket send queues %.1f MiB max (receive %.1f MiB)",
		mib(m.rssIdle), mib(m.rssMax), mib(m.rssAfter), m.settle, mib(m.sendMax), mib(m.recvMax))
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// attackFor runs attack for d against the exporter p (probe port probe),
// and clients beside it from half a second in; it returns the memory
// figures, RSS after included (settleFor after the attack).
func attackFor(cfg config, name string, d time.Duration, p *exporterProc, probe string, fetch func(path string) ([]byte, error), attack, clients func(ctx context.Context)) memFigures {
	var m memFigures
	pid := p.cmd.Process.Pid
	m.rssIdle, _ = procRSS(pid)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var w memWatch
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); watchMemory(ctx, pid, []string{portOf(p.addr), portOf(probe)}, &w) }()
	go func() { defer wg.Done(); attack(ctx) }()
	if cfg.profileDir != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sleepCtx(ctx, d-2*time.Second)
			saveProfiles(cfg, name+"-attack", fetch)
		}()
	}
	sleepCtx(ctx, 500*time.Millisecond)
	clients(ctx)
	wg.Wait()
	time.Sleep(cfg.settleFor)
	m.settle = cfg.settleFor
	m.rssAfter, _ = procRSS(pid)
	if cfg.profileDir != "" {
		saveProfiles(cfg, name+"-after", fetch)
	}
	m.rssMax, m.sendMax, m.recvMax = w.rss.Load(), w.sendQueue.Load(), w.recvQueue.Load()
	return m
}

// passwordFlood sends wrong passwords over TLS from floodAddress's
// addresses (each request from the next, on a new connection) with
// `clients` clients until ctx ends.
func passwordFlood(ctx context.Context, s *securedExporter, clients, addrs int, wp *wrongPasswords) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				from := floodAddress(int(next.Add(1)-1) % addrs)
				d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
				return d.DialContext(ctx, network, addr)
			}
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial,
				TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the bench's own certificate
			wp.send(ctx, c, "https://"+s.addr, w)
		}()
	}
	wg.Wait()
}

// tlsPipeline is pipeline over TLS with an Authorization header: conns
// connections from 127.0.0.1 each pipelining n `GET path` and reading
// readBytes every readEvery, reconnecting a second after being closed.
func tlsPipeline(ctx context.Context, addr, path, auth string, conns, n, readBytes int, readEvery time.Duration, st *pipelineStats) {
	req := []byte("GET " + path + " HTTP/1.1\r\nHost: bench\r\nAuthorization: " + auth + "\r\n\r\n")
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}, Control: smallReceiveWindow},
				Config: &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}}} //nolint:gosec // the bench's own certificate
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				st.conns.Add(1)
				stop := context.AfterFunc(ctx, func() { c.Close() })
				done := make(chan struct{})
				go func() {
					defer close(done)
					buf := make([]byte, readBytes)
					for {
						if _, err := c.Read(buf); err != nil {
							return
						}
						sleepCtx(ctx, readEvery)
					}
				}()
				batch := bytes.Repeat(req, 50)
				for sent := 0; sent < n && ctx.Err() == nil; sent += 50 {
					if _, err := c.Write(batch); err != nil {
						break
					}
					st.requests.Add(50)
				}
				<-done
				stop()
				c.Close()
				sleepCtx(ctx, time.Second)
			}
		}()
	}
	wg.Wait()
}

// slowHeaders holds conns connections from ip to addr, each sending a
// request's headers a line a second and never ending them, reopened when
// the server closes one, until ctx ends.
func slowHeaders(ctx context.Context, addr, ip string, conns int, opened *atomic.Int64) {
	var wg sync.WaitGroup
	d := &net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					sleepCtx(ctx, 100*time.Millisecond)
					continue
				}
				opened.Add(1)
				stop := context.AfterFunc(ctx, func() { c.Close() })
				_, err = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: bench\r\n"))
				for err == nil && ctx.Err() == nil {
					sleepCtx(ctx, time.Second)
					_, err = c.Write([]byte("X-Slow: 1\r\n"))
				}
				stop()
				c.Close()
			}
		}()
	}
	wg.Wait()
}

// runEnv is the GOMEMLIMIT a run gave the exporter, for its row.
func runEnv(cfg config) string {
	if cfg.goMemLimit == "" {
		return "no GOMEMLIMIT"
	}
	return "GOMEMLIMIT=" + cfg.goMemLimit
}

// besideTheAttack are a run's well-behaved clients: the logged-in
// scraper, first logins and the prober.
type besideTheAttack struct {
	scraper, fresh  *clientStats
	healthz, readyz *clientStats
}

// beside runs the well-behaved clients until ctx ends: the prober, a first
// login every firstLoginEvery from 1.5 s in, and the scraper as scrape
// polls it.
func (s *securedExporter) beside(ctx context.Context, firstLoginEvery time.Duration, b *besideTheAttack, scrape func(context.Context) *clientStats) {
	var wg sync.WaitGroup
	prober(ctx, &wg, proberAddr, s.probe, &b.healthz, &b.readyz)
	wg.Add(1)
	go func() {
		defer wg.Done()
		sleepCtx(ctx, 1500*time.Millisecond)
		b.fresh = s.firstLogins(ctx, firstLoginEvery)
	}()
	b.scraper = scrape(ctx)
	wg.Wait()
}

type mixedResult struct {
	mem       memFigures
	h2        h2Stats
	flood     wrongPasswords
	probePipe pipelineStats
	besideTheAttack
	loadBefore, loadAfter string
}

// measureMixed: TLS, basic auth and a probe port; at once, -h2-conns
// connections holding -h2-streams streams each at window 0 without
// credentials, -auth-clients clients sending wrong passwords from
// -auth-addrs addresses, and -probe-pipeline-conns connections pipelining
// probes never read; beside them the logged-in scraper (HTTP/2, every
// 100 ms), first logins every second and the prober.
func measureMixed(cfg config) (*mixedResult, error) {
	r := &mixedResult{loadBefore: loadAvg()}
	raiseFileLimit()
	s, err := startSecured(cfg, int(cfg.mixedFor/time.Second)+1)
	if err != nil {
		return r, err
	}
	defer s.stop()
	time.Sleep(3 * cfg.interval)
	scraper, scrape := s.scraper(scraperAddr)
	r.mem = attackFor(cfg, "mixed", cfg.mixedFor, s.exporterProc, s.probe, s.fetch(), func(ctx context.Context) {
		var wg sync.WaitGroup
		wg.Add(3)
		go func() { defer wg.Done(); h2Stall(ctx, s.addr, cfg.h2Conns, cfg.h2Streams, &r.h2) }()
		go func() { defer wg.Done(); passwordFlood(ctx, s, cfg.authClients, cfg.authAddrs, &r.flood) }()
		go func() {
			defer wg.Done()
			pipeline(ctx, s.probe, "/healthz", cfg.probePipeConns, cfg.probePipeRequests, 0, 0, 5*time.Second, &r.probePipe)
		}()
		wg.Wait()
	}, func(ctx context.Context) {
		s.beside(ctx, time.Second, &r.besideTheAttack, func(ctx context.Context) *clientStats {
			return poll(ctx, scraper, 100*time.Millisecond, scrape)
		})
	})
	r.loadAfter = loadAvg()
	return r, nil
}

type stolenResult struct {
	mem memFigures
	h2  h2Stats
	besideTheAttack
	loadBefore, loadAfter string
}

// measureStolenPassword: TLS, basic auth and a probe port; -stolen-conns
// HTTP/2 connections logged in with the scraper's own password, each
// holding -h2-streams streams at window 0; beside them the scraper
// (HTTP/2, every 100 ms, from its own address), first logins every second
// and the prober.
func measureStolenPassword(cfg config) (*stolenResult, error) {
	r := &stolenResult{loadBefore: loadAvg()}
	raiseFileLimit()
	s, err := startSecured(cfg, int(cfg.attackFor/time.Second)+1)
	if err != nil {
		return r, err
	}
	defer s.stop()
	time.Sleep(3 * cfg.interval)
	scraper, scrape := s.scraper(scraperAddr)
	r.mem = attackFor(cfg, "stolen-password", cfg.attackFor, s.exporterProc, s.probe, s.fetch(), func(ctx context.Context) {
		h2StallFrom(ctx, s.addr, "127.0.0.1", basicAuth("prometheus", benchPassword), cfg.stolenConns, cfg.h2Streams, &r.h2)
	}, func(ctx context.Context) {
		s.beside(ctx, time.Second, &r.besideTheAttack, func(ctx context.Context) *clientStats {
			return poll(ctx, scraper, 100*time.Millisecond, scrape)
		})
	})
	r.loadAfter = loadAvg()
	return r, nil
}

type sharedProbeResult struct {
	mem                   memFigures
	opened                atomic.Int64
	healthz, readyz       *clientStats
	loadBefore, loadAfter string
}

// measureSharedProbe: -shared-probe-conns connections sending headers a
// line a second to the probe port from the prober's own address, and the
// prober beside them.
func measureSharedProbe(cfg config) (*sharedProbeResult, error) {
	r := &sharedProbeResult{loadBefore: loadAvg()}
	raiseFileLimit()
	p, probe, err := startWithProbe(cfg)
	if err != nil {
		return r, err
	}
	defer p.stop()
	time.Sleep(3 * cfg.interval)
	r.mem = attackFor(cfg, "shared-probe", cfg.attackFor, p, probe, fetcher(&http.Client{Timeout: 10 * time.Second}, "http://"+p.addr, false), func(ctx context.Context) {
		slowHeaders(ctx, probe, proberAddr, cfg.sharedProbeConns, &r.opened)
	}, func(ctx context.Context) {
		var wg sync.WaitGroup
		sleepCtx(ctx, time.Second) // the attack holds the port first
		prober(ctx, &wg, proberAddr, probe, &r.healthz, &r.readyz)
		wg.Wait()
	})
	r.loadAfter = loadAvg()
	return r, nil
}

type sharedScraperResult struct {
	mem                   memFigures
	h2                    h2Stats
	scraper               *clientStats
	loadBefore, loadAfter string
}

// measureSharedScraper: TLS alone; -h2-conns connections holding
// -h2-streams streams each at window 0 from the scraper's own address,
// and the scraper (HTTP/2, every 100 ms) beside them. warm: the scraper
// has scraped once before the attack begins and keeps its connection, as
// a Prometheus scraping the exporter has; otherwise (shared-scraper-cold)
// its first connection comes half a second into the attack.
func measureSharedScraper(cfg config, warm bool) (*sharedScraperResult, error) {
	r := &sharedScraperResult{loadBefore: loadAvg()}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "bench-shared")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	certFile, keyFile, pool, err := tlsFiles(dir)
	if err != nil {
		return r, err
	}
	webFile := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webFile, []byte("tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+"\n"), 0o600); err != nil {
		return r, err
	}
	probe, err := freePort()
	if err != nil {
		return r, err
	}
	get := func(addr string) *http.Request {
		req, _ := http.NewRequest("GET", "https://"+addr+"/metrics", nil)
		return req
	}
	p, err := startExporter(cfg, []string{"--web.config.file=" + webFile, "--web.probe-address=" + probe},
		func(addr string) (*http.Request, error) { return get(addr), nil }, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}})
	if err != nil {
		return r, err
	}
	defer p.stop()
	time.Sleep(3 * cfg.interval)
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(scraperAddr)}}
	scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	name := "shared-scraper-cold"
	if warm {
		name = "shared-scraper"
		resp, err := scraper.Do(get(p.addr))
		if err != nil {
			return r, fmt.Errorf("the scraper's scrape before the attack: %w", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
			return r, fmt.Errorf("the scraper's scrape before the attack: %s over %s; want 200 over HTTP/2", resp.Status, resp.Proto)
		}
	}
	r.mem = attackFor(cfg, name, cfg.attackFor, p, probe, fetcher(&http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}, "https://"+p.addr, false), func(ctx context.Context) {
		h2StallFrom(ctx, p.addr, scraperAddr, "", cfg.h2Conns, cfg.h2Streams, &r.h2)
	}, func(ctx context.Context) {
		r.scraper = poll(ctx, scraper, 100*time.Millisecond, func() *http.Request { return get(p.addr) })
	})
	r.loadAfter = loadAvg()
	return r, nil
}

type soakResult struct {
	mem                    memFigures
	h2, stolen             h2Stats
	flood                  wrongPasswords
	probePipe, slowReaders pipelineStats
	slowProbes             atomic.Int64
	besideTheAttack
	counterFalls          int
	xidSeen               bool
	loadBefore, loadAfter string
}

// soakScenario is the built-in 8-GPU node's size with a GPU fault every
// few seconds for d (XIDs, lost and hung GPUs, ECC errors, throttling, row
// remaps, recovery actions, resets, the device plugin's capacity, DCGM
// health), cycling over the GPUs.
func soakScenario(d time.Duration) string {
	var b strings.Builder
	b.WriteString("seed: 7\nnode: {name: soak-node, model: H100-SXM5-80GB, count: 8}\n")
	b.WriteString("pods:\n")
	for g := 0; g < 8; g++ {
		fmt.Fprintf(&b, "  - {namespace: soak, name: job-%d, containers: [{name: main, devices: [{gpu: %d}]}]}\n", g, g)
	}
	b.WriteString("faults:\n")
	kinds := []func(at, g int) string{
		func(at, g int) string { return fmt.Sprintf("{at: %ds, gpu: %d, xid: 13, count: 3}", at, g) },
		func(at, g int) string {
			return fmt.Sprintf("{at: %ds, gpu: %d, ecc: {corrected: 5, uncorrected: 1}}", at, g)
		},
		func(at, g int) string { return fmt.Sprintf("{at: %ds, until: %ds, gpu: %d, lost: true}", at, at+6, g) },
		func(at, g int) string { return fmt.Sprintf("{at: %ds, until: %ds, gpu: %d, hang: true}", at, at+3, g) },
		func(at, g int) string {
			return fmt.Sprintf("{at: %ds, until: %ds, gpu: %d, throttle: [hw_thermal_slowdown]}", at, at+10, g)
		},
		func(at, g int) string { return fmt.Sprintf("{at: %ds, gpu: %d, xid: 94}", at, g) },
		func(at, g int) string { return fmt.Sprintf("{at: %ds, gpu: %d, reset: true}", at, g) },
		func(at, g int) string {
			return fmt.Sprintf("{at: %ds, until: %ds, gpu: %d, recoveryAction: gpu_reset}", at, at+10, g)
		},
		func(at, g int) string {
			return fmt.Sprintf("{at: %ds, until: %ds, gpu: %d, dcgmHealth: {system: memory, result: fail}}", at, at+10, g)
		},
		func(at, _ int) string {
			return fmt.Sprintf("{at: %ds, until: %ds, devicePlugin: {allocatable: 0}}", at, at+5)
		},
	}
	i := 0
	for at := 5; at < int(d/time.Second)+60; at += 4 {
		fmt.Fprintf(&b, "  - %s\n", kinds[i%len(kinds)](at, i%8))
		i++
	}
	return b.String()
}

// measureSoak: for -soak-for on a node whose GPUs keep failing
// (soakScenario), every attack at once: the mixed attack's three, the
// stolen password's stalled streams, the stolen password's pipelines of
// /metrics read slowly over TLS (the send buffers' attack), and slow
// headers on the probe port from the prober's own address; beside them
// the logged-in scraper (every second, checking that no counter falls),
// first logins every 10 s and the prober.
func measureSoak(cfg config) (*soakResult, error) {
	r := &soakResult{loadBefore: loadAvg()}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "bench-soak")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	scenario := filepath.Join(dir, "faults.yaml")
	if err := os.WriteFile(scenario, []byte(soakScenario(cfg.soakFor)), 0o600); err != nil {
		return r, err
	}
	s, err := startSecured(cfg, 64, "--simulate.scenario="+scenario)
	if err != nil {
		return r, err
	}
	defer s.stop()
	time.Sleep(3 * cfg.interval)
	scraper, scrape := s.scraper(scraperAddr)
	stolen := basicAuth("prometheus", benchPassword)
	counters := map[string]float64{}
	r.mem = attackFor(cfg, "soak", cfg.soakFor, s.exporterProc, s.probe, s.fetch(), func(ctx context.Context) {
		var wg sync.WaitGroup
		for _, f := range []func(){
			func() { h2Stall(ctx, s.addr, cfg.h2Conns, cfg.h2Streams, &r.h2) },
			func() { passwordFlood(ctx, s, cfg.authClients, cfg.authAddrs, &r.flood) },
			func() {
				pipeline(ctx, s.probe, "/healthz", cfg.probePipeConns, cfg.probePipeRequests, 0, 0, 5*time.Second, &r.probePipe)
			},
			func() { h2StallFrom(ctx, s.addr, "127.0.0.1", stolen, cfg.stolenConns, cfg.h2Streams, &r.stolen) },
			func() {
				tlsPipeline(ctx, s.addr, "/metrics", stolen, cfg.slowReaders, cfg.slowReaderRequests, 1024, 100*time.Millisecond, &r.slowReaders)
			},
			func() { slowHeaders(ctx, s.probe, proberAddr, cfg.sharedProbeConns, &r.slowProbes) },
		} {
			wg.Add(1)
			go func() { defer wg.Done(); f() }()
		}
		wg.Wait()
	}, func(ctx context.Context) {
		s.beside(ctx, 10*time.Second, &r.besideTheAttack, func(ctx context.Context) *clientStats {
			return pollBody(ctx, scraper, time.Second, scrape, func(body []byte) {
				r.counterFalls += countersFell(counters, body)
			})
		})
	})
	for k := range counters {
		if strings.HasPrefix(k, "gpu_xid_errors_total{") {
			r.xidSeen = true
		}
	}
	r.loadAfter = loadAvg()
	return r, nil
}

// pollBody is poll, handing each page answered 200 to check.
func pollBody(ctx context.Context, c *http.Client, every time.Duration, newReq func() *http.Request, check func([]byte)) *clientStats {
	s := &clientStats{}
	for ctx.Err() == nil {
		start := time.Now()
		resp, err := c.Do(newReq())
		switch {
		case err != nil:
			s.errs++
			s.fail("%v after %s ms", err, ms(time.Since(start)))
		default:
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			switch {
			case err != nil:
				s.errs++
				s.fail("%v after %s ms", err, ms(time.Since(start)))
			case resp.StatusCode == http.StatusOK:
				s.lat = append(s.lat, time.Since(start))
				check(body)
			case resp.StatusCode == http.StatusServiceUnavailable:
				s.unavailable++
				s.fail("503 after %s ms", ms(time.Since(start)))
			default:
				s.other++
				s.fail("%d after %s ms", resp.StatusCode, ms(time.Since(start)))
			}
		}
		sleepCtx(ctx, every)
	}
	return s
}

// countersFell records every counter (`_total`) of page in last and counts
// those that fell since the last page.
func countersFell(last map[string]float64, page []byte) int {
	fell := 0
	sc := bufio.NewScanner(bytes.NewReader(page))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		series := line[:i]
		name := series
		if j := strings.IndexByte(series, '{'); j >= 0 {
			name = series[:j]
		}
		if !strings.HasSuffix(name, "_total") {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		if old, ok := last[series]; ok && v < old {
			fell++
		}
		last[series] = v
	}
	return fell
}

// loadAvg is /proc/loadavg's first three fields: the machine's load
// beside each figure.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// at least minShare of a client's requests answered, under the mixed runs' bar.
func atLeastShare(s *clientStats, share float64, what, run string) []string {
	if s == nil {
		return []string{fmt.Sprintf("%s: no %s measured", run, what)}
	}
	if n := len(s.lat) + s.failed(); n == 0 || answered(s) < share {
		return []string{fmt.Sprintf("%s: %d of %d %s answered, want at least %.0f%%", run, len(s.lat), n, what, 100*share)}
	}
	return nil
}

// attackersChoices runs the chosen runs of this file once per -gomemlimit
// value, adds a row for each and returns what failed: RSS above the limit
// (with a GOMEMLIMIT), a well-behaved client under -min-share answered, a
// first login of firstLoginLimit or more (mixed), and (soak) socket send
// queues above maxSendQueues, RSS not back under the limit after the
// attack, or a counter that fell.
func attackersChoices(cfg config, row func(run, figure string)) (fails []string) {
	for _, limit := range cfg.goMemLimits {
		cfg.goMemLimit = limit
		env := runEnv(cfg)
		memFails := func(run string, m memFigures) []string {
			if limit == "" {
				return nil // without GOMEMLIMIT the garbage collector's headroom is part of the figure: reported, not held to the limit
			}
			return underLimit(cfg, m.rssMax, run+", "+env)
		}
		if cfg.runs["mixed"] {
			fmt.Fprintf(os.Stderr, "bench: mixed (%s) ...\n", env)
			m, err := measureMixed(cfg)
			if err != nil {
				fatalf("mixed: %v", err)
			}
			run := "mixed, " + env
			row(fmt.Sprintf("mixed (%s): TLS and basic auth; for %s at once: %d HTTP/2 connections x %d streams at window 0 without credentials, %d clients sending wrong passwords from %d addresses, %d connections pipelining probes never read",
				env, cfg.mixedFor, cfg.h2Conns, cfg.h2Streams, cfg.authClients, cfg.authAddrs, cfg.probePipeConns),
				fmt.Sprintf("%s; h2: %d connections, %d streams; flood: %d requests (%d 401, %d 429, %d 503, %d unanswered); probe pipelines: %d connections; logged-in scraper (HTTP/2, every 100 ms): %s; first logins (every 1 s): %s; prober /healthz %s; /readyz %s; load %s -> %s",
					m.mem, m.h2.conns.Load(), m.h2.streams.Load(), m.flood.requests.Load(), m.flood.unauthorized.Load(), m.flood.throttled.Load(), m.flood.busy.Load(), m.flood.errs.Load(),
					m.probePipe.conns.Load(), m.scraper, m.fresh, m.healthz, m.readyz, m.loadBefore, m.loadAfter))
			fails = append(fails, memFails("mixed", m.mem)...)
			fails = append(fails, atLeastShare(m.scraper, cfg.minShare, "logged-in scrapes", run)...)
			fails = append(fails, atLeastShare(m.healthz, cfg.minShare, "/healthz probes", run)...)
			fails = append(fails, atLeastShare(m.readyz, cfg.minShare, "/readyz probes", run)...)
			if m.fresh != nil {
				if slowest := pct(m.fresh.lat, 100); slowest >= firstLoginLimit {
					fails = append(fails, fmt.Sprintf("%s: a first login took %s ms, want under %s", run, ms(slowest), firstLoginLimit))
				}
			}
		}
		if cfg.runs["stolen-password"] {
			fmt.Fprintf(os.Stderr, "bench: stolen password (%s) ...\n", env)
			m, err := measureStolenPassword(cfg)
			if err != nil {
				fatalf("stolen-password: %v", err)
			}
			run := "stolen-password, " + env
			row(fmt.Sprintf("stolen-password (%s): TLS and basic auth; %d HTTP/2 connections logged in with the scraper's password, x %d streams at window 0, for %s",
				env, cfg.stolenConns, cfg.h2Streams, cfg.attackFor),
				fmt.Sprintf("%s; %d connections, %d streams, %d ended, %d reset; the scraper (HTTP/2, every 100 ms, own address): %s; first logins (every 1 s): %s; prober /healthz %s; /readyz %s; load %s -> %s",
					m.mem, m.h2.conns.Load(), m.h2.streams.Load(), m.h2.ended.Load(), m.h2.resets.Load(), m.scraper, m.fresh, m.healthz, m.readyz, m.loadBefore, m.loadAfter))
			fails = append(fails, memFails("stolen-password", m.mem)...)
			fails = append(fails, atLeastShare(m.scraper, cfg.minShare, "scrapes", run)...)
			fails = append(fails, atLeastShare(m.healthz, cfg.minShare, "/healthz probes", run)...)
			fails = append(fails, atLeastShare(m.readyz, cfg.minShare, "/readyz probes", run)...)
			fails = append(fails, atLeastShare(m.fresh, cfg.minShare, "first logins", run)...)
		}
		if cfg.runs["shared-probe"] {
			fmt.Fprintf(os.Stderr, "bench: slow headers from the prober's address (%s) ...\n", env)
			m, err := measureSharedProbe(cfg)
			if err != nil {
				fatalf("shared-probe: %v", err)
			}
			run := "shared-probe, " + env
			row(fmt.Sprintf("shared-probe (%s): %d connections sending headers a line a second to the probe port from the prober's own address, for %s", env, cfg.sharedProbeConns, cfg.attackFor),
				fmt.Sprintf("%s; %d connections opened; prober (same address) /healthz %s; /readyz %s; load %s -> %s",
					m.mem, m.opened.Load(), m.healthz, m.readyz, m.loadBefore, m.loadAfter))
			fails = append(fails, memFails("shared-probe", m.mem)...)
			fails = append(fails, atLeastShare(m.healthz, cfg.minShare, "/healthz probes", run)...)
			fails = append(fails, atLeastShare(m.readyz, cfg.minShare, "/readyz probes", run)...)
		}
		for _, warm := range []bool{true, false} {
			name, when := "shared-scraper", "connected before the attack"
			if !warm {
				name, when = "shared-scraper-cold", "connecting half a second into the attack"
			}
			if !cfg.runs[name] {
				continue
			}
			fmt.Fprintf(os.Stderr, "bench: HTTP/2 stalls from the scraper's address, the scraper %s (%s) ...\n", when, env)
			m, err := measureSharedScraper(cfg, warm)
			if err != nil {
				fatalf("%s: %v", name, err)
			}
			run := name + ", " + env
			row(fmt.Sprintf("%s (%s): TLS; %d HTTP/2 connections x %d streams at window 0 from the scraper's own address, for %s", name, env, cfg.h2Conns, cfg.h2Streams, cfg.attackFor),
				fmt.Sprintf("%s; %d connections, %d streams, %d ended, %d reset; the scraper (HTTP/2, every 100 ms, same address, %s): %s; load %s -> %s",
					m.mem, m.h2.conns.Load(), m.h2.streams.Load(), m.h2.ended.Load(), m.h2.resets.Load(), when, m.scraper, m.loadBefore, m.loadAfter))
			fails = append(fails, memFails(name, m.mem)...)
			fails = append(fails, atLeastShare(m.scraper, cfg.minShare, "scrapes", run)...)
		}
		if cfg.runs["soak"] {
			fmt.Fprintf(os.Stderr, "bench: soak, every attack at once for %s with GPU faults (%s) ...\n", cfg.soakFor, env)
			m, err := measureSoak(cfg)
			if err != nil {
				fatalf("soak: %v", err)
			}
			run := "soak, " + env
			row(fmt.Sprintf("soak (%s): TLS and basic auth; for %s, with a GPU fault every 4 s: the mixed attack, %d connections with the stolen password x %d streams at window 0, %d TLS connections with it pipelining /metrics and reading 1 KiB every 100 ms, %d slow-header connections to the probe port from the prober's address",
				env, cfg.soakFor, cfg.stolenConns, cfg.h2Streams, cfg.slowReaders, cfg.sharedProbeConns),
				fmt.Sprintf("%s; h2: %d connections; stolen: %d connections; flood: %d requests; slow readers: %d connections; slow probes: %d connections; scraper (every 1 s): %s, %d counters fell (XIDs seen: %v); first logins (every 10 s): %s; prober /healthz %s; /readyz %s; load %s -> %s",
					m.mem, m.h2.conns.Load(), m.stolen.conns.Load(), m.flood.requests.Load(), m.slowReaders.conns.Load(), m.slowProbes.Load(),
					m.scraper, m.counterFalls, m.xidSeen, m.fresh, m.healthz, m.readyz, m.loadBefore, m.loadAfter))
			fails = append(fails, memFails("soak", m.mem)...)
			fails = append(fails, atLeastShare(m.scraper, cfg.minShare, "scrapes", run)...)
			fails = append(fails, atLeastShare(m.healthz, cfg.minShare, "/healthz probes", run)...)
			fails = append(fails, atLeastShare(m.readyz, cfg.minShare, "/readyz probes", run)...)
			if m.mem.sendMax > maxSendQueues {
				fails = append(fails, fmt.Sprintf("%s: socket send queues %.1f MiB, want under %d MiB", run, mib(m.mem.sendMax), maxSendQueues>>20))
			}
			if limit != "" && m.mem.rssAfter > cfg.memLimit<<20 {
				fails = append(fails, fmt.Sprintf("%s: RSS %.1f MiB %s after the attack, want under the %d MiB limit", run, mib(m.mem.rssAfter), cfg.settleFor, cfg.memLimit))
			}
			if m.counterFalls > 0 {
				fails = append(fails, fmt.Sprintf("%s: %d counters fell", run, m.counterFalls))
			}
		}
	}
	return fails
}

// maxSendQueues bounds the soak's socket send-queue memory.
const maxSendQueues = 64 << 20

// saveProfiles writes the exporter's heap profile (after a collection;
// `go tool pprof -top -inuse_space`), its text form with the runtime's
// memory statistics, and its goroutines into -profile-dir, named after
// the run and the moment.
func saveProfiles(cfg config, name string, fetch func(path string) ([]byte, error)) {
	name = strings.NewReplacer(" ", "", ",", "-", "=", "").Replace(name + "-" + runEnv(cfg))
	for file, path := range map[string]string{
		name + "-heap.pb.gz":     "/debug/pprof/heap?gc=1",
		name + "-heap.txt":       "/debug/pprof/heap?debug=1",
		name + "-goroutines.txt": "/debug/pprof/goroutine?debug=1",
	} {
		b, err := fetch(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %s: %v\n", path, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(cfg.profileDir, file), b, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		}
	}
}

// fetcher fetches a path of base with c (and the scraper's password if
// auth): the profiles of -profile-dir.
func fetcher(c *http.Client, base string, auth bool) func(path string) ([]byte, error) {
	return func(path string) ([]byte, error) {
		req, err := http.NewRequest("GET", base+path, nil)
		if err != nil {
			return nil, err
		}
		if auth {
			req.SetBasicAuth("prometheus", benchPassword)
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("status %d", resp.StatusCode)
		}
		return io.ReadAll(resp.Body)
	}
}
