package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// The runs here put a well-behaved client (a scraper, the kubelet's prober)
// beside an attack on the built binary and record what the client saw:
// latency p50/p99 of what was served, and how many requests failed (503 and
// other answers, or no answer). A run fails `make bench` when the client
// lost any request.

// clientStats is what one well-behaved client saw.
type clientStats struct {
	lat         []time.Duration // served (200)
	unavailable int             // 503
	other       int             // another status
	errs        int             // no answer (refused, reset, timed out)
	firstErr    string          // the first failure, as the client saw it
}

func (s *clientStats) failed() int { return s.unavailable + s.other + s.errs }

func (s *clientStats) String() string {
	str := fmt.Sprintf("p50/p99 %s / %s ms, max %s ms; %d ok, %d failed (%d 503, %d other status, %d no answer)",
		ms(pct(s.lat, 50)), ms(pct(s.lat, 99)), ms(pct(s.lat, 100)), len(s.lat), s.failed(), s.unavailable, s.other, s.errs)
	if s.firstErr != "" {
		str += ", first: " + s.firstErr
	}
	return str
}

func (s *clientStats) fail(format string, args ...any) {
	if s.firstErr == "" {
		s.firstErr = fmt.Sprintf(format, args...)
	}
}

// do sends one request and records it.
func (s *clientStats) do(c *http.Client, req *http.Request) {
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		s.errs++
		s.fail("%v after %s ms", err, ms(time.Since(start)))
		return
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	resp.Body.Close()
	switch {
	case err != nil:
		s.errs++
		s.fail("%v after %s ms", err, ms(time.Since(start)))
	case resp.StatusCode == http.StatusOK:
		s.lat = append(s.lat, time.Since(start))
		return
	case resp.StatusCode == http.StatusServiceUnavailable:
		s.unavailable++
	default:
		s.other++
	}
	s.fail("%d %q after %s ms", resp.StatusCode, strings.TrimSpace(string(body[:min(len(body), 80)])), ms(time.Since(start)))
}

// poll sends a request from newReq every interval until ctx is done. The
// request still running when ctx ends counts too (with the client's
// timeout), so a request held past the end of the attack is not lost from
// the figures.
func poll(ctx context.Context, c *http.Client, every time.Duration, newReq func() *http.Request) *clientStats {
	s := &clientStats{}
	for ctx.Err() == nil {
		s.do(c, newReq())
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
	return s
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip, so that an attacker's address and a scraper's differ as they
// do across hosts. keepAlive false opens a connection per request (the
// kubelet's prober does).
func clientFrom(ip string, keepAlive bool, timeout time.Duration) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: !keepAlive, DialContext: d.DialContext}}
}

// bodyResult is what clients sending request bodies slowly got.
type bodyResult struct {
	requests int64           // requests sent
	answers  map[int]int64   // status -> count
	unanswer int64           // connections closed or still open with no answer when the run ended
	toAnswer []time.Duration // from the headers sent to the answer
}

func (b *bodyResult) String() string {
	codes := make([]int, 0, len(b.answers))
	for c := range b.answers {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d answered %d", b.answers[c], c))
	}
	if len(parts) == 0 {
		parts = append(parts, "none answered")
	}
	return fmt.Sprintf("%d requests: %s, %d unanswered; answered after p50 %s ms, max %s ms",
		b.requests, strings.Join(parts, ", "), b.unanswer, ms(pct(b.toAnswer, 50)), ms(pct(b.toAnswer, 100)))
}

// slowBodies runs conns clients from 127.0.0.1 that each send method path
// with a 200 KB body announced and then one byte of it a second, until the
// server answers or closes; a second after that, the client opens a new
// connection and starts again.
func slowBodies(ctx context.Context, addr, method, path string, conns int) *bodyResult {
	var mu sync.Mutex
	r := &bodyResult{answers: map[int]int64{}}
	var requests, unanswered atomic.Int64
	var wg sync.WaitGroup
	d := &net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
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
				start := time.Now()
				if _, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: bench\r\nContent-Length: 200000\r\n\r\n", method, path); err != nil {
					c.Close()
					continue
				}
				requests.Add(1)
				answered := make(chan struct{})
				go func() {
					defer close(answered)
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					if err != nil {
						unanswered.Add(1)
						return
					}
					took := time.Since(start)
					resp.Body.Close()
					mu.Lock()
					r.answers[resp.StatusCode]++
					r.toAnswer = append(r.toAnswer, took)
					mu.Unlock()
				}()
				tick := time.NewTicker(time.Second)
			trickle:
				for {
					select {
					case <-ctx.Done():
						break trickle
					case <-answered:
						break trickle
					case <-tick.C:
						if _, err := c.Write([]byte("x")); err != nil {
							break trickle
						}
					}
				}
				tick.Stop()
				c.Close()
				<-answered
				sleepCtx(ctx, time.Second)
			}
		}()
	}
	wg.Wait()
	r.requests, r.unanswer = requests.Load(), unanswered.Load()
	return r
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

type slowBodyResult struct {
	bodies  *bodyResult
	scraper *clientStats
}

// measureSlowBodies: -body-conns clients sending `GET /metrics` with a
// body at a byte a second, and a scraper from 127.0.0.2 every 100 ms
// beside them (default flags: 40 scrape slots).
func measureSlowBodies(cfg config) (slowBodyResult, error) {
	var r slowBodyResult
	p, err := startExporter(cfg, nil, func(addr string) (*http.Request, error) { return http.NewRequest("GET", "http://"+addr+"/readyz", nil) }, nil)
	if err != nil {
		return r, err
	}
	defer p.stop()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.attackFor)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); r.bodies = slowBodies(ctx, p.addr, "GET", "/metrics", cfg.bodyConns) }()
	sleepCtx(ctx, 500*time.Millisecond)
	r.scraper = poll(ctx, clientFrom("127.0.0.2", true, 10*time.Second), 100*time.Millisecond, func() *http.Request {
		req, _ := http.NewRequest("GET", "http://"+p.addr+"/metrics", nil)
		return req
	})
	<-done
	return r, nil
}

type probeResult struct {
	bodies          *bodyResult
	healthz, readyz *clientStats
	scraper         *clientStats
}

// measureProbePort: -probe-conns clients sending `POST /healthz` with a
// body at a byte a second to the probe listener (--web.probe-address), a
// prober from 127.0.0.2 asking /healthz and /readyz every 100 ms on a new
// connection each (as the kubelet does, 1 s timeout: its default), and a
// scraper on the web port every 100 ms.
func measureProbePort(cfg config) (probeResult, error) {
	var r probeResult
	p, probeAddr, err := startWithProbe(cfg)
	if err != nil {
		return r, err
	}
	defer p.stop()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.attackFor)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.bodies = slowBodies(ctx, probeAddr, "POST", "/healthz", cfg.probeConns) }()
	sleepCtx(ctx, 500*time.Millisecond)
	probeBoth(ctx, &wg, probeAddr, &r.healthz, &r.readyz)
	r.scraper = poll(ctx, clientFrom("127.0.0.3", true, 10*time.Second), 100*time.Millisecond, func() *http.Request {
		req, _ := http.NewRequest("GET", "http://"+p.addr+"/metrics", nil)
		return req
	})
	wg.Wait()
	return r, nil
}

// startWithProbe starts the exporter with a probe listener
// (--web.probe-address) and returns it and the probe address.
func startWithProbe(cfg config) (*exporterProc, string, error) {
	probeAddr, err := freePort()
	if err != nil {
		return nil, "", err
	}
	p, err := startExporter(cfg, []string{"--web.probe-address=" + probeAddr}, func(string) (*http.Request, error) {
		return http.NewRequest("GET", "http://"+probeAddr+"/readyz", nil)
	}, nil)
	return p, probeAddr, err
}

// probeBoth starts a prober from 127.0.0.2 asking /healthz and /readyz at
// probeAddr every 100 ms on a new connection each (as the kubelet does, 1 s
// timeout: its default), until ctx ends; wg is done for each when it has
// set its figures.
func probeBoth(ctx context.Context, wg *sync.WaitGroup, probeAddr string, healthz, readyz **clientStats) {
	prober := clientFrom("127.0.0.2", false, time.Second)
	for _, x := range []struct {
		path string
		out  **clientStats
	}{{"/healthz", healthz}, {"/readyz", readyz}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			*x.out = poll(ctx, prober, 100*time.Millisecond, func() *http.Request {
				req, _ := http.NewRequest("GET", "http://"+probeAddr+x.path, nil)
				return req
			})
		}()
	}
}

type manyAddrResult struct {
	addrs, clients          int
	requests                int64
	unauthorized, throttled int64 // 401 (bcrypt ran), 429 (refused before bcrypt)
	busy, errs              int64 // 503 (bcrypt slots busy), no answer
	scraper, fresh          *clientStats
	cpuCores                float64 // the exporter's CPU use during the flood
}

// floodAddress is the i-th address of the wrong-password flood: spread
// over the /16 networks 127.1-250 of the loopback's 127.0.0.0/8, the
// first 240 addresses of network 127.n.0.0/16 in 127.n.0.1-240, and so on.
// The scrapers are 127.1.0.251 and .252: in the flood's own /24.
func floodAddress(i int) string {
	n := i / 250
	return fmt.Sprintf("127.%d.%d.%d", 1+i%250, n/250, 1+n%250)
}

// Scrapers' addresses, in the network of the flood's first addresses.
const (
	loggedInScraper = "127.1.0.251"
	firstLoginFrom  = "127.1.0.252"
)

// maxFloodAddresses: floodAddress's range (250 networks of 250 x 250).
const maxFloodAddresses = 250 * 250 * 240

// measureManyAddrAuth: basic auth (bcrypt cost 10); -auth-clients clients
// send wrong passwords as fast as they are answered, each request from the
// next of -auth-addrs loopback addresses (floodAddress) on a connection of
// its own, while a scraper logged in before the flood scrapes every 100 ms
// and, from 2 s into the flood, a scraper that has not logged in yet logs
// in once a second (each time as a user of the web config that has not
// logged in before, so each login runs bcrypt). Both scrapers come from
// the flood's first /24.
func measureManyAddrAuth(cfg config) (manyAddrResult, error) {
	r := manyAddrResult{addrs: cfg.authAddrs, clients: cfg.authClients}
	if cfg.authAddrs < 1 || cfg.authAddrs > maxFloodAddresses {
		return r, fmt.Errorf("-auth-addrs=%d: want 1-%d", cfg.authAddrs, maxFloodAddresses)
	}
	raiseFileLimit()
	dir, err := os.MkdirTemp("", "bench-auth")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	fresh := int(cfg.attackFor/time.Second) + 1
	var users strings.Builder
	users.WriteString("basic_auth_users:\n")
	for i := -1; i < fresh; i++ {
		name, pass := "prometheus", "bench-secret"
		if i >= 0 {
			name, pass = "fresh-"+strconv.Itoa(i), "fresh-secret-"+strconv.Itoa(i)
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
		if err != nil {
			return r, err
		}
		fmt.Fprintf(&users, "  %s: %s\n", name, hash)
	}
	webCfg := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(webCfg, []byte(users.String()), 0o600); err != nil {
		return r, err
	}
	get := func(addr, user, pass string) *http.Request {
		req, _ := http.NewRequest("GET", "http://"+addr+"/metrics", nil)
		req.SetBasicAuth(user, pass)
		return req
	}
	p, err := startExporter(cfg, []string{"--web.config.file=" + webCfg}, func(addr string) (*http.Request, error) {
		return get(addr, "prometheus", "bench-secret"), nil // the scraper logs in before the flood
	}, &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(loggedInScraper)}}).DialContext})
	if err != nil {
		return r, err
	}
	defer p.stop()

	ctx, cancel := context.WithTimeout(context.Background(), cfg.attackFor)
	defer cancel()
	var wrong wrongPasswords
	var next atomic.Int64 // the next flood address
	var wg sync.WaitGroup
	cpu0, _ := procCPU(p.cmd.Process.Pid)
	t0 := time.Now()
	for w := 0; w < cfg.authClients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
				from := floodAddress(int(next.Add(1)-1) % cfg.authAddrs)
				d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
				return d.DialContext(ctx, network, addr)
			}
			c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
			wrong.send(ctx, c, "http://"+p.addr, w)
		}()
	}
	sleepCtx(ctx, 500*time.Millisecond)
	var scrapers sync.WaitGroup
	scrapers.Add(1)
	go func() {
		defer scrapers.Done()
		// The first login comes while the flood is under way.
		sleepCtx(ctx, 1500*time.Millisecond)
		n := 0
		r.fresh = poll(ctx, clientFrom(firstLoginFrom, false, 10*time.Second), time.Second, func() *http.Request {
			n++
			return get(p.addr, "fresh-"+strconv.Itoa((n-1)%fresh), "fresh-secret-"+strconv.Itoa((n-1)%fresh))
		})
	}()
	r.scraper = poll(ctx, clientFrom(loggedInScraper, true, 10*time.Second), 100*time.Millisecond, func() *http.Request {
		return get(p.addr, "prometheus", "bench-secret")
	})
	scrapers.Wait()
	cpu1, _ := procCPU(p.cmd.Process.Pid)
	r.cpuCores = float64(cpu1-cpu0) / float64(time.Since(t0))
	wg.Wait()
	r.requests, r.unauthorized, r.throttled, r.busy, r.errs = wrong.requests.Load(), wrong.unauthorized.Load(), wrong.throttled.Load(), wrong.busy.Load(), wrong.errs.Load()
	return r, nil
}
