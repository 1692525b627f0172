package collector_test

import (
	"context"
	"encoding/csv"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// releaseRow is one row of deploy/dcgm-exporter/releases.csv.
type releaseRow struct {
	release, kind, name, typ, unit, help, source, status string
}

// releaseTable reads deploy/dcgm-exporter/releases.csv: each release line's
// families and labels, with their sources.
func releaseTable(t *testing.T) map[string][]releaseRow {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "deploy", "dcgm-exporter", "releases.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	recs, err := r.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(recs[0], ",") != "release,kind,name,type,unit,help,source,status" {
		t.Fatalf("releases.csv header %v", recs[0])
	}
	out := map[string][]releaseRow{}
	for _, rec := range recs[1:] {
		row := releaseRow{rec[0], rec[1], rec[2], rec[3], rec[4], rec[5], rec[6], rec[7]}
		if row.source == "" || row.status == "" {
			t.Errorf("releases.csv: %s %s has no source or status: every row names where it comes from", row.release, row.name)
		}
		out[row.release] = append(out[row.release], row)
	}
	return out
}

// compatUnits convert our base units (hertz, joules, bytes, ratios) into a
// unit of releases.csv, and say whether DCGM truncates to a whole number.
var compatUnits = map[string]struct {
	scale float64
	whole bool
}{
	"MHz": {1e-6, true}, "Hz": {1, false}, "C": {1, false}, "W": {1, false}, "mJ": {1000, true}, "J": {1, false},
	"percent": {100, false}, "ratio": {1, false}, "MiB": {1.0 / (1 << 20), true}, "bytes": {1, false},
}

// compatNative is our own family of the same quantity as a DCGM family
// name of any release line.
var compatNative = map[string]string{
	"DCGM_FI_DEV_SM_CLOCK": "gpu_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK_HERTZ": "gpu_sm_clock_hertz",
	"DCGM_FI_DEV_MEM_CLOCK": "gpu_memory_clock_hertz", "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": "gpu_memory_clock_hertz",
	"DCGM_FI_DEV_GPU_TEMP": "gpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP_CELSIUS": "gpu_temperature_celsius",
	"DCGM_FI_DEV_MEMORY_TEMP": "gpu_memory_temperature_celsius", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": "gpu_memory_temperature_celsius",
	"DCGM_FI_DEV_POWER_USAGE": "gpu_power_watts", "DCGM_FI_DEV_BOARD_POWER_WATTS": "gpu_power_watts",
	"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "gpu_energy_joules_total", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": "gpu_energy_joules_total",
	"DCGM_FI_DEV_GPU_UTIL": "gpu_utilization_ratio", "DCGM_FI_DEV_GPU_UTIL_RATIO": "gpu_utilization_ratio",
	"DCGM_FI_DEV_MEM_COPY_UTIL": "gpu_memory_utilization_ratio", "DCGM_FI_DEV_MEMORY_UTIL_RATIO": "gpu_memory_utilization_ratio",
	"DCGM_FI_DEV_ENC_UTIL": "gpu_encoder_utilization_ratio", "DCGM_FI_DEV_ENC_UTIL_RATIO": "gpu_encoder_utilization_ratio",
	"DCGM_FI_DEV_DEC_UTIL": "gpu_decoder_utilization_ratio", "DCGM_FI_DEV_DEC_UTIL_RATIO": "gpu_decoder_utilization_ratio",
	"DCGM_FI_DEV_FB_USED": "gpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED_BYTES": "gpu_memory_used_bytes",
	"DCGM_FI_DEV_FB_RESERVED": "gpu_memory_reserved_bytes", "DCGM_FI_DEV_FB_RESERVED_BYTES": "gpu_memory_reserved_bytes",
	"DCGM_FI_DEV_FB_CAPACITY_BYTES": "gpu_memory_total_bytes",
}

// busyGPU0Node is the default simulated node held steady, with GPU 0 at a
// utilisation of 0.94.
func busyGPU0Node() *simnode.Scenario {
	sc := simnode.DefaultScenario()
	sc.Steady = true
	sc.GPUs[0].Workload = &simnode.Workload{Utilization: &simnode.Curve{Mean: 0.94}, Memory: &simnode.Curve{Mean: 0.5}}
	return sc
}

// compatPage is the page of a simulated node serving the compatibility
// families with cc, once DCGM's rates are on it.
func compatPage(t *testing.T, sc *simnode.Scenario, cc render.CompatConfig) *collector.Page {
	t.Helper()
	tn := newTestExporter(t, withRealTime(), withScenario(sc), withKubelet(), withDCGM(nil), withGroups(fullGroups()),
		withConfig(func(c *collector.Config) { c.Compat = &cc }))
	if err := tn.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	var p *collector.Page
	tn.until(t, "DCGM rates on the page", func(pg *collector.Page) bool {
		p = pg
		return len(series(pg, "DCGM_FI_PROF_PCIE_TX_BYTES"))+len(series(pg, "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND")) > 0
	})
	return p
}

// pageMeta is each family's HELP and TYPE on a page.
func pageMeta(p *collector.Page) (help, typ map[string]string) {
	help, typ = map[string]string{}, map[string]string{}
	for _, l := range strings.Split(string(p.Plain), "\n") {
		if rest, ok := strings.CutPrefix(l, "# HELP "); ok {
			name, text, _ := strings.Cut(rest, " ")
			help[name] = text
		}
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, text, _ := strings.Cut(rest, " ")
			typ[name] = text
		}
	}
	return help, typ
}

// TestCompatReleaseContracts: for each release line, the exporter started
// with the line's default counters file serves the families of the line's
// table (deploy/dcgm-exporter/releases.csv) and no other, each with its
// type and help text, in its unit (checked against our own family of the
// same quantity, on GPU 0 at a utilisation of 0.94), with the label names
// of the table and every one of them it must carry.
func TestCompatReleaseContracts(t *testing.T) {
	table := releaseTable(t)
	for _, rel := range render.CompatReleases {
		t.Run(rel.Name, func(t *testing.T) {
			rows := table[rel.Name]
			if len(rows) == 0 {
				t.Fatalf("releases.csv has no row for release line %s", rel.Name)
			}
			p := compatPage(t, busyGPU0Node(), render.CompatConfig{Release: rel.Name, Hostname: "gpu-node-7"})
			help, typ := pageMeta(p)
			labels := map[string]bool{}
			var families []string
			for _, r := range rows {
				switch r.kind {
				case "label":
					labels[r.name] = true
				case "family":
					families = append(families, r.name)
				default:
					t.Errorf("releases.csv: kind %q of %s", r.kind, r.name)
				}
			}
			// Names: the table's families, and no other DCGM family.
			slices.Sort(families)
			served := render.CompatFamilyNamesOf(rel.DefaultCounters())
			slices.Sort(served)
			if !slices.Equal(served, families) {
				t.Errorf("families of the line's default counters file %v, table %v", served, families)
			}
			for name := range typ {
				if strings.HasPrefix(name, "DCGM_") && !slices.Contains(families, name) {
					t.Errorf("%s is on the page but not in the line's table", name)
				}
			}
			driver, host := "", ""
			for l := range labels {
				if strings.HasPrefix(l, "DCGM_FI_") {
					driver = l
				}
				if strings.EqualFold(l, "hostname") {
					host = l
				}
			}
			if driver == "" || host == "" {
				t.Fatalf("the table names no driver or host name label: %v", labels)
			}
			for _, r := range rows {
				if r.kind != "family" {
					continue
				}
				t.Run(r.name, func(t *testing.T) {
					all := series(p, r.name)
					if len(all) == 0 {
						if r.name == "DCGM_FI_DEV_FB_RESERVED" || r.name == "DCGM_FI_DEV_FB_RESERVED_BYTES" {
							return // NVML's memory info v2 only
						}
						t.Fatalf("not served")
					}
					if typ[r.name] != r.typ || help[r.name] != r.help {
						t.Errorf("TYPE %q HELP %q, table %q %q", typ[r.name], help[r.name], r.typ, r.help)
					}
					for _, l := range all {
						lab := parseLabels(l)
						for name := range lab {
							if !labels[name] {
								t.Errorf("label %s is not in the line's table: %s", name, l)
							}
						}
						for _, must := range []string{"gpu", "UUID", "pci_bus_id", "device", "modelName", host, driver} {
							if lab[must] == "" {
								t.Errorf("no %s label: %s", must, l)
							}
						}
						xidFamily := r.unit == "XID code"
						if (lab["err_code"] != "") != xidFamily || (lab["err_msg"] != "") != xidFamily {
							t.Errorf("err_code/err_msg on the XID family alone: %s", l)
						}
						if (lab["GPU_I_ID"] != "") != (lab["gpu"] == "7") {
							t.Errorf("GPU_I_ID on GPU 7's MIG instances alone: %s", l)
						}
					}
					native, ok := compatNative[r.name]
					if !ok {
						return
					}
					u, ok := compatUnits[r.unit]
					if !ok {
						t.Fatalf("unit %q of the table has no conversion in this test", r.unit)
					}
					base := parseNum(t, value(t, p, native, `gpu="0"`, `gpu_instance=""`))
					want := base * u.scale
					got := parseNum(t, value(t, p, r.name, `gpu="0"`))
					tol := 1e-9 * max(1, math.Abs(want))
					if u.whole {
						want, tol = math.Floor(want), 1
					}
					if math.Abs(got-want) > tol {
						t.Errorf("%s{gpu=0} = %v, want %v (%s = %v in %s)", r.name, got, want, native, base, r.unit)
					}
				})
			}
			if rel.Name == "4.9" {
				// The 4.9 release notes' units: a 0-1 ratio, joules.
				if got := value(t, p, "DCGM_FI_DEV_GPU_UTIL_RATIO", `gpu="0"`); got != "0.94" {
					t.Errorf("DCGM_FI_DEV_GPU_UTIL_RATIO{gpu=0} = %s, want 0.94 (gpu_utilization_ratio %s)", got, value(t, p, "gpu_utilization_ratio", `gpu="0"`))
				}
				j, e := parseNum(t, value(t, p, "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", `gpu="0"`)), parseNum(t, value(t, p, "gpu_energy_joules_total", `gpu="0"`))
				if j != e {
					t.Errorf("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL{gpu=0} = %v, gpu_energy_joules_total = %v J", j, e)
				}
			}
		})
	}
}

// A counters file of a newer dcgm-exporter, with a field this exporter
// does not know: the exporter starts, serves the known fields in the units
// their names state and the XID totals, and counts the unknown one, under
// the default release line's host name label.
func TestCompatMixedCountersFile(t *testing.T) {
	cs, err := render.ParseCompatCounters("mixed.csv", []byte(`# a 4.10 user's own file
DCGM_FI_DEV_FB_CAPACITY_BYTES,        gauge,   Total GPU memory (in bytes).
DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND, gauge,  PCIe TX (in B/s).
DCGM_EXP_XID_ERRORS_TOTAL,            counter, Total XID errors observed since exporter start.
DCGM_EXP_XID_ERRORS_COUNT,            gauge,   XID errors observed during the configured time window.
DCGM_FI_DEV_QUANTUM_FLUX_RATIO,       gauge,   A field of a DCGM to come.
DCGM_FI_SYSTEM_DRIVER_VERSION,        label,   Driver Version
`))
	if err != nil {
		t.Fatal(err)
	}
	sc := simnode.DefaultScenario()
	gpu := 1
	sc.Faults = append(sc.Faults, simnode.FaultSpec{At: simnode.Duration(time.Second), GPU: &gpu, XID: 13})
	clk := newClock()
	tn := newTestExporter(t, withScenario(sc), withClock(clk), withKubelet(), withDCGM(nil),
		withNodeXIDSource(func(n *simnode.Node) xid.EventSource { return n.XIDSource() }),
		withConfig(func(c *collector.Config) { c.Compat = &render.CompatConfig{Hostname: "gpu-node-7", Counters: cs} }))
	ctx := context.Background()
	if err := tn.client.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		clk.Advance(time.Second)
		tn.e.SampleOnce(ctx)
	}
	// The PCIe rate needs two of DCGM's samples, which come in the
	// background on their own clock.
	waitFor(t, "XID 13 on GPU 1 and a PCIe rate", func() bool {
		clk.Advance(time.Second)
		tn.e.SampleOnce(ctx)
		p := tn.e.Page()
		return len(series(p, "DCGM_EXP_XID_ERRORS_TOTAL", `gpu="1"`)) > 0 && len(series(p, "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND")) > 0
	})
	p := tn.e.Page()
	total := parseNum(t, value(t, p, "gpu_memory_total_bytes", `gpu="3"`, `gpu_instance=""`))
	if got := parseNum(t, value(t, p, "DCGM_FI_DEV_FB_CAPACITY_BYTES", `gpu="3"`)); got != total {
		t.Errorf("DCGM_FI_DEV_FB_CAPACITY_BYTES{gpu=3} = %v, want gpu_memory_total_bytes %v", got, total)
	}
	if n := len(series(p, "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND")); n == 0 {
		t.Error("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND not served")
	}
	lab := parseLabels(series(p, "DCGM_FI_DEV_FB_CAPACITY_BYTES", `gpu="3"`)[0])
	if lab["hostname"] != "gpu-node-7" || lab["Hostname"] != "" || lab["DCGM_FI_SYSTEM_DRIVER_VERSION"] == "" {
		t.Errorf("labels %v: want hostname and DCGM_FI_SYSTEM_DRIVER_VERSION", lab)
	}
	if v := value(t, p, "DCGM_EXP_XID_ERRORS_TOTAL", `gpu="1"`, `xid="13"`); v != "1" {
		t.Errorf("DCGM_EXP_XID_ERRORS_TOTAL{gpu=1,xid=13} = %s, want 1", v)
	}
	if s := series(p, "DCGM_EXP_XID_ERRORS_TOTAL", `gpu="2"`); len(s) != 0 {
		t.Errorf("DCGM_EXP_XID_ERRORS_TOTAL of a GPU without XIDs: %v, want none (dcgm-exporter serves only the XIDs seen)", s)
	}
	if v := value(t, p, "DCGM_EXP_XID_ERRORS_COUNT", `gpu="1"`, `xid="13"`, `window_size_in_ms="300000"`); v != "1" {
		t.Errorf("DCGM_EXP_XID_ERRORS_COUNT{gpu=1,xid=13} = %s, want 1", v)
	}
	// A GPU without XIDs in the window: one 0 without xid.
	quiet := series(p, "DCGM_EXP_XID_ERRORS_COUNT", `gpu="2"`)
	if len(quiet) != 1 || parseLabels(quiet[0])["xid"] != "" || parseLabels(quiet[0])["window_size_in_ms"] != "300000" || !strings.HasSuffix(quiet[0], " 0") {
		t.Errorf("DCGM_EXP_XID_ERRORS_COUNT{gpu=2}: %v, want one 0 with window_size_in_ms and no xid", quiet)
	}
	for state, want := range map[string]string{"unknown": "1", "not_read": "0"} {
		if v := value(t, p, "gpu_exporter_compat_fields", `state="`+state+`"`); v != want {
			t.Errorf("gpu_exporter_compat_fields{state=%q} = %s, want %s", state, v, want)
		}
	}
	if s := series(p, "DCGM_FI_DEV_QUANTUM_FLUX_RATIO"); len(s) != 0 {
		t.Errorf("the unknown field is served: %v", s)
	}
	// The window passes: the count goes back to one 0, the total stays.
	for range 3 {
		clk.Advance(2 * time.Minute)
		tn.e.SampleOnce(ctx)
	}
	p = tn.e.Page()
	if got := series(p, "DCGM_EXP_XID_ERRORS_COUNT", `gpu="1"`); len(got) != 1 || !strings.HasSuffix(got[0], " 0") {
		t.Errorf("DCGM_EXP_XID_ERRORS_COUNT{gpu=1} six minutes later: %v, want one 0", got)
	}
	if v := value(t, p, "DCGM_EXP_XID_ERRORS_TOTAL", `gpu="1"`, `xid="13"`); v != "1" {
		t.Errorf("DCGM_EXP_XID_ERRORS_TOTAL{gpu=1,xid=13} = %s after the window, want 1", v)
	}
}
