// Package status is the node's answer to "who is on this GPU": per GPU, MIG
// instance and time-slicing replica, the containers holding it, their VRAM
// and activity, how long they have been idle, and the GPU's health. The
// exporter builds one Node per sample and renders it once, as HTML for the
// landing page and as JSON at Path for `gpupool status`; Text prints the
// same table in a terminal.
package status

import (
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// DefaultPort is the exporter's port, registered to no other GPU exporter
// (dcgm-exporter: 9400, nvidia_gpu_exporter: 9835,
// nvidia_gpu_prometheus_exporter: 9445): the agent listens on it and
// `gpupool status` asks it by default.
const DefaultPort = "9947"

// Path is where the exporter serves the status document as JSON.
const Path = "/status.json"

// Node is the whole status.
type Node struct {
	Version    string    `json:"version"`
	Node       string    `json:"node,omitempty"`
	Simulated  bool      `json:"simulated,omitempty"`
	SampleTime time.Time `json:"sample_time"`
	Driver     string    `json:"driver_version,omitempty"`
	CUDA       string    `json:"cuda_driver_version,omitempty"`
	// Processes says whether per-process accounting works: "on", "off"
	// (not configured) or why it does not.
	Processes string `json:"process_accounting"`
	// PodMap says whether the kubelet's pod map is current: "on", "off" or
	// "down: " and why (the kubelet's failure, or that it has not answered
	// since the start: the page then names no holder).
	PodMap string `json:"pod_map"`
	// NVML says whether NVML is usable: "ok", or why not (waiting for
	// nvmlInit, the driver went away).
	NVML string `json:"nvml,omitempty"`
	// XIDEvents says which GPUs' XIDs are seen: "off", "all N GPUs
	// registered", or which are not.
	XIDEvents string `json:"xid_events,omitempty"`
	GPUs      []GPU  `json:"gpus"`
}

// GPU is one physical GPU.
type GPU struct {
	Index  int    `json:"gpu"`
	UUID   string `json:"uuid"`
	Model  string `json:"model"`
	Device string `json:"device,omitempty"` // nvidiaN
	Up     bool   `json:"up"`
	Health Health `json:"health"`
	// Units are what the scheduler hands out: the whole GPU, or its MIG
	// instances.
	Units []Unit `json:"units"`
}

// Health is the GPU's health at a glance.
type Health struct {
	// XIDs is the number of XID errors since the exporter started, LastXID
	// the code of the latest.
	XIDs    uint64 `json:"xids"`
	LastXID int    `json:"last_xid,omitempty"`
	// Throttle lists active slowdown reasons (thermal, power brake...).
	Throttle []string `json:"throttle,omitempty"`
	// ECCUncorrected is the volatile uncorrected ECC error count.
	ECCUncorrected uint64 `json:"ecc_uncorrected"`
	// Problems is a one-line summary; empty when healthy.
	Problems string `json:"problems,omitempty"`
}

// OK reports whether nothing is wrong.
func (h Health) OK() bool { return h.Problems == "" }

// Unit is a whole GPU or a MIG instance.
type Unit struct {
	GPUInstance int    `json:"gpu_instance"` // -1 for a whole GPU
	MIGProfile  string `json:"mig_profile,omitempty"`
	// Shared: several containers hold it (time-slicing or MPS replicas).
	Shared           bool     `json:"shared"`
	MemoryUsedBytes  *float64 `json:"memory_used_bytes,omitempty"`
	MemoryTotalBytes *float64 `json:"memory_total_bytes,omitempty"`
	Activity         *float64 `json:"activity,omitempty"`
	Holders          []Holder `json:"holders"`
	// OutsidePodsMemoryBytes is the VRAM of processes in no pod (host
	// processes, other runtimes); nil when processes could not be read.
	OutsidePodsMemoryBytes *float64 `json:"outside_pods_memory_bytes,omitempty"`
	OutsidePodsProcesses   int      `json:"outside_pods_processes,omitempty"`
	// MPSServerMemoryBytes is the VRAM of the unit's MPS server (the
	// shared context of its MPS clients, no workload's); nil without one.
	MPSServerMemoryBytes *float64 `json:"mps_server_memory_bytes,omitempty"`
}

// Name is how the table names the unit: "gpu" or "gi2 1g.10gb".
func (u Unit) Name() string {
	if u.GPUInstance < 0 {
		return "gpu"
	}
	return fmt.Sprintf("gi%d %s", u.GPUInstance, u.MIGProfile)
}

// Holder is a container holding the unit (or using it without holding it:
// Holding false).
type Holder struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	Resource  string `json:"resource,omitempty"`
	Holding   bool   `json:"holding"`
	// Replicas are the time-slicing/MPS replica numbers the container holds.
	Replicas        []int    `json:"replicas,omitempty"`
	MemoryUsedBytes *float64 `json:"memory_used_bytes,omitempty"`
	Activity        *float64 `json:"activity,omitempty"`
	// ActivitySource says where Activity comes from: "device" (the whole
	// device's NVML busy ratio), "dcgm_sm_active" or "processes" (the
	// container's own processes, NVML per-process SM utilization).
	ActivitySource string `json:"activity_source,omitempty"`
	Processes      int    `json:"processes"`
	Idle           bool   `json:"idle"`
	// QuietSeconds is how long its activity has been below the idle
	// threshold (0 when busy); Idle turns true once it reaches the window.
	QuietSeconds float64 `json:"quiet_seconds"`
}

// Ref is namespace/pod/container.
func (h Holder) Ref() string { return h.Namespace + "/" + h.Pod + "/" + h.Container }

// JSON writes the status as JSON.
func (n *Node) JSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(n)
}

// Decode reads what JSON wrote, with a clear error when it is not that.
func Decode(r io.Reader) (*Node, error) {
	var n Node
	dec := json.NewDecoder(r)
	if err := dec.Decode(&n); err != nil {
		return nil, fmt.Errorf("not a gpupool status document: %w", err)
	}
	if n.GPUs == nil && n.Version == "" {
		return nil, fmt.Errorf("not a gpupool status document: no version and no gpus")
	}
	return &n, nil
}
