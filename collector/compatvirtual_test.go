package collector_test

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

// cgroupPodUID is the pod UID a cgroup file names (cgroupfs pod<uid>,
// systemd kubepods-<qos>-pod<uid_with_underscores>.slice), as dcgm-exporter
// maps a process to its pod.
var cgroupPodUID = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// Done-when: with --compat.dcgm-exporter.kubernetes-virtual-gpus, the
// time-sliced GPU 6 (chat-api-0, -1 and -2, one replica each; -2 runs
// nothing) serves, as dcgm-exporter 4.5+: DCGM_FI_DEV_FB_USED and
// DCGM_FI_DEV_GPU_UTIL once for the device without holder labels, and once
// per holder with its pod's own figure, each pod's memory being its
// processes' whole MiB as NVML lists them (the pod found by the process's
// cgroup, as dcgm-exporter finds it), labelled pod_uid and vgpu; the other
// families once per holder with its vgpu, never unlabelled.
func TestCompatVirtualGPUsPerPodFigures(t *testing.T) {
	tn := newTestExporter(t, withHostDir(), withKubelet(), withProcessResolver(nil),
		withConfig(func(c *collector.Config) {
			c.Compat = &render.CompatConfig{Hostname: "n", VirtualGPUs: true, NvidiaResourceNames: sharedResource}
		}))
	p := tn.step(t, time.Second)

	// The per-process figures, read as dcgm-exporter reads them: NVML's
	// process list of the GPU, each PID's pod from its cgroup.
	procs, ret := tn.node.Devices()[6].GetComputeRunningProcesses()
	if ret != nvml.SUCCESS || len(procs) == 0 {
		t.Fatalf("GPU 6 processes: %v %v", procs, ret)
	}
	hostProc, err := tn.node.HostProc()
	if err != nil {
		t.Fatal(err)
	}
	wantMiB := map[string]float64{}
	for _, pr := range procs {
		cg, err := os.ReadFile(filepath.Join(hostProc, strconv.Itoa(int(pr.Pid)), "cgroup"))
		if err != nil {
			t.Fatal(err)
		}
		if m := cgroupPodUID.FindStringSubmatch(string(cg)); m != nil {
			wantMiB[strings.ReplaceAll(m[1], "_", "-")] += float64(pr.UsedGpuMemory >> 20)
		}
	}
	if len(wantMiB) != 2 {
		t.Fatalf("pods with processes on GPU 6: %v, want chat-api-0 and chat-api-1", wantMiB)
	}

	g6 := `gpu="6"`
	deviceMiB := math.Floor(num(t, p, "gpu_memory_used_bytes", g6, `gpu_instance=""`) / (1 << 20))
	replicas := map[string]string{"chat-api-0": "0", "chat-api-1": "1", "chat-api-2": "2"}
	perPod := map[string]float64{}
	for _, l := range series(p, "DCGM_FI_DEV_FB_USED", g6) {
		lab := parseLabels(l)
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			t.Fatal(err)
		}
		pod, held := lab["pod"]
		if !held {
			if v != deviceMiB || lab["vgpu"] != "" || lab["pod_uid"] != "" {
				t.Errorf("device series %s, want %v MiB without holder labels", l, deviceMiB)
			}
			perPod["device"]++
			continue
		}
		if lab["vgpu"] != replicas[pod] {
			t.Errorf("%s: vgpu %q, want its replica %s", pod, lab["vgpu"], replicas[pod])
		}
		want := 0.0
		if uid := lab["pod_uid"]; uid != "" {
			want = wantMiB[uid]
		} else if pod != "chat-api-2" {
			t.Errorf("%s has processes but no pod_uid: %s", pod, l)
		}
		if v != want {
			t.Errorf("%s: DCGM_FI_DEV_FB_USED %v MiB, its processes use %v MiB (the device %v)", pod, v, want, deviceMiB)
		}
		perPod[pod] = v
	}
	t.Logf("GPU 6 DCGM_FI_DEV_FB_USED: device %v MiB; chat-api-0 %v, chat-api-1 %v, chat-api-2 %v MiB", deviceMiB, perPod["chat-api-0"], perPod["chat-api-1"], perPod["chat-api-2"])
	if perPod["device"] != 1 || len(perPod) != 4 || perPod["chat-api-0"] == perPod["chat-api-1"] || perPod["chat-api-0"]+perPod["chat-api-1"] >= deviceMiB {
		t.Errorf("want one device series and each pod's own memory: %v", perPod)
	}

	// GPU_UTIL: each pod's own SM percentage, the idle one 0.
	for pod := range replicas {
		got := series(p, "DCGM_FI_DEV_GPU_UTIL", g6, `pod="`+pod+`"`)
		if len(got) != 1 || (pod == "chat-api-2") != strings.HasSuffix(got[0], " 0") {
			t.Errorf("DCGM_FI_DEV_GPU_UTIL of %s: %v", pod, got)
		}
	}
	if n := len(series(p, "DCGM_FI_DEV_GPU_UTIL", g6)); n != 4 {
		t.Errorf("DCGM_FI_DEV_GPU_UTIL{gpu=6}: %d series, want the device's and three pods'", n)
	}
	// Other families: one series per holder and replica, none without a
	// holder, no pod_uid (not asked for).
	var pods []string
	for _, l := range series(p, "DCGM_FI_DEV_GPU_TEMP", g6) {
		lab := parseLabels(l)
		if lab["vgpu"] != replicas[lab["pod"]] || lab["pod_uid"] != "" {
			t.Errorf("DCGM_FI_DEV_GPU_TEMP: %s", l)
		}
		pods = append(pods, lab["pod"])
	}
	slices.Sort(pods)
	if !slices.Equal(pods, []string{"chat-api-0", "chat-api-1", "chat-api-2"}) {
		t.Errorf("DCGM_FI_DEV_GPU_TEMP{gpu=6} holders %v", pods)
	}
	// An exclusive GPU: its holder's own processes, beside the device.
	if n := len(series(p, "DCGM_FI_DEV_FB_USED", `gpu="4"`)); n != 2 {
		t.Errorf("DCGM_FI_DEV_FB_USED{gpu=4}: %d series, want the device's and its holder's", n)
	}
}

// Without per-process accounting the per-process families keep only the
// device's series under the virtual-GPU flag: never the device's value on
// every holder.
func TestCompatVirtualGPUsWithoutProcessAccounting(t *testing.T) {
	tn := newTestExporter(t, withKubelet(),
		withConfig(func(c *collector.Config) {
			c.Compat = &render.CompatConfig{Hostname: "n", VirtualGPUs: true, NvidiaResourceNames: sharedResource}
		}))
	p := tn.step(t, time.Second)
	got := series(p, "DCGM_FI_DEV_FB_USED", `gpu="6"`)
	if len(got) != 1 || strings.Contains(got[0], "pod=") {
		t.Errorf("DCGM_FI_DEV_FB_USED{gpu=6}: %v, want the device's series alone", got)
	}
	if n := len(series(p, "DCGM_FI_DEV_GPU_TEMP", `gpu="6"`)); n != 3 {
		t.Errorf("DCGM_FI_DEV_GPU_TEMP{gpu=6}: %d series, want one per holder", n)
	}
}
