package fakenvml_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// The real binary across a node's life: a slow nvmlInit, a driver reload,
// an unloaded driver, GPUs that do not register for events, event sets
// that break, and a GPU that stalls the whole driver.

// get fetches a path of the exporter: status code and body.
func (e *exporter) get(path string) (int, string) {
	e.t.Helper()
	resp, err := http.Get("http://" + e.addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitHTTP polls a path until ok says so, failing after 30 s.
func (e *exporter) waitHTTP(path, what string, ok func(code int, body string) bool) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var code int
	var body string
	for time.Now().Before(deadline) {
		if !e.alive() {
			e.t.Fatalf("the exporter died (%v) waiting for %s:\n%s", e.err, what, e.stderr.String())
		}
		if code, body = e.get(path); ok(code, body) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("no %s within 30s: %s answered %d %q\n%s", what, path, code, body, e.stderr.String())
}

func value(f map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	v, _ := sample(f, name, labels)
	return v
}

func traceLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

func countCalls(lines []string, fn string) int {
	n := 0
	for _, l := range lines {
		if strings.HasPrefix(l, fn+" ") {
			n++
		}
	}
	return n
}

func writeNode(t *testing.T, node *fakenvml.Node, path string) {
	t.Helper()
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
}

// An nvmlInit that does not return keeps nothing from listening: /healthz
// answers at once, /readyz and the page say what the exporter waits for,
// and NVML is initialised exactly once (no Init, Shutdown, Init).
func TestRealBinaryServesWhileNVMLInitHangs(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	node.Blocks = map[string]time.Duration{"nvmlInit": fakenvml.Forever}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	trace := filepath.Join(t.TempDir(), "trace")
	e := launchExporter(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace}) // --nvml.init-timeout=10s

	if code, body := e.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while nvmlInit hangs: %d %q, want 200", code, body)
	}
	e.waitHTTP("/readyz", "a /readyz that names nvmlInit", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "nvmlInit")
	})
	e.waitHTTP("/", "a landing page that says nvmlInit has not returned", func(code int, body string) bool {
		return code == http.StatusOK && strings.Contains(body, "nvmlInit has not returned")
	})
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return f["gpu_exporter_nvml_initialized"] != nil }, "gpu_exporter_nvml_initialized")
	if v := value(f, "gpu_exporter_nvml_initialized", nil); v != 0 {
		t.Errorf("gpu_exporter_nvml_initialized = %v while nvmlInit hangs, want 0", v)
	}
	if !strings.Contains(e.stderr.String(), "nvmlInit has not returned") {
		t.Errorf("no warning in the log that nvmlInit has not returned:\n%s", e.stderr.String())
	}

	node.Blocks = nil
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_up", map[string]string{"gpu": "1"}) == 1 && value(f, "gpu_exporter_nvml_initialized", nil) == 1
	}, "GPUs up once nvmlInit returns")
	e.waitHTTP("/readyz", "ready", func(code int, _ string) bool { return code == http.StatusOK })
	calls := traceLines(t, trace)
	if n := countCalls(calls, "nvmlInit"); n != 1 {
		t.Errorf("nvmlInit called %d times, want once", n)
	}
	if n := countCalls(calls, "nvmlShutdown"); n != 0 {
		t.Errorf("nvmlShutdown called %d times while running, want none", n)
	}
}

// nvmlInit succeeds but nvmlDeviceGetCount fails with an error that does
// not say the driver went away: each successful nvmlInit is paired with
// nvmlShutdown (NVML keeps the library, and the driver, until as many
// shutdowns as inits), tried again with backoff (1 s doubling), logged
// once, and counted in gpu_exporter_nvml_inits_total. When the GPUs can be
// listed they come up, with one nvmlInit held.
func TestRealBinaryReleasesNVMLWhenTheGPUsCannotBeListed(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	node.Returns = map[string]nvml.Return{"nvmlDeviceGetCount_v2": nvml.ERROR_UNKNOWN}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	trace := filepath.Join(t.TempDir(), "trace")
	exporterBinary(t) // built before the clock starts
	start := time.Now()
	e := launchExporter(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace})
	e.waitHTTP("/readyz", "a /readyz naming nvmlDeviceGetCount's answer", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "Unknown Error")
	})
	time.Sleep(4 * time.Second)
	calls := traceLines(t, trace)
	inits, shutdowns := countCalls(calls, "nvmlInit"), countCalls(calls, "nvmlShutdown")
	// Tries at 0 s, then after 1, 2, 4 s...: at most one more than the
	// doublings that fit in the time the exporter ran.
	allowed := 1
	for at, b := time.Second, time.Second; at <= time.Since(start); at, b = at+2*b, 2*b {
		allowed++
	}
	if inits > allowed {
		t.Errorf("nvmlInit called %d times in %s, want at most %d (backoff)", inits, time.Since(start).Round(time.Second), allowed)
	}
	if shutdowns != inits && shutdowns != inits-1 {
		t.Errorf("nvmlInit succeeded %d times, nvmlShutdown called %d times: each nvmlInit must be paired", inits, shutdowns)
	}
	if n := strings.Count(e.stderr.String(), "cannot list the GPUs"); n != 1 {
		t.Errorf("the failure was logged %d times, want once:\n%s", n, e.stderr.String())
	}

	node.Returns = nil
	writeNode(t, node, path)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_up", map[string]string{"gpu": "1"}) == 1 && value(f, "gpu_exporter_nvml_initialized", nil) == 1
	}, "GPUs up once they can be listed")
	calls = traceLines(t, trace)
	inits, shutdowns = countCalls(calls, "nvmlInit"), countCalls(calls, "nvmlShutdown")
	if shutdowns != inits-1 {
		t.Errorf("after recovery: %d nvmlInit, %d nvmlShutdown; want every nvmlInit but the one in use released", inits, shutdowns)
	}
	if v := value(f, "gpu_exporter_nvml_inits_total", nil); v != float64(inits) {
		t.Errorf("gpu_exporter_nvml_inits_total = %v, want %d: every successful nvmlInit", v, inits)
	}
}

// A driver reload (every call UNINITIALIZED until nvmlInit again) is
// recovered: NVML is released and initialised again, the GPUs come back,
// and XIDs raised after the reload are counted on a new event set. An
// unloaded driver that stays away fails /healthz after --nvml.restart-after.
func TestRealBinaryRecoversFromDriverReload(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	trace := filepath.Join(t.TempDir(), "trace")
	e := startExporterEnv(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace}, "--nvml.restart-after=3s")
	up := func(f map[string]*dto.MetricFamily, gpu string) float64 {
		return value(f, "gpu_up", map[string]string{"gpu": gpu})
	}
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return up(f, "0") == 1 && value(f, "gpu_xid_events_registered", map[string]string{"gpu": "1"}) == 1
	}, "GPUs up and registered for events")

	t.Run("reload", func(t *testing.T) {
		node.DriverGeneration = 2
		writeNode(t, node, path)
		e.waitFor(func(f map[string]*dto.MetricFamily) bool {
			return value(f, "gpu_exporter_nvml_inits_total", nil) == 2 && up(f, "0") == 1 && up(f, "1") == 1 &&
				value(f, "gpu_xid_events_registered", map[string]string{"gpu": "1"}) == 1
		}, "NVML initialised again, GPUs up, GPU 1 registered for events")
		node.Events = []fakenvml.Event{{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 79}}
		writeNode(t, node, path)
		e.waitFor(func(f map[string]*dto.MetricFamily) bool {
			return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "xid": "79"}) == 1
		}, "an XID raised after the reload counted")
		// The old library instance was released before the new one was
		// initialised: nothing of the old driver stays open.
		calls := traceLines(t, trace)
		reload, shutdown, init := -1, -1, -1
		for i, l := range calls {
			switch {
			case strings.HasPrefix(l, "driver-reload "):
				reload = i
			case strings.HasPrefix(l, "nvmlShutdown ") && reload >= 0 && shutdown < 0:
				shutdown = i
			case strings.HasPrefix(l, "nvmlInit ") && reload >= 0 && init < 0:
				init = i
			}
		}
		if reload < 0 || shutdown < 0 || init < 0 || shutdown > init {
			t.Errorf("want driver-reload, then nvmlShutdown, then nvmlInit in the trace; at lines %d, %d, %d", reload, shutdown, init)
		}
	})

	t.Run("unloaded past the bound", func(t *testing.T) {
		node.DriverUnloaded = true
		writeNode(t, node, path)
		e.waitFor(func(f map[string]*dto.MetricFamily) bool {
			return value(f, "gpu_exporter_nvml_initialized", nil) == 0 && f["gpu_up"] != nil && up(f, "0") == 0 && up(f, "1") == 0
		}, "NVML down and every GPU down, with its series kept")
		e.waitHTTP("/readyz", "not ready, saying why", func(code int, body string) bool {
			return code == http.StatusServiceUnavailable && strings.Contains(body, "NVML")
		})
		e.waitHTTP("/healthz", "a failing /healthz once NVML stayed unusable past --nvml.restart-after", func(code int, body string) bool {
			return code == http.StatusServiceUnavailable && strings.Contains(body, "unusable")
		})
		node.DriverUnloaded = false
		node.DriverGeneration = 3
		writeNode(t, node, path)
		e.waitFor(func(f map[string]*dto.MetricFamily) bool {
			return value(f, "gpu_exporter_nvml_initialized", nil) == 1 && up(f, "0") == 1
		}, "NVML back when the driver is")
		e.waitHTTP("/healthz", "a passing /healthz", func(code int, _ string) bool { return code == http.StatusOK })
	})
}

// GPUs register for events in parallel under a deadline: one whose
// registration hangs does not keep the others from being heard, it shows
// as not registered, and joins when its call returns. A GPU whose
// registration failed is tried again.
func TestRealBinaryRegistersEventsPerGPU(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 3, fakenvml.Full)
	node.GPUs[1].Blocks = map[string]time.Duration{"nvmlDeviceRegisterEvents": fakenvml.Forever}
	node.GPUs[2].Returns = map[string]nvml.Return{"nvmlDeviceRegisterEvents": nvml.ERROR_UNKNOWN}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	e := startExporter(t, fakenvml.Full, path)
	reg := func(f map[string]*dto.MetricFamily, gpu string) float64 {
		v, ok := sample(f, "gpu_xid_events_registered", map[string]string{"gpu": gpu})
		if !ok {
			return -1
		}
		return v
	}
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return reg(f, "0") == 1 }, "GPU 0 registered for events")
	if reg(f, "1") != 0 || reg(f, "2") != 0 {
		t.Errorf("gpu_xid_events_registered: GPU 1 (hangs) %v, GPU 2 (fails) %v, want 0 and 0", reg(f, "1"), reg(f, "2"))
	}
	if _, body := e.get("/"); !strings.Contains(body, "not registered (XIDs not seen): GPU 1, 2") {
		t.Errorf("the landing page does not name the GPUs not registered:\n%s", body)
	}
	node.Events = []fakenvml.Event{{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13}}
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "0", "xid": "13"}) == 1
	}, "GPU 0's XID counted while GPU 1's registration hangs")

	node.GPUs[1].Blocks = nil
	node.GPUs[2].Returns = nil
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return reg(f, "1") == 1 && reg(f, "2") == 1 },
		"GPU 1 registered once its call returns, GPU 2 on a retry")
	node.Events = append(node.Events,
		fakenvml.Event{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: 79},
		fakenvml.Event{GPU: 2, Type: nvml.EventTypeXidCriticalError, Data: 48})
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "xid": "79"}) == 1 &&
			value(f, "gpu_xid_errors_total", map[string]string{"gpu": "2", "xid": "48"}) == 1
	}, "XIDs of the late GPUs counted")
}

// twoRegisteredGPUs runs the real binary on two H100s, tracing the calls,
// until both GPUs are registered for events.
func twoRegisteredGPUs(t *testing.T) (node *fakenvml.Node, path, trace string, e *exporter) {
	t.Helper()
	node = fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	path = filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	trace = filepath.Join(t.TempDir(), "trace")
	e = startExporterEnv(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace})
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_events_registered", map[string]string{"gpu": "1"}) == 1
	}, "both GPUs registered")
	return node, path, trace, e
}

// A set that breaks (a GPU registered on it falls off the bus) is replaced
// by a new one created before the old one is closed, and what the old one
// still holds is read: XIDs of the healthy GPUs raised while the new set is
// being created are not lost.
func TestRealBinaryKeepsXIDsAcrossSetRecreation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node, path, trace, e := twoRegisteredGPUs(t)
	creates := countCalls(traceLines(t, trace), "nvmlEventSetCreate")

	// GPU 1 falls off the bus; creating the next set takes 3 s.
	node.GPUs[1].Lost = true
	node.Blocks = map[string]time.Duration{"nvmlEventSetCreate": 3 * time.Second}
	writeNode(t, node, path)
	deadline := time.Now().Add(30 * time.Second)
	for countCalls(traceLines(t, trace), "nvmlEventSetCreate") == creates {
		if time.Now().After(deadline) {
			t.Fatalf("the broken set was never replaced:\n%s", e.stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// While the new set is being created, GPU 0 raises XIDs.
	node.Events = []fakenvml.Event{
		{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13},
		{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13},
	}
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "0", "xid": "13"}) == 2
	}, "both XIDs raised during the re-creation counted")
	for _, l := range traceLines(t, trace) {
		if strings.HasPrefix(l, "event-lost ") {
			t.Errorf("the driver dropped an event for want of a registered set: %s", l)
		}
	}
}

// A GPU lost from the bus cannot be registered on the next event set, nor
// tell its UUID: its gpu_xid_events_registered series says 0 under the
// identity it had, so that it still joins gpu_info (which keeps it too).
func TestRealBinaryKeepsALostGPUsIdentityInItsRegistration(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node, path, _, e := twoRegisteredGPUs(t)
	uuid := node.GPUs[1].UUID
	node.GPUs[1].Lost = true
	writeNode(t, node, path)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		v, ok := sample(f, "gpu_xid_events_registered", map[string]string{"gpu": "1"})
		return ok && v == 0
	}, "GPU 1 not registered")
	for _, m := range f["gpu_xid_events_registered"].GetMetric() {
		labels := labelMap(m)
		if labels["gpu"] == "1" && labels["uuid"] != uuid {
			t.Errorf("gpu_xid_events_registered of the lost GPU has uuid %q, want %q", labels["uuid"], uuid)
		}
	}
	if _, ok := sample(f, "gpu_info", map[string]string{"gpu": "1", "uuid": uuid}); !ok {
		t.Errorf("gpu_info of the lost GPU lost its uuid %s", uuid)
	}
}

// A set replaced during an XID storm counts every XID once: GPU 1 falls
// off the bus (breaking the set) as GPU 0 starts raising XID 13 at 1 kHz,
// and the next set takes 200 ms to create. What the old set received
// before the new one is registered is read from the old one; nothing
// reaches the page twice (an XID raised while both sets are registered is
// delivered to both).
func TestRealBinaryCountsEachXIDOnceAcrossSetRecreation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	const raised = 2000
	node, path, trace, e := twoRegisteredGPUs(t)
	creates := countCalls(traceLines(t, trace), "nvmlEventSetCreate")

	node.GPUs[1].Lost = true
	node.Blocks = map[string]time.Duration{"nvmlEventSetCreate": 200 * time.Millisecond}
	node.Bursts = []fakenvml.Burst{{GPU: 0, Type: nvml.EventTypeXidCriticalError, Data: 13, Count: raised, Every: time.Millisecond}}
	writeNode(t, node, path)
	count := func(f map[string]*dto.MetricFamily) float64 {
		return value(f, "gpu_xid_errors_total", map[string]string{"gpu": "0", "xid": "13"})
	}
	// Wait until the count holds still for two samples: every XID raised
	// has been read, from one set or the other.
	var last, n float64 = -1, 0
	stable := 0
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		ts := value(f, "gpu_exporter_last_sample_timestamp_seconds", nil)
		if ts == last {
			return false
		}
		last = ts
		if c := count(f); c >= raised && c == n {
			stable++
		} else {
			n, stable = c, 0
		}
		return stable >= 2
	}, "every XID of the storm counted, and the count holding still")
	if n != raised {
		t.Errorf("gpu_xid_errors_total{gpu=0,xid=13} = %v for %d XIDs raised", n, raised)
	}
	if countCalls(traceLines(t, trace), "nvmlEventSetCreate") == creates {
		t.Error("the broken set was never replaced")
	}
}

// A GPU hung inside the driver holding a driver-wide lock stalls every
// GPU. What the operator sees, precisely: the sampler goes on (a new
// sample every interval) and says every GPU is down and the nvml collector
// failing; each GPU's last answer stays where the stall began, so the page's
// sample age is at least the stall's length; /readyz fails naming a GPU,
// /healthz passes, and NVML is neither released nor initialised again (the
// driver is loaded). Goroutines do not pile up: one per GPU stays blocked,
// however many samples pass. The exporter still stops on SIGTERM during a
// stall, without waiting for calls that never return.
func TestRealBinaryDriverWideStall(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	const gpuCount = 4
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, gpuCount, fakenvml.Full)
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	trace := filepath.Join(t.TempDir(), "trace")
	// pprof: the goroutines are counted from the goroutine profile, by
	// what each is doing (go_goroutines on the page also counts the
	// connections of the scrapes, which come and go with the client).
	e := startExporterEnv(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace}, "--web.enable-pprof")
	up := func(f map[string]*dto.MetricFamily, gpu int) float64 {
		return value(f, "gpu_up", map[string]string{"gpu": fmt.Sprint(gpu), "gpu_instance": ""})
	}
	allDown := func(f map[string]*dto.MetricFamily) bool {
		for gpu := 0; gpu < gpuCount; gpu++ {
			if up(f, gpu) != 0 {
				return false
			}
		}
		return true
	}
	allUp := func(f map[string]*dto.MetricFamily) bool {
		for gpu := 0; gpu < gpuCount; gpu++ {
			if up(f, gpu) != 1 {
				return false
			}
		}
		return value(f, "gpu_xid_events_registered", map[string]string{"gpu": fmt.Sprint(gpuCount - 1)}) == 1
	}
	// samples waits for n new samples and returns the last page.
	samples := func(n int) map[string]*dto.MetricFamily {
		t.Helper()
		var f map[string]*dto.MetricFamily
		last := -1.0
		for seen := 0; seen <= n; seen++ {
			f = e.waitFor(func(f map[string]*dto.MetricFamily) bool {
				return value(f, "gpu_exporter_last_sample_timestamp_seconds", nil) != last
			}, "a new sample")
			last = value(f, "gpu_exporter_last_sample_timestamp_seconds", nil)
		}
		return f
	}
	e.waitFor(allUp, "every GPU up and registered for events")
	samples(2)
	baseline, _, _ := e.goroutines()

	stall := func() float64 {
		t.Helper()
		node.Blocks = map[string]time.Duration{"all": fakenvml.Forever}
		writeNode(t, node, path)
		return float64(time.Now().UnixNano()) / 1e9
	}
	stalled := stall()
	e.waitFor(allDown, "every GPU down")
	f1 := samples(3)
	lastAnswer := map[int]float64{}
	for gpu := 0; gpu < gpuCount; gpu++ {
		v, ok := sample(f1, "gpu_last_sample_timestamp_seconds", map[string]string{"gpu": fmt.Sprint(gpu)})
		if !ok || v > stalled {
			t.Errorf("GPU %d: gpu_last_sample_timestamp_seconds %v (present %v), want at most %v, when the stall began", gpu, v, ok, stalled)
		}
		lastAnswer[gpu] = v
	}
	for name, want := range map[string]float64{"gpu_exporter_nvml_initialized": 1, "gpu_exporter_nvml_inits_total": 1} {
		if v := value(f1, name, nil); v != want {
			t.Errorf("%s = %v during a stall, want %v (the driver is loaded: a stall is not a reload)", name, v, want)
		}
	}
	if v := value(f1, "gpu_exporter_collector_up", map[string]string{"collector": "nvml"}); v != 0 {
		t.Errorf("gpu_exporter_collector_up{collector=nvml} = %v during a stall, want 0", v)
	}
	ts1, age1 := value(f1, "gpu_exporter_last_sample_timestamp_seconds", nil), value(f1, "gpu_exporter_sample_age_seconds", nil)
	if age1 < ts1-stalled {
		t.Errorf("gpu_exporter_sample_age_seconds %v, want at least %v: the time since the stall began", age1, ts1-stalled)
	}
	before, inNVML, profile := e.goroutines()
	// One per GPU, and the XID reader's event wait.
	if before > baseline+gpuCount || inNVML > gpuCount+1 {
		t.Errorf("%d goroutines after 3 stalled samples (%d in NVML calls), %d before the stall: more than one per GPU blocked\n%s", before, inNVML, baseline, profile)
	}

	f2 := samples(15)
	if after, afterNVML, profile := e.goroutines(); after > before || afterNVML > inNVML {
		t.Errorf("goroutines %d (%d in NVML calls) after 3 stalled samples, %d (%d) after 15 more: they pile up\n%s", before, inNVML, after, afterNVML, profile)
	}
	ts2, age2 := value(f2, "gpu_exporter_last_sample_timestamp_seconds", nil), value(f2, "gpu_exporter_sample_age_seconds", nil)
	if ts2 <= ts1 {
		t.Errorf("gpu_exporter_last_sample_timestamp_seconds %v, then %v: the sampler must go on during a stall", ts1, ts2)
	}
	if age2 <= age1 || age2 < ts2-stalled {
		t.Errorf("gpu_exporter_sample_age_seconds %v, then %v: it must grow with the stall (at least %v)", age1, age2, ts2-stalled)
	}
	for gpu := 0; gpu < gpuCount; gpu++ {
		if v, _ := sample(f2, "gpu_last_sample_timestamp_seconds", map[string]string{"gpu": fmt.Sprint(gpu)}); v != lastAnswer[gpu] {
			t.Errorf("GPU %d: gpu_last_sample_timestamp_seconds moved from %v to %v while it answered nothing", gpu, lastAnswer[gpu], v)
		}
	}
	if !allDown(f2) {
		t.Error("a GPU reported up during a driver-wide stall")
	}
	if code, body := e.get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "has not answered") {
		t.Errorf("/readyz during a stall: %d %q, want 503 naming a GPU that has not answered", code, body)
	}
	if code, _ := e.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d during a stall, want 200 (the driver is loaded; restarting would not help)", code)
	}
	if n := countCalls(traceLines(t, trace), "nvmlShutdown"); n != 0 {
		t.Errorf("nvmlShutdown called %d times during a stall, want none", n)
	}

	node.Blocks = nil
	writeNode(t, node, path)
	e.waitFor(allUp, "GPUs back once the driver answers")

	// SIGTERM during a stall: a clean exit, without waiting for the calls
	// that never return (stop fails the test after 20 s).
	stall()
	e.waitFor(allDown, "every GPU down again")
	e.stop()
}

// SIGTERM with one GPU hung in the driver: the exporter exits at once
// (code 0), without nvmlShutdown under the hung call, and says in its log
// that it abandoned calls blocked in the driver, naming the GPU.
func TestRealBinaryLogsAbandonedCallsAtExit(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node, path, trace, e := twoRegisteredGPUs(t)
	node.GPUs[1].Blocks = map[string]time.Duration{"all": fakenvml.Forever}
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_up", map[string]string{"gpu": "1", "gpu_instance": ""}) == 0
	}, "GPU 1 down, its calls hung")
	e.stop() // fails the test unless it exits with 0 within 20 s
	found := false
	for _, line := range strings.Split(e.stderr.String(), "\n") {
		var l struct {
			Level, Message string
			GPUs           []int
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Level == "warn" && strings.Contains(l.Message, "abandoned") && slices.Contains(l.GPUs, 1) {
			found = true
		}
	}
	if !found {
		t.Errorf("no warning that calls blocked in the driver on GPU 1 were abandoned:\n%s", e.stderr.String())
	}
	if n := countCalls(traceLines(t, trace), "nvmlShutdown"); n != 0 {
		t.Errorf("nvmlShutdown called %d times under a hung call, want none", n)
	}
}

// migUUIDs lists every MIG UUID the page names, in any family.
func migUUIDs(f map[string]*dto.MetricFamily) map[string]bool {
	seen := map[string]bool{}
	for _, mf := range f {
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "mig_uuid" && l.GetValue() != "" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	return seen
}

// MIG reconfigured under the running exporter (nvidia-smi mig -dci -dgi,
// then -cgi -C; or mig-parted in one go): the handles of the destroyed
// instances go stale (INVALID_ARGUMENT), new instances reuse the GPU
// instance IDs with new UUIDs and profiles. The first sample taken after
// the change serves the new layout and nothing of the old one, every MIG
// device up, without NVML being initialised again.
func TestRealBinaryFollowsMIGReconfiguration(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	g := &node.GPUs[1]
	for range 2 {
		if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	trace := filepath.Join(t.TempDir(), "trace")
	e := startExporterEnv(t, fakenvml.Full, path, []string{fakenvml.EnvTrace + "=" + trace})
	uuids := func() []string {
		var u []string
		for _, d := range g.MIG.Devices {
			u = append(u, d.UUID)
		}
		return u
	}
	migUp := func(f map[string]*dto.MetricFamily, uuid string) float64 {
		v, ok := sample(f, "gpu_mig_info", map[string]string{"gpu": "1", "mig_uuid": uuid})
		if !ok || v != 1 {
			return -1
		}
		for _, d := range g.MIG.Devices {
			if d.UUID == uuid {
				up, ok := sample(f, "gpu_up", map[string]string{"gpu": "1", "gpu_instance": fmt.Sprint(d.GPUInstance), "compute_instance": fmt.Sprint(d.ComputeInstance)})
				if !ok {
					return -1
				}
				return up
			}
		}
		return -1
	}
	old := uuids()
	e.waitFor(func(f map[string]*dto.MetricFamily) bool { return migUp(f, old[0]) == 1 && migUp(f, old[1]) == 1 }, "both 3g.40gb MIG devices up")

	// change writes the node and returns the first page sampled after it.
	change := func() map[string]*dto.MetricFamily {
		t.Helper()
		writeNode(t, node, path)
		written := float64(time.Now().UnixNano()) / 1e9
		return e.waitFor(func(f map[string]*dto.MetricFamily) bool {
			return value(f, "gpu_exporter_last_sample_timestamp_seconds", nil) > written
		}, "a sample taken after the MIG change")
	}
	// onlyNew fails for a page that names a MIG UUID not in want, or lacks
	// one of want, or reports one of want down.
	onlyNew := func(f map[string]*dto.MetricFamily, want []string) {
		t.Helper()
		page := migUUIDs(f)
		for _, u := range want {
			if v := migUp(f, u); v != 1 {
				t.Errorf("MIG device %s: gpu_mig_info or gpu_up %v in the first sample after the change, want up", u, v)
			}
			delete(page, u)
		}
		for u := range page {
			t.Errorf("the page still names MIG device %s, destroyed before this sample", u)
		}
		if v := value(f, "gpu_up", map[string]string{"gpu": "1", "gpu_instance": ""}); v != 1 {
			t.Errorf("gpu_up of the MIG GPU = %v, want 1", v)
		}
	}

	// removeAll destroys every GPU instance of the GPU.
	removeAll := func() {
		t.Helper()
		var ids []int
		for _, gi := range g.MIG.GPUInstances {
			ids = append(ids, gi.ID)
		}
		for _, id := range ids {
			if err := g.RemoveGPUInstance(id); err != nil {
				t.Fatal(err)
			}
		}
	}

	t.Run("destroy, then create", func(t *testing.T) {
		removeAll()
		onlyNew(change(), nil)
		for _, p := range []int{nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE} {
			if _, err := g.AddGPUInstance(p, 1); err != nil {
				t.Fatal(err)
			}
		}
		f := change()
		onlyNew(f, uuids())
		if _, ok := sample(f, "gpu_memory_total_bytes", map[string]string{"gpu": "1", "gpu_instance": "3", "mig_profile": "2g.20gb"}); !ok {
			t.Error("no gpu_memory_total_bytes for the new 2g.20gb in GPU instance 3 (at 0:2, inside a destroyed 3g.40gb's 0:4)")
		}
		if v := value(f, "gpu_mig_free_slices", map[string]string{"gpu": "1"}); v != 3 {
			t.Errorf("gpu_mig_free_slices = %v, want 3 (7 less 2g + 1g + 1g)", v)
		}
	})

	t.Run("in one step", func(t *testing.T) {
		removeAll()
		if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 2); err != nil {
			t.Fatal(err)
		}
		f := change()
		onlyNew(f, uuids())
		if _, ok := sample(f, "gpu_mig_info", map[string]string{"gpu": "1", "gpu_instance": "1", "compute_instance": "1", "mig_profile": "2c.4g.40gb"}); !ok {
			t.Error("no gpu_mig_info for the second compute instance (2c.4g.40gb) of the new 4g.40gb")
		}
	})

	f := e.waitFor(func(map[string]*dto.MetricFamily) bool { return true }, "a page")
	if v := value(f, "gpu_exporter_nvml_inits_total", nil); v != 1 {
		t.Errorf("gpu_exporter_nvml_inits_total = %v, want 1: a MIG change needs no new nvmlInit", v)
	}
	if v := value(f, "gpu_exporter_collector_up", map[string]string{"collector": "nvml"}); v != 1 {
		t.Errorf("gpu_exporter_collector_up{collector=nvml} = %v, want 1", v)
	}
	if n := countCalls(traceLines(t, trace), "nvmlShutdown"); n != 0 {
		t.Errorf("nvmlShutdown called %d times, want none", n)
	}
}

// A MIG device's XID count belongs to that device: once its GPU instance
// is destroyed and another created under the same GPU and compute instance
// IDs (a new UUID, another profile, another tenant), the old count leaves
// the page with its device and is not the new device's; the new device
// counts its own.
func TestRealBinaryKeepsMIGXIDCountsWithTheirDevice(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 2, fakenvml.Full)
	g := &node.GPUs[1]
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "node.conf")
	writeNode(t, node, path)
	e := startExporter(t, fakenvml.Full, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_xid_events_registered", map[string]string{"gpu": "1"}) == 1 && len(migUUIDs(f)) == 1
	}, "GPU 1 registered for events, its MIG device on the page")
	gi, ci := g.MIG.Devices[0].GPUInstance, g.MIG.Devices[0].ComputeInstance
	xidOn := func(code uint64) fakenvml.Event {
		return fakenvml.Event{GPU: 1, Type: nvml.EventTypeXidCriticalError, Data: code,
			GPUInstance: fakenvml.Ptr(uint32(gi)), ComputeInstance: fakenvml.Ptr(uint32(ci))}
	}
	at := map[string]string{"gpu": "1", "gpu_instance": fmt.Sprint(gi), "compute_instance": fmt.Sprint(ci)}
	with := func(k, v string) map[string]string {
		m := map[string]string{k: v}
		for a, b := range at {
			m[a] = b
		}
		return m
	}
	node.Events = []fakenvml.Event{xidOn(13)}
	writeNode(t, node, path)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_mig_xid_errors_total", with("xid", "13")) == 1
	}, "XID 13 counted on the 3g.40gb")

	old := g.MIG.Devices[0].UUID
	if err := g.RemoveGPUInstance(gi); err != nil {
		t.Fatal(err)
	}
	// A 4g.40gb at 0:4, the destroyed 3g.40gb's placement: the driver
	// gives it the same GPU instance ID.
	if _, err := g.AddGPUInstance(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 1); err != nil {
		t.Fatal(err)
	}
	d := g.MIG.Devices[0]
	if d.GPUInstance != gi || d.ComputeInstance != ci || d.UUID == old {
		t.Fatalf("the new instance is GI %d CI %d %s; the test needs the old IDs and a new UUID", d.GPUInstance, d.ComputeInstance, d.UUID)
	}
	writeNode(t, node, path)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool { return migUUIDs(f)[d.UUID] }, "the new 4g.40gb on the page")
	if v, ok := sample(f, "gpu_mig_xid_errors_total", with("xid", "13")); ok {
		t.Errorf("the destroyed 3g.40gb's XID 13 (%v) is served under the new 4g.40gb's IDs", v)
	}
	node.Events = append(node.Events, xidOn(43))
	writeNode(t, node, path)
	f = e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return value(f, "gpu_mig_xid_errors_total", with("xid", "43")) == 1
	}, "XID 43 counted on the 4g.40gb")
	for _, m := range f["gpu_mig_xid_errors_total"].GetMetric() {
		labels := labelMap(m)
		if labels["xid"] == "13" {
			t.Errorf("XID 13 of the destroyed instance still served: %v", labels)
		}
		if labels["xid"] == "43" && labels["mig_uuid"] != d.UUID {
			t.Errorf("XID 43 served with mig_uuid %q, want the new device's %s", labels["mig_uuid"], d.UUID)
		}
	}
	if v := value(f, "gpu_xid_errors_total", map[string]string{"gpu": "1", "xid": "13"}); v != 1 {
		t.Errorf("the GPU's XID 13 count = %v, want 1: it stays with the GPU", v)
	}
}
