package agent

import (
	"github.com/alecthomas/kingpin/v2"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
)

// A Simulation stands in for the node: the driver's library, the kubelet
// and the host. The simulated node's own binary (cmd/gpu-pool-exporter-sim)
// passes one to Run; the agent passes none, so it links no simulation.
type Simulation interface {
	// Name and Help name the binary and head its --help.
	Name() string
	Help() string
	// AddFlags adds the simulation's own flags to the agent's.
	AddFlags(app *kingpin.Application)
	// Check reads what its flags name, after the agent's flags are
	// checked into c: what it returns is kept as Config.Simulation. Its
	// errors are the user's unless marked otherwise.
	Check(c *Config) (any, error)
	// Sources are the simulated node's sources for c. A source the user
	// named with a flag (a kubelet socket, a host /proc) stays the real
	// one: Sources may call RealKube and Processes for those.
	Sources(c *Config, log zerolog.Logger) (collector.Sources, error)
}
