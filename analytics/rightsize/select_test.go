package rightsize

import (
	"math"
	"testing"
)

func p(v float64) *float64 { return &v }

const gb = 1e9

// An H100 and what the cluster offers instead of it.
var (
	h100 = Shape{Kind: KindGPU, Accelerator: "nvidia-h100-80gb", Model: "NVIDIA H100 80GB HBM3", Memory: 80 * gb, Compute: 1, PricePerHour: p(7)}
	mig1 = Shape{Kind: KindMIG, Accelerator: "nvidia-h100-80gb", Profile: "1g.10gb", Memory: 10 * gb, Compute: 1.0 / 7, PricePerHour: p(1)}
	mig3 = Shape{Kind: KindMIG, Accelerator: "nvidia-h100-80gb", Profile: "3g.40gb", Memory: 40 * gb, Compute: 3.0 / 7, PricePerHour: p(3)}
	half = Shape{Kind: KindShare, Accelerator: "nvidia-h100-80gb", Replicas: 2, Memory: 40 * gb, Compute: 0.5, PricePerHour: p(3.5)}
	l4   = Shape{Kind: KindGPU, Accelerator: "nvidia-l4", Memory: 24 * gb, Compute: 0.12, PricePerHour: p(0.7)}
)

func unpriced(s Shape) Shape { s.PricePerHour = nil; return s }

func TestChoose(t *testing.T) {
	all := []Shape{mig1, mig3, half, l4}
	for _, tc := range []struct {
		name       string
		current    Shape
		need       Need
		candidates []Shape
		want       string
		devices    int
		saving     *float64 // per pod-hour
	}{
		{"idle the whole window: release, whatever it holds in memory", h100, Need{Memory: 70 * gb, Devices: 1, IdleDevices: 1}, all, RecommendRelease, 0, p(7)},
		{"8 GPUs, 2 idle the whole window: the same accelerator, 6", h100, Need{Memory: 70 * gb, Compute: 1, Devices: 8, IdleDevices: 2}, all, "accelerator:nvidia-h100-80gb", 6, p(14)},
		{"8 GPUs, all busy: keep the count, even if one would fit a MIG", h100, Need{Memory: 5 * gb, Compute: 0.05, Devices: 8}, all, RecommendKeep, 8, p(0)},
		{"8 GPUs, all idle: release", h100, Need{Devices: 8, IdleDevices: 8}, all, RecommendRelease, 0, p(56)},
		{"small: the cheapest that holds it (L4 over 1g.10gb)", h100, Need{Memory: 9 * gb, Compute: 0.1}, all, "accelerator:nvidia-l4", 1, p(6.3)},
		{"compute past the L4 but within 1g: 1g.10gb", h100, Need{Memory: 9 * gb, Compute: 0.13}, all, "mig:1g.10gb", 1, p(6)},
		{"memory past 1g and the L4: 3g.40gb, cheaper than half a GPU", h100, Need{Memory: 30 * gb, Compute: 0.3}, all, "mig:3g.40gb", 1, p(4)},
		{"compute past 3g: half a GPU", h100, Need{Memory: 30 * gb, Compute: 0.45}, all, "share:2", 1, p(3.5)},
		{"exactly a candidate's size fits it", h100, Need{Memory: 40 * gb, Compute: 0.5}, all, "share:2", 1, p(3.5)},
		{"nothing smaller holds it: keep", h100, Need{Memory: 60 * gb, Compute: 0.6}, all, RecommendKeep, 1, p(0)},
		{"a candidate without a price is left out when the current has one", h100, Need{Memory: 9 * gb, Compute: 0.1}, []Shape{unpriced(l4), mig1}, "mig:1g.10gb", 1, p(6)},
		{"a candidate as dear as the current is no saving", h100, Need{Memory: 9 * gb, Compute: 0.1}, []Shape{func() Shape { s := mig1; s.PricePerHour = p(7); return s }()}, RecommendKeep, 1, p(0)},
		{"no prices: the smallest that holds it, saving unknown", unpriced(h100), Need{Memory: 9 * gb, Compute: 0.1}, []Shape{unpriced(mig3), unpriced(l4), unpriced(mig1)}, "accelerator:nvidia-l4", 1, nil},
		{"no prices, only bigger shapes hold it: keep", unpriced(mig1), Need{Memory: 9 * gb, Compute: 0.14}, []Shape{unpriced(mig3), unpriced(half)}, RecommendKeep, 1, nil},
		{"current priced, the recommended one is not: saving unknown for release is still known", h100, Need{Devices: 1, IdleDevices: 1}, nil, RecommendRelease, 0, p(7)},
		{"a MIG device moving down to a smaller profile", mig3, Need{Memory: 8 * gb, Compute: 0.13}, []Shape{mig1, half}, "mig:1g.10gb", 1, p(2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Choose(tc.current, tc.need, tc.candidates)
			if c.Recommendation != tc.want || c.Devices != tc.devices {
				t.Errorf("got %s x%d, want %s x%d", c.Recommendation, c.Devices, tc.want, tc.devices)
			}
			switch {
			case tc.saving == nil && c.SavingPerPodHour != nil:
				t.Errorf("saving %v, want unknown", *c.SavingPerPodHour)
			case tc.saving != nil && c.SavingPerPodHour == nil:
				t.Errorf("saving unknown, want %v", *tc.saving)
			case tc.saving != nil && math.Abs(*c.SavingPerPodHour-*tc.saving) > 1e-9:
				t.Errorf("saving %v a pod-hour, want %v", *c.SavingPerPodHour, *tc.saving)
			}
		})
	}
}

func TestSliceShare(t *testing.T) {
	for _, tc := range []struct {
		model, profile string
		want           float64
	}{
		{"NVIDIA H100 80GB HBM3", "3g.40gb", 3.0 / 7},
		{"NVIDIA H100 80GB HBM3", "1g.20gb", 1.0 / 7},
		{"NVIDIA H100 80GB HBM3", "7g.80gb", 1},
		// A compute instance of a GPU instance: its compute slices of it.
		{"NVIDIA H100 80GB HBM3", "1c.3g.40gb", 1.0 / 7},
		// The A30 has four compute slices.
		{"NVIDIA A30", "2g.12gb", 2.0 / 4},
		// A model the table does not know: seven slices.
		{"NVIDIA Future 1", "2g.30gb", 2.0 / 7},
		{"NVIDIA H100 80GB HBM3", "nonsense", 0},
	} {
		if got := SliceShare(tc.model, tc.profile); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("SliceShare(%q, %q) = %v, want %v", tc.model, tc.profile, got, tc.want)
		}
	}
}

func TestFactsTable(t *testing.T) {
	if len(Facts()) < 5 {
		t.Fatalf("%d accelerators", len(Facts()))
	}
	for _, tc := range []struct {
		names  []string
		tflops float64
	}{
		{[]string{"nvidia-l4"}, 121},
		{[]string{"", "NVIDIA L4"}, 121},
		{[]string{"NVIDIA-H100-80GB-HBM3"}, 989}, // GPU Feature Discovery's product label
		{[]string{"nvidia-h100-mega-80gb"}, 989},
		{[]string{"NVIDIA A100-SXM4-40GB"}, 312},
	} {
		f, ok := LookupFacts(tc.names...)
		if !ok || f.TFLOPS != tc.tflops {
			t.Errorf("LookupFacts(%q) = %v, %v; want %v TFLOPS", tc.names, f.TFLOPS, ok, tc.tflops)
		}
	}
	if _, ok := LookupFacts("nvidia-l40s", "NVIDIA L40S"); ok {
		t.Error("the L40S is not in the table, but LookupFacts found it (a name matched a prefix?)")
	}
}
