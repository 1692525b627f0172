package collector_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// compatNode is the default simulated node with DCGM, its pods and the
// dcgm-exporter compatibility families on.
func compatNode(t *testing.T, groups render.GroupSet) *collector.Exporter {
	t.Helper()
	return compatNodeWith(t, groups, render.CompatConfig{Hostname: "gpu-node-7"})
}

// compatNodeWith is compatNode with its own compatibility configuration.
func compatNodeWith(t *testing.T, groups render.GroupSet, cc render.CompatConfig) *collector.Exporter {
	t.Helper()
	tn := newTestExporter(t, withRealTime(), withKubelet(), withDCGM(nil), withGroups(groups),
		withConfig(func(c *collector.Config) { c.Compat = &cc }))
	if err := tn.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	// PCIe rates need two samples with DCGM values.
	tn.until(t, "DCGM values on the compatibility page", func(p *collector.Page) bool {
		return len(series(p, "DCGM_FI_PROF_PCIE_TX_BYTES"))+len(series(p, "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND")) > 0
	})
	return tn.e
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
	for _, name := range render.CompatFamilyNames() {
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
		t.Run(k, func(t *testing.T) {
			if lab[k] != want {
				t.Errorf("DCGM_FI_DEV_GPU_TEMP{gpu=3} %s=%q, want %q (%s)", k, lab[k], want, line)
			}
		})
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
		opts := []exporterOption{withRealTime(), withSamplerConfig(func(c *nvmlsampler.SamplerConfig) { c.RediscoverEvery = 1000 })}
		if compat {
			opts = append(opts, withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{} }))
		}
		tn := newTestExporter(t, opts...)
		e, node := tn.e, tn.node
		// The first sample waits for NVML's initialisation, which runs in
		// its own goroutine: count from the second on.
		e.SampleOnce(context.Background())
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

// The host name label is spelled as the release line spells it (Hostname
// up to 4.8.2, hostname since 4.8.3: the default line's), unless told
// otherwise.
func TestCompatHostnameLabel(t *testing.T) {
	for _, tc := range []struct{ release, label, want, absent string }{
		{"", "", "hostname", "Hostname"},
		{"4.8.2", "", "Hostname", "hostname"},
		{"4.8.3", "", "hostname", "Hostname"},
		{"4.10", "", "hostname", "Hostname"},
		{"", "Hostname", "Hostname", "hostname"},
		{"4.8.2", "hostname", "hostname", "Hostname"},
	} {
		t.Run("release="+tc.release+",label="+tc.label, func(t *testing.T) {
			e := compatNodeWith(t, nil, render.CompatConfig{Release: tc.release, Hostname: "gpu-node-7", HostnameLabel: tc.label})
			rel, err := render.CompatReleaseNamed(cmp.Or(tc.release, render.DefaultCompatRelease))
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range render.CompatFamilyNamesOf(rel.DefaultCounters()) {
				for _, l := range series(e.Page(), name) {
					lab := parseLabels(l)
					if lab[tc.want] != "gpu-node-7" || lab[tc.absent] != "" {
						t.Fatalf("%s: %s=%q, %s=%q: %s", name, tc.want, lab[tc.want], tc.absent, lab[tc.absent], l)
					}
				}
			}
		})
	}
	_, err := collector.New(collector.Config{Interval: time.Second, Log: zerolog.Nop(),
		Compat: &render.CompatConfig{HostnameLabel: "HOSTNAME"}}, nil)
	if err == nil || !strings.Contains(err.Error(), "Hostname") {
		t.Errorf("an unknown host name label: error %v, want one naming the choices", err)
	}
}

// sharedResource is the resource the simulated node's time-sliced GPU 6
// is held through: the NVIDIA device plugin's renameByDefault name.
var sharedResource = []string{"nvidia.com/gpu.shared"}

// A time-sliced GPU (GPU 6 of the simulated node: three holders of
// nvidia.com/gpu.shared) has one series per family, labelled with one of
// its holders once its resource is named (dcgm-exporter's
// --nvidia-resource-names), as dcgm-exporter by default; with VirtualGPUs
// one per holder, as its --kubernetes-virtual-gpus.
func TestCompatTimeSlicedGPU(t *testing.T) {
	holders := []string{"chat-api-0", "chat-api-1", "chat-api-2"}
	t.Run("default", func(t *testing.T) {
		e := compatNodeWith(t, nil, render.CompatConfig{Hostname: "gpu-node-7", NvidiaResourceNames: sharedResource})
		for _, name := range render.CompatFamilyNames() {
			got := series(e.Page(), name, `gpu="6"`)
			if name == "DCGM_FI_DEV_FB_RESERVED" && len(got) == 0 {
				continue
			}
			if len(got) != 1 {
				t.Fatalf("%s{gpu=6}: %d series, want 1: %v", name, len(got), got)
			}
			if lab := parseLabels(got[0]); lab["pod"] != "chat-api-0" || lab["namespace"] != "inference" || lab["container"] != "server" {
				t.Errorf("%s{gpu=6} labelled %s/%s/%s, want inference/chat-api-0/server (the first holder)", name, lab["namespace"], lab["pod"], lab["container"])
			}
		}
		// The sum over the node counts the shared GPU once.
		if n, want := len(series(e.Page(), "DCGM_FI_DEV_GPU_TEMP")), len(series(e.Page(), "gpu_temperature_celsius"))-1+4; n != want {
			t.Errorf("%d DCGM_FI_DEV_GPU_TEMP series, want %d (one per GPU, one per MIG instance of GPU 7)", n, want)
		}
	})
	t.Run("VirtualGPUs", func(t *testing.T) {
		e := compatNodeWith(t, nil, render.CompatConfig{Hostname: "gpu-node-7", VirtualGPUs: true, NvidiaResourceNames: sharedResource})
		got := series(e.Page(), "DCGM_FI_DEV_GPU_TEMP", `gpu="6"`)
		var pods []string
		for _, l := range got {
			pods = append(pods, parseLabels(l)["pod"])
		}
		slices.Sort(pods)
		if !slices.Equal(pods, holders) {
			t.Errorf("DCGM_FI_DEV_GPU_TEMP{gpu=6} pods %v, want one series per holder %v", pods, holders)
		}
	})
	// dcgm-exporter names the holders of nvidia.com/gpu and nvidia.com/mig-*
	// alone unless --nvidia-resource-names adds more: the shared GPU's
	// series carry no pod, the others' keep theirs.
	for _, virtual := range []bool{false, true} {
		t.Run(fmt.Sprintf("resource not named, virtual GPUs %v", virtual), func(t *testing.T) {
			e := compatNodeWith(t, nil, render.CompatConfig{Hostname: "gpu-node-7", VirtualGPUs: virtual})
			got := series(e.Page(), "DCGM_FI_DEV_GPU_TEMP", `gpu="6"`)
			if len(got) != 1 || parseLabels(got[0])["pod"] != "" || parseLabels(got[0])["namespace"] != "" {
				t.Errorf("DCGM_FI_DEV_GPU_TEMP{gpu=6} (held through nvidia.com/gpu.shared only): %v, want one series without holder labels", got)
			}
			if lab := parseLabels(value1(t, e.Page(), "DCGM_FI_DEV_GPU_TEMP", `gpu="3"`)); lab["pod"] != "llm-pretrain-1" {
				t.Errorf("GPU 3 (nvidia.com/gpu) lost its holder: %v", lab)
			}
			mig := series(e.Page(), "DCGM_FI_DEV_GPU_TEMP", `gpu="7"`)
			held := 0
			for _, l := range mig {
				if parseLabels(l)["pod"] != "" {
					held++
				}
			}
			if held == 0 {
				t.Errorf("GPU 7's MIG instances (nvidia.com/mig-*) lost their holders: %v", mig)
			}
		})
	}
}

// value1 is the one series of name with the matchers, or fails.
func value1(t *testing.T, p *collector.Page, name string, matchers ...string) string {
	t.Helper()
	got := series(p, name, matchers...)
	if len(got) != 1 {
		t.Fatalf("%s%v: %d series, want 1: %v", name, matchers, len(got), got)
	}
	return got[0]
}

// A GPU lost to XID 79 (simulated: every NVML call answers GPU_IS_LOST)
// keeps its DCGM_FI_DEV_XID_ERRORS series, with the code and the labels it
// had, while it is lost; its other families are absent. The holder's
// labels stay: alerts that name the pod still see it.
func TestCompatXID79KeepsTheLostGPUsSeries(t *testing.T) {
	sc := simnode.DefaultScenario()
	gpu := 0
	sc.Faults = append(sc.Faults, simnode.FaultSpec{At: simnode.Duration(10 * time.Second), GPU: &gpu, XID: 79})
	clk := newClock()
	tn := newTestExporter(t, withScenario(sc), withClock(clk), withKubelet(),
		withNodeXIDSource(func(n *simnode.Node) xid.EventSource { return n.XIDSource() }),
		withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{Hostname: "gpu-node-7"} }))
	ctx := context.Background()
	if err := tn.client.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	e, reader := tn.e, tn.reader
	e.SampleOnce(ctx)
	before := series(e.Page(), "DCGM_FI_DEV_XID_ERRORS", `gpu="0"`)
	if len(before) != 1 || !strings.Contains(before[0], `err_code="0"`) {
		t.Fatalf("GPU 0 before the fault: %v", before)
	}
	want := parseLabels(before[0])
	clk.Advance(20 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for reader.Events() < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the XID reader saw no event")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := 0; i < 4; i++ { // a lost GPU needs a few samples to be found lost
		e.SampleOnce(ctx)
		clk.Advance(time.Second)
		p := e.Page()
		if i < 3 {
			continue
		}
		if v := value(t, p, "gpu_up", `gpu="0"`, `gpu_instance=""`); v != "0" {
			t.Fatalf("gpu_up{gpu=0} = %s: the fault did not take the GPU", v)
		}
		got := series(p, "DCGM_FI_DEV_XID_ERRORS", `gpu="0"`)
		if len(got) != 1 {
			t.Fatalf("lost GPU 0: %d DCGM_FI_DEV_XID_ERRORS series, want 1: %v", len(got), got)
		}
		lab := parseLabels(got[0])
		if lab["err_code"] != "79" || !strings.HasSuffix(got[0], " 79") || lab["err_msg"] != "GPU has fallen off the bus" {
			t.Errorf("lost GPU 0: %s, want code 79 with dcgm-exporter's err_msg \"GPU has fallen off the bus\"", got[0])
		}
		for _, k := range []string{"UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", "namespace", "pod", "container"} {
			if lab[k] != want[k] {
				t.Errorf("lost GPU 0: %s=%q, was %q", k, lab[k], want[k])
			}
		}
		if n := len(series(p, "DCGM_FI_DEV_GPU_TEMP", `gpu="0"`)); n != 0 {
			t.Errorf("lost GPU 0 still has %d DCGM_FI_DEV_GPU_TEMP series: its values are unknown", n)
		}
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
	e := newTestExporter(t, withScenario(sc), withRealTime(), withGroups(fullGroups()),
		withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{Hostname: "n"} })).e
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

// Two pods on two compute instances of one GPU instance: one series per
// GPU instance, labelled with one of them, unless every holder is asked
// for (kubernetes-virtual-gpus).
func TestCompatComputeInstanceHolders(t *testing.T) {
	sc, err := simnode.ParseScenario("ci.yaml", []byte(`
node: {model: A100-SXM4-80GB, count: 1}
gpus:
  - {index: 0, mig: [{profile: 3g.40gb, computeInstances: 2}, {profile: 4g.40gb}]}
pods:
  - {namespace: a, name: p0, containers: [{name: c, devices: [{gpu: 0, mig: 0}]}]}
  - {namespace: b, name: p1, containers: [{name: c, devices: [{gpu: 0, mig: 1}]}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		virtual bool
		want    int
	}{{"one series per GPU instance", false, 1}, {"every holder", true, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			tn := newTestExporter(t, withScenario(sc), withRealTime(), withKubelet(), withGroups(fullGroups()),
				withConfig(func(c *collector.Config) {
					c.Compat = &render.CompatConfig{Hostname: "n", VirtualGPUs: tc.virtual}
				}))
			if err := tn.client.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			tn.e.SampleOnce(context.Background())
			if _, err := tn.e.Registry().Gather(); err != nil {
				t.Fatalf("registry refused the page: %v", err)
			}
			// A field that is not per-process (FB_USED and GPU_UTIL are, and
			// without process accounting keep only the device's series).
			got := series(tn.e.Page(), "DCGM_FI_DEV_GPU_TEMP", `GPU_I_PROFILE="3g.40gb"`)
			if len(got) != tc.want {
				t.Errorf("3g.40gb: %d series, want %d: %v", len(got), tc.want, got)
			}
			for _, l := range got {
				if !strings.Contains(l, `pod="p0"`) && !strings.Contains(l, `pod="p1"`) {
					t.Errorf("series without a holder: %s", l)
				}
			}
		})
	}
}

// A device no container holds has no namespace, pod or container label at
// all, as dcgm-exporter's: sent empty, they would remove the target's own
// under honor_labels: true (alerts/e2e checks that on a real Prometheus).
func TestCompatFreeDeviceHasNoHolderLabels(t *testing.T) {
	p := compatNode(t, nil).Page()
	free := 0
	for _, l := range strings.Split(string(p.Plain), "\n") {
		if !strings.HasPrefix(l, "DCGM_FI_DEV_GPU_TEMP{") {
			continue
		}
		if strings.Contains(l, `=""`) {
			t.Errorf("a label sent empty: %s", l)
		}
		if !strings.Contains(l, "pod=") {
			free++
			for _, name := range []string{"namespace=", "container="} {
				if strings.Contains(l, name) {
					t.Errorf("a free device's series has %s: %s", name, l)
				}
			}
		}
	}
	if free == 0 {
		t.Fatal("no free device on the simulated node's page")
	}
}
