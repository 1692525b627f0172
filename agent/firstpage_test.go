package agent_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// firstPageScenario is a node whose kubelet takes 400ms to answer, as a busy
// one on a big node does, with three of its four GPUs held.
const firstPageScenario = `node: {count: 4, kubeletLatency: 400ms}
pods:
  - {namespace: ml, name: train-0, containers: [{name: main, devices: [{gpu: 0}, {gpu: 1}]}]}
  - {namespace: ml, name: infer-0, containers: [{name: server, devices: [{gpu: 2}]}]}
`

// The first page /readyz calls ready names the pod on every allocated GPU,
// with and without the dcgm-exporter families: /readyz is polled from the
// start and /metrics read at the first 200.
func TestFirstReadyPageNamesThePods(t *testing.T) {
	dir := t.TempDir()
	sc := filepath.Join(dir, "slow-kubelet.yaml")
	if err := os.WriteFile(sc, []byte(firstPageScenario), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		// want are lines the first ready page must hold.
		want []string
	}{
		{"native", nil, []string{
			`gpu_allocation_info{compute_instance="",container="main",gpu="0",`, `gpu_allocation_info{compute_instance="",container="main",gpu="1",`, `gpu_allocation_info{compute_instance="",container="server",gpu="2",`,
		}},
		{"dcgm-exporter", []string{"--compat.dcgm-exporter"}, []string{
			`DCGM_FI_DEV_GPU_TEMP{DCGM_FI_DRIVER_VERSION=`, `container="main",device="nvidia0",gpu="0",`, `container="main",device="nvidia1",gpu="1",`, `container="server",device="nvidia2",gpu="2",`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			addr := freeAddr(t)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan int)
			go func() {
				done <- runSim(ctx, append([]string{"--simulate.scenario=" + sc, "--web.listen-address=" + addr, "--collect-interval=1s"}, tc.args...), io.Discard, io.Discard)
			}()
			t.Cleanup(func() { cancel(); <-done })
			var page string
			deadline := time.Now().Add(waitTimeout)
			for page == "" {
				if time.Now().After(deadline) {
					t.Fatal("/readyz never answered 200")
				}
				resp, err := http.Get("http://" + addr + "/readyz")
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						page = getBody(t, "http://"+addr+"/metrics")
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
			for _, w := range tc.want {
				if !strings.Contains(page, w) {
					t.Errorf("the first page /readyz called ready lacks %q", w)
				}
			}
			if strings.Contains(page, `pod=""`) {
				t.Error(`the first ready page has pod=""`)
			}
		})
	}
}

func getBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
