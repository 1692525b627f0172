package simnode

import (
	"math"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
)

// The simulated DCGM lists each compute instance as an entity of its own
// and gives it its own activity (from its own workload), as DCGM does; a
// GPU instance's activity is the mean of its compute instances'.
func TestDCGMComputeInstances(t *testing.T) {
	sc, err := ParseScenario("ci.yaml", []byte(`
node: {model: A100-SXM4-80GB, count: 1}
gpus:
  - index: 0
    mig: [{profile: 3g.40gb, computeInstances: 2, computeInstanceWorkloads: [{preset: busy}, {preset: idle}]}, {profile: 1g.10gb}]
`))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now := start
	n, err := New(sc, WithClock(func() time.Time { return now }))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	devs, err := n.DCGM().Devices()
	if err != nil {
		t.Fatal(err)
	}
	cis := map[[2]int]bool{}
	for _, d := range devs {
		if d.Entity.Kind == dcgm.EntityComputeInstance {
			cis[[2]int{d.GPUInstance, d.ComputeInstance}] = true
		}
	}
	migs := n.Devices()[0].MIG()
	if len(cis) != len(migs) {
		t.Fatalf("compute instance entities %v, want one per MIG device (%d)", cis, len(migs))
	}
	for step := range 20 {
		now = start.Add(time.Duration(step) * 7 * time.Second)
		el := n.elapsed()
		a0, ok0 := n.activity(0, migs[0].gi, migs[0].ci)
		a1, ok1 := n.activity(0, migs[1].gi, migs[1].ci)
		gi, okGI := n.activity(0, migs[0].gi, -1)
		if !ok0 || !ok1 || !okGI {
			t.Fatalf("no activity: %v %v %v", ok0, ok1, okGI)
		}
		if want := 0.85 * migs[0].utilAt(el); math.Abs(a0-want) > 1e-12 {
			t.Errorf("compute instance 0: %v, want its own %v", a0, want)
		}
		if math.Abs(gi-(a0+a1)/2) > 1e-12 {
			t.Errorf("GPU instance %v, want the mean of %v and %v", gi, a0, a1)
		}
		if a0 < 0.5 || a1 > 0.05 {
			t.Errorf("busy compute instance %v, idle one %v", a0, a1)
		}
	}
	if _, ok := n.activity(0, migs[0].gi, 5); ok {
		t.Error("a compute instance that does not exist has activity")
	}
}
