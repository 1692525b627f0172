package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

// runReport is `gpupool report`: GPU-hours allocated, busy and
// idle, and their cost, per namespace, owner or pod label.
func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f rightsizeFlags
	app := newRightsizeApp("report", "Show back GPU use per team: GPU-hours allocated, busy and idle, and their cost, per namespace, owner (workload) or pod label and per GPU model, over the window, with the GPU-hours no one held by reason, adding up to the bill of every GPU of every node. A MIG device costs the larger of its compute and memory slice shares, a time-sliced GPU's holder its replica. Reads the recordings of gpu-pool-exporter's rules in Prometheus; see docs/rightsizing.md.", stdout, stderr, &f)
	app.Flag("output", "Output format: table, csv or json.").Short('o').Default("table").StringVar(&f.output)
	byFlag := app.Flag("by", "Group by namespace, owner (the pod's workload, from kube-state-metrics) or label:<pod label> (kube_pod_labels; allow the label in kube-state-metrics).").Default("namespace").String()
	since := app.Flag("since", "How far back to look (a Prometheus duration).").Default("30d").String()
	unallocatedFlag := app.Flag("unallocated", "GPU-hours no group held (free GPUs, unheld replicas, free MIG devices, MIG remainders, unhealthy or cordoned): show (rows of their own, by reason) or share (their cost spread over the groups of the model in proportion to their allocated cost, as OpenCost's shared idle).").Default(rightsize.UnallocatedShow).String()
	if code := app.parse(args, &f); code >= 0 {
		return code
	}
	by, err := rightsize.ParseBy(*byFlag)
	if err != nil {
		return app.fail(exitUsage, err)
	}
	mode, err := rightsize.ParseUnallocated(*unallocatedFlag)
	if err != nil {
		return app.fail(exitUsage, err)
	}
	o, prices, notes, code := app.read(ctx, &f, "since", *since, 0)
	if code >= 0 {
		return code
	}
	sb, err := o.Report(by, prices, mode)
	if err != nil {
		return app.fail(exitError, err)
	}
	if len(notes) == 0 {
		notes = unpricedHoursNote(sb)
	}
	if !o.KSM {
		notes = append(notes, noKSMNote)
	}
	if !o.NodeObjects {
		notes = append(notes, noNodeObjectsNote)
	}
	sr := &rightsize.ShowbackReport{At: o.Window.End.UTC(), Window: *since, Showback: sb, Notes: notes}
	if sr.Notes == nil {
		sr.Notes = []string{}
	}
	stderrNotes := sr.Notes
	if f.output == "csv" {
		stderrNotes = append(sb.BillLines(), sr.Notes...)
	}
	return app.finish(stdout, &f, sr, stderrNotes)
}

// unpricedHoursNote names the models without a price and their GPU-hours,
// which the report lists without cost.
func unpricedHoursNote(sb *rightsize.Showback) []string {
	if len(sb.Unpriced) == 0 {
		return nil
	}
	var parts []string
	for _, m := range sb.Unpriced {
		for _, b := range sb.Bill {
			if b.Model == m {
				parts = append(parts, fmt.Sprintf("%s (%.3f GPU-hours)", m, b.Hours))
			}
		}
	}
	return []string{"no price for " + strings.Join(parts, ", ") + ": their hours are listed without cost, and the priced totals leave them out; add them with --idle.price-file or --idle.price"}
}

// noNodeObjectsNote says what the report cannot tell without
// kube-state-metrics' node objects.
const noNodeObjectsNote = "kube-state-metrics' node objects (kube_node_labels) are not in Prometheus: cordons and time-sharing replicas are unknown, so a cordoned node's free GPUs count as free and a time-sliced GPU's holders share it among themselves (no unheld replicas); scrape kube-state-metrics with the node labels of docs/rightsizing.md"
