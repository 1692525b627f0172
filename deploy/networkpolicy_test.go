package deploy_test

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// checkNetworkPolicy: the policy selects the exporter's pods, admits only
// the listed peers to the metrics port, and names ports the pod has.
func checkNetworkPolicy(t *testing.T, m *manifests, wantPeerNamespace string) {
	t.Helper()
	if len(m.networkPolicies) != 1 {
		t.Fatalf("%s: %d NetworkPolicies, want 1", m.name, len(m.networkPolicies))
	}
	np := m.networkPolicies[0]
	ds := m.daemonSet(t)
	sel, err := metav1LabelSelector(np)
	if err != nil {
		t.Fatalf("%s: podSelector: %v", m.name, err)
	}
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("%s: NetworkPolicy podSelector %v does not select the exporter's pods %v", m.name, np.Spec.PodSelector, ds.Spec.Template.Labels)
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("%s: policyTypes %v, want [Ingress]", m.name, np.Spec.PolicyTypes)
	}
	ports := map[string]bool{}
	for _, p := range ds.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	metricsAdmitted := false
	for i, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Errorf("%s: ingress rule %d admits every peer", m.name, i)
		}
		for _, p := range r.Ports {
			if p.Port == nil || !ports[p.Port.String()] || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
				t.Errorf("%s: ingress rule %d port %+v is not a TCP port of the pod (%v)", m.name, i, p, ports)
			}
			if p.Port != nil && p.Port.String() == "metrics" {
				metricsAdmitted = true
				for _, peer := range r.From {
					if peer.NamespaceSelector == nil || peer.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != wantPeerNamespace || peer.PodSelector == nil {
						t.Errorf("%s: metrics peer %+v, want pods of namespace %s", m.name, peer, wantPeerNamespace)
					}
				}
			}
		}
	}
	if !metricsAdmitted {
		t.Errorf("%s: no rule admits the scraper to the metrics port", m.name)
	}
}

func metav1LabelSelector(np networkingv1.NetworkPolicy) (labels.Selector, error) {
	return metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
}

func TestNetworkPolicyHelm(t *testing.T) {
	helm := tool(t, "helm", installHelm)
	render := func(sets ...string) (*manifests, string, error) {
		args := []string{"template", release, chartDir, "--namespace", namespace}
		for _, s := range sets {
			args = append(args, "--set", s)
		}
		out, errOut, err := helmCmd(t, helm, args...)
		if err != nil {
			return nil, string(errOut), err
		}
		return decodeManifests(t, "helm "+strings.Join(sets, ","), out), "", nil
	}
	m, _, err := render()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.networkPolicies) != 0 {
		t.Errorf("a NetworkPolicy by default: it is optional")
	}
	m, errOut, err := render("networkPolicy.enabled=true")
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	checkNetworkPolicy(t, m, "monitoring")
	m, errOut, err = render("networkPolicy.enabled=true", "networkPolicy.probeFrom[0].ipBlock.cidr=10.0.0.0/8")
	if err != nil {
		t.Fatalf("%v: %s", err, errOut)
	}
	checkNetworkPolicy(t, m, "monitoring")
	if len(m.networkPolicies[0].Spec.Ingress) != 2 || m.networkPolicies[0].Spec.Ingress[1].Ports[0].Port.String() != "probe" {
		t.Errorf("probeFrom: ingress %+v, want a second rule for the probe port", m.networkPolicies[0].Spec.Ingress)
	}
	if _, errOut, err := render("networkPolicy.enabled=true", "networkPolicy.from=null"); err == nil || !strings.Contains(errOut, "networkPolicy.from must name the scraper") {
		t.Errorf("an empty networkPolicy.from: err %v, %s", err, errOut)
	}
}

func TestNetworkPolicyKustomize(t *testing.T) {
	dir := "testdata/kustomize-network-policy"
	m := decodeManifests(t, dir, kustomizeBuild(t, dir))
	checkDaemonSet(t, m.name, m.daemonSet(t), gke)
	checkNetworkPolicy(t, m, "gmp-system")
	if np := m.networkPolicies[0]; np.Namespace != m.daemonSet(t).Namespace {
		t.Errorf("NetworkPolicy in namespace %q, DaemonSet in %q", np.Namespace, m.daemonSet(t).Namespace)
	}
}
