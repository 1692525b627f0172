package xid_test

import (
	"strconv"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/xid"
)

func TestDCGMExporterMessage(t *testing.T) {
	// dcgm-exporter 4.5.3-4.8.2's text, code by code, for a few of the 173
	// codes it knows (0 to 172), and its answer past them.
	for _, tc := range []struct {
		code int
		want string
	}{
		{0, "No Error"},
		{13, "Graphics Engine Exception"},
		{31, "GPU memory page fault"},
		{48, "Double Bit ECC Error"},
		{79, "GPU has fallen off the bus"},
		{94, "Contained ECC error"},
		{95, "Uncontained ECC error"},
		{119, "GSP RPC Timeout"},
		{154, "GPU Recovery Action Changed"},
		{172, "Uncorrectable SRAM Error"},
		{173, "Unknown Error"},
		{999, "Unknown Error"},
		{-1, "Unknown Error"},
	} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			if got := xid.DCGMExporterMessage(tc.code); got != tc.want {
				t.Errorf("DCGMExporterMessage(%d) = %q, want %q", tc.code, got, tc.want)
			}
		})
	}
	for code := 0; code <= 172; code++ {
		if m := xid.DCGMExporterMessage(code); m == "" || m == xid.UnknownMessage {
			t.Errorf("code %d: %q; dcgm-exporter names every code from 0 to 172", code, m)
		}
	}
}
