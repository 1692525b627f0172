// Command gpu-pool-exporter-sim is gpu-pool-exporter on a simulated GPU
// node: the same agent, flags and pages, with the simulation wing (sim/)
// standing in for the driver, DCGM, the kubelet and the host. `make run`
// starts it; the image ships it for a try-out on a machine without GPUs.
// Exit codes are the agent's.
package main

import (
	"context"
	"os"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/agent"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simagent"
)

func main() {
	os.Exit(agent.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr, simagent.New()))
}
