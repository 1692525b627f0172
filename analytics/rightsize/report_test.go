package rightsize

import (
	"errors"
	"math"
	"testing"
	"time"
)

// An hour at one-minute steps on three nodes: a whole H100, an H100 split
// in MIG devices, and a GKE time-sharing node with four replicas per GPU,
// two of them held.
func showbackFixture() *Observation {
	o := &Observation{
		Window:         Window{End: time.Unix(1e9, 0), Length: time.Hour, Step: time.Minute},
		Owners:         NewOwners(),
		gpuModel:       map[[2]string]string{},
		nodeModel:      map[string]string{"whole": "NVIDIA H100 80GB HBM3", "mig": "NVIDIA H100 80GB HBM3", "shared": "NVIDIA H100 80GB HBM3"},
		nodeAccel:      map[string]string{},
		memory:         map[DeviceKey]float64{},
		migSizes:       map[string]map[string]float64{},
		modelMem:       map[string]float64{},
		nodes:          map[string]nodeLabels{"shared": {replicas: 4}},
		ExporterPrices: map[string]float64{"NVIDIA H100 80GB HBM3": 7},
	}
	// Steps held; Share, Busy and Idle are sums over those 60 steps.
	o.Holdings = []*Holding{
		{DeviceKey: DeviceKey{Node: "whole", UUID: "GPU-w"}, Namespace: "a", Pod: "train", Steps: 60, Share: 60, Busy: 30, Idle: 0},
		{DeviceKey: DeviceKey{Node: "mig", UUID: "GPU-m", GPUInstance: "1", ComputeInstance: "0"}, MIGProfile: "3g.40gb", Namespace: "b", Pod: "tune", Steps: 60, Share: 60, Busy: 60, Idle: 0},
		// Two of four replicas held: each holder's recorded share is 1/2,
		// its replica share 1/4; chat-1 was idle half the hour.
		{DeviceKey: DeviceKey{Node: "shared", UUID: "GPU-s"}, Namespace: "b", Pod: "chat-0", Steps: 60, Share: 30, Busy: 15, Idle: 0},
		{DeviceKey: DeviceKey{Node: "shared", UUID: "GPU-s"}, Namespace: "b", Pod: "chat-1", Steps: 60, Share: 30, Busy: 3, Idle: 15},
	}
	return o
}

func TestReportShares(t *testing.T) {
	o := showbackFixture()
	sb, err := o.Report(By{Kind: ByNamespace}, Prices{Exporters: o.ExporterPrices})
	if err != nil {
		t.Fatal(err)
	}
	// a: 1 GPU-hour, busy 0.5.
	// b: the 3g.40gb device 3/7 of an hour, all busy; each replica 1/4 of
	//    an hour: chat-0 busy 15/30 of it, chat-1 busy 3/30 and idle 15/30.
	want := []ShowbackRow{
		{Group: "a", AllocatedHours: 1, BusyHours: 0.5, AllocatedCost: p(7), BusyCost: p(3.5), IdleCost: p(0)},
		{Group: "b", AllocatedHours: roundTo(3.0/7+0.5, 3), BusyHours: roundTo(3.0/7+0.125+0.025, 3), IdleHours: 0.125,
			AllocatedCost: p(roundTo(7*(3.0/7+0.5), 2)), BusyCost: p(roundTo(7*(3.0/7+0.15), 2)), IdleCost: p(0.88)},
	}
	if len(sb.Rows) != len(want) {
		t.Fatalf("rows %+v, want %+v", sb.Rows, want)
	}
	for i, w := range want {
		g := sb.Rows[i]
		if g.Group != w.Group || g.AllocatedHours != w.AllocatedHours || g.BusyHours != w.BusyHours || g.IdleHours != w.IdleHours ||
			!sameCost(g.AllocatedCost, w.AllocatedCost) || !sameCost(g.BusyCost, w.BusyCost) || !sameCost(g.IdleCost, w.IdleCost) {
			t.Errorf("group %s: got %+v (costs %v %v %v), want %+v (costs %v %v %v)", w.Group, g, *g.AllocatedCost, *g.BusyCost, *g.IdleCost, w, *w.AllocatedCost, *w.BusyCost, *w.IdleCost)
		}
	}

	// Without the node's replicas, each of the two holders is half the GPU.
	o.nodes = map[string]nodeLabels{}
	sb, err = o.Report(By{Kind: ByNamespace}, Prices{Exporters: o.ExporterPrices})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.Rows[1].AllocatedHours, roundTo(3.0/7+1, 3); got != want {
		t.Errorf("b without replicas: %v GPU-hours, want %v (each holder half of the GPU)", got, want)
	}

	// Unpriced models leave the cost unknown.
	sb, err = o.Report(By{Kind: ByNamespace}, Prices{Exporters: map[string]float64{}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Rows[0].AllocatedCost != nil || len(sb.Unpriced) != 1 {
		t.Errorf("no prices: cost %v, unpriced %v; want unknown and the H100 named", sb.Rows[0].AllocatedCost, sb.Unpriced)
	}
}

func TestReportGroupingsNeedKubeStateMetrics(t *testing.T) {
	o := showbackFixture()
	for _, by := range []By{{Kind: ByOwner}, {Kind: ByLabel, Label: "team"}} {
		if _, err := o.Report(by, Prices{}); !errors.Is(err, ErrNoKSM) {
			t.Errorf("--by=%s without kube-state-metrics: %v, want ErrNoKSM", by, err)
		}
	}
	o.KSM = true
	if _, err := o.Report(By{Kind: ByLabel, Label: "team"}, Prices{}); err == nil {
		t.Error("--by=label:team where no pod has the label: no error; want one naming the allowlist")
	}
	o.Owners.AddPodLabel("a", "train", "label_team", "ml")
	sb, err := o.Report(By{Kind: ByLabel, Label: "team"}, Prices{})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Rows) != 2 || sb.Rows[0].Group != NoLabel || sb.Rows[1].Group != "ml" {
		t.Errorf("groups %+v, want (none) and ml", sb.Rows)
	}
}

func sameCost(a, b *float64) bool {
	return a == nil && b == nil || a != nil && b != nil && math.Abs(*a-*b) < 1e-9
}
