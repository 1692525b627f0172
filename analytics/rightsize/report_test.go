package rightsize

import (
	"errors"
	"math"
	"testing"
	"time"
)

const (
	h100Model = "NVIDIA H100 80GB HBM3"
	t4Model   = "Tesla T4"
)

// An hour at one-minute steps on four nodes: a whole H100, an H100 split
// into a 3g.40gb and a 2g.20gb MIG device, a GKE time-sharing node with
// four replicas per GPU (two of them held), and a T4 node without a price.
// Every GPU is there the whole hour.
func showbackFixture() *Observation {
	o := &Observation{
		Window:    Window{End: time.Unix(1e9, 0), Length: time.Hour, Step: time.Minute},
		Owners:    NewOwners(),
		gpuModel:  map[[2]string]string{},
		nodeModel: map[string]string{"whole": h100Model, "mig": h100Model, "shared": h100Model, "t4": t4Model},
		nodeAccel: map[string]string{},
		memory:    map[DeviceKey]float64{},
		migSizes:  map[string]map[string]float64{},
		modelMem:  map[string]float64{},
		nodes:     map[string]nodeLabels{"shared": {replicas: 4}},
		gpus: map[[2]string]*gpuSteps{
			{"whole", "GPU-w"}:  {Model: h100Model, Steps: 60},
			{"whole", "GPU-w2"}: {Model: h100Model, Steps: 60},
			{"mig", "GPU-m"}:    {Model: h100Model, Steps: 60, MIGSteps: 60},
			{"shared", "GPU-s"}: {Model: h100Model, Steps: 60},
			{"t4", "GPU-t"}:     {Model: t4Model, Steps: 60},
		},
		devices: map[DeviceKey]*deviceSteps{
			{Node: "whole", UUID: "GPU-w"}:                                       {Present: 60, Held: 60},
			{Node: "whole", UUID: "GPU-w2"}:                                      {Present: 60, Held: 0, Unavailable: 20},
			{Node: "mig", UUID: "GPU-m", GPUInstance: "1", ComputeInstance: "0"}: {Profile: "3g.40gb", Present: 60, Held: 60},
			{Node: "mig", UUID: "GPU-m", GPUInstance: "2", ComputeInstance: "0"}: {Profile: "2g.20gb", Present: 60, Held: 30},
			{Node: "shared", UUID: "GPU-s"}:                                      {Present: 60, Held: 60},
			{Node: "t4", UUID: "GPU-t"}:                                          {Present: 60, Held: 60},
		},
		ExporterPrices: map[string]float64{h100Model: 7},
	}
	// Steps held; Share, Busy and Idle are sums over those steps.
	o.Holdings = []*Holding{
		{DeviceKey: DeviceKey{Node: "whole", UUID: "GPU-w"}, Namespace: "a", Pod: "train", Steps: 60, Share: 60, Busy: 30, Idle: 0},
		{DeviceKey: DeviceKey{Node: "mig", UUID: "GPU-m", GPUInstance: "1", ComputeInstance: "0"}, MIGProfile: "3g.40gb", Namespace: "b", Pod: "tune", Steps: 60, Share: 60, Busy: 60, Idle: 0},
		{DeviceKey: DeviceKey{Node: "mig", UUID: "GPU-m", GPUInstance: "2", ComputeInstance: "0"}, MIGProfile: "2g.20gb", Namespace: "b", Pod: "eval", Steps: 30, Share: 30, Busy: 15, Idle: 0},
		// Two of four replicas held: each holder's recorded share is 1/2,
		// its replica share 1/4. Busy is each one's own activity (0.5
		// and 0.1 of the GPU): chat-0 is busier than its replica.
		{DeviceKey: DeviceKey{Node: "shared", UUID: "GPU-s"}, Namespace: "b", Pod: "chat-0", Steps: 60, Share: 30, Busy: 30, Idle: 0},
		{DeviceKey: DeviceKey{Node: "shared", UUID: "GPU-s"}, Namespace: "b", Pod: "chat-1", Steps: 60, Share: 30, Busy: 6, Idle: 15},
		{DeviceKey: DeviceKey{Node: "t4", UUID: "GPU-t"}, Namespace: "b", Pod: "ocr", Steps: 60, Share: 60, Busy: 12, Idle: 0},
	}
	return o
}

func TestReportReconciles(t *testing.T) {
	o := showbackFixture()
	sb, err := o.Report(By{Kind: ByNamespace}, Prices{Exporters: o.ExporterPrices}, UnallocatedShow)
	if err != nil {
		t.Fatal(err)
	}
	// a: 1 H100-hour, busy 0.5.
	// b H100: the 3g.40gb device costs max(3/7, 4/8) = 1/2 of the GPU an
	//    hour, busy all of it; the 2g.20gb max(2/7, 2/8) = 2/7, held half
	//    the hour at half busy (busy 1/14); each replica 1/4 of an hour,
	//    busy chat-0 0.5 + chat-1 0.1 (the GPU's 0.6); chat-1 idle 1/8.
	// b T4: 1 hour, busy 0.2, no price.
	bH100 := 0.5 + 1.0/7 + 0.5
	want := []ShowbackRow{
		{Group: "a", Model: h100Model, AllocatedHours: 1, BusyHours: 0.5, AllocatedCost: p(7), BusyCost: p(3.5), IdleCost: p(0), SharedCost: p(0)},
		{Group: "b", Model: h100Model, AllocatedHours: roundTo(bH100, 3), BusyHours: roundTo(0.5+1.0/14+0.6, 3), IdleHours: 0.125,
			AllocatedCost: p(roundTo(7*bH100, 2)), BusyCost: p(roundTo(7*(0.5+1.0/14+0.6), 2)), IdleCost: p(0.88), SharedCost: p(0)},
		{Group: "b", Model: t4Model, AllocatedHours: 1, BusyHours: 0.2},
	}
	if len(sb.Rows) != len(want) {
		t.Fatalf("rows %+v, want %+v", sb.Rows, want)
	}
	for i, w := range want {
		g := sb.Rows[i]
		if g.Group != w.Group || g.Model != w.Model || g.AllocatedHours != w.AllocatedHours || g.BusyHours != w.BusyHours || g.IdleHours != w.IdleHours ||
			!sameCost(g.AllocatedCost, w.AllocatedCost) || !sameCost(g.BusyCost, w.BusyCost) || !sameCost(g.IdleCost, w.IdleCost) || !sameCost(g.SharedCost, w.SharedCost) {
			t.Errorf("row %d: got %+v, want %+v", i, g, w)
		}
	}
	// The rest of every GPU-hour, by reason: GPU-w2 free 40 minutes and
	// unavailable 20; the 2g.20gb device free half the hour (1/7); the MIG
	// GPU's remainder 1 - 1/2 - 2/7 = 3/14; the time-shared GPU's two
	// unheld replicas 1/2.
	wantFree := map[string]float64{
		ReasonFree:          roundTo(40.0/60, 3),
		ReasonUnheldReplica: 0.5,
		ReasonFreeMIG:       roundTo(1.0/7, 3),
		ReasonRemainder:     roundTo(3.0/14, 3),
		ReasonUnavailable:   roundTo(20.0/60, 3),
	}
	if len(sb.Free) != len(wantFree) {
		t.Errorf("unallocated %+v, want one H100 row per reason of %v", sb.Free, wantFree)
	}
	for _, f := range sb.Free {
		if f.Model != h100Model || f.Hours != wantFree[f.Reason] || f.Cost == nil || math.Abs(*f.Cost-roundTo(7*wantFree[f.Reason], 2)) > 0.011 {
			t.Errorf("unallocated %+v, want %v H100-hours at 7 $", f, wantFree[f.Reason])
		}
	}
	// The bill: four H100s an hour at 7 $ (28 $), and a T4 hour unpriced;
	// the rows add up to both.
	if len(sb.Bill) != 2 {
		t.Fatalf("bill %+v, want the H100 and the T4", sb.Bill)
	}
	h, t4 := sb.Bill[0], sb.Bill[1]
	if h.Model != h100Model || h.Hours != 4 || !sameCost(h.Cost, p(28)) || h.RowsHours != 4 || math.Abs(*h.RowsCost-28) > 0.01 || !h.Adds(false) {
		t.Errorf("H100 bill %+v (cost %v, rows %v), want 4 GPU-hours, 28 $, and rows adding up to them", h, h.Cost, h.RowsCost)
	}
	if t4.Model != t4Model || t4.Hours != 1 || t4.Cost != nil || t4.RowsHours != 1 || !t4.Adds(false) {
		t.Errorf("T4 bill %+v, want 1 GPU-hour, no price, rows adding up to it", t4)
	}
	// The unpriced T4 blanks nothing priced: the totals are the H100's.
	if sb.Total.BillCost == nil || *sb.Total.BillCost != 28 || sb.Total.AllocatedCost == nil || math.Abs(*sb.Total.AllocatedCost+*sb.Total.UnallocatedCost-28) > 0.01 {
		t.Errorf("total %+v, want the priced bill 28 $ = allocated + unallocated", sb.Total)
	}
	if len(sb.Unpriced) != 1 || sb.Unpriced[0] != t4Model {
		t.Errorf("unpriced %v, want the T4", sb.Unpriced)
	}
}

// TestTimeSlicedBusyAddsUp: the busy hours of a time-sliced GPU's holders
// are their own activity, so they add up to the GPU's busy hours (0.5 +
// 0.1 of an hour), not to their shares of it (the old n-times undercount).
func TestTimeSlicedBusyAddsUp(t *testing.T) {
	o := showbackFixture()
	o.KSM = true
	sb, err := o.Report(By{Kind: ByOwner}, Prices{Exporters: o.ExporterPrices}, UnallocatedShow)
	if err != nil {
		t.Fatal(err)
	}
	busy := map[string]float64{}
	alloc := map[string]float64{}
	for _, r := range sb.Rows {
		busy[r.Group], alloc[r.Group] = r.BusyHours, r.AllocatedHours
	}
	if got := busy["b/Pod/chat-0"] + busy["b/Pod/chat-1"]; math.Abs(got-0.6) > 1e-9 {
		t.Errorf("the holders' busy hours add up to %v, want the GPU's 0.6", got)
	}
	if busy["b/Pod/chat-0"] <= alloc["b/Pod/chat-0"] {
		t.Errorf("chat-0: busy %v, allocated %v: want busy above its replica's share, shown as it is", busy["b/Pod/chat-0"], alloc["b/Pod/chat-0"])
	}
}

func TestReportShareUnallocated(t *testing.T) {
	o := showbackFixture()
	sb, err := o.Report(By{Kind: ByNamespace}, Prices{Exporters: o.ExporterPrices}, UnallocatedShare)
	if err != nil {
		t.Fatal(err)
	}
	// The H100's unallocated cost (28 $ less the groups' allocated) goes
	// to a and b in proportion to their allocated cost; the T4's hours
	// cannot be shared by cost and stay.
	var allocated, shared float64
	for _, r := range sb.Rows {
		if r.Model == h100Model {
			allocated += *r.AllocatedCost
			shared += *r.SharedCost
		}
	}
	if math.Abs(allocated+shared-28) > 0.02 {
		t.Errorf("allocated %v + shared %v, want the H100 bill 28", allocated, shared)
	}
	a, b := sb.Rows[0], sb.Rows[1]
	if math.Abs(*a.SharedCost / *a.AllocatedCost - *b.SharedCost / *b.AllocatedCost) > 0.01 {
		t.Errorf("shares %v of %v and %v of %v: want in proportion to allocated cost", *a.SharedCost, *a.AllocatedCost, *b.SharedCost, *b.AllocatedCost)
	}
	for _, f := range sb.Free {
		if f.Model == h100Model {
			t.Errorf("unallocated %+v left after sharing", f)
		}
	}
	if !sb.Bill[0].Adds(true) {
		t.Errorf("H100 bill %+v: the shared rows should add up to it", sb.Bill[0])
	}
}

// TestTimeSlicedReplicasWithoutLabels: without the node's replicas, each
// of the two holders is half of the GPU, and nothing is an unheld replica.
func TestTimeSlicedReplicasWithoutLabels(t *testing.T) {
	o := showbackFixture()
	o.nodes = map[string]nodeLabels{}
	sb, err := o.Report(By{Kind: ByNamespace}, Prices{Exporters: o.ExporterPrices}, UnallocatedShow)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := sb.Rows[1].AllocatedHours, roundTo(0.5+1.0/7+1, 3); got != want {
		t.Errorf("b without replicas: %v GPU-hours, want %v (each holder half of the GPU)", got, want)
	}
	for _, f := range sb.Free {
		if f.Reason == ReasonUnheldReplica {
			t.Errorf("unheld replicas %+v without replicas in the node's labels", f)
		}
	}
}

func TestReportGroupingsNeedKubeStateMetrics(t *testing.T) {
	o := showbackFixture()
	for _, by := range []By{{Kind: ByOwner}, {Kind: ByLabel, Label: "team"}} {
		if _, err := o.Report(by, Prices{}, UnallocatedShow); !errors.Is(err, ErrNoKSM) {
			t.Errorf("--by=%s without kube-state-metrics: %v, want ErrNoKSM", by, err)
		}
	}
	o.KSM = true
	if _, err := o.Report(By{Kind: ByLabel, Label: "team"}, Prices{}, UnallocatedShow); err == nil {
		t.Error("--by=label:team where no pod has the label: no error; want one naming the allowlist")
	}
	o.Owners.AddPodLabel("a", "train", "label_team", "ml")
	sb, err := o.Report(By{Kind: ByLabel, Label: "team"}, Prices{}, UnallocatedShow)
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Rows) != 3 || sb.Rows[0].Group != NoLabel || sb.Rows[2].Group != "ml" {
		t.Errorf("groups %+v, want (none) twice (H100, T4) and ml", sb.Rows)
	}
}

func TestCostShare(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    float64
	}{
		{"3g.40gb", 4.0 / 8}, // 3 of 7 compute slices, 4 of 8 memory slices
		{"2g.20gb", 2.0 / 7},
		{"1g.10gb", 1.0 / 7},
		{"1g.20gb", 2.0 / 8},
		{"7g.80gb", 1},
		{"1c.3g.40gb", 4.0 / 8 / 3},
	} {
		if got := CostShare(h100Model, tc.profile); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("CostShare(H100, %s) = %v, want %v", tc.profile, got, tc.want)
		}
	}
}

func sameCost(a, b *float64) bool {
	return a == nil && b == nil || a != nil && b != nil && math.Abs(*a-*b) < 1e-9
}

// TestFullMIGLayoutCostsTheGPU: a 3g.40gb, a 2g.20gb and two 1g.10gb fill
// an H100 (7 compute, 8 memory slices) but cost 15/14 of it by their
// larger fractions: each is scaled by 14/15, so the rows add up to the
// GPU and nothing is left over.
func TestFullMIGLayoutCostsTheGPU(t *testing.T) {
	o := showbackFixture()
	o.Holdings = o.Holdings[1:3] // tune (3g.40gb) and eval (2g.20gb, half the hour)
	o.gpus = map[[2]string]*gpuSteps{{"mig", "GPU-m"}: {Model: h100Model, Steps: 60, MIGSteps: 60}}
	o.devices[DeviceKey{Node: "mig", UUID: "GPU-m", GPUInstance: "3", ComputeInstance: "0"}] = &deviceSteps{Profile: "1g.10gb", Present: 60}
	o.devices[DeviceKey{Node: "mig", UUID: "GPU-m", GPUInstance: "4", ComputeInstance: "0"}] = &deviceSteps{Profile: "1g.10gb", Present: 60}
	for k := range o.devices {
		if k.Node != "mig" {
			delete(o.devices, k)
		}
	}
	sb, err := o.Report(By{Kind: ByNamespace}, Prices{Exporters: o.ExporterPrices}, UnallocatedShow)
	if err != nil {
		t.Fatal(err)
	}
	// b: 3g.40gb 1/2 x 14/15 an hour, 2g.20gb 2/7 x 14/15 half of it.
	if want := roundTo((0.5+1.0/7)*14/15, 3); len(sb.Rows) != 1 || sb.Rows[0].AllocatedHours != want {
		t.Errorf("rows %+v, want b with %v GPU-hours", sb.Rows, want)
	}
	for _, f := range sb.Free {
		if f.Reason == ReasonRemainder {
			t.Errorf("a remainder %+v of a GPU its devices fill", f)
		}
	}
	if b := sb.Bill[0]; b.Hours != 1 || b.RowsHours != 1 || !b.Adds(false) {
		t.Errorf("bill %+v: want 1 GPU-hour and rows adding up to it", b)
	}
}
