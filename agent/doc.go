// Package agent is the node agent: gpu-pool-exporter's command line,
// parsed once and checked into a Config, its wiring of the node's sources
// into the collector, and its serving through the server package's
// defences. Run is the whole command; cmd/gpu-pool-exporter is a thin main
// around it, and the simulated node's binary (cmd/gpu-pool-exporter-sim)
// runs the same with a Simulation standing in for the hardware.
//
// The files, in the order of a run, each using only those before it:
//
//	exit.go        exit codes, and the error that marks the user's
//	               mistakes (exit 2) among the machine's (exit 1)
//	config.go      the flags as given and the Config they are checked into
//	simulation.go  what a simulated node provides in place of the hardware
//	flags.go       the command line: every flag, parsed once (ParseConfig)
//	wiring.go      the node's sources and the collector's configuration
//	routes.go      the endpoints (/metrics, /healthz, /readyz, /, pprof)
//	serve.go       serving them through the server package's defences
//	version.go     what the binary says of its own version
//	run.go         Run: parse, wire, serve until a signal
//
// Exit codes:
//
//	0  clean shutdown (SIGTERM, interrupt), --help or --version
//	1  the machine failed it: no NVML, a port in use, a setup step that
//	   could not be done (temporary files, a client), a server that failed
//	2  what the user wrote is wrong: a flag, the scenario, the price file,
//	   the web config
package agent
