// Command gpu-pool-exporter is the node agent, the DaemonSet's binary: it
// serves one GPU node's metrics (NVML, DCGM, the kubelet's pod map, idle
// allocations and fragmentation) to Prometheus. Everything it does is the
// agent package's; it links neither the simulation (gpu-pool-exporter-sim)
// nor the analytics (gpupool).
//
// Exit codes: 0 after a clean shutdown, --help or --version; 1 when the
// machine fails it (no NVML, a port in use, a setup step or a server that
// fails); 2 when what the user wrote is wrong (a flag, the price file, the
// web config).
package main

import (
	"context"
	"os"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
)

func main() {
	os.Exit(agent.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, nil))
}
