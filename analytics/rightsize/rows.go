package rightsize

import (
	"sort"
	"time"
)

// workloadHoldings are one row's holdings in the window, and those it
// holds at the end (or, for a workload gone by then, its last ones).
type workloadHoldings struct {
	rowKey
	all, current []*Holding
}

// byWorkload groups the holdings; without kube-state-metrics each pod is
// its own workload. A workload that held devices of models the
// accelerator table cannot convert into one another is a row per model.
func (o *Observation) byWorkload() []*workloadHoldings {
	m := map[Workload][]*Holding{}
	var order []Workload
	for _, h := range o.Holdings {
		w := Workload{h.Namespace, "Pod", h.Pod}
		if o.KSM {
			w = o.Owners.Resolve(h.Namespace, h.Pod)
		}
		if _, ok := m[w]; !ok {
			order = append(order, w)
		}
		m[w] = append(m[w], h)
	}
	var out []*workloadHoldings
	for _, w := range order {
		hs := m[w]
		models, convertible := map[string]bool{}, true
		for _, h := range hs {
			model := o.ModelOf(h.DeviceKey)
			models[model] = true
			if _, ok := LookupFacts(o.AcceleratorOf(h.Node, model), model); !ok {
				convertible = false
			}
		}
		if len(models) < 2 || convertible {
			out = append(out, o.withCurrent(rowKey{Workload: w}, hs))
			continue
		}
		byModel := map[string][]*Holding{}
		var names []string
		for _, h := range hs {
			model := o.ModelOf(h.DeviceKey)
			if byModel[model] == nil {
				names = append(names, model)
			}
			byModel[model] = append(byModel[model], h)
		}
		sort.Strings(names)
		for _, model := range names {
			out = append(out, o.withCurrent(rowKey{Workload: w, Model: model}, byModel[model]))
		}
	}
	return out
}

// withCurrent sets a row's current holdings: those held at the window's
// end, else those held at its last step (a finished Job's last pods).
func (o *Observation) withCurrent(k rowKey, hs []*Holding) *workloadHoldings {
	wh := &workloadHoldings{rowKey: k, all: hs}
	var last time.Time
	for _, h := range hs {
		if h.Current {
			wh.current = append(wh.current, h)
		}
		if h.Last.After(last) {
			last = h.Last
		}
	}
	if len(wh.current) == 0 {
		for _, h := range hs {
			if !h.Last.Before(last.Add(-o.Window.Step)) {
				wh.current = append(wh.current, h)
			}
		}
	}
	if len(wh.current) == 0 {
		wh.current = hs
	}
	return wh
}

// activityFactor converts a holding's activity into whole GPUs of a row's
// reference (current) model: a MIG device's by its compute slices,
// another model's by its throughput over the reference's (the accelerator
// table); ok is false where the table cannot convert it.
func (o *Observation) activityFactor(h *Holding, ref Shape) (float64, bool) {
	s := o.CurrentShape(h, 1, Prices{})
	f := ActivityScale(s)
	if s.Model == ref.Model {
		return f, true
	}
	a, okA := LookupFacts(s.Accelerator, s.Model)
	b, okB := LookupFacts(ref.Accelerator, ref.Model)
	if !okA || !okB {
		return 0, false
	}
	return f * a.TFLOPS / b.TFLOPS, true
}
