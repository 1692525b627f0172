package main

import (
	"context"
	"fmt"
	"io"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

// runRecommend is `gpupool recommend`: a GPU shape per workload
// from what it used over the window.
func runRecommend(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f rightsizeFlags
	app := newRightsizeApp("recommend", "Recommend a GPU shape per workload (keep, a MIG profile, a time-sliced share, another accelerator, or release) from its peak VRAM and p95 activity over the window, with the monthly saving at the configured prices. Reads the recordings of gpu-pool-exporter's rules in Prometheus; see docs/rightsizing.md.", stdout, stderr, &f)
	windowFlag := app.Flag("window", "How far back to look: the workload's peak and p95 are over this window (a Prometheus duration).").Default("7d").String()
	headroom := app.Flag("headroom", "Margin over the peak VRAM and the p95 activity that the recommended shape must hold (0.2: 20%).").Default("0.2").Float64()
	idleThreshold := app.Flag("idle.threshold", "Activity below which a device counts as idle; a device under it for the whole window is given back.").Default("0.05").Float64()
	if code := app.parse(args, &f); code >= 0 {
		return code
	}
	if *headroom < 0 || *headroom > 10 {
		return app.fail(exitUsage, fmt.Errorf("--headroom=%v: want a fraction from 0 to 10 (0.2 is 20%%)", *headroom))
	}
	if *idleThreshold < 0 || *idleThreshold > 1 {
		return app.fail(exitUsage, fmt.Errorf("--idle.threshold=%v: want a ratio from 0 to 1", *idleThreshold))
	}
	o, prices, notes, code := app.read(ctx, &f, "window", *windowFlag)
	if code >= 0 {
		return code
	}
	if !o.KSM {
		notes = append(notes, noKSMNote)
	}
	rows := o.Recommend(rightsize.RecommendOptions{Headroom: *headroom, IdleThreshold: *idleThreshold, Prices: prices})
	if len(notes) == 0 {
		var unpriced []string
		for _, r := range rows {
			if r.MonthlySaving == nil && r.Recommendation != rightsize.InsufficientData {
				unpriced = append(unpriced, r.Model)
			}
		}
		notes = unpricedNote(dedupe(unpriced))
	}
	rs := &rightsize.Recommendations{At: o.Window.End.UTC(), Window: *windowFlag, Headroom: *headroom, Workloads: rows, Notes: notes}
	if rs.Workloads == nil {
		rs.Workloads = []rightsize.Row{}
	}
	if rs.Notes == nil {
		rs.Notes = []string{}
	}
	return app.finish(stdout, &f, rs, rs.Notes)
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
