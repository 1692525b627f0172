package collector_test

import (
	"context"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
)

// migHolders and wholeHolders are pods of the default scenario.
var (
	migHolders   = []string{"finetune-small", "embeddings-0", "dev-shell-bob"}
	wholeHolders = []string{"llm-pretrain-0", "notebook-alice"}
)

// newPodNodeWithDCGM is the default node with its fake kubelet and, if
// dcgmOn, its fake DCGM host engine, on real time (DCGM's staleness rules
// use its own timestamps).
func newPodNodeWithDCGM(t *testing.T, dcgmOn bool) func() *collector.Page {
	t.Helper()
	opts := []exporterOption{withRealTime(), withKubelet(), withGroups(fullGroups())}
	if dcgmOn {
		opts = append(opts, withDCGM(nil))
	}
	tn := newTestExporter(t, opts...)
	if err := tn.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	return func() *collector.Page {
		return tn.until(t, "DCGM values", func(p *collector.Page) bool {
			return !dcgmOn || len(series(p, "gpu_sm_active_ratio", `gpu="7"`, `gpu_instance="2"`)) > 0
		})
	}
}

// Idleness that cannot be seen is left out, not reported as busy: without
// DCGM a MIG instance has no activity figure (NVML has no busy time for it).
// gpu_container_utilization_ratio is NVML busy time only, so it never mixes
// sources: on MIG instances SM activity is gpu_container_sm_active_ratio.
func TestMIGIdlenessAndContainerUtilisationSources(t *testing.T) {
	p := newPodNodeWithDCGM(t, false)()
	for _, pod := range migHolders {
		if s := series(p, "gpu_allocation_idle", `pod="`+pod+`"`); len(s) != 0 {
			t.Errorf("without DCGM, MIG holder %s has gpu_allocation_idle %v: unknown must be left out", pod, s)
		}
	}
	for _, pod := range wholeHolders {
		if s := series(p, "gpu_allocation_idle", `pod="`+pod+`"`); len(s) == 0 {
			t.Errorf("whole-GPU holder %s has no gpu_allocation_idle", pod)
		}
	}

	p = newPodNodeWithDCGM(t, true)()
	for _, pod := range migHolders {
		if s := series(p, "gpu_allocation_idle", `pod="`+pod+`"`); len(s) != 1 {
			t.Errorf("with DCGM, MIG holder %s: gpu_allocation_idle %v, want one series", pod, s)
		}
		if s := series(p, "gpu_container_utilization_ratio", `pod="`+pod+`"`); len(s) != 0 {
			t.Errorf("MIG holder %s has gpu_container_utilization_ratio %v: NVML has no busy time for MIG", pod, s)
		}
		if s := series(p, "gpu_container_sm_active_ratio", `pod="`+pod+`"`); len(s) != 1 {
			t.Errorf("MIG holder %s: gpu_container_sm_active_ratio %v, want one series", pod, s)
		}
	}
	if s := series(p, "gpu_container_utilization_ratio", `pod="notebook-alice"`); len(s) != 1 {
		t.Errorf("whole-GPU holder: gpu_container_utilization_ratio %v, want one series", s)
	}
}
