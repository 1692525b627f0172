package rightsize

import (
	"fmt"
	"sort"
	"strconv"
)

// Kinds of shape.
const (
	KindGPU   = "gpu"   // a whole GPU of an accelerator
	KindMIG   = "mig"   // a MIG instance of a profile
	KindShare = "share" // one of n time-sliced replicas of a GPU
)

// HoursPerMonth is the month savings are quoted for (365 x 24 / 12, the
// month cloud price lists use).
const HoursPerMonth = 730

// Shape is one device of a workload's pod as it holds it now, or as it
// could hold it instead.
type Shape struct {
	Kind        string
	Accelerator string // the accelerator's name (GKE's label, else the model)
	Model       string // NVML model name of the GPU
	Profile     string // KindMIG: the MIG profile
	Replicas    int    // KindShare: replicas of the GPU
	// Memory is the device's framebuffer in bytes (a MIG instance its
	// own; a share its part of the GPU's, total over replicas).
	Memory float64
	// Compute is the device's compute in whole GPUs of the workload's
	// current model: 1 for that GPU, a MIG profile's compute slices over
	// the GPU's, 1/n for a share, another accelerator's throughput over
	// the current one's.
	Compute float64
	// PricePerHour is what the device costs an hour (a MIG device its
	// cost share of the GPU's price); nil where no price is known.
	PricePerHour *float64
	// Pool is the node pool that serves the shape, or NewPoolPrefix and
	// the labels of the pool to create (NewPool).
	Pool    string
	NewPool bool
}

// Name is the shape as the recommendation column names it.
func (s Shape) Name() string {
	switch s.Kind {
	case KindMIG:
		return "mig:" + s.Profile
	case KindShare:
		return "share:" + strconv.Itoa(s.Replicas)
	}
	return "accelerator:" + s.Accelerator
}

// Describe is the shape for people: "nvidia-h100-80gb", "nvidia-h100-80gb
// mig 3g.40gb", "nvidia-h100-80gb share 1/4".
func (s Shape) Describe() string {
	switch s.Kind {
	case KindMIG:
		return s.Accelerator + " mig " + s.Profile
	case KindShare:
		return fmt.Sprintf("%s share 1/%d", s.Accelerator, s.Replicas)
	}
	return s.Accelerator
}

// Need is what a workload used, per device of one pod, with headroom
// applied, and how many of its devices sat idle the whole window.
type Need struct {
	Memory      float64 // bytes: peak x (1 + headroom)
	Compute     float64 // whole GPUs of the current model: p95 x (1 + headroom)
	Devices     int     // devices each pod holds
	IdleDevices int     // of those, idle the whole window (in every pod)
}

// Recommendations other than a shape's Name.
const (
	RecommendKeep    = "keep"
	RecommendRelease = "release"
)

// InsufficientData is the recommendation of a workload whose data cannot
// carry one.
const InsufficientData = "insufficient data"

// Choice is the recommendation for a workload.
type Choice struct {
	Recommendation string
	Devices        int    // devices per pod recommended (0 to release)
	Shape          *Shape // the recommended shape; nil for keep and release
	// SavingPerPodHour is what each pod saves an hour; nil where the
	// current or the recommended shape has no price.
	SavingPerPodHour *float64
}

func (s Shape) fits(n Need) bool { return s.Memory >= n.Memory && s.Compute >= n.Compute }

// smaller orders shapes without prices: less compute, then less memory.
func smaller(a, b Shape) bool {
	if a.Compute != b.Compute {
		return a.Compute < b.Compute
	}
	return a.Memory < b.Memory
}

// Choose picks the recommendation for a workload holding current (per
// device) with need, among candidates:
//   - every device idle the whole window: release;
//   - several devices per pod: the same shape, with the idle ones given
//     back if any sat idle the whole window (a job spread over GPUs keeps
//     its count otherwise);
//   - one device: the cheapest candidate whose memory and compute hold the
//     need and that costs less than the current shape; without prices,
//     the smallest (compute, then memory) smaller than the current one;
//     none: keep.
//
// Candidates with no price are left out when the current shape has one
// (their saving is unknown).
func Choose(current Shape, need Need, candidates []Shape) Choice {
	if need.Devices < 1 {
		need.Devices = 1
	}
	perPod := func(devices int, s *Shape) *float64 {
		if current.PricePerHour == nil {
			return nil
		}
		after := 0.0
		if s != nil {
			if s.PricePerHour == nil {
				return nil
			}
			after = float64(devices) * *s.PricePerHour
		}
		v := float64(need.Devices)**current.PricePerHour - after
		return &v
	}
	if need.IdleDevices >= need.Devices {
		return Choice{Recommendation: RecommendRelease, SavingPerPodHour: perPod(0, nil)}
	}
	if need.Devices > 1 {
		if need.IdleDevices == 0 {
			zero := 0.0
			if current.PricePerHour == nil {
				return Choice{Recommendation: RecommendKeep, Devices: need.Devices}
			}
			return Choice{Recommendation: RecommendKeep, Devices: need.Devices, SavingPerPodHour: &zero}
		}
		n := need.Devices - need.IdleDevices
		s := current
		return Choice{Recommendation: s.Name(), Devices: n, Shape: &s, SavingPerPodHour: perPod(n, &s)}
	}
	var fitting []Shape
	for _, c := range candidates {
		if !c.fits(need) {
			continue
		}
		if current.PricePerHour != nil {
			if c.PricePerHour == nil || *c.PricePerHour >= *current.PricePerHour {
				continue
			}
		} else if !smaller(c, current) {
			continue
		}
		fitting = append(fitting, c)
	}
	if len(fitting) == 0 {
		zero := 0.0
		if current.PricePerHour == nil {
			return Choice{Recommendation: RecommendKeep, Devices: 1}
		}
		return Choice{Recommendation: RecommendKeep, Devices: 1, SavingPerPodHour: &zero}
	}
	sort.SliceStable(fitting, func(i, j int) bool {
		a, b := fitting[i], fitting[j]
		if current.PricePerHour != nil && *a.PricePerHour != *b.PricePerHour {
			return *a.PricePerHour < *b.PricePerHour
		}
		if a.Compute != b.Compute || a.Memory != b.Memory {
			return smaller(a, b)
		}
		return a.Name() < b.Name()
	})
	best := fitting[0]
	return Choice{Recommendation: best.Name(), Devices: 1, Shape: &best, SavingPerPodHour: perPod(1, &best)}
}
