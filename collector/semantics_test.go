package collector_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/dcgm"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nvmlsampler"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/simnode"
)

// migHolders and wholeHolders are pods of the default scenario.
var (
	migHolders   = []string{"finetune-small", "embeddings-0", "dev-shell-bob"}
	wholeHolders = []string{"llm-pretrain-0", "notebook-alice"}
)

// newPodNodeWithDCGM is the default node with its fake kubelet and, if
// withDCGM, its fake DCGM host engine, on real time (DCGM's staleness rules
// use its own timestamps).
func newPodNodeWithDCGM(t *testing.T, withDCGM bool) func() *collector.Page {
	t.Helper()
	dir, err := os.MkdirTemp("", "gpe")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	node, err := simnode.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, client := startKubelet(t, dir, node, nil)
	if err := client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := collector.Config{Interval: time.Second, Log: zerolog.Nop(), Pods: client, Groups: fullGroups()}
	if withDCGM {
		ds := dcgm.NewSampler(dcgm.Config{Mode: dcgm.ModeEmbedded, Interval: 20 * time.Millisecond, MaxMissed: 3, MaxBackoff: 50 * time.Millisecond, Log: zerolog.Nop()}, node.DCGM().Open)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go ds.Run(ctx)
		cfg.DCGM = ds
	}
	s, err := nvmlsampler.NewSampler(node, nvmlsampler.SamplerConfig{DeviceTimeout: time.Second, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	e, err := collector.New(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	return func() *collector.Page {
		deadline := time.Now().Add(10 * time.Second)
		for {
			e.SampleOnce(context.Background())
			p := e.Page()
			if !withDCGM || len(series(p, "gpu_sm_active_ratio", `gpu="7"`, `gpu_instance="0"`)) > 0 {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatal("no DCGM values after 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
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
