package collector

import (
	"strconv"
	"testing"
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
