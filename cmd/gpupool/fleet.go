package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/alecthomas/kingpin/v2"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/fleet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/promapi"
)

// runFleet is `gpupool fleet`: the fleet's capacity, idle cost and
// replacements from the recorded series of a Prometheus (or anything that
// serves its query API).
func runFleet(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	app := kingpin.New("gpupool fleet", "Print, from the recording rules in Prometheus, per node pool and zone the free GPUs and the jobs of each task shape that fit, the idle holders that cost most, and the GPUs recommended for replacement.")
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	var done bool
	app.Terminate(func(int) { done = true })
	prom := promapi.AddFlags(app, "30s")
	output := app.Flag("output", "Output format: table or json.").Short('o').Default("table").String()
	top := app.Flag("top", "How many idle holders to list, the most costly first.").Default("10").Int()
	if _, err := app.Parse(args); err != nil {
		fmt.Fprintf(stderr, "gpupool fleet: %v (see --help)\n", err)
		return exitUsage
	}
	if done {
		return exitOK
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "gpupool fleet: --output=%s: want table or json\n", *output)
		return exitUsage
	}
	if *top < 1 {
		fmt.Fprintf(stderr, "gpupool fleet: --top=%d: want at least 1\n", *top)
		return exitUsage
	}
	c, err := prom.NewClient()
	if err != nil {
		fmt.Fprintf(stderr, "gpupool fleet: %v\n", err)
		return exitUsage
	}
	c.Warnings = stderr
	ctx, cancel := prom.Context(ctx)
	defer cancel()
	f, err := fleet.Read(ctx, c, *top)
	if err != nil {
		fmt.Fprintf(stderr, "gpupool fleet: %v\n", err)
		return exitError
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(f)
	} else {
		err = f.Text(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpupool fleet: %v\n", err)
		return exitError
	}
	return exitOK
}
