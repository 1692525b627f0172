//go:build linux

package agent_test

// Churn soak: pods come and go on time-sliced and MIG devices while the
// exporter samples every second and refreshes the kubelet view every second.
// The series count stays bounded by the pods alive, a pod's series leave
// within a refresh or two of the pod, and the heap stays flat.
//
// Short by default (about 6s of scraping); GPE_SOAK=5m runs longer (give go
// test a -timeout above it).

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// soakPod is one generated pod's life.
type soakPod struct {
	name        string
	start, stop time.Duration
}

// Device slots of the soak node: GPUs 0-3 time-sliced into 16 replicas each,
// GPUs 4-7 in MIG mode with seven 1g.10gb instances each.
const (
	soakSharedGPUs = 4
	soakReplicas   = 16
	soakMIGGPUs    = 4
	soakMIGPerGPU  = 7
)

// soakScenario writes a scenario whose pods cover d: every device slot
// hosts one pod after another, each living one to a few seconds with a short
// gap between them, so pods start and stop all the time.
func soakScenario(d time.Duration) (string, []soakPod) {
	var b strings.Builder
	b.WriteString("seed: 3\nnode: {name: soak-node, model: H100-SXM5-80GB, count: 8}\n")
	fmt.Fprintf(&b, "sharing:\n  timeSlicing: {gpus: [0, 1, 2, 3], replicas: %d}\n", soakReplicas)
	b.WriteString("gpus:\n")
	for g := 0; g < soakSharedGPUs; g++ {
		fmt.Fprintf(&b, "  - {index: %d, workload: {preset: inference}}\n", g)
	}
	for g := soakSharedGPUs; g < soakSharedGPUs+soakMIGGPUs; g++ {
		fmt.Fprintf(&b, "  - index: %d\n    mig:\n", g)
		for j := 0; j < soakMIGPerGPU; j++ {
			preset := "training"
			if j%3 == 0 {
				preset = "idle-held"
			}
			fmt.Fprintf(&b, "      - {profile: 1g.10gb, workload: {preset: %s}}\n", preset)
		}
	}
	b.WriteString("pods:\n")
	var pods []soakPod
	slot := 0
	emit := func(device string) {
		const gap = 300 * time.Millisecond
		t := time.Duration(slot%4) * 100 * time.Millisecond
		for i := 0; t < d; i++ {
			life := time.Second + time.Duration((slot+i)%6)*400*time.Millisecond
			p := soakPod{name: fmt.Sprintf("churn-%03d-%04d", slot, i), start: t, stop: t + life}
			pods = append(pods, p)
			fmt.Fprintf(&b, "  - {namespace: soak, name: %s, start: %s, stop: %s, containers: [{name: c, devices: [%s]}]}\n",
				p.name, p.start, p.stop, device)
			t = p.stop + gap
		}
		slot++
	}
	for g := 0; g < soakSharedGPUs; g++ {
		for r := 0; r < soakReplicas; r++ {
			emit(fmt.Sprintf("{gpu: %d, replica: %d}", g, r))
		}
	}
	for g := soakSharedGPUs; g < soakSharedGPUs+soakMIGGPUs; g++ {
		for j := 0; j < soakMIGPerGPU; j++ {
			emit(fmt.Sprintf("{gpu: %d, mig: %d}", g, j))
		}
	}
	return b.String(), pods
}

// maxAlive is the largest number of pods alive at once.
func maxAlive(pods []soakPod) int {
	type ev struct {
		at    time.Duration
		delta int
	}
	var evs []ev
	for _, p := range pods {
		evs = append(evs, ev{p.start, 1}, ev{p.stop, -1})
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].delta < evs[j].delta // a stop before a start at the same instant
	})
	n, m := 0, 0
	for _, e := range evs {
		n += e.delta
		m = max(m, n)
	}
	return m
}

// heapInUse is the heap in use after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// perHolderSeries bounds the series one holder adds: gpu_allocation_info,
// gpu_allocation_share_ratio, gpu_allocation_activity_ratio,
// gpu_allocation_idle, gpu_allocation_idle_seconds_total and, on a device
// held alone, gpu_container_{memory_used_bytes,utilization_ratio,sm_active_ratio}.
const perHolderSeries = 8

func TestSoakPodChurn(t *testing.T) {
	runFor := 6 * time.Second
	if v := os.Getenv("GPE_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("GPE_SOAK=%q: want a duration such as 5m", v)
		}
		runFor = d
	}
	// Pods cover the run, the start-up and the tail.
	yml, pods := soakScenario(runFor + 20*time.Second)
	file := filepath.Join(t.TempDir(), "churn.yaml")
	if err := os.WriteFile(file, []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	alive := maxAlive(pods)
	t.Logf("scenario: %d pods, at most %d alive at once, %d device slots", len(pods), alive, soakSharedGPUs*soakReplicas+soakMIGGPUs*soakMIGPerGPU)
	if len(pods) < 200 {
		t.Fatalf("the scenario has %d pods; the soak wants at least 200", len(pods))
	}
	stopOf := map[string]time.Duration{}
	for _, p := range pods {
		stopOf[p.name] = p.stop
	}

	r := startExporter(t, "--simulate.scenario="+file, "--collect-interval=1s", "--kubelet.refresh-interval=1s", "--log.level=error")
	// The node's clock started inside run(), before /readyz answered: the
	// time since now is a lower bound of the scenario's elapsed time.
	ready := time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	// grace: the fake kubelet's 1s update, two 1s refreshes and a 1s sample,
	// plus a second of margin.
	const grace = 5 * time.Second
	const maxScrapeTime = 2 * time.Second

	scrapeOnce := func() map[string]*dto.MetricFamily {
		t.Helper()
		start := time.Now()
		resp, err := client.Get(r.url("/metrics"))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > maxScrapeTime {
			t.Errorf("a scrape took %v (bound %v)", d, maxScrapeTime)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("scrape answered %d: %s", resp.StatusCode, body)
		}
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
		if err != nil {
			t.Fatalf("exposition does not parse: %v", err)
		}
		return mfs
	}

	// Warm up: two samples with pods, then the heap baseline. Time passes on
	// purpose: the baseline is the heap of a running exporter, not a state.
	time.Sleep(2 * time.Second)
	scrapeOnce()
	heapStart := heapInUse()
	heapMax := heapStart

	var (
		maxPodSeries, minOther, maxOther int
		seenPods                         = map[string]bool{}
		podSets                          = map[string]bool{}
		scrapes, staleChecked            int
	)
	minOther = -1
	end := time.Now().Add(runFor)
	lastHeap := time.Now()
	const maxScrapes = 100000
	for scrapes < maxScrapes && time.Now().Before(end) {
		mfs := scrapeOnce()
		// Elapsed scenario time: at least this much, measured after the scrape.
		elapsed := time.Since(ready)
		scrapes++
		podSeries, other := 0, 0
		podsNow := map[string]bool{}
		for name, mf := range mfs {
			for _, m := range mf.GetMetric() {
				pod := ""
				for _, l := range m.GetLabel() {
					if l.GetName() == "pod" {
						pod = l.GetValue()
					}
				}
				if pod == "" {
					other++
					continue
				}
				podSeries++
				podsNow[pod] = true
				stop, ok := stopOf[pod]
				if !ok {
					t.Fatalf("%s names a pod the scenario does not have: %q", name, pod)
				}
				staleChecked++
				if stop+grace < elapsed {
					t.Errorf("%s of pod %s is still served %v after the pod stopped (at %v, now at least %v)",
						name, pod, elapsed-stop, stop, elapsed)
				}
			}
		}
		for p := range podsNow {
			seenPods[p] = true
		}
		names := make([]string, 0, len(podsNow))
		for p := range podsNow {
			names = append(names, p)
		}
		sort.Strings(names)
		podSets[strings.Join(names, ",")] = true
		maxPodSeries = max(maxPodSeries, podSeries)
		maxOther = max(maxOther, other)
		if minOther < 0 || other < minOther {
			minOther = other
		}
		if time.Since(lastHeap) > 5*time.Second {
			heapMax = max(heapMax, heapInUse())
			lastHeap = time.Now()
		}
		if t.Failed() {
			break
		}
		time.Sleep(200 * time.Millisecond) // the scrape cadence of the soak
	}
	heapEnd := heapInUse()
	heapMax = max(heapMax, heapEnd)

	t.Logf("%d scrapes over %v: %d distinct pods seen, %d pod sets, pod series max %d (bound %d), other series %d..%d",
		scrapes, runFor, len(seenPods), len(podSets), maxPodSeries, alive*perHolderSeries, minOther, maxOther)
	t.Logf("heap in use: %.1f MiB at the start, %.1f MiB at the end, %.1f MiB max",
		float64(heapStart)/(1<<20), float64(heapEnd)/(1<<20), float64(heapMax)/(1<<20))

	// The churn was seen: pods mapped, and the set of pods changed.
	if len(seenPods) < 20 || len(podSets) < 3 {
		t.Errorf("only %d pods in %d distinct sets were seen: the churn did not reach /metrics", len(seenPods), len(podSets))
	}
	if staleChecked == 0 {
		t.Error("no pod series was checked for staleness")
	}
	// Bounded series: pod series by the pods alive, the rest nearly constant.
	if maxPodSeries > alive*perHolderSeries {
		t.Errorf("%d pod series at once, more than %d pods alive x %d series", maxPodSeries, alive, perHolderSeries)
	}
	if maxOther > minOther+8 {
		t.Errorf("series without a pod label went from %d to %d", minOther, maxOther)
	}
	// Flat memory: a generous factor, for a shared and noisy machine.
	if limit := 2*heapStart + 8<<20; heapMax > limit {
		t.Errorf("heap in use grew from %.1f MiB to %.1f MiB (limit %.1f MiB)",
			float64(heapStart)/(1<<20), float64(heapMax)/(1<<20), float64(limit)/(1<<20))
	}
}
