package fakenvml_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

// The exporter's table of NVML calls (collector/nvmlsampler/symbols.go) against the
// branch lists generated from each branch's nvml.h (branches/*.txt): every
// function is exported from the branch it names on, and not before. So the
// probes gate exactly what older drivers lack, and the fake library serves
// every function the exporter calls.
func TestSymbolTableMatchesBranchHeaders(t *testing.T) {
	for _, b := range fakenvml.Branches {
		n, err := strconv.Atoi(strings.TrimPrefix(strings.ToLower(b), "r"))
		if err != nil {
			t.Fatalf("branch %q", b)
		}
		syms, err := fakenvml.BranchSymbols(b)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range nvmlsampler.Symbols {
			want := int(s.Since) <= n
			if syms[s.Name] != want {
				t.Errorf("%s in %s's nvml.h: %v, but symbols.go says since R%d", s.Name, b, syms[s.Name], s.Since)
			}
			if s.Fallback != "" && !syms[s.Fallback] {
				t.Errorf("%s: fallback %s missing in %s", s.Name, s.Fallback, b)
			}
		}
	}
}
