package rightsize

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Formats of -o.
var Formats = []string{"table", "csv", "json"}

// Recommendations is recommend's answer.
type Recommendations struct {
	At        time.Time `json:"at"`
	Window    string    `json:"window"`
	Headroom  float64   `json:"headroom"`
	Workloads []Row     `json:"workloads"`
	Notes     []string  `json:"notes"`
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
	return fmt.Sprintf("peak %s, p95 %s, idle %s", peak, percent(r.P95Activity), percent(r.IdleShare))
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
	case "csv":
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{"namespace", "workload", "pods", "accelerator", "model", "holds", "devices", "peak_memory_bytes", "p95_activity", "idle_share", "idle_devices", "recommendation", "recommended_devices", "monthly_saving_dollars", "reason"})
		for _, r := range rs.Workloads {
			_ = cw.Write([]string{r.Namespace, r.Workload, strconv.Itoa(r.Pods), r.Accelerator, r.Model, r.Holds, strconv.Itoa(r.Devices),
				csvNum(r.PeakMemoryBytes, "%.0f"), csvNum(r.P95Activity, "%.4f"), csvNum(r.IdleShare, "%.4f"), strconv.Itoa(r.IdleDevices),
				r.Recommendation, strconv.Itoa(r.RecommendedDevices), csvNum(r.MonthlySaving, "%.2f"), r.Reason})
		}
		cw.Flush()
		return cw.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tWORKLOAD\tHOLDS\tUSED (PER DEVICE)\tRECOMMENDATION\tSAVING $/MONTH")
	for _, r := range rs.Workloads {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Workload, r.holds(), r.used(), r.recommendation(), optFormat(r.MonthlySaving, "%.2f"))
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

// Write prints the report as a table, CSV or JSON.
func (sr *ShowbackReport) Write(w io.Writer, format string) error {
	switch format {
	case "json":
		return writeJSON(w, sr)
	case "csv":
		cw := csv.NewWriter(w)
		_ = cw.Write([]string{sr.By, "allocated_gpu_hours", "busy_gpu_hours", "idle_gpu_hours", "allocated_cost_dollars", "busy_cost_dollars", "idle_cost_dollars"})
		for _, r := range sr.Rows {
			_ = cw.Write([]string{r.Group, fmt.Sprintf("%.3f", r.AllocatedHours), fmt.Sprintf("%.3f", r.BusyHours), fmt.Sprintf("%.3f", r.IdleHours),
				csvNum(r.AllocatedCost, "%.2f"), csvNum(r.BusyCost, "%.2f"), csvNum(r.IdleCost, "%.2f")})
		}
		cw.Flush()
		return cw.Error()
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tGPU-HOURS\tBUSY GPU-HOURS\tIDLE GPU-HOURS\tCOST $\tBUSY $\tIDLE $\n", strings.ToUpper(sr.By))
	for _, r := range append(append([]ShowbackRow{}, sr.Rows...), sr.Total) {
		fmt.Fprintf(tw, "%s\t%.3f\t%.3f\t%.3f\t%s\t%s\t%s\n", r.Group, r.AllocatedHours, r.BusyHours, r.IdleHours,
			optFormat(r.AllocatedCost, "%.2f"), optFormat(r.BusyCost, "%.2f"), optFormat(r.IdleCost, "%.2f"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return writeNotes(w, sr.Notes)
}
