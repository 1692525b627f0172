package rightsize

import (
	"maps"
	"slices"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
)

// TestShippedGKEPriceLists: the on-demand and Spot lists parse, price the
// same models, each Spot price below its on-demand one, and price every
// model by the name NVML reports and by GKE's accelerator name.
func TestShippedGKEPriceLists(t *testing.T) {
	onDemand, err := fragmentation.LoadPriceList("../../deploy/prices-gke-on-demand.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spot, err := fragmentation.LoadPriceList("../../deploy/prices-gke-spot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if onDemand.Date == "" || spot.Date == "" || onDemand.Source == "" || spot.Source == "" {
		t.Error("each list names the date and the source of its prices")
	}
	models := slices.Sorted(maps.Keys(onDemand.PerGPUHour))
	if !slices.Equal(models, slices.Sorted(maps.Keys(spot.PerGPUHour))) || len(models) < 3 {
		t.Fatalf("on-demand prices %v, Spot %v: want the same few models", models, slices.Sorted(maps.Keys(spot.PerGPUHour)))
	}
	for _, m := range models {
		if s, o := spot.PerGPUHour[m], onDemand.PerGPUHour[m]; s <= 0 || s >= o {
			t.Errorf("%s: Spot %v, on-demand %v: want 0 < Spot < on-demand", m, s, o)
		}
		f, ok := LookupFacts(m)
		if !ok {
			t.Errorf("%s is priced but not in accelerators.yaml", m)
			continue
		}
		p := Prices{List: onDemand}
		if got := p.PerGPUHour("", f.GKE[0]); got == nil || *got != onDemand.PerGPUHour[m] {
			t.Errorf("GKE's %s is not priced as %s", f.GKE[0], m)
		}
	}
}

// TestPricesByAcceleratorName: a price list keyed by GKE's accelerator
// names prices the models of those accelerators.
func TestPricesByAcceleratorName(t *testing.T) {
	list, err := fragmentation.ParsePriceList("gke.yaml", []byte("per_gpu_hour:\n  nvidia-tesla-t4: 0.35\n  nvidia-h100-80gb: 11\n"))
	if err != nil {
		t.Fatal(err)
	}
	p := Prices{List: list}
	for _, tc := range []struct {
		model, accelerator string
		want               float64
	}{
		{"Tesla T4", "nvidia-tesla-t4", 0.35},
		{"NVIDIA H100 80GB HBM3", "nvidia-h100-80gb", 11},
		{"NVIDIA H100 80GB HBM3", "", 11}, // the key's words are all in the model's
		{"", "nvidia-tesla-t4", 0.35},
	} {
		if got := p.PerGPUHour(tc.model, tc.accelerator); got == nil || *got != tc.want {
			t.Errorf("PerGPUHour(%q, %q) = %v, want %v", tc.model, tc.accelerator, got, tc.want)
		}
	}
	if got := p.PerGPUHour("NVIDIA L4", "nvidia-l4"); got != nil {
		t.Errorf("the L4 is not in the list, but is priced %v", *got)
	}
}
