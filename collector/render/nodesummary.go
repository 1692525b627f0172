package render

import (
	"math"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// foldOp is how the node_summary group folds a family's per-GPU series into
// one series per node.
type foldOp string

// fold says how a family is folded: op over the whole GPUs' rows, and, where
// only is set, only the rows with that label value (the others stay per
// GPU).
type fold struct {
	op   foldOp
	only [2]string
}

const (
	foldSum  foldOp = "sum"
	foldMin  foldOp = "min"
	foldMean foldOp = "mean"
)

// nodeSummaryFolds are the families node_summary serves as one series per
// node: those no alert or recording rule reads per GPU and that attribute no
// use to a pod. Counters are summed (and stay monotonic when a GPU leaves);
// a gauge is folded the way the node dashboard reads it: summed where the
// node's total means something (power against the node's power limit),
// the minimum for a threshold (the Temperature panel's min()), the mean
// for clocks and activity ratios. Of the ECC counters only the corrected
// ones fold: GPUUncorrectableECCErrors reads the uncorrected per GPU.
var nodeSummaryFolds = map[string]fold{
	"gpu_pcie_transmit_bytes_total":    {op: foldSum},
	"gpu_pcie_receive_bytes_total":     {op: foldSum},
	"gpu_pcie_replay_errors_total":     {op: foldSum},
	"gpu_nvlink_transmit_bytes_total":  {op: foldSum},
	"gpu_nvlink_receive_bytes_total":   {op: foldSum},
	"gpu_nvlink_errors_total":          {op: foldSum},
	"gpu_ecc_errors_total":             {op: foldSum, only: [2]string{"error", "corrected"}},
	"gpu_power_watts":                  {op: foldSum},
	"gpu_power_limit_watts":            {op: foldSum},
	"gpu_slowdown_temperature_celsius": {op: foldMin},
	"gpu_sm_clock_hertz":               {op: foldMean},
	"gpu_tensor_active_ratio":          {op: foldMean},
	"gpu_dram_active_ratio":            {op: foldMean},
	"gpu_memory_utilization_ratio":     {op: foldMean},
}

// NodeSummaryFolds returns, for each family the node_summary group folds,
// how: "sum", "min" or "mean" over the node's whole GPUs, followed by
// ` of error="corrected"` where only some series fold (docs/profiles.md, tests).
func NodeSummaryFolds() map[string]string {
	out := make(map[string]string, len(nodeSummaryFolds))
	for name, f := range nodeSummaryFolds {
		out[name] = string(f.op)
		if f.only[0] != "" {
			out[name] += " of " + f.only[0] + "=\"" + f.only[1] + "\""
		}
	}
	return out
}

// NodeSummaryGPU is the gpu (and uuid) label value of a folded series.
const NodeSummaryGPU = "all"

// identityLabels name the device; a folded series has gpu and uuid "all"
// and the MIG ones empty, so dashboards that filter gpu=~".*" and
// gpu_instance="" match it. Every other label (an NVLink error's type)
// keeps its value, and series are folded per value.
var identityLabels = map[string]string{
	"gpu": NodeSummaryGPU, "uuid": NodeSummaryGPU,
	"gpu_instance": "", "mig_profile": "", "compute_instance": "",
}

// nodeSummary folds rendered families into one series per node. A folded
// counter is the sum of its GPUs' increases since the exporter started, so
// it never goes down: a GPU that stops answering or leaves the page keeps
// its last value in the sum, and a GPU whose counter fell (a reset the
// monotonic layer did not see) counts on from zero.
type nodeSummary struct {
	counters map[string]*foldedCounter // family and other labels -> state
	// gave is, per folded gauge (family and other labels), the GPUs that
	// have given it a value since the exporter started: one of them on the
	// page without a value now makes the total partial.
	gave map[string]map[string]bool
}

// PartialLabel marks a folded gauge that misses the value of a GPU on the
// page (lost, not answering, or its read failed) that gave one before:
// partial="true". A complete total has no such label.
const PartialLabel = "partial"

type foldedCounter struct {
	total float64
	last  map[string]float64 // member GPU -> last value counted
}

func newNodeSummary() *nodeSummary {
	return &nodeSummary{counters: map[string]*foldedCounter{}, gave: map[string]map[string]bool{}}
}

// fold replaces, in place, the per-GPU series of every folded family by one
// series per node (and per value of the family's other labels). MIG
// instance rows are dropped: a whole GPU's row already covers them. A
// group without a value on any GPU gets no series, and a family left
// without series leaves the returned slice.
func (n *nodeSummary) fold(mfs []*dto.MetricFamily) []*dto.MetricFamily {
	onPage := pageGPUs(mfs)
	kept := mfs[:0]
	for _, mf := range mfs {
		f, ok := nodeSummaryFolds[mf.GetName()]
		if !ok {
			kept = append(kept, mf)
			continue
		}
		op := f.op
		counter := mf.GetType() == dto.MetricType_COUNTER
		type group struct {
			labels  []*dto.LabelPair
			acc     float64
			n       int
			key     string
			members map[string]bool
		}
		groups := map[string]*group{}
		var order []string
		var out []*dto.Metric // rows that stay per GPU, then the folded ones
		for _, m := range mf.Metric {
			if f.only[0] != "" && labelValue(m.Label, f.only[0]) != f.only[1] {
				out = append(out, m)
				continue
			}
			key, member, whole := foldKey(m.Label)
			if !whole {
				continue
			}
			v := metricValue(m)
			if math.IsNaN(v) {
				continue
			}
			g := groups[key]
			if g == nil {
				g = &group{labels: foldedLabels(m.Label), key: key, members: map[string]bool{}}
				if op == foldMin {
					g.acc = math.Inf(1)
				}
				groups[key] = g
				order = append(order, key)
			}
			g.n++
			g.members[member] = true
			switch {
			case counter:
				n.count(mf.GetName()+"\xff"+key, member, v)
			case op == foldMin:
				g.acc = math.Min(g.acc, v)
			default:
				g.acc += v
			}
		}
		sort.Strings(order)
		for _, k := range order {
			g := groups[k]
			m := &dto.Metric{Label: g.labels}
			switch {
			case counter:
				m.Counter = &dto.Counter{Value: proto.Float64(n.counters[mf.GetName()+"\xff"+k].total)}
			case op == foldMean:
				m.Gauge = &dto.Gauge{Value: proto.Float64(g.acc / float64(g.n))}
			default:
				m.Gauge = &dto.Gauge{Value: proto.Float64(g.acc)}
			}
			if !counter && n.partial(mf.GetName()+"\xff"+k, g.members, onPage) {
				m.Label = withPartial(m.Label)
			}
			out = append(out, m)
		}
		if len(out) == 0 {
			continue
		}
		mf.Metric = out
		what := "the " + string(op) + " over its GPUs"
		if f.only[0] != "" {
			what += ", for " + f.only[0] + "=\"" + f.only[1] + "\""
		}
		if !counter {
			what += "; partial=\"true\" while it misses the value of a GPU on the page that gave one before"
		}
		mf.Help = proto.String(mf.GetHelp() + " Folded by node_summary: one series per node (gpu=\"" + NodeSummaryGPU + "\"), " + what + ".")
		kept = append(kept, mf)
	}
	return kept
}

// partial records the GPUs whose values a folded gauge holds now and
// reports whether it misses one that is on the page and gave a value
// before. A GPU that never gave one (the board does not have the field)
// does not make it partial; one that stopped (lost, failing, its read
// answering an error) does, until it gives one again or leaves the page.
func (n *nodeSummary) partial(key string, members, onPage map[string]bool) bool {
	gave := n.gave[key]
	if gave == nil {
		gave = map[string]bool{}
		n.gave[key] = gave
	}
	for m := range members {
		gave[m] = true
	}
	for m := range gave {
		if onPage[m] && !members[m] {
			return true
		}
	}
	return false
}

// pageGPUs are the whole GPUs on the page (gpu_up's rows without a GPU
// instance), by the member key foldKey gives them.
func pageGPUs(mfs []*dto.MetricFamily) map[string]bool {
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "gpu_up" {
			continue
		}
		for _, m := range mf.Metric {
			if _, member, whole := foldKey(m.Label); whole {
				out[member] = true
			}
		}
	}
	return out
}

// withPartial adds partial="true" to a folded series' labels, in order.
func withPartial(labels []*dto.LabelPair) []*dto.LabelPair {
	out := append(labels, &dto.LabelPair{Name: proto.String(PartialLabel), Value: proto.String("true")})
	sort.Slice(out, func(i, j int) bool { return out[i].GetName() < out[j].GetName() })
	return out
}

// count adds a member GPU's counter value to a folded counter: its increase
// since the last render, or all of it when it is new or fell.
func (n *nodeSummary) count(key, member string, v float64) {
	c := n.counters[key]
	if c == nil {
		c = &foldedCounter{last: map[string]float64{}}
		n.counters[key] = c
	}
	last, seen := c.last[member]
	switch {
	case !seen, v < last:
		c.total += v
	default:
		c.total += v - last
	}
	c.last[member] = v
}

// foldKey returns a series' other labels (the key it is folded by), the GPU
// it belongs to, and whether it is a whole GPU's row.
func foldKey(labels []*dto.LabelPair) (key, member string, whole bool) {
	var b strings.Builder
	var gpu, uuid string
	for _, l := range labels {
		switch l.GetName() {
		case "gpu_instance":
			if l.GetValue() != "" {
				return "", "", false
			}
		case "uuid":
			uuid = l.GetValue()
		case "gpu":
			gpu = l.GetValue()
		}
		if _, id := identityLabels[l.GetName()]; id {
			continue
		}
		b.WriteString(l.GetName())
		b.WriteByte(0xfe)
		b.WriteString(l.GetValue())
		b.WriteByte(0xff)
	}
	member = uuid
	if member == "" {
		member = "gpu " + gpu
	}
	return b.String(), member, true
}

func labelValue(labels []*dto.LabelPair, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func foldedLabels(labels []*dto.LabelPair) []*dto.LabelPair {
	out := make([]*dto.LabelPair, len(labels))
	for i, l := range labels {
		v := l.GetValue()
		if folded, id := identityLabels[l.GetName()]; id {
			v = folded
		}
		out[i] = &dto.LabelPair{Name: proto.String(l.GetName()), Value: proto.String(v)}
	}
	return out
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return math.NaN()
}
