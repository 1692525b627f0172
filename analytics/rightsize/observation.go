package rightsize

import (
	"context"
	"math"
	"regexp"
	"time"

	"github.com/prometheus/common/model"
)

// The recordings the commands read (alerts/gpu-pool-exporter.rules.yml,
// node-level group gpu-pool-exporter.recording.node).
const (
	RecordShare    = "allocation:gpu_devices:share"
	RecordIdle     = "allocation:gpu_idle_devices:share"
	RecordActivity = "allocation:gpu_activity_ratio:avg1m"
	RecordMemory   = "allocation:gpu_memory_used_bytes:max1m"
	RecordModel    = "node:gpu_model:info"
	RecordAccel    = "node:gpu_accelerator:info"
)

// Recordings are the recordings the commands read, each after those it
// reads.
var Recordings = []string{RecordShare, RecordActivity, RecordMemory, RecordModel, RecordIdle, RecordAccel}

// RulesHint says which rules record what the commands read.
const RulesHint = "load alerts/gpu-pool-exporter.rules.yml (sharded: gpu-pool-exporter.shard.rules.yml in every shard, and query where every shard's node-level series are visible, such as Thanos Query)"

// Window is the time range the commands read, (End-Length, End], sampled
// every Step for the integrals.
type Window struct {
	End    time.Time
	Length time.Duration
	Step   time.Duration
}

// Start is the window's start.
func (w Window) Start() time.Time { return w.End.Add(-w.Length) }

// DefaultStep is the step integrals are sampled at: the rules' one minute,
// or for windows under 200 minutes the window over 200 (at least a second),
// so that a short window still has steps to count.
func DefaultStep(length time.Duration) time.Duration {
	if length >= 200*time.Minute {
		return time.Minute
	}
	s := (length / 200).Truncate(time.Second)
	if s < time.Second {
		s = time.Second
	}
	return s
}

// DeviceKey names a schedulable device: a whole GPU, or a MIG device.
type DeviceKey struct{ Node, UUID, GPUInstance, ComputeInstance string }

// Holding is one container's hold on one device in the window: one series
// of allocation:gpu_devices:share, with what the recordings say of it.
type Holding struct {
	DeviceKey
	Namespace, Pod, Container string
	GPU, MIGProfile, Resource string
	// Steps is the number of the window's steps at which it was held;
	// Share, Busy and Idle are its device share summed over those steps,
	// weighted by activity, and while the exporter judged it idle.
	Steps, Share, Busy, Idle float64
	// Current: held at the window's end.
	Current bool
	// First and Last are the first and the last step it was held at.
	First, Last time.Time
	PeakMemory  *float64 // bytes
	// P95Activity is the percentile of its activity the commands were
	// asked for (--percentile, the 95th by default).
	P95Activity, MaxActivity *float64
}

// Span is the number of steps from its first to its last, both counted:
// the steps a pod held the device, recorded or not.
func (h *Holding) Span(step time.Duration) float64 {
	if h.Last.Before(h.First) {
		return h.Steps
	}
	return math.Round(float64(h.Last.Sub(h.First))/float64(step)) + 1
}

// GapSteps are the steps between its first and its last at which nothing
// was recorded: an exporter, its pod map or Prometheus away for longer
// than the lookback, while the pod held the device.
func (h *Holding) GapSteps(step time.Duration) float64 {
	return max(0, h.Span(step)-h.Steps)
}

// Node facts from kube-state-metrics' node objects.
type nodeLabels struct {
	accelerator string // GKE's accelerator label, else GPU Feature Discovery's product
	replicas    int    // time-sliced replicas per GPU offered (>1), 0 if none
	capacity    float64
	// pool is the node's pool as its labels name it (poolLabel: GKE's,
	// Karpenter's, EKS's or AKS's label), "" where none does.
	pool, poolLabel string
	// partitionSize is GKE's MIG partition size label; migStrategy and
	// migConfig the GPU Operator's (nvidia.com/mig.strategy, mig.config);
	// product GPU Feature Discovery's nvidia.com/gpu.product.
	partitionSize, migStrategy, migConfig, product string
	gke                                            bool // a GKE node (cloud.google.com/gke-nodepool)
}

// gpuSteps is one physical GPU over the window: the steps gpu_info was
// served, and of them those in MIG mode.
type gpuSteps struct {
	Model           string
	Steps, MIGSteps float64
}

// deviceSteps is one schedulable device over the window (a whole GPU out
// of MIG mode, or a MIG device): the steps it was there, those at which
// someone held it, and those at which nobody held it while its node was
// cordoned or its GPU unhealthy.
type deviceSteps struct {
	Profile                    string
	Present, Held, Unavailable float64
}

// nodePool is what one node pool of the cluster serves: its accelerator,
// and whole GPUs, MIG devices of some profiles, or time-sliced replicas.
// From kube-state-metrics' node labels (GKE's pool, accelerator,
// partition size and sharing labels; the GPU Operator's MIG strategy and
// config and GPU Feature Discovery's product and replicas) and the
// exporters' own series (the model, the MIG devices each node has).
type nodePool struct {
	// name is the pool as its nodes' label names it (label); a node no
	// such label names is a pool of its own, "node/<name>".
	name, label        string
	gke                bool
	accelerator, model string
	product            string // GPU Feature Discovery's nvidia.com/gpu.product
	profiles           map[string]bool
	replicas           int
	migStrategy        string
	sharedResource     bool // its holders ask for nvidia.com/gpu.shared
	migResource        bool // its holders ask for nvidia.com/mig-<profile>
}

// rowKey is a row of recommend: a workload, and the model where its
// devices' models cannot be converted into one another (else "").
type rowKey struct {
	Workload
	Model string
}

// Observation is what Prometheus holds of the window: every holding, the
// cluster's devices and accelerators, owners and prices.
type Observation struct {
	Window   Window
	Holdings []*Holding
	// KSM says whether kube-state-metrics' pod objects are in Prometheus;
	// NodeObjects whether its node objects (kube_node_labels) are.
	KSM, NodeObjects bool
	Owners           *Owners
	// gpuModel is each GPU's model; nodeModel each node's (the last in
	// the window), for GPUs no longer served.
	gpuModel  map[[2]string]string // node, uuid
	nodeModel map[string]string
	nodeAccel map[string]string             // nodes with an exporter
	memory    map[DeviceKey]float64         // gpu_memory_total_bytes at the end (MIG devices by GPU instance, compute instance "")
	migSizes  map[string]map[string]float64 // model -> profile -> bytes seen
	modelMem  map[string]float64            // model -> whole-GPU bytes
	nodes     map[string]nodeLabels
	// gpus and devices are every GPU and schedulable device the exporters
	// served in the window: the bill's GPU-hours and the unallocated ones.
	gpus    map[[2]string]*gpuSteps // node, uuid
	devices map[DeviceKey]*deviceSteps
	// nodeProfiles are the MIG profiles each node's devices had at the end.
	nodeProfiles map[string]map[string]bool
	scales       map[[2]string]float64 // migScales, once read
	poolList     []*nodePool           // pools, once read
	// Quantile is the activity percentile read (0.95 by default).
	Quantile float64
	// converted is the activity percentile of a workload that held
	// devices of several models or shapes, in its current device's units.
	converted map[rowKey]float64
	// ExporterPrices are the exporters' configured prices of whole GPUs
	// by model (gpu_price_dollars_per_hour).
	ExporterPrices map[string]float64
}

// ModelOf is a device's GPU model: its GPU's gpu_info, else its node's.
func (o *Observation) ModelOf(d DeviceKey) string {
	if m := o.gpuModel[[2]string{d.Node, d.UUID}]; m != "" {
		return m
	}
	return o.nodeModel[d.Node]
}

// AcceleratorOf is a node's accelerator (node:gpu_accelerator:info, else
// kube-state-metrics' node labels, else the model).
func (o *Observation) AcceleratorOf(node, model string) string {
	if a := o.nodeAccel[node]; a != "" {
		return a
	}
	if a := o.nodes[node].accelerator; a != "" {
		return a
	}
	return model
}

// Querier runs instant queries whose answers are vectors; its errors say
// what went wrong and what to do (promapi.Client).
type Querier interface {
	VectorAt(ctx context.Context, expr string, at time.Time) (model.Vector, error)
}

// querier runs instant queries at one time.
type querier struct {
	api Querier
	at  time.Time
}

func (q querier) vector(ctx context.Context, expr string) (model.Vector, error) {
	return q.vectorAt(ctx, expr, q.at)
}

func (q querier) vectorAt(ctx context.Context, expr string, at time.Time) (model.Vector, error) {
	return q.api.VectorAt(ctx, expr, at)
}

// label reads a label; the holder's namespace is exported_namespace under
// GKE Managed Prometheus (its own namespace label is the scraped pod's).
func label(m model.Metric, name string) string {
	if name == "namespace" {
		if v, ok := m["exported_namespace"]; ok && v != "" {
			return string(v)
		}
	}
	return string(m[model.LabelName(name)])
}

func promDuration(d time.Duration) string { return model.Duration(d).String() }

// exporter selects the exporter's own series.
const exporter = `job="gpu-pool-exporter"`

// podsPerQuery bounds the pod names one query matches by regular
// expression: an owner query's, a workload's converted activity's.
const podsPerQuery = 200

// plainProfile is a GPU instance profile without a variant (+me, +gfx,
// -me) or a compute-instance prefix (1c.3g.40gb).
var plainProfile = regexp.MustCompile(`^[0-9]+g\.[0-9]+gb$`)
