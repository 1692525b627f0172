package churn

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts/internal/proctest"
)

// TestADayOfChurn runs the shipped rules over a simulated day of a GKE GPU
// cluster's churn (Plan) on Prometheus 2.42 (promtool) and 3.x
// (promtool3): every real fault fires its alert once, on its node, and
// nothing else fires, whatever its severity. docs/alerts.md ("A day of
// churn") reports the day and its counts; `go test -v -run TestADayOfChurn
// ./alerts/churn/` prints them, with each promtool's time.
func TestADayOfChurn(t *testing.T) {
	rf, err := alerts.Rules()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := filepath.Abs(filepath.Join("..", alerts.RulesFileName))
	if err != nil {
		t.Fatal(err)
	}
	d := Plan()
	start := time.Now()
	dir := t.TempDir()
	count := filepath.Join(dir, "count.rules.yml")
	if err := os.WriteFile(count, []byte(CountRules), 0o644); err != nil {
		t.Fatal(err)
	}
	data, err := Build(d, rf, rules, count)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "churn_test.yml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	machines := 0
	for _, n := range d.Nodes {
		machines += len(n.machines)
	}
	t.Logf("the day: %d GPU node names, %d machines, %d scrapes every %s, %d KiB of promtool input, built in %s",
		len(d.Nodes), machines, steps, Step, len(data)/1024, time.Since(start).Round(time.Millisecond))
	for _, e := range d.Events {
		t.Log("  " + e)
	}
	want := d.Expected()
	counts := map[string]int{}
	for k, v := range want {
		counts[k[0]] += v
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	sort.Strings(names)
	var line []string
	for _, n := range names {
		line = append(line, fmt.Sprintf("%s %d", n, counts[n]))
	}
	t.Logf("alerts that must fire, once each (any other firing fails the test): %s", strings.Join(line, ", "))
	for name, pt := range proctest.Promtools(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			out, err := proctest.PromtoolCommand(pt, "test", "rules", file).CombinedOutput()
			if err != nil {
				t.Fatalf("%s test rules over the day: %v (each series it got is an alert name and node with its count; the test file is %s)\n%s", name, err, file, out)
			}
			t.Logf("%s: %s", name, time.Since(start).Round(time.Millisecond))
		})
	}
}

// TestPlanFaults holds the day to what docs/alerts.md says of it: six
// faults that page (two XIDs that need a reset, two that need a reboot, one
// of them killing a job while its node is being removed, an uncorrectable
// ECC error, a lost GPU) and an XID on an idle GPU of a node being removed,
// which pages nobody.
func TestPlanFaults(t *testing.T) {
	d := Plan()
	var got []string
	for _, f := range d.Faults() {
		got = append(got, fmt.Sprintf("%s %s -> %q", clock(f.At), f.What, f.Alert))
	}
	want := []string{
		`03:10 XID 48 on GPU 1 -> "GPUXIDResetRequired"`,
		`09:00 XID 79 on GPU 0 -> "GPUXIDNodeRebootRequired"`,
		`13:40 2 uncorrectable ECC errors on GPU 1 -> "GPUUncorrectableECCErrors"`,
		`13:50 XID 48 on GPU 0 -> "GPUXIDResetRequired"`,
		`17:01 XID 79 on GPU 0 -> "GPUXIDNodeRebootRequired"`,
		`18:00 GPU 1 lost -> "GPULost"`,
		`18:12 XID 48 on GPU 1 -> ""`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("faults:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
