package collector_test

import (
	"compress/gzip"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

var update = flag.Bool("update", false, "rewrite golden files")

// deterministicMetrics are compared with the golden file; durations and
// build info vary from run to run.
var deterministicMetrics = []string{
	"gpu_info", "gpu_mig_info", "gpu_driver_info", "gpu_up", "gpu_last_sample_timestamp_seconds",
	"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_utilization_ratio", "gpu_memory_utilization_ratio",
	"gpu_temperature_celsius", "gpu_memory_temperature_celsius", "gpu_encoder_utilization_ratio", "gpu_decoder_utilization_ratio", "gpu_power_watts", "gpu_energy_joules_total", "gpu_sm_clock_hertz",
	"gpu_memory_clock_hertz", "gpu_pcie_link_generation", "gpu_pcie_link_width",
	"gpu_exporter_collector_up", "gpu_exporter_last_sample_timestamp_seconds",
	"gpu_power_limit_watts", "gpu_slowdown_temperature_celsius", "gpu_shutdown_temperature_celsius",
	"gpu_ecc_errors_total", "gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_remapped_rows_failed",
	"gpu_clock_event_active", "gpu_pcie_replay_errors_total", "gpu_recovery_action_code", "gpu_nvlink_active_links",
	"gpu_numa_node", "gpu_nvlink_errors_total",
}

func TestGoldenExposition(t *testing.T) {
	clk := newClock()
	e, _ := newExporter(t, nil, clk, nil)
	clk.Advance(90 * time.Second)
	e.SampleOnce(context.Background())
	golden := filepath.Join("testdata", "simulated-node.prom")
	if *update {
		p := e.Page()
		if err := os.WriteFile(golden, filterExposition(string(p.Plain), deterministicMetrics), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./collector -run TestGoldenExposition -update to create it)", err)
	}
	defer f.Close()
	if err := testutil.GatherAndCompare(e.Registry(), f, deterministicMetrics...); err != nil {
		t.Fatalf("exposition differs from %s (if intended, rerun with -update):\n%v", golden, err)
	}
}

// filterExposition keeps the families named.
func filterExposition(text string, names []string) []byte {
	keep := map[string]bool{}
	for _, n := range names {
		keep[n] = true
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(text, "\n") {
		name := line
		if strings.HasPrefix(line, "# ") {
			f := strings.Fields(line)
			if len(f) > 2 {
				name = f[2]
			}
		}
		if i := strings.IndexAny(name, "{ "); i >= 0 {
			name = name[:i]
		}
		if keep[strings.TrimSpace(name)] {
			out.WriteString(line)
		}
	}
	return []byte(out.String())
}

// TestLint runs promlint over the default node and over one whose faults
// bring out the health families.
func TestLint(t *testing.T) {
	for _, sc := range []*simnode.Scenario{nil, scenario(t, "faults: [{at: 0s, gpu: 0, ecc: {uncorrected: 1}}, {at: 0s, gpu: 1, xid: 13}]")} {
		e, _ := newExporter(t, sc, newClock(), nil)
		e.SampleOnce(context.Background())
		problems, err := testutil.GatherAndLint(e.Registry())
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	}
}

func TestEightGPUsServeCoreMetrics(t *testing.T) {
	e, _ := newExporter(t, nil, newClock(), nil)
	e.SampleOnce(context.Background())
	for _, name := range []string{"gpu_memory_used_bytes", "gpu_memory_total_bytes", "gpu_temperature_celsius", "gpu_power_watts", "gpu_energy_joules_total", "gpu_info"} {
		n, err := testutil.GatherAndCount(e.Registry(), name)
		if err != nil {
			t.Fatal(err)
		}
		want := 8
		if name == "gpu_memory_used_bytes" || name == "gpu_memory_total_bytes" {
			want = 8 + 4 // GPU 7's four MIG instances have memory of their own
		}
		if n != want {
			t.Errorf("%s: %d series, want %d", name, n, want)
		}
	}
	// GPU 7 is in MIG mode: NVML has no busy time for it, the other seven have.
	if n, _ := testutil.GatherAndCount(e.Registry(), "gpu_utilization_ratio"); n != 7 {
		t.Errorf("gpu_utilization_ratio: %d series, want 7", n)
	}
}

func TestMIGEnumeration(t *testing.T) {
	sc, err := simnode.ParseScenario("mig.yaml", []byte(`
node: {model: A100-SXM4-40GB, count: 2}
gpus:
  - index: 1
    mig:
      - {profile: 4g.20gb}
      - {profile: 2g.10gb}
      - {profile: 1g.5gb}
`))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := newExporter(t, sc, newClock(), nil)
	e.SampleOnce(context.Background())
	st := e.Page().State.Sample
	if len(st.GPUs) != 2 || st.GPUs[0].MIGEnabled || !st.GPUs[1].MIGEnabled {
		t.Fatalf("MIG modes wrong: %+v", st.GPUs)
	}
	var profiles []string
	seen := map[int]bool{}
	for _, m := range st.GPUs[1].MIG {
		profiles = append(profiles, m.MIGProfile)
		if seen[m.GPUInstance] {
			t.Errorf("GPU instance %d twice", m.GPUInstance)
		}
		seen[m.GPUInstance] = true
		if !strings.HasPrefix(m.MIGUUID, "MIG-") || m.UUID != st.GPUs[1].UUID {
			t.Errorf("MIG instance identity wrong: %+v", m)
		}
		total, _ := m.Values.Get(sample.FieldMemoryTotal)
		if total <= 0 || total >= 40<<30 {
			t.Errorf("MIG %s memory total %v", m.MIGProfile, total)
		}
	}
	if got := strings.Join(profiles, ","); got != "4g.20gb,2g.10gb,1g.5gb" {
		t.Errorf("profiles = %s", got)
	}
	want := `
# HELP gpu_mig_info Static facts about a MIG instance; value 1.
# TYPE gpu_mig_info gauge
gpu_mig_info{compute_instance="0",gpu="1",gpu_instance="1",mig_profile="4g.20gb",mig_uuid="` + st.GPUs[1].MIG[0].MIGUUID + `",uuid="` + st.GPUs[1].UUID + `"} 1
gpu_mig_info{compute_instance="0",gpu="1",gpu_instance="5",mig_profile="2g.10gb",mig_uuid="` + st.GPUs[1].MIG[1].MIGUUID + `",uuid="` + st.GPUs[1].UUID + `"} 1
gpu_mig_info{compute_instance="0",gpu="1",gpu_instance="13",mig_profile="1g.5gb",mig_uuid="` + st.GPUs[1].MIG[2].MIGUUID + `",uuid="` + st.GPUs[1].UUID + `"} 1
`
	if err := testutil.GatherAndCompare(e.Registry(), strings.NewReader(want), "gpu_mig_info"); err != nil {
		t.Error(err)
	}
}

// unsupportedNVML answers NOT_SUPPORTED for temperature and power on GPU 2,
// as consumer or virtualised GPUs do.
type unsupportedNVML struct{ nvmlsampler.NVML }

func (u unsupportedNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := u.NVML.DeviceGetHandleByIndex(i)
	if i == 2 && ret == nvml.SUCCESS {
		return unsupportedDevice{d}, ret
	}
	return d, ret
}

type unsupportedDevice struct{ nvmlsampler.Device }

func (unsupportedDevice) GetTemperature(nvml.TemperatureSensors) (uint32, nvml.Return) {
	return 0, nvml.ERROR_NOT_SUPPORTED
}
func (unsupportedDevice) GetTemperatureV1() (nvml.Temperature, nvml.Return) {
	return nvml.Temperature{}, nvml.ERROR_NOT_SUPPORTED
}
func (unsupportedDevice) GetPowerUsage() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }

func TestNotSupportedFieldsAreSkipped(t *testing.T) {
	e, _ := newExporter(t, nil, newClock(), func(n nvmlsampler.NVML) nvmlsampler.NVML { return unsupportedNVML{n} })
	e.SampleOnce(context.Background())
	text := string(e.Page().Plain)
	if strings.Contains(text, `gpu_temperature_celsius{gpu="2"`) || strings.Contains(text, `gpu_power_watts{gpu="2"`) {
		t.Error("unsupported fields of GPU 2 are exported")
	}
	if !strings.Contains(text, `gpu_up{compute_instance="",gpu="2",gpu_instance="",mig_profile="",uuid=`) || strings.Contains(text, `gpu_up{compute_instance="",gpu="2",gpu_instance="",mig_profile="",uuid="`+e.Page().State.Sample.GPUs[2].UUID+`"} 0`) {
		t.Error("GPU 2 should stay up when fields are merely unsupported")
	}
	if n, _ := testutil.GatherAndCount(e.Registry(), "gpu_temperature_celsius"); n != 7 {
		t.Errorf("gpu_temperature_celsius: %d series, want 7", n)
	}
	if !e.Page().State.Collectors[0].Up {
		t.Error("nvml collector down because of unsupported fields")
	}
}

func TestNoNVMLCallOnScrapePath(t *testing.T) {
	e, node := newExporter(t, nil, newClock(), nil)
	e.SampleOnce(context.Background())
	before := node.Calls()
	if before == 0 {
		t.Fatal("the simulated node counted no calls at all; the counter is broken")
	}
	srv := httptest.NewServer(e)
	defer srv.Close()
	for i := 0; i < 50; i++ {
		for _, gz := range []bool{false, true} {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			if gz {
				req.Header.Set("Accept-Encoding", "gzip")
			}
			tr := &http.Transport{DisableCompression: true}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var body io.Reader = resp.Body
			if gz {
				if resp.Header.Get("Content-Encoding") != "gzip" {
					t.Fatal("gzip not served")
				}
				zr, err := gzip.NewReader(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				body = zr
			}
			b, _ := io.ReadAll(body)
			resp.Body.Close()
			if !strings.Contains(string(b), "gpu_memory_used_bytes") {
				t.Fatal("scrape did not return metrics")
			}
		}
	}
	if after := node.Calls(); after != before {
		t.Errorf("100 scrapes made %d NVML calls; want 0", after-before)
	}
	// And the next sample does call NVML, so the counter can tell.
	e.SampleOnce(context.Background())
	if node.Calls() == before {
		t.Error("a sample made no NVML calls: the zero above proves nothing")
	}
}

func TestNoPageBeforeFirstSample(t *testing.T) {
	e, _ := newExporter(t, nil, newClock(), nil)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("status %d before the first sample, want 503", rec.Code)
	}
	if ok, _ := e.Ready(); ok {
		t.Error("ready before the first sample")
	}
}

func TestReadyGoesStale(t *testing.T) {
	clk := newClock()
	e, _ := newExporter(t, nil, clk, nil)
	e.SampleOnce(context.Background())
	if ok, why := e.Ready(); !ok {
		t.Fatalf("not ready after a sample: %s", why)
	}
	clk.Advance(16 * time.Second) // three 5s intervals and a bit
	if ok, _ := e.Ready(); ok {
		t.Error("still ready with a sample 16s old")
	}
}

func TestIntervalBoundedBelow(t *testing.T) {
	node, _ := simnode.New(nil)
	s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collector.New(collector.Config{Interval: 100 * time.Millisecond}, s); err == nil {
		t.Error("a 100ms interval was accepted")
	}
}

func TestAcceptsGzip(t *testing.T) {
	for ae, want := range map[string]bool{
		"": false, "gzip": true, "GZIP": true, "deflate, gzip": true, "gzip;q=0": false, "gzip; q=0.5": true,
		"br;q=1, gzip;q=0.0": false, "identity": false, "x-gzip": false,
	} {
		t.Run(fmt.Sprintf("%q", ae), func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/metrics", nil)
			req.Header.Set("Accept-Encoding", ae)
			e := readyExporter(t)
			e.ServeHTTP(rec, req)
			if got := rec.Header().Get("Content-Encoding") == "gzip"; got != want {
				t.Errorf("Accept-Encoding %q: gzip=%v, want %v", ae, got, want)
			}
		})
	}
}

var readyOnce *collector.Exporter

func readyExporter(t *testing.T) *collector.Exporter {
	if readyOnce == nil {
		readyOnce, _ = newExporter(t, nil, newClock(), nil)
		readyOnce.SampleOnce(context.Background())
	}
	return readyOnce
}
