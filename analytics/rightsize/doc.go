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
// of NVIDIA's documented profiles (miggeometry), which only this command
// reads: the exporter itself names and sizes MIG instances from NVML
// alone.
//
// The files, in the order of the flow, each using only those before it:
//
//	round.go         rounding to what the outputs print, and figures that
//	                 may be missing (*float64)
//	accelerators.go  the accelerator table (accelerators.yaml): names,
//	                 memory, throughput, each row's source
//	workload.go      a pod's workload, from kube-state-metrics' owner graph
//	select.go        shapes, a workload's need, and Choose: the
//	                 recommendation among candidate shapes
//	observation.go   what Prometheus holds of the window: the recordings
//	                 read, holdings, devices, node facts, the Observation
//	                 and the querier its readings share
//	pools.go         the cluster's node pools, what each serves, and the
//	                 labels and resource of a pool to create
//	candidates.go    prices, MIG slice and cost shares, the shape a holding
//	                 has and the shapes its workload could have instead
//	capacity.go      every GPU and device over the window (readCapacity):
//	                 what the bill charges and what nobody held
//	rows.go          recommend's rows: the holdings by workload (and by
//	                 model where the models cannot be converted), their
//	                 current ones, activity in the current device's units
//	convert.go       the activity percentile of a workload whose devices
//	                 differ in model or shape, read converted (readConverted)
//	observe.go       Observe: the window read from Prometheus (holdings,
//	                 devices, kube-state-metrics' objects), then
//	                 capacity.go's and convert.go's readings
//	change.go        what a person would change in a pod template to
//	                 follow a recommendation
//	recommend.go     Recommend: a row per workload, its data's coverage and
//	                 its recommendation
//	report.go        Report: GPU-hours per group and model, and those no
//	                 group held, against the bill
//	render.go        the outputs: recommend's table, CSV, JSON and YAML
//	                 patches; report's table, CSV and JSON
package rightsize
