package rightsize

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// RecommendOptions are recommend's settings.
type RecommendOptions struct {
	Headroom      float64 // 0.2: the shape must hold 120% of the peak and the p95
	IdleThreshold float64 // activity under which a device counts as idle
	Prices        Prices
}

// A holding there from the window's start to its end must be recorded at
// all of its steps but 1% (and ten steps): more missing means gaps in the
// data (an exporter, its pod map or Prometheus away for longer than the
// lookback).
const (
	minCoverage     = 0.99
	gapStepsAllowed = 10
)

// InsufficientData is the recommendation of a workload whose data cannot
// carry one.
const InsufficientData = "insufficient data"

// Row is one workload's recommendation.
type Row struct {
	Namespace string `json:"namespace"`
	// Workload is Kind/Name.
	Workload    string `json:"workload"`
	Kind        string `json:"kind"`
	Name        string `json:"name"`
	Pods        int    `json:"pods"`
	Accelerator string `json:"accelerator"`
	Model       string `json:"model"`
	// Holds is the device shape each pod holds now, as Shape.Describe.
	Holds string `json:"holds"`
	// Devices is how many each pod holds.
	Devices int `json:"devices"`
	// What it used, per device, over the window (the most of any device
	// of any of its pods): peak VRAM, p95 activity (of the device it
	// holds), and the share of its device-time the exporter judged idle.
	PeakMemoryBytes *float64 `json:"peak_memory_bytes"`
	P95Activity     *float64 `json:"p95_activity"`
	IdleShare       *float64 `json:"idle_share"`
	// IdleDevices are the devices per pod idle the whole window.
	IdleDevices        int    `json:"idle_devices"`
	Recommendation     string `json:"recommendation"`
	RecommendedDevices int    `json:"recommended_devices"`
	// MonthlySaving is in US dollars at the configured prices; nil where a
	// price is missing.
	MonthlySaving *float64 `json:"monthly_saving_dollars"`
	// Reason says why the data is insufficient.
	Reason string `json:"reason,omitempty"`
}

// workloadHoldings are one workload's holdings in the window.
type workloadHoldings struct {
	Workload
	all, current []*Holding
}

// byWorkload groups the holdings; without kube-state-metrics each pod is
// its own workload.
func (o *Observation) byWorkload() []*workloadHoldings {
	m := map[Workload]*workloadHoldings{}
	var order []Workload
	for _, h := range o.Holdings {
		w := Workload{h.Namespace, "Pod", h.Pod}
		if o.KSM {
			w = o.Owners.Resolve(h.Namespace, h.Pod)
		}
		wh := m[w]
		if wh == nil {
			wh = &workloadHoldings{Workload: w}
			m[w] = wh
			order = append(order, w)
		}
		wh.all = append(wh.all, h)
		if h.Current {
			wh.current = append(wh.current, h)
		}
	}
	out := make([]*workloadHoldings, 0, len(order))
	for _, w := range order {
		out = append(out, m[w])
	}
	return out
}

// Recommend gives every workload that holds a device at the window's end
// a recommendation.
func (o *Observation) Recommend(opt RecommendOptions) []Row {
	sharedWith := map[DeviceKey]int{}
	for _, h := range o.Holdings {
		if h.Current {
			sharedWith[h.DeviceKey]++
		}
	}
	var rows []Row
	for _, wh := range o.byWorkload() {
		if len(wh.current) == 0 {
			continue // gone before the window's end: nothing to resize
		}
		rows = append(rows, o.recommendOne(wh, sharedWith, opt))
	}
	sort.SliceStable(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if (a.Recommendation == InsufficientData) != (b.Recommendation == InsufficientData) {
			return b.Recommendation == InsufficientData
		}
		as, bs := saving(a), saving(b)
		if as != bs {
			return as > bs
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Workload < b.Workload
	})
	return rows
}

func saving(r Row) float64 {
	if r.MonthlySaving == nil {
		return -1
	}
	return *r.MonthlySaving
}

func (o *Observation) recommendOne(wh *workloadHoldings, sharedWith map[DeviceKey]int, opt RecommendOptions) Row {
	first := wh.current[0]
	current := o.CurrentShape(first, sharedWith[first.DeviceKey], opt.Prices)
	devicesOf := map[string]map[DeviceKey]*Holding{}
	for _, h := range wh.current {
		if devicesOf[h.Pod] == nil {
			devicesOf[h.Pod] = map[DeviceKey]*Holding{}
		}
		devicesOf[h.Pod][h.DeviceKey] = h
	}
	devices, idle := 0, -1
	for _, devs := range devicesOf {
		devices = max(devices, len(devs))
		n := 0
		for _, h := range devs {
			if h.MaxActivity != nil && *h.MaxActivity < opt.IdleThreshold {
				n++
			}
		}
		if idle < 0 || n < idle {
			idle = n // a device counts idle when it is in every pod
		}
	}
	r := Row{
		Namespace:   wh.Namespace,
		Workload:    wh.String(),
		Kind:        wh.Kind,
		Name:        wh.Name,
		Pods:        len(devicesOf),
		Accelerator: current.Accelerator,
		Model:       current.Model,
		Holds:       current.Describe(),
		Devices:     devices,
		IdleDevices: idle,
	}
	var peak, p95 *float64
	var share, idleShare float64
	for _, h := range wh.all {
		peak = maxOf(peak, h.PeakMemory)
		p95 = maxOf(p95, h.P95Activity)
		share += h.Share
		idleShare += h.Idle
	}
	r.PeakMemoryBytes, r.P95Activity = roundedPtr(peak, 0), roundedPtr(p95, 4)
	if share > 0 {
		v := roundTo(idleShare/share, 4)
		r.IdleShare = &v
	}
	if reason := o.insufficient(wh); reason != "" {
		r.Recommendation, r.Reason = InsufficientData, reason
		return r
	}
	need := Need{
		Memory:      *peak * (1 + opt.Headroom),
		Compute:     *p95 * ActivityScale(current) * (1 + opt.Headroom),
		Devices:     devices,
		IdleDevices: idle,
	}
	c := Choose(current, need, o.Candidates(current, opt.Prices))
	r.Recommendation, r.RecommendedDevices = c.Recommendation, c.Devices
	if c.SavingPerPodHour != nil {
		v := roundTo(*c.SavingPerPodHour*HoursPerMonth*float64(r.Pods), 2)
		r.MonthlySaving = &v
	}
	return r
}

func maxOf(a, b *float64) *float64 {
	if b == nil || a != nil && *a >= *b {
		return a
	}
	return b
}

// insufficient says why a workload's data cannot carry a recommendation,
// or "": none of its pods held a device at the window's start (it is
// younger than the window), a holding there from start to end was not
// recorded all along (gaps), or a device it holds has no activity or memory recorded.
func (o *Observation) insufficient(wh *workloadHoldings) string {
	w := o.Window
	steps := w.Length.Seconds() / w.Step.Seconds()
	old, longest := false, 0.0
	for _, h := range wh.all {
		old = old || h.AtStart
		longest = max(longest, h.Steps)
	}
	if !old {
		age := time.Duration(longest * float64(w.Step))
		if age >= time.Hour {
			age = age.Round(time.Hour)
		} else {
			age = age.Round(time.Minute)
		}
		return fmt.Sprintf("younger than the window: first seen %s before its end", promDuration(age))
	}
	for _, h := range wh.all {
		if h.AtStart && h.Current && h.Steps < min(minCoverage*steps, steps-gapStepsAllowed) {
			return fmt.Sprintf("gaps in the data: %s/%s on %s recorded %.0f%% of the window", h.Namespace, h.Pod, h.Node, 100*h.Steps/steps)
		}
	}
	for _, h := range wh.current {
		if h.P95Activity == nil {
			return fmt.Sprintf("no activity recorded for %s/%s on %s GPU %s %s (a MIG device without DCGM has none)", h.Namespace, h.Pod, h.Node, h.GPU, h.MIGProfile)
		}
		if h.PeakMemory == nil {
			return fmt.Sprintf("no memory recorded for %s/%s on %s GPU %s (a shared GPU without per-process accounting has none)", h.Namespace, h.Pod, h.Node, h.GPU)
		}
	}
	return ""
}

func roundTo(v float64, decimals int) float64 {
	p := math.Pow(10, float64(decimals))
	return math.Round(v*p) / p
}

// roundedPtr is a copy of *v rounded, or nil.
func roundedPtr(v *float64, decimals int) *float64 {
	if v == nil {
		return nil
	}
	r := roundTo(*v, decimals)
	return &r
}
