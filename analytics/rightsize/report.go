package rightsize

import (
	"errors"
	"fmt"
	"math"
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

// Unallocated modes of report: show the unallocated GPU-hours as rows of
// their own, or share their cost out over the groups.
const (
	UnallocatedShow  = "show"
	UnallocatedShare = "share"
)

// ParseUnallocated parses --unallocated.
func ParseUnallocated(s string) (string, error) {
	if s == UnallocatedShow || s == UnallocatedShare {
		return s, nil
	}
	return "", fmt.Errorf("--unallocated=%s: want show (rows of their own, by reason) or share (their cost spread over the groups in proportion to their allocated cost, as OpenCost's shared idle)", s)
}

// UnallocatedGroup names the rows of GPU-hours no group held.
const UnallocatedGroup = "(unallocated)"

// ShowbackRow is one group's GPU-hours of one model and their cost over
// the window. A MIG device counts by its cost share (the larger of its
// compute and memory slice fractions), a time-sliced GPU by its replica
// share: 1/n of the GPU for a holder of one of its n replicas where the
// node's labels say n (time-sharing on GKE, GPU Feature Discovery's
// replicas), else 1/n for each of its n holders. Busy hours are the
// holder's own activity: on a time-sliced GPU they can exceed its
// allocated hours where the others leave the GPU idle.
type ShowbackRow struct {
	Group          string   `json:"group"`
	Model          string   `json:"model"`
	AllocatedHours float64  `json:"allocated_gpu_hours"`
	BusyHours      float64  `json:"busy_gpu_hours"`
	IdleHours      float64  `json:"idle_gpu_hours"`
	AllocatedCost  *float64 `json:"allocated_cost_dollars"`
	BusyCost       *float64 `json:"busy_cost_dollars"`
	IdleCost       *float64 `json:"idle_cost_dollars"`
	// SharedCost is the group's part of its model's unallocated cost
	// under --unallocated=share (0 under show).
	SharedCost *float64 `json:"shared_unallocated_cost_dollars"`
}

// UnallocatedRow is GPU-hours of one model no group held, for one reason.
type UnallocatedRow struct {
	Reason string   `json:"reason"`
	Model  string   `json:"model"`
	Hours  float64  `json:"gpu_hours"`
	Cost   *float64 `json:"cost_dollars"`
}

// BillRow is what the GPUs of one model cost over the window: every GPU
// the exporters served, every hour it was there, at the model's price; and
// what the report's rows add up to for the model.
type BillRow struct {
	Model        string   `json:"model"`
	Hours        float64  `json:"gpu_hours"`
	Cost         *float64 `json:"cost_dollars"`
	PricePerHour *float64 `json:"price_dollars_per_hour"`
	RowsHours    float64  `json:"rows_gpu_hours"`
	RowsCost     *float64 `json:"rows_cost_dollars"`
}

// ShowbackTotal is the costs of every row summed over the priced models
// (hours of different models are never summed).
type ShowbackTotal struct {
	Group           string   `json:"group"`
	AllocatedCost   *float64 `json:"allocated_cost_dollars"`
	BusyCost        *float64 `json:"busy_cost_dollars"`
	IdleCost        *float64 `json:"idle_cost_dollars"`
	SharedCost      *float64 `json:"shared_unallocated_cost_dollars"`
	UnallocatedCost *float64 `json:"unallocated_cost_dollars"`
	BillCost        *float64 `json:"bill_cost_dollars"`
}

// Showback is report's answer: the groups' rows, the unallocated rows, and
// the bill they add up to, per model.
type Showback struct {
	By          string           `json:"by"`
	Unallocated string           `json:"unallocated_mode"`
	Rows        []ShowbackRow    `json:"groups"`
	Free        []UnallocatedRow `json:"unallocated"`
	Bill        []BillRow        `json:"bill"`
	Total       ShowbackTotal    `json:"total"`
	// Unpriced are the models without a price: their rows' hours are
	// listed, their cost is unknown (null) and in no total.
	Unpriced []string `json:"unpriced_models"`
}

// BillTolerance is how far the rows may be from the bill (0.5%) before the
// report says they do not add up.
const BillTolerance = 0.005

// chargeOf is what a holding is charged, in device-steps of its device
// (a MIG device's are converted into GPUs by its cost share): its share
// of the device; on a time-sliced GPU whose node says n replicas, 1/n
// (its replica) as long as it holds no more than that.
func (o *Observation) chargeOf(h *Holding) float64 {
	if n := o.nodes[h.Node].replicas; n > 1 && h.GPUInstance == "" {
		return min(h.Share, h.Steps/float64(n))
	}
	return h.Share
}

// Report sums the window's GPU-hours per group and model, and the
// GPU-hours no group held per reason and model, against the bill.
func (o *Observation) Report(by By, prices Prices, mode string) (*Showback, error) {
	if by.Kind != ByNamespace && !o.KSM {
		return nil, fmt.Errorf("--by=%s: %w: deploy kube-state-metrics and scrape it where the exporters' series are (--by=namespace works without it)", by, ErrNoKSM)
	}
	if mode == "" {
		mode = UnallocatedShow
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
	priceOf := map[string]*float64{}
	modelPrice := func(model, node string) *float64 {
		if p, ok := priceOf[model]; ok {
			return p
		}
		p := prices.PerGPUHour(model, o.AcceleratorOf(node, model))
		priceOf[model] = p
		return p
	}
	type groupKey struct{ group, model string }
	groups := map[groupKey]*ShowbackRow{}
	charged := map[DeviceKey]float64{}
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
		model := o.ModelOf(h.DeviceKey)
		row := groups[groupKey{g, model}]
		if row == nil {
			row = &ShowbackRow{Group: g, Model: model}
			groups[groupKey{g, model}] = row
		}
		charge := o.chargeOf(h)
		charged[h.DeviceKey] += charge
		fraction := 1.0
		if h.GPUInstance != "" {
			fraction = o.chargeShare(h.DeviceKey, model, h.MIGProfile)
		}
		idle := h.Idle
		if h.Share > 0 {
			idle *= charge / h.Share
		}
		row.AllocatedHours += charge * fraction * stepHours
		row.BusyHours += h.Busy * fraction * stepHours
		row.IdleHours += idle * fraction * stepHours
		modelPrice(model, h.Node)
	}
	sb := &Showback{By: by.String(), Unallocated: mode, Rows: []ShowbackRow{}, Free: []UnallocatedRow{}, Bill: []BillRow{}, Unpriced: []string{}}
	for _, r := range groups {
		if p := priceOf[r.Model]; p != nil {
			r.AllocatedCost, r.BusyCost, r.IdleCost, r.SharedCost = ptr(r.AllocatedHours**p), ptr(r.BusyHours**p), ptr(r.IdleHours**p), ptr(0)
		}
		sb.Rows = append(sb.Rows, *r)
	}
	unallocated := o.unallocated(charged)
	for _, reason := range Reasons {
		for model, hours := range unallocated[reason] {
			p := modelPrice(model, "")
			var cost *float64
			if p != nil {
				cost = ptr(hours * *p)
			}
			sb.Free = append(sb.Free, UnallocatedRow{Reason: reason, Model: model, Hours: hours, Cost: cost})
		}
	}
	sort.SliceStable(sb.Free, func(i, j int) bool {
		a, b := sb.Free[i], sb.Free[j]
		if a.Reason != b.Reason {
			return reasonIndex(a.Reason) < reasonIndex(b.Reason)
		}
		return a.Model < b.Model
	})
	if mode == UnallocatedShare {
		sb.Free = shareOut(sb.Rows, sb.Free)
	}
	for model, hours := range o.billHours() {
		b := BillRow{Model: model, Hours: hours, PricePerHour: modelPrice(model, "")}
		if b.PricePerHour != nil {
			b.Cost = ptr(hours * *b.PricePerHour)
		}
		sb.Bill = append(sb.Bill, b)
	}
	for model, p := range priceOf {
		if p == nil {
			sb.Unpriced = append(sb.Unpriced, model)
		}
	}
	sort.Strings(sb.Unpriced)
	sb.reconcile()
	sb.round()
	return sb, nil
}

func reasonIndex(r string) int {
	for i, x := range Reasons {
		if x == r {
			return i
		}
	}
	return len(Reasons)
}

// shareOut spreads each priced model's unallocated cost over the groups
// that held the model, in proportion to their allocated cost (OpenCost's
// shared idle); the rows of a model nobody was charged for, or that has no
// price, stay.
func shareOut(rows []ShowbackRow, free []UnallocatedRow) []UnallocatedRow {
	allocated := map[string]float64{}
	for _, r := range rows {
		if r.AllocatedCost != nil {
			allocated[r.Model] += *r.AllocatedCost
		}
	}
	shared := map[string]float64{}
	var kept []UnallocatedRow
	for _, f := range free {
		if f.Cost == nil || allocated[f.Model] <= 0 {
			kept = append(kept, f)
			continue
		}
		shared[f.Model] += *f.Cost
	}
	for i := range rows {
		r := &rows[i]
		if r.AllocatedCost != nil && allocated[r.Model] > 0 {
			r.SharedCost = ptr(shared[r.Model] * *r.AllocatedCost / allocated[r.Model])
		}
	}
	if kept == nil {
		kept = []UnallocatedRow{}
	}
	return kept
}

// reconcile adds up the rows per model against the bill, and the total
// of the priced costs.
func (sb *Showback) reconcile() {
	hours, cost := map[string]float64{}, map[string]float64{}
	for _, r := range sb.Rows {
		hours[r.Model] += r.AllocatedHours
		if r.AllocatedCost != nil {
			cost[r.Model] += *r.AllocatedCost + *r.SharedCost
		}
	}
	unallocatedHours := map[string]float64{}
	for _, f := range sb.Free {
		unallocatedHours[f.Model] += f.Hours
		if f.Cost != nil {
			cost[f.Model] += *f.Cost
		}
	}
	// Rows of models the bill does not have (a holder on a GPU without
	// gpu_info) still show against it, as a bill of 0.
	billed := map[string]bool{}
	for _, b := range sb.Bill {
		billed[b.Model] = true
	}
	for m := range hours {
		if !billed[m] {
			sb.Bill = append(sb.Bill, BillRow{Model: m})
		}
	}
	sort.Slice(sb.Bill, func(i, j int) bool { return sb.Bill[i].Model < sb.Bill[j].Model })
	t := ShowbackTotal{Group: "TOTAL"}
	for i := range sb.Bill {
		b := &sb.Bill[i]
		b.RowsHours = hours[b.Model] + unallocatedHours[b.Model]
		if b.PricePerHour != nil {
			b.RowsCost = ptr(cost[b.Model])
			if b.Cost == nil {
				b.Cost = ptr(0)
			}
			t.BillCost = addPtr(t.BillCost, *b.Cost)
		}
	}
	for _, r := range sb.Rows {
		if r.AllocatedCost != nil {
			t.AllocatedCost = addPtr(t.AllocatedCost, *r.AllocatedCost)
			t.BusyCost = addPtr(t.BusyCost, *r.BusyCost)
			t.IdleCost = addPtr(t.IdleCost, *r.IdleCost)
			t.SharedCost = addPtr(t.SharedCost, *r.SharedCost)
		}
	}
	for _, f := range sb.Free {
		if f.Cost != nil {
			t.UnallocatedCost = addPtr(t.UnallocatedCost, *f.Cost)
		}
	}
	if t.BillCost != nil {
		for _, p := range []**float64{&t.AllocatedCost, &t.BusyCost, &t.IdleCost, &t.SharedCost, &t.UnallocatedCost} {
			if *p == nil {
				*p = ptr(0)
			}
		}
	}
	sb.Total = t
}

func addPtr(p *float64, v float64) *float64 {
	if p == nil {
		return ptr(v)
	}
	return ptr(*p + v)
}

// Adds says whether a model's rows add up to its bill: the hours (which
// every model has) and, where it is priced, the cost, within
// BillTolerance; shared reports compare the cost only (the unallocated
// hours are in no row).
func (b BillRow) Adds(shared bool) bool {
	near := func(got, want float64) bool {
		return math.Abs(got-want) <= BillTolerance*math.Abs(want)+1e-9
	}
	if b.PricePerHour != nil && b.Cost != nil && b.RowsCost != nil && !near(*b.RowsCost, *b.Cost) {
		return false
	}
	return shared && b.PricePerHour != nil || near(b.RowsHours, b.Hours)
}

// round keeps what the outputs print: GPU-hours to the thousandth,
// dollars to the cent.
func (sb *Showback) round() {
	h := func(v *float64) { *v = roundTo(*v, 3) }
	c := func(v **float64) {
		if *v != nil {
			*v = ptr(roundTo(**v, 2))
		}
	}
	for i := range sb.Rows {
		r := &sb.Rows[i]
		h(&r.AllocatedHours)
		h(&r.BusyHours)
		h(&r.IdleHours)
		for _, p := range []**float64{&r.AllocatedCost, &r.BusyCost, &r.IdleCost, &r.SharedCost} {
			c(p)
		}
	}
	sort.Slice(sb.Rows, func(i, j int) bool {
		if sb.Rows[i].Group != sb.Rows[j].Group {
			return sb.Rows[i].Group < sb.Rows[j].Group
		}
		return sb.Rows[i].Model < sb.Rows[j].Model
	})
	for i := range sb.Free {
		h(&sb.Free[i].Hours)
		c(&sb.Free[i].Cost)
	}
	for i := range sb.Bill {
		b := &sb.Bill[i]
		h(&b.Hours)
		h(&b.RowsHours)
		c(&b.Cost)
		c(&b.RowsCost)
	}
	t := &sb.Total
	for _, p := range []**float64{&t.AllocatedCost, &t.BusyCost, &t.IdleCost, &t.SharedCost, &t.UnallocatedCost, &t.BillCost} {
		c(p)
	}
}
