package collector_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/textparse"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// A pod holding a whole MIG-mode GPU by its GPU UUID (the NVIDIA device
// plugin's migStrategy none) holds all its instances: it is in
// gpu_allocation_info, not among the unmatched IDs, and the instances are
// not free.
func TestWholeMIGGPUHolderHoldsEveryInstance(t *testing.T) {
	p := newPodNode(t, nil)
	page := p.step(t, time.Second)
	g7 := page.State.Sample.GPUs[7]
	if len(g7.MIG) == 0 {
		t.Fatal("GPU 7 of the default node is not in MIG mode")
	}
	freeBefore := num(t, page, "gpu_devices", `state="free"`)
	heldBefore := 0
	for _, h := range holders(page) {
		if strings.HasPrefix(h, "7/") {
			heldBefore++
		}
	}

	// A pod takes GPU 7 whole, by its GPU UUID.
	pods := append(p.node.KubeletPods(), fakekubelet.Pod{Namespace: "batch", Name: "whole-board", Containers: []fakekubelet.Container{
		{Name: "main", Devices: []fakekubelet.Devices{{Resource: "nvidia.com/gpu", IDs: []string{g7.UUID}}}},
	}})
	// The default node's own holders of GPU 7's instances leave: the board is the new pod's.
	var kept []fakekubelet.Pod
	for _, pod := range pods {
		onGPU7 := false
		for _, c := range pod.Containers {
			for _, d := range c.Devices {
				for _, id := range d.IDs {
					for _, m := range g7.MIG {
						if strings.EqualFold(id, m.MIGUUID) {
							onGPU7 = true
						}
					}
				}
			}
		}
		if !onGPU7 {
			kept = append(kept, pod)
		}
	}
	p.kube.SetPods(kept)
	if err := p.client.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	p.clk.Advance(5 * time.Second)
	p.e.SampleOnce(context.Background())
	page = p.e.Page()

	var onBoard []string
	for _, h := range holders(page) {
		if strings.HasPrefix(h, "7/") {
			onBoard = append(onBoard, h)
		}
	}
	if len(onBoard) != len(g7.MIG) {
		t.Errorf("holders on GPU 7: %v; want batch/whole-board/main on each of its %d instances", onBoard, len(g7.MIG))
	}
	for _, h := range onBoard {
		if !strings.HasSuffix(h, " batch/whole-board/main") {
			t.Errorf("GPU 7 holder %q, want batch/whole-board/main", h)
		}
	}
	if s := series(page, "gpu_kubelet_unmatched_device_ids"); len(s) != 0 {
		t.Errorf("the whole-board holder counted as unmatched: %v", s)
	}
	// GPU 7's instances that were free before are held now.
	if got, want := num(t, page, "gpu_devices", `state="free"`), freeBefore-float64(len(g7.MIG)-heldBefore); got != want {
		t.Errorf("gpu_devices{state=\"free\"} = %v, want %v: GPU 7's instances are held", got, want)
	}
	if s := series(page, "gpu_mig_free_slices", `gpu="7"`); len(s) != 1 {
		t.Errorf("gpu_mig_free_slices for GPU 7: %v", s)
	}
}

// Accept headers of Prometheus' scrapes, literally as its source writes or
// builds them:
//   - v2.42.0 scrape/scrape.go: scrapeAcceptHeader, and
//     scrapeAcceptHeaderWithProtobuf (--enable-feature=native-histograms);
//   - v3.x scrape/scrape.go acceptHeader() over config.DefaultScrapeProtocols
//     with the default escaping scheme allow-utf-8: as 3.0 sends it (five
//     protocols known) and as the v0.316 module in go.mod builds it (six, with
//     OpenMetrics 2.0), and over DefaultProtoFirstScrapeProtocols
//     (scrape_native_histograms).
var prometheusAccept = map[string]string{
	"2.42":                   `application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1`,
	"2.42 native histograms": `application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1`,
	"3.0":                    `application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2`,
	"3.x (v0.316)":           `application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.7,application/openmetrics-text;version=0.0.1;q=0.6,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.3`,
	"3.x native histograms":  `application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2`,
	"curl":                   `*/*`,
	"none":                   ``,
}

// Whatever Prometheus asks for, it gets the text format, and Prometheus'
// own parser (chosen, as in a scrape, by the answer's Content-Type) reads
// the whole page.
func TestContentNegotiationWithPrometheus(t *testing.T) {
	p := newPodNode(t, nil)
	p.step(t, time.Second)
	for name, accept := range prometheusAccept {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		rec := httptest.NewRecorder()
		p.e.ServeHTTP(rec, req)
		ct := rec.Header().Get("Content-Type")
		if rec.Code != 200 || !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
			t.Errorf("Prometheus %s: status %d, Content-Type %q; want 200 and text/plain; version=0.0.4", name, rec.Code, ct)
			continue
		}
		parser, err := textparse.New(rec.Body.Bytes(), ct, nil, textparse.ParserOptions{})
		if err != nil {
			t.Errorf("Prometheus %s: %v", name, err)
			continue
		}
		if got := fmt.Sprintf("%T", parser); got != "*textparse.PromParser" {
			t.Errorf("Prometheus %s: parsed with %s, want the text parser", name, got)
		}
		series := 0
		for {
			et, err := parser.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("Prometheus %s: parse error after %d series: %v", name, series, err)
			}
			if et == textparse.EntrySeries {
				series++
			}
		}
		if series < 100 {
			t.Errorf("Prometheus %s: parsed %d series", name, series)
		}
	}
}

func TestMetricsMethods(t *testing.T) {
	p := newPodNode(t, nil)
	p.step(t, time.Second)
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"} {
		rec := httptest.NewRecorder()
		p.e.ServeHTTP(rec, httptest.NewRequest(m, "/metrics", strings.NewReader("x")))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s /metrics: status %d, Allow %q; want 405 and GET, HEAD", m, rec.Code, rec.Header().Get("Allow"))
		}
		if strings.Contains(rec.Body.String(), "gpu_") {
			t.Errorf("%s /metrics served metrics", m)
		}
	}
	for _, m := range []string{"GET", "HEAD"} {
		rec := httptest.NewRecorder()
		p.e.ServeHTTP(rec, httptest.NewRequest(m, "/metrics", nil))
		if rec.Code != 200 {
			t.Errorf("%s /metrics: status %d", m, rec.Code)
		}
	}
}

// Every counter the exporter serves is monotonic for the life of the
// process: a GPU reset takes NVML's volatile ECC count back to zero, and the
// served value goes on from where it was (100, then 4 more after the reset:
// 104, never 0 or 4).
func TestCountersSurviveGPUReset(t *testing.T) {
	sc, err := simnode.ParseScenario("reset.yaml", []byte(`
node: {count: 2}
faults:
  - {gpu: 0, at: 1s, ecc: {corrected: 100}}
  - {gpu: 0, at: 20s, reset: true}
  - {gpu: 0, at: 40s, ecc: {corrected: 4}}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := newPodNode(t, sc)
	prev := map[string]float64{}
	var volatile []float64
	for i := 0; i < 12; i++ {
		page := p.step(t, 5*time.Second)
		cur := counters(t, page)
		for k, v := range cur {
			if old, ok := prev[k]; ok && v < old {
				t.Errorf("sample %d: counter %s fell from %v to %v", i, k, old, v)
			}
		}
		prev = cur
		volatile = append(volatile, num(t, page, "gpu_ecc_errors_total", `gpu="0"`, `error="corrected"`, `scope="volatile"`))
	}
	if last := volatile[len(volatile)-1]; last != 104 {
		t.Errorf("volatile corrected ECC over the run: %v; want it to end at 104", volatile)
	}
}

// counters maps every counter series of the page to its value.
func counters(t *testing.T, p *collector.Page) map[string]float64 {
	t.Helper()
	isCounter := map[string]bool{}
	out := map[string]float64{}
	for _, l := range strings.Split(string(p.Plain), "\n") {
		if f := strings.Fields(l); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" && f[3] == "counter" {
			isCounter[f[2]] = true
			continue
		}
		if l == "" || l[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(l, ' ')
		name := l[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		if !isCounter[name] {
			continue
		}
		v, err := strconv.ParseFloat(l[i+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		out[l[:i]] = v
	}
	return out
}
