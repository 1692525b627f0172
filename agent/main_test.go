package agent_test

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// A bad scenario file fails at start with what is wrong (the exit code is
// TestBadFlagsExit2's business once scenarios are checked with the flags).
func TestBadScenarioFails(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ yaml, want string }{
		{"node: {count: 2}\n---\nnode: {count: 3}\n", "a second YAML document"},
		{"node: {count: 0}\n", "field node.count: 0 GPUs"},
		{"faults:\n  - {gpu: 0, remap: {correctable: -2}}\n", "field faults[0].remap.correctable: -2 remapped rows"},
		{"# " + strings.Repeat("x", 5<<20), "the limit is 4194304 bytes (4 MiB)"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			f := filepath.Join(dir, "s.yaml")
			if err := os.WriteFile(f, []byte(tc.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			var errb bytes.Buffer
			code := runSim(context.Background(), []string{"--simulate.scenario=" + f, "--web.listen-address=" + freeAddr(t)}, io.Discard, &errb)
			if code == exitOK || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("scenario %.40q: exit %d, stderr %q; want a failure saying %q", tc.yaml, code, errb.String(), tc.want)
			}
		})
	}
}

func TestBadFlagsExit2(t *testing.T) {
	dir := t.TempDir()
	hugeWebConfig := filepath.Join(dir, "web.yml")
	if err := os.WriteFile(hugeWebConfig, append([]byte("# "), bytes.Repeat([]byte("x"), 300<<10)...), 0o644); err != nil {
		t.Fatal(err)
	}
	hugePriceFile := filepath.Join(dir, "prices.yaml")
	if err := os.WriteFile(hugePriceFile, append([]byte("per_gpu_hour:\n  x: 1\n# "), bytes.Repeat([]byte("x"), 300<<10)...), 0o644); err != nil {
		t.Fatal(err)
	}
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
		{[]string{"--kubelet.max-response-bytes=1KiB"}, "--kubelet.max-response-bytes=1KiB must be between 4MiB and 1GiB"},
		{[]string{"--kubelet.max-response-bytes=2GiB"}, "--kubelet.max-response-bytes=2GiB must be between"},
		{[]string{"--kubelet.max-response-bytes=lots"}, "--kubelet.max-response-bytes"},
		{[]string{"--collector.profile=tiny"}, "collector.profile"},
		{[]string{"--no-collector.dcgm", "--dcgm.host-engine=h:5555"}, "--no-collector.dcgm contradicts --dcgm.host-engine=h:5555"},
		{[]string{"--collector.nosuchgroup"}, "unknown long flag '--collector.nosuchgroup'"},
		{[]string{"--kubelet.refresh-interval=1000000h"}, "--kubelet.refresh-interval=1000000h0m0s is too long: it must be at most 2m0s"},
		{[]string{"--collect-interval=1000000h"}, "--collect-interval=1000000h0m0s is too long: it must be at most 5m0s"},
		{[]string{"--idle.window=1000000h"}, "--idle.window=1000000h0m0s must be at most 168h0m0s"},
		{[]string{"--web.shutdown-timeout=-1s"}, "--web.shutdown-timeout=-1s must be 0 (do not wait) to 5m0s"},
		{[]string{"--web.shutdown-timeout=1000h"}, "--web.shutdown-timeout=1000h0m0s must be 0"},
		{[]string{"--web.max-requests=99999999999999999999"}, "--web.max-requests=99999999999999999999: out of range"},
		{[]string{"--web.max-requests=1.5"}, "--web.max-requests=1.5: not a whole number"},
		{[]string{"--web.max-requests=1e3"}, "--web.max-requests=1e3: not a whole number"},
		{[]string{"--simulate.seed=99999999999999999999"}, "--simulate.seed=99999999999999999999"},
		{[]string{"--web.config.file=" + hugeWebConfig}, "larger than the limit of 262144 bytes (256 KiB)"},
		{[]string{"--simulate", "--idle.price-file=" + hugePriceFile}, "the limit is 262144 bytes (256 KiB)"},
		{[]string{"--kubelet.resource-names=a*b"}, "'*' is only allowed at the end"},
		{[]string{"--kubelet.pod-resources-socket=/" + strings.Repeat("x", 200)}, "check --kubelet.pod-resources-socket"},
		{[]string{"--procs.cri-socket=/run/%zz.sock"}, "--procs.cri-socket=/run/%zz.sock"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb)
			if code != exitUsage {
				t.Errorf("%v: exit %d, want 2", tc.args, code)
			}
			if !strings.Contains(errb.String(), tc.want) {
				t.Errorf("%v: stderr %q does not say %q", tc.args, errb.String(), tc.want)
			}
		})
	}
}

func TestNoNVMLLibraryNamesThePath(t *testing.T) {
	var errb bytes.Buffer
	code := run(context.Background(), []string{"--nvml.library=/wrong/path/libnvidia-ml.so.1", "--web.listen-address=" + freeAddr(t)}, io.Discard, &errb)
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	msg := strings.TrimSpace(errb.String())
	for _, want := range []string{"--nvml.library=/wrong/path/libnvidia-ml.so.1", "no such file", "gpu-pool-exporter-sim"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
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
	for _, want := range []string{"libnvidia-ml.so.1", "/usr/local/nvidia/lib64", "--nvml.library", "gpu-pool-exporter-sim"} {
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
		done <- runSim(ctx, []string{"--web.listen-address=" + addr, "--collect-interval=1s", "--nvml.device-timeout=500ms"}, io.Discard, &errb)
	}()
	body := waitFor(t, "http://"+addr+"/metrics", 200)
	for _, m := range []string{"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_utilization_ratio", "gpu_temperature_celsius",
		"gpu_power_watts", "gpu_energy_joules_total", "gpu_info", "gpu_driver_info", "gpu_exporter_build_info", "process_resident_memory_bytes"} {
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
	if err := os.WriteFile(f, []byte("node:\n  model: H100-SXM5-80GB\n  count: 99\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	code := runSim(context.Background(), []string{"--simulate.scenario=" + f, "--web.listen-address=" + freeAddr(t)}, io.Discard, &errb)
	if code != exitUsage {
		t.Errorf("exit %d, want %d (an input error)", code, exitUsage)
	}
	if !strings.Contains(errb.String(), f+":3: field node.count") {
		t.Errorf("error does not name file, line and field: %s", errb.String())
	}
}

// TestInputErrorsExit2 holds docs/failure-behaviour.md's rule: every error in what the user
// wrote (flags, scenario, price file, web config) exits 2; a machine without
// NVML or a port taken exits 1.
func TestInputErrorsExit2(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"flag", []string{"--collect-interval=1ms"}, exitUsage, "--collect-interval"},
		{"scenario syntax", []string{"--simulate.scenario=" + write("s1.yaml", "node: {count: many}\n")}, exitUsage, "s1.yaml"},
		{"scenario content", []string{"--simulate.scenario=" + write("s2.yaml", "node: {flavour: gke, count: 8, minorNumbers: [3, 2, 1, 0]}\n")}, exitUsage, "s2.yaml"},
		{"scenario missing", []string{"--simulate.scenario=" + filepath.Join(dir, "nope.yaml")}, exitUsage, "nope.yaml"},
		{"price file", []string{"--simulate", "--idle.price-file=" + write("p.yaml", "perGPUHour: [1\n")}, exitUsage, "--idle.price-file"},
		{"web config", []string{"--simulate", "--web.config.file=" + write("w.yaml", "tls_server_config: {cert_file: /nonexistent.crt}\n")}, exitUsage, "--web.config.file"},
		{"counters file: no field name", []string{"--simulate", "--compat.dcgm-exporter.collectors=" + write("c1.csv", "DCGM_FI_DEV_GPU_TEMP, gauge, t\ndcgm_fi_dev_fb_total, gauge, lower case\n")}, exitUsage, `c1.csv:2: "dcgm_fi_dev_fb_total" is no DCGM field name`},
		{"counters file: bad type of an unknown field", []string{"--simulate", "--compat.dcgm-exporter.collectors=" + write("c4.csv", "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_FROM_THE_FUTURE, gauges, t\n")}, exitUsage, `c4.csv:2: prometheus type "gauges"`},
		{"release line", []string{"--simulate", "--compat.dcgm-exporter", "--compat.dcgm-exporter.release=3.3"}, exitUsage, `--compat.dcgm-exporter.release: dcgm-exporter release line "3.3": want one of 4.8.2, 4.8.3, 4.9, 4.10`},
		{"host name label", []string{"--simulate", "--compat.dcgm-exporter", "--compat.dcgm-exporter.hostname-label=HOSTNAME"}, exitUsage, `--compat.dcgm-exporter.hostname-label="HOSTNAME"`},
		{"XID window", []string{"--simulate", "--compat.dcgm-exporter", "--compat.dcgm-exporter.xid-count-window-size=0"}, exitUsage, "--compat.dcgm-exporter.xid-count-window-size=0"},
		{"resource name", []string{"--simulate", "--compat.dcgm-exporter", "--compat.dcgm-exporter.nvidia-resource-names=gpu.shared"}, exitUsage, `"gpu.shared": want a device plugin resource name`},
		{"counters file: bad type", []string{"--simulate", "--compat.dcgm-exporter.collectors=" + write("c2.csv", "# comment\n\nDCGM_FI_DEV_GPU_TEMP, gague, t\n")}, exitUsage, `c2.csv:3: prometheus type "gague"`},
		{"counters file: malformed", []string{"--simulate", "--compat.dcgm-exporter.collectors=" + write("c3.csv", "DCGM_FI_DEV_GPU_TEMP, gauge\n")}, exitUsage, "c3.csv:1: want 3 comma-separated fields"},
		{"counters file: missing", []string{"--simulate", "--compat.dcgm-exporter.collectors=" + filepath.Join(dir, "nope.csv")}, exitUsage, "nope.csv"},
		{"pod labels without compat", []string{"--simulate", "--compat.dcgm-exporter.kubernetes-enable-pod-labels"}, exitUsage, "need --compat.dcgm-exporter"},
		{"pod UID without a node name", []string{"--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-pod-uid", "--node-name="}, exitUsage, "give --node-name"},
		{"pod label allowlist", []string{"--simulate", "--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-pod-labels", "--compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex=^app$,([bad"}, exitUsage, `"([bad"`},
		{"kubeconfig missing", []string{"--simulate", "--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-pod-uid", "--kubernetes.kubeconfig=" + filepath.Join(dir, "nope.kubeconfig")}, exitUsage, "--kubernetes.kubeconfig"},
		{"node condition without a node name", []string{"--node-condition", "--node-name="}, exitUsage, "--node-condition writes this node's condition: give --node-name"},
		{"resource slices without a node name", []string{"--kubernetes.resource-slices", "--node-name="}, exitUsage, "--kubernetes.resource-slices watches this node's ResourceSlices: give --node-name"},
		{"node condition type", []string{"--simulate", "--node-condition", "--node-condition.type=GPU Fault"}, exitUsage, `--node-condition.type="GPU Fault"`},
		{"node condition outside a pod", []string{"--simulate", "--node-condition", "--kubernetes.kubeconfig=" + filepath.Join(dir, "nope.kubeconfig")}, exitUsage, "--kubernetes.kubeconfig"},
		{"DRA labels without compat", []string{"--simulate", "--compat.dcgm-exporter.kubernetes-enable-dra"}, exitUsage, "it needs --compat.dcgm-exporter"},
		{"port taken", []string{"--simulate", "--web.listen-address=" + taken.Addr().String()}, exitError, "already in use"},
		{"no nvml", []string{"--nvml.library=" + filepath.Join(dir, "libnvidia-ml.so.1")}, exitError, "--nvml.library"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errb bytes.Buffer
			args := tc.args
			if tc.name != "port taken" {
				args = append(args, "--web.listen-address="+freeAddr(t))
			}
			if code := run(context.Background(), args, io.Discard, &errb); code != tc.code {
				t.Errorf("%s: exit %d, want %d; stderr: %s", tc.name, code, tc.code, errb.String())
			}
			if !strings.Contains(errb.String(), tc.want) {
				t.Errorf("%s: stderr %q does not say %q", tc.name, errb.String(), tc.want)
			}
		})
	}
}

// simBinary is gpu-pool-exporter-sim built (GPE_TEST_SIM_BINARY).
func simBinary(t *testing.T) string {
	t.Helper()
	return builtBinary(t, "GPE_TEST_SIM_BINARY", "gpu-pool-exporter-sim")
}

// builtBinary is $env, else cmd/<name> built into a temporary directory.
func builtBinary(t *testing.T, env, name string) string {
	t.Helper()
	if bin := os.Getenv(env); bin != "" {
		return bin
	}
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/"+name).CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/%s: %v\n%s", name, err, out)
	}
	return bin
}

// TestSetupFailureExits1 runs the built binary where the simulated node's
// host tree cannot be written (TMPDIR is missing): the machine's failure,
// not the user's, so the process exits 1 and not with the usage code 2.
func TestSetupFailureExits1(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := simBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--web.listen-address="+freeAddr(t))
	cmd.Env = append(os.Environ(), "TMPDIR="+filepath.Join(t.TempDir(), "missing"))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("want the exporter to fail at start; got %v; stderr:\n%s", err, errb.String())
	}
	if exit.ExitCode() != exitError {
		t.Errorf("exit %d, want %d (a setup failure, not a usage error); stderr:\n%s", exit.ExitCode(), exitError, errb.String())
	}
	if !strings.Contains(errb.String(), "simulated node's") || !strings.Contains(errb.String(), "TMPDIR") {
		t.Errorf("stderr does not say what failed:\n%s", errb.String())
	}
}

// TestHelpSaysExitCodes: whoever scripts around the exporter finds the
// codes in --help.
func TestHelpSaysExitCodes(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, io.Discard); code != exitOK {
		t.Fatalf("--help: exit %d", code)
	}
	help := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"Exit codes: 0 after a clean shutdown", "1 when the machine fails it", "2 when what you wrote is wrong"} {
		if !strings.Contains(help, want) {
			t.Errorf("--help does not say %q", want)
		}
	}
}

// TestREADMEExitCodes keeps docs/failure-behaviour.md on the rule above.
func TestREADMEExitCodes(t *testing.T) {
	b, err := os.ReadFile("../docs/failure-behaviour.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := strings.Join(strings.Fields(string(b)), " ")
	for _, want := range []string{
		"Bad input (flags, scenario, price file, web config): what was wrong and what to do, exit 2.",
		"`gpu-pool-exporter-sim` (the simulated node's binary), not `--simulate`; exit 1.",
		"Port in use: the error names the port and `--web.listen-address`; exit 1.",
	} {
		if !strings.Contains(readme, want) {
			t.Errorf("docs/failure-behaviour.md does not say %q", want)
		}
	}
}

func TestPortInUseNamesFlagAndPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	_, port, _ := net.SplitHostPort(taken.Addr().String())
	var errb bytes.Buffer
	code := runSim(context.Background(), []string{"--web.listen-address=" + taken.Addr().String()}, io.Discard, &errb)
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	msg := errb.String()
	for _, want := range []string{"port " + port + " is already in use", "choose a free port with --web.listen-address"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "SIMULATED") {
		t.Errorf("the node started before the port was checked:\n%s", msg)
	}
}

func TestStartupLogsServedURL(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var errb syncBuffer
	done := make(chan int)
	go func() {
		done <- runSim(ctx, []string{"--log.format=console", "--web.listen-address=127.0.0.1:0", "--collect-interval=1s"}, io.Discard, &errb)
	}()
	re := regexp.MustCompile(`serving /metrics .*url=(http://127\.0\.0\.1:[1-9][0-9]*/)`)
	ansi := regexp.MustCompile(`\x1b\[[0-9;]*m`)
	var url string
	pollUntil(waitTimeout, func() bool {
		if m := re.FindStringSubmatch(ansi.ReplaceAllString(errb.String(), "")); m != nil {
			url = m[1]
		}
		return url != ""
	})
	if url == "" {
		t.Fatalf("no served URL in the console log:\n%s", errb.String())
	}
	if body := waitFor(t, url+"metrics", 200); !strings.Contains(body, "gpu_info") {
		t.Errorf("%smetrics does not serve the exporter", url)
	}
	cancel()
	<-done
}

func TestLogDurationsHaveUnits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var errb syncBuffer
	done := make(chan int)
	go func() {
		done <- runSim(ctx, []string{"--web.listen-address=127.0.0.1:0", "--collect-interval=2s"}, io.Discard, &errb)
	}()
	pollUntil(waitTimeout, func() bool { return strings.Contains(errb.String(), "starting gpu-pool-exporter") })
	cancel()
	<-done
	if !strings.Contains(errb.String(), `"interval":"2s"`) {
		t.Errorf("start-up log does not give the interval with its unit (\"interval\":\"2s\"):\n%s", errb.String())
	}
}

func TestVersionSaysWhatItIs(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"--version"}, &out, io.Discard); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if strings.Contains(out.String(), "version  (") {
		t.Errorf("--version of a build without -ldflags names no version:\n%s", out.String())
	}
}

// checkWithPromtool runs `promtool check metrics`, Prometheus' own exposition linter.
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

// TestGoBuildSaysWhatItIs reads --version of a plain `go build` (no
// -ldflags) of a clean checkout, as a user would build it: the version and
// revision come from what Go embeds. make test's own build is such a binary
// when the checkout is clean (CI's is); otherwise the test clones HEAD and
// builds that.
func TestGoBuildSaysWhatItIs(t *testing.T) {
	t.Parallel()
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	rev := strings.TrimSpace(string(head))
	bin := plainBuildOf(rev)
	if bin == "" {
		if testing.Short() {
			t.Skip("builds the binary")
		}
		bin = buildCleanClone(t)
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("--version: %v", err)
	}
	first := strings.SplitN(string(out), "\n", 2)[0]
	// A tagged commit is vX.Y.Z; any other, Go's pseudo-version naming it.
	if !regexp.MustCompile(`version v\d+\.\d+\.\d+(-\S*` + rev[:12] + `)? `).MatchString(first) {
		t.Errorf("a plain go build of %s says %q: want Go's module version, which names the commit", rev[:12], first)
	}
	if !strings.Contains(first, "revision: "+rev+")") {
		t.Errorf("a plain go build of %s says %q: want revision %s", rev[:12], first, rev)
	}
}

// plainBuildOf returns GPE_TEST_BINARY when Go stamped it from an unmodified
// checkout of rev without -ldflags (make test builds it so), else "".
func plainBuildOf(rev string) string {
	bin := os.Getenv("GPE_TEST_BINARY")
	if bin == "" {
		return ""
	}
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["vcs.revision"] != rev || settings["vcs.modified"] != "false" || settings["-ldflags"] != "" {
		return ""
	}
	return bin
}

// buildCleanClone builds a clean clone of the checkout's HEAD with plain
// `go build` and returns the binary.
func buildCleanClone(t *testing.T) string {
	t.Helper()
	top, _ := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	clone := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("git", "clone", "--quiet", "--no-local", strings.TrimSpace(string(top)), clone).CombinedOutput(); err != nil {
		t.Skipf("git clone: %v\n%s", err, out)
	}
	bin := filepath.Join(t.TempDir(), "gpu-pool-exporter")
	// -trimpath: the clone's compiled packages do not name its temporary
	// directory, so the next run finds them in the build cache and only links.
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/gpu-pool-exporter")
	build.Dir = clone
	// A fresh machine's default; this one's go env may say -buildvcs=false.
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=auto")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestNodeSummaryFlags: node_summary is switched like every group, lean
// has it, default leaves it off, and full, which serves every group, leaves
// it off too: it only folds series away.
func TestNodeSummaryFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--collector.profile=lean"}, true},
		{[]string{"--collector.profile=full"}, false},
		{[]string{"--collector.profile=lean", "--no-collector.node_summary"}, false},
		{[]string{"--collector.node_summary"}, true},
		{[]string{"--collector.profile=full", "--collector.node_summary"}, true},
	} {
		t.Run(fmt.Sprint(tc.args), func(t *testing.T) {
			o, code, err := agent.ParseConfig(tc.args, io.Discard, io.Discard, nil)
			if err != nil || code != exitOK {
				t.Fatalf("%v: exit %d, %v", tc.args, code, err)
			}
			if got := o.Groups.On(render.GroupNodeSummary); got != tc.want {
				t.Errorf("%v: node_summary on: %v, want %v", tc.args, got, tc.want)
			}
		})
	}
}

// A counters file naming fields of later dcgm-exporter releases and one
// this exporter does not know: the exporter starts (no exit 2 on every GPU
// node of a DaemonSet), serves the known fields, counts the unknown one,
// and labels the series hostname (the default release line's spelling).
func TestCountersFileWithAnUnknownFieldStarts(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "mixed.csv")
	if err := os.WriteFile(file, []byte(`DCGM_FI_DEV_FB_CAPACITY_BYTES, gauge, Total GPU memory (in bytes).
DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND, gauge, PCIe TX (in B/s).
DCGM_EXP_XID_ERRORS_TOTAL, counter, Total XID errors observed since exporter start.
DCGM_FI_DEV_MADE_UP_BY_A_LATER_DCGM, gauge, Not known here.
`), 0o600); err != nil {
		t.Fatal(err)
	}
	body := simulatedPage(t, "--compat.dcgm-exporter", "--compat.dcgm-exporter.collectors="+file)
	for _, want := range []string{
		`gpu_exporter_compat_fields{state="unknown"} 1`,
		"\nDCGM_FI_DEV_FB_CAPACITY_BYTES{",
		"\nDCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{",
		`,hostname="`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	if strings.Contains(body, "DCGM_FI_DEV_MADE_UP_BY_A_LATER_DCGM") || strings.Contains(body, "Hostname=") {
		t.Error("the unknown field, or the Hostname label, is on the page")
	}
}

// The agent links no simulation and answers no question for people: given
// the simulated node's flags or one of gpupool's commands, it says where
// they went (exit 2) and starts nothing.
func TestAgentSaysWhereTheSimulationAndCommandsWent(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--simulate"}, "gpu-pool-exporter-sim"},
		{[]string{"--web.listen-address=127.0.0.1:0", "--simulate.scenario=x.yaml"}, "gpu-pool-exporter-sim"},
		{[]string{"status", "--url=http://localhost:9947"}, "gpupool status"},
		{[]string{"recommend", "--prometheus=http://p:9090"}, "gpupool recommend"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var errb bytes.Buffer
			if code := agent.Run(context.Background(), tc.args, io.Discard, &errb, nil); code != exitUsage {
				t.Fatalf("exit %d, want %d: %s", code, exitUsage, errb.String())
			}
			if !strings.Contains(errb.String(), tc.want) {
				t.Errorf("%q does not say %q", errb.String(), tc.want)
			}
		})
	}
}
