package collector_test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// wantFolds is what node_summary promises, written down independently of
// the collector's table: how each family is folded over the whole GPUs.
var wantFolds = map[string]string{
	"gpu_pcie_transmit_bytes_total":    "sum",
	"gpu_pcie_receive_bytes_total":     "sum",
	"gpu_pcie_replay_errors_total":     "sum",
	"gpu_nvlink_transmit_bytes_total":  "sum",
	"gpu_nvlink_receive_bytes_total":   "sum",
	"gpu_nvlink_errors_total":          "sum",
	"gpu_ecc_errors_total":             `sum of error="corrected"`,
	"gpu_power_watts":                  "sum",
	"gpu_power_limit_watts":            "sum",
	"gpu_slowdown_temperature_celsius": "min",
	"gpu_sm_clock_hertz":               "mean",
	"gpu_tensor_active_ratio":          "mean",
	"gpu_dram_active_ratio":            "mean",
	"gpu_memory_utilization_ratio":     "mean",
}

// frozenDCGM serves one DCGM snapshot to every exporter, so two exporters
// render the same sample.
type frozenDCGM struct{ s *dcgm.Snapshot }

func (f frozenDCGM) Snapshot() *dcgm.Snapshot { return f.s }

// dcgmSnapshot runs the fake host engine of a simulated node on real time
// (the DCGM sampler drops values older than its maximum age by the wall
// clock) until its snapshot has PCIe bytes, and returns it. The node's
// UUIDs are those of every default simulated node.
func dcgmSnapshot(t *testing.T) *dcgm.Snapshot {
	t.Helper()
	ds := newTestExporter(t, withRealTime(), withDCGM(nil)).ds
	var snap *dcgm.Snapshot
	waitFor(t, "DCGM values from the simulated host engine", func() bool {
		snap = ds.Snapshot()
		if snap.Up && len(snap.Devices) > 0 {
			v, ok := snap.Devices[0].Value(dcgm.PCIeTxBytes)
			return ok && v > 0
		}
		return false
	})
	return snap
}

func profileGroups(t *testing.T, profile string, nodeSummary bool) render.GroupSet {
	t.Helper()
	g, err := render.ProfileGroups(profile)
	if err != nil {
		t.Fatal(err)
	}
	g[render.GroupNodeSummary] = nodeSummary
	return g
}

// TestNodeSummaryFoldsTheSameSample renders one sample of the simulated
// node twice, per GPU and folded, and checks every folded series against
// the aggregate of the per-GPU page, and every other gpu_ family against
// the per-GPU page line by line.
func TestNodeSummaryFoldsTheSameSample(t *testing.T) {
	if got := render.NodeSummaryFolds(); fmt.Sprint(got) != fmt.Sprint(wantFolds) {
		t.Errorf("node_summary folds %v, want %v", got, wantFolds)
	}
	for _, profile := range []string{render.ProfileLean, render.ProfileDefault} {
		t.Run(profile, func(t *testing.T) {
			clk := newClock()
			node, err := simnode.New(nil, simnode.WithClock(clk.Now))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(node.Close)
			snap := dcgmSnapshot(t)
			newE := func(fold bool) *collector.Exporter {
				return newTestExporter(t, withNode(node), withClock(clk), withDCGMSource(frozenDCGM{snap}), withGroups(profileGroups(t, profile, fold))).e
			}
			perGPU, folded := newE(false), newE(true)
			for step := 0; step < 3; step++ {
				clk.Advance(30 * time.Second)
				perGPU.SampleOnce(context.Background())
				folded.SampleOnce(context.Background())
				compareFolded(t, fmt.Sprintf("%s, render %d", profile, step), fltParse(t, perGPU.Page().Plain), fltParse(t, folded.Page().Plain))
			}
		})
	}
}

func compareFolded(t *testing.T, what string, perGPU, folded map[string]*dto.MetricFamily) {
	t.Helper()
	foldedSeen := 0
	for name, mf := range perGPU {
		if !strings.HasPrefix(name, "gpu_") || strings.HasPrefix(name, "gpu_exporter_") {
			continue
		}
		op, ok := wantFolds[name]
		if !ok {
			// Not folded: the same series with the same values.
			if a, b := familyLines(mf), familyLines(folded[name]); a != b {
				t.Errorf("%s: %s differs between the per-GPU and the folded page:\n%s\n---\n%s", what, name, a, b)
			}
			continue
		}
		// Only the corrected ECC errors fold; the uncorrected stay per GPU.
		partly := func(m *dto.Metric) bool {
			return strings.HasSuffix(op, `"corrected"`) && labelMap(m)["error"] != "corrected"
		}
		var stay, stayed dto.MetricFamily
		for _, m := range mf.Metric {
			if partly(m) {
				stay.Metric = append(stay.Metric, m)
			}
		}
		for _, m := range folded[name].GetMetric() {
			if partly(m) {
				stayed.Metric = append(stayed.Metric, m)
			}
		}
		if a, b := familyLines(&stay), familyLines(&stayed); a != b {
			t.Errorf("%s: %s rows that stay per GPU differ:\n%s\n---\n%s", what, name, a, b)
		}
		want := map[string]float64{} // other labels -> aggregate
		n := map[string]int{}
		for _, m := range mf.Metric {
			lv := labelMap(m)
			if lv["gpu_instance"] != "" || partly(m) {
				continue
			}
			k := otherLabels(lv)
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			switch {
			case n[k] == 0:
				want[k] = v
			case strings.HasPrefix(op, "min"):
				want[k] = math.Min(want[k], v)
			default:
				want[k] += v
			}
			n[k]++
		}
		got := map[string]float64{}
		for _, m := range folded[name].GetMetric() {
			lv := labelMap(m)
			if partly(m) {
				continue
			}
			if lv["gpu"] != "all" || lv["uuid"] != "all" || lv["gpu_instance"] != "" || lv["mig_profile"] != "" || lv["compute_instance"] != "" {
				t.Errorf("%s: %s has a series that is not the node's: %v", what, name, lv)
				continue
			}
			got[otherLabels(lv)] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		if len(got) != len(want) {
			t.Errorf("%s: %s folded into %d series, want %d (%v)", what, name, len(got), len(want), want)
		}
		for k, w := range want {
			if strings.HasPrefix(op, "mean") {
				w /= float64(n[k])
			}
			if g, ok := got[k]; !ok || math.Abs(g-w) > 1e-9*math.Max(1, math.Abs(w)) {
				t.Errorf("%s: %s{%s} folded to %v (present %v), want the %s over %d GPUs: %v", what, name, k, g, ok, op, n[k], w)
			}
		}
		foldedSeen++
	}
	if foldedSeen != len(wantFolds) {
		t.Errorf("%s: %d of the %d folded families are on the per-GPU page; the test compares too little", what, foldedSeen, len(wantFolds))
	}
}

func labelMap(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func otherLabels(lv map[string]string) string {
	var parts []string
	for k, v := range lv {
		switch k {
		case "gpu", "uuid", "gpu_instance", "mig_profile", "compute_instance":
			continue
		}
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func familyLines(mf *dto.MetricFamily) string {
	var lines []string
	for _, m := range mf.GetMetric() {
		lines = append(lines, fmt.Sprintf("%v %v", labelMap(m), m.GetGauge().GetValue()+m.GetCounter().GetValue()))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// replayNVML serves PCIe replay counts the test sets, through the fault
// wrapper (so a lost GPU answers GPU_IS_LOST first).
type replayNVML struct {
	*faultyNVML
	mu     sync.Mutex
	counts map[int]int
}

func (r *replayNVML) set(gpu, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[gpu] = n
}

func (r *replayNVML) DeviceGetHandleByIndex(i int) (nvmlsampler.Device, nvml.Return) {
	d, ret := r.faultyNVML.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return d, ret
	}
	return &replayDevice{Device: d, r: r, gpu: i}, ret
}

type replayDevice struct {
	nvmlsampler.Device
	r   *replayNVML
	gpu int
}

func (d *replayDevice) GetPcieReplayCounter() (int, nvml.Return) {
	if _, ret := d.Device.GetPcieReplayCounter(); ret != nvml.SUCCESS {
		return 0, ret
	}
	d.r.mu.Lock()
	defer d.r.mu.Unlock()
	return d.r.counts[d.gpu], nvml.SUCCESS
}

// TestNodeSummaryCounterKeepsALostGPU: the folded PCIe replay counter never
// falls. A GPU that is lost keeps its last count in the node's sum, and
// when it comes back from a reset with a lower count, that count adds on.
func TestNodeSummaryCounterKeepsALostGPU(t *testing.T) {
	clk := newClock()
	var lib *replayNVML
	e := newTestExporter(t, withClock(clk), withGroups(profileGroups(t, render.ProfileLean, true)),
		withNVML(func(node nvmlsampler.NVML) nvmlsampler.NVML {
			lib = &replayNVML{faultyNVML: newFaultyNVML(node), counts: map[int]int{}}
			for g := 0; g < 8; g++ {
				lib.set(g, 10*g)
			}
			lib.set(3, 1000)
			return lib
		})).e
	replays := func() string {
		clk.Advance(5 * time.Second)
		e.SampleOnce(context.Background())
		if n := len(series(e.Page(), "gpu_pcie_replay_errors_total")); n != 1 {
			t.Fatalf("%d gpu_pcie_replay_errors_total series, want the node's one", n)
		}
		return value(t, e.Page(), "gpu_pcie_replay_errors_total", `gpu="all"`, `uuid="all"`)
	}
	// 0+10+20+1000+40+50+60+70; GPU 7 is in MIG mode but counts as a whole GPU.
	if v := replays(); v != "1250" {
		t.Fatalf("folded replays %s, want 1250", v)
	}
	lib.loseAfter(3, 0)
	lib.set(1, 11)
	if v := replays(); v != "1251" {
		t.Errorf("after GPU 3 was lost: folded replays %s, want 1251 (its 1000 carried, GPU 1's one new replay added)", v)
	}
	if n := len(series(e.Page(), "gpu_up", `gpu="3"`, `gpu_instance=""`, " 0")); n != 1 {
		t.Fatalf("GPU 3 is not reported lost: %v", series(e.Page(), "gpu_up", `gpu="3"`))
	}
	lib.set(3, 5) // a GPU reset cleared its counter
	lib.recoverGPU()
	if v := replays(); v != "1256" {
		t.Errorf("after GPU 3 came back with 5 replays: folded replays %s, want 1256", v)
	}
	lib.set(3, 7)
	if v := replays(); v != "1258" {
		t.Errorf("after 2 more replays on GPU 3: folded replays %s, want 1258", v)
	}
}
