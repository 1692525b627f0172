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

// The future branch has dropped what the newest nvml.h deprecates: every
// function the exporter calls is there unless symbols.go marks it
// deprecated (and so probes it), and each one marked is gone.
func TestSymbolTableMarksWhatTheFutureBranchDrops(t *testing.T) {
	syms, err := fakenvml.BranchSymbols(fakenvml.Future)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range nvmlsampler.Symbols {
		if want := s.Deprecated == 0; syms[s.Name] != want {
			t.Errorf("%s in the future branch: %v, but symbols.go says deprecated since R%d", s.Name, syms[s.Name], s.Deprecated)
		}
	}
}
