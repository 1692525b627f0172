package collector_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

func scenario(t *testing.T, y string) *simnode.Scenario {
	t.Helper()
	sc, err := simnode.ParseScenario("test.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// series returns the exposition lines of a metric whose labels contain all of want.
func series(p *collector.Page, name string, want ...string) []string {
	var out []string
	for _, l := range strings.Split(string(p.Plain), "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		ok := true
		for _, w := range want {
			if !strings.Contains(l, w) {
				ok = false
			}
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

func value(t *testing.T, p *collector.Page, name string, want ...string) string {
	t.Helper()
	s := series(p, name, want...)
	if len(s) != 1 {
		t.Fatalf("%s%v: %d series, want 1: %v", name, want, len(s), s)
	}
	return s[0][strings.LastIndex(s[0], " ")+1:]
}

func TestHealthFaults(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 4}
gpus: [{index: 0, workload: {preset: busy}}, {index: 1, workload: {preset: busy}}, {index: 2, workload: {preset: busy}}, {index: 3, workload: {preset: busy}}]
faults:
  - {at: 10s, gpu: 0, ecc: {corrected: 5, uncorrected: 2}}
  - {at: 10s, gpu: 1, throttle: [hw_thermal_slowdown, sw_power_cap], until: 1m}
  - {at: 10s, gpu: 2, remap: {uncorrectable: 3, pending: true}}
  - {at: 10s, gpu: 3, recoveryAction: node_reboot}
`)
	clk := newClock()
	e, _ := newExporter(t, sc, clk, nil)
	e.SampleOnce(context.Background())
	p := e.Page()
	if v := value(t, p, "gpu_ecc_errors_total", `gpu="0"`, `error="uncorrected"`, `scope="volatile"`); v != "0" {
		t.Errorf("uncorrected ECC before the fault: %s", v)
	}
	if v := value(t, p, "gpu_clock_event_active", `gpu="1"`, `reason="hw_thermal_slowdown"`); v != "0" {
		t.Errorf("throttled before the fault: %s", v)
	}
	clk.Advance(15 * time.Second)
	e.SampleOnce(context.Background())
	p = e.Page()
	for _, c := range []struct {
		name  string
		match []string
		want  string
	}{
		{"gpu_ecc_errors_total", []string{`gpu="0"`, `error="uncorrected"`, `scope="volatile"`}, "2"},
		{"gpu_ecc_errors_total", []string{`gpu="0"`, `error="corrected"`, `scope="volatile"`}, "5"},
		{"gpu_ecc_errors_total", []string{`gpu="0"`, `error="uncorrected"`, `scope="aggregate"`}, "2"},
		{"gpu_clock_event_active", []string{`gpu="1"`, `reason="hw_thermal_slowdown"`}, "1"},
		{"gpu_clock_event_active", []string{`gpu="1"`, `reason="sw_power_cap"`}, "1"},
		{"gpu_clock_event_active", []string{`gpu="1"`, `reason="hw_slowdown"`}, "0"},
		{"gpu_clock_event_active", []string{`gpu="0"`, `reason="hw_thermal_slowdown"`}, "0"},
		{"gpu_remapped_rows", []string{`gpu="2"`, `type="uncorrectable"`}, "3"},
		{"gpu_remapped_rows_pending", []string{`gpu="2"`}, "1"},
		{"gpu_remapped_rows_failed", []string{`gpu="2"`}, "0"},
		{"gpu_recovery_action_code", []string{`gpu="3"`}, "2"}, // node_reboot
		{"gpu_recovery_action_code", []string{`gpu="2"`}, "0"}, // none
		{"gpu_nvlink_active_links", []string{`gpu="0"`}, "18"},
	} {
		t.Run(fmt.Sprint(c.name, c.match), func(t *testing.T) {
			if v := value(t, p, c.name, c.match...); v != c.want {
				t.Errorf("%s%v = %s, want %s", c.name, c.match, v, c.want)
			}
		})
	}
	// Retired pages are not supported on Hopper: skipped, not zero.
	if s := series(p, "gpu_retired_pages"); len(s) != 0 {
		t.Errorf("retired pages exported on H100: %v", s)
	}
	// The throttle ends, the ECC errors stay counted.
	clk.Advance(time.Minute)
	e.SampleOnce(context.Background())
	p = e.Page()
	if v := value(t, p, "gpu_clock_event_active", `gpu="1"`, `reason="hw_thermal_slowdown"`); v != "0" {
		t.Errorf("throttle did not end: %s", v)
	}
	if v := value(t, p, "gpu_ecc_errors_total", `gpu="0"`, `error="uncorrected"`, `scope="volatile"`); v != "2" {
		t.Errorf("ECC count went to %s after the fault window", v)
	}
}

func TestLostGPU(t *testing.T) {
	sc := scenario(t, `
node: {count: 8}
faults:
  - {at: 10s, until: 40s, gpu: 3, lost: true}
`)
	clk := newClock()
	e, _ := newExporter(t, sc, clk, nil)
	clk.Advance(15 * time.Second)
	for i := 0; i < 4; i++ { // several failures in a row: the worker rediscovers
		e.SampleOnce(context.Background())
		clk.Advance(time.Second)
	}
	p := e.Page()
	for gpu := 0; gpu < 8; gpu++ {
		want := "1"
		if gpu == 3 {
			want = "0"
		}
		if v := value(t, p, "gpu_up", `gpu="`+string(rune('0'+gpu))+`"`, `gpu_instance=""`); v != want {
			t.Errorf("gpu_up{gpu=%d} = %s, want %s", gpu, v, want)
		}
	}
	if s := series(p, "gpu_memory_used_bytes", `gpu="3"`); len(s) != 0 {
		t.Errorf("a lost GPU still reports memory: %v", s)
	}
	if s := series(p, "gpu_info", `gpu="3"`); len(s) != 1 {
		t.Errorf("a lost GPU must keep its identity: %v", s)
	}
	if !p.State.Collectors[0].Up {
		t.Error("the nvml collector is down because one GPU is lost")
	}
	clk.Advance(30 * time.Second) // NVML answers again
	e.SampleOnce(context.Background())
	if v := value(t, e.Page(), "gpu_up", `gpu="3"`, `gpu_instance=""`); v != "1" {
		t.Errorf("GPU 3 did not come back: gpu_up %s", v)
	}
}

func TestHangingGPUStallsNoScrape(t *testing.T) {
	sc := scenario(t, `
node: {count: 4}
faults:
  - {at: 10s, until: 50s, gpu: 1, hang: true}
`)
	clk := newClock()
	e := newTestExporter(t, withScenario(sc), withClock(clk), withGroups(fullGroups()),
		withSamplerConfig(func(c *nvmlsampler.SamplerConfig) { c.DeviceTimeout = 50 * time.Millisecond })).e
	// nvmlInit may outlast the short device timeout on a loaded machine:
	// sample until the node is ready, before the hang begins.
	var why string
	waitFor(t, describe(func() string { return "ready before the hang (not ready: " + why + ")" }), func() bool {
		e.SampleOnce(context.Background())
		ok, w := e.Ready()
		why = w
		return ok
	})
	clk.Advance(11 * time.Second)
	for i := 0; i < 4; i++ {
		start := time.Now()
		e.SampleOnce(context.Background())
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("a sample took %s with one GPU hanging", d)
		}
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if rec.Code != 200 {
			t.Fatalf("scrape answered %d during the hang", rec.Code)
		}
		clk.Advance(5 * time.Second)
	}
	p := e.Page()
	if v := value(t, p, "gpu_up", `gpu="1"`, `gpu_instance=""`); v != "0" {
		t.Errorf("hanging GPU gpu_up = %s, want 0", v)
	}
	if v := value(t, p, "gpu_up", `gpu="0"`, `gpu_instance=""`); v != "1" {
		t.Errorf("healthy GPU gpu_up = %s, want 1", v)
	}
	age := value(t, p, "gpu_exporter_sample_age_seconds")
	if age == "0" || strings.HasPrefix(age, "0.") || strings.HasPrefix(age, "1e-") {
		t.Errorf("sample age %s does not grow during the hang", age)
	}
	if ok, _ := e.Ready(); ok {
		t.Error("/readyz still ready with a GPU hanging for 20s")
	}
	clk.Advance(30 * time.Second) // the hang ends
	waitFor(t, "GPU 1 to recover after the hang ended", func() bool {
		e.SampleOnce(context.Background())
		return value(t, e.Page(), "gpu_up", `gpu="1"`, `gpu_instance=""`) == "1"
	})
	if ok, why := e.Ready(); !ok {
		t.Errorf("not ready after recovery: %s", why)
	}
}

func TestLostGPUKeepsReadiness(t *testing.T) {
	clk := newClock()
	e, _ := newExporter(t, scenario(t, "faults: [{at: 1s, gpu: 2, lost: true}]"), clk, nil)
	for i := 0; i < 6; i++ {
		clk.Advance(5 * time.Second)
		e.SampleOnce(context.Background())
	}
	if v := value(t, e.Page(), "gpu_up", `gpu="2"`, `gpu_instance=""`); v != "0" {
		t.Fatalf("GPU 2 gpu_up %s, want 0", v)
	}
	// A lost GPU answers NVML (with an error): the page is fresh, the
	// exporter ready; gpu_up and the GPULost alert say the rest.
	if ok, why := e.Ready(); !ok {
		t.Errorf("not ready with one GPU lost: %s", why)
	}
	if v := value(t, e.Page(), "gpu_exporter_sample_age_seconds"); v != "0" {
		t.Errorf("sample age %s with a lost (not hung) GPU, want 0", v)
	}
}

// nvlinkNVML gives GPU 0's link 3 five CRC errors, then takes the link down.
type nvlinkNVML struct {
	nvmlsampler.NVML
	down *bool
}

func (n nvlinkNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := n.NVML.DeviceGetHandleByIndex(i)
	if i == 0 && ret == nvml.SUCCESS {
		return nvlinkDevice{d, n.down}, ret
	}
	return d, ret
}

type nvlinkDevice struct {
	nvmlsampler.Device
	down *bool
}

func (d nvlinkDevice) GetNvLinkState(link int) (nvml.EnableState, nvml.Return) {
	if link == 3 && *d.down {
		return nvml.FEATURE_DISABLED, nvml.SUCCESS
	}
	return d.Device.GetNvLinkState(link)
}

func (d nvlinkDevice) GetNvLinkErrorCounter(link int, c nvml.NvLinkErrorCounter) (uint64, nvml.Return) {
	if link == 3 && c == nvml.NVLINK_ERROR_DL_CRC_FLIT {
		return 5, nvml.SUCCESS
	}
	return d.Device.GetNvLinkErrorCounter(link, c)
}

func TestNVLinkErrorsNeverFallWhenALinkGoesDown(t *testing.T) {
	down := false
	clk := newClock()
	e, _ := newExporter(t, nil, clk, func(n nvmlsampler.NVML) nvmlsampler.NVML { return nvlinkNVML{n, &down} })
	e.SampleOnce(context.Background())
	if v := value(t, e.Page(), "gpu_nvlink_errors_total", `gpu="0"`, `type="crc_flit"`); v != "5" {
		t.Fatalf("crc_flit errors %s, want 5", v)
	}
	down = true
	for i := 0; i < 8; i++ { // past the next full health read
		clk.Advance(5 * time.Second)
		e.SampleOnce(context.Background())
	}
	p := e.Page()
	if v := value(t, p, "gpu_nvlink_errors_total", `gpu="0"`, `type="crc_flit"`); v != "5" {
		t.Errorf("crc_flit errors fell to %s when the link went down", v)
	}
	if v := value(t, p, "gpu_nvlink_active_links", `gpu="0"`); v != "17" {
		t.Errorf("active links %s, want 17", v)
	}
}

// badNameNVML answers GPU 1's name with bytes that are not UTF-8.
type badNameNVML struct{ nvmlsampler.NVML }

func (b badNameNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := b.NVML.DeviceGetHandleByIndex(i)
	if i == 1 && ret == nvml.SUCCESS {
		return badNameDevice{d}, ret
	}
	return d, ret
}

type badNameDevice struct{ nvmlsampler.Device }

func (badNameDevice) GetName() (string, nvml.Return) { return "NVIDIA \xff\xfe H100", nvml.SUCCESS }

func TestInvalidUTF8FromNVMLDoesNotPanic(t *testing.T) {
	e, _ := newExporter(t, nil, newClock(), func(n nvmlsampler.NVML) nvmlsampler.NVML { return badNameNVML{n} })
	e.SampleOnce(context.Background()) // a panic here would take the exporter down
	if s := series(e.Page(), "gpu_info", `gpu="1"`); len(s) != 1 || !strings.Contains(s[0], "NVIDIA \ufffd") {
		t.Errorf("GPU 1's info with a mangled name: %v", s)
	}
}

// Recovery actions 5-7 and clock event reasons
// 0x200/0x400 (board limit, reliability) are exported like the others;
// the simulated node takes both lists from go-nvml's constants.
func TestNewerRecoveryActionsAndClockReasons(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 4}
faults:
  - {at: 0s, gpu: 0, recoveryAction: recover_imex_domain}
  - {at: 0s, gpu: 1, recoveryAction: bus_reset}
  - {at: 0s, gpu: 2, recoveryAction: system_reboot}
  - {at: 0s, gpu: 3, throttle: [board_limit, reliability]}
`)
	clk := newClock()
	e, _ := newExporter(t, sc, clk, nil)
	e.SampleOnce(context.Background())
	p := e.Page()
	for gpu, code := range []string{"5", "6", "7"} {
		if v := value(t, p, "gpu_recovery_action_code", `gpu="`+strconv.Itoa(gpu)+`"`); v != code {
			t.Errorf("GPU %d: recovery action code %s, want %s", gpu, v, code)
		}
	}
	for _, r := range []string{"board_limit", "reliability"} {
		if v := value(t, p, "gpu_clock_event_active", `gpu="3"`, `reason="`+r+`"`); v != "1" {
			t.Errorf("clock event reason %s = %s, want 1", r, v)
		}
	}
}

// recoveryNVML reports a recovery action value newer than go-nvml knows.
type recoveryNVML struct{ nvmlsampler.NVML }

func (r recoveryNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := r.NVML.DeviceGetHandleByIndex(i)
	return recoveryDevice{d}, ret
}

type recoveryDevice struct{ nvmlsampler.Device }

func (recoveryDevice) GetFieldValues(fv []nvml.FieldValue) nvml.Return {
	for i := range fv {
		if fv[i].FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
			fv[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			continue
		}
		fv[i].NvmlReturn = uint32(nvml.SUCCESS)
		fv[i].Value = [8]byte{42}
	}
	return nvml.SUCCESS
}

// A recovery action the exporter does not know is shown, not hidden.
func TestUnknownRecoveryActionIsExported(t *testing.T) {
	clk := newClock()
	e, _ := newExporter(t, scenario(t, "node: {model: H100-SXM5-80GB, count: 1}"), clk, func(l nvmlsampler.NVML) nvmlsampler.NVML { return recoveryNVML{l} })
	e.SampleOnce(context.Background())
	if v := value(t, e.Page(), "gpu_recovery_action_code", `gpu="0"`); v != "42" {
		t.Errorf("recovery action code = %s, want 42", v)
	}
}

// On Blackwell the per-link NVLink error counters answer
// NOT_SUPPORTED; the errors come from NVLink5's NVML_FI_DEV_NVLINK_COUNT_*
// field values, per link (the simulated B200 has link i report i symbol
// errors: 0+1+...+17 = 153 over 18 links).
func TestBlackwellNVLinkErrorsFromFields(t *testing.T) {
	clk := newClock()
	e, _ := newExporter(t, scenario(t, "node: {model: B200-SXM5-180GB, count: 1}"), clk, nil)
	e.SampleOnce(context.Background())
	p := e.Page()
	if v := value(t, p, "gpu_nvlink_errors_total", `gpu="0"`, `type="symbol"`); v != "153" {
		t.Errorf("symbol errors %s, want 153", v)
	}
	if v := value(t, p, "gpu_nvlink_errors_total", `gpu="0"`, `type="recovery"`); v != "0" {
		t.Errorf("recovery events %s, want 0", v)
	}
	if got := series(p, "gpu_nvlink_errors_total", `type="crc_flit"`); len(got) != 0 {
		t.Errorf("per-link counter types exported on Blackwell: %v", got)
	}
}
