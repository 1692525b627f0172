package status_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
)

func f(v float64) *float64 { return &v }

func sample() *status.Node {
	return &status.Node{
		Version: "test", Node: "gpu-node-a", SampleTime: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Driver: "550.54.15", CUDA: "12.4", Processes: "on", PodMap: "on",
		GPUs: []status.GPU{
			{Index: 6, UUID: "GPU-6", Model: "H100", Up: true,
				Health: status.Health{XIDs: 2, LastXID: 13, Problems: "2 XIDs (last 13)"},
				Units: []status.Unit{{GPUInstance: -1, Shared: true, MemoryUsedBytes: f(30 << 30), MemoryTotalBytes: f(80 << 30),
					OutsidePodsMemoryBytes: f(1 << 30), OutsidePodsProcesses: 1, MPSServerMemoryBytes: f(32 << 20),
					Holders: []status.Holder{
						{Namespace: "inference", Pod: "chat-api-0", Container: "server", Holding: true, Replicas: []int{0}, MemoryUsedBytes: f(20 << 30), Activity: f(0.42), ActivitySource: "processes", Processes: 2},
						{Namespace: "inference", Pod: "chat-api-2", Container: "server", Holding: true, Replicas: []int{2}, MemoryUsedBytes: f(0), Activity: f(0), ActivitySource: "processes", Idle: true, QuietSeconds: 1900},
						{Namespace: "team-<x>", Pod: "sneaky", Container: "c", MemoryUsedBytes: f(9 << 30), Activity: f(0.1), ActivitySource: "processes", Processes: 1, QuietSeconds: 0},
					}}}},
			{Index: 7, UUID: "GPU-7", Up: false, Units: []status.Unit{{GPUInstance: 2, MIGProfile: "1g.10gb"}}},
		},
	}
}

func TestText(t *testing.T) {
	var b bytes.Buffer
	if err := sample().Text(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"node gpu-node-a, driver 550.54.15",
		"inference/chat-api-0/server",
		"20.0 GiB", "42% (processes)", "idle 31m", "2 XIDs (last 13)",
		"team-<x>/sneaky/c (not holding)",
		"(outside pods: 1 processes)",
		"(MPS server)", "0.0 GiB",
		"gi2 1g.10gb", "DOWN",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text table lacks %q:\n%s", want, out)
		}
	}
}

func TestHTMLEscapesAndJSONRoundTrip(t *testing.T) {
	var b bytes.Buffer
	if err := sample().HTML(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "team-<x>") || !strings.Contains(b.String(), "team-&lt;x&gt;") {
		t.Error("a label value is not escaped in the page")
	}
	var j bytes.Buffer
	if err := sample().JSON(&j); err != nil {
		t.Fatal(err)
	}
	n, err := status.Decode(&j)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.GPUs[0].Units[0].Holders[1]; got.Pod != "chat-api-2" || !got.Idle || *got.Activity != 0 {
		t.Errorf("round trip: %+v", got)
	}
	if _, err := status.Decode(strings.NewReader("# HELP gpu_up ...\n")); err == nil || !strings.Contains(err.Error(), "not a gpupool status document") {
		t.Errorf("decoding /metrics: %v", err)
	}
}

func TestDuration(t *testing.T) {
	for sec, want := range map[float64]string{5: "5s", 125: "2m", 3900: "1h05m", 200000: "2d7h"} {
		t.Run(want, func(t *testing.T) {
			if got := status.Duration(sec); got != want {
				t.Errorf("Duration(%v) = %q, want %q", sec, got, want)
			}
		})
	}
}
