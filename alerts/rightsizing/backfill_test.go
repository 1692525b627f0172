// Package rightsizing tests `gpupool recommend` and `report` on a
// week of a simulated fleet backfilled into a real Prometheus: the raw
// series with `promtool tsdb create-blocks-from openmetrics`, the shipped
// recording rules over them with `promtool tsdb create-blocks-from rules`.
// Both commands must print exactly the answers worked out by hand below.
package rightsizing

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/internal/proctest"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

const (
	day  = 24 * time.Hour
	week = 7 * day
)

// The fixture's week ends at the first grid point after this time.
var fixtureEnd = time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

// newFleet is the simulated fleet, its samples ending at end (a grid
// point) and starting a week and an hour before it: 23 GPUs on 7 nodes,
// each node in a pool of its own.
//
//	gpu-a   8 x H100, DCGM    pool h100-train. ml-training/llm-pretrain-workers-0-0 (Job of JobSet
//	                          llm-pretrain) holds all 8: GPUs 0-5 at 0.9 SM activity, 70 GiB; GPUs 6, 7
//	                          at 0, 1 GiB, idle
//	gpu-b   8 x H100, DCGM    pool h100.
//	                          GPU 0 team-a/steady-trainer (Deployment): 0.30 always, 30 GiB
//	                          GPU 1 team-a/bursty-infer-0 (StatefulSet): 0.08, and 0.95 with 9 GiB (else 6 GiB)
//	                                for one sample every 8 hours (at end - k x 8h)
//	                          GPU 2 research/notebook-alice (no owner): 0, 40 GiB, idle
//	                          GPU 3 research/notebook-bob (no owner): 0.01, one sample of 0.04 at end - 3d, 2 GiB, idle
//	                          GPU 4 team-b/new-svc (Deployment) since end - 2d: 0.4, 10 GiB
//	                          GPU 5 team-b/flaky (no owner): 0.5, 20 GiB; no sample in [end - 4d, end - 4d + 3h)
//	                          GPU 6 team-a/ranker's new pod (Deployment, rolled out from gpu-e) since
//	                                rollout = end - 3d12h: 0.2, 14 GiB
//	                          GPU 7 free; lost (gpu_up 0) from end - 1d
//	gpu-c   2 x H100, DCGM,   pool h100-shared. GPU 0 time-shared by team-c/chat (Deployment, two pods),
//	        time-sharing 2          each pod's processes at 0.15 and 12 GiB (the GPU's own SM activity,
//	                                0.3, is both of theirs)
//	                          GPU 1: reports/nightly-report (CronJob) a night, one replica, 2 hours from
//	                                end - 7d + 1h + k days (k = 0..6): 0.7, 30 GiB; its other replica unheld
//	gpu-d   1 x H100, MIG     pool h100-mig (the GPU Operator's mixed strategy).
//	                          3g.40gb team-c/finetune (Job): 0.2 of its slices, 8 GiB
//	                          2g.20gb ml-training/eval (Deployment): 0.9, 15 GiB; 1g.10gb free
//	gpu-l4  2 x L4, no DCGM   pool l4. GPU 0 team-b/embed (Deployment): 0.5 busy time, 10 GiB; GPU 1 free;
//	                          the node cordoned from end - 2d
//	gpu-e   1 x A100 80GB     pool a100. team-a/ranker's old pod until the rollout: 0.6, 14 GiB
//	gpu-t4  2 x T4, no DCGM   pool t4. GPU 0 team-b/ocr (Deployment): 0.3 busy time, 6 GiB; GPU 1 free
//
// Prices: the exporters serve 11.06 $/h for an H100, 0.71 for an L4, 5.07
// for an A100 80GB, none for the T4.
func newFleet(end time.Time) *fleet {
	f := &fleet{tl: timeline{end.Add(-week - time.Hour), end}, families: map[string][]series{}, ksm: map[string][]series{},
		unhealthyFrom: map[string]time.Time{"GPU-b7": end.Add(-day)}, cordonedFrom: map[string]time.Time{"gpu-l4": end.Add(-2 * day)}}
	const h100Price, l4Price, a100Price, noPrice = 11.06, 0.71, 5.07, -1
	gpus := func(node, prefix string, n int, model string, memory, price float64) []device {
		var out []device
		for i := 0; i < n; i++ {
			d := device{node: node, gpu: strconv.Itoa(i), uuid: fmt.Sprintf("GPU-%s%d", prefix, i)}
			f.gpu(d, model, memory, price, "disabled")
			out = append(out, d)
		}
		return out
	}
	f.node("gpu-a", "h100-train", "nvidia-h100-80gb", 8)
	a := gpus("gpu-a", "a", 8, h100, h100Memory, h100Price)
	f.node("gpu-b", "h100", "nvidia-h100-80gb", 8)
	b := gpus("gpu-b", "b", 8, h100, h100Memory, h100Price)
	f.node("gpu-c", "h100-shared", "nvidia-h100-80gb", 4, "label_cloud_google_com_gke_gpu_sharing_strategy", "time-sharing", "label_cloud_google_com_gke_max_shared_clients_per_gpu", "2")
	c := gpus("gpu-c", "c", 2, h100, h100Memory, h100Price)
	f.node("gpu-d", "h100-mig", "nvidia-h100-80gb", 0, "label_nvidia_com_mig_strategy", "mixed", "label_nvidia_com_mig_config", "h100-3g-2g-1g")
	d0 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0"}
	f.gpu(d0, h100, h100Memory, h100Price, "enabled")
	mig3 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0", gi: "0", ci: "0", profile: "3g.40gb"}
	mig2 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0", gi: "1", ci: "0", profile: "2g.20gb"}
	mig1 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0", gi: "2", ci: "0", profile: "1g.10gb"}
	f.migDevice(mig3, mig3gMemory)
	f.migDevice(mig2, mig2gMemory)
	f.migDevice(mig1, mig1gMemory)
	f.node("gpu-l4", "l4", "nvidia-l4", 2)
	l := gpus("gpu-l4", "l", 2, l4, l4Memory, l4Price)
	f.node("gpu-e", "a100", "nvidia-a100-80gb", 1)
	e := gpus("gpu-e", "e", 1, a100, a100Memory, a100Price)
	f.node("gpu-t4", "t4", "nvidia-tesla-t4", 2)
	t4s := gpus("gpu-t4", "t", 2, t4, t4Memory, noPrice)

	// gpu-a: the 8-GPU job, two of its GPUs idle the whole week.
	f.owner("ml-training", "llm-pretrain-workers-0-0", "Job", "llm-pretrain-workers-0", "ml")
	f.job("ml-training", "llm-pretrain-workers-0", "JobSet", "llm-pretrain")
	for i, d := range a {
		h := holder{dev: d, namespace: "ml-training", pod: "llm-pretrain-workers-0-0", container: "trainer", resource: "nvidia.com/gpu",
			activity: constant(0.9), memory: constant(70 * gib), activitySource: "dcgm"}
		if i >= 6 {
			h.activity, h.memory, h.idle = constant(0), constant(1*gib), true
		}
		f.hold(h)
	}

	// gpu-b.
	f.owner("team-a", "steady-trainer-7c9d-x2k4p", "ReplicaSet", "steady-trainer-7c9d", "alpha")
	f.replicaSet("team-a", "steady-trainer-7c9d", "steady-trainer")
	f.hold(holder{dev: b[0], namespace: "team-a", pod: "steady-trainer-7c9d-x2k4p", container: "trainer", resource: "nvidia.com/gpu",
		activity: constant(0.30), memory: constant(30 * gib), activitySource: "dcgm"})
	spike := func(t time.Time) bool { return end.Sub(t)%(8*time.Hour) == 0 }
	f.owner("team-a", "bursty-infer-0", "StatefulSet", "bursty-infer", "alpha")
	f.hold(holder{dev: b[1], namespace: "team-a", pod: "bursty-infer-0", container: "server", resource: "nvidia.com/gpu", activitySource: "dcgm",
		activity: func(t time.Time) (float64, bool) {
			if spike(t) {
				return 0.95, true
			}
			return 0.08, true
		},
		memory: func(t time.Time) (float64, bool) {
			if spike(t) {
				return 9 * gib, true
			}
			return 6 * gib, true
		}})
	f.owner("research", "notebook-alice", "<none>", "<none>", "research")
	f.hold(holder{dev: b[2], namespace: "research", pod: "notebook-alice", container: "jupyter", resource: "nvidia.com/gpu",
		activity: constant(0), memory: constant(40 * gib), idle: true, activitySource: "dcgm"})
	f.owner("research", "notebook-bob", "<none>", "<none>", "research")
	f.hold(holder{dev: b[3], namespace: "research", pod: "notebook-bob", container: "jupyter", resource: "nvidia.com/gpu", idle: true, activitySource: "dcgm",
		activity: func(t time.Time) (float64, bool) {
			if t.Equal(end.Add(-3 * day)) {
				return 0.04, true
			}
			return 0.01, true
		},
		memory: constant(2 * gib)})
	f.owner("team-b", "new-svc-6b7f-q8w2z", "ReplicaSet", "new-svc-6b7f", "beta")
	f.replicaSet("team-b", "new-svc-6b7f", "new-svc")
	f.hold(holder{dev: b[4], namespace: "team-b", pod: "new-svc-6b7f-q8w2z", container: "server", resource: "nvidia.com/gpu", from: end.Add(-2 * day),
		activity: constant(0.4), memory: constant(10 * gib), activitySource: "dcgm"})
	f.owner("team-b", "flaky", "<none>", "<none>", "")
	f.hold(holder{dev: b[5], namespace: "team-b", pod: "flaky", container: "main", resource: "nvidia.com/gpu",
		gap:      [2]time.Time{end.Add(-4 * day), end.Add(-4*day + 3*time.Hour)},
		activity: constant(0.5), memory: constant(20 * gib), activitySource: "dcgm"})

	// The rollout: ranker's old ReplicaSet on the A100 until rollout, the
	// new one on gpu-b's GPU 6 from then; the old pod's objects go with it.
	rollout := end.Add(-3*day - 12*time.Hour)
	f.replicaSet("team-a", "ranker-5c8d", "ranker")
	f.replicaSet("team-a", "ranker-7f9b", "ranker")
	f.hold(holder{dev: e[0], namespace: "team-a", pod: "ranker-5c8d-aaaaa", container: "server", resource: "nvidia.com/gpu", to: rollout.Add(-gridStep),
		activity: constant(0.6), memory: constant(14 * gib), activitySource: "dcgm",
		owner: func(from, to time.Time) {
			f.ownerDuring(from, to, "team-a", "ranker-5c8d-aaaaa", "ReplicaSet", "ranker-5c8d", "alpha")
		}})
	f.owner("team-a", "ranker-7f9b-bbbbb", "ReplicaSet", "ranker-7f9b", "alpha")
	f.hold(holder{dev: b[6], namespace: "team-a", pod: "ranker-7f9b-bbbbb", container: "server", resource: "nvidia.com/gpu", from: rollout,
		activity: constant(0.2), memory: constant(14 * gib), activitySource: "dcgm"})

	// gpu-c: two pods time-share GPU 0; the GPU's own SM activity is both of theirs.
	f.add("gpu_sm_active_ratio", series{c[0].labels(), f.tl.start, end, constant(0.3)})
	f.replicaSet("team-c", "chat-5f6d", "chat")
	for _, pod := range []string{"chat-5f6d-aaaaa", "chat-5f6d-bbbbb"} {
		f.owner("team-c", pod, "ReplicaSet", "chat-5f6d", "alpha")
		f.hold(holder{dev: c[0], namespace: "team-c", pod: pod, container: "server", resource: "nvidia.com/gpu",
			activity: constant(0.15), memory: constant(12 * gib), activitySource: "processes"})
	}
	// GPU 1: the nightly CronJob's Jobs, two hours a night, each holding
	// one of the GPU's two replicas alone (DCGM's activity is its own).
	for k := 0; k < 7; k++ {
		from := end.Add(-week + time.Hour + time.Duration(k)*day)
		job := fmt.Sprintf("nightly-report-2939%04d", k*1440)
		pod := job + "-x7k2p"
		f.hold(holder{dev: c[1], namespace: "reports", pod: pod, container: "report", resource: "nvidia.com/gpu", from: from, to: from.Add(2*time.Hour - gridStep),
			activity: constant(0.7), memory: constant(30 * gib), activitySource: "dcgm",
			owner: func(from, to time.Time) {
				f.ownerDuring(from, to, "reports", pod, "Job", job, "delta")
				f.jobDuring(from, to, "reports", job, "CronJob", "nightly-report")
			}})
	}

	// gpu-d: MIG devices.
	f.owner("team-c", "finetune-abcde", "Job", "finetune", "alpha")
	f.hold(holder{dev: mig3, namespace: "team-c", pod: "finetune-abcde", container: "trainer", resource: "nvidia.com/mig-3g.40gb",
		activity: constant(0.2), memory: constant(8 * gib), activitySource: "dcgm"})
	f.owner("ml-training", "eval-7d8f-zzzzz", "ReplicaSet", "eval-7d8f", "ml")
	f.replicaSet("ml-training", "eval-7d8f", "eval")
	f.hold(holder{dev: mig2, namespace: "ml-training", pod: "eval-7d8f-zzzzz", container: "eval", resource: "nvidia.com/mig-2g.20gb",
		activity: constant(0.9), memory: constant(15 * gib), activitySource: "dcgm"})

	// gpu-l4: no DCGM; the exporter's NVML busy time.
	f.owner("team-b", "embed-8c9d-yyyyy", "ReplicaSet", "embed-8c9d", "beta")
	f.replicaSet("team-b", "embed-8c9d", "embed")
	f.hold(holder{dev: l[0], namespace: "team-b", pod: "embed-8c9d-yyyyy", container: "server", resource: "nvidia.com/gpu",
		activity: constant(0.5), memory: constant(10 * gib), activitySource: "device"})

	// gpu-t4: no DCGM, no price.
	f.owner("team-b", "ocr-9f8e-ccccc", "ReplicaSet", "ocr-9f8e", "beta")
	f.replicaSet("team-b", "ocr-9f8e", "ocr")
	f.hold(holder{dev: t4s[0], namespace: "team-b", pod: "ocr-9f8e-ccccc", container: "server", resource: "nvidia.com/gpu",
		activity: constant(0.3), memory: constant(6 * gib), activitySource: "device"})
	return f
}

// blockDuration is promtool's (hidden) largest block: the week in three
// blocks rather than 85 of two hours, each of which promtool writes (and,
// for OpenMetrics, reads its whole input for) on its own. A Prometheus
// compaction range (2h x 3^4), as promtool requires.
const blockDuration = "--max-block-duration=162h"

// backfillRulesFile and backfillGroup name the rules promtool backfills:
// its evaluation times are offset from the grid by a hash of the two
// (rules.Group.EvalTimestamp), which evalPhase computes to put the
// fixture's samples exactly on them.
const (
	backfillRulesFile = "rightsizing.rules.yml"
	backfillGroup     = "rightsizing"
)

// backfillPasses are the recordings the commands read and those they
// read in turn, in the order the backfill must make them: the first pass
// reads raw series only, each later one what the earlier passes recorded
// (a recording's pass is one past the latest of what it reads).
func backfillPasses(t *testing.T, rf *alerts.RuleFile) [][]string {
	t.Helper()
	names := rf.RecordNames()
	reads := func(name string) []string {
		rules, err := rf.Recordings(name)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, rec := range names {
			if rec != name && readsRecord(rules[0].Expr, rec) {
				out = append(out, rec)
			}
		}
		return out
	}
	pass := map[string]int{}
	var place func(name string, depth int) int
	place = func(name string, depth int) int {
		if p, ok := pass[name]; ok {
			return p
		}
		if depth > len(names) {
			t.Fatalf("the recordings %v read each other in a cycle", rightsize.Recordings)
		}
		p := 0
		for _, r := range reads(name) {
			p = max(p, place(r, depth+1)+1)
		}
		pass[name] = p
		return p
	}
	for _, n := range rightsize.Recordings {
		place(n, 0)
	}
	var passes [][]string
	for n, p := range pass {
		for len(passes) <= p {
			passes = append(passes, nil)
		}
		passes[p] = append(passes[p], n)
	}
	for _, p := range passes {
		sort.Strings(p)
	}
	return passes
}

// readsRecord: expr reads the recorded series rec.
func readsRecord(expr, rec string) bool {
	return regexp.MustCompile(`(^|[^a-zA-Z0-9_:])` + regexp.QuoteMeta(rec) + `($|[^a-zA-Z0-9_:])`).MatchString(expr)
}

// evalPhase is where promtool evaluates the group: at offset + k x
// interval, offset the hash of the group's name and file modulo the
// interval (Prometheus' rules.Group.EvalTimestamp, with the labels
// implementation promtool3 is built with), rounded to the millisecond as
// the query API rounds the times it is given.
func evalPhase(interval time.Duration) time.Duration {
	h := labels.New(labels.Label{Name: "name", Value: backfillGroup}, labels.Label{Name: "file", Value: backfillRulesFile}).Hash()
	return (time.Duration(h % uint64(interval))).Round(time.Millisecond)
}

func TestRecommendAndReportOnABackfilledWeek(t *testing.T) {
	t.Parallel()
	promtool3 := tool(t, "promtool3", "build it with scripts/install-tools.sh (make tools)")
	servers := prometheusServers(t)
	root := proctest.RepoRoot(t)
	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gpupool := proctest.GpupoolBinary(t, ctx, root, filepath.Join(tmp, "gpupool"))

	// The grid: promtool's evaluation times. A phase on a whole minute
	// would put a query step exactly five minutes after a sample (where
	// Prometheus 2 and 3 disagree on the lookback's edge); one in the
	// last second before a block boundary (a multiple of four minutes)
	// would lose that evaluation between promtool's blocks.
	phase := evalPhase(gridStep)
	if phase%time.Minute == 0 || (gridStep-phase)%gridStep <= time.Second && phase != 0 {
		t.Fatalf("the backfill's evaluation phase %s falls on a whole minute or just before a block boundary: rename backfillRulesFile", phase)
	}
	end := fixtureEnd.Truncate(gridStep).Add(phase)
	if end.Before(fixtureEnd) {
		end = end.Add(gridStep)
	}
	fx := newFleet(end)
	began := time.Now()

	// Raw blocks: the exporters' and kube-state-metrics' series.
	raw := filepath.Join(tmp, "raw")
	all := map[string][]series{}
	for _, fams := range []map[string][]series{fx.families, fx.ksm} {
		for name, ss := range fams {
			all[name] = append(all[name], ss...)
		}
	}
	if err := writeOpenMetrics(raw+".om", fx.tl, fx.tl.start, fx.tl.end.Add(time.Millisecond), all); err != nil {
		t.Fatal(err)
	}
	runTool(t, promtool3, tmp, "tsdb", "create-blocks-from", blockDuration, "openmetrics", "--quiet", raw+".om", raw)
	t.Logf("raw blocks written in %s", time.Since(began).Round(time.Millisecond))

	// The rules, pass by pass, each against a Prometheus on what the
	// previous passes wrote.
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	blockDirs := []string{raw}
	passes := backfillPasses(t, rf)
	t.Logf("backfill passes: %v", passes)
	for i, names := range passes {
		data := filepath.Join(tmp, fmt.Sprintf("data-pass%d", i+1))
		copyBlocks(t, data, blockDirs...)
		prom := startPrometheus(t, ctx, servers[0], data)
		writeRules(t, filepath.Join(tmp, backfillRulesFile), rf, names, passes[:i])
		out := filepath.Join(tmp, fmt.Sprintf("rules-pass%d", i+1))
		runTool(t, promtool3, tmp, "tsdb", "create-blocks-from", blockDuration, "rules", "--quiet", "--url="+prom,
			"--start="+strconv.FormatInt(fx.tl.start.Unix()-1, 10), "--end="+strconv.FormatInt(end.Add(time.Minute).Unix(), 10),
			"--eval-interval="+gridStep.String(), "--output-dir="+out, backfillRulesFile)
		blockDirs = append(blockDirs, out)
		t.Logf("rules pass %d done at %s", i+1, time.Since(began).Round(time.Millisecond))
	}

	at := end.Add(gridStep - time.Millisecond) // see the expected answers
	for _, server := range servers {
		t.Run(filepath.Base(server.name), func(t *testing.T) {
			data := filepath.Join(tmp, "data-"+filepath.Base(server.name))
			copyBlocks(t, data, blockDirs...)
			prom := startPrometheus(t, ctx, server, data)
			checkAlignment(t, prom, end)
			checkAnswers(t, gpupool, prom, root, end, at)

			// The same week without kube-state-metrics: its series deleted.
			noKSM := filepath.Join(tmp, "data-noksm-"+filepath.Base(server.name))
			copyBlocks(t, noKSM, blockDirs...)
			prom = startPrometheus(t, ctx, server, noKSM)
			deleteSeries(t, prom, `{job="kube-state-metrics"}`)
			checkWithoutKSM(t, gpupool, prom, at)
		})
	}
}

// checkAlignment: the backfilled recordings sit on the fixture's grid.
func checkAlignment(t *testing.T, prom string, end time.Time) {
	t.Helper()
	v, err := query(prom, `timestamp(`+rightsize.RecordShare+`{pod="notebook-alice"})`, end.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(end.UnixMilli()) / 1000; v != want {
		t.Fatalf("the backfilled recordings are at %v, the fixture's samples at %v: promtool evaluated the rules off the grid evalPhase predicts (did Prometheus change rules.Group.EvalTimestamp?)", v, want)
	}
}

// The answers, worked out from newFleet's curves.
//
// The window: --at is the grid point after end, less a millisecond, so
// (at - 7d, at] holds the 2,520 grid points from end - 7d + 4m to end, and
// the query steps (whole minutes, one a minute) are the 10,080 minutes of
// [end - 7d + 4m, end + 4m). Each step sees the latest recorded sample,
// so every sample counts for exactly the four steps before the next one:
// a holding present the whole week is 10,080 steps, 168 hours. The last
// sample of a series that stops counts for five (the lookback reaches
// five minutes back, and the next sample is hours away), and the rules
// record one sample more than the raw series has (their instant selectors
// see its last raw sample until it is five minutes old): a holding whose
// raw series stops at s is recorded until s + 4m, and counts 4 steps a
// sample and one more.
//
// Per holding (GPU-hours = steps / 60 x its charge: 1 for a whole GPU, its
// replica 1/2 on gpu-c, a MIG device its cost share, the larger of its
// compute and memory slice fractions: 3g.40gb max(3/7, 4/8) = 1/2, 2g.20gb
// max(2/7, 2/8) = 2/7, 1g.10gb max(1/7, 1/8) = 1/7); busy GPU-hours are its
// own activity x its steps / 60 (x the cost share on a MIG device):
//
//	llm-pretrain  8 GPUs x 168 h = 1344; busy 6 x 0.9 x 168 = 907.2; idle (GPUs 6, 7) 2 x 168 = 336
//	eval          2g.20gb: 2/7 x 168 = 48; busy 0.9 x 48 = 43.2
//	steady        168; busy 0.30 x 168 = 50.4
//	bursty        168; busy: 2,520 samples, 21 of them spikes (end - k x 8h, k = 0..20; k = 21 is
//	              end - 7d, before the window): (2499 x 0.08 + 21 x 0.95) x 4 / 60 = 219.87 x 4 / 60 = 14.658
//	ranker (old)  A100, raw until rollout - 4m, recorded until rollout: 1,260 samples in the window,
//	              4 x 1260 + 1 = 5,041 steps = 84.016667 h; busy 0.6 x 5,037 / 60 = 50.37 (its activity,
//	              recorded from the raw series, has no sample at the share's extra step: 4 steps fewer)
//	ranker (new)  H100 from rollout = end - 3d12h to end: 1,261 samples, 5,044 steps = 84.066667 h;
//	              busy 0.2 x that = 16.813333
//	alice         168; busy 0; idle 168
//	bob           168; busy (2519 x 0.01 + 0.04) x 4 / 60 = 1.682; idle 168
//	new-svc       recorded from end - 2d: 721 samples, 2,884 steps = 48.066667 h; busy 0.4 x that = 19.226667
//	flaky         allocation:gpu_devices:share is recorded at end - 4d (the rules' extra sample), its
//	              activity not; 1,080 samples from end - 7d + 4m to end - 4d,
//	              then none until end - 4d + 3h, then 1,396 to end:
//	              4 x 1080 + 1 + 4 x 1396 = 9,905 steps = 165.083333 h; busy 0.5 x 9,901 / 60 = 82.508333
//	chat          2 pods x 1/2 x 168 = 168; busy 2 x 0.15 x 168 = 50.4: the GPU's own 0.3 x 168
//	nightly       7 nights x 30 raw samples, recorded 31: 7 x (4 x 31 + 1) = 875 steps; its replica
//	              1/2: 7.291667 h; busy 7 x (4 x 30 + 1) x 0.7 / 60 = 9.881667 (its activity: 30 samples
//	              a night), above its allocated hours (136%)
//	finetune      3g.40gb: 1/2 x 168 = 84; busy 0.2 x 84 = 16.8
//	embed (L4)    168; busy 0.5 x 168 = 84
//	ocr (T4)      168; busy 0.3 x 168 = 50.4
//
// The rest of each GPU, nobody's (steps / 60 x the part):
//
//	free                  H100: gpu-b GPU 4 before new-svc 10080 - 2884 = 7,196; GPU 5 in flaky's gap
//	                      10080 - 9905 = 175; GPU 6 before the rollout 10080 - 5044 = 5,036; GPU 7 while
//	                      healthy 10080 - 1444 = 8,636; gpu-c GPU 1 between the nights 10080 - 875 = 9,205:
//	                      30,248 steps = 504.133333 h. A100: 10080 - 5041 = 5,039 = 83.983333 h.
//	                      L4: GPU 1 before the cordon 10080 - 2884 = 7,196 = 119.933333 h. T4: GPU 1, 168 h.
//	unheld replica        gpu-c GPU 1's other replica while the nightly job holds one: 875 / 2 = 7.291667 h
//	free MIG capacity     the 1g.10gb device, 1/7 x 168 = 24 h
//	unplaceable remainder gpu-d's GPU less its three devices' cost shares: (1 - 1/2 - 2/7 - 1/7) x 168 = 12 h
//	unhealthy or cordoned H100: gpu-b GPU 7 lost from end - 1d: 361 samples, 1,444 steps = 24.066667 h.
//	                      L4: GPU 1 cordoned from end - 2d: 2,884 steps = 48.066667 h
//
// The invoice: every GPU of every node, 168 hours, at the exporters' prices.
//
//	H100  19 GPUs x 168 = 3192 h x 11.06 = 35303.52 $
//	A100   1 GPU  x 168 =  168 h x  5.07 =   851.76 $
//	L4     2 GPUs x 168 =  336 h x  0.71 =   238.56 $
//	T4     2 GPUs x 168 =  336 h, no price
//
// By namespace, at those prices (H100-hours first):
//
//	ml-training  1392 h: 15395.52; busy 950.4: 10511.424; idle 336: 3716.16
//	reports      7.291667: 80.645833; busy 9.881667: 109.291233
//	research     336: 3716.16; busy 1.682: 18.60292; idle 336: 3716.16
//	team-a       H100 168 + 168 + 84.066667 = 420.066667: 4645.937333; busy 50.4 + 14.658 + 16.813333 =
//	             81.871333: 905.496947. A100 84.016667: 425.9645; busy 50.37: 255.3759
//	team-b       H100 48.066667 + 165.083333 = 213.15: 2357.439; busy 101.735: 1125.1891.
//	             L4 168: 119.28; busy 84: 59.64. T4 168, busy 50.4, no cost
//	team-c       H100 168 + 84 = 252: 2787.12; busy 50.4 + 16.8 = 67.2: 743.232
//	unallocated  H100 free 504.133333: 5575.714667; unheld replica 7.291667: 80.645833; free MIG 24:
//	             265.44; remainder 12: 132.72; unhealthy 24.066667: 266.177333. A100 free 83.983333:
//	             425.7955. L4 free 119.933333: 85.152667; cordoned 48.066667: 34.127333. T4 free 168
//
// H100 rows: 1392 + 7.291667 + 336 + 420.066667 + 213.15 + 252 + 504.133333 + 7.291667 + 24 + 12 +
// 24.066667 = 3192 h, 35303.52 $ (the rounded rows 35303.53). A100: 84.016667 + 83.983333 = 168 h,
// 851.76 $. L4: 168 + 119.933333 + 48.066667 = 336 h, 238.56 $. T4: 168 + 168 = 336 h.
const wantReportByNamespace = `namespace,model,reason,allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours,allocated_cost_dollars,busy_cost_dollars,idle_cost_dollars,shared_unallocated_cost_dollars
ml-training,NVIDIA H100 80GB HBM3,,1392.000,950.400,336.000,15395.52,10511.42,3716.16,0.00
reports,NVIDIA H100 80GB HBM3,,7.292,9.882,0.000,80.65,109.29,0.00,0.00
research,NVIDIA H100 80GB HBM3,,336.000,1.682,336.000,3716.16,18.60,3716.16,0.00
team-a,NVIDIA A100-SXM4-80GB,,84.017,50.370,0.000,425.96,255.38,0.00,0.00
team-a,NVIDIA H100 80GB HBM3,,420.067,81.871,0.000,4645.94,905.50,0.00,0.00
team-b,NVIDIA H100 80GB HBM3,,213.150,101.735,0.000,2357.44,1125.19,0.00,0.00
team-b,NVIDIA L4,,168.000,84.000,0.000,119.28,59.64,0.00,0.00
team-b,Tesla T4,,168.000,50.400,0.000,,,,
team-c,NVIDIA H100 80GB HBM3,,252.000,67.200,0.000,2787.12,743.23,0.00,0.00
` + wantUnallocated

const wantUnallocated = `(unallocated),NVIDIA A100-SXM4-80GB,free,83.983,,,425.80,,,
(unallocated),NVIDIA H100 80GB HBM3,free,504.133,,,5575.71,,,
(unallocated),NVIDIA L4,free,119.933,,,85.15,,,
(unallocated),Tesla T4,free,168.000,,,,,,
(unallocated),NVIDIA H100 80GB HBM3,unheld replica,7.292,,,80.65,,,
(unallocated),NVIDIA H100 80GB HBM3,free MIG capacity,24.000,,,265.44,,,
(unallocated),NVIDIA H100 80GB HBM3,unplaceable remainder,12.000,,,132.72,,,
(unallocated),NVIDIA H100 80GB HBM3,unhealthy or cordoned,24.067,,,266.18,,,
(unallocated),NVIDIA L4,unhealthy or cordoned,48.067,,,34.13,,,
`

// invoice is the week's GPU bill, worked out above: GPU-hours and dollars
// per model (no price for the T4: -1).
var invoice = map[string][2]float64{
	h100: {3192, 35303.52},
	a100: {168, 851.76},
	l4:   {336, 238.56},
	t4:   {336, -1},
}

// By the pods' team label: ml = llm-pretrain + eval; alpha = steady,
// bursty, ranker, chat and finetune (H100 672.066667 h: 7433.057333; busy
// 149.071333: 1648.728947; ranker's A100 84.016667: 425.9645); beta =
// new-svc, embed and ocr (H100 48.066667: 531.617333; busy 19.226667:
// 212.646933); delta = nightly; flaky has no label (165.083333 h:
// 1825.821667; busy 82.508333: 912.542167).
const wantReportByTeam = `label:team,model,reason,allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours,allocated_cost_dollars,busy_cost_dollars,idle_cost_dollars,shared_unallocated_cost_dollars
(none),NVIDIA H100 80GB HBM3,,165.083,82.508,0.000,1825.82,912.54,0.00,0.00
alpha,NVIDIA A100-SXM4-80GB,,84.017,50.370,0.000,425.96,255.38,0.00,0.00
alpha,NVIDIA H100 80GB HBM3,,672.067,149.071,0.000,7433.06,1648.73,0.00,0.00
beta,NVIDIA H100 80GB HBM3,,48.067,19.227,0.000,531.62,212.65,0.00,0.00
beta,NVIDIA L4,,168.000,84.000,0.000,119.28,59.64,0.00,0.00
beta,Tesla T4,,168.000,50.400,0.000,,,,
delta,NVIDIA H100 80GB HBM3,,7.292,9.882,0.000,80.65,109.29,0.00,0.00
ml,NVIDIA H100 80GB HBM3,,1392.000,950.400,336.000,15395.52,10511.42,3716.16,0.00
research,NVIDIA H100 80GB HBM3,,336.000,1.682,336.000,3716.16,18.60,3716.16,0.00
` + wantUnallocated

// Recommendations, with 20% headroom, per device: need = peak x 1.2 and
// p95 x 1.2 (in whole H100s: a MIG device's activity times its compute
// slices, 3/7 or 2/7). Candidates a pool serves: the MIG profiles of
// h100-mig (3g.40gb, 2g.20gb, 1g.10gb at the sizes gpu-d serves), 1/2 of
// an H100 (h100-shared), whole L4s (l4), A100s (a100; 312/989 = 0.3155 of
// an H100), T4s (t4; unpriced, so never proposed for a priced shape). At
// the shipped GKE on-demand prices: an H100 11.06, a MIG device its cost
// share (3g 5.53, 2g 3.16, 1g 1.58), a half 5.53, an L4 0.71, an A100 80GB
// 5.07. Savings are a month of 730 hours at the rate the workload's pods
// held devices in the window (one pod all along: 730 hours).
//
//	llm-pretrain  8 GPUs, GPUs 6 and 7 never above 0.05: the same accelerator x6 on its pool;
//	              saves 2 x 11.06 x 730 = 16147.60
//	alice, bob    never above 0.05 (bob's most is 0.04): release; saves 11.06 x 730 = 8073.80
//	bursty        p95 0.08 (21 spikes of 2,520 samples are under 5%), peak 9 GiB: needs 0.096 and
//	              10.8 GiB; 1g.10gb is too small, the L4 (0.1223, 22.5 GiB, 0.71) is the cheapest that
//	              holds it; saves (11.06 - 0.71) x 730 = 7555.50
//	ranker        its A100 minutes 0.6 x 0.3155 = 0.189 of an H100, its H100 minutes 0.2: p95 0.2 of
//	              the H100 it holds now (judged in mixed units, 0.6, it would keep a whole H100);
//	              peak 14 GiB: needs 0.24 and 16.8 GiB: 2g.20gb (0.2857, 19.5 GiB, 3.16); its pods held
//	              5041 + 5044 = 10,085 steps of 10,080: saves (11.06 - 3.16) x 730 x 10085 / 10080 = 5769.86
//	steady        p95 0.30, peak 30 GiB: needs 0.36 and 36 GiB: 3g.40gb (0.4286, 39.5 GiB, 5.53 for its 4 of
//	              8 memory slices) ties with the half and has less compute; saves (11.06 - 5.53) x 730 = 4036.90
//	finetune      3g.40gb (5.53), p95 0.2 of 3/7: needs 0.1029 and 9.6 GiB: the L4 (0.71) before
//	              1g.10gb (1.58); saves (5.53 - 0.71) x 730 = 3518.60
//	chat          each pod 1/2 (5.53), p95 0.15, peak 12 GiB: needs 0.18 and 14.4 GiB: 2g.20gb (0.2857,
//	              19.6 GiB, 3.16); saves 2 x (5.53 - 3.16) x 730 = 3460.20
//	eval          2g.20gb (3.16), p95 0.9 of 2/7: needs 0.3086: nothing cheaper holds it: keep
//	nightly       gone at the end: judged on its last shape, 1/2 of an H100; p95 0.7: needs 0.84: keep;
//	              875 samples; first seen at the first step after end - 7d + 1h, last at the last step
//	              its last night's extra sample (end - 21h) reaches; coverage from its first step to the
//	              window's end, 10080 - 56 = 10,024 steps: 0.9944
//	embed         an L4, 0.5: the H100 costs more, the L4 has no MIG: keep
//	flaky         coverage (10080 - 175) / 10080 = 0.9826 (its gap of 175 steps) over 0.8: p95 0.5, 20 GiB:
//	              needs 0.6 and 24 GiB: nothing cheaper holds it: keep
//	ocr           a T4 without a price: only smaller shapes would do and there are none: keep, saving
//	              unknown, and a note names the T4
//	new-svc       first seen at the first step after end - 2d: 2,884 of 10,080 steps, 0.2861 under
//	              0.8: insufficient data
const wantRecommend = `namespace,workload,pods,accelerator,model,holds,devices,peak_memory_bytes,p95_activity,idle_share,idle_devices,recommendation,recommended_devices,monthly_saving_dollars,reason,samples,coverage,first_seen,last_seen,pool
ml-training,JobSet/llm-pretrain,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,8,75161927680,0.9000,0.2500,2,accelerator:nvidia-h100-80gb,6,16147.60,,80640,1.0000,{first},{last},h100-train
research,Pod/notebook-alice,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,42949672960,0.0000,1.0000,1,release,0,8073.80,,10080,1.0000,{first},{last},
research,Pod/notebook-bob,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,2147483648,0.0100,1.0000,1,release,0,8073.80,,10080,1.0000,{first},{last},
team-a,StatefulSet/bursty-infer,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,9663676416,0.0800,0.0000,0,accelerator:nvidia-l4,1,7555.50,,10080,1.0000,{first},{last},l4
team-a,Deployment/ranker,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,15032385536,0.2000,0.0000,0,mig:2g.20gb,1,5769.86,,10085,1.0000,{first},{last},h100-mig
team-a,Deployment/steady-trainer,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,32212254720,0.3000,0.0000,0,mig:3g.40gb,1,4036.90,,10080,1.0000,{first},{last},h100-mig
team-c,Job/finetune,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb mig 3g.40gb,1,8589934592,0.2000,0.0000,0,accelerator:nvidia-l4,1,3518.60,,10080,1.0000,{first},{last},l4
team-c,Deployment/chat,2,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb share 1/2,1,12884901888,0.1500,0.0000,0,mig:2g.20gb,1,3460.20,,20160,1.0000,{first},{last},h100-mig
ml-training,Deployment/eval,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb mig 2g.20gb,1,16106127360,0.9000,0.0000,0,keep,1,0.00,,10080,1.0000,{first},{last},h100-mig
reports,CronJob/nightly-report,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb share 1/2,1,32212254720,0.7000,0.0000,0,keep,1,0.00,,875,0.9944,{nightlyFirst},{nightlyLast},h100-shared
team-b,Deployment/embed,1,nvidia-l4,NVIDIA L4,nvidia-l4,1,10737418240,0.5000,0.0000,0,keep,1,0.00,,10080,1.0000,{first},{last},l4
team-b,Pod/flaky,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,21474836480,0.5000,0.0000,0,keep,1,0.00,,9905,0.9826,{first},{last},h100
team-b,Deployment/ocr,1,nvidia-tesla-t4,Tesla T4,nvidia-tesla-t4,1,6442450944,0.3000,0.0000,0,keep,1,,,10080,1.0000,{first},{last},t4
team-b,Deployment/new-svc,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,10737418240,0.4000,0.0000,0,insufficient data,0,,coverage 29% of the window (first seen 2d before its end) is under --min-coverage=0.8,2884,0.2861,{newFirst},{last},
`

// stepTimes fills the first and last steps of wantRecommend: the query
// steps are whole minutes, and the fixture's samples (and end) never fall
// on one, so the step that first sees a sample at t is the minute after
// it.
func stepTimes(s string, end, at time.Time) string {
	after := func(t time.Time) string { return t.Truncate(time.Minute).Add(time.Minute).UTC().Format(time.RFC3339) }
	return strings.NewReplacer(
		"{first}", after(at.Add(-week)),
		"{last}", at.Truncate(time.Minute).UTC().Format(time.RFC3339),
		"{nightlyFirst}", after(end.Add(-week+time.Hour)),
		// Its last night's raw samples end at end - 21h - 4m, the rules'
		// extra sample is at end - 21h, seen five minutes.
		"{nightlyLast}", end.Add(-21*time.Hour+5*time.Minute).Truncate(time.Minute).UTC().Format(time.RFC3339),
		"{newFirst}", after(end.Add(-2*day)),
	).Replace(s)
}

// With --allow-new-pools, shapes no pool serves: chat (needs 0.18 and 14.4
// GiB) fits 1/5 of an H100 (0.2, 16 GiB, 2.212 $: saves 2 x (5.53 -
// 2.212) x 730 = 4844.28), ranker (0.24, 16.8 GiB) 1/4 (0.25, 20 GiB,
// 2.765: saves (11.06 - 2.765) x 730 x 10085 / 10080 = 6058.37), both on
// a GKE time-sharing pool to create; ocr, whose T4 has no price, the
// smallest shape that holds it (0.36 of a T4 and 7.2 GiB): half a T4 on a
// new time-sharing pool; the others as without it.
var wantNewPools = map[string][2]string{
	"team-c/Deployment/chat":   {"share:5", "new pool: cloud.google.com/gke-accelerator=nvidia-h100-80gb, cloud.google.com/gke-gpu-sharing-strategy=time-sharing, cloud.google.com/gke-max-shared-clients-per-gpu=5"},
	"team-a/Deployment/ranker": {"share:4", "new pool: cloud.google.com/gke-accelerator=nvidia-h100-80gb, cloud.google.com/gke-gpu-sharing-strategy=time-sharing, cloud.google.com/gke-max-shared-clients-per-gpu=4"},
	"team-c/Job/finetune":      {"accelerator:nvidia-l4", "l4"},
	"team-b/Deployment/ocr":    {"share:2", "new pool: cloud.google.com/gke-accelerator=nvidia-tesla-t4, cloud.google.com/gke-gpu-sharing-strategy=time-sharing, cloud.google.com/gke-max-shared-clients-per-gpu=2"},
}

func checkAnswers(t *testing.T, gpupool, prom, root string, end, at time.Time) {
	t.Helper()
	atFlag := "--at=" + at.Format(time.RFC3339Nano)
	priceFile := "--idle.price-file=" + filepath.Join(root, "deploy", "prices-gke-on-demand.yaml")
	run := func(args ...string) (string, string) {
		t.Helper()
		out, errOut, code := runCommand(t, gpupool, append(args, "--prometheus="+prom, atFlag)...)
		if code != 0 {
			t.Fatalf("gpupool %s: exit %d: %s", strings.Join(args, " "), code, errOut)
		}
		return out, errOut
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		// recommend with the shipped GKE price list (the same prices as the exporters').
		{[]string{"recommend", "--window=7d", "-o", "csv", priceFile}, stepTimes(wantRecommend, end, at)},
		// report with the exporters' prices.
		{[]string{"report", "--by=namespace", "--since=7d", "-o", "csv"}, wantReportByNamespace},
		{[]string{"report", "--by=label:team", "--since=7d", "-o", "csv"}, wantReportByTeam},
	} {
		if out, _ := run(c.args...); out != c.want {
			t.Errorf("gpupool %s printed\n%s\nwant\n%s", strings.Join(c.args, " "), out, c.want)
		}
	}

	// Every grouping's rows add up to the invoice, model by model, and say
	// so in their bill lines; the T4's hours are listed, not hidden.
	for _, by := range []string{"namespace", "owner", "label:team"} {
		out, errOut := run("report", "--by="+by, "--since=7d", "-o", "csv")
		checkInvoice(t, "--by="+by, out, false)
		for _, want := range []string{"bill NVIDIA H100 80GB HBM3: 3192.000 GPU-hours x 11.06 $/h = 35303.52 $; the rows add up to 35303.5", "bill Tesla T4: 336.000 GPU-hours, no price; the rows add up to 336.000 GPU-hours",
			"no price for Tesla T4 (336.000 GPU-hours)"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("report --by=%s -o csv: standard error lacks %q:\n%s", by, want, errOut)
			}
		}
		if strings.Contains(errOut, "do NOT add up") {
			t.Errorf("report --by=%s: %s", by, errOut)
		}
	}
	// Shared: the groups of each priced model carry its unallocated cost in
	// proportion to their allocated cost, and still add up to the bill.
	shared, _ := run("report", "--by=owner", "--since=7d", "-o", "csv", "--unallocated=share")
	checkInvoice(t, "--by=owner --unallocated=share", shared, true)

	// The time-sliced GPU: chat's two holders' busy hours are the GPU's
	// (0.3 x 168 = 50.4), the nightly job's above its allocated hours.
	byOwner, _ := run("report", "--by=owner", "--since=7d", "-o", "csv")
	for _, want := range []string{"team-c/Deployment/chat,NVIDIA H100 80GB HBM3,,168.000,50.400,", "reports/CronJob/nightly-report,NVIDIA H100 80GB HBM3,,7.292,9.882,",
		"team-a/Deployment/ranker,NVIDIA A100-SXM4-80GB,,84.017,50.370,", "team-a/Deployment/ranker,NVIDIA H100 80GB HBM3,,84.067,16.813,"} {
		if !strings.Contains(byOwner, want) {
			t.Errorf("report --by=owner lacks the row %q:\n%s", want, byOwner)
		}
	}
	table, _ := run("report", "--by=namespace", "--since=7d")
	if !regexp.MustCompile(`(?m)^reports .* 136%\*`).MatchString(table) || !strings.Contains(table, "* busy above allocated") {
		t.Errorf("report's table does not mark the nightly job's 136%% busy over allocated:\n%s", table)
	}
	checkDocExample(t, root, docReportExample, table)

	// JSON: a model per group row, the unallocated list, the bill with
	// null for the unpriced T4.
	js, _ := run("report", "--by=namespace", "--since=7d", "-o", "json")
	var rep struct {
		Groups []struct {
			Group, Model string
			Cost         *float64 `json:"allocated_cost_dollars"`
		} `json:"groups"`
		Unallocated []struct {
			Reason, Model string
			Hours         float64  `json:"gpu_hours"`
			Cost          *float64 `json:"cost_dollars"`
		} `json:"unallocated"`
		Bill []struct {
			Model string
			Hours float64  `json:"gpu_hours"`
			Cost  *float64 `json:"cost_dollars"`
		} `json:"bill"`
		Unpriced []string `json:"unpriced_models"`
	}
	if err := json.Unmarshal([]byte(js), &rep); err != nil {
		t.Fatalf("report -o json: %v\n%s", err, js)
	}
	if len(rep.Groups) != 9 || rep.Groups[0].Model != h100 || len(rep.Unallocated) != 9 || len(rep.Bill) != 4 || len(rep.Unpriced) != 1 {
		t.Errorf("report -o json: %d groups (first model %q), %d unallocated, %d bill rows, unpriced %v; want 9, %q, 9, 4, [%s]\n%s",
			len(rep.Groups), rep.Groups[0].Model, len(rep.Unallocated), len(rep.Bill), rep.Unpriced, h100, t4, js)
	}
	for _, b := range rep.Bill {
		inv := invoice[b.Model]
		if b.Hours != inv[0] || (inv[1] < 0) != (b.Cost == nil) || b.Cost != nil && *b.Cost != inv[1] {
			t.Errorf("report -o json: bill %s %v GPU-hours, %v $; want %v", b.Model, b.Hours, b.Cost, inv)
		}
	}

	// Recommendations name only shapes a pool serves, unless new pools are
	// allowed; then they name the pool to create.
	pools := map[string]bool{"h100-train": true, "h100": true, "h100-shared": true, "h100-mig": true, "l4": true, "a100": true, "t4": true}
	for _, allow := range []bool{false, true} {
		args := []string{"recommend", "--window=7d", "-o", "json", priceFile}
		if allow {
			args = append(args, "--allow-new-pools")
		}
		js, _ := run(args...)
		var rec struct {
			Workloads []struct {
				Namespace, Workload, Recommendation, Pool string
				Saving                                    *float64 `json:"monthly_saving_dollars"`
				Samples                                   int
				Coverage                                  float64
				FirstSeen                                 time.Time `json:"first_seen"`
				LastSeen                                  time.Time `json:"last_seen"`
			} `json:"workloads"`
		}
		if err := json.Unmarshal([]byte(js), &rec); err != nil {
			t.Fatalf("recommend -o json: %v\n%s", err, js)
		}
		for _, w := range rec.Workloads {
			name := w.Namespace + "/" + w.Workload
			if w.Samples == 0 || w.Coverage <= 0 || w.FirstSeen.IsZero() || w.LastSeen.Before(w.FirstSeen) {
				t.Errorf("recommend %v: %s: samples %d, coverage %v, seen %s to %s", args, name, w.Samples, w.Coverage, w.FirstSeen, w.LastSeen)
			}
			want, changed := wantNewPools[name]
			switch {
			case allow && changed:
				if w.Recommendation != want[0] || w.Pool != want[1] {
					t.Errorf("recommend --allow-new-pools: %s: %s on %q; want %s on %q", name, w.Recommendation, w.Pool, want[0], want[1])
				}
			case w.Pool != "" && !pools[w.Pool]:
				t.Errorf("recommend %v: %s: %s on %q, a pool the cluster does not have", args, name, w.Recommendation, w.Pool)
			}
		}
	}

	// -o yaml: what a person would apply, per workload that changes.
	yml, _ := run("recommend", "--window=7d", "-o", "yaml", priceFile)
	for _, want := range []string{
		"# team-a/Deployment/steady-trainer: mig:3g.40gb; pool: h100-mig; saves 4036.90 $/month\n",
		"apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: steady-trainer\n  namespace: team-a\nspec:\n  template:\n    spec:\n      nodeSelector:\n        cloud.google.com/gke-nodepool: h100-mig\n      containers:\n        - name: trainer\n          resources:\n            limits:\n              nvidia.com/gpu: null\n              nvidia.com/mig-3g.40gb: 1\n",
		"kind: JobSet\nmetadata:\n  name: llm-pretrain\n  namespace: ml-training\npodTemplateSpec:\n",
		"# research/Pod/notebook-alice: release", "nvidia.com/gpu: 6",
	} {
		if !strings.Contains(yml, want) {
			t.Errorf("recommend -o yaml lacks\n%s\nin\n%s", want, yml)
		}
	}
	if m := docYAMLExample.FindStringSubmatch(readDoc(t, root)); m == nil || !strings.Contains(yml, m[1]) {
		t.Errorf("docs/rightsizing.md's -o yaml example is not part of what recommend -o yaml prints:\n%s", yml)
	}
	if strings.Contains(yml, "name: eval\n") {
		t.Errorf("recommend -o yaml prints a change for eval, whose recommendation is keep:\n%s", yml)
	}

	// A higher --min-coverage: flaky's three-hour gap leaves it short.
	out, _ := run("recommend", "--window=7d", "-o", "csv", "--min-coverage=0.99", priceFile)
	if !strings.Contains(out, `team-b,Pod/flaky,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,21474836480,0.5000,0.0000,0,insufficient data,0,,"coverage 98% of the window (first seen 1w before its end, a gap of 3h in team-b/flaky on gpu-b) is under --min-coverage=0.99",9905,0.9826,`) {
		t.Errorf("recommend --min-coverage=0.99: flaky is not insufficient data with its coverage:\n%s", out)
	}
	// --percentile=100: the busiest minute; bursty's spikes (0.95) need a whole H100.
	out, _ = run("recommend", "--window=7d", "-o", "csv", "--percentile=100", priceFile)
	if !strings.Contains(out, "team-a,StatefulSet/bursty-infer,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,9663676416,0.9500,0.0000,0,keep,") {
		t.Errorf("recommend --percentile=100: bursty-infer's busiest minutes (0.95) should keep its H100:\n%s", out)
	}

	// The worked example of docs/rightsizing.md is this week's table.
	table, _ = run("recommend", "--window=7d", priceFile)
	checkDocExample(t, root, docExample, table)

	// Bad input: a clear message and a non-zero exit.
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"recommend", "--window=30d", "--prometheus=" + prom, atFlag}, 1, "longer than the data"},
		{[]string{"report", "--since=1d", "--prometheus=" + prom, "--at=" + at.Add(-30*day).Format(time.RFC3339)}, 1, "no recordings of gpu-pool-exporter's rules in Prometheus: no series node:gpu_model:info"},
		{[]string{"report", "--by=pod", "--prometheus=" + prom, atFlag}, 2, "want namespace, owner or label:"},
		{[]string{"report", "--unallocated=hide", "--prometheus=" + prom, atFlag}, 2, "--unallocated=hide: want show"},
		{[]string{"report", "--by=label:cost-center", "--since=7d", "--prometheus=" + prom, atFlag}, 1, "--metric-labels-allowlist=pods=[cost-center]"},
		{[]string{"recommend", "-o", "xml", "--prometheus=" + prom, atFlag}, 2, "want table, csv, json, yaml"},
		{[]string{"report", "-o", "yaml", "--prometheus=" + prom, atFlag}, 2, "want table, csv, json"},
		{[]string{"recommend", "--percentile=0", "--prometheus=" + prom, atFlag}, 2, "--percentile=0"},
		{[]string{"recommend", "--min-coverage=2", "--prometheus=" + prom, atFlag}, 2, "--min-coverage=2"},
		{[]string{"recommend", "--window=a week", "--prometheus=" + prom, atFlag}, 2, "want a Prometheus duration"},
		{[]string{"recommend", "--prometheus=http://" + proctest.FreeAddr(t), atFlag}, 1, "cannot reach Prometheus"},
	} {
		_, errOut, code := runCommand(t, gpupool, c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("gpupool %s: exit %d, %q; want exit %d and a message with %q", strings.Join(c.args, " "), code, errOut, c.code, c.msg)
		}
	}
}

// checkInvoice: the rows of a report's CSV add up, model by model, to the
// invoice worked out by hand: GPU-hours exactly (to the rounding of the
// rows), dollars within 0.5% (here to the cent's rounding); shared, the
// dollars only (the unallocated hours are in no row).
func checkInvoice(t *testing.T, what, csvText string, shared bool) {
	t.Helper()
	rows, err := csv.NewReader(strings.NewReader(csvText)).ReadAll()
	if err != nil || len(rows) < 2 {
		t.Fatalf("report %s: %v\n%s", what, err, csvText)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	hours, dollars := map[string]float64{}, map[string]float64{}
	for _, r := range rows[1:] {
		model := r[col["model"]]
		h, _ := strconv.ParseFloat(r[col["allocated_gpu_hours"]], 64)
		c, _ := strconv.ParseFloat(r[col["allocated_cost_dollars"]], 64)
		s, _ := strconv.ParseFloat(r[col["shared_unallocated_cost_dollars"]], 64)
		hours[model] += h
		dollars[model] += c + s
	}
	for model, inv := range invoice {
		if !shared && math.Abs(hours[model]-inv[0]) > 0.01 {
			t.Errorf("report %s: %s rows add up to %.3f GPU-hours; the invoice has %v", what, model, hours[model], inv[0])
		}
		if inv[1] >= 0 && math.Abs(dollars[model]-inv[1]) > 0.005*inv[1] {
			t.Errorf("report %s: %s rows add up to %.2f $; the invoice has %.2f (more than 0.5%% off)", what, model, dollars[model], inv[1])
		}
		if inv[1] >= 0 && math.Abs(dollars[model]-inv[1]) > 0.05 {
			t.Errorf("report %s: %s rows add up to %.2f $; the invoice has %.2f (more than the cents' rounding)", what, model, dollars[model], inv[1])
		}
	}
}

// docExample and docReportExample are the text blocks after the worked
// examples' commands in docs/rightsizing.md.
var (
	docExample       = regexp.MustCompile("(?s)gpupool recommend --window=7d[^\n]*\n```\n\n```text\n(.*?)```")
	docReportExample = regexp.MustCompile("(?s)gpupool report --by=namespace --since=7d[^\n]*\n```\n\n```text\n(.*?)```")
	docYAMLExample   = regexp.MustCompile("(?s)gpupool recommend --window=7d[^\n]*-o yaml\n```\n\n```text\n(.*?)```")
)

func readDoc(t *testing.T, root string) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "rightsizing.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// checkDocExample: a worked example of docs/rightsizing.md is what the
// command prints on this week.
func checkDocExample(t *testing.T, root string, re *regexp.Regexp, printed string) {
	t.Helper()
	if m := re.FindStringSubmatch(readDoc(t, root)); m == nil {
		t.Errorf("docs/rightsizing.md has no worked example matching %s", re)
	} else if string(m[1]) != printed {
		t.Errorf("docs/rightsizing.md's worked example differs from what the command prints on this week; it prints\n%s", printed)
	}
}

// checkWithoutKSM: the same week without kube-state-metrics: every pod
// is its own workload, and the output says so; grouping by owner or label
// stops with a message; a missing price is still named; the report still
// adds up to the bill, though it cannot tell cordons and time-sharing
// replicas (the cordoned L4's hours are free, the nightly job's GPU its
// own).
func checkWithoutKSM(t *testing.T, gpupool, prom string, at time.Time) {
	t.Helper()
	atFlag := "--at=" + at.Format(time.RFC3339Nano)
	out, errOut, code := runCommand(t, gpupool, "recommend", "--window=7d", "--prometheus="+prom, atFlag)
	if code != 0 {
		t.Fatalf("recommend without kube-state-metrics: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"Pod/llm-pretrain-workers-0-0", "Pod/steady-trainer-7c9d-x2k4p", "Pod/ranker-5c8d-aaaaa",
		"note: kube-state-metrics' pod objects (kube_pod_owner) are not in Prometheus: each pod is its own workload",
		"note: no price for Tesla T4"} {
		if !strings.Contains(out, want) {
			t.Errorf("recommend without kube-state-metrics lacks %q:\n%s", want, out)
		}
	}
	for _, by := range []string{"owner", "label:team"} {
		_, errOut, code := runCommand(t, gpupool, "report", "--by="+by, "--since=7d", "--prometheus="+prom, atFlag)
		if code != 1 || !strings.Contains(errOut, "kube-state-metrics' pod objects (kube_pod_owner) are not in Prometheus") {
			t.Errorf("report --by=%s without kube-state-metrics: exit %d, %q; want exit 1 and a message naming kube-state-metrics", by, code, errOut)
		}
	}
	out, errOut, code = runCommand(t, gpupool, "report", "--by=namespace", "--since=7d", "-o", "csv", "--prometheus="+prom, atFlag)
	if code != 0 || !strings.Contains(errOut, "each pod is its own workload") || !strings.Contains(errOut, "cordons and time-sharing replicas are unknown") ||
		!strings.Contains(out, "(unallocated),NVIDIA L4,free,168.000,,,119.28,,,\n") {
		t.Errorf("report --by=namespace without kube-state-metrics: exit %d, stderr %q, printed\n%s", code, errOut, out)
	}
	checkInvoice(t, "--by=namespace without kube-state-metrics", out, false)
}

func runCommand(t *testing.T, gpupool string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, gpupool, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s %v: %v", gpupool, args, err)
	}
	return out.String(), errb.String(), code
}

// writeRules writes the backfill's rule file: the named recordings, in
// one group; each must read only raw series and earlier passes'.
func writeRules(t *testing.T, path string, rf *alerts.RuleFile, names []string, earlier [][]string) {
	t.Helper()
	done := map[string]bool{}
	for _, p := range earlier {
		for _, n := range p {
			done[n] = true
		}
	}
	rules, err := rf.Recordings(names...)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		for _, rec := range rf.RecordNames() {
			if rec != r.Record && !done[rec] && readsRecord(r.Expr, rec) {
				t.Fatalf("%s reads %s, which no earlier backfill pass records (backfillPasses)", r.Record, rec)
			}
		}
	}
	b, err := alerts.RecordingFile(backfillGroup, "", rules)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// server is a Prometheus server binary and its version line.
type server struct{ name, path string }

// prometheusServers: Debian's 2.42 (required in CI) and prometheus3
// (scripts/prometheus3.sh) where it is built.
func prometheusServers(t *testing.T) []server {
	t.Helper()
	var out []server
	if p, err := exec.LookPath("prometheus"); err == nil {
		out = append(out, server{"prometheus", p})
	} else if os.Getenv("CI") != "" {
		t.Fatal("the prometheus server is not installed: apt-get install -y prometheus")
	}
	gopath, _ := exec.Command("go", "env", "GOPATH").Output()
	for _, p := range []string{"prometheus3", filepath.Join(strings.TrimSpace(string(gopath)), "bin", "prometheus3")} {
		if full, err := exec.LookPath(p); err == nil {
			out = append(out, server{"prometheus3", full})
			break
		}
	}
	if len(out) == 0 {
		t.Skip("no prometheus server: apt-get install -y prometheus (2.42) or scripts/prometheus3.sh (3.x)")
	}
	for _, s := range out {
		v, _ := exec.Command(s.path, "--version").CombinedOutput()
		mod, _ := exec.Command("go", "version", "-m", s.path).Output()
		if m := regexp.MustCompile(`(?m)^\s+mod\s+github.com/prometheus/prometheus\s+(\S+)`).FindSubmatch(mod); m != nil {
			v = append([]byte("module "+string(m[1])+"; "), v...)
		}
		t.Logf("server %s: %s", s.path, strings.SplitN(string(v), "\n", 2)[0])
	}
	return out
}

func tool(t *testing.T, name, how string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	gopath, _ := exec.Command("go", "env", "GOPATH").Output()
	if p := filepath.Join(strings.TrimSpace(string(gopath)), "bin", name); fileExists(p) {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found: %s", name, how)
	}
	t.Skipf("%s not found: %s", name, how)
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func runTool(t *testing.T, bin, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
}

// copyBlocks makes a Prometheus data directory of the blocks in dirs.
func copyBlocks(t *testing.T, data string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			if err := os.CopyFS(filepath.Join(data, e.Name()), os.DirFS(filepath.Join(d, e.Name()))); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// startPrometheus serves a data directory until the test ends; it
// scrapes nothing and evaluates no rules.
func startPrometheus(t *testing.T, ctx context.Context, s server, data string) string {
	t.Helper()
	config := data + ".yml"
	if err := os.WriteFile(config, []byte("global:\n  scrape_interval: 1m\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := proctest.FreeAddr(t)
	log := data + ".log"
	proctest.Start(t, ctx, log, s.path, "--config.file="+config, "--storage.tsdb.path="+data,
		"--storage.tsdb.retention.time=100y", "--web.listen-address="+addr, "--web.enable-admin-api")
	proctest.WaitHTTP(t, "http://"+addr+"/-/ready", time.Minute, log)
	return "http://" + addr
}

// deleteSeries deletes the series a selector matches (the admin API).
func deleteSeries(t *testing.T, prom, selector string) {
	t.Helper()
	resp, err := http.Post(prom+"/api/v1/admin/tsdb/delete_series?match[]="+url.QueryEscape(selector), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("delete_series %s: %s", selector, resp.Status)
	}
}

// query runs an instant query that must return one sample.
func query(prom, expr string, at time.Time) (float64, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	u := prom + "/api/v1/query?query=" + url.QueryEscape(expr) + "&time=" + strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)
	if err := proctest.GetJSON(u, &r); err != nil {
		return 0, err
	}
	if r.Status != "success" || len(r.Data.Result) != 1 {
		return 0, fmt.Errorf("%s: %s, %d samples; want one", expr, r.Error, len(r.Data.Result))
	}
	s, _ := r.Data.Result[0].Value[1].(string)
	return strconv.ParseFloat(s, 64)
}
