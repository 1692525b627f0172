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
	onDemand, err := fragmentation.LoadPriceList("../../../deploy/prices-gke-on-demand.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spot, err := fragmentation.LoadPriceList("../../../deploy/prices-gke-spot.yaml")
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
