package rightsize

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.yaml.in/yaml/v3"
)

// Formats of -o: every command's, and recommend's also yaml (the
// changes a person would apply).
var (
	Formats          = []string{"table", "csv", "json"}
	RecommendFormats = []string{"table", "csv", "json", "yaml"}
)

// Recommendations is recommend's answer.
type Recommendations struct {
	At            time.Time `json:"at"`
	Window        string    `json:"window"`
	Headroom      float64   `json:"headroom"`
	Percentile    float64   `json:"percentile"`
	MinCoverage   float64   `json:"min_coverage"`
	AllowNewPools bool      `json:"allow_new_pools"`
	Workloads     []Row     `json:"workloads"`
	Notes         []string  `json:"notes"`
}

const gib = 1 << 30

func optFormat(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func percent(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100**v)
}

// holds is "8 x nvidia-h100-80gb", "2 pods x 1 nvidia-h100-80gb share 1/2".
func (r Row) holds() string {
	if r.Pods > 1 {
		return fmt.Sprintf("%d pods x %d %s", r.Pods, r.Devices, r.Holds)
	}
	return fmt.Sprintf("%d x %s", r.Devices, r.Holds)
}

func (r Row) used() string {
	peak := "-"
	if r.PeakMemoryBytes != nil {
		peak = fmt.Sprintf("%.1f GiB", *r.PeakMemoryBytes/gib)
	}
	return fmt.Sprintf("peak %s, %s %s, idle %s", peak, r.percentileName, percent(r.P95Activity), percent(r.IdleShare))
}

// data is how much data the row stands on: its coverage of the window
// and samples, and when it was last seen where that is before the end.
func (r Row) data(at time.Time, step time.Duration) string {
	s := fmt.Sprintf("%.0f%%, %d samples", 100*r.Coverage, r.Samples)
	if at.Sub(r.LastSeen) > 5*time.Minute+step {
		s += ", last " + r.LastSeen.UTC().Format("2006-01-02T15:04Z")
	}
	return s
}

func (r Row) recommendation() string {
	switch {
	case r.Recommendation != RecommendKeep && r.Recommendation != RecommendRelease && r.Recommendation != InsufficientData && r.RecommendedDevices != r.Devices:
		return fmt.Sprintf("%s x%d", r.Recommendation, r.RecommendedDevices)
	}
	return r.Recommendation
}

// Write prints the recommendations as a table, CSV or JSON. Notes go
// under the table and into the JSON; CSV has no place for them (the
// command prints them on standard error).
func (rs *Recommendations) Write(w io.Writer, format string) error {
	switch format {
	case "json":
		return writeJSON(w, rs)
	case "yaml":
		return rs.writeYAML(w)
	case "csv":
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"namespace", "workload", "pods", "accelerator", "model", "holds", "devices", "peak_memory_bytes", "p95_activity", "idle_share", "idle_devices", "recommendation", "recommended_devices", "monthly_saving_dollars", "reason",
			"samples", "coverage", "first_seen", "last_seen", "pool"})
		for _, r := range rs.Workloads {
			_ = cw.Write([]string{r.Namespace, r.Workload, strconv.Itoa(r.Pods), r.Accelerator, r.Model, r.Holds, strconv.Itoa(r.Devices),
				csvNum(r.PeakMemoryBytes, "%.0f"), csvNum(r.P95Activity, "%.4f"), csvNum(r.IdleShare, "%.4f"), strconv.Itoa(r.IdleDevices),
				r.Recommendation, strconv.Itoa(r.RecommendedDevices), csvNum(r.MonthlySaving, "%.2f"), r.Reason,
				strconv.Itoa(r.Samples), fmt.Sprintf("%.4f", r.Coverage), csvTime(r.FirstSeen), csvTime(r.LastSeen), r.Pool})
		}
		cw.Flush()
		return cw.Error()
	}
	name := rs.percentileName()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tWORKLOAD\tHOLDS\tUSED (PER DEVICE)\tRECOMMENDATION\tPOOL\tSAVING $/MONTH\tDATA")
	for _, r := range rs.Workloads {
		r.percentileName = name
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Workload, r.holds(), r.used(), r.recommendation(), orDash(r.Pool),
			optFormat(r.MonthlySaving, "%.2f"), r.data(rs.At, time.Minute))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rs.Workloads {
		if r.Reason != "" {
			if _, err := fmt.Fprintf(w, "%s %s/%s: %s\n", InsufficientData+":", r.Namespace, r.Workload, r.Reason); err != nil {
				return err
			}
		}
	}
	return writeNotes(w, rs.Notes)
}

// percentileName is "p95" for --percentile=95.
func (rs *Recommendations) percentileName() string {
	if rs.Percentile == 0 {
		return "p95"
	}
	return "p" + strconv.FormatFloat(rs.Percentile, 'g', -1, 64)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func csvTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func writeNotes(w io.Writer, notes []string) error {
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, "note: "+n); err != nil {
			return err
		}
	}
	return nil
}

func csvNum(v *float64, format string) string {
	if v == nil {
		return ""
	}
	return fmt.Sprintf(format, *v)
}

// ShowbackReport is report's answer with its window and notes.
type ShowbackReport struct {
	At     time.Time `json:"at"`
	Window string    `json:"since"`
	*Showback
	Notes []string `json:"notes"`
}

// aboveShare marks a row whose busy hours exceed its allocated ones.
const aboveShare = "*"

// efficiency is busy over allocated, marked where above 100% (a holder of
// a time-sliced GPU busier than its replica's share).
func efficiency(r ShowbackRow) string {
	if r.AllocatedHours <= 0 {
		return "-"
	}
	e := r.BusyHours / r.AllocatedHours
	s := fmt.Sprintf("%.0f%%", 100*e)
	if e > 1.0005 {
		s += aboveShare
	}
	return s
}

// BillLines say, per model, what its GPUs cost over the window and what
// the report's rows add up to.
func (sb *Showback) BillLines() []string {
	var out []string
	shared := sb.Unallocated == UnallocatedShare
	for _, b := range sb.Bill {
		var line string
		if b.PricePerHour != nil && b.Cost != nil && b.RowsCost != nil {
			pct := 100.0
			if *b.Cost > 0 {
				pct = 100 * *b.RowsCost / *b.Cost
			}
			line = fmt.Sprintf("bill %s: %.3f GPU-hours x %.2f $/h = %.2f $; the rows add up to %.2f $ (%.2f%%)", b.Model, b.Hours, *b.PricePerHour, *b.Cost, *b.RowsCost, pct)
		} else {
			line = fmt.Sprintf("bill %s: %.3f GPU-hours, no price; the rows add up to %.3f GPU-hours", b.Model, b.Hours, b.RowsHours)
		}
		if !b.Adds(shared) {
			line += fmt.Sprintf(": they do NOT add up to the bill within %.1f%% (holders on GPUs whose gpu_info was not recorded, or series missing from Prometheus)", 100*BillTolerance)
		}
		out = append(out, line)
	}
	return out
}

// Write prints the report as a table, CSV or JSON. The table ends with
// the bill per model; CSV holds the rows only (the command prints the
// bill lines with the notes on standard error).
func (sr *ShowbackReport) Write(w io.Writer, format string) error {
	shared := sr.Unallocated == UnallocatedShare
	switch format {
	case "json":
		return writeJSON(w, sr)
	case "csv":
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{sr.By, "model", "reason", "allocated_gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "allocated_cost_dollars", "busy_cost_dollars", "idle_cost_dollars", "shared_unallocated_cost_dollars"})
		for _, r := range sr.Rows {
			_ = cw.Write([]string{r.Group, r.Model, "", fmt.Sprintf("%.3f", r.AllocatedHours), fmt.Sprintf("%.3f", r.BusyHours), fmt.Sprintf("%.3f", r.IdleHours),
				csvNum(r.AllocatedCost, "%.2f"), csvNum(r.BusyCost, "%.2f"), csvNum(r.IdleCost, "%.2f"), csvNum(r.SharedCost, "%.2f")})
		}
		for _, f := range sr.Free {
			_ = cw.Write([]string{UnallocatedGroup, f.Model, f.Reason, fmt.Sprintf("%.3f", f.Hours), "", "", csvNum(f.Cost, "%.2f"), "", "", ""})
		}
		cw.Flush()
		return cw.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := fmt.Sprintf("%s\tMODEL\tGPU-HOURS\tBUSY GPU-HOURS\tIDLE GPU-HOURS\tBUSY/ALLOCATED\tCOST $\tBUSY $\tIDLE $", strings.ToUpper(sr.By))
	if shared {
		header += "\tSHARED UNALLOCATED $"
	}
	fmt.Fprintln(tw, header)
	above := false
	for _, r := range sr.Rows {
		e := efficiency(r)
		above = above || strings.HasSuffix(e, aboveShare)
		line := fmt.Sprintf("%s\t%s\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s\t%s", r.Group, r.Model, r.AllocatedHours, r.BusyHours, r.IdleHours, e,
			optFormat(r.AllocatedCost, "%.2f"), optFormat(r.BusyCost, "%.2f"), optFormat(r.IdleCost, "%.2f"))
		if shared {
			line += "\t" + optFormat(r.SharedCost, "%.2f")
		}
		fmt.Fprintln(tw, line)
	}
	for _, f := range sr.Free {
		line := fmt.Sprintf("%s %s\t%s\t%.3f\t-\t-\t-\t%s\t-\t-", UnallocatedGroup, f.Reason, f.Model, f.Hours, optFormat(f.Cost, "%.2f"))
		if shared {
			line += "\t-"
		}
		fmt.Fprintln(tw, line)
	}
	t := sr.Total
	total := fmt.Sprintf("%s\t(priced models)\t-\t-\t-\t-\t%s\t%s\t%s", t.Group, optFormat(sumPtr(t.AllocatedCost, t.UnallocatedCost), "%.2f"), optFormat(t.BusyCost, "%.2f"), optFormat(t.IdleCost, "%.2f"))
	if shared {
		total += "\t" + optFormat(t.SharedCost, "%.2f")
	}
	fmt.Fprintln(tw, total)
	if err := tw.Flush(); err != nil {
		return err
	}
	lines := sr.BillLines()
	if above {
		lines = append(lines, aboveShare+" busy above allocated: time-sliced GPUs' holders busier than their replica's share, the other replicas idle (their own part of the GPU's busy time, not clamped)")
	}
	for _, l := range lines {
		if _, err := fmt.Fprintln(w, l); err != nil {
			return err
		}
	}
	return writeNotes(w, sr.Notes)
}

func sumPtr(a, b *float64) *float64 {
	if a == nil || b == nil {
		return nil
	}
	return ptr(*a + *b)
}

// podTemplatePath is where a kind holds its pod spec, and its API
// version; kinds not listed get the pod spec alone.
var podTemplatePath = map[string]struct {
	apiVersion string
	path       []string
}{
	"Deployment":  {"apps/v1", []string{"spec", "template", "spec"}},
	"StatefulSet": {"apps/v1", []string{"spec", "template", "spec"}},
	"ReplicaSet":  {"apps/v1", []string{"spec", "template", "spec"}},
	"DaemonSet":   {"apps/v1", []string{"spec", "template", "spec"}},
	"Job":         {"batch/v1", []string{"spec", "template", "spec"}},
	"CronJob":     {"batch/v1", []string{"spec", "jobTemplate", "spec", "template", "spec"}},
	"Pod":         {"v1", []string{"spec"}},
}

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

func nullNode() *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"} }

func mapping(kv ...any) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		v, ok := kv[i+1].(*yaml.Node)
		if !ok {
			v = scalar(fmt.Sprint(kv[i+1]))
		}
		n.Content = append(n.Content, scalar(kv[i].(string)), v)
	}
	return n
}

// writeYAML prints, per workload whose recommendation changes something,
// the change as a strategic merge patch of its pod template (kubectl patch
// --type=strategic), with a comment that says what it does.
func (rs *Recommendations) writeYAML(w io.Writer) error {
	n := 0
	for _, r := range rs.Workloads {
		if r.change == nil {
			continue
		}
		n++
		ch := r.change
		limits := mapping()
		if ch.newResource != ch.oldResource {
			limits.Content = append(limits.Content, scalar(ch.oldResource), nullNode())
		}
		if ch.newResource != "" {
			limits.Content = append(limits.Content, scalar(ch.newResource), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(ch.count)})
		}
		containers := &yaml.Node{Kind: yaml.SequenceNode}
		for _, c := range ch.containers {
			containers.Content = append(containers.Content, mapping("name", c, "resources", mapping("limits", limits)))
		}
		podSpec := mapping()
		if len(ch.nodeSelector) > 0 {
			keys := make([]string, 0, len(ch.nodeSelector))
			for k := range ch.nodeSelector {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			sel := mapping()
			for _, k := range keys {
				sel.Content = append(sel.Content, scalar(k), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: ch.nodeSelector[k]})
			}
			podSpec.Content = append(podSpec.Content, scalar("nodeSelector"), sel)
		}
		podSpec.Content = append(podSpec.Content, scalar("containers"), containers)

		where, known := podTemplatePath[r.Kind]
		doc := mapping()
		comment := fmt.Sprintf("%s/%s: %s", r.Namespace, r.Workload, r.recommendation())
		if r.Pool != "" {
			comment += "; pool: " + r.Pool
		}
		if r.MonthlySaving != nil {
			comment += fmt.Sprintf("; saves %.2f $/month", *r.MonthlySaving)
		}
		comment += "\nnot applied: review, then kubectl patch " + r.Kind + " " + r.Name + " -n " + r.Namespace + " --type=strategic --patch-file=<this document>"
		switch {
		case r.Kind == "Pod":
			comment += "\na Pod's resources and nodeSelector cannot change in place: recreate it with this"
		case r.Kind == "Job":
			comment += "\na Job's pod template cannot change once created: change what creates it"
		case !known:
			comment = fmt.Sprintf("%s/%s: %s; put this pod spec into the pod template(s) of the %s", r.Namespace, r.Workload, r.recommendation(), r.Kind)
			where.path = []string{"podTemplateSpec", "spec"}
		}
		doc.HeadComment = comment
		if known {
			doc.Content = append(doc.Content, scalar("apiVersion"), scalar(where.apiVersion))
		}
		doc.Content = append(doc.Content, scalar("kind"), scalar(r.Kind),
			scalar("metadata"), mapping("name", r.Name, "namespace", r.Namespace))
		inner := podSpec
		for i := len(where.path) - 1; i >= 0; i-- {
			inner = mapping(where.path[i], inner)
		}
		doc.Content = append(doc.Content, inner.Content...)
		if _, err := io.WriteString(w, "---\n"); err != nil {
			return err
		}
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		if err := enc.Encode(doc); err != nil {
			return err
		}
		if err := enc.Close(); err != nil {
			return err
		}
	}
	if n == 0 {
		_, err := io.WriteString(w, "# no recommendation changes a workload\n")
		return err
	}
	return nil
}
