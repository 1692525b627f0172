package deploy_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/alerts"
)

// remediatorsGroup is the gpu-pool-exporter.remediators group of a rules
// object's spec (or of a rules file), as YAML decodes it.
func remediatorsGroup(t *testing.T, where string, spec []byte) any {
	t.Helper()
	var f struct {
		Groups []map[string]any `json:"groups"`
	}
	if err := yaml.Unmarshal(spec, &f); err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	for _, g := range f.Groups {
		if g["name"] == "gpu-pool-exporter.remediators" {
			return g
		}
	}
	t.Fatalf("%s: no group gpu-pool-exporter.remediators", where)
	return nil
}

// renderRules renders the chart's PrometheusRule and ClusterRules with
// the values file and returns their specs by kind.
func renderRules(t *testing.T, values string) map[string][]byte {
	t.Helper()
	helm := tool(t, "helm", installHelm)
	out, errOut, err := helmCmd(t, helm, "template", release, chartDir, "--namespace", namespace, "-f", values,
		"--set", "prometheusRule.enabled=true", "--set", "gmpRules.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, errOut)
	}
	specs := map[string][]byte{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var o struct {
			Kind string         `json:"kind"`
			Spec map[string]any `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil || (o.Kind != "PrometheusRule" && o.Kind != "ClusterRules") {
			continue
		}
		b, err := yaml.Marshal(o.Spec)
		if err != nil {
			t.Fatal(err)
		}
		specs[o.Kind] = b
	}
	if len(specs) != 2 {
		t.Fatalf("rendered %d of PrometheusRule and ClusterRules", len(specs))
	}
	return specs
}

// The chart's remediators value writes the rules' remediators group as
// make generate does (alerts.Remediators.RemediatorsGroup): the shipped
// list gives the shipped group, another list the group the generator
// writes for it, in PrometheusRule and GMP's ClusterRules alike; a bad
// name fails the install with what is wrong.
func TestChartRemediators(t *testing.T) {
	dir := t.TempDir()
	shipped, err := os.ReadFile(filepath.Join(repoRoot, "alerts", alerts.RemediatorsFileName))
	if err != nil {
		t.Fatal(err)
	}
	custom := []byte(`remediators:
  - name: my-health-checker
    conditions: [MyGPUFault, example.com/GPUBroken]
    taints: [example.com/gpu-quarantine]
    labels: {example.com/gpu-state: [broken, repairing]}
  - name: gke
    conditions: [XidCriticalError]
  - name: dra
    deviceTaints: [gpu.nvidia.com/xid]
`)
	for _, tc := range []struct {
		name string
		list []byte
	}{{"shipped", shipped}, {"custom", custom}} {
		t.Run(tc.name, func(t *testing.T) {
			values := filepath.Join(dir, tc.name+".yaml")
			if err := os.WriteFile(values, tc.list, 0o600); err != nil {
				t.Fatal(err)
			}
			r, err := alerts.ParseRemediators(tc.list)
			if err != nil {
				t.Fatal(err)
			}
			want, err := alerts.WithRemediators(alerts.RulesYAML, r)
			if err != nil {
				t.Fatal(err)
			}
			wantGroup := remediatorsGroup(t, "the generator's", want)
			for kind, spec := range renderRules(t, values) {
				if got := remediatorsGroup(t, kind, spec); !reflect.DeepEqual(got, wantGroup) {
					gy, _ := yaml.Marshal(got)
					wy, _ := yaml.Marshal(wantGroup)
					t.Errorf("%s: the chart's remediators group differs from the generator's:\nchart:\n%s\ngenerator:\n%s", kind, gy, wy)
				}
			}
		})
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("remediators: [{name: \"two words\", conditions: [X]}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	helm := tool(t, "helm", installHelm)
	_, errOut, err := helmCmd(t, helm, "template", release, chartDir, "-f", bad, "--set", "prometheusRule.enabled=true")
	if err == nil || !strings.Contains(string(errOut), `remediators[0].name "two words"`) {
		t.Errorf("a remediator named \"two words\": %v\n%s", err, errOut)
	}
}
