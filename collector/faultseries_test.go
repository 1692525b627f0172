package collector_test

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

var (
	labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)
	// slowdownReason: NVML's clock event reasons that slow a busy GPU
	// down (nvmlClocksEventReason*: HwSlowdown, SwThermalSlowdown,
	// HwThermalSlowdown, HwPowerBrakeSlowdown), and the lean summary.
	slowdownReason = regexp.MustCompile(`^(hw_slowdown|sw_thermal_slowdown|hw_thermal_slowdown|hw_power_brake_slowdown|all)$`)
)

// faultsOnPage is the page's gpu_fault_active series as "gpu/fault/detail=value".
func faultsOnPage(p *collector.Page) []string {
	var out []string
	for _, l := range series(p, "gpu_fault_active") {
		m := map[string]string{}
		for _, kv := range labelPair.FindAllStringSubmatch(l, -1) {
			m[kv[1]] = kv[2]
		}
		out = append(out, fmt.Sprintf("%s/%s/%s%s=%s", m["gpu"], m["fault"], m["system"], m["reason"], l[strings.LastIndex(l, " ")+1:]))
	}
	sort.Strings(out)
	return out
}

// faultsFromDenseFamilies derives the same list from the dense families the
// page serves, as the alert rules read them before: gpu_up 0 of a GPU or one
// of its MIG instances, gpu_remapped_rows_failed 1, gpu_recovery_action_code
// above 0, gpu_clock_event_active 1 for a reason that slows a busy GPU down.
func faultsFromDenseFamilies(p *collector.Page) []string {
	gpuOf := func(l string) string { return labelPair.FindStringSubmatch(l[strings.Index(l, `gpu="`):])[2] }
	val := func(l string) string { return l[strings.LastIndex(l, " ")+1:] }
	seen := map[string]bool{}
	for _, l := range series(p, "gpu_up") {
		if val(l) == "0" {
			seen[gpuOf(l)+"/lost/=1"] = true
		}
	}
	for _, l := range series(p, "gpu_remapped_rows_failed") {
		if val(l) == "1" {
			seen[gpuOf(l)+"/row_remap_failed/=1"] = true
		}
	}
	for _, l := range series(p, "gpu_recovery_action_code") {
		if val(l) != "0" {
			seen[gpuOf(l)+"/recovery_action/="+val(l)] = true
		}
	}
	for _, l := range series(p, "gpu_clock_event_active") {
		r := labelPair.FindStringSubmatch(l[strings.Index(l, `reason="`):])[2]
		if val(l) == "1" && slowdownReason.MatchString(r) {
			seen[gpuOf(l)+"/clock_slowdown/"+r+"=1"] = true
		}
	}
	out := []string{}
	for k := range seen {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestFaultSeriesFollowTheDenseFamilies runs a node through a lost GPU, a
// failed row remap, a recovery action and a thermal slowdown (and a power
// cap, which is no fault), under each profile, and checks at every step that
// gpu_fault_active lists exactly the faults the dense families show on the
// same page, that a fault's series goes when the fault ends, and that
// gpu_faulted_devices counts the GPUs with one.
func TestFaultSeriesFollowTheDenseFamilies(t *testing.T) {
	const sc = `
node: {model: A100-SXM4-80GB, count: 6}
gpus:
  - {index: 5, mig: [{profile: 3g.40gb}, {profile: 3g.40gb}]}
faults:
  - {at: 1m, until: 3m, gpu: 0, lost: true}
  - {at: 1m, gpu: 1, remap: {uncorrectable: 1, failed: true}}
  - {at: 2m, until: 4m, gpu: 2, recoveryAction: drain_and_reset}
  - {at: 2m, until: 4m, gpu: 3, throttle: [hw_thermal_slowdown, sw_power_cap]}
  - {at: 2m, until: 3m, gpu: 4, throttle: [sw_power_cap]}
`
	lean, err := render.ProfileGroups(render.ProfileLean)
	if err != nil {
		t.Fatal(err)
	}
	noThrottle, err := render.ProfileGroups(render.ProfileDefault)
	if err != nil {
		t.Fatal(err)
	}
	delete(noThrottle, render.GroupThrottle)
	for _, tc := range []struct {
		name   string
		groups render.GroupSet
		// want lists the faults at 2m30s, when all of them hold.
		want []string
	}{
		{"default", nil, []string{"0/lost/=1", "1/row_remap_failed/=1", "2/recovery_action/=4", "3/clock_slowdown/hw_thermal_slowdown=1"}},
		{"lean", lean, []string{"0/lost/=1", "1/row_remap_failed/=1", "2/recovery_action/=4", "3/clock_slowdown/all=1"}},
		{"throttle off", noThrottle, []string{"0/lost/=1", "1/row_remap_failed/=1", "2/recovery_action/=4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			tn := newTestExporter(t, withScenario(scenario(t, sc)), withClock(clk), withGroups(tc.groups))
			var elapsed time.Duration
			for _, step := range []struct {
				at      time.Duration
				faulted string
			}{
				{30 * time.Second, "0"},
				{150 * time.Second, fmt.Sprint(len(tc.want))},
				{200 * time.Second, fmt.Sprint(len(tc.want) - 1)}, // GPU 0 answers again
				{5 * time.Minute, "1"},                            // the failed remap stays
			} {
				clk.Advance(step.at - elapsed)
				elapsed = step.at
				for i := 0; i < 3; i++ { // a lost GPU is rediscovered over a few samples
					tn.e.SampleOnce(context.Background())
				}
				p := tn.e.Page()
				got, dense := faultsOnPage(p), faultsFromDenseFamilies(p)
				if strings.Join(got, " ") != strings.Join(dense, " ") {
					t.Errorf("at %s: gpu_fault_active %v, the dense families say %v", step.at, got, dense)
				}
				if step.at == 150*time.Second && strings.Join(got, " ") != strings.Join(tc.want, " ") {
					t.Errorf("at %s: gpu_fault_active %v, want %v", step.at, got, tc.want)
				}
				if v := value(t, p, "gpu_faulted_devices"); v != step.faulted {
					t.Errorf("at %s: gpu_faulted_devices %s, want %s (faults %v)", step.at, v, step.faulted, got)
				}
			}
		})
	}
}
