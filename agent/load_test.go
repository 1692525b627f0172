//go:build linux

package agent_test

// Load: many concurrent scrapers (plain, gzip, HEAD and slow readers) on the
// real HTTP server of run(), then no goroutine left behind; and the
// concurrency limit answering 503 at once while slow clients hold it.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// exporterRun is run() going in the background on a loopback port.
type exporterRun struct {
	addr   string
	logs   *syncBuffer
	cancel context.CancelFunc
	done   chan int
}

// startExporter starts run() with args plus a free 127.0.0.1 listen address
// and waits (bounded) until /readyz answers 200.
func startExporter(t *testing.T, args ...string) *exporterRun {
	t.Helper()
	r := &exporterRun{addr: freeAddr(t), logs: &syncBuffer{}, done: make(chan int, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	args = append(args, "--web.listen-address="+r.addr)
	go func() { r.done <- runSim(ctx, args, io.Discard, r.logs) }()
	t.Cleanup(func() { r.stop(t) })
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var err error
	if !pollUntil(20*time.Second, func() bool {
		var resp *http.Response
		if resp, err = c.Get("http://" + r.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return true
			}
		}
		select {
		case code := <-r.done:
			r.done <- code
			t.Fatalf("run exited with %d before it was ready; log:\n%s", code, r.logs.String())
		default:
		}
		return false
	}) {
		t.Fatalf("/readyz not 200 within 20s (last error %v); log:\n%s", err, r.logs.String())
	}
	return r
}

// stop cancels run() (what SIGTERM does) and waits, bounded, for exit 0.
// It may be called more than once.
func (r *exporterRun) stop(t *testing.T) {
	t.Helper()
	r.cancel()
	select {
	case code := <-r.done:
		r.done <- code
		if code != 0 {
			t.Errorf("run exited with %d, want 0; log:\n%s", code, r.logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("run did not return within 15s of shutdown")
	}
}

func (r *exporterRun) url(path string) string { return "http://" + r.addr + path }

// bodyChecker parses every distinct body once: all scrapes of one sample
// share the same bytes, so each response is checked at the cost of a hash.
type bodyChecker struct {
	mu   sync.Mutex
	seen map[[32]byte]error
	gpus int
}

func (c *bodyChecker) check(body []byte) error {
	sum := sha256.Sum256(body)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err, ok := c.seen[sum]; ok {
		return err
	}
	err := checkExposition(body, c.gpus)
	c.seen[sum] = err
	return err
}

func (c *bodyChecker) distinct() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen)
}

// checkExposition parses a text exposition with expfmt and checks the
// families every page must have.
func checkExposition(body []byte, gpus int) error {
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("exposition does not parse: %v", err)
	}
	for _, f := range []string{"gpu_info", "gpu_up", "gpu_memory_used_bytes", "gpu_energy_joules_total", "gpu_exporter_build_info",
		"gpu_exporter_last_sample_timestamp_seconds", "process_resident_memory_bytes"} {
		if mfs[f] == nil {
			return fmt.Errorf("exposition lacks %s", f)
		}
	}
	if n := len(mfs["gpu_info"].GetMetric()); n != gpus {
		return fmt.Errorf("%d gpu_info series, want %d", n, gpus)
	}
	return nil
}

// scrapeStats collects what the scrapers saw.
type scrapeStats struct {
	mu      sync.Mutex
	ok      map[string]int
	slowest map[string]time.Duration
	errs    []string
	nerrs   int
}

func (s *scrapeStats) done(mode string, d time.Duration, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.nerrs++
		if len(s.errs) < 20 {
			s.errs = append(s.errs, mode+": "+err.Error())
		}
		return
	}
	s.ok[mode]++
	if d > s.slowest[mode] {
		s.slowest[mode] = d
	}
}

// maxScrape is the generous bound on one scrape's latency (time to the whole
// body; for slow readers, time to the response headers). A cached page over
// loopback takes milliseconds; this only catches a scrape that queues or hangs.
const maxScrape = 2 * time.Second

// scrape does one request of the given mode and checks the response.
func scrape(client *http.Client, url, mode string, check *bodyChecker) (time.Duration, error) {
	method := http.MethodGet
	if mode == "head" {
		method = http.MethodHead
	}
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		return 0, err
	}
	if mode == "gzip" {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	headers := time.Since(start)
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return 0, fmt.Errorf("Content-Type %q", ct)
	}
	length, err := strconv.Atoi(resp.Header.Get("Content-Length"))
	if err != nil || length <= 0 {
		return 0, fmt.Errorf("Content-Length %q", resp.Header.Get("Content-Length"))
	}
	var body []byte
	switch mode {
	case "head":
		b, _ := io.ReadAll(resp.Body)
		if len(b) != 0 {
			return 0, fmt.Errorf("HEAD answered a %d-byte body", len(b))
		}
		return time.Since(start), nil
	case "slow":
		// A few hundred bytes at a time with a pause: bounded by the length.
		buf := make([]byte, 512)
		for reads := 0; reads <= length/len(buf)+1; reads++ {
			n, err := resp.Body.Read(buf)
			body = append(body, buf[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				return 0, err
			}
			time.Sleep(time.Millisecond) // a slow reader on purpose: the pause is the point
		}
	default:
		if body, err = io.ReadAll(resp.Body); err != nil {
			return 0, err
		}
	}
	elapsed := time.Since(start)
	if mode == "slow" {
		elapsed = headers
	}
	if len(body) != length {
		return 0, fmt.Errorf("read %d bytes, Content-Length %d", len(body), length)
	}
	if mode == "gzip" {
		if ce := resp.Header.Get("Content-Encoding"); ce != "gzip" {
			return 0, fmt.Errorf("asked for gzip, got Content-Encoding %q", ce)
		}
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return 0, fmt.Errorf("gzip: %v", err)
		}
		if body, err = io.ReadAll(zr); err != nil {
			return 0, fmt.Errorf("gzip: %v", err)
		}
	} else if ce := resp.Header.Get("Content-Encoding"); ce != "" {
		return 0, fmt.Errorf("plain request answered with Content-Encoding %q", ce)
	}
	if err := check.check(body); err != nil {
		return 0, err
	}
	return elapsed, nil
}

// goroutineDump is the stacks of all goroutines, cut to a readable length.
func goroutineDump() string {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	s := b.String()
	if len(s) > 20000 {
		s = s[:20000] + "\n..."
	}
	return s
}

func TestLoadConcurrentScrapers(t *testing.T) {
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	runtime.GC()
	baseline := runtime.NumGoroutine()

	r := startExporter(t, "--collect-interval=1s", "--log.level=warn")
	tr := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64}
	client := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	check := &bodyChecker{seen: map[[32]byte]error{}, gpus: 8}
	stats := &scrapeStats{ok: map[string]int{}, slowest: map[string]time.Duration{}}

	const (
		scrapers     = 32
		loadFor      = 3 * time.Second
		maxPerWorker = 5000
	)
	modes := []string{"plain", "gzip", "head", "slow"}
	stopAt := time.Now().Add(loadFor)
	var wg sync.WaitGroup
	for i := 0; i < scrapers; i++ {
		mode := modes[i%len(modes)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < maxPerWorker && time.Now().Before(stopAt); n++ {
				d, err := scrape(client, r.url("/metrics"), mode, check)
				stats.done(mode, d, err)
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(loadFor + 30*time.Second):
		t.Fatal("scrapers still running 30s after the load ended")
	}

	total := 0
	for _, m := range modes {
		total += stats.ok[m]
		t.Logf("%-5s %6d scrapes, slowest %v", m, stats.ok[m], stats.slowest[m])
		if stats.ok[m] == 0 {
			t.Errorf("no successful %s scrape", m)
		}
		if stats.slowest[m] > maxScrape {
			t.Errorf("slowest %s scrape took %v (bound %v)", m, stats.slowest[m], maxScrape)
		}
	}
	t.Logf("%d scrapes, %d distinct pages checked", total, check.distinct())
	if stats.nerrs > 0 {
		t.Errorf("%d failed scrapes, first: \n%s", stats.nerrs, strings.Join(stats.errs, "\n"))
	}
	if check.distinct() < 2 {
		t.Errorf("%d distinct pages in %v at --collect-interval=1s: samples did not go on under load", check.distinct(), loadFor)
	}

	// Shut down and check that nothing is left running.
	tr.CloseIdleConnections()
	r.stop(t)
	const slack = 4 // os/signal's watcher starts once per process and stays
	var n int
	if !pollUntil(10*time.Second, func() bool { n = runtime.NumGoroutine(); return n <= baseline+slack }) {
		t.Fatalf("goroutine leak: %d before the exporter started, %d 10s after it stopped:\n%s", baseline, n, goroutineDump())
	}
	t.Logf("goroutines: %d before, %d after", baseline, n)
}

// slowConn opens a connection whose receive window is tiny (small receive
// buffer, small MSS), sends a GET and reads only the response headers. The
// server's write of a ~100 KB page then blocks until the client reads or
// its write deadline passes.
func slowConn(t *testing.T, addr string) (net.Conn, int) {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096); serr != nil {
				return
			}
			serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, 536)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: %s\r\n\r\n", addr); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 16), nil)
	if err != nil {
		t.Fatalf("slow client: %v", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, resp.StatusCode
}
