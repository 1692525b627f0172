// Command gpupool answers people's questions about GPU node pools, as
// promtool and amtool do for Prometheus and Alertmanager: who is on each GPU
// of a running exporter (status), and, from the recording rules in
// Prometheus, the fleet's free capacity and idle cost (fleet), a GPU shape
// per workload (recommend) and GPU-hours and cost per team (report).
//
// It links the analytics (analytics/...) and the status document's decoder,
// never the node agent: the DaemonSet's binary is gpu-pool-exporter.
//
// Exit codes:
//
//	0  the answer was printed, or --help
//	1  the exporter or Prometheus could not be reached or answered wrongly
//	2  what the user wrote is wrong: a command, a flag, a price file
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/common/version"
)

// Exit codes (see the package comment): exitUsage only for what the user
// wrote.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// commands are gpupool's commands, by their first word.
var commands = map[string]struct {
	run  func(ctx context.Context, args []string, stdout, stderr io.Writer) int
	help string
}{
	"status":    {runStatus, "who is on each GPU of a running exporter (its /status.json)"},
	"fleet":     {runFleet, "free capacity, idle cost and GPUs to replace, from the recording rules in Prometheus"},
	"recommend": {runRecommend, "a GPU shape per workload from its use over a window"},
	"report":    {runReport, "GPU-hours and cost per namespace, owner or pod label"},
}

// run is main without os.Exit, for tests. It returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		usage(stdout)
		return exitOK
	case "--version", "version":
		fmt.Fprintln(stdout, version.Print("gpupool"))
		return exitOK
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "gpupool: unknown command %q: want one of %s (gpupool --help)\n", args[0], strings.Join(commandNames(), ", "))
		return exitUsage
	}
	return cmd.run(ctx, args[1:], stdout, stderr)
}

func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: gpupool <command> [flags]  (gpupool <command> --help for its flags)")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, n := range commandNames() {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].help)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Exit codes: 0 the answer was printed or --help; 1 the exporter or Prometheus could not be reached or answered wrongly; 2 what you wrote is wrong (a command, a flag, a price file).")
}
