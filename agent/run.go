package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/version"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server"
)

func init() {
	// Log durations with their unit ("took":"15.99ms"), never a bare number.
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
	stampVersion()
}

// gcPercent is the agent's GOGC unless the environment sets one: its live
// heap is 2-3 MiB, so a collection at half of it again instead of all of
// it keeps about 1.3 MiB less resident, for about 0.3 ms of CPU per
// second at a one-second interval (docs/performance.md, "The binary and
// its memory at rest"). Under load GOMEMLIMIT (the chart sets it) bounds
// the heap either way.
const gcPercent = 50

// setGCPercent applies gcPercent where GOGC is not set.
func setGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}

// peopleCommands are gpupool's commands, which the agent once answered
// itself: given one, the agent says where it went.
var peopleCommands = []string{"status", "fleet", "recommend", "report"}

// Run is the command: it parses args (with sim's flags where sim is not
// nil), serves until ctx is done, SIGTERM or an interrupt, and returns the
// exit code.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, sim Simulation) int {
	name := "gpu-pool-exporter"
	if sim != nil {
		name = sim.Name()
	}
	if len(args) > 0 && slices.Contains(peopleCommands, args[0]) {
		fmt.Fprintf(stderr, "%s: %q is a command of gpupool, the command for people the image ships beside the agent: run gpupool %s (kubectl exec ds/gpu-pool-exporter -- gpupool %s)\n", name, args[0], args[0], args[0])
		return ExitUsage
	}
	if sim == nil {
		if a := simulationFlag(args); a != "" {
			fmt.Fprintf(stderr, "%s: %s: the simulated node is a binary of its own, so that the agent carries no simulator: run gpu-pool-exporter-sim (make run; in the image /gpu-pool-exporter-sim) with the same flags\n", name, a)
			return ExitUsage
		}
	}
	setGCPercent()
	c, code, err := ParseConfig(args, stdout, stderr, sim)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v (see --help)\n", name, err)
		return code
	}
	if c == nil {
		return ExitOK // --help or --version
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	// SIGHUP would end the process without a shutdown; it reloads the web
	// config instead.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := start(ctx, c, sim, hup, NewLogger(c, stderr)); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return exitCode(err)
	}
	return ExitOK
}

// simulationFlag is the first argument that asks the agent for the
// simulated node (--simulate, --simulate.scenario=...), or "".
func simulationFlag(args []string) string {
	for _, a := range args {
		if a == "--" {
			return ""
		}
		if a == "--simulate" || strings.HasPrefix(a, "--simulate.") || strings.HasPrefix(a, "--simulate=") {
			return a
		}
	}
	return ""
}

// start builds the exporter from its parts, in the order that fails
// fastest, and serves until ctx is done (nil) or something fails.
func start(ctx context.Context, c *Config, sim Simulation, hup <-chan os.Signal, log zerolog.Logger) error {
	if c.WebConfig != nil {
		defer c.WebConfig.Close()
	}
	ls, err := server.Listen(c.Listen)
	if err != nil {
		return err
	}
	defer ls.Close()
	src, err := nodeSources(c, sim, log)
	if err != nil {
		return err
	}
	// NVML is initialised once, by the sampler, in the background: the
	// listeners above serve /healthz at once and /readyz says what the
	// exporter waits for.
	node, err := collector.Assemble(nodeConfig(c, sim != nil, log), src)
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
		Bool("simulated", sim != nil).Dur("interval", c.Interval).Msg("starting gpu-pool-exporter")
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
