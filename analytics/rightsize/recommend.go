package rightsize

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// RecommendOptions are recommend's settings.
type RecommendOptions struct {
	Headroom      float64 // 0.2: the shape must hold 120% of the peak and the percentile
	IdleThreshold float64 // activity under which a device counts as idle
	Prices        Prices
	// MinCoverage is the coverage of the window under which a workload's
	// data carry no recommendation (DefaultMinCoverage).
	MinCoverage float64
	// AllowNewPools also proposes shapes no pool of the cluster serves,
	// naming the pool to create.
	AllowNewPools bool
}

// DefaultMinCoverage is 0.8: a week's recommendation needs the workload's data
// over 80% of it (5.6 days). A daily job first seen within a day of the
// window's start covers at least 6/7 of a week.
const DefaultMinCoverage = 0.8

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
	// Holds is the device shape each pod holds now (or last held, for a
	// workload gone before the window's end), as Shape.Describe.
	Holds string `json:"holds"`
	// Devices is how many each pod holds.
	Devices int `json:"devices"`
	// What it used, per device, over the window (the most of any device
	// of any of its pods): peak VRAM, the percentile of its activity (of
	// the device it holds; over devices of other models or shapes, in
	// its current device's units), and the share of its device-time the
	// exporter judged idle.
	PeakMemoryBytes *float64 `json:"peak_memory_bytes"`
	P95Activity     *float64 `json:"p95_activity"`
	IdleShare       *float64 `json:"idle_share"`
	// IdleDevices are the devices per pod idle the whole window.
	IdleDevices        int    `json:"idle_devices"`
	Recommendation     string `json:"recommendation"`
	RecommendedDevices int    `json:"recommended_devices"`
	// MonthlySaving is in US dollars at the configured prices, for a
	// month at the rate the workload held devices in the window; nil
	// where a price is missing.
	MonthlySaving *float64 `json:"monthly_saving_dollars"`
	// Reason says why the data is insufficient.
	Reason string `json:"reason,omitempty"`
	// Samples are the per-minute samples of its devices the figures come
	// from; Coverage the part of the window they cover (from its first
	// step to the window's end, less its longest gap); FirstSeen and
	// LastSeen its first and last step.
	Samples   int       `json:"samples"`
	Coverage  float64   `json:"coverage"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Pool is the node pool that serves the recommendation, or
	// NewPoolPrefix and the labels of the pool to create.
	Pool string `json:"pool"`

	change         *podChange
	percentileName string // "p95": the table's name of P95Activity
}

// sharedWith counts the holders of each device among holdings.
func sharedWith(hs []*Holding) map[DeviceKey]int {
	out := map[DeviceKey]int{}
	for _, h := range hs {
		out[h.DeviceKey]++
	}
	return out
}

// Recommend gives every workload that held a device in the window a
// recommendation; one gone by the window's end is judged on the shape it
// held last.
func (o *Observation) Recommend(opt RecommendOptions) []Row {
	if opt.MinCoverage == 0 {
		opt.MinCoverage = DefaultMinCoverage
	}
	var currentAll []*Holding
	for _, h := range o.Holdings {
		if h.Current {
			currentAll = append(currentAll, h)
		}
	}
	holders := sharedWith(currentAll)
	var rows []Row
	for _, wh := range o.byWorkload() {
		shared := holders
		if !wh.current[0].Current {
			shared = sharedWith(wh.current)
		}
		rows = append(rows, o.recommendOne(wh, shared, opt))
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
		if a.Workload != b.Workload {
			return a.Workload < b.Workload
		}
		return a.Model < b.Model
	})
	return rows
}

func saving(r Row) float64 {
	if r.MonthlySaving == nil {
		return -1
	}
	return *r.MonthlySaving
}

// windowSteps is the number of steps in the window, and lastStep the
// time of its last: the query steps are multiples of the step since the
// Unix epoch, the last at or before its end.
func (w Window) windowSteps() float64 { return math.Round(w.Length.Seconds() / w.Step.Seconds()) }

func (w Window) lastStep() time.Time {
	step := w.Step.Milliseconds()
	return time.UnixMilli(w.End.UnixMilli() / step * step).UTC()
}

// confidence is a row's samples, coverage and first and last step, and
// the longest gap of any of its devices (in steps) and where it was.
type confidence struct {
	samples     float64
	coverage    float64
	first, last time.Time
	gap         float64
	gapAt       *Holding
}

func (o *Observation) confidenceOf(hs []*Holding) confidence {
	var c confidence
	for _, h := range hs {
		c.samples += h.Steps
		if c.first.IsZero() || h.First.Before(c.first) {
			c.first = h.First
		}
		if h.Last.After(c.last) {
			c.last = h.Last
		}
		if g := h.GapSteps(o.Window.Step); g > c.gap {
			c.gap, c.gapAt = g, h
		}
	}
	w := o.Window
	fromFirst := math.Round(float64(w.lastStep().Sub(c.first))/float64(w.Step)) + 1
	c.coverage = min(1, max(0, (fromFirst-c.gap)/w.windowSteps()))
	return c
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
	c := o.confidenceOf(wh.all)
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
		Samples:     int(c.samples),
		Coverage:    roundTo(c.coverage, 4),
		FirstSeen:   c.first,
		LastSeen:    c.last,
	}
	// Activity in whole GPUs of the current model: converted where the
	// row's devices differ in model or shape.
	var peak, used *float64
	var share, idleShare float64
	for _, h := range wh.all {
		peak = maxOf(peak, h.PeakMemory)
		if h.P95Activity != nil {
			if f, ok := o.activityFactor(h, current); ok {
				used = maxOf(used, ptr(*h.P95Activity*f))
			}
		}
		share += h.Share
		idleShare += h.Idle
	}
	if v, ok := o.converted[wh.rowKey]; ok {
		used = &v
	}
	scale := ActivityScale(current)
	if used != nil && scale > 0 {
		r.P95Activity = roundedPtr(ptr(*used/scale), 4)
	}
	r.PeakMemoryBytes = roundedPtr(peak, 0)
	if share > 0 {
		v := roundTo(idleShare/share, 4)
		r.IdleShare = &v
	}
	if reason := o.insufficient(wh, c, opt.MinCoverage); reason != "" {
		r.Recommendation, r.Reason = InsufficientData, reason
		return r
	}
	need := Need{
		Memory:      *peak * (1 + opt.Headroom),
		Compute:     *used * (1 + opt.Headroom),
		Devices:     devices,
		IdleDevices: idle,
	}
	choice := Choose(current, need, o.Candidates(current, opt.Prices, opt.AllowNewPools))
	r.Recommendation, r.RecommendedDevices = choice.Recommendation, choice.Devices
	here := o.poolOf(first.Node)
	switch {
	case choice.Shape != nil && choice.Shape.Pool != "":
		r.Pool = choice.Shape.Pool
	case choice.Recommendation != RecommendRelease && here != nil:
		r.Pool = here.name
	}
	if choice.SavingPerPodHour != nil {
		// A month at the rate its pods held devices in the window: the
		// pods holding all along, a nightly job's hours a night.
		podSteps := 0.0
		spans := map[string]float64{}
		for _, h := range wh.all {
			spans[h.Pod] = max(spans[h.Pod], h.Span(o.Window.Step))
		}
		for _, s := range spans {
			podSteps += s
		}
		v := roundTo(*choice.SavingPerPodHour*HoursPerMonth*podSteps/o.Window.windowSteps(), 2)
		r.MonthlySaving = &v
	}
	r.change = o.changeFor(wh, current, choice)
	return r
}

func maxOf(a, b *float64) *float64 {
	if b == nil || a != nil && *a >= *b {
		return a
	}
	return b
}

// insufficient says why a workload's data cannot carry a recommendation,
// or "": its data cover less of the window than minCoverage (it is
// younger than the window, or its data have gaps), or a device it holds
// has no activity or memory recorded.
func (o *Observation) insufficient(wh *workloadHoldings, c confidence, minCoverage float64) string {
	if c.coverage < minCoverage {
		why := fmt.Sprintf("first seen %s before its end", promDuration(roundAge(o.Window.End.Sub(c.first))))
		if c.gap > 0 && c.gapAt != nil {
			why += fmt.Sprintf(", a gap of %s in %s/%s on %s", promDuration(roundAge(time.Duration(c.gap*float64(o.Window.Step)))), c.gapAt.Namespace, c.gapAt.Pod, c.gapAt.Node)
		}
		return fmt.Sprintf("coverage %.0f%% of the window (%s) is under --min-coverage=%g", 100*c.coverage, why, minCoverage)
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

// roundAge rounds a duration for people: to the hour from an hour, else
// to the minute.
func roundAge(d time.Duration) time.Duration {
	if d >= time.Hour {
		return d.Round(time.Hour)
	}
	return d.Round(time.Minute)
}
