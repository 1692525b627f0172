package collector_test

import (
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

// counterAudit lists every family the exporter types counter, whether the
// counter-reset protection (collector/render/monotonic.go) applies to it, and why. A counter
// family served but not listed here fails the test: each new one is
// audited.
var counterAudit = []struct {
	name      string
	protected bool
	why       string
}{
	{"gpu_energy_joules_total", true, "NVML's energy since the driver loaded: restarts at a driver reload"},
	{"gpu_pcie_transmit_bytes_total", true, "integrated from DCGM's rate by the exporter: starts again when DCGM's values come back after a gap"},
	{"gpu_pcie_receive_bytes_total", true, "as gpu_pcie_transmit_bytes_total"},
	{"gpu_nvlink_transmit_bytes_total", true, "as gpu_pcie_transmit_bytes_total"},
	{"gpu_nvlink_receive_bytes_total", true, "as gpu_pcie_transmit_bytes_total"},
	{"gpu_pcie_replay_errors_total", true, "NVML's replay count: restarts at a GPU reset or driver reload"},
	{"gpu_nvlink_errors_total", true, "NVML's NVLink error counts: reset by a GPU reset"},
	{"gpu_ecc_errors_total", true, "volatile ECC counts restart at a GPU reset; aggregate ones never fall"},
	{"gpu_xid_errors_total", true, "the exporter's own count of XID events: never falls while it runs"},
	{"gpu_mig_xid_errors_total", true, "as gpu_xid_errors_total, per MIG instance"},
	{"gpu_ecc_error_events_total", true, "the exporter's own count of ECC events"},
	{"gpu_allocation_idle_seconds_total", true, "the exporter's own idle time per holder: a holder that leaves and comes back goes on"},
	{"gpu_exporter_nvml_inits_total", true, "the exporter's own count of NVML initialisations: never falls while it runs"},
	{"gpu_exporter_xid_uncovered_seconds_total", true, "the exporter's own time without an event set: never falls while it runs"},
	{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", true, "DCGM's energy since boot: restarts at a driver reload"},
	{"DCGM_FI_DEV_PCIE_REPLAY_COUNTER", true, "as gpu_pcie_replay_errors_total"},
	{"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", true, "rows remapped over the board's life (InfoROM): only grows"},
	{"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", true, "as DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"},
	{"DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", true, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION in joules (dcgm-exporter 4.9's name)"},
	{"DCGM_FI_DEV_PCIE_REPLAY_TOTAL", true, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER under DCGM 4.6's canonical name (4.9's)"},
	{"DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", true, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS under DCGM 4.6's canonical name (4.9's)"},
	{"DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", true, "as DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL"},
	{"DCGM_EXP_XID_ERRORS_TOTAL", false, "the exporter's own XID count since its start: never falls, nothing to protect"},
	{"DCGM_EXP_XID_ERRORS_COUNT", false, "the XIDs of the last window (dcgm-exporter 4.8.2's list types it counter): goes down as XIDs leave the window"},
	{"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", false, "dcgm-exporter's list types it counter, but DCGM's value is the current rate, which goes up and down: protected, it would ratchet by every fall"},
}

// The process' own go_ and process_ counters never fall: protected, which
// changes nothing.
var counterAuditPrefixes = []string{"go_", "process_"}

func TestCounterFamiliesAudited(t *testing.T) {
	listed := map[string]bool{}
	for _, c := range counterAudit {
		t.Run(c.name, func(t *testing.T) {
			if got := render.CounterProtected(c.name); got != c.protected {
				t.Errorf("protected = %v, want %v: %s", got, c.protected, c.why)
			}
		})
		listed[c.name] = true
	}
	e := compatNode(t, fullGroups())
	for _, l := range strings.Split(string(e.Page().Plain), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 || f[1] != "TYPE" || f[3] != "counter" || listed[f[2]] {
			continue
		}
		known := false
		for _, p := range counterAuditPrefixes {
			known = known || strings.HasPrefix(f[2], p)
		}
		if !known {
			t.Errorf("counter family %s is not in counterAudit: is its value a count that only grows (protect it) or not (mark it notCount)?", f[2])
		}
	}
}
