package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/analytics/rightsize"
)

// TestRightsizeUsageErrors: what the user wrote wrong stops recommend and
// report with exit 2 and a message naming the flag, before any query.
// alerts/rightsizing runs both against a real Prometheus.
func TestRightsizeUsageErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const prom = "--prometheus=http://127.0.0.1:1"
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"recommend"}, "'--prometheus' not provided"},
		{[]string{"recommend", prom, "--window=a week"}, "--window=a week: want a Prometheus duration"},
		{[]string{"recommend", prom, "--window=0s"}, "--window=0s"},
		{[]string{"recommend", prom, "--headroom=-0.1"}, "--headroom=-0.1"},
		{[]string{"recommend", prom, "--idle.threshold=2"}, "--idle.threshold=2"},
		{[]string{"recommend", prom, "-o", "xml"}, "--output=xml: want table, csv, json, yaml"},
		{[]string{"report", prom, "-o", "yaml"}, "--output=yaml: want table, csv, json"},
		{[]string{"recommend", prom, "--percentile=0"}, "--percentile=0: want a percentile above 0 and at most 100"},
		{[]string{"recommend", prom, "--percentile=101"}, "--percentile=101"},
		{[]string{"recommend", prom, "--min-coverage=1.5"}, "--min-coverage=1.5: want a fraction of the window from 0 to 1"},
		{[]string{"recommend", prom, "--percentile=high"}, "--percentile=high: want a number"},
		{[]string{"recommend", prom, "--headroom=lots"}, "--headroom=lots: want a number"},
		{[]string{"report", prom, "--unallocated=hide"}, "--unallocated=hide: want show"},
		{[]string{"recommend", prom, "--at=yesterday"}, "--at=yesterday: want an RFC 3339 time"},
		{[]string{"recommend", prom, "--idle.price=H100"}, "--idle.price=H100"},
		{[]string{"recommend", prom, "--idle.price-file=/nonexistent.yaml"}, "--idle.price-file"},
		{[]string{"recommend", "--prometheus=prometheus:9090"}, "--prometheus=prometheus:9090: want a URL"},
		{[]string{"recommend", prom, "--prometheus.bearer-token-file=" + empty}, "is empty"},
		{[]string{"report", prom, "--by=team"}, "--by=team: want namespace, owner or label:<pod label>"},
		{[]string{"report", prom, "--since=1x"}, "--since=1x"},
		{[]string{"report", prom, "-o", "xml"}, "--output=xml"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), tc.args, &out, &errb); code != exitUsage {
				t.Errorf("exit %d, want %d (usage); stderr %q", code, exitUsage, errb.String())
			}
			if !strings.Contains(errb.String(), tc.msg) {
				t.Errorf("stderr %q, want it to say %q", errb.String(), tc.msg)
			}
		})
	}
}

// TestRightsizeUnreachablePrometheus: a Prometheus that does not answer is
// the machine's failure (exit 1), named with the flag to check.
func TestRightsizeUnreachablePrometheus(t *testing.T) {
	for _, cmd := range []string{"recommend", "report"} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{cmd, "--prometheus=http://127.0.0.1:1"}, &out, &errb); code != exitError || !strings.Contains(errb.String(), "cannot reach Prometheus at http://127.0.0.1:1") {
			t.Errorf("%s: exit %d, %q; want exit 1, cannot reach Prometheus", cmd, code, errb.String())
		}
	}
}

// TestRecommendNotesKeepUnpricedWithoutKSM: without kube-state-metrics,
// the note that a model has no price is still printed beside the one
// that workloads are pods.
func TestRecommendNotesKeepUnpricedWithoutKSM(t *testing.T) {
	rows := []rightsize.Row{{Model: "Tesla T4", Recommendation: rightsize.RecommendKeep}}
	for _, ksm := range []bool{true, false} {
		notes := strings.Join(recommendNotes(nil, rows, ksm), "\n")
		if !strings.Contains(notes, "no price for Tesla T4") {
			t.Errorf("kube-state-metrics %v: notes %q lack the unpriced T4", ksm, notes)
		}
		if strings.Contains(notes, "each pod is its own workload") == ksm {
			t.Errorf("kube-state-metrics %v: notes %q", ksm, notes)
		}
	}
}
