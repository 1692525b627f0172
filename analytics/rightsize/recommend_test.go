package rightsize

import (
	"math"
	"strings"
	"testing"
	"time"
)

// A week at one-minute steps: an H100 pool split into 3g.40gb MIG devices
// (GKE's partition size), a whole-H100 pool, an L4 pool, and a node of an
// accelerator the table does not know.
func recommendFixture() *Observation {
	end := time.Date(2026, 11, 30, 0, 0, 30, 0, time.UTC)
	o := &Observation{
		Window:       Window{End: end, Length: week, Step: time.Minute},
		Owners:       NewOwners(),
		KSM:          true,
		Quantile:     0.95,
		gpuModel:     map[[2]string]string{},
		nodeModel:    map[string]string{"h100": h100Model, "mig": h100Model, "l4": "NVIDIA L4", "odd": "NVIDIA Odd 1"},
		nodeAccel:    map[string]string{"h100": "nvidia-h100-80gb", "mig": "nvidia-h100-80gb", "l4": "nvidia-l4", "odd": "nvidia-odd-1"},
		memory:       map[DeviceKey]float64{},
		migSizes:     map[string]map[string]float64{},
		modelMem:     map[string]float64{h100Model: 80 * gib, "NVIDIA L4": 22.5 * gib, "NVIDIA Odd 1": 48 * gib},
		nodeProfiles: map[string]map[string]bool{"mig": {"3g.40gb": true}},
		converted:    map[rowKey]float64{},
		nodes: map[string]nodeLabels{
			"h100": {pool: "h100", poolLabel: "cloud.google.com/gke-nodepool", gke: true, accelerator: "nvidia-h100-80gb", capacity: 8},
			"mig":  {pool: "h100-mig", poolLabel: "cloud.google.com/gke-nodepool", gke: true, accelerator: "nvidia-h100-80gb", partitionSize: "3g.40gb"},
			"l4":   {pool: "l4", poolLabel: "cloud.google.com/gke-nodepool", gke: true, accelerator: "nvidia-l4", capacity: 2},
			"odd":  {pool: "odd", poolLabel: "cloud.google.com/gke-nodepool", gke: true, accelerator: "nvidia-odd-1", capacity: 1},
		},
		ExporterPrices: map[string]float64{h100Model: 10, "NVIDIA L4": 1, "NVIDIA Odd 1": 2},
	}
	first, last := o.Window.End.Add(-week).Truncate(time.Minute).Add(time.Minute), o.Window.lastStep()
	steps := math.Round(last.Sub(first).Minutes()) + 1
	held := func(node, uuid, ns, pod string, activity, memory float64) *Holding {
		return &Holding{DeviceKey: DeviceKey{Node: node, UUID: uuid}, Namespace: ns, Pod: pod, Container: "main", Resource: "nvidia.com/gpu",
			Steps: steps, Share: steps, Current: true, First: first, Last: last,
			P95Activity: ptr(activity), MaxActivity: ptr(activity), PeakMemory: ptr(memory)}
	}
	// small: 0.05 of an H100 and 5 GiB: the L4 (0.12) is cheapest.
	small := held("h100", "GPU-0", "a", "small", 0.05, 5*gib)
	// mid: 0.3 and 25 GiB: 2g.20gb would cost less than 3g.40gb, but no
	// pool serves it.
	mid := held("h100", "GPU-1", "a", "mid", 0.3, 25*gib)
	mid.P95Activity, mid.PeakMemory = ptr(0.2), ptr(15*gib)
	// moved: half the week on the odd accelerator, then an H100.
	movedOld := held("odd", "GPU-o", "b", "moved-old", 0.9, 10*gib)
	movedOld.Current, movedOld.Last, movedOld.Steps = false, first.Add(week/2), steps/2
	movedNew := held("h100", "GPU-2", "b", "moved-new", 0.3, 10*gib)
	movedNew.First, movedNew.Steps = first.Add(week/2+time.Minute), steps/2
	// nightly: a job that ran an hour a night and is gone.
	var nightly []*Holding
	for k := 0; k < 7; k++ {
		h := held("h100", "GPU-3", "c", "nightly-"+string(rune('0'+k)), 0.1, 8*gib)
		h.Current, h.First = false, first.Add(time.Duration(k)*24*time.Hour+time.Hour)
		h.Last, h.Steps = h.First.Add(59*time.Minute), 60
		nightly = append(nightly, h)
		o.Owners.AddPod("c", h.Pod, "Job", "nightly-job-"+string(rune('0'+k)))
		o.Owners.AddJob("c", "nightly-job-"+string(rune('0'+k)), "CronJob", "nightly")
	}
	o.Holdings = append([]*Holding{small, mid, movedOld, movedNew}, nightly...)
	o.Owners.AddPod("b", "moved-old", "ReplicaSet", "moved-1")
	o.Owners.AddPod("b", "moved-new", "ReplicaSet", "moved-2")
	o.Owners.AddReplicaSet("b", "moved-1", "Deployment", "moved")
	o.Owners.AddReplicaSet("b", "moved-2", "Deployment", "moved")
	return o
}

const week = 7 * 24 * time.Hour

func rowsByName(rows []Row) map[string]Row {
	out := map[string]Row{}
	for _, r := range rows {
		out[r.Namespace+"/"+r.Workload+"@"+r.Model] = r
	}
	return out
}

func TestRecommendOnlyServedShapes(t *testing.T) {
	o := recommendFixture()
	rows := rowsByName(o.Recommend(RecommendOptions{Headroom: 0.2, IdleThreshold: 0.05, Prices: Prices{Exporters: o.ExporterPrices}}))
	if r := rows["a/Pod/small@"+h100Model]; r.Recommendation != "accelerator:nvidia-l4" || r.Pool != "l4" {
		t.Errorf("small: %s on %q, want accelerator:nvidia-l4 on l4", r.Recommendation, r.Pool)
	}
	// mid needs 0.24 and 18 GiB: 2g.20gb (no pool) or 3g.40gb (h100-mig).
	if r := rows["a/Pod/mid@"+h100Model]; r.Recommendation != "mig:3g.40gb" || r.Pool != "h100-mig" {
		t.Errorf("mid: %s on %q, want mig:3g.40gb, the profile h100-mig serves", r.Recommendation, r.Pool)
	}
	rows = rowsByName(o.Recommend(RecommendOptions{Headroom: 0.2, IdleThreshold: 0.05, Prices: Prices{Exporters: o.ExporterPrices}, AllowNewPools: true}))
	r := rows["a/Pod/mid@"+h100Model]
	if !strings.HasPrefix(r.Recommendation, "share:") && r.Recommendation != "mig:2g.20gb" || !strings.HasPrefix(r.Pool, NewPoolPrefix+"cloud.google.com/gke-accelerator=nvidia-h100-80gb, ") {
		t.Errorf("mid with new pools: %s on %q, want a cheaper shape on a GKE pool to create", r.Recommendation, r.Pool)
	}
	for _, r := range rows {
		if r.Pool != "" && !strings.HasPrefix(r.Pool, NewPoolPrefix) && o.poolByName(r.Pool) == nil {
			t.Errorf("%s: pool %q is neither the cluster's nor a new one", r.Workload, r.Pool)
		}
	}
}

func (o *Observation) poolByName(name string) *nodePool {
	for _, p := range o.pools() {
		if p.name == name {
			return p
		}
	}
	return nil
}

// TestRecommendAcrossModelsAndTime: a workload that moved to an
// accelerator the table cannot convert gets a row per model; a CronJob
// gone at the window's end gets one row, judged on its last shape, with
// its samples, coverage and first and last seen.
func TestRecommendAcrossModelsAndTime(t *testing.T) {
	o := recommendFixture()
	rows := rowsByName(o.Recommend(RecommendOptions{Headroom: 0.2, IdleThreshold: 0.05, Prices: Prices{Exporters: o.ExporterPrices}}))
	odd, h := rows["b/Deployment/moved@NVIDIA Odd 1"], rows["b/Deployment/moved@"+h100Model]
	if odd.Workload == "" || h.Workload == "" || odd.P95Activity == nil || *odd.P95Activity != 0.9 || *h.P95Activity != 0.3 {
		t.Errorf("moved across an unknown accelerator: rows %+v and %+v; want one per model, each in its own units", odd, h)
	}
	n, ok := rows["c/CronJob/nightly@"+h100Model]
	if !ok {
		t.Fatalf("no row for the CronJob gone at the window's end: %v", rows)
	}
	if n.Samples != 7*60 || n.Pods != 1 || n.Holds != "nvidia-h100-80gb" || n.FirstSeen.IsZero() || !n.LastSeen.Before(o.Window.End.Add(-20*time.Hour)) {
		t.Errorf("nightly: %d samples, %d pods, holds %q, seen %s to %s; want 420 samples of its last pod's shape", n.Samples, n.Pods, n.Holds, n.FirstSeen, n.LastSeen)
	}
	// From an hour after the window's first step to its end: 1 - 60/10080.
	if want := roundTo(1-60.0/10080, 4); n.Coverage != want || n.Recommendation == InsufficientData {
		t.Errorf("nightly: coverage %v (%s), want %v and a recommendation", n.Coverage, n.Reason, want)
	}
	// A month at its rate: an hour a night of (10 - 1) $/h.
	if n.MonthlySaving == nil || math.Abs(*n.MonthlySaving-roundTo(9*730*420/10080.0, 2)) > 0.011 {
		t.Errorf("nightly: saving %v, want a month of an hour a night", n.MonthlySaving)
	}
	// A higher bar leaves it short, with the figure.
	rows = rowsByName(o.Recommend(RecommendOptions{Headroom: 0.2, IdleThreshold: 0.05, Prices: Prices{Exporters: o.ExporterPrices}, MinCoverage: 0.999}))
	if n := rows["c/CronJob/nightly@"+h100Model]; n.Recommendation != InsufficientData || !strings.Contains(n.Reason, "coverage 99% of the window") {
		t.Errorf("nightly at --min-coverage=0.999: %s (%s), want insufficient data with its coverage", n.Recommendation, n.Reason)
	}
}

// TestConvertedActivity: a workload's devices of two models the table
// knows are one row in the current model's units.
func TestConvertedActivity(t *testing.T) {
	o := recommendFixture()
	o.nodeModel["odd"], o.nodeAccel["odd"] = "NVIDIA L4", "nvidia-l4"
	rows := o.Recommend(RecommendOptions{Headroom: 0.2, IdleThreshold: 0.05, Prices: Prices{Exporters: o.ExporterPrices}})
	var found bool
	for _, r := range rows {
		if r.Workload == "Deployment/moved" {
			found = true
			// The L4's 0.9 is 0.9 x 121/989 = 0.11 of an H100: the H100's 0.3 is the most.
			if r.Model != h100Model || r.P95Activity == nil || *r.P95Activity != 0.3 {
				t.Errorf("moved: model %s, activity %v; want the H100's 0.3", r.Model, r.P95Activity)
			}
		}
	}
	if !found {
		t.Error("no row for moved")
	}
}
