package miggeometry

import "testing"

func TestTableLoads(t *testing.T) {
	all := All()
	if len(all) < 10 {
		t.Fatalf("%d models; want every MIG-capable model", len(all))
	}
	for _, m := range all {
		t.Run(m.Model, func(t *testing.T) {
			// Every profile's placements together never need more than the
			// GPU's memory slices, and its instances no more compute than it has.
			for _, p := range m.Profiles {
				if p.Count*p.Compute > m.ComputeSlices {
					t.Errorf("%s: %d instances of %d compute slices exceed %d", p.Name, p.Count, p.Compute, m.ComputeSlices)
				}
				if len(p.Places) < p.Count {
					t.Errorf("%s: %d placements for %d instances", p.Name, len(p.Places), p.Count)
				}
			}
			if _, ok := ByModel(m.Model); !ok {
				t.Errorf("ByModel(%q) not found", m.Model)
			}
			for _, n := range m.NVMLNames {
				if got, ok := ByNVMLName(n); !ok || got.Model != m.Model {
					t.Errorf("ByNVMLName(%q) = %v, %v", n, got, ok)
				}
			}
		})
	}
}
