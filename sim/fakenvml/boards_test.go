package fakenvml_test

import (
	"encoding/json"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// Boards that are not SXM data-centre parts: the real binary serves what
// they have, reports no error for what they lack, and invents no series.

// TestRealBinaryOnAnL4ClassBoard: a GDDR board on PCIe has no NVLink and no
// memory temperature sensor; both answer NOT_SUPPORTED, which is not an
// error, and no NVLink or HBM series appears.
func TestRealBinaryOnAnL4ClassBoard(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(fakenvml.L4, 0, fakenvml.Full)
	for i := 0; i < 2; i++ {
		node.GPUs = append(node.GPUs, fakenvml.L4Class(i))
	}
	e := startBoard(t, node)
	f := healthyPage(t, e, 2)
	for _, fam := range []string{"gpu_temperature_celsius", "gpu_power_watts", "gpu_power_limit_watts", "gpu_ecc_errors_total", "gpu_pcie_link_generation"} {
		if f[fam] == nil {
			t.Errorf("%s is missing: the board has it", fam)
		}
	}
	absent(t, f, "gpu_memory_temperature_celsius", "gpu_nvlink_errors_total", "gpu_nvlink_active_links")
	if v, ok := sample(f, "gpu_exporter_xid_events_supported", nil); !ok || v != 1 {
		t.Errorf("gpu_exporter_xid_events_supported = %v (present %v); want 1: the board supports events", v, ok)
	}
	if v, _ := sample(f, "gpu_pcie_link_generation", map[string]string{"gpu": "0"}); v != 4 {
		t.Errorf("gpu_pcie_link_generation = %v; want 4", v)
	}
	noErrorLogs(t, e, "")
}

// TestRealBinaryOnABoardWithoutECCPowerEvents: ECC, power and events answer
// NOT_SUPPORTED (consumer boards, some vGPU guests). The page is served
// without ECC and power series, the XID reader reports that the boards do
// not support events (gpu_exporter_xid_events_supported 0) and its collector
// stays up, so GPUExporterCollectorDown does not fire on this healthy node.
// Both ways a driver says so are covered: no event type supported by any
// board, and no event set at all.
func TestRealBinaryOnABoardWithoutECCPowerEvents(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	for _, tc := range []struct {
		name   string
		noSets bool // the driver cannot create event sets at all
	}{
		{name: "no event types"},
		{name: "no event sets", noSets: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := fakenvml.NewNode(fakenvml.L4, 0, fakenvml.Full)
			for i := 0; i < 2; i++ {
				node.GPUs = append(node.GPUs, fakenvml.WithoutECCPowerEvents(fakenvml.L4Class(i)))
			}
			if tc.noSets {
				node.Returns = map[string]nvml.Return{"nvmlEventSetCreate": nvml.ERROR_NOT_SUPPORTED}
			}
			e := startBoard(t, node)
			e.waitFor(func(f map[string]*dto.MetricFamily) bool {
				v, ok := sample(f, "gpu_exporter_xid_events_supported", nil)
				return ok && v == 0
			}, "gpu_exporter_xid_events_supported 0")
			f := healthyPage(t, e, 2)
			if v, _ := sample(f, "gpu_exporter_xid_events_supported", nil); v != 0 {
				t.Errorf("gpu_exporter_xid_events_supported = %v; want 0", v)
			}
			absent(t, f, "gpu_ecc_errors_total", "gpu_remapped_rows", "gpu_remapped_rows_pending", "gpu_remapped_rows_failed",
				"gpu_row_remap_banks", "gpu_power_watts", "gpu_energy_joules_total", "gpu_power_limit_watts",
				"gpu_memory_temperature_celsius", "gpu_nvlink_errors_total", "gpu_nvlink_active_links", "gpu_ecc_error_events_total")
			if f["gpu_temperature_celsius"] == nil || f["gpu_memory_used_bytes"] == nil {
				t.Errorf("temperature or memory missing: the board has them")
			}
			// The one notice: the boards do not support events, said once.
			noErrorLogs(t, e, "xid: not watching XID and ECC events")
		})
	}
}

// What a board cannot say is left out, never shown as 0: a GPU with ECC
// off registers for XIDs only (nvml.h: ECC events are available only on
// ECC-enabled devices), so it has no ECC event counts; a GPU whose NVLink
// calls answer NOT_SUPPORTED has no count of links up, while one whose
// links are all down has 0.
func TestRealBinaryLeavesOutWhatTheBoardCannotSay(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(gpus.H100_SXM5_80GB, 4, fakenvml.Full)
	node.GPUs[1].ECC.Enabled = false
	for l := range node.GPUs[2].NVLinks {
		node.GPUs[2].NVLinks[l].Active = false
	}
	node.GPUs[3].NVLinks = nil
	e := startBoard(t, node)
	e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		for gpu := 0; gpu < 4; gpu++ {
			if v, _ := sample(f, "gpu_xid_events_registered", map[string]string{"gpu": strconv.Itoa(gpu)}); v != 1 {
				return false
			}
		}
		return true
	}, "every GPU registered for events")
	f := healthyPage(t, e, 4)
	for _, c := range []struct {
		family, gpu string
		labels      map[string]string
		want        float64 // -1: absent
	}{
		{"gpu_ecc_error_events_total", "0", map[string]string{"type": "single_bit"}, 0},
		{"gpu_ecc_error_events_total", "0", map[string]string{"type": "double_bit"}, 0},
		{"gpu_ecc_error_events_total", "1", nil, -1},
		{"gpu_nvlink_active_links", "0", nil, 18},
		{"gpu_nvlink_active_links", "2", nil, 0},
		{"gpu_nvlink_active_links", "3", nil, -1},
	} {
		want := map[string]string{"gpu": c.gpu}
		for k, v := range c.labels {
			want[k] = v
		}
		v, ok := sample(f, c.family, want)
		switch {
		case c.want < 0 && ok:
			t.Errorf("%s%v = %v; the board cannot say, want no series", c.family, want, v)
		case c.want >= 0 && (!ok || v != c.want):
			t.Errorf("%s%v = %v (present %v), want %v", c.family, want, v, ok, c.want)
		}
	}
}

// startBoard writes node and starts the real binary on it.
func startBoard(t *testing.T, node *fakenvml.Node) *exporter {
	t.Helper()
	path := filepath.Join(t.TempDir(), "node.conf")
	if err := node.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return startExporter(t, fakenvml.Full, path, "--procs.container-log-dir="+t.TempDir())
}

// healthyPage waits for a page with the slow-moving health read and checks
// that every GPU is up and every collector is up.
func healthyPage(t *testing.T, e *exporter, gpus int) map[string]*dto.MetricFamily {
	t.Helper()
	// Let a few samples pass: the first reads the slow-moving health too.
	time.Sleep(3 * time.Second)
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return f["gpu_temperature_celsius"] != nil && f["gpu_exporter_collector_up"] != nil
	}, "a page with health families")
	for i := 0; i < gpus; i++ {
		if v, ok := sample(f, "gpu_up", map[string]string{"gpu": strconv.Itoa(i)}); !ok || v != 1 {
			t.Errorf("gpu_up{gpu=%d} = %v (present %v); want 1", i, v, ok)
		}
	}
	for _, m := range f["gpu_exporter_collector_up"].GetMetric() {
		if m.GetGauge().GetValue() != 1 {
			t.Errorf("gpu_exporter_collector_up%v = 0; want every collector up", m.GetLabel())
		}
	}
	if f["gpu_exporter_collector_up"] == nil {
		t.Error("no gpu_exporter_collector_up")
	}
	return f
}

// absent fails for each family the page serves.
func absent(t *testing.T, f map[string]*dto.MetricFamily, fams ...string) {
	t.Helper()
	for _, fam := range fams {
		if mf := f[fam]; mf != nil && len(mf.GetMetric()) > 0 {
			t.Errorf("%s served (%d series); the board does not have it", fam, len(mf.GetMetric()))
		}
	}
}

// noErrorLogs fails for every warning or error the exporter logged, but for
// one expected notice (a message prefix, logged exactly once; "" for none).
func noErrorLogs(t *testing.T, e *exporter, notice string) {
	t.Helper()
	var bad []string
	seen := 0
	for _, line := range strings.Split(e.stderr.String(), "\n") {
		var l struct{ Level, Message string }
		if json.Unmarshal([]byte(line), &l) != nil || (l.Level != "error" && l.Level != "warn" && l.Level != "warning") {
			continue
		}
		if notice != "" && strings.HasPrefix(l.Message, notice) {
			seen++
			continue
		}
		bad = append(bad, line)
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Errorf("the exporter logged %d warnings or errors on a healthy node:\n%s", len(bad), strings.Join(bad, "\n"))
	}
	if notice != "" && seen != 1 {
		t.Errorf("the notice %q was logged %d times; want once", notice, seen)
	}
}

// rtxPro6000 is an RTX PRO 6000 Blackwell Server Edition as NVML names it
// in the MIG geometry table: GB202, compute capability 12.0, GDDR7 on PCIe,
// 97887 MiB of framebuffer.
var rtxPro6000 = gpus.Config{Name: "NVIDIA RTX PRO 6000 Blackwell Server Edition", Architecture: nvml.DEVICE_ARCH_BLACKWELL,
	Brand: nvml.BRAND_NVIDIA, MemoryMB: 97887, CudaMajor: 12, CudaMinor: 0, PciDeviceId: 0x2BB510DE}

// TestRealBinaryOnRTXPro6000MIG: MIG on a four-slice board that places
// instances on a 12-unit grid, whose profiles are asked for with NVML's +gfx,
// -me and +me.all profile constants. The real binary names the GPU instances
// as the driver does and counts free slices and placeable instances: a
// 2g.48gb+gfx at units 0-5 and a 1g.24gb-me at 6-8 leave one compute slice
// and one 1g placement (9-11), and no 2g placement.
func TestRealBinaryOnRTXPro6000MIG(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	node := fakenvml.NewNode(rtxPro6000, 1, fakenvml.Full)
	g := &node.GPUs[0]
	g.NVLinks = nil
	if g.MIG == nil {
		t.Fatal("the MIG geometry table has no profiles for " + rtxPro6000.Name)
	}
	for _, idx := range []int{nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX, nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME} {
		if _, err := g.AddGPUInstance(idx, 1); err != nil {
			t.Fatal(err)
		}
	}
	e := startBoard(t, node)
	info := func(f map[string]*dto.MetricFamily, p string) bool {
		_, ok := sample(f, "gpu_mig_info", map[string]string{"mig_profile": p})
		return ok
	}
	f := e.waitFor(func(f map[string]*dto.MetricFamily) bool {
		return info(f, "2g.48gb+gfx") && info(f, "1g.24gb-me")
	}, "MIG instances 2g.48gb+gfx and 1g.24gb-me")
	if v, ok := sample(f, "gpu_mig_free_slices", map[string]string{"gpu": "0"}); !ok || v != 1 {
		t.Errorf("gpu_mig_free_slices = %v (present %v); want 1 of 4", v, ok)
	}
	for p, want := range map[string]float64{"1g.24gb": 1, "1g.24gb+gfx": 1, "1g.24gb+me.all": 1, "2g.48gb": 0, "2g.48gb+gfx": 0, "4g.96gb+gfx": 0} {
		if v, ok := sample(f, "gpu_mig_placeable_instances", map[string]string{"mig_profile": p}); !ok || v != want {
			t.Errorf("gpu_mig_placeable_instances{mig_profile=%q} = %v (present %v); want %v", p, v, ok, want)
		}
	}
	absent(t, f, "gpu_nvlink_errors_total", "gpu_memory_temperature_celsius")
	noErrorLogs(t, e, "")
}
