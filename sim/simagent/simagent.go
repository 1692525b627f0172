// Package simagent runs the node agent on a simulated node: it is the
// agent.Simulation of cmd/gpu-pool-exporter-sim (`make run`), which adds
// --simulate.scenario and --simulate.seed to the agent's flags and hands
// the agent the simulation wing's stand-ins (sim.Sources) for the driver,
// the kubelet and the host. The agent itself links none of it.
package simagent

import (
	"fmt"
	"time"

	"github.com/alecthomas/kingpin/v2"
	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// Simulation is the simulated node as the agent's Simulation.
type Simulation struct {
	scenarioFile string
	seed         int64
	seedSet      bool
}

// New is the simulated node of the flags it adds.
func New() *Simulation { return &Simulation{} }

// Name is the binary's name.
func (*Simulation) Name() string { return "gpu-pool-exporter-sim" }

// Help heads --help.
func (*Simulation) Help() string {
	return "Runs gpu-pool-exporter on a SIMULATED GPU node (no GPU, driver or kubelet needed): the built-in 8 x H100 node, or the node of --simulate.scenario, with a fake kubelet, DCGM and host /proc. Every flag of gpu-pool-exporter works here too."
}

// AddFlags adds --simulate.seed and --simulate.scenario.
func (s *Simulation) AddFlags(app *kingpin.Application) {
	agent.Named(app.Flag("simulate.seed", "Seed of the simulated node's telemetry and UUIDs (overrides the scenario's).").Default("1").IsSetByUser(&s.seedSet)).Int64Var(&s.seed)
	app.Flag("simulate.scenario", "YAML scenario for the simulated node (docs/simulation.md); empty: the built-in 8 x H100 node.").Default("").StringVar(&s.scenarioFile)
}

// Check reads the scenario and applies the seed: the Config's Simulation
// is the scenario. Without --node-name the pods and ResourceSlices watched
// on the API server, and the node whose condition is kept, are the
// simulated node's own name's.
func (s *Simulation) Check(c *agent.Config) (any, error) {
	sc := simnode.DefaultScenario()
	if s.scenarioFile != "" {
		var err error
		if sc, err = simnode.LoadScenario(s.scenarioFile); err != nil {
			return nil, agent.NewInputError(fmt.Errorf("--simulate.scenario=%s: %w", s.scenarioFile, err))
		}
	}
	if s.seedSet || sc.Seed == 0 {
		sc.Seed = s.seed
	}
	if c.NodeName == "" {
		if c.PodMeta != nil {
			c.PodMeta.NodeName = sc.Node.Name
		}
		if c.Slices != nil {
			c.Slices.NodeName = sc.Node.Name
		}
		if c.NodeCondition != nil {
			c.NodeCondition.NodeName = sc.Node.Name
		}
	}
	return sc, nil
}

// Sources are the simulated node's stand-ins; a kubelet socket, a host
// /proc or a log directory the user named stays the real one, and a
// kubeconfig names the API server for the pod labels and UIDs.
func (s *Simulation) Sources(c *agent.Config, log zerolog.Logger) (collector.Sources, error) {
	sc, ok := c.Simulation.(*simnode.Scenario)
	if !ok {
		return collector.Sources{}, fmt.Errorf("simagent: the Config was not checked with this simulation (Simulation is %T)", c.Simulation)
	}
	node, err := simnode.New(sc)
	if err != nil {
		return collector.Sources{}, agent.NewInputError(fmt.Errorf("--simulate.scenario=%s: %w", s.scenarioFile, err))
	}
	log.Warn().Str("model", sc.Node.Model).Int("gpus", sc.Node.Count).Str("flavour", sc.Node.Flavour).Msg("running on a SIMULATED GPU node; no real GPU is read")
	// The pod labels and UIDs, the ResourceSlices and the node condition
	// are the API server's a kubeconfig names, else the simulated node's
	// own.
	podMeta := (c.PodMeta != nil || c.Slices != nil || c.NodeCondition != nil) && c.Kubeconfig == ""
	nodeName := c.NodeName
	if nodeName == "" {
		nodeName = sc.Node.Name
	}
	interval := min(c.Interval, time.Second)
	stand, err := sim.Sources(node, sim.Options{Kubelet: c.Kubelet != nil && !c.KubeletSocketNamed, FollowEvery: interval, Sysfs: true,
		APIServer: podMeta, NodeName: nodeName})
	if err != nil {
		node.Close()
		return collector.Sources{}, err
	}
	src := stand.Sources
	if !podMeta {
		if src.Kube, err = agent.KubeClient(c); err != nil {
			stand.Sources.Close()
			node.Close()
			return collector.Sources{}, err
		}
	}
	if stand.Kubelet != nil {
		log.Info().Str("socket", src.KubeletSocket).Msg("serving the simulated node's pods on a built-in fake kubelet")
	} else if c.Kubelet != nil {
		src.KubeletSocket = c.Kubelet.Socket
	}
	closeStand := src.Close
	src.Close = func() { closeStand(); node.Close() }
	if c.Procs == nil {
		return src, nil
	}
	// The simulated host's /proc and container logs unless the flags name
	// others.
	root, logDir := c.Procs.Root, c.Procs.LogDir
	if !c.Procs.RootNamed {
		if root, err = node.HostProc(); err != nil {
			src.Close()
			return collector.Sources{}, err
		}
	}
	if !c.Procs.LogDirNamed {
		if logDir, err = node.HostLogDir(); err != nil {
			src.Close()
			return collector.Sources{}, err
		}
	}
	resolver, closeResolver, err := agent.ProcessResolver(c.Procs, root, logDir, log)
	if err != nil {
		src.Close()
		return collector.Sources{}, err
	}
	src.Processes = resolver
	closeSim := src.Close
	src.Close = func() { closeResolver(); closeSim() }
	return src, nil
}
