package collector_test

import (
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// GPU 2 gets two uncorrectable ECC errors at 30 s and one more at 90 s;
// GPU 1 only corrected ones. The exporter serves the time of the sample in
// which it saw GPU 2's count grow, for GPU 2 only, and only from then on.
const eccScenario = `
node: {model: H100-SXM5-80GB, count: 4}
faults:
  - {at: 30s, gpu: 2, ecc: {uncorrected: 2}}
  - {at: 30s, gpu: 1, ecc: {corrected: 5}}
  - {at: 90s, gpu: 2, ecc: {uncorrected: 1}}
`

func TestECCUncorrectedLastIncrease(t *testing.T) {
	sc, err := simnode.ParseScenario("ecc.yaml", []byte(eccScenario))
	if err != nil {
		t.Fatal(err)
	}
	fn := newFaultNode(t, sc)
	const name = "gpu_ecc_uncorrected_last_increase_timestamp_seconds"
	series := func(step time.Duration) (map[string]float64, time.Time) {
		mfs := fn.step(t, step, 0)
		out := map[string]float64{}
		if mf := mfs[name]; mf != nil {
			for _, m := range mf.GetMetric() {
				out[fltLabels(m)["gpu"]] = fltValue(m)
			}
		}
		return out, fn.clk.Now()
	}
	if got, _ := series(10 * time.Second); len(got) != 0 {
		t.Fatalf("at 10s, before any error: %v, want no series", got)
	}
	got, at40 := series(30 * time.Second)
	want := float64(at40.UnixNano()) / 1e9
	if len(got) != 1 || got["2"] != want {
		t.Fatalf("at 40s, after GPU 2's errors at 30s: %v, want only GPU 2 at %v", got, want)
	}
	if got, _ := series(30 * time.Second); len(got) != 1 || got["2"] != want {
		t.Fatalf("at 70s, no new error: %v, want GPU 2 still at %v", got, want)
	}
	got, at100 := series(30 * time.Second)
	if want := float64(at100.UnixNano()) / 1e9; len(got) != 1 || got["2"] != want {
		t.Fatalf("at 100s, after GPU 2's error at 90s: %v, want GPU 2 at %v", got, want)
	}
}
