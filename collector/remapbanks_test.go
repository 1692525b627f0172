package collector_test

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestRowRemapBanksWalkTowardExhaustion walks one GPU's banks down, one
// level a minute, and checks the histogram and the low-availability count
// the page serves at each step, and that spare rows never come back after
// the fault ends.
func TestRowRemapBanksWalkTowardExhaustion(t *testing.T) {
	sc := scenario(t, `
node: {model: H100-SXM5-80GB, count: 2}
faults:
  - {at: 1m, until: 10m, gpu: 1, remap: {walkEvery: 1m}}
  - {at: 1m, gpu: 0, remap: {banks: {high: 2, low: 1}}}
`)
	clk := newClock()
	e, _ := newExporter(t, sc, clk, nil)
	var elapsed time.Duration
	for _, step := range []struct {
		name string
		at   time.Duration
		// banks on GPU 1: max, high, partial, low, none
		banks         [5]int
		low, remapped int
	}{
		{"healthy", 30 * time.Second, [5]int{640, 0, 0, 0, 0}, 0, 0},
		{"first step", 2 * time.Minute, [5]int{639, 1, 0, 0, 0}, 0, 1},
		{"partial", 3 * time.Minute, [5]int{639, 0, 1, 0, 0}, 0, 2},
		{"low", 4 * time.Minute, [5]int{639, 0, 0, 1, 0}, 1, 3},
		{"exhausted", 5 * time.Minute, [5]int{639, 0, 0, 0, 1}, 1, 4},
		{"next bank", 6 * time.Minute, [5]int{638, 1, 0, 0, 1}, 1, 5},
		{"after the fault", 30 * time.Minute, [5]int{637, 1, 0, 0, 2}, 2, 9}, // nine steps from 1m to 10m, then nothing comes back
	} {
		t.Run(step.name, func(t *testing.T) {
			clk.Advance(step.at - elapsed)
			elapsed = step.at
			e.SampleOnce(context.Background())
			p := e.Page()
			for i, lvl := range []string{"max", "high", "partial", "low", "none"} {
				if v := value(t, p, "gpu_row_remap_banks", `gpu="1"`, `availability="`+lvl+`"`); v != strconv.Itoa(step.banks[i]) {
					t.Errorf("banks %s = %s, want %d", lvl, v, step.banks[i])
				}
			}
			if step.low == 0 {
				if s := series(p, "gpu_row_remap_banks_low_availability", `gpu="1"`); len(s) != 0 {
					t.Errorf("low availability served with no bank low: %v", s)
				}
			} else if v := value(t, p, "gpu_row_remap_banks_low_availability", `gpu="1"`); v != strconv.Itoa(step.low) {
				t.Errorf("low availability = %s, want %d", v, step.low)
			}
			if v := value(t, p, "gpu_remapped_rows", `gpu="1"`, `type="uncorrectable"`); v != strconv.Itoa(step.remapped) {
				t.Errorf("uncorrectable remapped rows = %s, want %d", v, step.remapped)
			}
		})
	}
	p := e.Page()
	if v := value(t, p, "gpu_row_remap_banks_low_availability", `gpu="0"`); v != "1" {
		t.Errorf("GPU 0 with one low bank: low availability %s, want 1", v)
	}
	if v := value(t, p, "gpu_row_remap_banks", `gpu="0"`, `availability="max"`); v != "637" {
		t.Errorf("GPU 0: max %s, want 637", v)
	}
}
