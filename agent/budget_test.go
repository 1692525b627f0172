package agent_test

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/promqlcheck"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

// simulatedPage runs the exporter on the simulated node with args and
// returns its page once DCGM and the pod map have filled it.
func simulatedPage(t *testing.T, args ...string) string {
	t.Helper()
	r := startExporter(t, append([]string{"--collect-interval=1s"}, args...)...)
	defer r.stop(t)
	addr := r.addr
	var body string
	if !pollUntil(20*time.Second, func() bool {
		body = waitFor(t, "http://"+addr+"/metrics", 200)
		return strings.Contains(body, `gpu_exporter_collector_up{collector="podmap"} 1`) &&
			strings.Contains(body, `gpu_exporter_collector_up{collector="dcgm"} 1`) &&
			strings.Contains(body, "\ngpu_allocation_info{") &&
			// byte rates need two samples
			(!slices.Contains(args, "--compat.dcgm-exporter") || strings.Contains(body, "\nDCGM_FI_PROF_PCIE_TX_BYTES{") ||
				strings.Contains(body, "\nDCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND{"))
	}) {
		t.Fatalf("the page never had DCGM and the pod map up; log:\n%s", r.logs.String())
	}
	return body
}

// seriesPerGPU counts a page's series (every sample line) and its GPUs.
func seriesPerGPU(t *testing.T, body string) (series, gpus int) {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			series++
		}
	}
	gpus = strings.Count(body, "\ngpu_info{")
	if gpus == 0 {
		t.Fatal("no gpu_info on the page")
	}
	return series, gpus
}

var familyRE = regexp.MustCompile(`(?m)^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{| )`)

func families(body string) map[string]int {
	out := map[string]int{}
	for _, m := range familyRE.FindAllStringSubmatch(body, -1) {
		out[m[1]]++
	}
	return out
}

// TestSeriesBudget fails when the default or the lean page of the simulated
// 8 x H100 node grows past its series budget per GPU, or when the lean page
// lacks a metric that an alert, a recording rule or a dashboard uses.
func TestSeriesBudget(t *testing.T) {
	t.Parallel()
	used, err := promqlcheck.UsedMetrics()
	if err != nil {
		t.Fatal(err)
	}
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]bool{}
	for _, r := range rf.RecordNames() {
		recorded[r] = true
	}
	// Used metrics the default scenario cannot show: its GPUs are H100s
	// (no page retirement), it sets no price, every kubelet device ID
	// matches a device, and no XID happens in it.
	absentOnSimulatedNode := map[string]string{
		"gpu_retired_pages_pending":                           "pre-Ampere GPUs only",
		"gpu_price_dollars_per_hour":                          "no --idle.price",
		"gpu_kubelet_unmatched_device_ids":                    "every device ID matches",
		"gpu_xid_errors_total":                                "no XID in the default scenario",
		"gpu_xid_first_timestamp_seconds":                     "no XID in the default scenario",
		"gpu_xid_last_timestamp_seconds":                      "no XID in the default scenario",
		"gpu_ecc_uncorrected_last_increase_timestamp_seconds": "no ECC error in the default scenario (its group, ecc, is on in both profiles)",
		"gpu_fault_active":                                    "no fault in the default scenario (served while a GPU has one; lost in core, on in both profiles)",
		"gpu_row_remap_banks_low_availability":                "no bank short of spare rows in the default scenario (its group, ecc, is on in both profiles)",
		"gpu_mig_mode_pending":                                "no MIG mode change pending in the default scenario (its group, core, is on in both profiles)",
		"gpu_dra_device_taint":                                "only with --kubernetes.resource-slices while a DRA driver taints a device (its group, core, is on in both profiles)",
	}
	for _, tc := range []struct {
		profile string
		budget  int
	}{
		{render.ProfileDefault, render.DefaultBudgetPerGPU},
		{render.ProfileLean, render.LeanBudgetPerGPU},
	} {
		t.Run(tc.profile, func(t *testing.T) {
			body := simulatedPage(t, "--collector.profile="+tc.profile)
			n, gpus := seriesPerGPU(t, body)
			per := float64(n) / float64(gpus)
			t.Logf("%s profile: %d series, %d GPUs, %.1f series per GPU (budget %d)", tc.profile, n, gpus, per, tc.budget)
			if per > float64(tc.budget) {
				fs := families(body)
				var top []string
				for f, c := range fs {
					top = append(top, f+":"+itoa(c))
				}
				sort.Strings(top)
				t.Errorf("%s profile serves %.1f series per GPU, over its budget of %d: %s", tc.profile, per, tc.budget, strings.Join(top, " "))
			}
			fs := families(body)
			for name, where := range used {
				if recorded[name] || !strings.HasPrefix(name, "gpu_") {
					continue
				}
				if _, ok := absentOnSimulatedNode[name]; ok {
					continue
				}
				if fs[name] == 0 {
					t.Errorf("%s profile: %s is not on the page, but %s uses it", tc.profile, name, where[0])
				}
			}
			if tc.profile == render.ProfileLean && !strings.Contains(body, `gpu_clock_event_active{gpu="0",reason="all"`) {
				t.Errorf("lean profile: no gpu_clock_event_active{reason=\"all\"}, which GPUThrottled matches")
			}
			// node_summary: lean serves the folded families once per node,
			// default once per GPU.
			for name, how := range render.NodeSummaryFolds() {
				// `sum of error="corrected"`: only those series fold.
				_, only, _ := strings.Cut(how, " of ")
				node := regexp.MustCompile(`(?m)^` + name + `\{[^}]*gpu="all"`).MatchString(body)
				perGPU := false
				for _, l := range regexp.MustCompile(`(?m)^`+name+`\{[^}]*gpu="0"[^}]*\}`).FindAllString(body, -1) {
					perGPU = perGPU || strings.Contains(l, only)
				}
				if lean := tc.profile == render.ProfileLean; node != lean || perGPU == lean {
					t.Errorf("%s profile: %s has a node series: %v, a series of GPU 0: %v", tc.profile, name, node, perGPU)
				}
			}
			promtoolCheckMetrics(t, tc.profile+" page", body, nil)
		})
	}
	// The full profile and the compatibility page have no budget: log them
	// for docs/profiles.md.
	for _, args := range [][]string{{"--collector.profile=full"}, {"--compat.dcgm-exporter"}} {
		body := simulatedPage(t, args...)
		n, gpus := seriesPerGPU(t, body)
		compat := 0
		for f, c := range families(body) {
			if strings.HasPrefix(f, "DCGM_") {
				compat += c
			}
		}
		t.Logf("%v: %d series, %.1f per GPU (dcgm-exporter families: %d, %.1f per GPU)", args, n, float64(n)/float64(gpus), compat, float64(compat)/float64(gpus))
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestCompatPagePassesPromtool: `promtool check metrics` finds nothing on the
// page with the dcgm-exporter families, except what dcgm-exporter's own
// names and types make unavoidable (see compatLintAllowed).
func TestCompatPagePassesPromtool(t *testing.T) {
	body := simulatedPage(t, "--compat.dcgm-exporter")
	if n := families(body)["DCGM_FI_DEV_GPU_TEMP"]; n == 0 {
		t.Fatal("no DCGM_FI_DEV_GPU_TEMP on the compatibility page")
	}
	promtoolCheckMetrics(t, "compatibility page", body, compatLintAllowed)
}

// compatLintAllowed tells the lint findings that dcgm-exporter's own names
// cause, and only those: its counters lack the _total suffix (and one is
// named ..._COUNTER), and its modelName label is camelCase. Renaming either would break the
// dashboards and alerts the switch exists for.
func compatLintAllowed(line string) bool {
	name, msg, ok := strings.Cut(line, " ")
	if !ok || !strings.HasPrefix(name, "DCGM_FI_") {
		return false
	}
	return msg == `counter metrics should have "_total" suffix` ||
		msg == `metric name should not include type 'counter'` ||
		msg == `label names should be written in 'snake_case' not 'camelCase'`
}

// promtoolCheckMetrics fails the test on every finding of `promtool check
// metrics` on body that allowed does not excuse.
func promtoolCheckMetrics(t *testing.T, what, body string, allowed func(string) bool) {
	t.Helper()
	path, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found: install it with `apt-get install -y prometheus` (make test does)")
		}
		t.Logf("promtool not found (make test installs it): %s not linted", what)
		return
	}
	cmd := exec.Command(path, "check", "metrics")
	cmd.Stdin = strings.NewReader(body)
	out, _ := cmd.CombinedOutput() // exits 1 on findings: the lines say
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" || (allowed != nil && allowed(l)) {
			continue
		}
		t.Errorf("promtool check metrics on the %s: %s", what, l)
	}
}
