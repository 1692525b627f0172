package status

import (
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one line of the table: a holder of a unit, a free unit, or the
// processes of a unit that run in no pod.
type Row struct {
	GPU, Unit, Replicas, Holder string
	Namespace, Pod, Container   string // empty on free, outside-pods and MPS server rows
	Kind                        string // holder, user (uses without holding), free, outside, mps-server
	VRAM, Activity, Idle        string
	Health                      string // on the GPU's first row
	Model, Device, UUID         string // on the GPU's first row
	HealthOK, Up, IsIdle        bool
}

// Rows flattens the status into table rows, GPU by GPU.
func (n *Node) Rows() []Row {
	var rows []Row
	for _, g := range n.GPUs {
		first := true
		add := func(r Row) {
			r.GPU = strconv.Itoa(g.Index)
			r.Up = g.Up
			if first {
				r.Model, r.Device, r.UUID = g.Model, g.Device, g.UUID
				r.Health = healthText(g)
				r.HealthOK = g.Up && g.Health.OK()
				first = false
			}
			rows = append(rows, r)
		}
		for _, u := range g.Units {
			unit := u.Name()
			if u.Shared {
				unit += " (shared)"
			}
			if len(u.Holders) == 0 {
				add(Row{Unit: unit, Kind: "free", Holder: "(free)", VRAM: bytesOf(u.MemoryUsedBytes, u.MemoryTotalBytes), Activity: ratioOf(u.Activity, ""), Idle: "-"})
			}
			for _, h := range u.Holders {
				r := Row{Unit: unit, Kind: "holder", Holder: h.Ref(), Namespace: h.Namespace, Pod: h.Pod, Container: h.Container,
					Replicas: replicas(h.Replicas), VRAM: bytesOf(h.MemoryUsedBytes, nil), Activity: ratioOf(h.Activity, h.ActivitySource),
					Idle: idleText(h), IsIdle: h.Idle}
				if !h.Holding {
					r.Kind = "user"
					r.Holder += " (not holding)"
				}
				add(r)
			}
			if u.OutsidePodsMemoryBytes != nil && (*u.OutsidePodsMemoryBytes > 0 || u.OutsidePodsProcesses > 0) {
				add(Row{Unit: unit, Kind: "outside", Holder: fmt.Sprintf("(outside pods: %d processes)", u.OutsidePodsProcesses),
					VRAM: bytesOf(u.OutsidePodsMemoryBytes, nil), Activity: "-", Idle: "-"})
			}
			if u.MPSServerMemoryBytes != nil {
				add(Row{Unit: unit, Kind: "mps-server", Holder: "(MPS server)", VRAM: bytesOf(u.MPSServerMemoryBytes, nil), Activity: "-", Idle: "-"})
			}
		}
		if len(g.Units) == 0 {
			add(Row{Unit: "gpu", Kind: "free", Holder: "-", VRAM: "-", Activity: "-", Idle: "-"})
		}
	}
	return rows
}

func healthText(g GPU) string {
	if !g.Up {
		return "DOWN"
	}
	if g.Health.OK() {
		return "ok"
	}
	return g.Health.Problems
}

func replicas(r []int) string {
	if len(r) == 0 {
		return "-"
	}
	s := make([]string, len(r))
	for i, v := range r {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func bytesOf(used, total *float64) string {
	if used == nil {
		return "-"
	}
	if total != nil && *total > 0 {
		return fmt.Sprintf("%.1f / %.1f GiB", *used/(1<<30), *total/(1<<30))
	}
	return fmt.Sprintf("%.1f GiB", *used/(1<<30))
}

func ratioOf(v *float64, source string) string {
	if v == nil {
		return "-"
	}
	s := fmt.Sprintf("%.0f%%", *v*100)
	if source != "" {
		s += " (" + source + ")"
	}
	return s
}

func idleText(h Holder) string {
	switch {
	case h.Idle:
		return "idle " + Duration(h.QuietSeconds)
	case h.QuietSeconds > 0:
		return "quiet " + Duration(h.QuietSeconds)
	case h.Activity == nil:
		return "unknown"
	default:
		return "busy"
	}
}

// Duration is a short human duration: 45s, 12m, 3h05m, 2d4h.
func Duration(sec float64) string {
	d := time.Duration(sec * float64(time.Second))
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// Text prints the table for a terminal.
func (n *Node) Text(w io.Writer) error {
	fmt.Fprintf(w, "node %s", orDash(n.Node))
	if n.Simulated {
		fmt.Fprint(w, " (simulated)")
	}
	fmt.Fprintf(w, ", driver %s, CUDA %s, sample %s, process accounting %s, pod map %s\n",
		orDash(n.Driver), orDash(n.CUDA), n.SampleTime.UTC().Format(time.RFC3339), orDash(n.Processes), orDash(n.PodMap))
	if n.NVML != "" && n.NVML != "ok" {
		fmt.Fprintf(w, "NVML: %s\n", n.NVML)
	}
	if n.XIDEvents != "" {
		fmt.Fprintf(w, "XID events: %s\n", n.XIDEvents)
	}
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tUNIT\tREPLICA\tNAMESPACE/POD/CONTAINER\tVRAM\tACTIVITY\tIDLE\tHEALTH")
	for _, r := range n.Rows() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.GPU, r.Unit, r.Replicas, r.Holder, r.VRAM, r.Activity, r.Idle, r.Health)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

var pageTmpl = template.Must(template.New("page").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpu-pool-exporter{{with .N.Node}} on {{.}}{{end}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-top:1em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f3f3}
tr.free td{color:#777}tr.outside td,tr.mps-server td{color:#555;font-style:italic}
tr.gpu-first td{border-top:2px solid #888}
.bad{color:#b00;font-weight:bold}.ok{color:#070}.idle{color:#a60;font-weight:bold}
.num{text-align:right;font-variant-numeric:tabular-nums}
</style></head><body>
<h1>Who is on this GPU{{with .N.Node}}: {{.}}{{end}}</h1>
<p>gpu-pool-exporter {{.N.Version}}{{if .N.Simulated}} &mdash; <b>simulated GPU node</b>{{end}}.
Driver {{.N.Driver}}, CUDA {{.N.CUDA}}. Sample taken <time datetime="{{.Time}}">{{.Time}}</time>;
process accounting: <span id="process-accounting">{{.N.Processes}}</span>; pod map: <span id="pod-map">{{.N.PodMap}}</span>.</p>
{{with .N.NVML}}<p>NVML: <span id="nvml"{{if ne . "ok"}} class="bad"{{end}}>{{.}}</span>{{with $.N.XIDEvents}}; XID events: <span id="xid-events">{{.}}</span>{{end}}.</p>{{end}}
<p><a href="metrics">/metrics</a> &middot; <a href="status.json">/status.json</a> (this table, for <code>gpupool status</code>) &middot; <a href="healthz">/healthz</a> &middot; <a href="readyz">/readyz</a>. This page is rendered once per sample.</p>
<table id="holders">
<thead><tr><th>GPU</th><th>Unit</th><th>Replica</th><th>Namespace/pod/container</th><th>VRAM</th><th>Activity</th><th>Idle</th><th>Health</th></tr></thead>
<tbody>
{{range .Rows}}<tr class="{{.Kind}}{{if .Health}} gpu-first{{end}}" data-gpu="{{.GPU}}"{{if .Pod}} data-namespace="{{.Namespace}}" data-pod="{{.Pod}}" data-container="{{.Container}}"{{end}}>
<td class="gpu">{{.GPU}}{{if .Model}}<br><small>{{.Model}}{{with .Device}}, {{.}}{{end}}</small>{{end}}</td><td>{{.Unit}}</td><td>{{.Replicas}}</td><td class="holder">{{.Holder}}</td><td class="vram num">{{.VRAM}}</td><td class="activity num">{{.Activity}}</td><td class="idle-for{{if .IsIdle}} idle{{end}}">{{.Idle}}</td><td class="health{{if .Health}}{{if .HealthOK}} ok{{else}} bad{{end}}{{end}}">{{.Health}}</td></tr>
{{else}}<tr><td colspan="8">no GPUs</td></tr>{{end}}
</tbody></table>
</body></html>
`))

// HTML writes the landing page.
func (n *Node) HTML(w io.Writer) error {
	return pageTmpl.Execute(w, struct {
		N    *Node
		Time string
		Rows []Row
	}{n, n.SampleTime.UTC().Format(time.RFC3339), n.Rows()})
}
