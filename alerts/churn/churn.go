// Package churn builds a simulated day of a GKE GPU cluster whose nodes come
// and go, as one promtool test that counts the alerts the shipped rules
// fire: the cluster autoscaler adds and removes nodes, spot VMs are
// preempted (re-created under the same node object, under a new one, or
// not at all for want of capacity), a node pool is surge-upgraded to
// another driver, the exporter's DaemonSet is rolled out on every node at
// once, and a few real faults happen (XIDs, an uncorrectable ECC error, a
// lost GPU), one of them on a GPU whose job is killed while its node is
// being removed, and one on an idle GPU of a node being removed, which
// must page nobody.
//
// The exporter's series are its real pages (alerts/pages: the exporter run
// in-process on a simulated node): each machine's exporter runs once over
// a compressed copy of its life (its faults, pod stops and restarts three
// minutes apart), and the day replays those pages over the machine's real
// lifetime at the scrape interval, with the node, instance, GPU UUIDs and
// the times the exporter reports moved to the day's. kube-state-metrics'
// node objects (labels, creation time, cordon, taints, capacity) come from
// the day's events.
package churn

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/pages"
)

// Step is the scrape interval of the day: GKE Managed Prometheus'
// PodMonitoring default (the exporter's pages are a minute apart).
const Step = time.Minute

// Length is how long the day runs.
const Length = 24 * time.Hour

// EvaluationInterval is the rules' evaluation interval in the test (promtool
// runs every group at it): two minutes, coarser than the shipped 15 s to
// 1 min, so that a day costs each promtool about 20 s of CPU (every rule
// cycle costs about as much as the day's series). Every condition of the
// day holds for two minutes or more.
const EvaluationInterval = 2 * time.Minute

// compressedGap is the minutes between two events of a machine's
// compressed life: the page settles in between.
const compressedGap = 3

// kind is the shape of a node pool's machines.
type kind struct {
	pool, accelerator, zone string
	model                   string
	gpus                    int
	held                    []int // GPUs the node's job holds (the others are free)
	spot                    bool
	driver, cuda            string
}

// eventKind is what happens to a machine.
type eventKind int

const (
	xidFault  eventKind = iota // the GPU raises an XID
	eccFault                   // uncorrectable ECC errors
	lostFault                  // the GPU stops answering
	podStop                    // the node's job ends (evicted or killed)
	restart                    // the exporter's container restarts: one failed scrape minute, same address
	rollout                    // the exporter's pod is replaced: no target for a minute, a new address
)

// event is one thing that happens to a machine, at a whole minute of the day.
type event struct {
	at    time.Duration
	what  eventKind
	gpu   int
	xid   int
	ecc   int
	alert string // the alert a fault must raise once; "": none
}

// span is [from, until) of the day.
type span struct{ from, until time.Duration }

func (s span) holds(t time.Duration) bool { return t >= s.from && t < s.until }

// taint is a node taint over a span.
type taint struct {
	key, value, effect string
	span
}

// machine is one VM behind a node name: its GPUs and its exporter.
type machine struct {
	target   span          // the exporter's scrape target exists
	upFrom   time.Duration // its scrapes succeed from (the driver is installed)
	downFrom time.Duration // its scrapes fail from (the VM is gone)
	events   []event
	seq      int // the machine's number in the cluster: its GPUs' UUIDs
}

// Node is one Kubernetes node name over the day: its node objects, machines,
// taints and cordons.
type Node struct {
	Name     string
	kind     *kind
	objects  []span
	machines []*machine
	taints   []taint
	cordons  []span
}

// Fault is a real fault of the day and the alert it must raise once.
type Fault struct {
	Node  string
	At    time.Duration
	What  string
	Alert string // "": none (its node is being removed and no job held the GPU)
}

// Day is the cluster over the day.
type Day struct {
	Nodes []*Node
	// System are CPU nodes kube-state-metrics lists all day.
	System   []string
	machines int
	// Events lists what happens, in order, for the docs and the test's log.
	Events []string
}

// end is past the last scrape of the day.
const end = Length + Step

func minutes(h, m int) time.Duration {
	return time.Duration(h)*time.Hour + time.Duration(m)*time.Minute
}

func clock(d time.Duration) string {
	return fmt.Sprintf("%02d:%02d", int(d.Hours()), int(d.Minutes())%60)
}

func (d *Day) logf(at time.Duration, format string, args ...any) {
	d.Events = append(d.Events, clock(at)+" "+fmt.Sprintf(format, args...))
}

// nodeName is a GKE node name: gke-<cluster>-<pool>-<group hash>-<suffix>.
func nodeName(k *kind, i int) string {
	h := sha256.Sum256([]byte(k.pool))
	s := sha256.Sum256([]byte(k.pool + strconv.Itoa(i)))
	return fmt.Sprintf("gke-gpu-%s-%x-%x", k.pool, h[:4], s[:2])
}

// add creates a node: its object at t; its exporter scheduled a minute later,
// failing its scrapes until GKE's driver installer is done (three minutes).
// A node of the day's start exists from 0 with its exporter up.
func (d *Day) add(k *kind, i int, t time.Duration) *Node {
	n := &Node{Name: nodeName(k, i), kind: k, objects: []span{{t, end}}}
	d.Nodes = append(d.Nodes, n)
	d.newMachine(n, t)
	if t > 0 {
		d.logf(t, "%s joins %s", n.Name, k.pool)
	}
	return n
}

// newMachine starts a VM behind n at t.
func (d *Day) newMachine(n *Node, t time.Duration) *machine {
	d.machines++
	m := &machine{target: span{t, end}, upFrom: t, downFrom: end, seq: d.machines}
	if t > 0 {
		// The kubelet registers the node NotReady; the exporter's pod runs a
		// minute later and crash-loops until the driver is installed.
		n.taints = append(n.taints, taint{"node.kubernetes.io/not-ready", "", "NoSchedule", span{t, t + time.Minute}})
		m.target.from = t + time.Minute
		m.upFrom = t + 4*time.Minute
	}
	n.machines = append(n.machines, m)
	return m
}

func (n *Node) machine() *machine { return n.machines[len(n.machines)-1] }

// deleteVM ends the node's current machine at vm (its scrapes fail from
// then), its node object a minute later, and its exporter's target when
// the pod is collected (gc after the VM).
func (n *Node) deleteVM(vm, gc time.Duration) {
	m := n.machine()
	m.downFrom = vm
	m.target.until = vm + gc
	n.objects[len(n.objects)-1].until = vm + time.Minute
}

// fault adds a fault to the node's machine.
func (d *Day) fault(n *Node, e event, what string) {
	n.machine().events = append(n.machine().events, e)
	d.logf(e.at, "%s: %s%s", n.Name, what, map[bool]string{true: " (pages " + e.alert + ")", false: " (pages nobody: its node is being removed and no job holds the GPU)"}[e.alert != ""])
}

// scaleDown is the cluster autoscaler removing n: a removal candidate ten
// minutes before (a soft taint), ToBeDeletedByClusterAutoscaler at t, the
// node's job evicted four minutes later, the VM deleted at t+5m, the node
// object at t+6m, the exporter's pod collected gc after the VM.
func (d *Day) scaleDown(n *Node, t, gc time.Duration) {
	n.taints = append(n.taints,
		taint{"DeletionCandidateOfClusterAutoscaler", strconv.Itoa(int((t - 10*time.Minute).Seconds())), "PreferNoSchedule", span{t - 10*time.Minute, end}},
		taint{"ToBeDeletedByClusterAutoscaler", strconv.Itoa(int(t.Seconds())), "NoSchedule", span{t, end}})
	n.machine().events = append(n.machine().events, event{at: t + 4*time.Minute, what: podStop})
	n.deleteVM(t+5*time.Minute, gc)
	d.logf(t, "cluster autoscaler removes %s (VM deleted %s, exporter target gone %s)", n.Name, clock(t+5*time.Minute), clock(t+5*time.Minute+gc))
}

// preempt is a spot VM preempted at t: the exporter's pod fails with it
// (its target goes at once), the node is unreachable from t+1m and shut
// down by the cloud from t+2m; at back a VM is re-created under the same
// node name, with other GPUs. newObject: the node object is deleted at
// t+1m and created again at back, before any taint shows.
func (d *Day) preempt(n *Node, t, back time.Duration, newObject bool) {
	m := n.machine()
	m.target.until, m.downFrom = t, t
	if newObject {
		n.objects[len(n.objects)-1].until = t + time.Minute
		n.objects = append(n.objects, span{back, end})
	} else {
		n.taints = append(n.taints,
			taint{"node.kubernetes.io/unreachable", "", "NoSchedule", span{t + time.Minute, back}},
			taint{"node.kubernetes.io/unreachable", "", "NoExecute", span{t + time.Minute, back}},
			taint{"node.cloudprovider.kubernetes.io/shutdown", "", "NoSchedule", span{t + 2*time.Minute, back}})
	}
	d.newMachine(n, back)
	how := "under the same node object"
	if newObject {
		how = "under a new node object"
	}
	d.logf(t, "spot VM %s preempted, re-created %s at %s", n.Name, how, clock(back))
}

// replace is an operator's repair: cordon at c, VM deleted at vm, node
// object a minute later, exporter target two minutes later.
func (d *Day) replace(n *Node, c, vm time.Duration) {
	n.cordons = append(n.cordons, span{c, end})
	n.taints = append(n.taints, taint{"node.kubernetes.io/unschedulable", "", "NoSchedule", span{c, end}})
	n.deleteVM(vm, 2*time.Minute)
	d.logf(c, "%s cordoned and drained; deleted at %s", n.Name, clock(vm))
}

// Plan is the day.
func Plan() *Day {
	a100 := &kind{pool: "a100-pool", accelerator: "nvidia-a100-80gb", zone: "us-central1-a", model: "A100-SXM4-80GB", gpus: 2, held: []int{0}, driver: "550.54.15", cuda: "12.4"}
	l4 := &kind{pool: "l4-spot-pool", accelerator: "nvidia-l4", zone: "us-central1-b", model: "L4-24GB", gpus: 2, held: []int{0}, spot: true, driver: "550.54.15", cuda: "12.4"}
	h100 := &kind{pool: "h100-pool", accelerator: "nvidia-h100-80gb", zone: "us-central1-c", model: "H100-SXM5-80GB", gpus: 2, held: []int{0}, driver: "550.54.15", cuda: "12.4"}
	h100new := *h100
	h100new.driver = "550.90.07"

	d := &Day{System: []string{"gke-gpu-default-pool-1a2b3c4d-0001", "gke-gpu-default-pool-1a2b3c4d-0002", "gke-gpu-default-pool-1a2b3c4d-0003"}}
	a := []*Node{d.add(a100, 0, 0), d.add(a100, 1, 0)}
	l := []*Node{d.add(l4, 0, 0), d.add(l4, 1, 0), d.add(l4, 2, 0), d.add(l4, 3, 0)}
	h := []*Node{d.add(h100, 0, 0), d.add(h100, 1, 0), d.add(h100, 2, 0)}

	// 03:10 XID 48 on an A100; the exporter restarts at 03:20 (OOM); the
	// operator cordons the node at 03:25 and deletes it at 03:45; the
	// autoscaler (minimum two nodes) adds another at 03:46.
	d.fault(a[1], event{at: minutes(3, 10), what: xidFault, gpu: 1, xid: 48, alert: "GPUXIDResetRequired"}, "XID 48 on GPU 1")
	a[1].machine().events = append(a[1].machine().events, event{at: minutes(3, 20), what: restart})
	d.logf(minutes(3, 20), "exporter on %s restarts", a[1].Name)
	d.replace(a[1], minutes(3, 25), minutes(3, 45))
	a = append(a, d.add(a100, 5, minutes(3, 46)))

	d.preempt(l[1], minutes(6, 0), minutes(6, 5), false)

	a = append(a, d.add(a100, 2, minutes(8, 0)), d.add(a100, 3, minutes(8, 0)))

	// 09:00 XID 79 on a spot L4 whose job holds the GPU; preempted at 09:02.
	d.fault(l[2], event{at: minutes(9, 0), what: xidFault, gpu: 0, xid: 79, alert: "GPUXIDNodeRebootRequired"}, "XID 79 on GPU 0 (its job's)")
	d.preempt(l[2], minutes(9, 2), minutes(9, 6), true)

	a = append(a, d.add(a100, 4, minutes(9, 30)))

	// 11:00-11:45 surge upgrade of the H100 pool to another driver: a new
	// node, then an old one cordoned, drained for ten minutes and deleted.
	d.logf(minutes(11, 0), "surge upgrade of h100-pool to driver %s begins", h100new.driver)
	for i, old := range h {
		t := minutes(11, 15*i)
		h = append(h, d.add(&h100new, 3+i, t))
		d.replace(old, t+2*time.Minute, t+12*time.Minute)
	}
	h3, h4, h5 := h[3], h[4], h[5]

	// 13:40 an uncorrectable ECC error, 13:50 XID 48; 14:00 the exporter's
	// DaemonSet is rolled out on every node at once.
	d.fault(h4, event{at: minutes(13, 40), what: eccFault, gpu: 1, ecc: 2, alert: "GPUUncorrectableECCErrors"}, "2 uncorrectable ECC errors on GPU 1")
	d.fault(h5, event{at: minutes(13, 50), what: xidFault, gpu: 0, xid: 48, alert: "GPUXIDResetRequired"}, "XID 48 on GPU 0 (its job's)")
	d.rollout(minutes(14, 0))

	// 15:00 a spot VM preempted and no capacity for an hour and a half.
	d.preempt(l[3], minutes(15, 0), minutes(16, 30), false)

	// 17:00 the autoscaler removes an A100 node whose job is still being
	// evicted when XID 79 kills it: that pages.
	d.scaleDown(a[4], minutes(17, 0), time.Minute)
	d.fault(a[4], event{at: minutes(17, 1), what: xidFault, gpu: 0, xid: 79, alert: "GPUXIDNodeRebootRequired"}, "XID 79 on GPU 0, killing its job during the removal")

	// 18:00 a GPU of the upgraded pool stops answering; the operator
	// replaces the node at 18:40.
	d.fault(h3, event{at: minutes(18, 0), what: lostFault, gpu: 1, alert: "GPULost"}, "GPU 1 stops answering")
	d.replace(h3, minutes(18, 20), minutes(18, 40))
	d.add(&h100new, 6, minutes(18, 41))

	// 18:10 the autoscaler removes another A100 node; XID 48 on its idle
	// GPU during the removal; its exporter's pod is collected late.
	d.scaleDown(a[3], minutes(18, 10), 9*time.Minute)
	d.fault(a[3], event{at: minutes(18, 12), what: xidFault, gpu: 1, xid: 48}, "XID 48 on idle GPU 1 during the removal")

	d.scaleDown(a[2], minutes(19, 20), time.Minute)
	d.preempt(l[0], minutes(21, 0), minutes(21, 6), false)

	sort.SliceStable(d.Events, func(i, j int) bool { return d.Events[i][:5] < d.Events[j][:5] })
	return d
}

// rollout replaces every running exporter pod at t: no target for a minute,
// then a new address.
func (d *Day) rollout(t time.Duration) {
	for _, n := range d.Nodes {
		m := n.machine()
		if m.target.holds(t) && m.upFrom <= t && m.downFrom > t {
			m.events = append(m.events, event{at: t, what: rollout})
		}
	}
	d.logf(t, "the exporter's DaemonSet is rolled out on every node at once")
}

// Faults are the day's real faults.
func (d *Day) Faults() []Fault {
	var out []Fault
	for _, n := range d.Nodes {
		for _, m := range n.machines {
			for _, e := range m.events {
				var what string
				switch e.what {
				case xidFault:
					what = fmt.Sprintf("XID %d on GPU %d", e.xid, e.gpu)
				case eccFault:
					what = fmt.Sprintf("%d uncorrectable ECC errors on GPU %d", e.ecc, e.gpu)
				case lostFault:
					what = fmt.Sprintf("GPU %d lost", e.gpu)
				default:
					continue
				}
				out = append(out, Fault{Node: n.Name, At: e.at, What: what, Alert: e.alert})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// Expected is, per alert name and node, how many times it must fire over the
// day: once per fault that pages.
func (d *Day) Expected() map[[2]string]int {
	out := map[[2]string]int{}
	for _, f := range d.Faults() {
		if f.Alert != "" {
			out[[2]string{f.Alert, f.Node}]++
		}
	}
	return out
}

// steps is the number of scrapes over the day.
const steps = int(Length/Step) + 1

// builder accumulates the day's series.
type builder struct {
	series map[string]*daySeries
	runs   map[string][]runSeries // pages.Run's series per compressed life
	keep   map[string]bool
	parse  parser.Parser
	pods   int // exporter pods so far: their addresses
}

// daySeries is a series over the day, its values in one array.
type daySeries struct {
	*pages.Series
	values []float64
}

// get returns the day's series of key, new and empty the first time.
func (b *builder) get(key string) *daySeries {
	s := b.series[key]
	if s == nil {
		s = &daySeries{&pages.Series{Labels: key, Values: make([]*float64, steps), Stale: make([]bool, steps)}, make([]float64, steps)}
		b.series[key] = s
	}
	return s
}

func (s *daySeries) set(step int, v float64) {
	s.values[step] = v
	s.Values[step] = &s.values[step]
}

// Build renders the day as a promtool test file for the rules file at
// rulesPath (parsed as rf) and CountRules at countPath: its input series,
// and the counts of the alerts that fire over the day (firing episodes,
// distinct alerts, and minutes firing about a node that left, per alert
// name and node) as promql_expr_test at the day's end.
func Build(d *Day, rf *alerts.RuleFile, rulesPath, countPath string) ([]byte, error) {
	keep, err := pages.RuleMetrics(rf)
	if err != nil {
		return nil, err
	}
	b := &builder{series: map[string]*daySeries{}, runs: map[string][]runSeries{}, keep: keep, parse: parser.NewParser(parser.Options{})}
	for _, n := range d.Nodes {
		for _, m := range n.machines {
			if err := b.exporter(n, m); err != nil {
				return nil, fmt.Errorf("%s: %w", n.Name, err)
			}
		}
		b.kubeStateMetrics(n)
	}
	for _, s := range d.System {
		b.steadyObject(s, "default-pool")
	}
	for _, s := range b.series {
		for t := 1; t < steps; t++ {
			s.Stale[t] = s.Values[t] == nil && s.Values[t-1] != nil
		}
	}
	return render(d, b, rf, []string{rulesPath, countPath})
}

// anchor ties a minute of the day to a minute of a machine's compressed
// life: the exporter's first page, and each minute with events.
type anchor struct {
	day, c int       // the day's minute, the compressed run's minute
	what   eventKind // the (last) event of the minute
	event  bool      // false: the exporter's first page
}

// compress writes machine m's compressed life as a simulated node's
// scenario (its kind's GPUs and job, its faults and the job's end three
// minutes apart), with the minutes at which its exporter restarts, and
// the anchors that map it back to the day.
func (m *machine) compress(k *kind) (scenario string, restarts []int, anchors []anchor, err error) {
	slices.SortStableFunc(m.events, func(x, y event) int { return int(x.at - y.at) })
	anchors = []anchor{{day: int(m.upFrom / time.Minute)}}
	var faults []string
	stop := ""
	for _, e := range m.events {
		if e.at%time.Minute != 0 || e.at < m.upFrom || e.at >= m.downFrom {
			return "", nil, nil, fmt.Errorf("event at %s: not a whole minute while the exporter serves (%s to %s)", e.at, m.upFrom, m.downFrom)
		}
		day := int(e.at / time.Minute)
		if last := anchors[len(anchors)-1]; !last.event || last.day != day {
			anchors = append(anchors, anchor{day: day, c: compressedGap * len(anchors), what: e.what, event: true})
		} else if e.what == restart || e.what == rollout || last.what == restart || last.what == rollout {
			return "", nil, nil, fmt.Errorf("event at %s: a restart shares its minute with another event", e.at)
		}
		c := anchors[len(anchors)-1].c
		switch e.what {
		case xidFault:
			faults = append(faults, fmt.Sprintf("  - {at: %dm, gpu: %d, xid: %d}", c, e.gpu, e.xid))
		case eccFault:
			faults = append(faults, fmt.Sprintf("  - {at: %dm, gpu: %d, ecc: {uncorrected: %d}}", c, e.gpu, e.ecc))
		case lostFault:
			faults = append(faults, fmt.Sprintf("  - {at: %dm, gpu: %d, lost: true}", c, e.gpu))
		case podStop:
			stop = fmt.Sprintf("    stop: %dm\n", c)
		case restart, rollout:
			restarts = append(restarts, c)
		}
	}
	var sc strings.Builder
	fmt.Fprintf(&sc, "seed: 1\nsteady: true\nnode: {name: template, model: %s, count: %d, driverVersion: %q, cudaDriverVersion: %q}\ngpus:\n", k.model, k.gpus, k.driver, k.cuda)
	var devices []string
	for i := 0; i < k.gpus; i++ {
		preset := "free"
		if slices.Contains(k.held, i) {
			preset = "busy"
			devices = append(devices, fmt.Sprintf("{gpu: %d}", i))
		}
		fmt.Fprintf(&sc, "  - index: %d\n    workload: {preset: %s}\n", i, preset)
	}
	if len(devices) > 0 {
		fmt.Fprintf(&sc, "pods:\n  - namespace: ml\n    name: job\n%s    containers:\n      - name: main\n        devices: [%s]\n", stop, strings.Join(devices, ", "))
	}
	if len(faults) > 0 {
		sc.WriteString("faults:\n" + strings.Join(faults, "\n") + "\n")
	}
	return sc.String(), restarts, anchors, nil
}

// runSeries is a series of a compressed run: its labels, and, for a time
// the exporter serves, whether it is the sample's (its last sample) or an
// event's.
type runSeries struct {
	name   string
	labels labels.Labels
	now    bool
	values []*float64
}

// run runs the exporter over a compressed life, once per distinct life.
func (b *builder) run(scenario string, restarts []int, minutes int) ([]runSeries, error) {
	key := fmt.Sprint(scenario, restarts, minutes)
	if rs, ok := b.runs[key]; ok {
		return rs, nil
	}
	run, err := pages.Run(&pages.Source{Scenario: scenario, Minutes: minutes, QuietEvery: 1, Restarts: restarts}, b.keep)
	if err != nil {
		return nil, fmt.Errorf("simulated exporter: %w", err)
	}
	var rs []runSeries
	for _, s := range run {
		ls, err := b.parse.ParseMetric(s.Labels)
		if err != nil {
			return nil, fmt.Errorf("page series %s: %w", s.Labels, err)
		}
		name := ls.Get(model.MetricNameLabel)
		now := false
		if strings.HasSuffix(name, "_timestamp_seconds") {
			present := 0
			now = true
			for c, v := range s.Values {
				if v != nil {
					present++
					now = now && *v == float64(c*60)
				}
			}
			now = now && present > 1
		}
		rs = append(rs, runSeries{name: name, labels: ls, now: now, values: s.Values})
	}
	b.runs[key] = rs
	return rs, nil
}

// instance is the scrape address of a new exporter pod.
func (b *builder) instance() string {
	b.pods++
	return fmt.Sprintf("10.%d.%d.%d:9947", 64+b.pods/250%64, b.pods/250/64, 2+b.pods%250)
}

// exporter adds the series of machine m's exporter: up, and its real pages
// from the compressed run replayed over the machine's day, with the node,
// the pod's address, the machine's GPU UUIDs and the day's times.
func (b *builder) exporter(n *Node, m *machine) error {
	scenario, restarts, anchors, err := m.compress(n.kind)
	if err != nil {
		return err
	}
	rs, err := b.run(scenario, restarts, anchors[len(anchors)-1].c+compressedGap)
	if err != nil {
		return err
	}
	// eventTime moves a time the exporter reported in the compressed run to
	// the day: relative to the latest anchor at or before it.
	eventTime := func(v float64) float64 {
		a := anchors[0]
		for _, x := range anchors {
			if float64(x.c*60) <= v {
				a = x
			}
		}
		return float64(a.day*60) + v - float64(a.c*60)
	}
	inst := b.instance()
	rolled := 0
	var day []*daySeries // the day's series of each run series, for the pod serving now
	for step := 0; step < steps; step++ {
		t := time.Duration(step) * Step
		if !m.target.holds(t) {
			continue
		}
		minute := int(t / time.Minute)
		ai := 0
		for i, a := range anchors {
			if a.day <= minute && (i == 0 || a.event) {
				ai = i
			}
		}
		a := anchors[ai]
		// The pod serving now: a new address per rollout passed.
		r := 0
		for _, x := range anchors[1 : ai+1] {
			if x.what == rollout {
				r++
			}
		}
		for ; rolled < r; rolled++ {
			inst = b.instance()
			day = nil
		}
		if day == nil {
			day = make([]*daySeries, len(rs))
		}
		target := map[string]string{"job": pages.Job, "instance": inst, "node": n.Name}
		if t < m.upFrom || t >= m.downFrom {
			b.get(pages.SeriesKey("up", target)).set(step, 0)
			continue
		}
		gap := compressedGap
		if ai+1 < len(anchors) {
			gap = anchors[ai+1].c - a.c
		}
		c := a.c + min(minute-a.day, gap-1)
		if a.event && a.what == rollout {
			// No target in the rollout's minute; the new pod serves from
			// the next, as the run's new process does.
			if minute == a.day {
				continue
			}
			c = a.c + 1 + min(minute-a.day-1, gap-2)
		}
		for i, s := range rs {
			v := s.values[c]
			if v == nil {
				continue
			}
			val := *v
			if strings.HasSuffix(s.name, "_timestamp_seconds") {
				if s.now {
					val = t.Seconds()
				} else {
					val = eventTime(val)
				}
			}
			if day[i] == nil {
				day[i] = b.get(b.dayKey(s, target, m.seq, n.Name))
			}
			day[i].set(step, val)
		}
	}
	return nil
}

// dayKey is a run series' key on the day: the target's labels, machine
// seq's GPU UUIDs, and the job's pod named after its node.
func (b *builder) dayKey(s runSeries, target map[string]string, seq int, node string) string {
	ls := map[string]string{}
	s.labels.Range(func(l labels.Label) {
		if l.Name != model.MetricNameLabel {
			ls[l.Name] = l.Value
		}
	})
	for k, v := range target {
		ls[k] = v
	}
	if u := ls["uuid"]; u != "" {
		ls["uuid"] = machineUUID(seq, u)
	}
	if p := ls["pod"]; p != "" {
		ls["pod"] = p + "-" + node[len(node)-4:]
	}
	return pages.SeriesKey(s.name, ls)
}

// machineUUID is a GPU UUID of machine seq, in NVIDIA's format.
func machineUUID(seq int, template string) string {
	h := sha256.Sum256([]byte(strconv.Itoa(seq) + template))
	x := fmt.Sprintf("%x", h[:16])
	return "GPU-" + x[:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32]
}

// ksm are the target labels of kube-state-metrics' series.
var ksm = map[string]string{"job": "kube-state-metrics", "instance": "10.8.0.5:8080"}

func withKSM(ls map[string]string) map[string]string {
	for k, v := range ksm {
		ls[k] = v
	}
	return ls
}

// kubeStateMetrics adds n's node objects as kube-state-metrics serves them.
func (b *builder) kubeStateMetrics(n *Node) {
	k := n.kind
	nodeLabels := withKSM(map[string]string{
		"node":                                   n.Name,
		"label_cloud_google_com_gke_nodepool":    k.pool,
		"label_cloud_google_com_gke_accelerator": k.accelerator,
		"label_topology_kubernetes_io_zone":      k.zone,
	})
	if k.spot {
		nodeLabels["label_cloud_google_com_gke_spot"] = "true"
	}
	node := withKSM(map[string]string{"node": n.Name})
	labelsSeries, created, unschedulable := b.get(pages.SeriesKey("kube_node_labels", nodeLabels)), b.get(pages.SeriesKey("kube_node_created", node)), b.get(pages.SeriesKey("kube_node_spec_unschedulable", node))
	capacity := b.get(pages.SeriesKey("kube_node_status_capacity", withKSM(map[string]string{"node": n.Name, "resource": "nvidia_com_gpu", "unit": "integer"})))
	taints := append([]taint{{"nvidia.com/gpu", "present", "NoSchedule", span{0, end}}}, n.taints...)
	taintSeries := make([]*daySeries, len(taints))
	for i, tt := range taints {
		taintSeries[i] = b.get(pages.SeriesKey("kube_node_spec_taint", withKSM(map[string]string{"node": n.Name, "key": tt.key, "value": tt.value, "effect": tt.effect})))
	}
	for step := 0; step < steps; step++ {
		t := time.Duration(step) * Step
		var obj *span
		for i := range n.objects {
			if n.objects[i].holds(t) {
				obj = &n.objects[i]
			}
		}
		if obj == nil {
			continue
		}
		labelsSeries.set(step, 1)
		created.set(step, obj.from.Seconds())
		capacity.set(step, float64(k.gpus))
		cordoned := 0.0
		for _, c := range n.cordons {
			if c.holds(t) {
				cordoned = 1
			}
		}
		unschedulable.set(step, cordoned)
		for i, tt := range taints {
			if tt.holds(t) {
				taintSeries[i].set(step, 1)
			}
		}
	}
}

// steadyObject adds a node kube-state-metrics lists all day, without GPUs.
func (b *builder) steadyObject(name, pool string) {
	keys := map[string]float64{
		pages.SeriesKey("kube_node_labels", withKSM(map[string]string{"node": name, "label_cloud_google_com_gke_nodepool": pool})): 1,
		pages.SeriesKey("kube_node_created", withKSM(map[string]string{"node": name})):                                             0,
		pages.SeriesKey("kube_node_spec_unschedulable", withKSM(map[string]string{"node": name})):                                  0,
	}
	for key, v := range keys {
		s := b.get(key)
		for step := 0; step < steps; step++ {
			s.set(step, v)
		}
	}
}

// PagesQuery counts, per alert name and node, the firing episodes of the
// day: evaluations where an alert fires and did not one evaluation before
// (Alertmanager sends each as a new notification).
var PagesQuery = fmt.Sprintf(`sum by (alertname, node) (sum_over_time((ALERTS{alertstate="firing"} unless ALERTS{alertstate="firing"} offset %[1]s)[%[2]s:%[1]s]))`,
	promDuration(EvaluationInterval), promDuration(Length))

// DistinctQuery counts, per alert name and node, the distinct alerts (label
// sets) that fired over the day.
var DistinctQuery = fmt.Sprintf(`count by (alertname, node) (last_over_time(ALERTS{alertstate="firing"}[%s]))`, promDuration(Length))

// CountRules is a rule file the test loads after the shipped rules: the
// alerts firing about a node that kube-state-metrics does not list, at
// every evaluation (a recording, so that the day's count reads a few
// sparse series rather than every node object at every step).
const CountRules = `groups:
  - name: churn.count
    rules:
      - record: churn:alerts_firing_departed:count
        expr: count by (alertname, node) (ALERTS{alertstate="firing"} unless on (node) kube_node_labels)
`

// countGroup is CountRules' group, evaluated after the shipped ones.
const countGroup = "churn.count"

// DepartedQuery counts, per alert name and node, the minutes an alert
// fired about a node that kube-state-metrics no longer listed: it must find
// none.
var DepartedQuery = fmt.Sprintf(`sum by (alertname, node) (count_over_time(churn:alerts_firing_departed:count[%s])) * %g`,
	promDuration(Length), EvaluationInterval.Minutes())

func promDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0 && d >= 24*time.Hour && d%(24*time.Hour) == 0:
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// render writes the promtool test file.
func render(d *Day, b *builder, rf *alerts.RuleFile, ruleFiles []string) ([]byte, error) {
	type sample struct {
		Labels string  `yaml:"labels"`
		Value  float64 `yaml:"value"`
	}
	type exprTest struct {
		Expr       string   `yaml:"expr"`
		EvalTime   string   `yaml:"eval_time"`
		ExpSamples []sample `yaml:"exp_samples"`
	}
	type test struct {
		Name           string              `yaml:"name"`
		Interval       string              `yaml:"interval"`
		InputSeries    []pages.InputSeries `yaml:"input_series"`
		PromQLExprTest []exprTest          `yaml:"promql_expr_test"`
	}
	type file struct {
		RuleFiles          []string `yaml:"rule_files"`
		EvaluationInterval string   `yaml:"evaluation_interval"`
		GroupEvalOrder     []string `yaml:"group_eval_order"`
		Tests              []test   `yaml:"tests"`
	}
	keys := make([]string, 0, len(b.series))
	for k := range b.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	t := test{Name: "a day of cluster churn", Interval: promDuration(Step)}
	for _, k := range keys {
		t.InputSeries = append(t.InputSeries, pages.InputSeries{Series: k, Values: b.series[k].ValuesString()})
	}
	var want []sample
	for k, v := range d.Expected() {
		want = append(want, sample{Labels: pages.SeriesKey("", map[string]string{"alertname": k[0], "node": k[1]}), Value: float64(v)})
	}
	sort.Slice(want, func(i, j int) bool { return want[i].Labels < want[j].Labels })
	at := promDuration(Length)
	t.PromQLExprTest = []exprTest{
		{Expr: PagesQuery, EvalTime: at, ExpSamples: want},
		{Expr: DistinctQuery, EvalTime: at, ExpSamples: want},
		{Expr: DepartedQuery, EvalTime: at, ExpSamples: []sample{}},
	}
	out, err := yaml.Marshal(file{RuleFiles: ruleFiles, EvaluationInterval: promDuration(EvaluationInterval), GroupEvalOrder: append(rf.GroupNames(), countGroup), Tests: []test{t}})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	buf.WriteString("# A simulated day of cluster churn (alerts/churn); generated by its test.\n")
	for _, e := range d.Events {
		buf.WriteString("#   " + e + "\n")
	}
	buf.Write(out)
	return buf.Bytes(), nil
}
