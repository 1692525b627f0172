package rightsize

import (
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// ErrNoRecordings is returned where the rules are not recorded where the commands query.
var ErrNoRecordings = errors.New("no recordings of gpu-pool-exporter's rules in Prometheus")

// ObserveOptions are what the commands ask of the window beyond its time.
type ObserveOptions struct {
	// Quantile is the percentile of activity read, 0-1 (default 0.95).
	Quantile float64
}

// Observe reads the window from Prometheus.
func Observe(ctx context.Context, api Querier, w Window, opt ObserveOptions) (*Observation, error) {
	q := querier{api: api, at: w.End}
	if err := checkCoverage(ctx, q, w); err != nil {
		return nil, err
	}
	if opt.Quantile <= 0 || opt.Quantile > 1 {
		opt.Quantile = 0.95
	}
	o := &Observation{
		Window:         w,
		Quantile:       opt.Quantile,
		gpus:           map[[2]string]*gpuSteps{},
		devices:        map[DeviceKey]*deviceSteps{},
		nodeProfiles:   map[string]map[string]bool{},
		converted:      map[rowKey]float64{},
		Owners:         NewOwners(),
		gpuModel:       map[[2]string]string{},
		nodeModel:      map[string]string{},
		nodeAccel:      map[string]string{},
		memory:         map[DeviceKey]float64{},
		migSizes:       map[string]map[string]float64{},
		modelMem:       map[string]float64{},
		nodes:          map[string]nodeLabels{},
		ExporterPrices: map[string]float64{},
	}
	if err := o.readHoldings(ctx, q); err != nil {
		return nil, err
	}
	if err := o.readDevices(ctx, q); err != nil {
		return nil, err
	}
	if err := o.readKSM(ctx, q); err != nil {
		return nil, err
	}
	if err := o.readCapacity(ctx, q); err != nil {
		return nil, err
	}
	if err := o.readConverted(ctx, q); err != nil {
		return nil, err
	}
	return o, nil
}

// checkCoverage fails when the rules are not recorded at all, or not yet
// at the window's start (a window longer than the data).
func checkCoverage(ctx context.Context, q querier, w Window) error {
	probe := "count(" + RecordModel + ")"
	now, err := q.vector(ctx, probe)
	if err != nil {
		return err
	}
	if len(now) == 0 {
		return fmt.Errorf("%w: no series %s at %s; %s", ErrNoRecordings, RecordModel, w.End.UTC().Format(time.RFC3339), RulesHint)
	}
	first := w.Start().Add(w.Step)
	then, err := q.vectorAt(ctx, probe, first)
	if err != nil {
		return err
	}
	if len(then) == 0 {
		return &WindowError{Start: w.Start(), Length: w.Length}
	}
	return nil
}

// WindowError is a window that reaches back before the recordings.
type WindowError struct {
	Start  time.Time
	Length time.Duration
}

func (e *WindowError) Error() string {
	return fmt.Sprintf("Prometheus holds no recordings of gpu-pool-exporter's rules at %s, where the %s window starts: the window is longer than the data (Prometheus' retention, or the time since the rules were loaded); shorten it", e.Start.UTC().Format(time.RFC3339), promDuration(e.Length))
}

func holdingKey(m model.Metric) [7]string {
	return [7]string{label(m, "node"), label(m, "namespace"), label(m, "pod"), label(m, "container"), label(m, "uuid"), label(m, "gpu_instance"), label(m, "compute_instance")}
}

func (o *Observation) readHoldings(ctx context.Context, q querier) error {
	w, s := promDuration(o.Window.Length), promDuration(o.Window.Step)
	sub := "[" + w + ":" + s + "]"
	byKey := map[[7]string]*Holding{}
	get := func(m model.Metric) *Holding {
		k := holdingKey(m)
		h := byKey[k]
		if h == nil {
			h = &Holding{
				DeviceKey: DeviceKey{Node: k[0], UUID: k[4], GPUInstance: k[5], ComputeInstance: k[6]},
				Namespace: k[1], Pod: k[2], Container: k[3],
				GPU: label(m, "gpu"), MIGProfile: label(m, "mig_profile"), Resource: label(m, "resource"),
			}
			byKey[k] = h
		}
		return h
	}
	steps, err := q.vector(ctx, "count_over_time("+RecordShare+sub+")")
	if err != nil {
		return err
	}
	for _, smp := range steps {
		get(smp.Metric).Steps = float64(smp.Value)
	}
	sums := []struct {
		expr string
		set  func(*Holding, float64)
	}{
		{"sum_over_time(" + RecordShare + sub + ")", func(h *Holding, v float64) { h.Share = v }},
		// Busy: its activity, recorded at the minutes it holds a share and
		// already its own part of a shared device (not weighted again).
		{"sum_over_time(" + RecordActivity + sub + ")", func(h *Holding, v float64) { h.Busy = v }},
		{"sum_over_time(" + RecordIdle + sub + ")", func(h *Holding, v float64) { h.Idle = v }},
		{"quantile_over_time(" + strconv.FormatFloat(o.Quantile, 'g', -1, 64) + ", " + RecordActivity + "[" + w + "])", func(h *Holding, v float64) { h.P95Activity = &v }},
		// The first and last steps held: the step's time where it is held.
		{"min_over_time((" + RecordShare + " * 0 + time())" + sub + ")", func(h *Holding, v float64) { h.First = secondsTime(v) }},
		{"max_over_time((" + RecordShare + " * 0 + time())" + sub + ")", func(h *Holding, v float64) { h.Last = secondsTime(v) }},
		{"max_over_time(" + RecordActivity + "[" + w + "])", func(h *Holding, v float64) { h.MaxActivity = &v }},
		{"max_over_time(" + RecordMemory + "[" + w + "])", func(h *Holding, v float64) { h.PeakMemory = &v }},
		{RecordShare, func(h *Holding, _ float64) { h.Current = true }},
	}
	for _, sm := range sums {
		vec, err := q.vector(ctx, sm.expr)
		if err != nil {
			return err
		}
		for _, smp := range vec {
			// Only what was held in the window: an activity or memory
			// series of a holder whose share is not recorded is not one.
			if h := byKey[holdingKey(smp.Metric)]; h != nil {
				sm.set(h, float64(smp.Value))
			}
		}
	}
	for _, h := range byKey {
		o.Holdings = append(o.Holdings, h)
	}
	sort.Slice(o.Holdings, func(i, j int) bool { return lessHolding(o.Holdings[i], o.Holdings[j]) })
	return nil
}

// secondsTime is a time PromQL gave in Unix seconds, to the millisecond.
func secondsTime(v float64) time.Time {
	return time.UnixMilli(int64(math.Round(v * 1000))).UTC()
}

func lessHolding(a, b *Holding) bool {
	ka := [...]string{a.Namespace, a.Pod, a.Container, a.Node, a.UUID, a.GPUInstance, a.ComputeInstance}
	kb := [...]string{b.Namespace, b.Pod, b.Container, b.Node, b.UUID, b.GPUInstance, b.ComputeInstance}
	for i := range ka {
		if ka[i] != kb[i] {
			return ka[i] < kb[i]
		}
	}
	return false
}

func (o *Observation) readDevices(ctx context.Context, q querier) error {
	w := promDuration(o.Window.Length)
	nodeModels, err := q.vector(ctx, "max by (node, model) (last_over_time("+RecordModel+"["+w+"]))")
	if err != nil {
		return err
	}
	for _, s := range nodeModels {
		o.nodeModel[label(s.Metric, "node")] = label(s.Metric, "model")
	}
	infos, err := q.vector(ctx, "max by (node, uuid, model) (gpu_info{"+exporter+"})")
	if err != nil {
		return err
	}
	for _, s := range infos {
		o.gpuModel[[2]string{label(s.Metric, "node"), label(s.Metric, "uuid")}] = label(s.Metric, "model")
	}
	mem, err := q.vector(ctx, "max by (node, uuid, gpu_instance, mig_profile) (gpu_memory_total_bytes{"+exporter+"})")
	if err != nil {
		return err
	}
	for _, s := range mem {
		node, uuid, gi, profile := label(s.Metric, "node"), label(s.Metric, "uuid"), label(s.Metric, "gpu_instance"), label(s.Metric, "mig_profile")
		v := float64(s.Value)
		o.memory[DeviceKey{Node: node, UUID: uuid, GPUInstance: gi}] = v
		model := o.ModelOf(DeviceKey{Node: node, UUID: uuid})
		if model == "" {
			continue
		}
		if gi == "" {
			o.modelMem[model] = math.Max(o.modelMem[model], v)
		} else if plainProfile.MatchString(profile) {
			if o.nodeProfiles[node] == nil {
				o.nodeProfiles[node] = map[string]bool{}
			}
			o.nodeProfiles[node][profile] = true
			if o.migSizes[model] == nil {
				o.migSizes[model] = map[string]float64{}
			}
			o.migSizes[model][profile] = math.Max(o.migSizes[model][profile], v)
		}
	}
	accels, err := q.vector(ctx, "max by (node, accelerator) ("+RecordAccel+")")
	if err != nil {
		return err
	}
	for _, s := range accels {
		o.nodeAccel[label(s.Metric, "node")] = label(s.Metric, "accelerator")
	}
	prices, err := q.vector(ctx, "max by (model) (gpu_price_dollars_per_hour{"+exporter+`, gpu_instance=""})`)
	if err != nil {
		return err
	}
	for _, s := range prices {
		o.ExporterPrices[label(s.Metric, "model")] = float64(s.Value)
	}
	return nil
}

// Node labels read for the pools, their sharing and MIG offers, and
// accelerators without exporters.
var nodeLabelNames = []string{
	"label_cloud_google_com_gke_accelerator",
	"label_nvidia_com_gpu_product",
	"label_cloud_google_com_gke_gpu_sharing_strategy",
	"label_cloud_google_com_gke_max_shared_clients_per_gpu",
	"label_nvidia_com_gpu_replicas",
	"label_cloud_google_com_gke_gpu_partition_size",
	"label_nvidia_com_mig_strategy",
	"label_nvidia_com_mig_config",
	"label_nvidia_com_gpu_sharing_strategy",
	"label_cloud_google_com_gke_nodepool",
	"label_karpenter_sh_nodepool",
	"label_eks_amazonaws_com_nodegroup",
	"label_kubernetes_azure_com_agentpool",
}

// poolLabels are the labels that name a node's pool, in the order read:
// GKE's, Karpenter's, EKS's and AKS's (as node:gpu_nodepool:info reads them).
var poolLabels = []string{"cloud.google.com/gke-nodepool", "karpenter.sh/nodepool", "eks.amazonaws.com/nodegroup", "kubernetes.azure.com/agentpool"}

func (o *Observation) readKSM(ctx context.Context, q querier) error {
	present, err := q.vector(ctx, "count(kube_pod_owner)")
	if err != nil {
		return err
	}
	o.KSM = len(present) > 0
	nodeLabelsVec, err := q.vector(ctx, "max by (node, "+strings.Join(nodeLabelNames, ", ")+") (kube_node_labels)")
	if err != nil {
		return err
	}
	o.NodeObjects = len(nodeLabelsVec) > 0
	for _, s := range nodeLabelsVec {
		n := nodeLabels{accelerator: label(s.Metric, "label_cloud_google_com_gke_accelerator")}
		if n.accelerator == "" {
			n.accelerator = label(s.Metric, "label_nvidia_com_gpu_product")
		}
		if label(s.Metric, "label_cloud_google_com_gke_gpu_sharing_strategy") == "time-sharing" {
			n.replicas, _ = strconv.Atoi(label(s.Metric, "label_cloud_google_com_gke_max_shared_clients_per_gpu"))
		}
		if r, err := strconv.Atoi(label(s.Metric, "label_nvidia_com_gpu_replicas")); err == nil && r > n.replicas {
			n.replicas = r
		}
		if n.replicas < 2 {
			n.replicas = 0
		}
		for _, l := range poolLabels {
			if v := label(s.Metric, KSMLabelName(l)); v != "" {
				n.pool, n.poolLabel = v, l
				break
			}
		}
		n.gke = label(s.Metric, "label_cloud_google_com_gke_nodepool") != ""
		n.partitionSize = label(s.Metric, "label_cloud_google_com_gke_gpu_partition_size")
		n.migStrategy = label(s.Metric, "label_nvidia_com_mig_strategy")
		n.migConfig = label(s.Metric, "label_nvidia_com_mig_config")
		n.product = label(s.Metric, "label_nvidia_com_gpu_product")
		o.nodes[label(s.Metric, "node")] = n
	}
	capacity, err := q.vector(ctx, `max by (node) (kube_node_status_capacity{resource="nvidia_com_gpu"})`)
	if err != nil {
		return err
	}
	for _, s := range capacity {
		n := o.nodes[label(s.Metric, "node")]
		n.capacity = float64(s.Value)
		o.nodes[label(s.Metric, "node")] = n
	}
	if !o.KSM {
		return nil
	}
	return o.readOwners(ctx, q)
}

// readOwners reads the owners and labels of the pods that held a device,
// their last value in the window (a pod gone since keeps its owner).
func (o *Observation) readOwners(ctx context.Context, q querier) error {
	w := promDuration(o.Window.Length)
	pods := map[string]bool{}
	for _, h := range o.Holdings {
		pods[h.Pod] = true
	}
	var rsNames, jobNames []string
	err := forNames(pods, func(re string) error {
		owners, err := q.vector(ctx, "max by (namespace, pod, owner_kind, owner_name) (last_over_time(kube_pod_owner{pod=~`"+re+"`, owner_is_controller!=\"false\"}["+w+"]))")
		if err != nil {
			return err
		}
		for _, s := range owners {
			kind, name := label(s.Metric, "owner_kind"), label(s.Metric, "owner_name")
			o.Owners.AddPod(label(s.Metric, "namespace"), label(s.Metric, "pod"), kind, name)
			switch kind {
			case "ReplicaSet":
				rsNames = append(rsNames, name)
			case "Job":
				jobNames = append(jobNames, name)
			}
		}
		podLabels, err := q.vector(ctx, "last_over_time(kube_pod_labels{pod=~`"+re+"`}["+w+"])")
		if err != nil {
			return err
		}
		for _, s := range podLabels {
			for k, v := range s.Metric {
				if strings.HasPrefix(string(k), "label_") && v != "" {
					o.Owners.AddPodLabel(label(s.Metric, "namespace"), label(s.Metric, "pod"), string(k), string(v))
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := forNames(setOf(rsNames), func(re string) error {
		vec, err := q.vector(ctx, "max by (namespace, replicaset, owner_kind, owner_name) (last_over_time(kube_replicaset_owner{replicaset=~`"+re+"`}["+w+"]))")
		for _, s := range vec {
			o.Owners.AddReplicaSet(label(s.Metric, "namespace"), label(s.Metric, "replicaset"), label(s.Metric, "owner_kind"), label(s.Metric, "owner_name"))
		}
		return err
	}); err != nil {
		return err
	}
	return forNames(setOf(jobNames), func(re string) error {
		vec, err := q.vector(ctx, "max by (namespace, job_name, owner_kind, owner_name) (last_over_time(kube_job_owner{job_name=~`"+re+"`}["+w+"]))")
		for _, s := range vec {
			o.Owners.AddJob(label(s.Metric, "namespace"), label(s.Metric, "job_name"), label(s.Metric, "owner_kind"), label(s.Metric, "owner_name"))
		}
		return err
	})
}

func setOf(names []string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// forNames calls f with regular expressions matching the names, a bounded
// number at a time, in a stable order.
func forNames(names map[string]bool, f func(re string) error) error {
	sorted := make([]string, 0, len(names))
	for n := range names {
		if n != "" {
			sorted = append(sorted, regexp.QuoteMeta(n))
		}
	}
	sort.Strings(sorted)
	for i := 0; i < len(sorted); i += podsPerQuery {
		if err := f(strings.Join(sorted[i:min(i+podsPerQuery, len(sorted))], "|")); err != nil {
			return err
		}
	}
	return nil
}
