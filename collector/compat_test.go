package collector_test

import (
	"context"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
)

// compatNode is the default simulated node with DCGM, its pods and the
// dcgm-exporter compatibility families on.
func compatNode(t *testing.T, groups collector.GroupSet) *collector.Exporter {
	t.Helper()
	node, err := simnode.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "gpe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_, client := startKubelet(t, dir, node, nil)
	if err := client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	ds := dcgm.NewSampler(dcgm.Config{Mode: dcgm.ModeEmbedded, Interval: 20 * time.Millisecond, MaxMissed: 3, Log: zerolog.Nop()}, node.DCGM().Open)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go ds.Run(ctx)
	s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := collector.New(collector.Config{Interval: time.Second, Log: zerolog.Nop(), DCGM: ds, Pods: client,
		Groups: groups, Compat: &collector.CompatConfig{Hostname: "gpu-node-7"}}, s)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.SampleOnce(context.Background())
		// PCIe rates need two samples with DCGM values.
		if p := e.Page(); len(series(p, "DCGM_FI_PROF_PCIE_TX_BYTES")) > 0 {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatal("no DCGM values on the compatibility page")
		}
		time.Sleep(30 * time.Millisecond)
	}
}

func parseNum(t *testing.T, s string) float64 {
	t.Helper()
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestCompatFamiliesFromTheSameSample(t *testing.T) {
	e := compatNode(t, nil)
	p := e.Page()
	for _, name := range collector.CompatFamilyNames() {
		n := len(series(p, name))
		if name == "DCGM_FI_DEV_FB_RESERVED" {
			// From NVML's memory info v2 (R510+): served wherever used
			// memory is, once ours is served at all.
			want := 0
			if len(series(p, "gpu_memory_reserved_bytes")) > 0 {
				want = len(series(p, "DCGM_FI_DEV_FB_USED"))
			}
			if n != want {
				t.Errorf("%s: %d series, want %d", name, n, want)
			}
			continue
		}
		if n == 0 {
			t.Errorf("%s not served", name)
		}
	}
	// Units: MiB, MHz, percent, mJ; labels as dcgm-exporter's.
	gpu3 := []string{`gpu="3"`}
	used := parseNum(t, value(t, p, "gpu_memory_used_bytes", `gpu="3"`, `gpu_instance=""`))
	if got := parseNum(t, value(t, p, "DCGM_FI_DEV_FB_USED", gpu3...)); got != math.Floor(used/(1<<20)) {
		t.Errorf("DCGM_FI_DEV_FB_USED = %v MiB, want %v bytes in MiB", got, used)
	}
	total := parseNum(t, value(t, p, "gpu_memory_total_bytes", `gpu="3"`, `gpu_instance=""`))
	free := parseNum(t, value(t, p, "DCGM_FI_DEV_FB_FREE", gpu3...))
	if free <= 0 || free > (total-used)/(1<<20) {
		t.Errorf("DCGM_FI_DEV_FB_FREE = %v MiB with %v of %v bytes used", free, used, total)
	}
	if r := series(p, "DCGM_FI_DEV_FB_RESERVED", gpu3...); len(r) == 1 {
		// As DCGM: free + used + reserved is the total, in whole MiB.
		res := parseNum(t, value(t, p, "DCGM_FI_DEV_FB_RESERVED", gpu3...))
		used := parseNum(t, value(t, p, "DCGM_FI_DEV_FB_USED", gpu3...))
		if sum := free + used + res; math.Abs(sum-total/(1<<20)) > 2 {
			t.Errorf("FB free %v + used %v + reserved %v = %v MiB, total %v MiB", free, used, res, sum, total/(1<<20))
		}
	}
	if got, hz := parseNum(t, value(t, p, "DCGM_FI_DEV_SM_CLOCK", gpu3...)), parseNum(t, value(t, p, "gpu_sm_clock_hertz", gpu3...)); got != hz/1e6 {
		t.Errorf("DCGM_FI_DEV_SM_CLOCK = %v MHz, gpu_sm_clock_hertz = %v", got, hz)
	}
	if got, r := parseNum(t, value(t, p, "DCGM_FI_DEV_GPU_UTIL", gpu3...)), parseNum(t, value(t, p, "gpu_utilization_ratio", gpu3...)); math.Abs(got-100*r) > 1e-9 {
		t.Errorf("DCGM_FI_DEV_GPU_UTIL = %v %%, gpu_utilization_ratio = %v", got, r)
	}
	if got, j := parseNum(t, value(t, p, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", gpu3...)), parseNum(t, value(t, p, "gpu_energy_joules_total", gpu3...)); math.Abs(got-1000*j) > 1 {
		t.Errorf("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION = %v mJ, gpu_energy_joules_total = %v J", got, j)
	}
	if got, c := parseNum(t, value(t, p, "DCGM_FI_DEV_MEMORY_TEMP", gpu3...)), parseNum(t, value(t, p, "gpu_memory_temperature_celsius", gpu3...)); got != c {
		t.Errorf("DCGM_FI_DEV_MEMORY_TEMP = %v, gpu_memory_temperature_celsius = %v", got, c)
	}
	line := series(p, "DCGM_FI_DEV_GPU_TEMP", gpu3...)[0]
	lab := parseLabels(line)
	for k, want := range map[string]string{
		"device": "nvidia3", "modelName": "NVIDIA H100 80GB HBM3", "hostname": "gpu-node-7", "DCGM_FI_DRIVER_VERSION": "550.54.15",
		"namespace": "ml-training", "pod": "llm-pretrain-1", "container": "trainer", "pci_bus_id": "00000000:48:00.0",
	} {
		if lab[k] != want {
			t.Errorf("DCGM_FI_DEV_GPU_TEMP{gpu=3} %s=%q, want %q (%s)", k, lab[k], want, line)
		}
	}
	if !strings.HasPrefix(lab["UUID"], "GPU-") || lab["GPU_I_ID"] != "" {
		t.Errorf("whole GPU: UUID=%q GPU_I_ID=%q", lab["UUID"], lab["GPU_I_ID"])
	}
	// MIG: one series per instance with GPU_I_ID and GPU_I_PROFILE, the
	// board's values repeated, and none for the MIG-mode parent itself.
	mig := series(p, "DCGM_FI_DEV_GPU_TEMP", `gpu="7"`)
	if len(mig) != 4 {
		t.Fatalf("GPU 7 (4 MIG instances): %d DCGM_FI_DEV_GPU_TEMP series, want 4: %v", len(mig), mig)
	}
	for _, l := range mig {
		lab := parseLabels(l)
		if lab["GPU_I_ID"] == "" || lab["GPU_I_PROFILE"] == "" {
			t.Errorf("MIG series without GPU_I_ID/GPU_I_PROFILE: %s", l)
		}
	}
	if n := len(series(p, "DCGM_FI_DEV_GPU_UTIL", `gpu="7"`)); n != 0 {
		t.Errorf("GPU_UTIL on MIG instances: %d series; NVML has no busy ratio there", n)
	}
	if fb := series(p, "DCGM_FI_DEV_FB_USED", `gpu="7"`, `GPU_I_PROFILE="3g.40gb"`); len(fb) != 1 {
		t.Errorf("3g.40gb instance FB_USED: %v", fb)
	}
	// XID: the last code as a gauge, 0 with "No Error" before any.
	if v := value(t, p, "DCGM_FI_DEV_XID_ERRORS", `gpu="0"`, `err_code="0"`, `err_msg="No Error"`); v != "0" {
		t.Errorf("DCGM_FI_DEV_XID_ERRORS = %s before any XID", v)
	}
	if v := parseNum(t, value(t, p, "DCGM_FI_PROF_PCIE_TX_BYTES", `gpu="3"`)); v < 0 {
		t.Errorf("PCIe TX rate %v", v)
	}
}

// TestCompatDoesNotReadAgain: the compatibility families cost no NVML call.
func TestCompatDoesNotReadAgain(t *testing.T) {
	calls := func(compat bool) int64 {
		node, err := simnode.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second, Log: zerolog.Nop(), RediscoverEvery: 1000})
		if err != nil {
			t.Fatal(err)
		}
		cfg := collector.Config{Interval: time.Second, Log: zerolog.Nop()}
		if compat {
			cfg.Compat = &collector.CompatConfig{}
		}
		e, err := collector.New(cfg, s)
		if err != nil {
			t.Fatal(err)
		}
		before := node.Calls()
		for i := 0; i < 3; i++ {
			e.SampleOnce(context.Background())
		}
		return node.Calls() - before
	}
	if off, on := calls(false), calls(true); on != off {
		t.Errorf("3 samples made %d NVML calls with the compatibility families, %d without", on, off)
	}
}

// noMemoryTemp is a GDDR board: the driver answers NOT_SUPPORTED for the
// memory temperature field (nvmlFieldValue_t.nvmlReturn), and only for it.
type noMemoryTemp struct{ nvmlsampler.NVML }

func (n noMemoryTemp) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := n.NVML.DeviceGetHandleByIndex(i)
	return noMemoryTempDevice{d}, ret
}

type noMemoryTempDevice struct{ nvmlsampler.Device }

func (d noMemoryTempDevice) GetFieldValues(fv []nvml.FieldValue) nvml.Return {
	ret := d.Device.GetFieldValues(fv)
	for i := range fv {
		if fv[i].FieldId == nvml.FI_DEV_MEMORY_TEMP {
			fv[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
		}
	}
	return ret
}

func TestMemoryTemperatureNotSupported(t *testing.T) {
	clk := newClock()
	e, _ := newExporter(t, nil, clk, func(l nvmlsampler.NVML) nvmlsampler.NVML { return noMemoryTemp{l} })
	e.SampleOnce(context.Background())
	p := e.Page()
	if s := series(p, "gpu_memory_temperature_celsius"); len(s) != 0 {
		t.Errorf("memory temperature served where the driver has none: %v", s)
	}
	if v := value(t, p, "gpu_up", `gpu="0"`, `gpu_instance=""`); v != "1" {
		t.Errorf("gpu_up = %s: an unsupported field must not take the GPU down", v)
	}
	if len(series(p, "gpu_recovery_action_code")) == 0 {
		t.Error("the other field values of the same call are lost")
	}
	// And where the driver has it, it is served.
	e2, _ := newExporter(t, nil, newClock(), nil)
	e2.SampleOnce(context.Background())
	if n := len(series(e2.Page(), "gpu_memory_temperature_celsius")); n != 8 {
		t.Errorf("%d gpu_memory_temperature_celsius series, want 8", n)
	}
}

// Two compute instances of one GPU instance are one GPU instance entity to
// DCGM and dcgm-exporter: the compatibility families carry GPU_I_ID, not
// the compute instance, so they are served once per GPU instance (its
// holders each get their series). Served once per compute instance, their
// label sets collided and the registry refused the page.
func TestCompatComputeInstancesDoNotCollide(t *testing.T) {
	sc, err := simnode.ParseScenario("ci.yaml", []byte(`
node: {model: A100-SXM4-80GB, count: 1}
gpus:
  - {index: 0, mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 4g.40gb}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	node, err := simnode.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := collector.New(collector.Config{Interval: time.Second, Log: zerolog.Nop(), Groups: fullGroups(),
		Compat: &collector.CompatConfig{Hostname: "n"}}, s)
	if err != nil {
		t.Fatal(err)
	}
	e.SampleOnce(context.Background())
	if _, err := e.Registry().Gather(); err != nil {
		t.Fatalf("registry refused the page: %v", err)
	}
	used := series(e.Page(), "DCGM_FI_DEV_FB_USED")
	if len(used) != 2 {
		t.Errorf("DCGM_FI_DEV_FB_USED has %d series, want 2 (one per GPU instance): %v", len(used), used)
	}
	if !strings.Contains(string(e.Page().Plain), `GPU_I_PROFILE="3g.40gb"`) {
		t.Errorf("GPU_I_PROFILE is not the GPU instance's profile")
	}
}
