package deploy_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// matchesNode evaluates a required node affinity against a node's labels,
// as the scheduler and the DaemonSet controller do: terms are ORed, the
// expressions of a term ANDed.
func matchesNode(t *testing.T, a *corev1.Affinity, node map[string]string) bool {
	t.Helper()
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return true
	}
	ops := map[corev1.NodeSelectorOperator]selection.Operator{
		corev1.NodeSelectorOpIn: selection.In, corev1.NodeSelectorOpNotIn: selection.NotIn,
		corev1.NodeSelectorOpExists: selection.Exists, corev1.NodeSelectorOpDoesNotExist: selection.DoesNotExist,
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		sel := labels.NewSelector()
		for _, e := range term.MatchExpressions {
			op, ok := ops[e.Operator]
			if !ok {
				t.Fatalf("node affinity operator %s is not evaluated by this test", e.Operator)
			}
			r, err := labels.NewRequirement(e.Key, op, e.Values)
			if err != nil {
				t.Fatal(err)
			}
			sel = sel.Add(*r)
		}
		if sel.Matches(labels.Set(node)) {
			return true
		}
	}
	return false
}

// During a GPU Operator driver upgrade, k8s-driver-manager sets the
// operator's nvidia.com/gpu.deploy.<component> labels to
// paused-for-driver-upgrade before it unloads the kernel modules; an
// exporter that still holds /dev/nvidia* open keeps them loaded. During a
// MIG reconfiguration the MIG manager (mig-parted's k8s-mig-manager,
// pkg/mig/reconfigure: shutdownKubernetesGPUClients, maybeSetPaused) sets
// nvidia.com/gpu.deploy.{device-plugin,gpu-feature-discovery,dcgm-exporter,
// dcgm,nvsm} to paused-for-mig-change (a "false" stays "false") and
// nvidia.com/mig.config.state to pending, then resets the GPUs, which an
// open /dev/nvidia* can block; afterwards it sets them back to true and the
// state to success (or failed). The rendered DaemonSets must not run on
// such a node, and must on every other GPU node, the MIG manager's success
// and failure included.
func TestStepsAsideForDriverUpgrade(t *testing.T) {
	operatorNode := map[string]string{
		"nvidia.com/gpu.present":                        "true",
		"nvidia.com/gpu.deploy.device-plugin":           "true",
		"nvidia.com/gpu.deploy.dcgm-exporter":           "true",
		"nvidia.com/gpu.deploy.container-toolkit":       "true",
		"nvidia.com/gpu.deploy.gpu-feature-discovery":   "true",
		"nvidia.com/gpu.deploy.operator-validator":      "true",
		"nvidia.com/gpu.deploy.driver":                  "true",
		"nvidia.com/gpu-driver-upgrade-state":           "upgrade-done",
		"feature.node.kubernetes.io/pci-10de.present":   "true",
		"nvidia.com/gpu.deploy.dcgm":                    "true",
		"nvidia.com/gpu.deploy.mig-manager":             "true",
		"nvidia.com/gpu.deploy.node-status-exporter":    "true",
		"nvidia.com/gpu.deploy.sandbox-device-plugin":   "false",
		"nvidia.com/gpu.deploy.vgpu-device-manager":     "false",
		"nvidia.com/gpu.deploy.sandbox-validator":       "false",
		"nvidia.com/gpu.deploy.vgpu-manager":            "false",
		"nvidia.com/gpu.deploy.kata-manager":            "false",
		"nvidia.com/gpu.deploy.cc-manager":              "false",
		"nvidia.com/gpu.deploy.vfio-manager":            "false",
		"nvidia.com/gpu.deploy.nvsm":                    "",
		"nvidia.com/gpu.deploy.dra-driver":              "",
		"nvidia.com/gpu.deploy.client":                  "",
		"nvidia.com/gpu.deploy.dcgm-exporter-dra":       "",
		"nvidia.com/gpu.deploy.dcgm-dra":                "",
		"nvidia.com/gpu.deploy.dra-validator":           "",
		"nvidia.com/gpu.deploy.sandbox-workload-config": "",
	}
	// What the driver manager's evictAllGPUOperatorComponents writes:
	// "true" becomes paused-for-driver-upgrade, "false" stays.
	upgrading := map[string]string{}
	for k, v := range operatorNode {
		if v == "true" && k != "nvidia.com/gpu.present" && k != "nvidia.com/gpu.deploy.driver" {
			v = "paused-for-driver-upgrade"
		}
		upgrading[k] = v
	}
	// An operator with dcgm-exporter turned off: its label is "false".
	noDCGMExporter := map[string]string{}
	for k, v := range upgrading {
		noDCGMExporter[k] = v
	}
	noDCGMExporter["nvidia.com/gpu.deploy.dcgm-exporter"] = "false"
	// What the MIG manager writes before it changes the MIG layout, and
	// after: the labels it pauses, and the state label.
	migState := func(state string, paused bool) map[string]string {
		out := map[string]string{}
		for k, v := range operatorNode {
			out[k] = v
		}
		for _, c := range []string{"device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm"} {
			k := "nvidia.com/gpu.deploy." + c
			if paused && out[k] != "false" {
				out[k] = "paused-for-mig-change"
			} else if !paused && out[k] != "false" {
				out[k] = "true"
			}
		}
		out["nvidia.com/mig.config"] = "all-1g.10gb"
		out["nvidia.com/mig.config.state"] = state
		return out
	}
	migNoDCGMExporter := migState("pending", true)
	migNoDCGMExporter["nvidia.com/gpu.deploy.dcgm-exporter"] = "false"
	nodes := []struct {
		name   string
		labels map[string]string
		run    bool
	}{
		{"GPU Operator node", operatorNode, true},
		{"GPU Operator node during a driver upgrade", upgrading, false},
		{"driver upgrade, operator without dcgm-exporter", noDCGMExporter, false},
		{"GPU Operator node during a MIG change", migState("pending", true), false},
		{"MIG change, operator without dcgm-exporter", migNoDCGMExporter, false},
		{"GPU Operator node after a MIG change", migState("success", false), true},
		{"GPU Operator node after a failed MIG change", migState("failed", false), true},
		{"GPU node without the operator", map[string]string{"nvidia.com/gpu.present": "true"}, true},
		{"GKE GPU node", map[string]string{"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, true},
		{"CPU node", map[string]string{"kubernetes.io/os": "linux"}, false},
	}

	helm := tool(t, "helm", installHelm)
	renders := map[string][]byte{}
	for _, values := range [][]string{nil, {chartDir + "/values-gpu-operator.yaml"}} {
		args := append([]string{"template", release, chartDir, "--namespace", namespace}, valuesArgs(values...)...)
		out, errOut, err := helmCmd(t, helm, args...)
		if err != nil {
			t.Fatalf("helm template %v: %v\n%s", values, err, errOut)
		}
		renders["helm "+labels.FormatLabels(map[string]string{"values": join(values)})] = out
	}
	for _, dir := range []string{"kustomize/base", "kustomize/overlays/gpu-operator"} {
		renders[dir] = kustomizeBuild(t, dir)
	}
	for name, out := range renders {
		ds := decodeManifests(t, name, out).daemonSet(t)
		for _, n := range nodes {
			t.Run(name+"/"+n.name, func(t *testing.T) {
				if got := matchesNode(t, ds.Spec.Template.Spec.Affinity, n.labels); got != n.run {
					t.Errorf("runs on the node: %v, want %v", got, n.run)
				}
			})
		}
	}
}

func join(s []string) string {
	out := "default"
	for _, x := range s {
		out += "+" + x
	}
	return out
}
