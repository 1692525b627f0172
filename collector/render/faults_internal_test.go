package render

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/sample"
)

// faultSeries runs collectFaults and returns its series as
// "gpu/fault/system/reason=value", sorted, and gpu_faulted_devices.
func faultSeries(t *testing.T, gpus []sample.GPUState, groups GroupSet) ([]string, float64) {
	t.Helper()
	ch := make(chan prometheus.Metric, 100)
	collectFaults(gpus, groups, ch)
	close(ch)
	var out []string
	faulted := -1.0
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(m.Desc().String(), `"gpu_faulted_devices"`) {
			faulted = pb.GetGauge().GetValue()
			continue
		}
		l := map[string]string{}
		for _, p := range pb.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		out = append(out, fmt.Sprintf("%s/%s/%s/%s=%g", l["gpu"], l["fault"], l["system"], l["reason"], pb.GetGauge().GetValue()))
	}
	sort.Strings(out)
	return out, faulted
}

// DCGM health: one fault per failing system (a warning is none), or one
// with system="all" under the summary group; a lost MIG instance makes its
// GPU lost; a GPU that does not answer NVML keeps its DCGM health faults
// (gpu_dcgm_health_status is still served for it) but not NVML's (its
// recovery action: gpu_recovery_action_code is not).
func TestFaultsOfDCGMHealthAndMIG(t *testing.T) {
	up := func(gpu int) sample.GPUState {
		return sample.GPUState{DeviceState: sample.DeviceState{GPU: gpu, UUID: fmt.Sprint("GPU-", gpu), Up: true}}
	}
	g0 := up(0)
	g0.DCGMHealth = map[string]string{dcgm.HealthPCIe: dcgm.HealthFail, dcgm.HealthThermal: dcgm.HealthWarn, dcgm.HealthNVLink: dcgm.HealthFail}
	g1 := up(1)
	g1.DCGMHealth = map[string]string{dcgm.HealthThermal: dcgm.HealthWarn}
	g2 := up(2)
	g2.MIG = []sample.DeviceState{{GPU: 2, UUID: "GPU-2", GPUInstance: 1, Up: true}, {GPU: 2, UUID: "GPU-2", GPUInstance: 2, Up: false}}
	g3 := up(3)
	g3.Up = false
	g3.DCGMHealth = map[string]string{dcgm.HealthPCIe: dcgm.HealthFail}
	g3.Health.RecoveryAction = sample.Opt[int]{V: 1, OK: true}
	gpus := []sample.GPUState{g0, g1, g2, g3}

	lean, err := ProfileGroups(ProfileLean)
	if err != nil {
		t.Fatal(err)
	}
	noHealth, err := ProfileGroups(ProfileDefault)
	if err != nil {
		t.Fatal(err)
	}
	delete(noHealth, GroupDCGMHealth)
	for _, tc := range []struct {
		name    string
		groups  GroupSet
		want    []string
		faulted float64
	}{
		{"default", nil, []string{"0/dcgm_health/nvlink/=1", "0/dcgm_health/pcie/=1", "2/lost//=1", "3/dcgm_health/pcie/=1", "3/lost//=1"}, 3},
		{"lean", lean, []string{"0/dcgm_health/all/=1", "2/lost//=1", "3/dcgm_health/all/=1", "3/lost//=1"}, 3},
		{"dcgm_health off", noHealth, []string{"2/lost//=1", "3/lost//=1"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, faulted := faultSeries(t, gpus, tc.groups)
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("faults %v, want %v", got, tc.want)
			}
			if faulted != tc.faulted {
				t.Errorf("gpu_faulted_devices %g, want %g", faulted, tc.faulted)
			}
		})
	}
	// The dcgm_health faults are the dense family's failing series, GPU by
	// GPU, whether or not the GPU answers NVML.
	ch := make(chan prometheus.Metric, 100)
	for i := range gpus {
		collectDCGMHealth(&gpus[i], ch)
	}
	close(ch)
	var dense []string
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		l := map[string]string{}
		for _, p := range pb.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if pb.GetGauge().GetValue() == 2 && l["system"] != "all" {
			dense = append(dense, fmt.Sprintf("%s/dcgm_health/%s/=1", l["gpu"], l["system"]))
		}
	}
	sort.Strings(dense)
	all, _ := faultSeries(t, gpus, nil)
	var fromFaults []string
	for _, f := range all {
		if strings.Contains(f, "/dcgm_health/") {
			fromFaults = append(fromFaults, f)
		}
	}
	if strings.Join(fromFaults, " ") != strings.Join(dense, " ") {
		t.Errorf("dcgm_health faults %v, gpu_dcgm_health_status 2 on %v", fromFaults, dense)
	}

	if got, faulted := faultSeries(t, []sample.GPUState{up(0), up(1)}, nil); len(got) != 0 || faulted != 0 {
		t.Errorf("healthy node: faults %v, gpu_faulted_devices %g; want none and 0", got, faulted)
	}
}
