package pages

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
)

var update = flag.Bool("update", false, "rewrite the generated promtool tests (alerts/tests/pages_*_test.yml, alerts/tests/gmp/pages_*_test.yml)")

// fixture is one source and the promtool tests generated from it.
type fixture struct {
	name    string
	src     *Source
	vanilla []byte
	gmp     []byte
}

// fixtures runs every source of testdata/ and renders both variants.
func fixtures(t *testing.T) []fixture {
	t.Helper()
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	keep, err := RuleMetrics(rf)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob("testdata/*.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixture sources in testdata/*.yml (%v)", err)
	}
	var out []fixture
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yml")
		src, err := LoadSource(f)
		if err != nil {
			t.Fatal(err)
		}
		series, err := Run(src, keep)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		fx := fixture{name: name, src: src}
		if fx.vanilla, err = Render(name, src, series, rf, Vanilla); err != nil {
			t.Fatal(err)
		}
		if fx.gmp, err = Render(name, src, series, rf, GMP); err != nil {
			t.Fatal(err)
		}
		out = append(out, fx)
	}
	return out
}

func generatedPaths(name string) (vanilla, gmp string) {
	base := "pages_" + strings.ReplaceAll(name, "-", "_") + "_test.yml"
	return filepath.Join("..", "tests", base), filepath.Join("..", "tests", "gmp", base)
}

// TestGeneratedFixturesUpToDate: the committed promtool tests are what the
// exporter serves today on their scenarios (go test ./alerts/pages -update
// rewrites them).
func TestGeneratedFixturesUpToDate(t *testing.T) {
	for _, fx := range fixtures(t) {
		vp, gp := generatedPaths(fx.name)
		for _, f := range []struct {
			path string
			data []byte
		}{{vp, fx.vanilla}, {gp, fx.gmp}} {
			if *update {
				if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			got, err := os.ReadFile(f.path)
			if err != nil || !bytes.Equal(got, f.data) {
				t.Errorf("%s is stale or missing (%v): the exporter's pages or the fixture source changed; run `go test ./alerts/pages -update` and review the diff", f.path, err)
			}
		}
	}
}
