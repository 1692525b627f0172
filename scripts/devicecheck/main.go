// Command devicecheck runs the exporter binary on a machine with NVIDIA GPUs
// and compares its page with nvidia-smi: identity, driver and CUDA versions,
// memory used and reserved, utilisation, temperature, power and, where MIG is
// enabled, the GPU instances. It prints one table and exits 1 when a value is
// beyond its stated tolerance (2 when the check itself cannot run).
//
// scripts/device-check is the entry point; see docs/drivers.md.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK       = 0
	exitMismatch = 1
	exitSetup    = 2
)

type config struct {
	binary     string
	library    string
	nvidiaSMI  string
	settle     time.Duration
	exporterFl []string
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("device-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	var extra string
	fs.StringVar(&c.binary, "binary", "", "exporter binary to run (default: go build ./cmd/gpu-pool-exporter)")
	fs.StringVar(&c.library, "nvml.library", "", "libnvidia-ml.so.1 to load (default: the dynamic loader's search path)")
	fs.StringVar(&c.nvidiaSMI, "nvidia-smi", "nvidia-smi", "nvidia-smi to compare with")
	fs.DurationVar(&c.settle, "settle", 4*time.Second, "how long the exporter samples before the comparison")
	fs.StringVar(&extra, "exporter-args", "", "extra exporter flags, space separated")
	if err := fs.Parse(args); err != nil {
		return exitSetup
	}
	c.exporterFl = strings.Fields(extra)
	rows, err := check(ctx, c, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "device-check: %v\n", err)
		return exitSetup
	}
	if printTable(stdout, rows) {
		fmt.Fprintln(stdout, "\nFAIL: values beyond tolerance (see the rows marked FAIL)")
		return exitMismatch
	}
	fmt.Fprintln(stdout, "\nOK: the exporter agrees with nvidia-smi")
	return exitOK
}

func check(ctx context.Context, c config, _ io.Writer) ([]row, error) {
	smi, err := querySMI(ctx, c.nvidiaSMI)
	if err != nil {
		return nil, err
	}
	bin := c.binary
	if bin == "" {
		dir, err := os.MkdirTemp("", "device-check-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "gpu-pool-exporter")
		out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/gpu-pool-exporter").CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("go build ./cmd/gpu-pool-exporter (run from the repository root): %v\n%s", err, out)
		}
	}
	page, logs, err := scrapeExporter(ctx, bin, c)
	if err != nil {
		return nil, fmt.Errorf("%v\nexporter log:\n%s", err, logs)
	}
	if strings.Contains(logs, "symbol lookup error") {
		return nil, fmt.Errorf("the exporter crashed:\n%s", logs)
	}
	return compare(page, smi), nil
}

// ---- nvidia-smi ---------------------------------------------------------

// smiFields are the --query-gpu fields compared; memory.reserved is left out
// (and reported missing) by drivers that do not know it.
var smiFields = []string{"index", "uuid", "name", "pci.bus_id", "driver_version", "memory.total", "memory.used",
	"memory.reserved", "utilization.gpu", "temperature.gpu", "power.draw", "power.limit", "mig.mode.current"}

// smiGPU is one GPU's nvidia-smi answers, by field; "" where it has none.
type smiGPU map[string]string

type smiNode struct {
	GPUs []smiGPU
	CUDA string
	// MIG maps GPU index to its GPU instances as "profile/instanceID".
	MIG map[string][]string
}

func querySMI(ctx context.Context, smi string) (*smiNode, error) {
	fields := smiFields
	out, err := exec.CommandContext(ctx, smi, "--query-gpu="+strings.Join(fields, ","), "--format=csv,noheader,nounits").CombinedOutput()
	if err != nil && bytes.Contains(out, []byte("memory.reserved")) {
		// Older drivers do not know memory.reserved.
		fields = slicesDelete(fields, "memory.reserved")
		out, err = exec.CommandContext(ctx, smi, "--query-gpu="+strings.Join(fields, ","), "--format=csv,noheader,nounits").CombinedOutput()
	}
	if err != nil {
		return nil, fmt.Errorf("%s --query-gpu: %v\n%s", smi, err, out)
	}
	gpus, err := parseQuery(out, fields)
	if err != nil {
		return nil, err
	}
	head, err := exec.CommandContext(ctx, smi).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %v\n%s", smi, err, head)
	}
	n := &smiNode{GPUs: gpus, CUDA: parseCUDAVersion(head), MIG: map[string][]string{}}
	for _, g := range gpus {
		if g["mig.mode.current"] == "Enabled" {
			out, err := exec.CommandContext(ctx, smi, "mig", "-lgi").CombinedOutput()
			if err != nil {
				return nil, fmt.Errorf("%s mig -lgi: %v\n%s", smi, err, out)
			}
			n.MIG = parseMIGInstances(out)
			break
		}
	}
	return n, nil
}

func slicesDelete(s []string, x string) []string {
	var out []string
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}

// parseQuery reads --format=csv,noheader,nounits output. "[N/A]" and
// "[Not Supported]" become "".
func parseQuery(out []byte, fields []string) ([]smiGPU, error) {
	r := csv.NewReader(bytes.NewReader(out))
	r.TrimLeadingSpace = true
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi --query-gpu output: %v\n%s", err, out)
	}
	var gpus []smiGPU
	for i, rec := range recs {
		if len(rec) != len(fields) {
			return nil, fmt.Errorf("nvidia-smi --query-gpu line %d has %d fields, want %d (%s)", i+1, len(rec), len(fields), strings.Join(fields, ","))
		}
		g := smiGPU{}
		for j, f := range fields {
			v := strings.TrimSpace(rec[j])
			if strings.HasPrefix(v, "[") {
				v = ""
			}
			g[f] = v
		}
		gpus = append(gpus, g)
	}
	if len(gpus) == 0 {
		return nil, errors.New("nvidia-smi lists no GPU")
	}
	return gpus, nil
}

var cudaRE = regexp.MustCompile(`CUDA Version:\s*([0-9]+\.[0-9]+)`)

// parseCUDAVersion reads "CUDA Version: 12.4" from nvidia-smi's header.
func parseCUDAVersion(out []byte) string {
	if m := cudaRE.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return ""
}

// migRowRE matches a row of nvidia-smi mig -lgi:
// "|   0  MIG 3g.40gb          9        2          4:4     |".
var migRowRE = regexp.MustCompile(`^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+):(\d+)\s*\|`)

// parseMIGInstances reads nvidia-smi mig -lgi into GPU index -> sorted
// "profile/instanceID".
func parseMIGInstances(out []byte) map[string][]string {
	m := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if r := migRowRE.FindStringSubmatch(sc.Text()); r != nil {
			m[r[1]] = append(m[r[1]], r[2]+"/"+r[4])
		}
	}
	for _, v := range m {
		sort.Strings(v)
	}
	return m
}

// ---- the exporter -------------------------------------------------------

func scrapeExporter(ctx context.Context, bin string, c config) (map[string]*dto.MetricFamily, string, error) {
	args := []string{"--no-kubelet.enabled", "--web.listen-address=127.0.0.1:0", "--collect-interval=1s", "--log.format=json"}
	if c.library != "" {
		args = append(args, "--nvml.library="+c.library)
	}
	args = append(args, c.exporterFl...)
	cmd := exec.CommandContext(ctx, bin, args...)
	var logs lockedBuf
	pr, pw := io.Pipe()
	cmd.Stderr = io.MultiWriter(&logs, pw)
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var l struct{ Message, Address string }
			if json.Unmarshal(sc.Bytes(), &l) == nil && l.Message == "serving /metrics" && l.Address != "" {
				select {
				case addr <- l.Address:
				default:
				}
			}
		}
	}()
	var a string
	select {
	case a = <-addr:
	case err := <-exited:
		return nil, logs.String(), fmt.Errorf("the exporter exited at start: %v", err)
	case <-time.After(60 * time.Second):
		return nil, logs.String(), errors.New("the exporter did not start listening within 60s")
	}
	time.Sleep(c.settle)
	resp, err := http.Get("http://" + a + "/metrics")
	if err != nil {
		return nil, logs.String(), err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	f, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, logs.String(), fmt.Errorf("parsing /metrics: %v", err)
	}
	select {
	case err := <-exited:
		return nil, logs.String(), fmt.Errorf("the exporter died: %v", err)
	default:
	}
	return f, logs.String(), nil
}

// lockedBuf is the exporter's log, written by exec's copier while read here.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// series returns a family's samples as labels -> value.
func series(f map[string]*dto.MetricFamily, name string) []sampleT {
	mf := f[name]
	if mf == nil {
		return nil
	}
	var out []sampleT
	for _, m := range mf.Metric {
		s := sampleT{labels: map[string]string{}}
		for _, l := range m.Label {
			s.labels[l.GetName()] = l.GetValue()
		}
		switch {
		case m.Gauge != nil:
			s.value = m.Gauge.GetValue()
		case m.Counter != nil:
			s.value = m.Counter.GetValue()
		case m.Untyped != nil:
			s.value = m.Untyped.GetValue()
		}
		out = append(out, s)
	}
	return out
}

type sampleT struct {
	labels map[string]string
	value  float64
}

// wholeGPU finds a family's value for a whole GPU (not a MIG instance).
func wholeGPU(f map[string]*dto.MetricFamily, name, gpu string) (float64, bool) {
	for _, s := range series(f, name) {
		if s.labels["gpu"] == gpu && s.labels["gpu_instance"] == "" {
			return s.value, true
		}
	}
	return 0, false
}

// ---- comparison ---------------------------------------------------------

type row struct {
	gpu, field, ours, smi, tolerance string
	ok                               bool
	skipped                          bool // neither side has a value
}

// numeric compares a value with an absolute tolerance; tolRel (a fraction
// of the nvidia-smi value) widens it where larger.
type numeric struct {
	field  string // the row's name
	smi    string // nvidia-smi field
	family string // our family
	scale  float64
	tolAbs float64
	tolRel float64
	unit   string
}

// The tolerances: values read moments apart by two programs. Memory used is
// held to 64 MiB, below the few hundred MiB a driver reserves, so counting
// reserved memory as used (NVML's v1 call) is caught.
var numerics = []numeric{
	{"memory.total", "memory.total", "gpu_memory_total_bytes", 1.0 / (1 << 20), 1, 0, "MiB"},
	{"memory.used", "memory.used", "gpu_memory_used_bytes", 1.0 / (1 << 20), 64, 0, "MiB"},
	{"memory.reserved", "memory.reserved", "gpu_memory_reserved_bytes", 1.0 / (1 << 20), 1, 0, "MiB"},
	{"utilization.gpu", "utilization.gpu", "gpu_utilization_ratio", 100, 10, 0, "%"},
	{"temperature.gpu", "temperature.gpu", "gpu_temperature_celsius", 1, 3, 0, "C"},
	{"power.draw", "power.draw", "gpu_power_watts", 1, 10, 0.15, "W"},
	{"power.limit", "power.limit", "gpu_power_limit_watts", 1, 1, 0, "W"},
}

func compare(f map[string]*dto.MetricFamily, smi *smiNode) []row {
	var rows []row
	add := func(r row) { rows = append(rows, r) }
	// Node: driver and CUDA versions.
	var drv, cuda string
	for _, s := range series(f, "gpu_driver_info") {
		drv, cuda = s.labels["driver_version"], s.labels["cuda_driver_version"]
	}
	add(row{gpu: "-", field: "driver_version", ours: orNone(drv), smi: orNone(smi.GPUs[0]["driver_version"]), tolerance: "exact",
		ok: drv == smi.GPUs[0]["driver_version"]})
	add(row{gpu: "-", field: "cuda_version", ours: orNone(cuda), smi: orNone(smi.CUDA), tolerance: "exact", ok: cuda == smi.CUDA})
	ours := map[string]map[string]string{} // gpu -> uuid, model, bus
	for _, s := range series(f, "gpu_info") {
		if s.labels["gpu_instance"] != "" {
			continue
		}
		ours[s.labels["gpu"]] = s.labels
	}
	add(row{gpu: "-", field: "gpus", ours: strconv.Itoa(len(ours)), smi: strconv.Itoa(len(smi.GPUs)), tolerance: "exact", ok: len(ours) == len(smi.GPUs)})
	for _, g := range smi.GPUs {
		idx := g["index"]
		o := ours[idx]
		for _, id := range []struct{ field, smi, ours string }{
			{"uuid", g["uuid"], o["uuid"]},
			{"name", g["name"], o["model"]},
			{"pci.bus_id", strings.ToLower(g["pci.bus_id"]), strings.ToLower(o["pci_bus_id"])},
		} {
			add(row{gpu: idx, field: id.field, ours: orNone(id.ours), smi: orNone(id.smi), tolerance: "exact", ok: id.ours == id.smi})
		}
		for _, n := range numerics {
			sv, hasSMI := g[n.smi]
			ov, hasOurs := wholeGPU(f, n.family, idx)
			r := row{gpu: idx, field: n.field + " " + n.unit}
			tol := n.tolAbs
			var smiV float64
			if hasSMI && sv != "" {
				v, err := strconv.ParseFloat(sv, 64)
				if err != nil {
					r.smi, r.tolerance = sv, "-"
					add(r)
					continue
				}
				smiV = v
				tol = math.Max(tol, n.tolRel*math.Abs(v))
				r.smi = trimFloat(v)
			} else {
				r.smi = "n/a"
			}
			r.tolerance = "±" + trimFloat(tol)
			if hasOurs {
				r.ours = trimFloat(ov * n.scale)
			} else {
				r.ours = "absent"
			}
			switch {
			case r.smi == "n/a" && !hasOurs:
				r.ok, r.skipped = true, true
			case r.smi == "n/a":
				// nvidia-smi has nothing to compare with (e.g. utilisation of
				// a MIG GPU): shown, not judged.
				r.ok = true
			case !hasOurs:
				r.ok = false
			default:
				r.ok = math.Abs(ov*n.scale-smiV) <= tol
			}
			add(r)
		}
		if g["mig.mode.current"] == "Enabled" {
			want := smi.MIG[idx]
			var have []string
			for _, s := range series(f, "gpu_memory_total_bytes") {
				if s.labels["gpu"] == idx && s.labels["gpu_instance"] != "" {
					have = append(have, s.labels["mig_profile"]+"/"+s.labels["gpu_instance"])
				}
			}
			sort.Strings(have)
			have = uniq(have)
			add(row{gpu: idx, field: "mig instances", ours: orNone(strings.Join(have, " ")), smi: orNone(strings.Join(want, " ")),
				tolerance: "exact", ok: strings.Join(have, " ") == strings.Join(want, " ")})
		}
	}
	return rows
}

func uniq(s []string) []string {
	var out []string
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "absent"
	}
	return s
}

func trimFloat(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

// printTable prints the comparison and reports whether any row failed.
func printTable(w io.Writer, rows []row) bool {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU\tFIELD\tOURS\tNVIDIA-SMI\tTOLERANCE\tRESULT")
	failed := false
	for _, r := range rows {
		res := "ok"
		switch {
		case r.skipped:
			res = "-"
		case !r.ok:
			res, failed = "FAIL", true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.gpu, r.field, r.ours, r.smi, r.tolerance, res)
	}
	tw.Flush()
	return failed
}
