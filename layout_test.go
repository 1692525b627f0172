package readme

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gpu-pool-exporter/gpu-pool-exporter"

// productDirs are the product's packages: none of them may link the
// simulation wing (only gpu-pool-exporter-sim and the tests wire it in).
var productDirs = []string{"agent", "analytics", "collector", "dashboards", "miggeometry", "podmap", "server", "cmd/gpu-pool-exporter", "cmd/gpupool"}

// agentDirs are the node agent's packages: they import neither the
// simulation nor the analytics (gpupool's).
var agentDirs = []string{"agent", "collector", "podmap", "server", "cmd/gpu-pool-exporter"}

// TestProductDoesNotImportTheSimulation reads every non-test Go file of the
// product's packages: none imports sim/, and none of the agent's imports
// analytics/ (depguard in .golangci.yml says the same to the linter).
func TestProductDoesNotImportTheSimulation(t *testing.T) {
	fset := token.NewFileSet()
	n := 0
	for _, dir := range productDirs {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				return err
			}
			n++
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				if p == module+"/sim" || strings.HasPrefix(p, module+"/sim/") {
					t.Errorf("%s imports %s: product packages take the node's sources as collector.Sources; only gpu-pool-exporter-sim wires in the simulation", path, p)
				}
				if inAgent(path) && (p == module+"/analytics" || strings.HasPrefix(p, module+"/analytics/")) {
					t.Errorf("%s imports %s: the node agent links no analytics (gpupool's job)", path, p)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if n < 50 {
		t.Fatalf("read %d product files: the walk missed the tree", n)
	}
}

// TestFakesLiveInTheSimulationWing: every tracked file whose name says it
// is a fake, a stand-in or a simulation lives under sim/.
func TestFakesLiveInTheSimulationWing(t *testing.T) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a checkout)", err)
	}
	files := strings.Fields(string(out))
	inWing := 0
	for _, f := range files {
		if strings.HasPrefix(f, "sim/") {
			inWing++
			continue
		}
		for _, part := range strings.Split(f, "/") {
			base := strings.TrimSuffix(part, filepath.Ext(part))
			if strings.HasPrefix(base, "fake") || base == "simnode" || base == "simagent" {
				t.Errorf("%s is a stand-in outside the simulation wing: move it under sim/", f)
				break
			}
		}
	}
	if inWing < 20 {
		t.Errorf("only %d files under sim/: is the wing where this test thinks it is?", inWing)
	}
}

// inAgent says whether path is in one of the agent's packages.
func inAgent(path string) bool {
	for _, d := range agentDirs {
		if strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// TestAgentLinksNeitherSimulationNorAnalytics: the packages the node
// agent's binary links, transitively, include none of the simulation wing
// and none of the analytics; the simulated node's binary does link the
// wing (so the check would see it).
func TestAgentLinksNeitherSimulationNorAnalytics(t *testing.T) {
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	forbidden := func(p string) bool {
		for _, w := range []string{"/sim", "/analytics"} {
			if p == module+w || strings.HasPrefix(p, module+w+"/") {
				return true
			}
		}
		return false
	}
	agent := deps("./cmd/gpu-pool-exporter")
	for _, p := range agent {
		if forbidden(p) {
			t.Errorf("the agent (cmd/gpu-pool-exporter) links %s", p)
		}
	}
	if !slices.ContainsFunc(deps("./cmd/gpu-pool-exporter-sim"), forbidden) {
		t.Error("gpu-pool-exporter-sim links no package of the simulation: does this test look at the right paths?")
	}
	if !slices.ContainsFunc(deps("./cmd/gpupool"), forbidden) {
		t.Error("gpupool links no package of the analytics: does this test look at the right paths?")
	}
}

// TestMakeRunBuildsOnlyWhatTheSimulatedNodeRuns: `make run`'s quick build
// (the Makefile's RUN_BUILD_FLAGS) leaves go-dcgm out of the simulated
// node, whose DCGM is sim/fakedcgm, while the agent links it.
func TestMakeRunBuildsOnlyWhatTheSimulatedNodeRuns(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var tags string
	for _, l := range strings.Split(string(mk), "\n") {
		if rest, ok := strings.CutPrefix(l, "RUN_BUILD_FLAGS :="); ok {
			f := strings.Fields(rest)
			if i := slices.Index(f, "-tags"); i >= 0 && i+1 < len(f) {
				tags = f[i+1]
			}
		}
	}
	if !slices.Contains(strings.Split(tags, ","), "nodcgm") {
		t.Fatalf("the Makefile's RUN_BUILD_FLAGS has no -tags with nodcgm (tags %q): make run would compile go-dcgm, which the simulated node never runs", tags)
	}
	const goDCGM = "github.com/NVIDIA/go-dcgm/pkg/dcgm"
	deps := func(args ...string) []string {
		out, err := exec.Command("go", append([]string{"list", "-deps"}, args...)...).Output()
		if err != nil {
			t.Fatalf("go list -deps %v: %v", args, err)
		}
		return strings.Fields(string(out))
	}
	if slices.Contains(deps("-tags", tags, "./cmd/gpu-pool-exporter-sim"), goDCGM) {
		t.Errorf("make run's build (-tags %s) of gpu-pool-exporter-sim links %s", tags, goDCGM)
	}
	if !slices.Contains(deps("./cmd/gpu-pool-exporter"), goDCGM) {
		t.Errorf("the agent does not link %s: is DCGM still read on a node?", goDCGM)
	}
	// What a binary built so says when asked for DCGM (a test that only
	// builds with the tag).
	out, err := exec.Command("go", "test", "-count=1", "-tags", tags, "-run", "^TestBuiltWithoutDCGM$", "-v", "./collector/dcgm/").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestBuiltWithoutDCGM") {
		t.Errorf("go test -tags %s ./collector/dcgm/: %v\n%s", tags, err, out)
	}
}
