package collector_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// The first page /readyz calls ready names the holder of every allocated
// device, however slowly the kubelet answers: the first sample waits for
// the first pod map (up to two kubelet call timeouts), so no restart serves
// short-lived series without their pods.
func TestFirstReadyPageNamesHolders(t *testing.T) {
	tn := newTestExporter(t, withRealTime(), withKubelet())
	tn.kube.SetDelay(300 * time.Millisecond)
	want := len(tn.node.KubeletPods())
	if want == 0 {
		t.Fatal("the simulated node has no pods")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { tn.client.Run(ctx) })
	wg.Go(func() { tn.e.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	var p *collector.Page
	waitFor(t, "ready", func() bool {
		ok, _ := tn.e.Ready()
		if ok {
			p = tn.e.Page()
		}
		return ok
	})
	if n := len(series(p, "gpu_allocation_info")); n == 0 {
		t.Fatalf("the first ready page names no holder (%d gpu_allocation_info series)", n)
	}
	holders := map[string]bool{}
	for _, pod := range tn.node.KubeletPods() {
		holders[pod.Namespace+"/"+pod.Name] = true
	}
	for h := range holders {
		ns, name, _ := strings.Cut(h, "/")
		if len(series(p, "gpu_allocation_info", `namespace="`+ns+`"`, `pod="`+name+`"`)) == 0 {
			t.Errorf("the first ready page does not name %s", h)
		}
	}
}

// A kubelet that does not answer at all delays readiness by at most the
// wait, then the page is served without holders and says why.
func TestFirstPageWithoutKubelet(t *testing.T) {
	sc := simnode.DefaultScenario()
	tn := newTestExporter(t, withRealTime(), withKubelet(), withScenario(sc),
		withConfig(func(c *collector.Config) { c.PodMapWait = 200 * time.Millisecond }))
	tn.kube.SetDelay(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { tn.client.Run(ctx) })
	wg.Go(func() { tn.e.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	start := time.Now()
	if ok, why := tn.e.Ready(); ok || why == "" {
		t.Errorf("ready at once (%q), want waiting for the pod map", why)
	}
	waitFor(t, "ready", func() bool { ok, _ := tn.e.Ready(); return ok })
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("ready after %s", d)
	}
	if got := string(tn.e.Page().StatusJSON); !strings.Contains(got, `"pod_map": "down: the kubelet has not answered yet"`) {
		t.Errorf("status.json does not say why the pod map is down: %s", got)
	}
}
