package agent_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/miggeometry"
)

// The configuration matrix: the real exporter (flags, wiring, simulated node,
// fake kubelet) renders its page over combinations of model, MIG layout,
// sharing, profile, compatibility families, DCGM and driver branch, and every
// page must be served, parse, hold no duplicate series, pass `promtool check
// metrics` and have figures that agree with each other. `go test` runs an
// all-pairs sample (every value of each dimension meets every value of every
// other dimension at least once, one board per MIG geometry table);
// GPE_MATRIX=full runs the whole product over every board
// (make test-matrix). Where promtool is on PATH, the shipped rules are also
// evaluated on the page's series and must not fail.

type matrixDim struct {
	name   string
	values []string
}

func matrixDims() []matrixDim {
	// The all-pairs sample takes one board per MIG geometry table: boards
	// that share one differ only in name, memory and PCI device ID.
	full := os.Getenv("GPE_MATRIX") == "full"
	var models []string
	tables := map[*miggeometry.Table]bool{}
	for _, m := range miggeometry.All() {
		if !full && tables[m.Table] {
			continue
		}
		tables[m.Table] = true
		models = append(models, m.Model)
	}
	return []matrixDim{
		{"model", models},
		{"mig", []string{"none", "mixed", "smallest", "compute-instances", "empty"}},
		{"sharing", []string{"exclusive", "time-slicing", "mps"}},
		{"profile", []string{"default", "lean", "full"}},
		// "virtual-gpus": dcgm-exporter's families with each time-shared
		// holder's own FB_USED and GPU_UTIL (--kubernetes-virtual-gpus);
		// "pod-meta": with the holders' pod UIDs and labels from the API
		// server (--kubernetes-enable-pod-uid and -labels).
		{"compat", []string{"off", "on", "virtual-gpus", "pod-meta"}},
		{"dcgm", []string{"off", "auto"}},
		{"driver", []string{"R535", "R550", "R580"}},
		// "bare": ECC, power and NVML events answer NOT_SUPPORTED, as on
		// consumer and some vGPU boards.
		{"board", []string{"full", "bare"}},
	}
}

// allPairs returns rows (indices into each dimension's values) that cover
// every pair of values of every two dimensions: greedy, deterministic.
func allPairs(sizes []int) [][]int {
	type pair struct{ a, va, b, vb int }
	uncovered := map[pair]bool{}
	for a := range sizes {
		for b := a + 1; b < len(sizes); b++ {
			for va := 0; va < sizes[a]; va++ {
				for vb := 0; vb < sizes[b]; vb++ {
					uncovered[pair{a, va, b, vb}] = true
				}
			}
		}
	}
	var rows [][]int
	for len(uncovered) > 0 {
		// Seed the row with the first uncovered pair (in a fixed order).
		var first *pair
		for p := range uncovered {
			if first == nil || p.a < first.a || (p.a == first.a && (p.b < first.b || (p.b == first.b && (p.va < first.va || (p.va == first.va && p.vb < first.vb))))) {
				q := p
				first = &q
			}
		}
		row := make([]int, len(sizes))
		for i := range row {
			row[i] = -1
		}
		row[first.a], row[first.b] = first.va, first.vb
		for d := range sizes {
			if row[d] >= 0 {
				continue
			}
			best, bestN := 0, -1
			for v := 0; v < sizes[d]; v++ { //nolint:gosec // G602: d ranges over sizes
				n := 0
				for e := range sizes {
					if e == d || row[e] < 0 {
						continue
					}
					p := pair{e, row[e], d, v}
					if d < e {
						p = pair{d, v, e, row[e]}
					}
					if uncovered[p] {
						n++
					}
				}
				if n > bestN {
					best, bestN = v, n
				}
			}
			row[d] = best
		}
		for a := range sizes {
			for b := a + 1; b < len(sizes); b++ {
				delete(uncovered, pair{a, row[a], b, row[b]})
			}
		}
		rows = append(rows, row)
	}
	return rows
}

func TestAllPairsCoversEveryPair(t *testing.T) {
	sizes := []int{4, 3, 2, 3}
	rows := allPairs(sizes)
	for a := range sizes {
		for b := a + 1; b < len(sizes); b++ {
			for va := 0; va < sizes[a]; va++ {
				for vb := 0; vb < sizes[b]; vb++ {
					found := false
					for _, r := range rows {
						if r[a] == va && r[b] == vb {
							found = true
						}
					}
					if !found {
						t.Errorf("pair dim%d=%d dim%d=%d not covered by %v", a, va, b, vb, rows)
					}
				}
			}
		}
	}
	if full := 4 * 3 * 2 * 3; len(rows) >= full {
		t.Errorf("%d rows: no smaller than the full product (%d)", len(rows), full)
	}
}

// matrixCase is one combination, by dimension name.
type matrixCase map[string]string

func (c matrixCase) name(dims []matrixDim) string {
	var parts []string
	for _, d := range dims {
		parts = append(parts, d.name+"="+c[d.name])
	}
	return strings.Join(parts, ",")
}

func matrixCases() []matrixCase {
	dims := matrixDims()
	sizes := make([]int, len(dims))
	for i, d := range dims {
		sizes[i] = len(d.values)
	}
	var rows [][]int
	if os.Getenv("GPE_MATRIX") == "full" {
		var rec func(prefix []int)
		rec = func(prefix []int) {
			if len(prefix) == len(sizes) {
				rows = append(rows, append([]int(nil), prefix...))
				return
			}
			for v := 0; v < sizes[len(prefix)]; v++ {
				rec(append(prefix, v))
			}
		}
		rec(nil)
	} else {
		rows = allPairs(sizes)
	}
	out := make([]matrixCase, len(rows))
	for i, r := range rows {
		c := matrixCase{}
		for d, v := range r {
			c[dims[d].name] = dims[d].values[v]
		}
		out[i] = c
	}
	return out
}

// plain reports whether a profile is a plain compute profile (no +me, +gfx,
// -me variant).
func plain(p miggeometry.Profile) bool { return !strings.ContainsAny(p.Name, "+-") }

// migLayout is GPU 1's mig: list for a layout, and how many MIG devices the
// first GPU instance has (the pods hold that many).
func migLayout(t *testing.T, m *miggeometry.Model, layout string) (yaml string, held int) {
	t.Helper()
	var smallest, half *miggeometry.Profile
	for i := range m.Profiles {
		p := &m.Profiles[i]
		if !plain(*p) {
			continue
		}
		if smallest == nil || p.Compute < smallest.Compute {
			smallest = p
		}
		if p.Compute <= m.ComputeSlices/2 && p.Compute >= 2 && (half == nil || p.Compute > half.Compute) {
			half = p
		}
	}
	// A two-slice board has no plain profile of two slices short of the
	// whole GPU: that one stands in, alone.
	for i := range m.Profiles {
		if p := &m.Profiles[i]; half == nil && plain(*p) && p.Compute >= 2 {
			half = p
		}
	}
	if smallest == nil || half == nil {
		t.Fatalf("%s: no plain smallest or half-size profile in the geometry table", m.Model)
	}
	beside := ""
	if half.Compute+smallest.Compute <= m.ComputeSlices {
		beside = ", {profile: " + smallest.Name + "}"
	}
	switch layout {
	case "none":
		return "", 0
	case "empty":
		return "mig: []", 0
	case "mixed":
		return fmt.Sprintf("mig: [{profile: %s}%s]", half.Name, beside), 1
	case "smallest":
		var l []string
		for i := 0; i < smallest.Count; i++ {
			l = append(l, "{profile: "+smallest.Name+"}")
		}
		return "mig: [" + strings.Join(l, ", ") + "]", 1
	case "compute-instances":
		return fmt.Sprintf("mig: [{profile: %s, computeInstances: 2}%s]", half.Name, beside), 2
	}
	t.Fatalf("unknown MIG layout %q", layout)
	return "", 0
}

func matrixScenario(t *testing.T, c matrixCase, m *miggeometry.Model) string {
	t.Helper()
	mig, held := migLayout(t, m, c["mig"])
	var b strings.Builder
	unsupported := ""
	if c["board"] == "bare" {
		unsupported = ", unsupported: [ecc, power, events]"
	}
	fmt.Fprintf(&b, "seed: 3\nnode: {model: %s, count: 2, driverBranch: %s%s}\n", m.Model, c["driver"], unsupported)
	b.WriteString("gpus:\n")
	if mig != "" {
		fmt.Fprintf(&b, "  - {index: 1, %s}\n", mig)
	}
	switch c["sharing"] {
	case "time-slicing":
		b.WriteString("sharing:\n  timeSlicing: {gpus: [0], replicas: 2}\n")
	case "mps":
		b.WriteString("sharing:\n  mps: {gpus: [0], replicas: 2}\n")
	}
	b.WriteString("pods:\n")
	holders := 1
	if c["sharing"] != "exclusive" {
		holders = 2
	}
	for i := 0; i < holders; i++ {
		dev := "{gpu: 0}"
		if holders > 1 {
			dev = fmt.Sprintf("{gpu: 0, replica: %d}", i)
		}
		proc := ""
		if c["sharing"] == "mps" {
			// MPS clients; the simulated node adds the GPU's MPS server.
			proc = fmt.Sprintf(", processes: [{pid: %d, memory: {mean: 0.2}, utilization: {mean: 0.3}}]", 4000+i)
		}
		fmt.Fprintf(&b, "  - {namespace: ml, name: whole-%d, labels: {app.kubernetes.io/name: whole-%d}, containers: [{name: main, devices: [%s]%s}]}\n", i, i, dev, proc)
	}
	for i := 0; i < held; i++ {
		fmt.Fprintf(&b, "  - {namespace: ml, name: mig-%d, labels: {app.kubernetes.io/name: mig-%d}, containers: [{name: main, devices: [{gpu: 1, mig: %d}]}]}\n", i, i, i)
	}
	if mig == "" {
		fmt.Fprintf(&b, "  - {namespace: web, name: other, labels: {app.kubernetes.io/name: other}, containers: [{name: main, devices: [{gpu: 1}]}]}\n")
	}
	return b.String()
}

func TestConfigurationMatrix(t *testing.T) {
	dims := matrixDims()
	cases := matrixCases()
	t.Logf("%d combinations (GPE_MATRIX=full for the whole product)", len(cases))
	// The cases wait on the exporter more than they compute: run a few at
	// once, each on its own port and scenario.
	sem := make(chan struct{}, 8)
	for _, c := range cases {
		t.Run(c.name(dims), func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			m, ok := miggeometry.ByModel(c["model"])
			if !ok {
				t.Fatalf("model %s not in the geometry table", c["model"])
			}
			sc := matrixScenario(t, c, m)
			file := filepath.Join(t.TempDir(), "node.yaml")
			if err := os.WriteFile(file, []byte(sc), 0o600); err != nil {
				t.Fatal(err)
			}
			var prices []string
			for _, n := range m.NVMLNames {
				prices = append(prices, n+"=10")
			}
			addr := freeAddr(t)
			args := []string{
				"--simulate.scenario=" + file, "--web.listen-address=" + addr,
				"--collect-interval=1s", "--nvml.device-timeout=500ms",
				"--collector.profile=" + c["profile"], "--dcgm.mode=" + c["dcgm"],
				"--idle.price=" + strings.Join(prices, ","),
			}
			switch c["compat"] {
			case "on":
				args = append(args, "--compat.dcgm-exporter")
			case "virtual-gpus":
				args = append(args, "--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-virtual-gpus")
			case "pod-meta":
				args = append(args, "--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-pod-uid",
					"--compat.dcgm-exporter.kubernetes-enable-pod-labels")
			}
			ctx, cancel := context.WithCancel(context.Background())
			var errb syncBuffer
			done := make(chan int, 1)
			go func() { done <- run(ctx, args, io.Discard, &errb) }()
			defer func() {
				cancel()
				select {
				case <-done:
				case <-time.After(10 * time.Second):
					t.Error("no shutdown within 10s")
				}
			}()
			// Wait for the state the checks need, not for a time: the pod
			// map is known (gpu_devices{state="allocated"} appears), and on
			// a board without NVML events the XID reader has found that
			// out (until its first try it counts every GPU unregistered,
			// which a loaded machine can show for seconds).
			ready := func(body string) bool {
				if !strings.Contains(body, `gpu_devices{state="allocated"}`) {
					return false
				}
				return c["board"] != "bare" || strings.Contains(body, "\ngpu_exporter_xid_events_supported 0\n")
			}
			var body string
			deadline := time.Now().Add(20 * time.Second)
			for {
				body = waitFor(t, "http://"+addr+"/metrics", 200)
				if ready(body) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the pod map (and, on a board without events, the XID reader's verdict) never showed on the page; scenario:\n%s\nlog:\n%s\npage:\n%s", sc, errb.String(), body)
				}
				time.Sleep(200 * time.Millisecond)
			}
			checkMatrixPage(t, c, m, body)
			if t.Failed() {
				t.Logf("scenario:\n%s", sc)
			}
		})
	}
}

func checkMatrixPage(t *testing.T, c matrixCase, m *miggeometry.Model, body string) {
	t.Helper()
	// No duplicate series (the parser below merges them silently).
	seen := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		if l == "" || l[0] == '#' {
			continue
		}
		key := l[:strings.LastIndexByte(l, ' ')]
		if seen[key] {
			t.Errorf("duplicate series %s", key)
		}
		seen[key] = true
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("page does not parse: %v", err)
	}
	// The compatibility families keep dcgm-exporter's names and labels
	// (camelCase, counters without _total), which promtool's linter flags
	// by design: lint the exporter's own families.
	var own []string
	for _, l := range strings.Split(body, "\n") {
		if !strings.Contains(l, "DCGM_FI_") {
			own = append(own, l)
		}
	}
	checkWithPromtool(t, strings.Join(own, "\n"))

	get := func(name string) []*dto.Metric {
		if f := fams[name]; f != nil {
			return f.Metric
		}
		return nil
	}
	label := func(x *dto.Metric, n string) string {
		for _, l := range x.Label {
			if l.GetName() == n {
				return l.GetValue()
			}
		}
		return ""
	}
	val := func(x *dto.Metric) float64 {
		switch {
		case x.Gauge != nil:
			return x.Gauge.GetValue()
		case x.Counter != nil:
			return x.Counter.GetValue()
		case x.Untyped != nil:
			return x.Untyped.GetValue()
		}
		return math.NaN()
	}

	// A holder's own series (vgpu) name its pod; the device keeps one
	// series without holder labels beside them.
	for _, name := range []string{"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"} {
		devices, holders := map[string]bool{}, map[string]bool{}
		for _, x := range get(name) {
			dev := label(x, "UUID") + "/" + label(x, "GPU_I_ID")
			if label(x, "vgpu") == "" {
				devices[dev] = true
				continue
			}
			holders[dev] = true
			if c["compat"] != "virtual-gpus" || label(x, "pod") == "" {
				t.Errorf("%s series with vgpu=%q but pod=%q under compat=%s", name, label(x, "vgpu"), label(x, "pod"), c["compat"])
			}
		}
		// A holder's pod UID and labels come with pod-meta only, on every
		// series that names the pod, from the first page on.
		for _, x := range get(name) {
			pod, uid, app := label(x, "pod"), label(x, "pod_uid"), label(x, "app_kubernetes_io_name")
			switch {
			case c["compat"] == "pod-meta" && pod != "" && (uid == "" || app != pod):
				t.Errorf("%s series of pod %q: pod_uid=%q app_kubernetes_io_name=%q, want the pod's UID and its label", name, pod, uid, app)
			case c["compat"] != "pod-meta" && app != "":
				t.Errorf("%s series of pod %q carries the pod label %q under compat=%s", name, pod, app, c["compat"])
			}
		}
		for dev := range holders {
			if !devices[dev] {
				t.Errorf("%s: per-holder series on %s without the device's own series", name, dev)
			}
		}
	}

	// One gpu_up per device: two GPUs, and one per MIG device.
	ups := map[string]int{}
	for _, x := range get("gpu_up") {
		ups[label(x, "uuid")+"/"+label(x, "gpu_instance")+"/"+label(x, "compute_instance")]++
	}
	whole := 0
	for k, n := range ups {
		if n != 1 {
			t.Errorf("%d gpu_up series for device %s", n, k)
		}
		if strings.HasSuffix(k, "//") {
			whole++
		}
	}
	if whole != 2 {
		t.Errorf("%d whole-GPU gpu_up series, want 2", whole)
	}
	migDevices := len(get("gpu_mig_info"))
	if len(ups) != 2+migDevices {
		t.Errorf("%d gpu_up series, want %d (2 GPUs and %d MIG devices)", len(ups), 2+migDevices, migDevices)
	}

	// Stranded memory within the node's memory.
	var total float64
	for _, x := range get("gpu_memory_total_bytes") {
		if label(x, "gpu_instance") == "" {
			total += val(x)
		}
	}
	for _, x := range get("gpu_memory_stranded_bytes") {
		if total > 0 && val(x) > total {
			t.Errorf("stranded %v bytes > the GPUs' %v", val(x), total)
		}
	}

	// Free slices within the model's compute slices.
	for _, x := range get("gpu_mig_free_slices") {
		if v := val(x); v < 0 || v > float64(m.ComputeSlices) {
			t.Errorf("gpu_mig_free_slices{gpu=%q} = %v, outside 0..%d", label(x, "gpu"), v, m.ComputeSlices)
		}
	}

	// Instance prices of a GPU within its price ($10).
	perGPU := map[string]float64{}
	for _, x := range get("gpu_price_dollars_per_hour") {
		if label(x, "gpu_instance") != "" {
			perGPU[label(x, "uuid")] += val(x)
		} else if v := val(x); v != 10 {
			t.Errorf("whole GPU %s priced %v, want 10", label(x, "uuid"), v)
		}
	}
	for u, v := range perGPU {
		if v > 10+1e-9 {
			t.Errorf("MIG devices of %s priced %v in all, over the GPU's 10", u, v)
		}
	}
	if c["mig"] == "mixed" || c["mig"] == "smallest" || c["mig"] == "compute-instances" {
		if len(perGPU) != 1 {
			t.Errorf("MIG devices priced on %d GPUs, want 1", len(perGPU))
		}
	}

	// Allocated + free within the schedulable devices.
	states := map[string]float64{}
	for _, x := range get("gpu_devices") {
		states[label(x, "state")] = val(x)
	}
	devices := float64(2)
	if c["mig"] != "none" {
		devices = 1 + float64(migDevices)
	}
	if a, f := states["allocated"], states["free"]; a+f > devices {
		t.Errorf("allocated %v + free %v > %v devices", a, f, devices)
	}
	if states["allocated"] < 1 {
		t.Errorf("allocated devices %v, want at least GPU 0", states["allocated"])
	}
	if len(fams) == 0 {
		t.Error("empty page")
	}
	// A board without NVML events: nothing to listen to, which is neither
	// a down collector nor GPUs left unwatched.
	if c["board"] == "bare" {
		one := func(name string, want float64) {
			if ms := get(name); len(ms) != 1 || val(ms[0]) != want {
				t.Errorf("%s on a board without events: %d series, want one of %v", name, len(ms), want)
			}
		}
		one("gpu_exporter_xid_events_supported", 0)
		one("gpu_exporter_xid_unregistered_gpus", 0)
		for _, x := range get("gpu_exporter_collector_up") {
			if label(x, "collector") == "xid" && val(x) != 1 {
				t.Errorf("xid collector down on a board without events")
			}
		}
		if n := len(get("gpu_ecc_errors_total")); n != 0 {
			t.Errorf("%d ECC series on a board without ECC", n)
		}
	}
	// A shared GPU's figures are its holders': on MPS, the server (run by
	// the device plugin's control daemon pod, which holds no GPU) is no
	// holder, no pod using the GPU, and within no client's figure.
	if strings.Contains(body, `namespace="nvidia-device-plugin"`) {
		t.Error("the MPS control daemon pod shows on the page")
	}
	if c["sharing"] != "exclusive" {
		var gpu0Total float64
		for _, x := range get("gpu_memory_total_bytes") {
			if label(x, "gpu") == "0" && label(x, "gpu_instance") == "" {
				gpu0Total = val(x)
			}
		}
		var holders []*dto.Metric
		for _, x := range get("gpu_container_memory_used_bytes") {
			if label(x, "gpu") == "0" {
				holders = append(holders, x)
			}
		}
		if len(holders) != 0 && len(holders) != 2 {
			t.Errorf("%d per-container VRAM series on the shared GPU 0, want one per holder (2)", len(holders))
		}
		for _, x := range holders {
			if v := val(x); c["sharing"] == "mps" && (v <= 0 || v > gpu0Total/2) {
				t.Errorf("MPS client %s VRAM %v, want above 0 and within its pinned limit %v", label(x, "pod"), v, gpu0Total/2)
			}
		}
	}
	// The rules on the page's series: on MIG layouts with several devices
	// per GPU in the sample (promtool takes about a second a page), on
	// every page in the full matrix.
	if c["mig"] == "compute-instances" || c["mig"] == "mixed" || os.Getenv("GPE_MATRIX") == "full" {
		checkRulesEvaluate(t, fams)
	}
}

// checkRulesEvaluate runs the shipped rules on the page's series (as one
// node's scrape, held for a few minutes) with promtool, which fails on any
// rule evaluation error (many-to-many matching, duplicate series). Matching
// and duplicates are the same on both engines; Prometheus 3's promtool
// (promtool3, make tools) evaluates these rules about four times faster
// than Debian's 2.42, so it is used where present.
func checkRulesEvaluate(t *testing.T, fams map[string]*dto.MetricFamily) {
	t.Helper()
	path, err := exec.LookPath("promtool3")
	if err != nil {
		path, err = exec.LookPath("promtool")
	}
	if err != nil {
		t.Log("promtool not found; skipping the rules evaluation")
		return
	}
	rules, err := filepath.Abs("../alerts/gpu-pool-exporter.rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rule_files:\n  - %s\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n", rules)
	var names []string
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, x := range fams[n].Metric {
			var v float64
			switch {
			case x.Gauge != nil:
				v = x.Gauge.GetValue()
			case x.Counter != nil:
				v = x.Counter.GetValue()
			case x.Untyped != nil:
				v = x.Untyped.GetValue()
			default:
				continue // summaries and histograms: no rule reads them
			}
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			labels := []string{`job="gpu-pool-exporter"`, `instance="10.0.0.1:9947"`, `node="matrix-node"`}
			for _, l := range x.Label {
				labels = append(labels, fmt.Sprintf("%s=%s", l.GetName(), strconv.Quote(l.GetValue())))
			}
			series := n + "{" + strings.Join(labels, ", ") + "}"
			fmt.Fprintf(&b, "      - series: %s\n        values: '%s'\n", strconv.Quote(series), strings.TrimSpace(strings.Repeat(strconv.FormatFloat(v, 'g', -1, 64)+" ", 6)))
		}
	}
	b.WriteString("    promql_expr_test:\n      - expr: vector(1)\n        eval_time: 5m\n        exp_samples:\n          - labels: '{}'\n            value: 1\n")
	file := filepath.Join(t.TempDir(), "rules_test.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(path, "test", "rules", file).CombinedOutput(); err != nil {
		t.Errorf("the shipped rules fail on this page's series: %v\n%s", err, out)
	}
}
