package pages

import (
	"strings"
	"testing"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
)

// TestAlertVolume counts, from the fixtures of the default simulated node,
// what the shipped rules fire in an hour (the generated promtool tests,
// which alerts.TestPromtoolTestRules runs, hold every other alert quiet at
// every check): a healthy node pages, warns and informs nobody; one fault
// pages once, with what to do in the description.
func TestAlertVolume(t *testing.T) {
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	severity := map[string]string{}
	for _, a := range rf.Alerts() {
		severity[a.Alert] = a.Labels["severity"]
	}
	for _, tc := range []struct {
		source string
		want   map[string]int // distinct alerts (name and labels) per severity
	}{
		{"testdata/default-healthy.yml", map[string]int{}},
		{"testdata/default-one-fault.yml", map[string]int{"critical": 1}},
	} {
		t.Run(tc.source, func(t *testing.T) {
			src, err := LoadSource(tc.source)
			if err != nil {
				t.Fatal(err)
			}
			if src.Minutes < 60 || src.QuietEvery > 5 {
				t.Fatalf("%s runs %d minutes, checked every %d: want an hour or more, checked every 5 minutes or less", tc.source, src.Minutes, src.QuietEvery)
			}
			if len(src.AlertRuleTest) > 0 {
				t.Fatalf("%s: alert_rule_test entries would escape the count; use firing", tc.source)
			}
			got := map[string]int{}
			seen := map[string]bool{}
			for _, f := range src.Firing {
				sev := severity[f.Alertname]
				if sev == "" {
					t.Fatalf("firing %s: no such alert", f.Alertname)
				}
				for _, n := range f.ExpAlerts {
					var exp struct {
						Labels      map[string]string `yaml:"exp_labels"`
						Annotations map[string]string `yaml:"exp_annotations"`
					}
					if err := n.Decode(&exp); err != nil {
						t.Fatal(err)
					}
					key := f.Alertname + seriesKey("", exp.Labels)
					if !seen[key] {
						seen[key] = true
						got[sev]++
					}
					if sev == "critical" && !strings.Contains(exp.Annotations["description"], "What to do:") {
						t.Errorf("page %s: the description has no runbook (What to do)", key)
					}
				}
			}
			t.Logf("%s: %d pages, %d warnings, %d info in %d minutes", tc.source, got["critical"], got["warning"], got["info"], src.Minutes)
			for _, s := range []string{"critical", "warning", "info"} {
				if got[s] != tc.want[s] {
					t.Errorf("%s: %d %s alerts, want %d", tc.source, got[s], s, tc.want[s])
				}
			}
		})
	}
}
