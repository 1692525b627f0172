package readme

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gpu-pool-exporter/gpu-pool-exporter"

// productDirs are the product's packages: none of them may link the
// simulation wing (the command wires it in for --simulate, alone).
var productDirs = []string{"collector", "podmap", "dashboards"}

// TestProductDoesNotImportTheSimulation reads every non-test Go file of the
// product's packages: none imports sim/ (depguard in .golangci.yml says the
// same to the linter).
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
					t.Errorf("%s imports %s: product packages take the node's sources as collector.Sources; only the command wires in the simulation", path, p)
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
			if strings.HasPrefix(base, "fake") || base == "simnode" || base == "miggeometry" {
				t.Errorf("%s is a stand-in outside the simulation wing: move it under sim/", f)
				break
			}
		}
	}
	if inWing < 20 {
		t.Errorf("only %d files under sim/: is the wing where this test thinks it is?", inWing)
	}
}
