package collector_test

import (
	"context"
	"fmt"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// TestMIGGeometryAgainstTable puts one GPU instance of every profile at
// every placement NVIDIA's MIG geometry table allows, on every model of the
// table, and checks what the exporter reports against the table: profile
// names and slices, free compute slices and how many of each profile still
// fit. The expectations are worked out here from the table alone.
func TestMIGGeometryAgainstTable(t *testing.T) {
	for _, m := range miggeometry.All() {
		t.Run(m.Model, func(t *testing.T) {
			for _, p := range m.Profiles {
				for _, pl := range p.Placements() {
					t.Run(fmt.Sprintf("%s@%d", p.Name, pl.Start), func(t *testing.T) {
						checkGeometry(t, &m, p, pl)
					})
				}
			}
		})
	}
}

func checkGeometry(t *testing.T, m *miggeometry.Model, p miggeometry.Profile, pl miggeometry.Placement) {
	sc, err := simnode.ParseScenario("geometry.yaml", []byte(fmt.Sprintf(`
node: {model: %s, count: 1}
gpus:
  - index: 0
    mig:
      - {profile: %q, placement: %d}
`, m.Model, p.Name, pl.Start)))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := newExporter(t, sc, newClock(), nil)
	e.SampleOnce(context.Background())
	g := e.Page().State.Sample.GPUs[0]
	if g.MIGLayout == nil {
		t.Fatal("no MIG layout sampled")
	}
	// Profiles: names and compute slices as the table lists them.
	got := map[string]int{}
	for _, sp := range g.MIGLayout.Profiles {
		got[sp.Name] = sp.Slices
	}
	for _, q := range m.Profiles {
		if s, ok := got[q.Name]; !ok || s != q.Compute {
			t.Errorf("profile %s: sampled slices %d (present %v); table says %d", q.Name, s, ok, q.Compute)
		}
	}
	if len(got) != len(m.Profiles) {
		t.Errorf("sampled %d profiles %v; table lists %d", len(got), got, len(m.Profiles))
	}
	if g.MIGLayout.TotalSlices != m.ComputeSlices {
		t.Errorf("total slices %d; table says %d", g.MIGLayout.TotalSlices, m.ComputeSlices)
	}
	mfs, err := e.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	if v := gaugeValue(mfs, "gpu_mig_free_slices", nil); v != float64(m.ComputeSlices-p.Compute) {
		t.Errorf("gpu_mig_free_slices = %v; want %d (%d compute slices less %s's %d)", v, m.ComputeSlices-p.Compute, m.ComputeSlices, p.Name, p.Compute)
	}
	if v := gaugeValue(mfs, "gpu_mig_info", map[string]string{"mig_profile": p.Name}); v != 1 {
		t.Errorf("gpu_mig_info{mig_profile=%q} = %v; want 1", p.Name, v)
	}
	occupied := uint64(1<<uint(pl.Size)-1) << uint(pl.Start)
	for _, q := range m.Profiles {
		want := tablePlaceable(m, q, p, occupied)
		if v := gaugeValue(mfs, "gpu_mig_placeable_instances", map[string]string{"mig_profile": q.Name}); v != float64(want) {
			t.Errorf("gpu_mig_placeable_instances{mig_profile=%q} = %v; want %d", q.Name, v, want)
		}
	}
}

// tablePlaceable is how many more instances of q fit beside one instance of
// p covering the memory slices in occupied, by the table: free placements of
// q taken in order, within q's instance limit and the free compute slices.
func tablePlaceable(m *miggeometry.Model, q, p miggeometry.Profile, occupied uint64) int {
	limit := q.Count
	if q.ID == p.ID {
		limit--
	}
	free := m.ComputeSlices - p.Compute
	n := 0
	for _, pl := range q.Placements() {
		mask := uint64(1<<uint(pl.Size)-1) << uint(pl.Start)
		if n >= limit || (n+1)*q.Compute > free {
			break
		}
		if occupied&mask == 0 {
			occupied |= mask
			n++
		}
	}
	return n
}

// gaugeValue is the value of the one series of family name whose labels
// include want; NaN-free -1 when there is none.
func gaugeValue(mfs []*dto.MetricFamily, name string, want map[string]string) float64 {
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, s := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range s.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			return s.GetGauge().GetValue()
		}
	}
	return -1
}
