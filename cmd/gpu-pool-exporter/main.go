// Command gpu-pool-exporter exports GPU, pod-allocation and fragmentation
// metrics of one Kubernetes GPU node to Prometheus.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/prometheus/common/version"
	"github.com/prometheus/exporter-toolkit/web"
	"github.com/prometheus/exporter-toolkit/web/kingpinflag"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
)

// DefaultPort is registered to no other GPU exporter (dcgm-exporter: 9400,
// nvidia_gpu_exporter: 9835, nvidia_gpu_prometheus_exporter: 9445).
const DefaultPort = "9947"

// options are the parsed flags.
type options struct {
	web             *web.FlagConfig
	interval        time.Duration
	deviceTimeout   time.Duration
	nvmlLibrary     string
	simulate        bool
	simulateSeed    int64
	simulateFile    string
	logLevel        string
	logFormat       string
	nodeName        string
	maxRequests     int
	shutdownTimeout time.Duration
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// exit codes
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

type terminated struct{}

func parseFlags(args []string, stdout, stderr io.Writer) (o *options, code int, err error) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(terminated); !ok {
				panic(r)
			}
			o, code, err = nil, exitOK, nil
		}
	}()
	app := kingpin.New("gpu-pool-exporter", "Prometheus exporter for Kubernetes GPU nodes: NVML/DCGM telemetry, GPU-to-pod mapping, idle allocations and fragmentation.")
	app.Version(version.Print("gpu-pool-exporter"))
	app.HelpFlag.Short('h')
	app.UsageWriter(stdout)
	app.ErrorWriter(stderr)
	// --help and --version end parsing through Terminate; kingpin would
	// call os.Exit, which tests cannot survive.
	app.Terminate(func(int) { panic(terminated{}) })
	o = &options{}
	o.web = kingpinflag.AddFlags(app, ":"+DefaultPort)
	named(app.Flag("collect-interval", "How often GPUs are sampled and /metrics is re-rendered (at least 1s).").Default("5s")).DurationVar(&o.interval)
	named(app.Flag("nvml.device-timeout", "How long one sample waits for one GPU before reporting it down (at most the collect interval).").Default("2s")).DurationVar(&o.deviceTimeout)
	app.Flag("nvml.library", "Path of libnvidia-ml.so.1; empty searches LD_LIBRARY_PATH (on GKE: /usr/local/nvidia/lib64/libnvidia-ml.so.1).").Default("").StringVar(&o.nvmlLibrary)
	app.Flag("simulate", "Run on a built-in simulated GPU node instead of real GPUs.").BoolVar(&o.simulate)
	named(app.Flag("simulate.seed", "Seed of the simulated node's telemetry and UUIDs.").Default("1")).Int64Var(&o.simulateSeed)
	app.Flag("simulate.scenario", "YAML scenario for the simulated node (implies --simulate).").Default("").StringVar(&o.simulateFile)
	named(app.Flag("log.level", "Log level: debug, info, warn, error.").Default("info")).EnumVar(&o.logLevel, "debug", "info", "warn", "error")
	named(app.Flag("log.format", "Log format: json or console.").Default("json")).EnumVar(&o.logFormat, "json", "console")
	app.Flag("node-name", "Kubernetes node name, for logs and the landing page.").Envar("NODE_NAME").Default("").StringVar(&o.nodeName)
	named(app.Flag("web.max-requests", "Maximum number of concurrent scrapes; more are answered 503 at once (0 = no limit).").Default("40")).IntVar(&o.maxRequests)
	named(app.Flag("web.shutdown-timeout", "How long to wait for scrapes in flight at SIGTERM.").Default("5s")).DurationVar(&o.shutdownTimeout)
	if _, err := app.Parse(args); err != nil {
		return nil, exitUsage, err
	}
	if o.interval < collector.MinInterval {
		return nil, exitUsage, fmt.Errorf("--collect-interval=%s is too short: it must be at least %s", o.interval, collector.MinInterval)
	}
	if o.deviceTimeout <= 0 || o.deviceTimeout > o.interval {
		return nil, exitUsage, fmt.Errorf("--nvml.device-timeout=%s must be above 0 and at most --collect-interval (%s)", o.deviceTimeout, o.interval)
	}
	if o.maxRequests < 0 {
		return nil, exitUsage, fmt.Errorf("--web.max-requests=%d must be 0 (no limit) or more", o.maxRequests)
	}
	if o.simulateFile != "" {
		o.simulate = true
	}
	return o, exitOK, nil
}

// named makes a flag's value errors name the flag: kingpin alone says only
// "time: invalid duration".
func named(fc *kingpin.FlagClause) *namedFlag { return &namedFlag{fc} }

type namedFlag struct{ fc *kingpin.FlagClause }

func (n *namedFlag) wrap() {
	m := n.fc.Model()
	n.fc.SetValue(namedValue{name: m.Name, Value: m.Value})
}

func (n *namedFlag) DurationVar(t *time.Duration)         { n.fc.DurationVar(t); n.wrap() }
func (n *namedFlag) IntVar(t *int)                        { n.fc.IntVar(t); n.wrap() }
func (n *namedFlag) Int64Var(t *int64)                    { n.fc.Int64Var(t); n.wrap() }
func (n *namedFlag) EnumVar(t *string, options ...string) { n.fc.EnumVar(t, options...); n.wrap() }

type namedValue struct {
	name string
	kingpin.Value
}

func (v namedValue) Set(s string) error {
	if err := v.Value.Set(s); err != nil {
		return fmt.Errorf("--%s=%s: %v", v.name, s, err)
	}
	return nil
}

func newLogger(o *options, w io.Writer) zerolog.Logger {
	var out io.Writer = w
	if o.logFormat == "console" {
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	}
	lvl, _ := zerolog.ParseLevel(o.logLevel)
	return zerolog.New(out).Level(lvl).With().Timestamp().Logger()
}

// run is main without os.Exit, for tests. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, code, err := parseFlags(args, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v (see --help)\n", err)
		return code
	}
	if o == nil {
		return exitOK // --help or --version
	}
	log := newLogger(o, stderr)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()

	lib, err := openNVML(o, log)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitError
	}
	sampler, err := collector.NewNVMLSampler(lib, collector.SamplerConfig{DeviceTimeout: o.deviceTimeout, Log: log})
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitError
	}
	defer sampler.Close()
	exp, err := collector.New(collector.Config{Interval: o.interval, Log: log, RuntimeMetrics: true}, sampler)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitUsage
	}
	d := sampler.Driver()
	log.Info().Str("version", version.Version).Str("driver", d.DriverVersion).Str("cuda", d.CUDADriverVersion).
		Bool("simulated", o.simulate).Dur("interval", o.interval).Msg("starting gpu-pool-exporter")

	listeners, err := listen(*o.web.WebListenAddresses)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitError
	}
	srv := &http.Server{
		Handler:           newMux(exp, o),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); exp.Run(runCtx) }()

	serveErr := make(chan error, 1)
	slogger := slog.New(zerolog.NewSlogHandler(log))
	go func() { serveErr <- web.ServeMultiple(listeners, srv, o.web, slogger) }()
	for _, l := range listeners {
		log.Info().Str("address", l.Addr().String()).Msg("serving /metrics")
	}

	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	case err := <-serveErr:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("HTTP server failed")
			cancel()
			<-done
			return exitError
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer scancel()
	_ = srv.Shutdown(sctx)
	cancel()
	<-done
	return exitOK
}

func listen(addrs []string) ([]net.Listener, error) {
	var ls []net.Listener
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			for _, x := range ls {
				x.Close()
			}
			return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: %w", a, err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func openNVML(o *options, log zerolog.Logger) (collector.NVML, error) {
	if !o.simulate {
		return collector.NewNVML(o.nvmlLibrary)
	}
	sc := simnode.DefaultScenario()
	if o.simulateFile != "" {
		var err error
		if sc, err = simnode.LoadScenario(o.simulateFile); err != nil {
			return nil, err
		}
	}
	if o.simulateSeed != 1 || sc.Seed == 0 {
		sc.Seed = o.simulateSeed
	}
	node, err := simnode.New(sc)
	if err != nil {
		return nil, err
	}
	log.Warn().Str("model", sc.Node.Model).Int("gpus", sc.Node.Count).Msg("running on a SIMULATED GPU node; no real GPU is read")
	return node, nil
}
