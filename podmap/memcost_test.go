package podmap

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakekubelet"
)

// TestHelperFakeKubelet is the fake kubelet of the memory measurements,
// run as a child process so that its own allocations are not counted.
func TestHelperFakeKubelet(t *testing.T) {
	socket, pods := os.Getenv("PODMAP_HELPER_SOCKET"), os.Getenv("PODMAP_HELPER_PODS")
	if socket == "" {
		t.Skip("run by the memory measurements")
	}
	n, _ := strconv.Atoi(pods)
	srv := fakekubelet.New(socket)
	srv.SetPods(bigNode(n))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	_, _ = os.Stdin.Read(make([]byte, 1)) // until the parent closes stdin
	srv.Stop()
}

// startFakeProcess serves bigNode(pods) from a child process.
func startFakeProcess(tb testing.TB, pods int) string {
	tb.Helper()
	socket := socketPath(tb)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperFakeKubelet$")
	cmd.Env = append(os.Environ(), "PODMAP_HELPER_SOCKET="+socket, fmt.Sprint("PODMAP_HELPER_PODS=", pods))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(socket); err == nil {
			return socket
		}
		if i > 3000 {
			tb.Fatalf("the fake kubelet process never made %s", filepath.Base(socket))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// refreshCost is the memory one Refresh of a List answer of pods costs:
// answer bytes, bytes allocated during the refresh (with the collector
// off, an upper bound of its peak) and bytes still held after it.
func refreshCost(tb testing.TB, pods int) (answer, allocated, retained uint64) {
	tb.Helper()
	socket := startFakeProcess(tb, pods)
	cfg := fastConfig(socket)
	cfg.MaxRecvMsgSize = 1 << 30
	cfg.CallTimeout = time.Minute // a large answer on a busy machine: the cost is measured, not the time
	c, err := NewClient(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	old := debug.SetGCPercent(-1)
	if err := c.Refresh(context.Background()); err != nil {
		tb.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	debug.SetGCPercent(old)
	allocated = after.TotalAlloc - before.TotalAlloc
	// Retained: the heap with the client's map, less the heap without it.
	runtime.GC()
	runtime.ReadMemStats(&after)
	with := after.HeapAlloc
	c.Close()
	c = nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	retained = with - min(with, after.HeapAlloc)
	return uint64(listAnswerSize(pods)), allocated, retained
}

// listAnswerSize is the encoded size of the List answer for bigNode(pods).
func listAnswerSize(pods int) int {
	return proto.Size(fakekubelet.ListResponse(bigNode(pods)))
}

func BenchmarkRefreshMemory(b *testing.B) {
	for _, pods := range []int{2000, 20000} {
		b.Run(fmt.Sprint(pods, "pods"), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				answer, allocated, retained := refreshCost(b, pods)
				b.ReportMetric(float64(answer)/(1<<20), "answer-MiB")
				b.ReportMetric(float64(allocated)/float64(answer), "alloc-B/answer-B")
				b.ReportMetric(float64(retained)/float64(answer), "retained-B/answer-B")
			}
		})
	}
}

// The default receive cap fits the chart's 100 MiB memory limit: the
// exporter's own 30 MiB, the previous map still held, and one refresh of
// an answer at the cap.
func TestDefaultMaxRecvMsgSizeFitsMemoryLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a 1 MiB refresh in a child process")
	}
	const memoryLimit, ownUse = 100 << 20, 30 << 20
	// Whatever else the process allocates meanwhile (gRPC's own goroutines,
	// the runtime) only adds to a measurement: the cheapest of three is the
	// refresh's own cost.
	var answer, allocated, retained uint64
	perByte := math.Inf(1)
	for range 3 {
		a, al, re := refreshCost(t, 2000)
		if p := float64(al+re) / float64(a); p < perByte {
			answer, allocated, retained, perByte = a, al, re, p
		}
	}
	need := ownUse + perByte*DefaultMaxRecvMsgSize
	t.Logf("answer %d bytes: %.1f bytes allocated and %.1f retained per byte; a %d MiB answer needs %.0f MiB",
		answer, float64(allocated)/float64(answer), float64(retained)/float64(answer), DefaultMaxRecvMsgSize>>20, need/(1<<20))
	if need > memoryLimit {
		t.Errorf("an answer at the default cap of %d MiB needs about %.0f MiB, over the chart's %d MiB limit", DefaultMaxRecvMsgSize>>20, need/(1<<20), memoryLimit>>20)
	}
}
