package rightsize

import (
	"context"
	"sort"
)

// The GPUs and devices the cluster had over the window, each step, from
// the exporters' own series: what the bill charges (every GPU of every
// node while it is there) and what no holder had.

// devicesExpr is every schedulable device each step: the GPUs out of MIG
// mode (gpu_info) and the MIG devices (gpu_mig_info), one series each.
const devicesExpr = `(
    group by (node, uuid, gpu_instance, compute_instance, mig_profile) (gpu_info{` + exporter + `, mig_mode!="enabled"})
  or
    group by (node, uuid, gpu_instance, compute_instance, mig_profile) (gpu_mig_info{` + exporter + `})
)`

// unavailableExpr is every GPU no pod could be given each step: on a
// cordoned node (kube-state-metrics' kube_node_spec_unschedulable), or
// unhealthy as the exporter judges it (gpu_devices{state="unhealthy"}:
// lost, row remapping failed, a reset or page retirement pending, a
// recovery action other than none).
const unavailableExpr = `group by (node, uuid) (
    gpu_info{` + exporter + `} and on (node) (kube_node_spec_unschedulable == 1)
  or gpu_up{` + exporter + `, gpu_instance=""} == 0
  or gpu_remapped_rows_failed{` + exporter + `} == 1
  or gpu_remapped_rows_pending{` + exporter + `} == 1
  or gpu_retired_pages_pending{` + exporter + `} == 1
  or gpu_recovery_action_code{` + exporter + `} > 0
)`

// readCapacity reads, per GPU, the steps it was served (and in MIG mode),
// and per device the steps it was there, held, and left unheld while
// unavailable.
func (o *Observation) readCapacity(ctx context.Context, q querier) error {
	sub := "[" + promDuration(o.Window.Length) + ":" + promDuration(o.Window.Step) + "]"
	gpus, err := q.vector(ctx, `count_over_time((max by (node, uuid, model, mig_mode) (gpu_info{`+exporter+`}))`+sub+`)`)
	if err != nil {
		return err
	}
	for _, s := range gpus {
		k := [2]string{label(s.Metric, "node"), label(s.Metric, "uuid")}
		g := o.gpus[k]
		if g == nil {
			g = &gpuSteps{}
			o.gpus[k] = g
		}
		if m := label(s.Metric, "model"); m != "" {
			g.Model = m
			if o.gpuModel[k] == "" {
				o.gpuModel[k] = m // a GPU gone before the window's end
			}
		}
		g.Steps += float64(s.Value)
		if label(s.Metric, "mig_mode") == "enabled" {
			g.MIGSteps += float64(s.Value)
		}
	}
	device := func(m map[string]string) *deviceSteps {
		k := DeviceKey{Node: m["node"], UUID: m["uuid"], GPUInstance: m["gpu_instance"], ComputeInstance: m["compute_instance"]}
		d := o.devices[k]
		if d == nil {
			d = &deviceSteps{}
			o.devices[k] = d
		}
		return d
	}
	for _, rd := range []struct {
		expr string
		set  func(d *deviceSteps, v float64, profile string)
	}{
		{`count_over_time(` + devicesExpr + sub + `)`, func(d *deviceSteps, v float64, profile string) {
			d.Present += v
			if profile != "" {
				d.Profile = profile
			}
		}},
		{`count_over_time((group by (node, uuid, gpu_instance, compute_instance) (` + RecordShare + `))` + sub + `)`, func(d *deviceSteps, v float64, _ string) { d.Held += v }},
		{`count_over_time((` + devicesExpr + ` unless on (node, uuid, gpu_instance, compute_instance) ` + RecordShare +
			` and on (node, uuid) ` + unavailableExpr + `)` + sub + `)`, func(d *deviceSteps, v float64, _ string) { d.Unavailable += v }},
	} {
		vec, err := q.vector(ctx, rd.expr)
		if err != nil {
			return err
		}
		for _, s := range vec {
			m := map[string]string{}
			for _, n := range []string{"node", "uuid", "gpu_instance", "compute_instance", "mig_profile"} {
				m[n] = label(s.Metric, n)
			}
			rd.set(device(m), float64(s.Value), m["mig_profile"])
		}
	}
	return nil
}

// Reasons a GPU-hour is allocated to no one.
const (
	// ReasonFree: a whole GPU nobody held, healthy on a schedulable node.
	ReasonFree = "free"
	// ReasonUnheldReplica: the replicas of a time-sliced GPU nobody held
	// while others did.
	ReasonUnheldReplica = "unheld replica"
	// ReasonFreeMIG: MIG devices nobody held.
	ReasonFreeMIG = "free MIG capacity"
	// ReasonRemainder: the part of a GPU in MIG mode that none of its MIG
	// devices costs: slices the layout leaves over (three 2g.20gb on an
	// H100 cost 6/7 of it) or no device covers.
	ReasonRemainder = "unplaceable remainder"
	// ReasonUnavailable: devices nobody held on a cordoned node or an
	// unhealthy GPU.
	ReasonUnavailable = "unhealthy or cordoned"
)

// Reasons lists the reasons in the order the report prints them.
var Reasons = []string{ReasonFree, ReasonUnheldReplica, ReasonFreeMIG, ReasonRemainder, ReasonUnavailable}

// modelHours are GPU-hours per accelerator model.
type modelHours map[string]float64

// billHours are the GPU-hours of every GPU the exporters served in the
// window, per model: what the cloud bills for the GPUs of the nodes.
func (o *Observation) billHours() modelHours {
	out := modelHours{}
	stepHours := o.Window.Step.Hours()
	for k, g := range o.gpus {
		m := g.Model
		if m == "" {
			m = o.ModelOf(DeviceKey{Node: k[0], UUID: k[1]})
		}
		out[m] += g.Steps * stepHours
	}
	return out
}

// unallocated are the GPU-hours per reason and model that no holder was
// charged: per device, the steps it was there but held by no one (free,
// or unavailable), the replicas of a time-sliced GPU its holders did not
// hold, and per GPU in MIG mode the part its devices do not cost. charged
// is what the holders of each device were charged, in device-steps.
func (o *Observation) unallocated(charged map[DeviceKey]float64) map[string]modelHours {
	out := map[string]modelHours{}
	stepHours := o.Window.Step.Hours()
	add := func(reason, model string, steps float64) {
		if steps <= 1e-9 {
			return
		}
		if out[reason] == nil {
			out[reason] = modelHours{}
		}
		out[reason][model] += steps * stepHours
	}
	migCovered := map[[2]string]float64{}
	scale := o.migScales()
	keys := make([]DeviceKey, 0, len(o.devices))
	for k := range o.devices {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return lessDevice(keys[i], keys[j]) })
	for _, k := range keys {
		d := o.devices[k]
		model := o.ModelOf(k)
		fraction, free := 1.0, ReasonFree
		if k.GPUInstance != "" {
			fraction, free = CostShare(model, d.Profile), ReasonFreeMIG
			if sc, ok := scale[[2]string{k.Node, k.UUID}]; ok {
				fraction /= sc
			}
			migCovered[[2]string{k.Node, k.UUID}] += d.Present * fraction
		}
		unheld := max(0, d.Present-d.Held)
		unavailable := min(d.Unavailable, unheld)
		add(ReasonUnavailable, model, unavailable*fraction)
		add(free, model, (unheld-unavailable)*fraction)
		// Held steps its holders were not charged for: replicas of a
		// time-sliced GPU nobody held (a MIG device's holders are charged
		// all of it).
		left := max(0, d.Held-charged[k])
		if k.GPUInstance == "" && o.nodes[k.Node].replicas > 1 {
			add(ReasonUnheldReplica, model, left)
		} else {
			add(free, model, left*fraction)
		}
	}
	for k, g := range o.gpus {
		if g.MIGSteps == 0 {
			continue
		}
		model := g.Model
		if model == "" {
			model = o.ModelOf(DeviceKey{Node: k[0], UUID: k[1]})
		}
		add(ReasonRemainder, model, g.MIGSteps-migCovered[k])
	}
	return out
}

// migScales are, per GPU in MIG mode whose devices together would cost
// more than the GPU (a 3g.40gb, a 2g.20gb and two 1g.10gb on an H100 use
// all 7 compute and all 8 memory slices, but cost 1/2 + 2/7 + 1/7 + 1/7 =
// 15/14 of it by their larger fractions), what their cost shares are
// divided by so that they cost the GPU: the sum of their cost shares,
// weighted by the steps each device was there over the GPU's steps in
// MIG mode (exact for a layout that did not change in the window). GPUs
// whose devices cost at most the GPU are not listed (1).
func (o *Observation) migScales() map[[2]string]float64 {
	if o.scales != nil {
		return o.scales
	}
	sum := map[[2]string]float64{}
	for k, d := range o.devices {
		if k.GPUInstance != "" {
			sum[[2]string{k.Node, k.UUID}] += CostShare(o.ModelOf(k), d.Profile) * d.Present
		}
	}
	o.scales = map[[2]string]float64{}
	for k, total := range sum {
		if g := o.gpus[k]; g != nil && g.MIGSteps > 0 && total > g.MIGSteps*(1+1e-9) {
			o.scales[k] = total / g.MIGSteps
		}
	}
	return o.scales
}

// chargeShare is the part of its GPU a MIG device costs the holders: its
// cost share, scaled down where its GPU's layout costs more than the GPU.
func (o *Observation) chargeShare(k DeviceKey, model, profile string) float64 {
	f := CostShare(model, profile)
	if s, ok := o.migScales()[[2]string{k.Node, k.UUID}]; ok {
		f /= s
	}
	return f
}

func lessDevice(a, b DeviceKey) bool {
	ka := [...]string{a.Node, a.UUID, a.GPUInstance, a.ComputeInstance}
	kb := [...]string{b.Node, b.UUID, b.GPUInstance, b.ComputeInstance}
	for i := range ka {
		if ka[i] != kb[i] {
			return ka[i] < kb[i]
		}
	}
	return false
}
