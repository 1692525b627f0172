package collector_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// podMetaMap is a pod metadata cache of fixed content.
type podMetaMap map[string]podmap.PodMeta

func (m podMetaMap) Lookup(ns, name string) (podmap.PodMeta, bool) {
	p, ok := m[ns+"/"+name]
	return p, ok
}

// With pod UIDs and labels on, each held device's DCGM_FI_* series carry
// its pod's UID and labels (named as dcgm-exporter names them); a pod the
// cache does not know and a free device carry neither.
func TestCompatPodUIDAndLabels(t *testing.T) {
	meta := podMetaMap{
		"ml-training/llm-pretrain-0": {UID: "uid-0", Labels: map[string]string{"app.kubernetes.io/name": "llm", "pod": "clash", "err_code": "clash"}},
	}
	tn := newTestExporter(t, withRealTime(), withKubelet(), withConfig(func(c *collector.Config) {
		c.Compat = &render.CompatConfig{Hostname: "n", PodUID: true, PodLabels: true}
		c.PodMeta = meta
	}))
	if err := tn.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := tn.until(t, "holders on the page", func(p *collector.Page) bool {
		return len(series(p, "DCGM_FI_DEV_GPU_TEMP", `pod="llm-pretrain-0"`)) > 0
	})
	for _, l := range append(series(p, "DCGM_FI_DEV_GPU_TEMP"), series(p, "DCGM_FI_DEV_XID_ERRORS")...) {
		switch {
		case strings.Contains(l, `pod="llm-pretrain-0"`):
			if !strings.Contains(l, `pod_uid="uid-0"`) || !strings.Contains(l, `app_kubernetes_io_name="llm"`) {
				t.Errorf("llm-pretrain-0's series lacks its UID or label: %s", l)
			}
			if strings.Contains(l, `"clash"`) {
				t.Errorf("a pod label overrides a label of the series: %s", l)
			}
		case strings.Contains(l, "pod_uid=") || strings.Contains(l, "app_kubernetes_io_name="):
			t.Errorf("a series of a pod the cache does not know, or of a free device, has a UID or label: %s", l)
		}
	}
}
