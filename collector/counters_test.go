package collector_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

// A counters file decides the DCGM_FI_* families: those it lists are served
// with its types and help texts, a family of the default list it leaves out
// is not served, and what it lists that this exporter never reads is
// counted.
func TestCompatCountersFile(t *testing.T) {
	cs, err := render.ParseCompatCounters("mine.csv", []byte(`# A user's own list
DCGM_FI_DEV_FB_TOTAL,          gauge,   My framebuffer total (in MiB).
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, My double-bit volatile ECC errors.
DCGM_FI_PROF_PIPE_FP16_ACTIVE, gauge,   My fp16 pipe.
DCGM_FI_DEV_FB_USED,           counter, Typed counter on purpose: the file's type is served.
DCGM_FI_PROF_NVLINK_L0_TX_BYTES, gauge, A per-link field this exporter does not read.
`))
	if err != nil {
		t.Fatal(err)
	}
	tn := newTestExporter(t, withRealTime(), withKubelet(), withDCGM(nil), withGroups(fullGroups()),
		withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{Hostname: "n", Counters: cs} }))
	if err := tn.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := tn.until(t, "the fp16 pipe on the page", func(p *collector.Page) bool {
		return len(series(p, "DCGM_FI_PROF_PIPE_FP16_ACTIVE")) > 0
	})
	page := string(p.Plain)
	for _, want := range []string{
		"# HELP DCGM_FI_DEV_FB_TOTAL My framebuffer total (in MiB).\n# TYPE DCGM_FI_DEV_FB_TOTAL gauge\n",
		"# HELP DCGM_FI_DEV_ECC_DBE_VOL_TOTAL My double-bit volatile ECC errors.\n# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter\n",
		"# HELP DCGM_FI_PROF_PIPE_FP16_ACTIVE My fp16 pipe.\n# TYPE DCGM_FI_PROF_PIPE_FP16_ACTIVE gauge\n",
		"# TYPE DCGM_FI_DEV_FB_USED counter\n",
		`gpu_exporter_compat_fields{state="not_read"} 1`,
		`gpu_exporter_compat_fields{state="served"} 4`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, absent := range []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_NVLINK_L0_TX_BYTES", "DCGM_FI_DEV_POWER_USAGE"} {
		if n := len(series(p, absent)); n != 0 {
			t.Errorf("%s: %d series, want none: the file does not list it", absent, n)
		}
	}
	// The values are ours in DCGM's units: FB_TOTAL in MiB per device, the
	// ECC count the board's uncorrected volatile count, the fp16 pipe DCGM's
	// ratio.
	total := parseNum(t, value(t, p, "gpu_memory_total_bytes", `gpu="0"`, `gpu_instance=""`))
	if got := parseNum(t, value(t, p, "DCGM_FI_DEV_FB_TOTAL", `gpu="0"`)); got != total/(1<<20) {
		t.Errorf("DCGM_FI_DEV_FB_TOTAL = %v, want %v MiB", got, total/(1<<20))
	}
	ecc := parseNum(t, value(t, p, "gpu_ecc_errors_total", `gpu="0"`, `error="uncorrected"`, `scope="volatile"`))
	if got := parseNum(t, value(t, p, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", `gpu="0"`)); got != ecc {
		t.Errorf("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL = %v, want gpu_ecc_errors_total's %v", got, ecc)
	}
	fp16 := parseNum(t, value(t, p, "gpu_fp16_active_ratio", `gpu="0"`, `gpu_instance=""`))
	if got := parseNum(t, value(t, p, "DCGM_FI_PROF_PIPE_FP16_ACTIVE", `gpu="0"`)); got != fp16 {
		t.Errorf("DCGM_FI_PROF_PIPE_FP16_ACTIVE = %v, want gpu_fp16_active_ratio's %v", got, fp16)
	}
}

// DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL is in DCGM's own unit: the KiB both
// directions moved per second, divided by 1000 (dcgm-exporter's PR 658
// reads DCGM's cache manager so); DCGM_FI_DEV_VGPU_LICENSE_STATUS is 0 on
// bare metal, as DCGM answers there.
func TestCompatNVLinkBandwidthAndLicenseStatus(t *testing.T) {
	cs, err := render.ParseCompatCounters("nvlink.csv", []byte(`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, gauge, NVLink total throughput for all lanes in MiB/s (TX+RX combined).
DCGM_FI_PROF_NVLINK_TX_BYTES, gauge, NVLink transmitted bytes per second.
DCGM_FI_PROF_NVLINK_RX_BYTES, gauge, NVLink received bytes per second.
DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status
`))
	if err != nil {
		t.Fatal(err)
	}
	tn := newTestExporter(t, withRealTime(), withDCGM(nil), withGroups(fullGroups()),
		withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{Hostname: "n", Counters: cs} }))
	p := tn.until(t, "NVLink throughput on the page", func(p *collector.Page) bool {
		return len(series(p, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", `gpu="0"`)) == 1 && len(series(p, "DCGM_FI_PROF_NVLINK_RX_BYTES", `gpu="0"`)) == 1
	})
	for _, gpu := range []string{"0", "3"} {
		g := `gpu="` + gpu + `"`
		tx, rx := parseNum(t, value(t, p, "DCGM_FI_PROF_NVLINK_TX_BYTES", g)), parseNum(t, value(t, p, "DCGM_FI_PROF_NVLINK_RX_BYTES", g))
		got := parseNum(t, value(t, p, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", g))
		if want := (tx + rx) / 1024 / 1000; tx+rx == 0 || !near(got, want) {
			t.Errorf("GPU %s: DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL %v, want (%v + %v B/s) / 1024 / 1000 = %v", gpu, got, tx, rx, want)
		}
		if v := value(t, p, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", g); v != "0" {
			t.Errorf("GPU %s: DCGM_FI_DEV_VGPU_LICENSE_STATUS %s, want 0 on bare metal", gpu, v)
		}
	}
}
