package collector_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// MIGScenario is 8 H100s, each split into seven 1g.10gb instances.
func migScenario(tb testing.TB) *simnode.Scenario {
	var b strings.Builder
	b.WriteString("node: {model: H100-SXM5-80GB, count: 8}\ngpus:\n")
	for i := 0; i < 8; i++ {
		b.WriteString("  - index: " + strconv.Itoa(i) + "\n    mig:\n")
		for j := 0; j < 7; j++ {
			b.WriteString("      - {profile: 1g.10gb, workload: {preset: training}}\n")
		}
	}
	sc, err := simnode.ParseScenario("mig-8x7", []byte(b.String()))
	if err != nil {
		tb.Fatal(err)
	}
	return sc
}

func benchScrape(b *testing.B, sc *simnode.Scenario, gzip bool) {
	e, _ := newExporter(b, sc, newClock(), nil)
	e.SampleOnce(context.Background())
	benchHandler(b, e, gzip, len(e.Page().Plain))
}

// benchStatic serves the same bytes from a static handler: the floor.
func benchStatic(b *testing.B, sc *simnode.Scenario, gzip bool) {
	e, _ := newExporter(b, sc, newClock(), nil)
	e.SampleOnce(context.Background())
	p := e.Page()
	body := p.Plain
	if gzip {
		body = p.Gzip
	}
	static := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// What any metrics handler must send with the bytes.
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		if gzip {
			w.Header().Set("Content-Encoding", "gzip")
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
	benchHandler(b, static, gzip, len(p.Plain))
}

func benchHandler(b *testing.B, h http.Handler, gzip bool, size int) {
	req := httptest.NewRequest("GET", "/metrics", nil)
	if gzip {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w := discardWriter{h: http.Header{}}
		h.ServeHTTP(&w, req)
		if w.code != 0 && w.code != 200 {
			b.Fatalf("status %d", w.code)
		}
	}
}

type discardWriter struct {
	h    http.Header
	code int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(c int)           { d.code = c }

func BenchmarkScrape8GPU(b *testing.B)       { benchScrape(b, nil, false) }
func BenchmarkScrape8GPUGzip(b *testing.B)   { benchScrape(b, nil, true) }
func BenchmarkStatic8GPU(b *testing.B)       { benchStatic(b, nil, false) }
func BenchmarkScrapeMIG8x7(b *testing.B)     { benchScrape(b, migScenario(b), false) }
func BenchmarkScrapeMIG8x7Gzip(b *testing.B) { benchScrape(b, migScenario(b), true) }
func BenchmarkStaticMIG8x7(b *testing.B)     { benchStatic(b, migScenario(b), false) }

// BenchmarkSample is the cost of one sample and render, off the scrape path.
func BenchmarkSample8GPU(b *testing.B) {
	e, _ := newExporter(b, nil, newClock(), nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.SampleOnce(context.Background())
	}
}

func BenchmarkSampleMIG8x7(b *testing.B) {
	e, _ := newExporter(b, migScenario(b), newClock(), nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.SampleOnce(context.Background())
	}
}
