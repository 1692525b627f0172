// Package rightsizing tests `gpupool recommend` and `report` on a
// week of a simulated fleet backfilled into a real Prometheus: the raw
// series with `promtool tsdb create-blocks-from openmetrics`, the shipped
// recording rules over them with `promtool tsdb create-blocks-from rules`.
// Both commands must print exactly the answers worked out by hand below.
package rightsizing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
// point) and starting a week and an hour before it.
//
//	gpu-a   8 x H100, DCGM    ml-training/llm-pretrain-workers-0-0 (Job of JobSet llm-pretrain) holds all 8:
//	                          GPUs 0-5 at 0.9 SM activity, 70 GiB; GPUs 6, 7 at 0, 1 GiB, idle
//	gpu-b   8 x H100, DCGM    GPU 0 team-a/steady-trainer (Deployment): 0.30 always, 30 GiB
//	                          GPU 1 team-a/bursty-infer-0 (StatefulSet): 0.08, and 0.95 with 9 GiB (else 6 GiB)
//	                                for one sample every 8 hours (at end - k x 8h)
//	                          GPU 2 research/notebook-alice (no owner): 0, 40 GiB, idle
//	                          GPU 3 research/notebook-bob (no owner): 0.01, one sample of 0.04 at end - 3d, 2 GiB, idle
//	                          GPU 4 team-b/new-svc (Deployment) since end - 2d: 0.4, 10 GiB
//	                          GPU 5 team-b/flaky (no owner): 0.5, 20 GiB; no sample in [end - 4d, end - 4d + 3h)
//	                          GPUs 6, 7 free
//	gpu-c   2 x H100, DCGM,   GPU 0 time-shared by team-c/chat (Deployment, two pods), each pod's processes at
//	        time-sharing 2          0.15 and 12 GiB (the GPU's own SM activity, 0.3, is both of theirs)
//	gpu-d   1 x H100, MIG     3g.40gb team-c/finetune (Job): 0.2 of its slices, 8 GiB
//	                          2g.20gb ml-training/eval (Deployment): 0.9, 15 GiB; 1g.10gb free
//	gpu-l4  2 x L4, no DCGM   GPU 0 team-b/embed (Deployment): 0.5 busy time, 10 GiB; GPU 1 free
//
// Prices: the exporters serve 11.06 $/h for an H100, 0.71 for an L4.
func newFleet(end time.Time) *fleet {
	f := &fleet{tl: timeline{end.Add(-week - time.Hour), end}, families: map[string][]series{}, ksm: map[string][]series{}}
	const h100Price, l4Price = 11.06, 0.71
	gpus := func(node, prefix string, n int, model string, memory, price float64) []device {
		var out []device
		for i := 0; i < n; i++ {
			d := device{node: node, gpu: strconv.Itoa(i), uuid: fmt.Sprintf("GPU-%s%d", prefix, i)}
			f.gpu(d, model, memory, price, "disabled")
			out = append(out, d)
		}
		return out
	}
	f.node("gpu-a", "nvidia-h100-80gb", 8)
	a := gpus("gpu-a", "a", 8, h100, h100Memory, h100Price)
	f.node("gpu-b", "nvidia-h100-80gb", 8)
	b := gpus("gpu-b", "b", 8, h100, h100Memory, h100Price)
	f.node("gpu-c", "nvidia-h100-80gb", 4, "label_cloud_google_com_gke_gpu_sharing_strategy", "time-sharing", "label_cloud_google_com_gke_max_shared_clients_per_gpu", "2")
	c := gpus("gpu-c", "c", 2, h100, h100Memory, h100Price)
	f.node("gpu-d", "nvidia-h100-80gb", 0, "label_cloud_google_com_gke_gpu_partition_size", "mixed")
	d0 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0"}
	f.gpu(d0, h100, h100Memory, h100Price, "enabled")
	mig3 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0", gi: "0", ci: "0", profile: "3g.40gb"}
	mig2 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0", gi: "1", ci: "0", profile: "2g.20gb"}
	mig1 := device{node: "gpu-d", gpu: "0", uuid: "GPU-d0", gi: "2", ci: "0", profile: "1g.10gb"}
	f.migDevice(mig3, mig3gMemory)
	f.migDevice(mig2, mig2gMemory)
	f.migDevice(mig1, mig1gMemory)
	f.node("gpu-l4", "nvidia-l4", 2)
	l := gpus("gpu-l4", "l", 2, l4, l4Memory, l4Price)

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

	// gpu-c: two pods time-share GPU 0; the GPU's own SM activity is both of theirs.
	f.add("gpu_sm_active_ratio", series{c[0].labels(), f.tl.start, end, constant(0.3)})
	f.replicaSet("team-c", "chat-5f6d", "chat")
	for _, pod := range []string{"chat-5f6d-aaaaa", "chat-5f6d-bbbbb"} {
		f.owner("team-c", pod, "ReplicaSet", "chat-5f6d", "alpha")
		f.hold(holder{dev: c[0], namespace: "team-c", pod: pod, container: "server", resource: "nvidia.com/gpu",
			activity: constant(0.15), memory: constant(12 * gib), activitySource: "processes"})
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

// The recordings the commands read, in the order the backfill must make
// them: the first pass reads raw series only, the second the first's.
var backfillPasses = [][]string{rightsize.Recordings[:4], rightsize.Recordings[4:]}

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
	for i, names := range backfillPasses {
		data := filepath.Join(tmp, fmt.Sprintf("data-pass%d", i+1))
		copyBlocks(t, data, blockDirs...)
		prom := startPrometheus(t, ctx, servers[0], data)
		writeRules(t, filepath.Join(tmp, backfillRulesFile), rf, names, backfillPasses[:i])
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
			checkAnswers(t, gpupool, prom, root, at)

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
	v, err := query(prom, `timestamp(`+rightsize.RecordBusy+`{pod="notebook-alice"})`, end.Add(time.Minute))
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
// sample before a gap counts for five (the lookback reaches five minutes
// back, and the next sample is hours away).
//
// Per holding (GPU-hours = steps / 60 x share x MIG slice share):
//
//	llm-pretrain  8 GPUs x 168 h = 1344; busy 6 x 0.9 x 168 = 907.2; idle (GPUs 6, 7) 2 x 168 = 336
//	eval          2g.20gb: 2/7 x 168 = 48; busy 0.9 x 48 = 43.2
//	steady        168; busy 0.30 x 168 = 50.4
//	bursty        168; busy: 2,520 samples, 21 of them spikes (end - k x 8h, k = 0..20; k = 21 is
//	              end - 7d, before the window): (2499 x 0.08 + 21 x 0.95) x 4 / 60 = 219.87 x 4 / 60 = 14.658
//	alice         168; busy 0; idle 168
//	bob           168; busy (2519 x 0.01 + 0.04) x 4 / 60 = 1.682; idle 168
//	new-svc       recorded from end - 2d: 721 samples, 2,884 steps = 48.066667 h; busy 0.4 x that = 19.226667
//	flaky         the rules bridge the gap by one sample (their instant selectors see the last raw
//	              sample at end - 4d - 4m until it is five minutes old: allocation:gpu_devices:share
//	              and allocation:gpu_busy_devices:share are recorded at end - 4d); 1,080 samples
//	              from end - 7d + 4m to end - 4d, then none until end - 4d + 3h, then 1,396 to end:
//	              4 x 1080 + 1 + 4 x 1396 = 9,905 steps = 165.083333 h; busy 0.5 x that = 82.541667
//	chat          2 pods x 1/2 x 168 = 168; busy 0.15 x 168 = 25.2
//	finetune      3g.40gb: 3/7 x 168 = 72; busy 0.2 x 72 = 14.4
//	embed (L4)    168; busy 0.5 x 168 = 84
//
// Costs at 11.06 $/h an H100 GPU-hour, 0.71 an L4 one:
//
//	ml-training   1392 h: 15395.52; busy 950.4: 10511.424; idle 336: 3716.16
//	research      336: 3716.16; busy 1.682: 18.60292; idle 336: 3716.16
//	team-a        336: 3716.16; busy 65.058: 719.54148
//	team-b        H100 213.15 h (48.066667 + 165.083333): 2357.439, L4 168 h: 119.28 -> 2476.719;
//	              busy H100 101.768333: 1125.557767, L4 84: 59.64 -> 1185.197767
//	team-c        240: 2654.40; busy 39.6: 437.976
const wantReportByNamespace = `namespace,allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours,allocated_cost_dollars,busy_cost_dollars,idle_cost_dollars
ml-training,1392.000,950.400,336.000,15395.52,10511.42,3716.16
research,336.000,1.682,336.000,3716.16,18.60,3716.16
team-a,336.000,65.058,0.000,3716.16,719.54,0.00
team-b,381.150,185.768,0.000,2476.72,1185.20,0.00
team-c,240.000,39.600,0.000,2654.40,437.98,0.00
`

// By the pods' team label: ml = llm-pretrain + eval; alpha = steady,
// bursty, chat and finetune (576 h: 6370.56; busy 104.658: 1157.51748);
// beta = new-svc + embed (216.066667 h: 531.617333 + 119.28 = 650.897333;
// busy 103.226667: 212.646933 + 59.64 = 272.286933); flaky has no label
// (165.083333 h: 1825.821667; busy 82.541667: 912.911833).
const wantReportByTeam = `label:team,allocated_gpu_hours,busy_gpu_hours,idle_gpu_hours,allocated_cost_dollars,busy_cost_dollars,idle_cost_dollars
(none),165.083,82.542,0.000,1825.82,912.91,0.00
alpha,576.000,104.658,0.000,6370.56,1157.52,0.00
beta,216.067,103.227,0.000,650.90,272.29,0.00
ml,1392.000,950.400,336.000,15395.52,10511.42,3716.16
research,336.000,1.682,336.000,3716.16,18.60,3716.16
`

// Recommendations, with 20% headroom, per device: need = peak x 1.2 and
// p95 x 1.2 (in whole H100s: a MIG device's activity times its slices,
// 3/7 or 2/7). Candidates: H100 MIG profiles (3g.40gb, 2g.20gb, 1g.10gb at
// the sizes gpu-d serves; the others from NVIDIA's table), 1/2 of an H100
// (gpu-c's time-sharing), and the L4, whose throughput is 121/989 =
// 0.1223 of an H100's and whose memory is 24152899584 bytes. Prices: an
// H100 11.06, a MIG device its slices' share (3g 4.74, 2g 3.16, 1g 1.58),
// a half 5.53, an L4 0.71. Savings are a month of 730 hours.
//
//	llm-pretrain  8 GPUs, GPUs 6 and 7 never above 0.05: the same accelerator x6; saves 2 x 11.06 x 730 = 16147.60
//	alice, bob    never above 0.05 (bob's most is 0.04): release; saves 11.06 x 730 = 8073.80
//	bursty        p95 0.08 (21 spikes of 2,520 samples are under 5%), peak 9 GiB: needs 0.096 and
//	              10.8 GiB; 1g.10gb is too small, the L4 (0.1223, 22.5 GiB, 0.71) is the cheapest that
//	              holds it; saves (11.06 - 0.71) x 730 = 7555.50
//	steady        p95 0.30, peak 30 GiB: needs 0.36 and 36 GiB: 3g.40gb (0.4286, 39.5 GiB, 4.74) before
//	              the half (5.53); saves (11.06 - 4.74) x 730 = 4613.60
//	chat          each pod 1/2 (5.53), p95 0.15, peak 12 GiB: needs 0.18 and 14.4 GiB: 2g.20gb (0.2857,
//	              19.6 GiB, 3.16); saves 2 x (5.53 - 3.16) x 730 = 3460.20
//	finetune      3g.40gb (4.74), p95 0.2 of 3/7: needs 0.1029 and 9.6 GiB: the L4 (0.71) before
//	              1g.10gb (1.58); saves (4.74 - 0.71) x 730 = 2941.90
//	eval          2g.20gb (3.16), p95 0.9 of 2/7: needs 0.3086: nothing cheaper holds it: keep
//	embed         an L4, 0.5: the H100 costs more, the L4 has no MIG: keep
//	new-svc       not held at the window's first step; held 2,884 steps, 2d rounded to the hour:
//	              insufficient data
//	flaky         held at the first step and the last, 9,905 of 10,080 steps, 98%: insufficient data
const wantRecommend = `namespace,workload,pods,accelerator,model,holds,devices,peak_memory_bytes,p95_activity,idle_share,idle_devices,recommendation,recommended_devices,monthly_saving_dollars,reason
ml-training,JobSet/llm-pretrain,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,8,75161927680,0.9000,0.2500,2,accelerator:nvidia-h100-80gb,6,16147.60,
research,Pod/notebook-alice,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,42949672960,0.0000,1.0000,1,release,0,8073.80,
research,Pod/notebook-bob,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,2147483648,0.0100,1.0000,1,release,0,8073.80,
team-a,StatefulSet/bursty-infer,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,9663676416,0.0800,0.0000,0,accelerator:nvidia-l4,1,7555.50,
team-a,Deployment/steady-trainer,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,32212254720,0.3000,0.0000,0,mig:3g.40gb,1,4613.60,
team-c,Deployment/chat,2,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb share 1/2,1,12884901888,0.1500,0.0000,0,mig:2g.20gb,1,3460.20,
team-c,Job/finetune,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb mig 3g.40gb,1,8589934592,0.2000,0.0000,0,accelerator:nvidia-l4,1,2941.90,
ml-training,Deployment/eval,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb mig 2g.20gb,1,16106127360,0.9000,0.0000,0,keep,1,0.00,
team-b,Deployment/embed,1,nvidia-l4,NVIDIA L4,nvidia-l4,1,10737418240,0.5000,0.0000,0,keep,1,0.00,
team-b,Deployment/new-svc,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,10737418240,0.4000,0.0000,0,insufficient data,0,,younger than the window: first seen 2d before its end
team-b,Pod/flaky,1,nvidia-h100-80gb,NVIDIA H100 80GB HBM3,nvidia-h100-80gb,1,21474836480,0.5000,0.0000,0,insufficient data,0,,gaps in the data: team-b/flaky on gpu-b recorded 98% of the window
`

func checkAnswers(t *testing.T, gpupool, prom, root string, at time.Time) {
	t.Helper()
	atFlag := "--at=" + at.Format(time.RFC3339Nano)
	priceFile := "--idle.price-file=" + filepath.Join(root, "deploy", "prices-gke-on-demand.yaml")
	for _, c := range []struct {
		args []string
		want string
	}{
		// recommend with the shipped GKE price list (the same prices as the exporters').
		{[]string{"recommend", "--window=7d", "-o", "csv", priceFile}, wantRecommend},
		// report with the exporters' prices.
		{[]string{"report", "--by=namespace", "--since=7d", "-o", "csv"}, wantReportByNamespace},
		{[]string{"report", "--by=label:team", "--since=7d", "-o", "csv"}, wantReportByTeam},
	} {
		out, errOut, code := runCommand(t, gpupool, append(c.args, "--prometheus="+prom, atFlag)...)
		if code != 0 {
			t.Errorf("gpu-pool-exporter %s: exit %d: %s", strings.Join(c.args, " "), code, errOut)
			continue
		}
		if out != c.want {
			t.Errorf("gpu-pool-exporter %s printed\n%s\nwant\n%s", strings.Join(c.args, " "), out, c.want)
		}
	}

	// The worked example of docs/rightsizing.md is this week's table.
	table, errOut, code := runCommand(t, gpupool, "recommend", "--window=7d", "--prometheus="+prom, atFlag, priceFile)
	if code != 0 {
		t.Fatalf("recommend: exit %d: %s", code, errOut)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "rightsizing.md"))
	if err != nil {
		t.Fatal(err)
	}
	if m := docExample.FindSubmatch(doc); m == nil {
		t.Errorf("docs/rightsizing.md has no worked example (a text block after %q)", "recommend --window=7d")
	} else if string(m[1]) != table {
		t.Errorf("docs/rightsizing.md's worked example differs from what recommend prints on this week; it prints\n%s", table)
	}

	// Bad input: a clear message and a non-zero exit.
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"recommend", "--window=30d", "--prometheus=" + prom, atFlag}, 1, "longer than the data"},
		{[]string{"report", "--since=1d", "--prometheus=" + prom, "--at=" + at.Add(-30*day).Format(time.RFC3339)}, 1, "no recordings of gpu-pool-exporter's rules in Prometheus: no series node:gpu_model:info"},
		{[]string{"report", "--by=pod", "--prometheus=" + prom, atFlag}, 2, "want namespace, owner or label:"},
		{[]string{"report", "--by=label:cost-center", "--since=7d", "--prometheus=" + prom, atFlag}, 1, "--metric-labels-allowlist=pods=[cost-center]"},
		{[]string{"recommend", "-o", "yaml", "--prometheus=" + prom, atFlag}, 2, "want table, csv, json"},
		{[]string{"recommend", "--window=a week", "--prometheus=" + prom, atFlag}, 2, "want a Prometheus duration"},
		{[]string{"recommend", "--prometheus=http://" + proctest.FreeAddr(t), atFlag}, 1, "cannot reach Prometheus"},
	} {
		_, errOut, code := runCommand(t, gpupool, c.args...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("gpu-pool-exporter %s: exit %d, %q; want exit %d and a message with %q", strings.Join(c.args, " "), code, errOut, c.code, c.msg)
		}
	}
}

// docExample is the text block after the worked example's command.
var docExample = regexp.MustCompile("(?s)gpupool recommend --window=7d[^\n]*\n```\n\n```text\n(.*?)```")

// checkWithoutKSM: the same week without kube-state-metrics: every pod
// is its own workload, and the output says so; grouping by owner or label
// stops with a message.
func checkWithoutKSM(t *testing.T, gpupool, prom string, at time.Time) {
	t.Helper()
	atFlag := "--at=" + at.Format(time.RFC3339Nano)
	out, errOut, code := runCommand(t, gpupool, "recommend", "--window=7d", "--prometheus="+prom, atFlag)
	if code != 0 {
		t.Fatalf("recommend without kube-state-metrics: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"Pod/llm-pretrain-workers-0-0", "Pod/steady-trainer-7c9d-x2k4p", "note: kube-state-metrics' pod objects (kube_pod_owner) are not in Prometheus: each pod is its own workload"} {
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
	if code != 0 || out != wantReportByNamespace || !strings.Contains(errOut, "each pod is its own workload") {
		t.Errorf("report --by=namespace without kube-state-metrics: exit %d, stderr %q, printed\n%s\nwant the same as with it", code, errOut, out)
	}
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
			if rec != r.Record && !done[rec] && regexp.MustCompile(`(^|[^a-zA-Z0-9_:])`+regexp.QuoteMeta(rec)+`($|[^a-zA-Z0-9_:])`).MatchString(r.Expr) {
				t.Fatalf("%s reads %s, which no earlier backfill pass records: add it to backfillPasses", r.Record, rec)
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
