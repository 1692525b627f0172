package rightsize

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// readConverted reads the activity percentile of each workload whose
// devices differ in model or shape (a rollout from an A100 to an H100, a
// ComputeClass fallback, a move from a MIG device to a whole GPU): each
// device's activity converted into whole GPUs of the workload's current
// model (activityFactor), the most of its devices each step, and the
// percentile of that over the window. Workloads of one model and shape
// need no query: the most of their devices' percentiles is read already.
func (o *Observation) readConverted(ctx context.Context, q querier) error {
	sub := "[" + promDuration(o.Window.Length) + ":" + promDuration(o.Window.Step) + "]"
	quantile := strconv.FormatFloat(o.Quantile, 'g', -1, 64)
	for _, wh := range o.byWorkload() {
		ref := o.CurrentShape(wh.current[0], 1, Prices{})
		groups := map[float64][]*Holding{}
		for _, h := range wh.all {
			f, ok := o.activityFactor(h, ref)
			if !ok {
				continue
			}
			f = roundTo(f, 9)
			groups[f] = append(groups[f], h)
		}
		if len(groups) < 2 {
			continue
		}
		factors := make([]float64, 0, len(groups))
		pods := 0
		for f, hs := range groups {
			factors = append(factors, f)
			pods += len(hs)
		}
		if pods > podsPerQuery {
			continue // too many to name in one query: the most of their converted percentiles stands
		}
		sort.Float64s(factors)
		parts := make([]string, len(factors))
		for i, f := range factors {
			podNames, uuids := map[string]bool{}, map[string]bool{}
			for _, h := range groups[f] {
				podNames[h.Pod], uuids[h.UUID] = true, true
			}
			parts[i] = fmt.Sprintf(`label_replace(max(%s{pod=~"%s", uuid=~"%s"}) * %s, "device_kind", "%d", "", "")`,
				RecordActivity, alternatives(podNames), alternatives(uuids), strconv.FormatFloat(f, 'g', -1, 64), i)
		}
		expr := "quantile_over_time(" + quantile + ", (max(" + strings.Join(parts, " or ") + "))" + sub + ")"
		vec, err := q.vector(ctx, expr)
		if err != nil {
			return err
		}
		if len(vec) == 1 && !math.IsNaN(float64(vec[0].Value)) {
			o.converted[wh.rowKey] = float64(vec[0].Value)
		}
	}
	return nil
}

// alternatives is a regular expression matching exactly the names.
func alternatives(names map[string]bool) string {
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, regexp.QuoteMeta(n))
	}
	sort.Strings(out)
	// PromQL strings in double quotes: escape the backslashes QuoteMeta writes.
	return strings.ReplaceAll(strings.Join(out, "|"), `\`, `\\`)
}
