package agent_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/server/servertest"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simagent"
)

// Tests that only wait on an exporter of their own (its own port and
// simulated node) run at once (t.Parallel); those that count goroutines,
// measure latency, send signals or set the environment run alone.

// The shared helpers of servertest under the names these tests use.
type syncBuffer = servertest.SyncBuffer

const waitTimeout = servertest.WaitTimeout

var (
	pollUntil = servertest.PollUntil
	waitUntil = servertest.WaitUntil
	get       = servertest.Get
)

// The exit codes under the names these tests use.
const (
	exitOK    = agent.ExitOK
	exitError = agent.ExitError
	exitUsage = agent.ExitUsage
)

// simulated, as an argument of run, picks the simulated node's binary: it
// is a flag of neither binary and is dropped before parsing.
const simulated = "--simulate"

// run runs the command in process: gpu-pool-exporter-sim where args hold
// simulated or one of its own flags (--simulate.*), else the agent, which
// links no simulation.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if slices.ContainsFunc(args, func(a string) bool { return a == simulated || strings.HasPrefix(a, "--simulate.") }) {
		return runSim(ctx, slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == simulated }), stdout, stderr)
	}
	return agent.Run(ctx, args, stdout, stderr, nil)
}

// runSim runs gpu-pool-exporter-sim in process.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return agent.Run(ctx, args, stdout, stderr, simagent.New())
}

// waitFor waits until url answers status and returns the body.
func waitFor(t *testing.T, url string, status int) string {
	t.Helper()
	var body string
	var err error
	if !pollUntil(waitTimeout, func() bool {
		var resp *http.Response
		if resp, err = http.Get(url); err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == status
	}) {
		t.Fatalf("%s did not answer %d in time (last error %v)", url, status, err)
	}
	return body
}
