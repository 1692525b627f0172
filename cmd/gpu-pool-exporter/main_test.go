package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the exporter's logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestBadFlagsExit2(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "unknown long flag '--no-such-flag'"},
		{[]string{"--collect-interval=100ms"}, "--collect-interval=100ms is too short"},
		{[]string{"--collect-interval=soon"}, "collect-interval"},
		{[]string{"--log.format=xml"}, "log.format"},
		{[]string{"--nvml.device-timeout=10s", "--collect-interval=5s"}, "must be above 0 and at most --collect-interval"},
		{[]string{"--web.max-requests=-1"}, "--web.max-requests=-1"},
		{[]string{"--idle.threshold=5"}, "--idle.threshold=5 must be above 0 and at most 1"},
		{[]string{"--idle.threshold=NaN"}, "--idle.threshold=NaN must be above 0"},
		{[]string{"--dcgm.mode=off", "--dcgm.host-engine=h:5555"}, "contradicts --dcgm.mode=off"},
		{[]string{"--kubelet.resource-names="}, "--kubelet.resource-names=\"\""},
		{[]string{"--simulate", "--idle.price-file=/nonexistent/prices.yaml"}, "--idle.price-file"},
		{[]string{"--idle.window=1s"}, "--idle.window=1s must be at least 10s"},
		{[]string{"--fragmentation.shapes=1:x"}, "--fragmentation.shapes=1:x"},
		{[]string{"--idle.price=H100"}, "--idle.price=H100"},
		{[]string{"--dcgm.mode=always"}, "--dcgm.mode=always"},
		{[]string{"--dcgm.mode=standalone"}, "needs --dcgm.host-engine"},
		{[]string{"--dcgm.host-engine=nohost"}, "--dcgm.host-engine=nohost: want HOST:PORT"},
		{[]string{"--kubelet.refresh-interval=10ms"}, "--kubelet.refresh-interval=10ms is too short"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want 2", tc.args, code)
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: stderr %q does not say %q", tc.args, errb.String(), tc.want)
		}
	}
}

func TestNoNVMLLibrary(t *testing.T) {
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	var out, errb bytes.Buffer
	start := time.Now()
	code := run(context.Background(), []string{"--web.listen-address=" + freeAddr(t)}, &out, &errb)
	if code != exitError {
		t.Errorf("exit %d, want 1", code)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %s to fail; it must fail at once", d)
	}
	msg := strings.TrimSpace(errb.String())
	if strings.Count(msg, "\n") != 0 {
		t.Errorf("want one line, got:\n%s", msg)
	}
	for _, want := range []string{"libnvidia-ml.so.1", "/usr/local/nvidia/lib64", "--simulate"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
}

func TestSimulateServesAndShutsDown(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	var errb syncBuffer
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"--simulate", "--web.listen-address=" + addr, "--collect-interval=1s", "--nvml.device-timeout=500ms"}, io.Discard, &errb)
	}()
	body := waitFor(t, "http://"+addr+"/metrics", 200)
	for _, m := range []string{"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_utilization_ratio", "gpu_temperature_celsius",
		"gpu_power_watts", "gpu_energy_joules_total", "gpu_info", "gpu_driver_info", "gpu_exporter_build_info", "go_goroutines", "process_resident_memory_bytes"} {
		if !strings.Contains(body, "\n"+m) {
			t.Errorf("/metrics lacks %s", m)
		}
	}
	if n := strings.Count(body, "\ngpu_info{"); n != 8 {
		t.Errorf("%d gpu_info series, want 8", n)
	}
	checkWithPromtool(t, body)
	if b := waitFor(t, "http://"+addr+"/readyz", 200); !strings.Contains(b, "ok") {
		t.Errorf("/readyz: %q", b)
	}
	if b := waitFor(t, "http://"+addr+"/healthz", 200); !strings.Contains(b, "ok") {
		t.Errorf("/healthz: %q", b)
	}
	landing := waitFor(t, "http://"+addr+"/", 200)
	for _, want := range []string{`href="metrics"`, "NVIDIA H100 80GB HBM3", "nvidia7", "3g.40gb", "simulated"} {
		if !strings.Contains(landing, want) {
			t.Errorf("landing page lacks %q", want)
		}
	}
	cancel() // what SIGTERM does
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d after shutdown, want 0; log:\n%s", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no clean shutdown within 10s")
	}
	if !strings.Contains(errb.String(), "shutting down") {
		t.Errorf("shutdown not logged:\n%s", errb.String())
	}
}

func TestMalformedScenarioFails(t *testing.T) {
	f := t.TempDir() + "/bad.yaml"
	os.WriteFile(f, []byte("node:\n  model: H100-SXM5-80GB\n  count: 99\n"), 0o644)
	var errb bytes.Buffer
	code := run(context.Background(), []string{"--simulate.scenario=" + f, "--web.listen-address=" + freeAddr(t)}, io.Discard, &errb)
	if code != exitError {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(errb.String(), f+":3: field node.count") {
		t.Errorf("error does not name file, line and field: %s", errb.String())
	}
}

func waitFor(t *testing.T, url string, status int) string {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == status {
				return string(b)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer %d in time (last error %v)", url, status, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkWithPromtool runs `promtool check metrics`, the linter the issue names.
func checkWithPromtool(t *testing.T, body string) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found: install it with `apt-get install -y prometheus` (make test does)")
		}
		t.Log("promtool not found; skipping `promtool check metrics` (make test installs it)")
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool check metrics failed: %v\n%s", err, out)
	}
}

func TestHelpAndVersionExit0(t *testing.T) {
	for _, arg := range []string{"--help", "--version"} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{arg}, &out, &errb); code != 0 {
			t.Errorf("%s: exit %d, want 0 (stderr %q)", arg, code, errb.String())
		}
		if out.Len()+errb.Len() == 0 {
			t.Errorf("%s printed nothing", arg)
		}
	}
}
