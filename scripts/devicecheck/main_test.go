package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

func TestParseQuery(t *testing.T) {
	b, err := os.ReadFile("testdata/query-gpu.csv")
	if err != nil {
		t.Fatal(err)
	}
	g, err := parseQuery(b, smiFields)
	if err != nil {
		t.Fatal(err)
	}
	if len(g) != 2 || g[0]["memory.used"] != "10240" || g[0]["name"] != "NVIDIA A100-SXM4-80GB" || g[1]["utilization.gpu"] != "" || g[1]["mig.mode.current"] != "Enabled" {
		t.Errorf("parsed %v", g)
	}
	if _, err := parseQuery([]byte("0, GPU-x\n"), smiFields); err == nil || !strings.Contains(err.Error(), "has 2 fields, want 13") {
		t.Errorf("short line: %v", err)
	}
	if _, err := parseQuery(nil, smiFields); err == nil {
		t.Error("no GPU accepted")
	}
}

func TestParseHeaderAndMIG(t *testing.T) {
	h, _ := os.ReadFile("testdata/nvidia-smi.txt")
	if v := parseCUDAVersion(h); v != "13.0" {
		t.Errorf("CUDA %q", v)
	}
	m, _ := os.ReadFile("testdata/nvidia-smi-mig-lgi.txt")
	if got := parseMIGInstances(m); !slices.Equal(got["1"], []string{"1g.10gb/11", "3g.40gb/1"}) || len(got) != 1 {
		t.Errorf("MIG %v", got)
	}
}

// node matches testdata's nvidia-smi answers.
func node(t *testing.T) *fakenvml.Node {
	n := fakenvml.NewNode(gpus.A100_SXM4_80GB, 2, fakenvml.Full)
	n.GPUs[0].Memory.Used = 10240 << 20
	n.GPUs[0].Utilization = &nvml.Utilization{Gpu: 87, Memory: 20}
	for _, p := range []int{nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE} {
		if _, err := n.GPUs[1].AddGPUInstance(p, 1); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestAgainstFakeDriverAndFakeSMI runs the whole check: the real exporter
// binary on the fake driver library, compared with a stand-in nvidia-smi.
func TestAgainstFakeDriverAndFakeSMI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the exporter binary")
	}
	dir := t.TempDir()
	b := fakenvml.NewBuilder(filepath.Join(dir, "lib"))
	lib, err := b.Library(fakenvml.Full)
	if err != nil {
		t.Fatal(err)
	}
	// make test builds the exporter once for every package (GPE_TEST_BINARY).
	bin := os.Getenv("GPE_TEST_BINARY")
	if bin == "" {
		bin = filepath.Join(dir, "gpu-pool-exporter")
		build := exec.Command("go", "build", "-o", bin, "../../cmd/gpu-pool-exporter")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	smi, _ := filepath.Abs("testdata/nvidia-smi")
	nodeFile := filepath.Join(dir, "node.conf")
	t.Setenv(fakenvml.EnvNode, nodeFile)
	check := func(t *testing.T, n *fakenvml.Node) (int, string) {
		t.Helper()
		if err := n.WriteFile(nodeFile); err != nil {
			t.Fatal(err)
		}
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"--binary=" + bin, "--nvml.library=" + lib, "--nvidia-smi=" + smi,
			"--settle=2500ms", "--exporter-args=--dcgm.mode=off"}, &out, &errb)
		t.Logf("device-check exit %d:\n%s%s", code, out.String(), errb.String())
		return code, out.String()
	}
	rowOf := func(out, gpu, field string) string {
		for _, l := range strings.Split(out, "\n") {
			if f := strings.Fields(l); len(f) > 2 && f[0] == gpu && strings.HasPrefix(strings.Join(f[1:], " "), field) {
				return l
			}
		}
		return ""
	}

	t.Run("agrees with a driver without memory.reserved", func(t *testing.T) {
		t.Setenv("FAKE_SMI_OLD", "1")
		n := node(t)
		for i := range n.GPUs {
			n.GPUs[i].Memory.Reserved = 0 // so v1 and v2 agree
		}
		code, out := check(t, n)
		if code != exitOK {
			t.Errorf("exit %d, want 0", code)
		}
		if r := rowOf(out, "1", "mig instances"); !strings.HasSuffix(strings.TrimSpace(r), "ok") || !strings.Contains(r, "1g.10gb/11 3g.40gb/1") {
			t.Errorf("MIG row %q", r)
		}
		if r := rowOf(out, "1", "utilization.gpu"); !strings.HasSuffix(strings.TrimSpace(r), "-") {
			t.Errorf("utilisation of a MIG GPU is judged: %q", r)
		}
	})

	t.Run("a value beyond tolerance fails its row and the check", func(t *testing.T) {
		t.Setenv("FAKE_SMI_OLD", "1")
		n := node(t)
		for i := range n.GPUs {
			n.GPUs[i].Memory.Reserved = 0
		}
		n.GPUs[1].Temperatures[nvml.TEMPERATURE_GPU] = 41 // nvidia-smi says 31
		code, out := check(t, n)
		if code != exitMismatch {
			t.Errorf("exit %d, want 1", code)
		}
		if r := rowOf(out, "1", "temperature.gpu"); !strings.Contains(r, "FAIL") {
			t.Errorf("temperature row %q", r)
		}
		if r := rowOf(out, "0", "temperature.gpu"); strings.Contains(r, "FAIL") {
			t.Errorf("GPU 0's temperature row %q", r)
		}
	})

	t.Run("reserved memory is not counted as used", func(t *testing.T) {
		code, out := check(t, node(t))
		if code != exitOK {
			t.Errorf("exit %d, want 0", code)
		}
		if r := rowOf(out, "0", "memory.reserved"); !strings.Contains(r, " ok") {
			t.Errorf("reserved row %q", r)
		}
	})

	t.Run("an exporter that cannot start is a setup error", func(t *testing.T) {
		var out, errb bytes.Buffer
		code := run(context.Background(), []string{"--binary=" + bin, "--nvml.library=/nonexistent/libnvidia-ml.so.1",
			"--nvidia-smi=" + smi, "--settle=1s"}, &out, &errb)
		if code != exitSetup || !strings.Contains(errb.String(), "exited at start") {
			t.Errorf("exit %d: %s", code, errb.String())
		}
	})
}
