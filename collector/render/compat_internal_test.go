package render

import (
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
// while float products a hair under a whole number are that number.
func TestCompatWhole(t *testing.T) {
	for _, tc := range []struct {
		name     string
		v, scale float64
		want     float64
	}{
		{"a byte short of 41216 MiB", 41216*mib - 1, 1.0 / mib, 41215},
		{"41216 MiB", 41216 * mib, 1.0 / mib, 41216},
		{"1.98 GHz in MHz", 1.98e9, 1e-6, 1980},
		{"energy in mJ", 123456.789, 1000, 123456789},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &sample.DeviceState{}
			d.Values.Set(sample.FieldMemoryUsed, tc.v)
			got, ok := whole(sample.FieldMemoryUsed, tc.scale, scopeDevice)(&compatDevice{d: d})
			if !ok || got != tc.want {
				t.Errorf("whole(%v × %v) = %v, want %v", tc.v, tc.scale, got, tc.want)
			}
		})
	}
}
