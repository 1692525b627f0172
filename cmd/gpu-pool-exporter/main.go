// Command gpu-pool-exporter exports GPU, pod-allocation and fragmentation
// metrics of one Kubernetes GPU node to Prometheus.
//
// Exit codes:
//
//	0  clean shutdown (SIGTERM, interrupt), --help or --version
//	1  the machine failed it: no NVML, a port in use, a setup step that
//	   could not be done (temporary files, a client), a server that failed
//	2  what the user wrote is wrong: a flag, the scenario, the price file,
//	   the web config
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/cmd/gpu-pool-exporter/internal/server"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
)

// DefaultPort is registered to no other GPU exporter (dcgm-exporter: 9400,
// nvidia_gpu_exporter: 9835, nvidia_gpu_prometheus_exporter: 9445).
const DefaultPort = "9947"

// Exit codes (see the package comment and --help): exitUsage only for what
// the user wrote, so that a wrapper or an operator can tell a typo, to fix,
// from a node that cannot run the exporter now, to retry or investigate.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// inputError marks an error in what the user wrote (exit 2) among start-up
// errors, which are otherwise the machine's (exit 1).
type inputError struct{ error }

func (e inputError) Unwrap() error { return e.error }

// exitCode is exitUsage for an inputError, else exitError.
func exitCode(err error) int {
	if errors.As(err, new(inputError)) {
		return exitUsage
	}
	return exitError
}

func init() {
	// Log durations with their unit ("took":"15.99ms"), never a bare number.
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	stampVersion()
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// subcommands are the commands other than serving, by their first word.
var subcommands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) int{
	"status":    runStatus,
	"fleet":     runFleet,
	"recommend": runRecommend,
	"report":    runReport,
}

// run is main without os.Exit, for tests. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if sub, ok := subcommands[args[0]]; ok {
			return sub(ctx, args[1:], stdout, stderr)
		}
	}
	c, code, err := parseConfig(args, stdout, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v (see --help)\n", err)
		return code
	}
	if c == nil {
		return exitOK // --help or --version
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	// SIGHUP would end the process without a shutdown; it reloads the web
	// config instead.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := start(ctx, c, hup, newLogger(c, stderr)); err != nil {
		fmt.Fprintf(stderr, "gpu-pool-exporter: %v\n", err)
		return exitCode(err)
	}
	return exitOK
}

// start builds the exporter from its parts, in the order that fails
// fastest, and serves until ctx is done (nil) or something fails.
func start(ctx context.Context, c *config, hup <-chan os.Signal, log zerolog.Logger) error {
	if c.webConfig != nil {
		defer c.webConfig.Close()
	}
	ls, err := server.Listen(c.listen)
	if err != nil {
		return err
	}
	defer ls.Close()
	src, err := nodeSources(c, log)
	if err != nil {
		return err
	}
	// NVML is initialised once, by the sampler, in the background: the
	// listeners above serve /healthz at once and /readyz says what the
	// exporter waits for.
	node, err := collector.Assemble(nodeConfig(c, log), src)
	if err != nil {
		return err
	}
	defer node.Close()

	// Everything started from here stops with runCtx and is waited for
	// (before node.Close, deferred above).
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer waitStopped(&wg, log)
	defer cancel()
	node.Start(runCtx, &wg)
	log.Info().Str("version", version.Version).Str("revision", version.GetRevision()).
		Bool("simulated", c.simulate).Dur("interval", c.interval).Msg("starting gpu-pool-exporter")
	return serve(runCtx, c, node.Exporter, ls, hup, log)
}

// stopWait bounds how long the exporter waits at exit for its background
// work. An NVML call stuck in the driver (a GPU hung holding the driver's
// lock) never returns: waiting for it would keep the pod Terminating until
// the kubelet kills it.
const stopWait = 5 * time.Second

// waitStopped waits for wg up to stopWait, then abandons what still runs.
// NVML is not shut down under such a call: Sampler.Close checks, and logs
// the calls it abandons.
func waitStopped(wg *sync.WaitGroup, log zerolog.Logger) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(stopWait):
		log.Warn().Dur("waited", stopWait).Msg("background work did not stop in time (a call blocked in the driver: a GPU hung in it, or a driver-wide stall): exiting without it")
	}
}
