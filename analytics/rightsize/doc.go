// Package rightsize answers, from the recordings of gpu-pool-exporter's
// rules in Prometheus, which GPU shape each workload should hold
// (`gpupool recommend`) and what each team's GPUs did and cost
// (`gpupool report`).
//
// It reads Prometheus through client_golang's v1 API (Observe), resolves
// each pod to its workload from kube-state-metrics' owner series (Owners),
// builds the shapes the cluster offers for a workload (MIG profiles of its
// model, time-sliced shares, other accelerators; Candidates) and picks the
// cheapest that holds its peak memory and its p95 activity with headroom
// (Choose). Report groups the same observation's GPU-hours per namespace,
// owner or pod label. docs/rightsizing.md describes the method and its
// limits.
//
// The MIG profile sizes of a model come from the exporters of the
// cluster's MIG nodes where it has them, else from the MIG geometry table
// of NVIDIA's documented profiles (sim/miggeometry), which only this
// command reads: the exporter itself names and sizes MIG instances from
// NVML alone.
package rightsize
