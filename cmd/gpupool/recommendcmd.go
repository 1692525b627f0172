package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

// runRecommend is `gpupool recommend`: a GPU shape per workload
// from what it used over the window.
func runRecommend(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f rightsizeFlags
	f.formats = rightsize.RecommendFormats
	app := newRightsizeApp("recommend", "Recommend a GPU shape per workload (keep, a MIG profile, a time-sliced share, another accelerator, or release) that a node pool of the cluster serves, from its peak VRAM and activity percentile over the window, with the monthly saving at the configured prices. Every workload that held a GPU in the window gets a row, finished Jobs included. Reads the recordings of gpu-pool-exporter's rules in Prometheus; see docs/rightsizing.md.", stdout, stderr, &f)
	app.Flag("output", "Output format: table, csv, json, or yaml (per workload, the resources and nodeSelector change a person would apply; never applied).").Short('o').Default("table").StringVar(&f.output)
	windowFlag := app.Flag("window", "How far back to look: the workload's peak and percentile are over this window (a Prometheus duration).").Default("7d").String()
	headroomFlag := app.Flag("headroom", "Margin over the peak VRAM and the activity percentile that the recommended shape must hold (0.2: 20%).").Default("0.2").String()
	idleThresholdFlag := app.Flag("idle.threshold", "Activity below which a device counts as idle; a device under it for the whole window is given back.").Default("0.05").String()
	percentileFlag := app.Flag("percentile", "Percentile of the per-minute activity a shape must hold (95: all but the busiest 5% of minutes; 100: the busiest minute).").Default("95").String()
	minCoverageFlag := app.Flag("min-coverage", "Part of the window (0-1) a workload's data must cover, from its first minute to the window's end less its longest gap, for a recommendation; under it the row says insufficient data with the figure.").Default(strconv.FormatFloat(rightsize.DefaultMinCoverage, 'g', -1, 64)).String()
	allowNew := app.Flag("allow-new-pools", "Also recommend shapes no node pool of the cluster serves (another MIG partition size, time-sharing with other replicas, an accelerator the cluster lacks), naming the labels of the pool to create.").Bool()
	if code := app.parse(args, &f); code >= 0 {
		return code
	}
	numbers := map[string]float64{}
	for _, fl := range []struct {
		name  string
		value *string
	}{{"headroom", headroomFlag}, {"idle.threshold", idleThresholdFlag}, {"percentile", percentileFlag}, {"min-coverage", minCoverageFlag}} {
		v, err := strconv.ParseFloat(*fl.value, 64)
		if err != nil {
			return app.fail(exitUsage, fmt.Errorf("--%s=%s: want a number", fl.name, *fl.value))
		}
		numbers[fl.name] = v
	}
	headroom, idleThreshold, percentile, minCoverage := ptr(numbers["headroom"]), ptr(numbers["idle.threshold"]), ptr(numbers["percentile"]), ptr(numbers["min-coverage"])
	if *headroom < 0 || *headroom > 10 {
		return app.fail(exitUsage, fmt.Errorf("--headroom=%v: want a fraction from 0 to 10 (0.2 is 20%%)", *headroom))
	}
	if *idleThreshold < 0 || *idleThreshold > 1 {
		return app.fail(exitUsage, fmt.Errorf("--idle.threshold=%v: want a ratio from 0 to 1", *idleThreshold))
	}
	if !(*percentile > 0 && *percentile <= 100) {
		return app.fail(exitUsage, fmt.Errorf("--percentile=%v: want a percentile above 0 and at most 100 (95 is the 95th)", *percentile))
	}
	if !(*minCoverage >= 0 && *minCoverage <= 1) {
		return app.fail(exitUsage, fmt.Errorf("--min-coverage=%v: want a fraction of the window from 0 to 1 (0.8 is 80%%)", *minCoverage))
	}
	o, prices, notes, code := app.read(ctx, &f, "window", *windowFlag, *percentile/100)
	if code >= 0 {
		return code
	}
	rows := o.Recommend(rightsize.RecommendOptions{Headroom: *headroom, IdleThreshold: *idleThreshold, Prices: prices,
		MinCoverage: *minCoverage, AllowNewPools: *allowNew})
	notes = recommendNotes(notes, rows, o.KSM)
	rs := &rightsize.Recommendations{At: o.Window.End.UTC(), Window: *windowFlag, Headroom: *headroom, Percentile: *percentile,
		MinCoverage: *minCoverage, AllowNewPools: *allowNew, Workloads: rows, Notes: notes}
	if rs.Workloads == nil {
		rs.Workloads = []rightsize.Row{}
	}
	if rs.Notes == nil {
		rs.Notes = []string{}
	}
	return app.finish(stdout, &f, rs, rs.Notes)
}

// recommendNotes are the notes under the recommendations: those of the
// prices (none at all), else the models without a price, whatever else
// is said; and that workloads are pods where kube-state-metrics is
// missing.
func recommendNotes(priceNotes []string, rows []rightsize.Row, ksm bool) []string {
	notes := priceNotes
	if len(notes) == 0 {
		var unpriced []string
		for _, r := range rows {
			if r.MonthlySaving == nil && r.Recommendation != rightsize.InsufficientData {
				unpriced = append(unpriced, r.Model)
			}
		}
		notes = unpricedNote(dedupe(unpriced))
	}
	if !ksm {
		notes = append(notes, noKSMNote)
	}
	return notes
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

func ptr(v float64) *float64 { return &v }
