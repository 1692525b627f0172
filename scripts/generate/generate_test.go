package main

import (
	"strings"
	"testing"
)

// TestGeneratedFilesUpToDate is the one check that every generated file and
// copy in the tree is what `make generate` writes now: the alerts/ rule
// layers, the dashboards, the Helm chart's files/ and the kustomize rule
// objects. It lists every stale file.
func TestGeneratedFilesUpToDate(t *testing.T) {
	files, err := Files("../..")
	if err != nil {
		t.Fatal(err)
	}
	stale, err := Stale("../..", files)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) > 0 {
		t.Errorf("%d generated files are stale; run make generate and commit the result:\n  %s", len(stale), strings.Join(stale, "\n  "))
	}
}
