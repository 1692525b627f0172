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
				alertSev := severity[f.Alertname]
				if alertSev == "" {
					t.Fatalf("firing %s: no such alert", f.Alertname)
				}
				for _, n := range f.ExpAlerts {
					sev := alertSev
					var exp struct {
						Labels      map[string]string `yaml:"exp_labels"`
						Annotations map[string]string `yaml:"exp_annotations"`
					}
					if err := n.Decode(&exp); err != nil {
						t.Fatal(err)
					}
					key := f.Alertname + SeriesKey("", exp.Labels)
					if sev == alerts.RemediatorSeverity {
						// Templated by who holds the fault: the alert's own label.
						sev = exp.Labels["severity"]
					}
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

// TestValuesString checks promtool's notation of a series: runs of one
// value, whole-step runs (timestamps), gaps and stale markers.
func TestValuesString(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		values []*float64
		stale  []int
		want   string
	}{
		{[]*float64{f(1), f(1), f(1)}, nil, "1x2"},
		{[]*float64{f(0), f(60), f(120), f(180)}, nil, "0+60x3"},
		{[]*float64{f(0), f(60)}, nil, "0 60"},
		{[]*float64{nil, nil, f(30), f(60), f(90), f(120), nil, f(90)}, []int{6}, "_x2 30+30x3 stale 90"},
		{[]*float64{f(71), f(73), f(75)}, nil, "71 73 75"},
		{[]*float64{f(0.1), f(0.2), f(0.3)}, nil, "0.1 0.2 0.3"},
		{[]*float64{f(5), f(4), f(3)}, nil, "5 4 3"},
		{[]*float64{f(7), f(7), f(8), f(9), f(10), f(11)}, nil, "7x1 8+1x3"},
	} {
		s := &Series{Values: tc.values, Stale: make([]bool, len(tc.values))}
		for _, i := range tc.stale {
			s.Stale[i] = true
		}
		if got := s.ValuesString(); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.values, got, tc.want)
		}
	}
}
