package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/pages"
)

// TestGeneratedFilesUpToDate is the one check that every generated file and
// copy in the tree is what `make generate` writes now: the alerts/ rule
// layers, the promtool tests from real pages, the dashboards, the Helm
// chart's files/, the kustomize rule objects and the built-in counters
// file. It lists every stale file.
//
// It runs the generator as a program (`generate -check`), built without the
// race detector even under `go test -race`: the page fixtures simulate hours
// of a node's samples, which the detector's instrumentation makes about
// seven times as costly, and the code they run is raced by its own packages'
// tests.
func TestGeneratedFilesUpToDate(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "generate")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build ./scripts/generate: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "-check", "-root", "../..").CombinedOutput(); err != nil {
		t.Errorf("generate -check: %v\n%s", err, out)
	}
}

// TestWriteIsIdempotent generates into an empty tree holding only the
// sources on disk (the rules file, the remediators list, the counters
// files, the reference rules whose inputs the page fixtures keep): the first Write writes every file but the rules file (whose
// remediators group is current already) and removes a stray one, a second
// changes nothing, and nothing is stale after.
func TestWriteIsIdempotent(t *testing.T) {
	root := t.TempDir()
	tree := map[string][]byte{}
	srcs := []string{rulesSrc, remediatorsSrc, filepath.FromSlash(pages.ReferenceRulesFile)}
	for _, rel := range countersReleases {
		srcs = append(srcs, filepath.Join(countersDir, rel, "default-counters.csv"))
	}
	for _, s := range srcs {
		b, err := os.ReadFile(filepath.Join("../..", s))
		if err != nil {
			t.Fatal(err)
		}
		tree[filepath.Join(root, s)] = b
	}
	stray := filepath.Join(root, chart, "files", "dashboards", "old.json")
	tree[stray] = []byte("{}")
	for p, b := range tree {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files, err := Files(root)
	if err != nil {
		t.Fatal(err)
	}
	changed, err := Write(root, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != len(files) {
		t.Errorf("first Write changed %d paths, want %d files (all but the rules file) and the stray one: %v", len(changed), len(files)-1, changed)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Errorf("%s not removed: %v", stray, err)
	}
	if changed, err := Write(root, files); err != nil || len(changed) > 0 {
		t.Errorf("second Write changed %v (%v), want nothing", changed, err)
	}
	if stale, err := Stale(root, files); err != nil || len(stale) > 0 {
		t.Errorf("stale after Write: %v (%v)", stale, err)
	}
}
