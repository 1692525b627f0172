package rightsize

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Groupings of report.
const (
	ByNamespace = "namespace"
	ByOwner     = "owner"
	ByLabel     = "label"
)

// By is how report groups: by namespace, by owner (the workload), or by
// the value of a pod label.
type By struct {
	Kind  string
	Label string // ByLabel: the Kubernetes label name
}

// String is the flag's form.
func (b By) String() string {
	if b.Kind == ByLabel {
		return "label:" + b.Label
	}
	return b.Kind
}

// ParseBy parses --by.
func ParseBy(s string) (By, error) {
	switch {
	case s == ByNamespace || s == ByOwner:
		return By{Kind: s}, nil
	case strings.HasPrefix(s, "label:") && len(s) > len("label:"):
		return By{Kind: ByLabel, Label: strings.TrimPrefix(s, "label:")}, nil
	}
	return By{}, fmt.Errorf("--by=%s: want namespace, owner or label:<pod label> (label:team, label:app.kubernetes.io/part-of)", s)
}

// NoLabel is the group of pods without the label.
const NoLabel = "(none)"

// ErrNoKSM is a grouping that needs kube-state-metrics' pod objects where
// Prometheus has none.
var ErrNoKSM = errors.New("kube-state-metrics' pod objects (kube_pod_owner) are not in Prometheus")

// ShowbackRow is one group's GPU-hours and their cost over the window. A
// MIG device counts by its slice share, a shared GPU by its replica share:
// 1/n of the GPU for a holder of one of its n replicas where the node's
// labels say n (time-sharing on GKE, GPU Feature Discovery's replicas),
// else 1/n for each of its n holders.
type ShowbackRow struct {
	Group          string   `json:"group"`
	AllocatedHours float64  `json:"allocated_gpu_hours"`
	BusyHours      float64  `json:"busy_gpu_hours"`
	IdleHours      float64  `json:"idle_gpu_hours"`
	AllocatedCost  *float64 `json:"allocated_cost_dollars"`
	BusyCost       *float64 `json:"busy_cost_dollars"`
	IdleCost       *float64 `json:"idle_cost_dollars"`
}

// Showback is report's answer.
type Showback struct {
	By    string        `json:"by"`
	Rows  []ShowbackRow `json:"groups"`
	Total ShowbackRow   `json:"total"`
	// Unpriced are the models without a price; the cost of the groups
	// that hold them is unknown (null).
	Unpriced []string `json:"unpriced_models"`
}

// Report sums the window's GPU-hours per group.
func (o *Observation) Report(by By, prices Prices) (*Showback, error) {
	if by.Kind != ByNamespace && !o.KSM {
		return nil, fmt.Errorf("--by=%s: %w: deploy kube-state-metrics and scrape it where the exporters' series are (--by=namespace works without it)", by, ErrNoKSM)
	}
	ksmLabel := ""
	if by.Kind == ByLabel {
		ksmLabel = KSMLabelName(by.Label)
		found := false
		for _, labels := range o.Owners.PodLabels {
			found = found || labels[ksmLabel] != ""
		}
		if !found {
			return nil, fmt.Errorf("--by=%s: no pod that held a GPU in the window has %s in kube_pod_labels: kube-state-metrics serves only the pod labels it is allowed, add it with --metric-labels-allowlist=pods=[%s]", by, ksmLabel, by.Label)
		}
	}
	stepHours := o.Window.Step.Hours()
	groups := map[string]*ShowbackRow{}
	unpriced := map[string]bool{}
	total := &ShowbackRow{Group: "TOTAL", AllocatedCost: new(float64), BusyCost: new(float64), IdleCost: new(float64)}
	for _, h := range o.Holdings {
		var g string
		switch by.Kind {
		case ByNamespace:
			g = h.Namespace
		case ByOwner:
			g = h.Namespace + "/" + o.Owners.Resolve(h.Namespace, h.Pod).String()
		case ByLabel:
			g = o.Owners.PodLabels[PodKey{h.Namespace, h.Pod}][ksmLabel]
			if g == "" {
				g = NoLabel
			}
		}
		row := groups[g]
		if row == nil {
			row = &ShowbackRow{Group: g, AllocatedCost: new(float64), BusyCost: new(float64), IdleCost: new(float64)}
			groups[g] = row
		}
		model := o.ModelOf(h.DeviceKey)
		part := stepHours
		if h.GPUInstance != "" {
			part *= SliceShare(model, h.MIGProfile)
		} else if n := o.nodes[h.Node].replicas; n > 1 && h.Share > 0 {
			// A replica of a time-shared GPU is 1/n of it, whoever holds the
			// others: scale the holders' share (1/holders) to it.
			part *= h.Steps / float64(n) / h.Share
		}
		alloc, busy, idle := h.Share*part, h.Busy*part, h.Idle*part
		p := prices.PerGPUHour(model, o.AcceleratorOf(h.Node, model))
		for _, r := range []*ShowbackRow{row, total} {
			r.AllocatedHours += alloc
			r.BusyHours += busy
			r.IdleHours += idle
			if p == nil {
				r.AllocatedCost, r.BusyCost, r.IdleCost = nil, nil, nil
				continue
			}
			if r.AllocatedCost != nil {
				*r.AllocatedCost += alloc * *p
				*r.BusyCost += busy * *p
				*r.IdleCost += idle * *p
			}
		}
		if p == nil {
			unpriced[model] = true
		}
	}
	sb := &Showback{By: by.String(), Rows: []ShowbackRow{}, Unpriced: []string{}}
	for _, r := range groups {
		sb.Rows = append(sb.Rows, rounded(*r))
	}
	sort.Slice(sb.Rows, func(i, j int) bool { return sb.Rows[i].Group < sb.Rows[j].Group })
	sb.Total = rounded(*total)
	for m := range unpriced {
		sb.Unpriced = append(sb.Unpriced, m)
	}
	sort.Strings(sb.Unpriced)
	return sb, nil
}

// rounded keeps what the outputs print: GPU-hours to the thousandth,
// dollars to the cent.
func rounded(r ShowbackRow) ShowbackRow {
	r.AllocatedHours, r.BusyHours, r.IdleHours = roundTo(r.AllocatedHours, 3), roundTo(r.BusyHours, 3), roundTo(r.IdleHours, 3)
	for _, c := range []**float64{&r.AllocatedCost, &r.BusyCost, &r.IdleCost} {
		if *c != nil {
			v := roundTo(**c, 2)
			*c = &v
		}
	}
	return r
}
