package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/model"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/promapi"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/fragmentation"
)

// rightsizeFlags are the flags recommend and report share besides
// Prometheus': the window's end, the output format and the prices.
type rightsizeFlags struct {
	prom      *promapi.Flags
	at        string
	output    string
	priceFile string
	priceFlag string
	formats   []string // -o's values; default rightsize.Formats
}

// rightsizeApp is a subcommand's flags and how it reports a failure.
type rightsizeApp struct {
	*kingpin.Application
	name   string
	stderr io.Writer
	done   bool // --help was given
}

func newRightsizeApp(name, help string, stdout, stderr io.Writer, f *rightsizeFlags) *rightsizeApp {
	app := &rightsizeApp{Application: kingpin.New("gpupool "+name, help), name: name, stderr: stderr}
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	app.Terminate(func(int) { app.done = true })
	// Reading a week of recordings takes longer than fleet's instant figures.
	f.prom = promapi.AddFlags(app.Application, "2m")
	app.Flag("at", "End of the window: RFC 3339 time or Unix seconds (default: now).").StringVar(&f.at)
	app.Flag("idle.price-file", "YAML price list, as the exporter's (per GPU-hour by NVML model name, or by GKE accelerator name; see deploy/prices-gke-on-demand.yaml). Default: the exporters' configured prices (gpu_price_dollars_per_hour).").StringVar(&f.priceFile)
	app.Flag("idle.price", "Prices per GPU-hour by model, e.g. \"NVIDIA H100 80GB HBM3=11.06\"; added to --idle.price-file.").StringVar(&f.priceFlag)
	return app
}

// fail prints the error and returns the exit code.
func (a *rightsizeApp) fail(code int, err error) int {
	fmt.Fprintf(a.stderr, "gpupool %s: %v\n", a.name, err)
	return code
}

// parse parses the command line: the exit code to stop with (--help, a
// bad flag), or -1 to go on.
func (a *rightsizeApp) parse(args []string, f *rightsizeFlags) int {
	if _, err := a.Parse(args); err != nil {
		return a.fail(exitUsage, fmt.Errorf("%v (see --help)", err))
	}
	if a.done {
		return exitOK
	}
	if err := f.checkOutput(); err != nil {
		return a.fail(exitUsage, err)
	}
	return -1
}

// read builds the window and the prices and reads the window from
// Prometheus: the observation, the prices and their notes, or the exit
// code to stop with.
func (a *rightsizeApp) read(ctx context.Context, f *rightsizeFlags, flag, length string, quantile float64) (*rightsize.Observation, rightsize.Prices, []string, int) {
	w, err := f.window(flag, length)
	if err != nil {
		return nil, rightsize.Prices{}, nil, a.fail(exitUsage, err)
	}
	list, err := f.prices()
	if err != nil {
		return nil, rightsize.Prices{}, nil, a.fail(exitUsage, err)
	}
	o, err := f.observe(ctx, w, quantile, a.stderr)
	if err != nil {
		return nil, rightsize.Prices{}, nil, a.fail(exitFor(err), err)
	}
	prices, notes := pricesFor(list, o)
	return o, prices, notes, -1
}

// writer is recommend's or report's answer.
type writer interface {
	Write(w io.Writer, format string) error
}

// finish prints the answer; with -o csv, which has no place for them, the
// notes go to standard error.
func (a *rightsizeApp) finish(stdout io.Writer, f *rightsizeFlags, answer writer, notes []string) int {
	if err := answer.Write(stdout, f.output); err != nil {
		return a.fail(exitError, err)
	}
	if f.output == "csv" {
		for _, n := range notes {
			fmt.Fprintf(a.stderr, "gpupool %s: note: %s\n", a.name, n)
		}
	}
	return exitOK
}

// parseWindowFlag reads a Prometheus duration such as 7d or 3m.
func parseWindowFlag(flag, value string) (time.Duration, error) {
	d, err := model.ParseDuration(value)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("--%s=%s: want a Prometheus duration such as 7d, 12h or 30m", flag, value)
	}
	return time.Duration(d), nil
}

// window builds the window ending at --at (or now).
func (f *rightsizeFlags) window(flag, length string) (rightsize.Window, error) {
	l, err := parseWindowFlag(flag, length)
	if err != nil {
		return rightsize.Window{}, err
	}
	end := time.Now()
	if f.at != "" {
		if end, err = parseAt(f.at); err != nil {
			return rightsize.Window{}, err
		}
	}
	return rightsize.Window{End: end, Length: l, Step: rightsize.DefaultStep(l)}, nil
}

func parseAt(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if v, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(v, 0) && !math.IsNaN(v) {
		sec, frac := math.Modf(v)
		return time.Unix(int64(sec), int64(math.Round(frac*1e3))*int64(time.Millisecond)), nil
	}
	return time.Time{}, fmt.Errorf("--at=%s: want an RFC 3339 time (2026-12-01T00:00:00Z) or Unix seconds", s)
}

// prices reads --idle.price-file and --idle.price, as the exporter does.
func (f *rightsizeFlags) prices() (*fragmentation.PriceList, error) {
	extra, err := fragmentation.ParsePriceFlag(f.priceFlag)
	if err != nil {
		return nil, fmt.Errorf("--idle.price=%s: %w", f.priceFlag, err)
	}
	return fragmentation.LoadPrices(f.priceFile, extra)
}

func (f *rightsizeFlags) checkOutput() error {
	formats := f.formats
	if formats == nil {
		formats = rightsize.Formats
	}
	if !slices.Contains(formats, f.output) {
		return fmt.Errorf("--output=%s: want %s", f.output, strings.Join(formats, ", "))
	}
	return nil
}

// observe reads the window from Prometheus, its warnings to warnings; its
// errors are the machine's or the data's (exit 1), explained.
func (f *rightsizeFlags) observe(ctx context.Context, w rightsize.Window, quantile float64, warnings io.Writer) (*rightsize.Observation, error) {
	c, err := f.prom.NewClient()
	if err != nil {
		return nil, usageError{err}
	}
	c.Warnings = warnings
	ctx, cancel := f.prom.Context(ctx)
	defer cancel()
	return rightsize.Observe(ctx, c, w, rightsize.ObserveOptions{Quantile: quantile})
}

// usageError is an error in what the user wrote, found after parsing.
type usageError struct{ error }

// pricesFor is the prices to use and the notes they need.
func pricesFor(list *fragmentation.PriceList, o *rightsize.Observation) (rightsize.Prices, []string) {
	p := rightsize.Prices{List: list, Exporters: o.ExporterPrices}
	var notes []string
	if list == nil && len(o.ExporterPrices) == 0 {
		notes = append(notes, "no prices: the exporters serve no gpu_price_dollars_per_hour and no --idle.price-file or --idle.price was given, so costs and savings are unknown (-)")
	}
	return p, notes
}

// unpricedNote names the models without a price.
func unpricedNote(models []string) []string {
	if len(models) == 0 {
		return nil
	}
	sort.Strings(models)
	return []string{"no price for " + strings.Join(models, ", ") + ": their costs are unknown (-); add them with --idle.price-file or --idle.price"}
}

// noKSMNote says that workloads fell back to pods.
const noKSMNote = "kube-state-metrics' pod objects (kube_pod_owner) are not in Prometheus: each pod is its own workload; scrape kube-state-metrics to group pods by Deployment, StatefulSet, Job, JobSet or LeaderWorkerSet"

// exitFor is the exit code of an error after parsing.
func exitFor(err error) int {
	if errors.As(err, new(usageError)) {
		return exitUsage
	}
	return exitError
}
