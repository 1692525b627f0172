package deploy_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

// The rules file is the single source of the shipped rules; the manifests
// carry copies because neither a chart nor a kustomization may read outside
// its directory. deploy/sync.sh refreshes them.
const rulesPath = "alerts/gpu-pool-exporter.rules.yml"

// gmpRulesPath is the rules file for GKE Managed Prometheus, generated from
// rulesPath (go run ./alerts/gmpgen, which deploy/sync.sh runs).
const gmpRulesPath = "alerts/gpu-pool-exporter.gmp.rules.yml"

func readGMPRulesFile(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, gmpRulesPath))
	if err != nil {
		t.Fatalf("%v (run deploy/sync.sh)", err)
	}
	if !bytes.Contains(b, []byte("exported_namespace")) {
		t.Fatalf("%s names no exported_namespace: it is not the GMP variant", gmpRulesPath)
	}
	return b
}

func readRulesFile(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rulesPath))
	if err != nil {
		t.Fatalf("the rules file is the source of every rule object: %v", err)
	}
	// A standard Prometheus rules file: groups of rules, nothing else.
	var f struct {
		Groups []struct {
			Name        string            `json:"name"`
			Interval    string            `json:"interval,omitempty"`
			QueryOffset string            `json:"query_offset,omitempty"`
			Limit       *int              `json:"limit,omitempty"`
			Labels      map[string]string `json:"labels,omitempty"`
			Rules       []struct {
				Record        string            `json:"record,omitempty"`
				Alert         string            `json:"alert,omitempty"`
				Expr          string            `json:"expr"`
				For           string            `json:"for,omitempty"`
				KeepFiringFor string            `json:"keep_firing_for,omitempty"`
				Labels        map[string]string `json:"labels,omitempty"`
				Annotations   map[string]string `json:"annotations,omitempty"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := strictUnmarshal(b, &f); err != nil {
		t.Fatalf("%s is not a Prometheus rules file: %v", rulesPath, err)
	}
	if len(f.Groups) == 0 {
		t.Fatalf("%s has no rule groups", rulesPath)
	}
	return b
}

// dashboardFiles lists the *.json files of dir, sorted; none if dir is absent.
func dashboardFiles(t *testing.T, dir string) []string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range matches {
		names = append(names, filepath.Base(m))
	}
	sort.Strings(names)
	return names
}

func TestCopiesInSync(t *testing.T) {
	const hint = " (edit alerts/ or dashboards/, then run deploy/sync.sh)"
	rules := readRulesFile(t)

	chartRules, err := os.ReadFile(filepath.Join(chartDir, "files/gpu-pool-exporter.rules.yml"))
	if err != nil || !bytes.Equal(chartRules, rules) {
		t.Errorf("%s/files/gpu-pool-exporter.rules.yml differs from %s%s", chartDir, rulesPath, hint)
	}
	gmpRules := readGMPRulesFile(t)
	chartGMP, err := os.ReadFile(filepath.Join(chartDir, "files/gpu-pool-exporter.gmp.rules.yml"))
	if err != nil || !bytes.Equal(chartGMP, gmpRules) {
		t.Errorf("%s/files/gpu-pool-exporter.gmp.rules.yml differs from %s%s", chartDir, gmpRulesPath, hint)
	}

	for _, l := range []string{"shard", "global", "gmp.shard", "gmp.global"} {
		name := "gpu-pool-exporter." + l + ".rules.yml"
		src, errS := os.ReadFile(filepath.Join(repoRoot, "alerts", name))
		cp, errC := os.ReadFile(filepath.Join(chartDir, "files", name))
		if errS != nil || errC != nil || !bytes.Equal(src, cp) {
			t.Errorf("%s/files/%s differs from alerts/%s%s", chartDir, name, name, hint)
		}
	}

	srcDir := filepath.Join(repoRoot, "dashboards")
	copyDir := filepath.Join(chartDir, "files/dashboards")
	src, cp := dashboardFiles(t, srcDir), dashboardFiles(t, copyDir)
	if !slices.Equal(src, cp) {
		t.Errorf("chart dashboards %v, dashboards/ has %v%s", cp, src, hint)
	}
	for _, name := range src {
		a, errA := os.ReadFile(filepath.Join(srcDir, name))
		b, errB := os.ReadFile(filepath.Join(copyDir, name))
		if err := errors.Join(errA, errB); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("%s/%s differs from dashboards/%s%s", copyDir, name, name, hint)
		}
	}

	// The kustomize rule objects: spec equal to the rules file.
	for _, f := range []string{
		"kustomize/components/prometheus-operator/prometheusrule.yaml",
		"kustomize/components/gke-managed-prometheus/clusterrules.yaml",
		"kustomize/components/prometheus-operator-sharded-rules/prometheusrule-shard.yaml",
		"kustomize/components/prometheus-operator-sharded-rules/prometheusrule-global.yaml",
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("%v%s", err, hint)
		}
		m := decodeManifests(t, f, b)
		if len(m.promRules)+len(m.clusterRules) != 1 {
			t.Errorf("%s: want one rule object", f)
		}
		checkRules(t, m, rules, gmpRules)
	}
}
