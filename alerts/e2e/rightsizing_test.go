package e2e

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/internal/proctest"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

// rightsizingWindow is the window recommend and report read: Prometheus
// must hold that much of the simulated node before they run.
const rightsizingWindow = 3 * time.Minute

// TestRightsizingEndToEnd runs `gpupool recommend` and `report`
// against a real Prometheus (Debian's 2.42 server, or whichever
// prometheusBinary finds) that scrapes the exporter on the built-in
// simulated node (gpu-pool-exporter-sim without a scenario: research/notebook-alice
// holds a whole H100 and never uses it, ml-training/llm-pretrain-0 and -1
// hold two busy H100s each) and a fake kube-state-metrics, with the
// recordings the commands read evaluated every second. After three minutes
// of data:
//   - recommend --window=3m releases notebook-alice or moves it to a
//     smaller shape, and keeps the llm-pretrain StatefulSet;
//   - report --by=namespace --since=3m has a row per namespace that holds
//     a GPU.
func TestRightsizingEndToEnd(t *testing.T) {
	t.Parallel()
	promBin := prometheusBinary(t)
	root := repoRoot(t)
	tmp := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	gpe := proctest.ExporterBinary(t, ctx, root, filepath.Join(tmp, "gpe"))
	gpupool := proctest.GpupoolBinary(t, ctx, root, filepath.Join(tmp, "gpupool"))
	exporterAddr := freeAddr(t)
	startProcess(t, ctx, filepath.Join(tmp, "exporter.log"), gpe,
		"--collect-interval=1s", "--web.listen-address="+exporterAddr,
		"--node-name="+nodeName, "--idle.window=10s", "--idle.price=NVIDIA H100 80GB HBM3=11.06")
	waitHTTP(t, "http://"+exporterAddr+"/metrics", startTimeout, filepath.Join(tmp, "exporter.log"))

	// kube-state-metrics: the node's accelerator and the pods' owners
	// (the built-in node's pods).
	ksm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "kube_node_labels{node=%q,label_cloud_google_com_gke_nodepool=%q,label_cloud_google_com_gke_accelerator=%q} 1\n", nodeName, nodePool, accelerator)
		fmt.Fprintf(w, "kube_node_status_capacity{node=%q,resource=\"nvidia_com_gpu\",unit=\"integer\"} 6\n", nodeName)
		owners := map[string][3]string{ // pod -> namespace, owner kind, owner name
			"llm-pretrain-0": {"ml-training", "StatefulSet", "llm-pretrain"},
			"llm-pretrain-1": {"ml-training", "StatefulSet", "llm-pretrain"},
			"notebook-alice": {"research", "<none>", "<none>"},
			"chat-api-0":     {"inference", "ReplicaSet", "chat-api-5d8f9"},
			"chat-api-1":     {"inference", "ReplicaSet", "chat-api-5d8f9"},
			"chat-api-2":     {"inference", "ReplicaSet", "chat-api-5d8f9"},
			"finetune-small": {"ml-training", "Job", "finetune-small"},
			"embeddings-0":   {"inference", "<none>", "<none>"},
			"dev-shell-bob":  {"research", "<none>", "<none>"},
		}
		for pod, o := range owners {
			controller := "true"
			if o[1] == "<none>" {
				controller = "<none>"
			}
			fmt.Fprintf(w, "kube_pod_owner{namespace=%q,pod=%q,uid=\"u-%s\",owner_kind=%q,owner_name=%q,owner_is_controller=%q} 1\n", o[0], pod, pod, o[1], o[2], controller)
		}
		fmt.Fprintf(w, "kube_replicaset_owner{namespace=\"inference\",replicaset=\"chat-api-5d8f9\",uid=\"u-rs\",owner_kind=\"Deployment\",owner_name=\"chat-api\",owner_is_controller=\"true\"} 1\n")
	}))
	t.Cleanup(ksm.Close)

	// Only the recordings the commands read, every second.
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	recs, err := rf.Recordings(rightsize.Recordings...)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := alerts.RecordingFile("rightsizing", "1s", recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "rules.yml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	promAddr := freeAddr(t)
	config := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: gpu-pool-exporter
    static_configs:
      - targets: [%q]
        labels:
          node: %q
  - job_name: kube-state-metrics
    honor_labels: true
    static_configs:
      - targets: [%q]
`, filepath.Join(tmp, "rules.yml"), exporterAddr, nodeName, strings.TrimPrefix(ksm.URL, "http://"))
	configFile := filepath.Join(tmp, "prometheus.yml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	promLog := filepath.Join(tmp, "prometheus.log")
	startProcess(t, ctx, promLog, promBin, "--config.file="+configFile, "--storage.tsdb.path="+filepath.Join(tmp, "data"), "--web.listen-address="+promAddr)
	prom := "http://" + promAddr
	waitHTTP(t, prom+"/-/ready", startTimeout, promLog)
	if out, _ := exec.Command(promBin, "--version").CombinedOutput(); len(out) > 0 {
		t.Logf("Prometheus: %s", strings.SplitN(string(out), "\n", 2)[0])
	}

	// Wait for the notebook's holding to be recorded, then for the window.
	deadline := time.Now().Add(startTimeout)
	var since time.Time
	for since.IsZero() {
		if n, err := queryCount(prom, `allocation:gpu_devices:share{pod="notebook-alice"}`); err == nil && n > 0 {
			since = time.Now()
		} else if time.Now().After(deadline) {
			tailFile(t, promLog, 20)
			t.Fatalf("no holding of notebook-alice recorded within %s (%v)", startTimeout, err)
		} else {
			time.Sleep(time.Second)
		}
	}
	time.Sleep(time.Until(since.Add(rightsizingWindow + 5*time.Second)))

	run := func(args ...string) string {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		defer ccancel()
		var out, errb bytes.Buffer
		cmd := exec.CommandContext(cctx, gpupool, append(args, "--prometheus="+prom)...)
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("gpu-pool-exporter %s: %v\n%s", strings.Join(args, " "), err, errb.String())
		}
		t.Logf("gpu-pool-exporter %s:\n%s%s", strings.Join(args, " "), out.String(), errb.String())
		return out.String()
	}

	var rec struct {
		Workloads []struct {
			Namespace, Workload, Recommendation string
			Saving                              *float64 `json:"monthly_saving_dollars"`
			Reason                              string
		} `json:"workloads"`
		Notes []string `json:"notes"`
	}
	if err := json.Unmarshal([]byte(run("recommend", "--window=3m", "-o", "json")), &rec); err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, w := range rec.Workloads {
		found[w.Namespace+"/"+w.Workload] = w.Recommendation
		switch w.Namespace + "/" + w.Workload {
		case "research/Pod/notebook-alice":
			shrinks := w.Recommendation == "release" || strings.HasPrefix(w.Recommendation, "mig:") ||
				strings.HasPrefix(w.Recommendation, "share:") || strings.HasPrefix(w.Recommendation, "accelerator:")
			if !shrinks || w.Saving == nil || *w.Saving <= 0 {
				t.Errorf("notebook-alice (a whole H100 at 0%%): recommendation %q, saving %v; want release or a smaller shape, saving > 0 (%s)", w.Recommendation, w.Saving, w.Reason)
			}
		case "ml-training/StatefulSet/llm-pretrain":
			if w.Recommendation != "keep" {
				t.Errorf("llm-pretrain (two pods on two busy H100s each): recommendation %q, want keep (%s)", w.Recommendation, w.Reason)
			}
		}
	}
	for _, want := range []string{"research/Pod/notebook-alice", "ml-training/StatefulSet/llm-pretrain", "inference/Deployment/chat-api"} {
		if _, ok := found[want]; !ok {
			t.Errorf("recommend lists no %s; it lists %v", want, found)
		}
	}

	rows, err := csv.NewReader(strings.NewReader(run("report", "--by=namespace", "--since=3m", "-o", "csv"))).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var namespaces []string
	for _, r := range rows[1:] {
		if r[0] != rightsize.UnallocatedGroup && !slices.Contains(namespaces, r[0]) {
			namespaces = append(namespaces, r[0])
		}
	}
	if want := []string{"inference", "ml-training", "research"}; !slices.Equal(namespaces, want) || rows[0][0] != "namespace" || rows[0][1] != "model" {
		t.Errorf("report --by=namespace: header %v, rows for %v; want a row for each of %v, and its model", rows[0], namespaces, want)
	}
	// The rows add up to the simulated node's bill: its 8 GPUs over the
	// window, whatever holds them (MIG devices, time-sliced replicas, a
	// free GPU).
	var rep struct {
		Bill []struct {
			Model     string
			Hours     float64 `json:"gpu_hours"`
			RowsHours float64 `json:"rows_gpu_hours"`
		} `json:"bill"`
	}
	if err := json.Unmarshal([]byte(run("report", "--by=namespace", "--since=3m", "-o", "json")), &rep); err != nil {
		t.Fatal(err)
	}
	if want := 8 * rightsizingWindow.Hours(); len(rep.Bill) != 1 || math.Abs(rep.Bill[0].Hours-want) > 0.002 || math.Abs(rep.Bill[0].RowsHours-rep.Bill[0].Hours) > 0.002 {
		t.Errorf("report -o json: bill %+v; want one model, %.3f GPU-hours (8 GPUs over %s), and rows adding up to it", rep.Bill, want, rightsizingWindow)
	}
	if t.Failed() {
		tailFile(t, promLog, 20)
	}
}
