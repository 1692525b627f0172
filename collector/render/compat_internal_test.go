package render

import (
	"math"
	"strconv"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// err_msg is dcgm-exporter's text for every code it knows, also where the
// XID catalog's own name (the category and action labels of
// gpu_xid_errors_total) says it otherwise.
func TestCompatXIDMessage(t *testing.T) {
	for code, want := range map[int]string{
		0:   "No Error",
		48:  "Double Bit ECC Error",
		63:  "ECC page retirement or row remapping recording event",
		140: "Unrecovered ECC Error",
		150: "NVLINK: MSE Error",
		300: "Unknown Error",
	} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			if got := xidMessage(code); got != want {
				t.Errorf("err_msg of XID %d = %q, want dcgm-exporter's %q", code, got, want)
			}
		})
	}
}

// DCGM truncates to whole MiB: a byte short of a MiB is the MiB below,
// while float products a hair off a whole number are that number.
func TestCompatUnitConvert(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    float64
		unit compatUnit
		want float64
	}{
		{"a byte short of 41216 MiB", 41216*mib - 1, unitMiB, 41215},
		{"41216 MiB", 41216 * mib, unitMiB, 41216},
		{"1.98 GHz in MHz", 1.98e9, unitMHz, 1980},
		{"energy in mJ", 123456.789, unitMilliJ, 123456789},
		{"0.57 in percent", 0.57, unitPercent, 57},
		{"0.573 in percent", 0.573, unitPercent, 57.3},
		{"NVLink 2048000 B/s in DCGM's MB/s", 2048000, unitNVLinkMB, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.unit.convert(tc.v); got != tc.want {
				t.Errorf("%v in %+v = %v, want %v", tc.v, tc.unit, got, tc.want)
			}
		})
	}
}

// Every name of a served field is served in the unit its name states,
// whichever name a counters file uses: DCGM's legacy names in DCGM's
// legacy units, its naming standard's names (DCGM 4.6 canonical names,
// the base-unit fields of go-dcgm v1.4611, DCGM 4.7's names of the 4.9
// release notes) in base units.
func TestCompatUnitByName(t *testing.T) {
	g := &sample.GPUState{}
	g.Values.Set(sample.FieldSMClock, 1.98e9)
	g.Values.Set(sample.FieldMemoryClock, 2.619e9)
	g.Values.Set(sample.FieldEnergy, 123456.789)
	g.Values.Set(sample.FieldUtilization, 0.94)
	g.Values.Set(sample.FieldMemoryUtilization, 0.31)
	g.Values.Set(sample.FieldEncoderUtilization, 0.05)
	g.Values.Set(sample.FieldDecoderUtilization, 0)
	g.Values.Set(sample.FieldMemoryTotal, 81559*mib)
	g.Values.Set(sample.FieldMemoryUsed, 41216*mib+5)
	g.Values.Set(sample.FieldMemoryReserved, 579*mib)
	g.Values.Set(sample.FieldTemperature, 61)
	g.Rates.Set(sample.FieldNVLinkTxBytes, 3e9)
	g.Rates.Set(sample.FieldNVLinkRxBytes, 1.096e9)
	g.Rates.Set(sample.FieldPCIeTxBytes, 7.5e8)
	c := &compatDevice{d: &g.DeviceState, g: g}
	for name, want := range map[string]float64{
		"DCGM_FI_DEV_SM_CLOCK":                           1980,
		"DCGM_FI_DEV_SM_CLOCK_HERTZ":                     1.98e9,
		"DCGM_FI_DEV_MEM_CLOCK":                          2619,
		"DCGM_FI_DEV_MEMORY_CLOCK_HERTZ":                 2.619e9,
		"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION":           123456789,
		"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL":            123456.789,
		"DCGM_FI_DEV_GPU_UTIL":                           94,
		"DCGM_FI_DEV_GPU_UTIL_RATIO":                     0.94,
		"DCGM_FI_DEV_MEM_COPY_UTIL":                      31,
		"DCGM_FI_DEV_MEMORY_UTIL_RATIO":                  0.31,
		"DCGM_FI_DEV_ENC_UTIL":                           5,
		"DCGM_FI_DEV_ENC_UTIL_RATIO":                     0.05,
		"DCGM_FI_DEV_DEC_UTIL_RATIO":                     0,
		"DCGM_FI_DEV_FB_TOTAL":                           81559,
		"DCGM_FI_DEV_FB_CAPACITY_BYTES":                  81559 * mib,
		"DCGM_FI_DEV_FB_USED":                            41216,
		"DCGM_FI_DEV_FB_USED_BYTES":                      41216*mib + 5,
		"DCGM_FI_DEV_FB_FREE":                            39763,
		"DCGM_FI_DEV_FB_FREE_BYTES":                      39764*mib - 5,
		"DCGM_FI_DEV_FB_RESERVED_BYTES":                  579 * mib,
		"DCGM_FI_DEV_GPU_TEMP":                           61,
		"DCGM_FI_DEV_GPU_TEMP_CELSIUS":                   61,
		"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":             4000, // 4.096e9 B/s: 4000000 KiB/s, divided by 1000
		"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL":            4000,
		"DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": 4.096e9,
		"DCGM_FI_PROF_PCIE_TX_BYTES":                     7.5e8,
		"DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND":          7.5e8,
	} {
		t.Run(name, func(t *testing.T) {
			f, unit, ok := compatFieldOf(name)
			if !ok {
				t.Fatalf("%s is not served", name)
			}
			v, ok := f.value(c)
			if got := unit.convert(v); !ok || math.Abs(got-want) > 1e-9*max(1, math.Abs(want)) {
				t.Errorf("%s = %v (ok %v), want %v", name, got, ok, want)
			}
		})
	}
}
