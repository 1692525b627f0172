package main

import (
	"context"
	"io"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

// runReport is `gpupool report`: GPU-hours allocated, busy and
// idle, and their cost, per namespace, owner or pod label.
func runReport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f rightsizeFlags
	app := newRightsizeApp("report", "Show back GPU use per team: GPU-hours allocated, busy and idle, and their cost, per namespace, owner (workload) or pod label, over the window. A MIG device counts by its slice share, a shared GPU by its replica share. Reads the recordings of gpu-pool-exporter's rules in Prometheus; see docs/rightsizing.md.", stdout, stderr, &f)
	byFlag := app.Flag("by", "Group by namespace, owner (the pod's workload, from kube-state-metrics) or label:<pod label> (kube_pod_labels; allow the label in kube-state-metrics).").Default("namespace").String()
	since := app.Flag("since", "How far back to look (a Prometheus duration).").Default("30d").String()
	if code := app.parse(args, &f); code >= 0 {
		return code
	}
	by, err := rightsize.ParseBy(*byFlag)
	if err != nil {
		return app.fail(exitUsage, err)
	}
	o, prices, notes, code := app.read(ctx, &f, "since", *since)
	if code >= 0 {
		return code
	}
	sb, err := o.Report(by, prices)
	if err != nil {
		return app.fail(exitError, err)
	}
	if len(notes) == 0 {
		notes = unpricedNote(sb.Unpriced)
	}
	if !o.KSM {
		notes = append(notes, noKSMNote)
	}
	sr := &rightsize.ShowbackReport{At: o.Window.End.UTC(), Window: *since, Showback: sb, Notes: notes}
	if sr.Notes == nil {
		sr.Notes = []string{}
	}
	return app.finish(stdout, &f, sr, sr.Notes)
}
