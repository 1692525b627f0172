package fakenvml_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
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
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// The real exporter binary, built once per test process. The
// TestRealBinary tests run at once (t.Parallel): each runs its own exporter
// on a node file of its own, and they wait on its samples more than they
// compute.
var (
	binOnce sync.Once
	binPath string
	binErr  error
)

func exporterBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		// make test builds the exporter once for every package.
		if binPath = os.Getenv("GPE_TEST_BINARY"); binPath != "" {
			return
		}
		root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
		if err != nil {
			binErr = fmt.Errorf("finding the module root: %v", err)
			return
		}
		binPath = filepath.Join(builder.Dir, "gpu-pool-exporter")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/gpu-pool-exporter")
		cmd.Dir = strings.TrimSpace(string(root))
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/gpu-pool-exporter: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// exporter is the real binary running on a fake driver.
type exporter struct {
	t      testing.TB
	cmd    *exec.Cmd
	addr   string
	stderr *lockedBuffer
	exited chan struct{}
	err    error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startExporter runs the agent (no simulation linked) on the library variant,
// serving node (written to dir), and waits until it serves a page with GPUs.
func startExporter(t testing.TB, variant, nodePath string, extra ...string) *exporter {
	t.Helper()
	return startExporterEnv(t, variant, nodePath, nil, extra...)
}

func startExporterEnv(t testing.TB, variant, nodePath string, env []string, extra ...string) *exporter {
	t.Helper()
	e := launchExporter(t, variant, nodePath, env, extra...)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_up"] != nil }, "a page with gpu_up")
	return e
}

// launchExporter runs the binary and returns once it listens, whatever
// NVML does.
func launchExporter(t testing.TB, variant, nodePath string, env []string, extra ...string) *exporter {
	t.Helper()
	bin := exporterBinary(t)
	lib := library(t, variant)
	// Every metric group: these tests check what NVML gives, not budgets.
	args := []string{"--nvml.library=" + lib, "--no-kubelet.enabled", "--dcgm.mode=off",
		"--web.listen-address=127.0.0.1:0", "--nvml.device-timeout=500ms"}
	// The defaults below, unless the test names its own (kingpin refuses a
	// flag given twice).
	for _, d := range []string{"--collector.profile=full", "--collect-interval=1s"} {
		name, _, _ := strings.Cut(d, "=")
		if !slices.ContainsFunc(extra, func(a string) bool { return strings.HasPrefix(a, name+"=") }) {
			args = append(args, d)
		}
	}
	args = append(args, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), fakenvml.EnvNode+"="+nodePath, "LD_LIBRARY_PATH="), env...)
	e := &exporter{t: t, cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(e.stderr, pw)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		e.err = cmd.Wait()
		pw.Close()
		close(e.exited)
	}()
	t.Cleanup(func() { e.stop() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var l struct{ Message, Address string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "serving /metrics" && l.Address != "" {
				select {
				case addr <- l.Address:
				default:
				}
			}
		}
	}()
	select {
	case e.addr = <-addr:
	case <-e.exited:
		t.Fatalf("%s: the exporter exited at start (%v):\n%s", variant, e.err, e.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: the exporter did not start listening:\n%s", variant, e.stderr.String())
	}
	return e
}

func (e *exporter) scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + e.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(resp.Body)
}

// goroutines reads the exporter's goroutine profile (it runs with
// --web.enable-pprof): its own goroutines, not counting those serving an
// HTTP connection (they follow the client), and of them those inside a
// call into NVML; and the profile, for a failure's message.
func (e *exporter) goroutines() (own, inNVML int, profile string) {
	e.t.Helper()
	resp, err := http.Get("http://" + e.addr + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		e.t.Fatalf("goroutine profile: %v", err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		e.t.Fatalf("goroutine profile: %s, %v:\n%s", resp.Status, err, body)
	}
	profile = string(body)
	// "goroutine profile: total N", then records of "N @ pc..." and their
	// frames, a blank line apart.
	_, records, _ := strings.Cut(profile, "\n")
	for _, rec := range strings.Split(records, "\n\n") {
		head, _, _ := strings.Cut(rec, "\n")
		count, _, ok := strings.Cut(head, " @ ")
		n, err := strconv.Atoi(count)
		if !ok || err != nil || strings.Contains(rec, "net/http.(*conn).serve") {
			continue
		}
		own += n
		if strings.Contains(rec, "go-nvml/pkg/nvml._Cfunc_") {
			inNVML += n
		}
	}
	if own == 0 {
		e.t.Fatalf("goroutine profile without goroutines:\n%s", profile)
	}
	return own, inNVML, profile
}

// waitFor scrapes until ok, failing the test if the exporter dies.
func (e *exporter) waitFor(ok func(map[string]*dto.MetricFamily) bool, what string) map[string]*dto.MetricFamily {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-e.exited:
			e.t.Fatalf("the exporter died (%v) waiting for %s:\n%s", e.err, what, e.stderr.String())
		default:
		}
		f, err := e.scrape()
		if err == nil && ok(f) {
			return f
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	e.t.Fatalf("no %s within 30s (last error %v):\n%s", what, last, e.stderr.String())
	return nil
}

// stop sends SIGTERM and requires a clean exit: no crash, no symbol lookup
// error, exit code 0.
func (e *exporter) stop() {
	e.t.Helper()
	select {
	case <-e.exited:
	default:
		_ = e.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-e.exited:
		case <-time.After(20 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.exited
			e.t.Errorf("the exporter did not stop within 20s of SIGTERM")
		}
	}
	if e.err != nil {
		e.t.Errorf("the exporter exited with %v", e.err)
	}
	if s := e.stderr.String(); strings.Contains(s, "symbol lookup error") || strings.Contains(s, "panic:") {
		e.t.Errorf("the exporter crashed:\n%s", s)
	}
}

func (e *exporter) alive() bool {
	select {
	case <-e.exited:
		return false
	default:
		return true
	}
}

// labelMap is a series' labels by name.
func labelMap(m *dto.Metric) map[string]string {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	return have
}

// sample finds a family's value for the series whose labels include want.
func sample(f map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	mf := f[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.Metric {
		have := labelMap(m)
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		}
	}
	return 0, false
}

// Families every supported branch serves from NVML on a data-centre GPU.
var everyBranch = []string{
	"gpu_up", "gpu_info", "gpu_driver_info",
	"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_utilization_ratio", "gpu_memory_utilization_ratio",
	"gpu_temperature_celsius", "gpu_power_watts", "gpu_energy_joules_total", "gpu_sm_clock_hertz", "gpu_memory_clock_hertz",
	"gpu_pcie_link_generation", "gpu_pcie_link_width", "gpu_power_limit_watts",
	"gpu_slowdown_temperature_celsius", "gpu_shutdown_temperature_celsius",
	"gpu_ecc_errors_total", "gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_remapped_rows_failed",
	"gpu_row_remap_banks",
	// R470 names the clock event reasons "throttle reasons"; same bits.
	"gpu_clock_event_active",
	"gpu_pcie_replay_errors_total", "gpu_nvlink_errors_total", "gpu_nvlink_active_links",
}

// newerThan lists families a branch's driver cannot provide: the field or
// function came later.
var notBefore = map[string]string{
	// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (field 230) is in the R570 header.
	"gpu_recovery_action_code": "r570",
	// nvmlDeviceGetMemoryInfo_v2 is R510: the first of these branches is R535.
	"gpu_memory_reserved_bytes": "r535",
}

func branchIndex(b string) int {
	for i, x := range fakenvml.Branches {
		if x == b {
			return i
		}
	}
	return len(fakenvml.Branches)
}

// TestRealBinaryOnEveryDriverBranch runs the exporter binary on each driver
// branch's library, and on a future one without the functions the newest
// nvml.h deprecates: it must start, serve what the branch can provide,
// leave out what it cannot, read the temperature with the versioned call
// where the driver has it (R570 on), and exit cleanly.
func TestRealBinaryOnEveryDriverBranch(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	for _, br := range append(append([]string{fakenvml.Full}, fakenvml.Branches...), fakenvml.Future) {
		t.Run(br, func(t *testing.T) {
			node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 3, br)
			node.GPUs[1].Memory.Used = 20 << 30
			node.GPUs[1].Utilization = &nvml.Utilization{Gpu: 75, Memory: 30}
			for _, p := range []int{nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_2_SLICE} {
				if _, err := node.GPUs[2].AddGPUInstance(p, 1); err != nil {
					t.Fatal(err)
				}
			}
			node.GPUs[2].MIG.Devices[1].Memory.Used = 3 << 30
			path := filepath.Join(t.TempDir(), "node.conf")
			if err := node.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			trace := filepath.Join(t.TempDir(), "trace")
			e := startExporterEnv(t, br, path, []string{fakenvml.EnvTrace + "=" + trace})
			// Let three samples pass (the first reads the slow-moving
			// health too): some families need a second sample, and the
			// exporter exposes no sample count to wait on.
			time.Sleep(3 * time.Second)
			f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_nvlink_active_links"] != nil }, "health families")
			var missing []string
			for _, name := range everyBranch {
				if f[name] == nil {
					missing = append(missing, name)
				}
			}
			for name, since := range notBefore {
				has := f[name] != nil
				if want := branchIndex(br) >= branchIndex(since); has != want {
					if want {
						missing = append(missing, name)
					} else {
						t.Errorf("%s serves %s, which needs %s or later", br, name, since)
					}
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("%s does not serve %s", br, strings.Join(missing, ", "))
			}
			// MIG instances: 3g.40gb at 0:4 as GPU instance 1, 2g.20gb at
			// 4:2 as 5 (numbered by placement, as the driver does).
			if v, _ := sample(f, "gpu_memory_used_bytes", map[string]string{"gpu": "2", "gpu_instance": "5", "mig_profile": "2g.20gb"}); v != 3<<30 {
				t.Errorf("gpu_memory_used_bytes of MIG 2g.20gb = %v, want %v", v, 3<<30)
			}
			if _, ok := sample(f, "gpu_memory_total_bytes", map[string]string{"gpu": "2", "gpu_instance": "1", "mig_profile": "3g.40gb"}); !ok {
				t.Error("no gpu_memory_total_bytes for MIG 3g.40gb")
			}
			for gpu := 0; gpu < 3; gpu++ {
				if v, ok := sample(f, "gpu_up", map[string]string{"gpu": fmt.Sprint(gpu)}); !ok || v != 1 {
					t.Errorf("gpu_up{gpu=%d} = %v, %v", gpu, v, ok)
				}
			}
			// v2 (R510+) reports reserved memory apart; on R470 the v1 call
			// counts it as used, and that is all there is.
			wantUsed := float64(20 << 30)
			if br == "r470" {
				wantUsed += float64(node.GPUs[1].Memory.Reserved)
			}
			if v, _ := sample(f, "gpu_memory_used_bytes", map[string]string{"gpu": "1", "gpu_instance": ""}); v != wantUsed {
				t.Errorf("gpu_memory_used_bytes{gpu=1} = %v, want %v", v, wantUsed)
			}
			if v, _ := sample(f, "gpu_utilization_ratio", map[string]string{"gpu": "1", "gpu_instance": ""}); v != 0.75 {
				t.Errorf("gpu_utilization_ratio{gpu=1} = %v, want 0.75", v)
			}
			if v, ok := sample(f, "gpu_driver_info", map[string]string{"driver_version": node.DriverVersion}); !ok || v != 1 {
				t.Errorf("gpu_driver_info has no driver_version=%s", node.DriverVersion)
			}
			if !e.alive() {
				t.Fatalf("the exporter died:\n%s", e.stderr.String())
			}
			// nvmlDeviceGetTemperatureV is in nvml.h from 12.8 (R570) on,
			// which marks nvmlDeviceGetTemperature DEPRECATED from 13.0.
			calls, err := os.ReadFile(trace)
			if err != nil {
				t.Fatal(err)
			}
			versioned, legacy := strings.Contains(string(calls), "nvmlDeviceGetTemperatureV "), strings.Contains(string(calls), "nvmlDeviceGetTemperature ")
			if want := branchIndex(br) >= branchIndex("r570"); versioned != want || legacy == want {
				t.Errorf("%s: nvmlDeviceGetTemperatureV called %v, nvmlDeviceGetTemperature called %v; want the versioned call %v", br, versioned, legacy, want)
			}
		})
	}
}

// TestRealBinarySurvivesFailingGPUs: a lost GPU, a hung GPU and a GPU that
// answers NO_PERMISSION leave the others reporting and the process up; a lost
// GPU that comes back reports again.
func TestRealBinarySurvivesFailingGPUs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 4, fakenvml.Full)
	path := filepath.Join(t.TempDir(), "node.conf")
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	e := startExporter(t, fakenvml.Full, path)
	node.GPUs[1].Lost = true
	node.GPUs[2].Blocks = map[string]time.Duration{"all": fakenvml.Forever}
	node.GPUs[3].Returns = map[string]nvml.Return{"nvmlDeviceGetPowerUsage": nvml.ERROR_NO_PERMISSION}
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	up := func(f map[string]*dto.MetricFamily, gpu int) float64 {
		v, _ := sample(f, "gpu_up", map[string]string{"gpu": fmt.Sprint(gpu)})
		return v
	}
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return up(f, 1) == 0 && up(f, 2) == 0 }, "GPUs 1 and 2 down")
	if up(f, 0) != 1 || up(f, 3) != 1 {
		t.Errorf("healthy GPUs down: gpu_up 0=%v 3=%v", up(f, 0), up(f, 3))
	}
	if _, ok := sample(f, "gpu_power_watts", map[string]string{"gpu": "3"}); ok {
		t.Error("gpu_power_watts served for a GPU that answers NO_PERMISSION")
	}
	if _, ok := sample(f, "gpu_power_watts", map[string]string{"gpu": "0"}); !ok {
		t.Error("gpu_power_watts missing on a healthy GPU")
	}
	node.GPUs[1].Lost = false
	node.GPUs[2].Blocks = nil
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return up(f, 1) == 1 && up(f, 2) == 1 }, "GPUs 1 and 2 back")
}

// TestRealBinaryServesRowRemapperHistogram: the banks a driver reports by
// spare rows left reach the page, and the ones with low or none left are
// counted for the replacement signal; they follow the driver as a GPU's
// banks wear down.
func TestRealBinaryServesRowRemapperHistogram(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
	node.GPUs[1].RemapperHistogram = &[5]uint32{630, 4, 3, 2, 1}
	path := filepath.Join(t.TempDir(), "node.conf")
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	e := startExporter(t, fakenvml.Full, path)
	banks := func(f map[string]*dto.MetricFamily, gpu, lvl string) float64 {
		v, _ := sample(f, "gpu_row_remap_banks", map[string]string{"gpu": gpu, "availability": lvl})
		return v
	}
	low := func(f map[string]*dto.MetricFamily, gpu string) float64 {
		v, _ := sample(f, "gpu_row_remap_banks_low_availability", map[string]string{"gpu": gpu})
		return v
	}
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return banks(f, "1", "max") == 630 }, "GPU 1's histogram")
	for lvl, want := range map[string]float64{"high": 4, "partial": 3, "low": 2, "none": 1} {
		if v := banks(f, "1", lvl); v != want {
			t.Errorf("GPU 1 banks %s = %v, want %v", lvl, v, want)
		}
	}
	if v := low(f, "1"); v != 3 {
		t.Errorf("GPU 1 low availability = %v, want 3", v)
	}
	if v := low(f, "0"); v != 0 {
		t.Errorf("GPU 0 low availability = %v, want 0", v)
	}
	node.GPUs[1].RemapperHistogram = &[5]uint32{630, 0, 0, 0, 10}
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return low(f, "1") == 10 }, "GPU 1's banks exhausted")
}

// TestRealBinaryCountsXIDs: XIDs injected into the driver reach the page.
func TestRealBinaryCountsXIDs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	path := filepath.Join(t.TempDir(), "node.conf")
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(t.TempDir(), "trace")
	e := startExporterEnv(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace})
	// NVML delivers no event raised before a set is registered.
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		v0, _ := sample(f, "gpu_xid_events_registered", map[string]string{"gpu": "0"})
		v1, _ := sample(f, "gpu_xid_events_registered", map[string]string{"gpu": "1"})
		return v0 == 1 && v1 == 1
	}, "both GPUs registered for events")
	node.Events = []fakenvml.Event{
		{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 79},
		{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 79},
		{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13},
	}
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	xid := func(f map[string]*dto.MetricFamily, gpu, code string) float64 {
		v, _ := sample(f, "gpu_xid_errors_total", map[string]string{"gpu": gpu, "xid": code})
		return v
	}
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return xid(f, "1", "79") == 2 && xid(f, "0", "13") == 1 }, "XIDs 79 x2 on GPU 1 and 13 on GPU 0")
	// The exporter waits with the v2 call, whose events carry MIG instance IDs.
	calls, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(calls), "nvmlEventSetWait_v2 ") || strings.Contains(string(calls), "nvmlEventSetWait ") {
		t.Errorf("the exporter does not wait for events with nvmlEventSetWait_v2")
	}
}

// TestRealBinaryStartsBesideAHungGPU: a GPU whose every NVML call hangs from
// the start must not keep the exporter from serving the others, and must be
// reported once it answers.
func TestRealBinaryStartsBesideAHungGPU(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	node.GPUs[1].Blocks = map[string]time.Duration{"all": fakenvml.Forever}
	path := filepath.Join(t.TempDir(), "node.conf")
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	e := startExporter(t, fakenvml.Full, path)
	up := func(f map[string]*dto.MetricFamily, gpu string) float64 {
		v, _ := sample(f, "gpu_up", map[string]string{"gpu": gpu})
		return v
	}
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return up(f, "0") == 1 }, "GPU 0 up beside hung GPU 1")
	node.GPUs[1].Blocks = nil
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return up(f, "1") == 1 }, "GPU 1 up once it answers")
}
