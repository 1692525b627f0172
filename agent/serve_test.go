package agent_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// authRun is the exporter run with basic auth and a probe listener.
type authRun struct {
	addr, probe string
	logs        *syncBuffer
}

func startWithAuth(t *testing.T, cost int, extra ...string) *authRun {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret-scrape"), cost)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(cfg, []byte("basic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return startWithConfig(t, cfg, extra...)
}

// startWithConfig runs the exporter with the web config cfg and a probe
// listener, and waits until the probe says ready.
func startWithConfig(t *testing.T, cfg string, extra ...string) *authRun {
	t.Helper()
	r := &authRun{addr: freeAddr(t), probe: freeAddr(t), logs: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	args := append([]string{"--simulate", "--collect-interval=1s", "--web.listen-address=" + r.addr,
		"--web.config.file=" + cfg, "--web.probe-address=" + r.probe}, extra...)
	if !strings.Contains(strings.Join(extra, " "), "--log.level=") {
		args = append(args, "--log.level=warn")
	}
	go func() { done <- run(ctx, args, io.Discard, r.logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("run did not return after cancel")
		}
	})
	waitFor(t, "http://"+r.probe+"/readyz", 200)
	return r
}

// The kubelet's probes need no secret: a probe listener serves /healthz and
// /readyz, and nothing else, without auth; the main listener keeps every
// path, /metrics and the health endpoints included, behind basic auth.
func TestProbeListenerNeedsNoSecret(t *testing.T) {
	r := startWithAuth(t, bcrypt.MinCost, "--web.enable-pprof")
	c := &http.Client{Timeout: 5 * time.Second}
	for _, tc := range []struct {
		url, user string
		want      int
	}{
		{"http://" + r.probe + "/healthz", "", 200},
		{"http://" + r.probe + "/readyz", "", 200},
		{"http://" + r.probe + "/metrics", "", 404},
		{"http://" + r.probe + "/", "", 404},
		{"http://" + r.probe + "/debug/pprof/", "", 404},
		{"http://" + r.addr + "/healthz", "", 401},
		{"http://" + r.addr + "/readyz", "", 401},
		{"http://" + r.addr + "/metrics", "", 401},
		{"http://" + r.addr + "/debug/pprof/", "", 401},
		{"http://" + r.addr + "/metrics", "prometheus", 200},
		{"http://" + r.addr + "/debug/pprof/", "prometheus", 200},
	} {
		t.Run(strings.NewReplacer(r.probe, "probe", r.addr, "web", "http://", "").Replace(tc.url)+" user="+tc.user, func(t *testing.T) {
			if code, body := get(t, c, tc.url, tc.user, "s3cret-scrape"); code != tc.want {
				t.Errorf("GET %s (user %q): %d, want %d: %.200s", tc.url, tc.user, code, tc.want, body)
			}
		})
	}
}

func TestProbeAddressFlag(t *testing.T) {
	for _, tc := range []struct{ args []string }{
		{[]string{"--web.probe-address=9948"}},
		{[]string{"--web.probe-address=:9948", "--web.listen-address=:9948"}},
		{[]string{"--web.max-connections=3"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var errb strings.Builder
			if code := run(context.Background(), tc.args, io.Discard, &errb); code != exitUsage || !strings.Contains(errb.String(), strings.SplitN(tc.args[0], "=", 2)[0]) {
				t.Errorf("%v: exit %d, %q", tc.args, code, errb.String())
			}
		})
	}
}

// A flood of unique wrong passwords from one address costs at most a few
// bcrypt comparisons before the address is refused (429) without one, and
// the real scraper, whose credentials were accepted before, keeps being
// served beside it. (exporter-toolkit ran bcrypt for every attempt, one at a
// time, and the scraper queued behind the flood once its cached login was
// evicted.)
func TestWrongPasswordFloodDoesNotStarveScraper(t *testing.T) {
	r := startWithAuth(t, bcrypt.DefaultCost)
	scraper := &http.Client{Timeout: 30 * time.Second}
	url := "http://" + r.addr + "/metrics"
	scrape := func() time.Duration {
		start := time.Now()
		if code, body := get(t, scraper, url, "prometheus", "s3cret-scrape"); code != 200 {
			t.Fatalf("the scraper got %d: %.200s", code, body)
		}
		return time.Since(start)
	}
	scrape() // the scraper's login is checked once
	var before []time.Duration
	for i := 0; i < 10; i++ {
		before = append(before, scrape())
	}

	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var n, refused, unauthorized atomic.Int64
	flood := &http.Client{Timeout: 30 * time.Second}
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				code, _ := get(t, flood, url, "prometheus", fmt.Sprintf("wrong-%d-%d", w, i))
				n.Add(1)
				switch code {
				case http.StatusTooManyRequests:
					refused.Add(1)
				case http.StatusUnauthorized:
					unauthorized.Add(1)
				case 200:
					t.Error("a wrong password was let in")
				}
			}
		}()
	}
	waitUntil(t, "the flood to reach the limiter", func() bool { return refused.Load() > 0 })
	var during []time.Duration
	for i := 0; i < 20; i++ {
		during = append(during, scrape())
	}
	stop()
	wg.Wait()

	// Limiter behaviour: at most the burst (5 failures per address) plus
	// the refill over the run reached bcrypt; everything else was refused
	// before it.
	if most := int64(5 + 5); unauthorized.Load() > most {
		t.Errorf("%d of %d wrong passwords reached bcrypt, want at most %d", unauthorized.Load(), n.Load(), most)
	}
	if refused.Load() < n.Load()/2 || refused.Load() < 100 {
		t.Errorf("%d of %d wrong passwords refused before bcrypt", refused.Load(), n.Load())
	}
	// Relative behaviour, generously bounded: the scraper beside the flood
	// stays in the range of its own latency without it (the toolkit took
	// seconds).
	if b, d := median(before), median(during); d > 20*b+250*time.Millisecond {
		t.Errorf("scraper median latency %v beside the flood, %v without", d, b)
	}
	t.Logf("%d flood requests (%d refused before bcrypt); scraper median %v without, %v beside the flood",
		n.Load(), refused.Load(), median(before), median(during))
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
