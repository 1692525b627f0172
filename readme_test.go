// Package readme holds the tests that run what README.md and docs/*.md tell a
// user to run and check that it does what they say: the opening commands, the
// scenario examples, the queries, the links, the metric reference. The install
// commands (helm, kustomize; README's Install section and docs/deployment.md)
// are run by deploy/readme_test.go: the kustomize library imports
// package plugin, which makes the linker bind every symbol at start-up, and
// a binary that also links go-nvml then fails to start without libnvidia-ml.
package readme

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/nodecondition"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/simnode"
)

// block is one fenced code block of README.md or a docs/*.md file.
type block struct {
	file    string // from the top directory
	lang    string
	line    int    // of the opening fence
	section string // the "# " or "## " heading above it
	text    string
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// docFiles are README.md, then docs/*.md in name order.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	return append([]string{"README.md"}, docs...)
}

// readmeBlocks returns the code blocks of README.md (first, in order) and of
// docs/*.md.
func readmeBlocks(t *testing.T) []block {
	t.Helper()
	var blocks []block
	for _, f := range docFiles(t) {
		blocks = append(blocks, fileBlocks(t, f)...)
	}
	return blocks
}

func fileBlocks(t *testing.T, file string) []block {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	var section string
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && (strings.HasPrefix(l, "# ") || strings.HasPrefix(l, "## ")):
			section = strings.TrimLeft(l, "# ")
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &block{file: file, lang: strings.TrimPrefix(l, "```"), line: i + 1, section: section}
		case cur != nil && l == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: code block never closed", file, cur.line)
	}
	return blocks
}

// commands are a shell block's commands: comments dropped, continuation
// lines joined.
func commands(text string) []string {
	var cmds []string
	var cur string
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			cur += strings.TrimSuffix(l, `\`)
			continue
		}
		cmds = append(cmds, strings.Join(strings.Fields(cur+l), " "))
		cur = ""
	}
	return cmds
}

// TestREADMEOpensWithTwoCommands: run a simulated node, run the test suite;
// CI runs exactly the second.
func TestREADMEOpensWithTwoCommands(t *testing.T) {
	first := readmeBlocks(t)[0]
	if got, want := commands(first.text), []string{"make run", "make test"}; first.file != "README.md" || strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s: the opening commands are %q, want %q", first.where(), got, want)
	}
	// The Go README names is the one go.mod asks for.
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	goLine := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	readme, _ := os.ReadFile("README.md")
	if goLine == nil || !bytes.Contains(readme, []byte("Go "+string(goLine[1])+" or later")) {
		t.Errorf("README does not name go.mod's Go version as \"Go %s or later\"", goLine[1])
	}
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var run []string
	for _, c := range commands(string(ci)) {
		if !strings.HasPrefix(c, "set ") && !strings.HasPrefix(c, "cd ") {
			run = append(run, c)
		}
	}
	if len(run) != 1 || run[0] != "make test" {
		t.Errorf(".ci/run runs %q, want exactly README's `make test`", run)
	}
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*m`)

// TestMakeRun runs README's first command as a user would and stops it with
// Ctrl-C. The build's own output (cgo warnings, downloads on a fresh
// machine) is shown only when it fails. make run's quick build has flags of
// its own (RUN_BUILD_FLAGS), so a cold suite compiles it once here.
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "--no-print-directory", "run", "ARGS=--web.listen-address=127.0.0.1:0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a terminal's foreground group
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	var mu sync.Mutex
	var lines []string
	served := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		re := regexp.MustCompile(`serving /metrics .*url=(http://127\.0\.0\.1:[0-9]+/)`)
		for sc.Scan() {
			l := ansi.ReplaceAllString(sc.Text(), "")
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
			if m := re.FindStringSubmatch(l); m != nil {
				served <- m[1]
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	output := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(lines, "\n") }

	var url string
	select {
	case url = <-served:
	case err := <-exited:
		t.Fatalf("make run exited (%v) before serving:\n%s", err, output())
	case <-ctx.Done():
		t.Fatalf("make run did not serve within 5 minutes:\n%s", output())
	}
	// Quiet: nothing but the exporter's own log lines.
	logLine := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (DBG|INF|WRN) `)
	var noise []string
	for _, l := range strings.Split(output(), "\n") {
		if !logLine.MatchString(l) && !strings.HasPrefix(l, "make run: building ./gpu-pool-exporter") {
			noise = append(noise, l)
		}
	}
	if len(noise) > 0 {
		t.Errorf("make run printed %d lines besides the exporter's log, starting:\n%s", len(noise), strings.Join(noise[:min(len(noise), 8)], "\n"))
	}
	var body []byte
	for deadline := time.Now().Add(15 * time.Second); !bytes.Contains(body, []byte("\ngpu_info{")); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%smetrics, the logged URL, serves no GPU:\n%s", url, body)
		}
		if resp, err := http.Get(url + "metrics"); err == nil {
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
	}
	// The process under make is the exporter itself.
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
	if err != nil {
		t.Skipf("cannot list make's children: %v", err)
	}
	fields := strings.Fields(string(kids))
	if len(fields) != 1 {
		t.Fatalf("make has %d children, want 1 (the exporter)", len(fields))
	}
	pid, _ := strconv.Atoi(fields[0])
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if filepath.Base(exe) != "gpu-pool-exporter-sim" {
		t.Errorf("make's child is %s, want the gpu-pool-exporter-sim binary (a shell or `go run` between them keeps the exporter alive when it is killed)", exe)
	}
	// Ctrl-C: SIGINT to the foreground process group.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("Ctrl-C did not stop make run within 20s:\n%s", output())
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("the exporter (pid %d) still runs after Ctrl-C", pid)
	}
	if !strings.Contains(output(), "shutting down") {
		t.Errorf("the exporter did not shut down cleanly:\n%s", output())
	}
}

// TestREADMEScenarios loads every scenario block of docs/simulation.md as
// --simulate.scenario does and checks what the text around it says of it.
func TestREADMEScenarios(t *testing.T) {
	var n int
	for _, b := range readmeBlocks(t) {
		if !isScenarioBlock(b) {
			continue
		}
		n++
		sc, err := simnode.ParseScenario(b.where(), []byte(b.text))
		if err != nil {
			t.Errorf("%s: the scenario does not load: %v", b.where(), err)
			continue
		}
		node, err := simnode.New(sc)
		if err != nil {
			t.Errorf("%s: the scenario loads but the node does not start: %v", b.where(), err)
			continue
		}
		if got, _ := node.DeviceGetCount(); got != sc.Node.Count {
			t.Errorf("%s: %d GPUs, the scenario says %d", b.where(), got, sc.Node.Count)
		}
		// "Pods are listed by the simulated kubelet with the device IDs of
		// the node's flavour."
		idPattern := map[string]*regexp.Regexp{
			"nvidia": regexp.MustCompile(`^(GPU-[0-9a-f-]+(::[0-9]+)?|MIG-[0-9a-f-]+)$`),
			"gke":    regexp.MustCompile(`^nvidia[0-9]+(/gi[0-9]+)?(/vgpu[0-9]+)?$`),
		}[sc.Node.Flavour]
		for _, p := range node.KubeletPods() {
			for _, c := range p.Containers {
				for _, d := range c.Devices {
					for _, id := range d.IDs {
						if !idPattern.MatchString(id) {
							t.Errorf("%s: pod %s/%s holds %q, not a %s device ID", b.where(), p.Namespace, p.Name, id, sc.Node.Flavour)
						}
					}
				}
			}
		}
		node.Close()
	}
	if n < 2 {
		t.Errorf("found %d scenario blocks in docs/simulation.md, want its 2 examples", n)
	}
}

func isScenarioBlock(b block) bool { return b.lang == "yaml" && b.file == "docs/simulation.md" }

// TestREADMEQueries parses every PromQL block.
func TestREADMEQueries(t *testing.T) {
	for _, b := range readmeBlocks(t) {
		if b.lang != "promql" {
			continue
		}
		for i, l := range strings.Split(b.text, "\n") {
			if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			if _, err := parser.NewParser(parser.Options{}).ParseExpr(l); err != nil {
				t.Errorf("%s:%d: %v", b.file, b.line+1+i, err)
			}
		}
	}
}

// TestREADMEEveryBlockChecked: each code block of README.md, docs/*.md and
// alerts/README.md is run by a test, or says why it cannot run offline; a new
// block fails here until one does.
func TestREADMEEveryBlockChecked(t *testing.T) {
	for _, b := range readmeBlocks(t) {
		var by string
		switch {
		case b.file == "README.md" && b.line == readmeBlocks(t)[0].line:
			by = "TestREADMEOpensWithTwoCommands, TestMakeRun"
		case isScenarioBlock(b):
			by = "TestREADMEScenarios"
		case b.lang == "promql":
			by = "TestREADMEQueries"
		case isInstallBlock(b):
			by = "deploy.TestREADMEInstall"
		case b.lang == "sh" && allPrefixed(commands(b.text), "scripts/device-check"):
			by = "needs a real GPU; scripts/devicecheck.TestAgainstFakeDriverAndFakeSMI runs it against the fake driver"
		case b.lang == "sh" && b.section == "Who uses a shared GPU" && allPrefixed(commands(b.text), "kubectl"):
			by = "needs a cluster (kubectl exec); cmd/gpupool.TestStatusSubcommand runs `gpupool status` against the simulated node and checks these rows"
		case b.file == "docs/sharded.md" && b.lang == "sh":
			checkThanosRuler(t, b)
			by = "this test: the rules file exists and alerts/thanos (make test-thanos) runs the ruler with these flags"
		case b.file == "docs/sharded.md" && b.lang == "yaml" && strings.Contains(b.text, "kind: ThanosRuler"):
			checkThanosRulerResource(t, b)
			by = "this test: it selects the label of the global PrometheusRule that deploy/ renders"
		case b.file == "docs/sharded.md" && b.lang == "yaml" && strings.Contains(b.text, "thanosRulerSpec:"):
			checkKubePrometheusStackValues(t, b)
			by = "this test: every key is one of kube-prometheus-stack's values, and the selectors name the rules-layer labels of the PrometheusRules deploy/ renders"
		case b.lang == "sh" && b.file == "docs/fleet.md" && allPrefixed(commands(b.text), "gpupool fleet"):
			by = "needs a Prometheus with the rules; alerts/e2e's checkFleet runs `gpupool fleet` (table and -o json) against the end-to-end test's Prometheus"
		case b.file == "docs/rightsizing.md" && b.lang == "sh" && allPrefixed(commands(b.text), "gpupool re"):
			by = "needs a Prometheus with the rules' recordings; alerts/rightsizing runs recommend and report on a backfilled week, alerts/e2e on the simulated node"
		case b.file == "docs/rightsizing.md" && b.lang == "text":
			by = "alerts/rightsizing.TestRecommendAndReportOnABackfilledWeek compares the worked examples with what recommend (table, -o yaml) and report print on its week; the allowlist is kube-state-metrics' flag, its labels the ones the commands read"
		case b.file == "docs/migration-dcgm-exporter.md" && b.lang == "yaml" && strings.Contains(b.text, "nvidia-dcgm-exporter"):
			by = "alerts/e2e reads this block into the scrape config of its honor_labels: true job and runs dcgm-exporter's dashboard pinned to job=\"nvidia-dcgm-exporter\""
		case b.file == "docs/pod-mapping.md" && b.lang == "yaml" && strings.Contains(b.text, "kube_pod_labels"):
			checkPodLabelsRule(t, b)
			by = "this test: promtool runs the group on pods of two apps and two kube-state-metrics replicas"
		case b.lang == "yaml" && strings.Contains(b.text, "rule_files:"):
			checkRuleFiles(t, b)
			by = "this test"
		case b.file == "docs/node-condition.md" && b.lang == "yaml" && strings.Contains(b.text, "kind: ValidatingAdmissionPolicy\n"):
			by = "needs an API server: podmap/apiserver.TestNodeConditionAdmissionPolicy (make test-apiserver) applies this block to a real kube-apiserver and writes with the tokens it issues"
		case b.file == "docs/node-condition.md" && b.lang == "yaml" && strings.Contains(b.text, "kubernetes-object-monitor:"):
			checkNVSentinelPolicy(t, b)
			by = "needs NVSentinel; this test: the values parse and the policy's predicate reads the condition type the exporter writes"
		case b.lang == "yaml" && strings.Contains(b.text, "remediators:"):
			checkRemediatorsBlock(t, b)
			by = "this test: the list parses as alerts/remediators.yml does and generates a rules file that parses"
		case b.lang == "yaml" && strings.Contains(b.text, "route:"):
			checkAlertmanagerRoute(t, b)
			by = "this test (an Alertmanager route needs an Alertmanager; its matchers name labels every shipped alert carries alike on vanilla and GMP rules)"
		default:
			t.Errorf("%s: a %s block in %q that no test runs; run it in a test or say why it cannot run offline", b.where(), b.lang, b.section)
			continue
		}
		t.Logf("%s (%s, %s): %s", b.where(), b.lang, b.section, by)
	}
	// The commands of alerts/README.md, from the top directory: `check rules`
	// runs here as written; `test rules` must name every promtool test file,
	// each of which alerts.TestPromtoolTestRules runs with both promtools
	// (running them here too would double the suite's costliest part).
	checkAlertsREADMECommands(t)
	// dashboards/README.md's `make generate` is checked by
	// scripts/generate.TestGeneratedFilesUpToDate.
}

// checkAlertsREADMECommands runs alerts/README.md's `promtool check rules`
// and checks that each `test rules` line, its globs expanded as the shell
// would, names exactly the promtool test files under alerts/tests.
func checkAlertsREADMECommands(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile("alerts/README.md")
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	if err := filepath.WalkDir("alerts/tests", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yml") {
			all = append(all, p)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	var checked, tested int
	for _, c := range commands(string(b)) {
		args := strings.Fields(c)
		if args[0] != "promtool" && args[0] != "promtool3" {
			continue // go test ./alerts/... runs in this suite anyway
		}
		var expanded []string // as the shell would
		for _, a := range args[1:] {
			files, _ := filepath.Glob(a)
			if strings.Contains(a, "*") {
				if len(files) == 0 {
					t.Errorf("alerts/README.md: %s: %s matches no file", c, a)
				}
				expanded = append(expanded, files...)
			} else {
				expanded = append(expanded, a)
			}
		}
		switch {
		case len(expanded) > 2 && expanded[0] == "test" && expanded[1] == "rules":
			tested++
			got := slices.Sorted(slices.Values(expanded[2:]))
			if !slices.Equal(got, all) {
				t.Errorf("alerts/README.md: %s names %d test files, want every one under alerts/tests (%d):\n got %v\nwant %v", c, len(got), len(all), got, all)
			}
		case len(expanded) > 2 && expanded[0] == "check" && expanded[1] == "rules" && args[0] == "promtool":
			checked++
			promtool, err := exec.LookPath("promtool")
			if err != nil {
				if os.Getenv("CI") != "" {
					t.Fatal("promtool not found (make tools installs it)")
				}
				t.Skip("promtool not found")
			}
			if out, err := exec.Command(promtool, expanded...).CombinedOutput(); err != nil {
				t.Errorf("alerts/README.md: %s: %v\n%s", c, err, out)
			}
		default:
			t.Errorf("alerts/README.md: %s: want promtool check rules or test rules", c)
		}
	}
	if checked != 1 || tested != 2 {
		t.Errorf("alerts/README.md: %d check rules and %d test rules commands, want 1 and 2 (promtool and promtool3)", checked, tested)
	}
}

// isInstallBlock: deploy.TestREADMEInstall runs README's Install section and
// docs/deployment.md.
func isInstallBlock(b block) bool {
	return (b.file == "README.md" && b.section == "Install") || b.file == "docs/deployment.md"
}

func allPrefixed(cmds []string, prefix string) bool {
	for _, c := range cmds {
		if !strings.HasPrefix(c, prefix) {
			return false
		}
	}
	return len(cmds) > 0
}

// checkRuleFiles: the prometheus.yml example loads the shipped rules file.
// checkThanosRuler: the block's ConfigMap holds a rules file alerts/ ships,
// and every flag of its `thanos rule` is one alerts/thanos passes to the
// ruler it runs.
func checkThanosRuler(t *testing.T, b block) {
	t.Helper()
	src, err := os.ReadFile("alerts/thanos/thanos_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var flags int
	for _, c := range commands(b.text) {
		args := strings.Fields(c)
		switch {
		case len(args) > 3 && args[0] == "kubectl":
			for _, a := range args {
				if f, ok := strings.CutPrefix(a, "--from-file="); ok {
					if _, err := os.Stat(f); err != nil {
						t.Errorf("%s: %s is not a file of this repository", b.where(), f)
					}
				}
			}
		case len(args) > 2 && args[0] == "thanos" && args[1] == "rule":
			for _, a := range args[2:] {
				name := strings.SplitN(a, "=", 2)[0]
				flags++
				if name == "--alertmanagers.url" {
					continue // the test runs no Alertmanager
				}
				if !strings.Contains(string(src), `"`+name+`=`) && !strings.Contains(string(src), "`"+name+`=`) {
					t.Errorf("%s: thanos rule %s: alerts/thanos does not run the ruler with it", b.where(), name)
				}
			}
		default:
			t.Errorf("%s: %q: want kubectl create configmap or thanos rule", b.where(), c)
		}
	}
	if flags < 5 {
		t.Errorf("%s: found %d flags of thanos rule, want the ruler's command line", b.where(), flags)
	}
}

// checkThanosRulerResource: the ThanosRuler selects the rules-layer label
// that the kustomize component gives the global PrometheusRule.
func checkThanosRulerResource(t *testing.T, b block) {
	t.Helper()
	global, err := os.ReadFile("deploy/kustomize/components/prometheus-operator-sharded-rules/prometheusrule-global.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const label = "gpu-pool-exporter/rules-layer: global"
	if !strings.Contains(b.text, label) || !strings.Contains(string(global), label) {
		t.Errorf("%s: the ThanosRuler must select %q, the global PrometheusRule's label", b.where(), label)
	}
	for _, field := range []string{"queryEndpoints:", "ruleSelector:", "ruleNamespaceSelector:"} {
		if !strings.Contains(b.text, field) {
			t.Errorf("%s: the ThanosRuler has no %s", b.where(), field)
		}
	}
}

// kubePrometheusStackKeys are the kube-prometheus-stack values (chart
// version 88) that the sharded setup's values example may set: the leaves
// it sets, and the maps above them.
var kubePrometheusStackKeys = map[string]bool{
	"prometheus":                                                          true,
	"prometheus.thanosService":                                            true,
	"prometheus.thanosService.enabled":                                    true,
	"prometheus.prometheusSpec":                                           true,
	"prometheus.prometheusSpec.externalLabels":                            true,
	"prometheus.prometheusSpec.ruleSelectorNilUsesHelmValues":             true,
	"prometheus.prometheusSpec.ruleNamespaceSelector":                     true,
	"prometheus.prometheusSpec.ruleSelector":                              true,
	"prometheus.prometheusSpec.thanos":                                    true,
	"prometheus.prometheusSpec.thanos.objectStorageConfig":                true,
	"prometheus.prometheusSpec.thanos.objectStorageConfig.existingSecret": true,
	"thanosRuler":                 true,
	"thanosRuler.enabled":         true,
	"thanosRuler.thanosRulerSpec": true,
	"thanosRuler.thanosRulerSpec.ruleSelectorNilUsesHelmValues": true,
	"thanosRuler.thanosRulerSpec.ruleNamespaceSelector":         true,
	"thanosRuler.thanosRulerSpec.ruleSelector":                  true,
	"thanosRuler.thanosRulerSpec.queryEndpoints":                true,
	"thanosRuler.thanosRulerSpec.labels":                        true,
	"thanosRuler.thanosRulerSpec.evaluationInterval":            true,
}

// kubePrometheusStackOpaque are values whose content is the user's (label
// sets, selectors, a Secret reference), not chart keys.
var kubePrometheusStackOpaque = []string{
	"prometheus.prometheusSpec.externalLabels",
	"prometheus.prometheusSpec.ruleSelector",
	"prometheus.prometheusSpec.ruleNamespaceSelector",
	"prometheus.prometheusSpec.thanos.objectStorageConfig.existingSecret",
	"thanosRuler.thanosRulerSpec.ruleSelector",
	"thanosRuler.thanosRulerSpec.ruleNamespaceSelector",
	"thanosRuler.thanosRulerSpec.labels",
}

// checkKubePrometheusStackValues: the values example for
// kube-prometheus-stack sets only keys the chart has; the shards select the
// node-level PrometheusRule and the ruler the global one (by the labels the
// kustomize component gives them), the chart's own rule selector is off in
// both, and the ruler has a Query endpoint and external labels, the shards
// external labels and a sidecar.
func checkKubePrometheusStackValues(t *testing.T, b block) {
	t.Helper()
	var values map[string]any
	if err := yaml.Unmarshal([]byte(b.text), &values); err != nil {
		t.Fatalf("%s: %v", b.where(), err)
	}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			if !kubePrometheusStackKeys[key] {
				t.Errorf("%s: %s is not a kube-prometheus-stack value this example may set", b.where(), key)
				continue
			}
			if sub, ok := v.(map[string]any); ok && !slices.Contains(kubePrometheusStackOpaque, key) {
				walk(key, sub)
			}
		}
	}
	walk("", values)
	get := func(path string) any {
		var cur any = values
		for _, k := range strings.Split(path, ".") {
			m, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = m[k]
		}
		return cur
	}
	for layer, spec := range map[string]string{"shard": "prometheus.prometheusSpec", "global": "thanosRuler.thanosRulerSpec"} {
		rule, err := os.ReadFile("deploy/kustomize/components/prometheus-operator-sharded-rules/prometheusrule-" + layer + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(rule), "gpu-pool-exporter/rules-layer: "+layer) {
			t.Errorf("prometheusrule-%s.yaml has no rules-layer: %s label", layer, layer)
		}
		if got := get(spec + ".ruleSelector.matchLabels"); !reflect.DeepEqual(got, map[string]any{"gpu-pool-exporter/rules-layer": layer}) {
			t.Errorf("%s: %s.ruleSelector.matchLabels is %v, want only gpu-pool-exporter/rules-layer: %s", b.where(), spec, got, layer)
		}
		if get(spec+".ruleSelectorNilUsesHelmValues") != false {
			t.Errorf("%s: %s.ruleSelectorNilUsesHelmValues must be false", b.where(), spec)
		}
	}
	if get("thanosRuler.enabled") != true {
		t.Errorf("%s: thanosRuler.enabled is not true", b.where())
	}
	for _, path := range []string{"thanosRuler.thanosRulerSpec.queryEndpoints", "thanosRuler.thanosRulerSpec.labels", "prometheus.prometheusSpec.externalLabels", "prometheus.prometheusSpec.thanos"} {
		if v := get(path); v == nil || reflect.ValueOf(v).Len() == 0 {
			t.Errorf("%s: %s is empty", b.where(), path)
		}
	}
}

func checkRuleFiles(t *testing.T, b block) {
	t.Helper()
	for _, l := range strings.Split(b.text, "\n") {
		l = strings.TrimSpace(l)
		if f, ok := strings.CutPrefix(l, "- "); ok {
			if _, err := os.Stat(filepath.Join("alerts", filepath.Base(f))); err != nil {
				t.Errorf("%s: rule file %s is not one alerts/ ships", b.where(), f)
			}
		}
	}
}

// podLabelsRuleTest is a promtool test of docs/pod-mapping.md's recording
// rule: train-0 and train-1 of app train, chat-0 of app chat, and
// kube_pod_labels from two kube-state-metrics replicas, which must not
// count twice.
const podLabelsRuleTest = `rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'gpu_container_memory_used_bytes{namespace="ml", pod="train-0", container="c", node="n1", uuid="GPU-a", gpu="0", gpu_instance=""}'
        values: '1000x5'
      - series: 'gpu_container_memory_used_bytes{namespace="ml", pod="train-1", container="c", node="n1", uuid="GPU-b", gpu="1", gpu_instance=""}'
        values: '500x5'
      - series: 'gpu_container_memory_used_bytes{namespace="web", pod="chat-0", container="c", node="n2", uuid="GPU-c", gpu="0", gpu_instance=""}'
        values: '200x5'
      - series: 'kube_pod_labels{namespace="ml", pod="train-0", label_app_kubernetes_io_name="train", instance="ksm-0"}'
        values: '1x5'
      - series: 'kube_pod_labels{namespace="ml", pod="train-0", label_app_kubernetes_io_name="train", instance="ksm-1"}'
        values: '1x5'
      - series: 'kube_pod_labels{namespace="ml", pod="train-1", label_app_kubernetes_io_name="train", instance="ksm-0"}'
        values: '1x5'
      - series: 'kube_pod_labels{namespace="web", pod="chat-0", label_app_kubernetes_io_name="chat", instance="ksm-0"}'
        values: '1x5'
      - series: 'kube_pod_labels{namespace="web", pod="idle-0", label_app_kubernetes_io_name="idle", instance="ksm-0"}'
        values: '1x5'
    promql_expr_test:
      - expr: label_app_kubernetes_io_name:gpu_container_memory_used_bytes:sum
        eval_time: 3m
        exp_samples:
          - labels: 'label_app_kubernetes_io_name:gpu_container_memory_used_bytes:sum{label_app_kubernetes_io_name="train"}'
            value: 1500
          - labels: 'label_app_kubernetes_io_name:gpu_container_memory_used_bytes:sum{label_app_kubernetes_io_name="chat"}'
            value: 200
`

// checkPodLabelsRule runs docs/pod-mapping.md's recording rule in promtool
// (Debian's, Prometheus 2.42) against podLabelsRuleTest.
func checkPodLabelsRule(t *testing.T, b block) {
	t.Helper()
	pt, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: promtool not on PATH", b.where())
		}
		t.Logf("%s: promtool not on PATH: the rule is not run", b.where())
		return
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), []byte(b.text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "test.yml"), []byte(podLabelsRuleTest), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(pt, "test", "rules", "test.yml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: promtool test rules: %v\n%s", b.where(), err, out)
	}
}

// alertmanagerRoute is the part of an Alertmanager configuration the docs'
// route example uses.
type alertmanagerRoute struct {
	Receiver string               `yaml:"receiver"`
	Matchers []string             `yaml:"matchers"`
	Routes   []*alertmanagerRoute `yaml:"routes"`
}

// routeMatcherRE is one equality matcher of a route: label="value".
var routeMatcherRE = regexp.MustCompile(`^([a-z_]+)="([^"]*)"$`)

// checkNVSentinelPolicy: NVSentinel's kubernetes-object-monitor values
// parse, watch Nodes, and the predicate reads the exporter's condition.
func checkNVSentinelPolicy(t *testing.T, b block) {
	t.Helper()
	var v struct {
		KOM struct {
			Policies []struct {
				Name     string `yaml:"name"`
				Enabled  bool   `yaml:"enabled"`
				Resource struct {
					Group   string `yaml:"group"`
					Version string `yaml:"version"`
					Kind    string `yaml:"kind"`
				} `yaml:"resource"`
				Predicate struct {
					Expression string `yaml:"expression"`
				} `yaml:"predicate"`
				NodeAssociation struct {
					Expression string `yaml:"expression"`
				} `yaml:"nodeAssociation"`
				HealthEvent map[string]any `yaml:"healthEvent"`
			} `yaml:"policies"`
		} `yaml:"kubernetes-object-monitor"`
	}
	dec := yaml.NewDecoder(strings.NewReader(b.text))
	dec.KnownFields(true)
	if err := dec.Decode(&v); err != nil || len(v.KOM.Policies) != 1 {
		t.Fatalf("%s: not NVSentinel's kubernetes-object-monitor values with one policy: %v", b.where(), err)
	}
	p := v.KOM.Policies[0]
	if !p.Enabled || p.Resource.Kind != "Node" || p.Resource.Version != "v1" || !strings.Contains(p.Predicate.Expression, `c.type == "`+nodecondition.DefaultType+`" && c.status == "True"`) {
		t.Errorf("%s: the policy does not watch Nodes for %s True: %+v", b.where(), nodecondition.DefaultType, p)
	}
}

// checkRemediatorsBlock: a remediators list of the docs is one
// alerts.ParseRemediators takes, and the rules file generated with it
// parses.
func checkRemediatorsBlock(t *testing.T, b block) {
	t.Helper()
	r, err := alerts.ParseRemediators([]byte(b.text))
	if err != nil {
		t.Fatalf("%s: %v", b.where(), err)
	}
	src, err := alerts.WithRemediators(alerts.RulesYAML, r)
	if err != nil {
		t.Fatalf("%s: %v", b.where(), err)
	}
	if _, err := alerts.ParseRules(src); err != nil {
		t.Fatalf("%s: the rules file with these remediators: %v", b.where(), err)
	}
}

// checkAlertmanagerRoute: the route example parses, names only receivers it
// defines, and matches only on namespace, severity and remediator, the
// labels whose meaning the vanilla and GMP rules share.
func checkAlertmanagerRoute(t *testing.T, b block) {
	t.Helper()
	var cfg struct {
		Route     *alertmanagerRoute `yaml:"route"`
		Receivers []struct {
			Name string `yaml:"name"`
		} `yaml:"receivers"`
	}
	dec := yaml.NewDecoder(strings.NewReader(b.text))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil || cfg.Route == nil {
		t.Fatalf("%s: not an Alertmanager route: %v", b.where(), err)
	}
	receivers := map[string]bool{}
	for _, r := range cfg.Receivers {
		receivers[r.Name] = true
	}
	var walk func(r *alertmanagerRoute)
	walk = func(r *alertmanagerRoute) {
		if !receivers[r.Receiver] {
			t.Errorf("%s: route to receiver %q, which the example does not define", b.where(), r.Receiver)
		}
		for _, m := range r.Matchers {
			sub := routeMatcherRE.FindStringSubmatch(m)
			if sub == nil || (sub[1] != "namespace" && sub[1] != "severity" && sub[1] != "remediator") {
				t.Errorf("%s: matcher %q: want namespace=\"...\", severity=\"...\" or remediator=\"...\"", b.where(), m)
			}
		}
		for _, c := range r.Routes {
			walk(c)
		}
	}
	walk(cfg.Route)
}
