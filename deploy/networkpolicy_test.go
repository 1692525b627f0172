package deploy_test

import (
	"net"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The NetworkPolicy is the first line of defence: only the scraper reaches
// the metrics port, and the kubelet still reaches the probe port. Each
// profile is checked by asking the rendered policy, with Kubernetes'
// NetworkPolicy semantics (policyAdmits), who gets in.

// peer is a client of the exporter's pod as a NetworkPolicy sees it.
type peer struct {
	what      string
	namespace string            // "" with fromNode or ip alone
	nsLabels  map[string]string // its namespace's labels
	podLabels map[string]string
	ip        string
	fromNode  bool // the pod's own node: the kubelet, or a hostNetwork pod
}

func newPodPeer(what, ns string, podLabels map[string]string, ip string) peer {
	return peer{what: what, namespace: ns, nsLabels: map[string]string{"kubernetes.io/metadata.name": ns}, podLabels: podLabels, ip: ip}
}

// policyAdmits: with the exporter's pod selected by np (in namespace
// policyNS, container ports ports), p's connection to port is admitted
// (Kubernetes' NetworkPolicy semantics: traffic from the pod's own node is
// always admitted; else a rule must name the port, or no ports, and a peer
// must match: namespaceSelector and podSelector together, either alone
// (podSelector alone: the policy's namespace), or an ipBlock).
func policyAdmits(t *testing.T, np networkingv1.NetworkPolicy, ports []corev1.ContainerPort, port string, p peer) bool {
	t.Helper()
	if p.fromNode {
		return true
	}
	portNumber := map[string]int32{}
	for _, cp := range ports {
		portNumber[cp.Name] = cp.ContainerPort
	}
	selects := func(sel *metav1.LabelSelector, set map[string]string) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatalf("selector %v: %v", sel, err)
		}
		return s.Matches(labels.Set(set))
	}
	for _, rule := range np.Spec.Ingress {
		portOK := len(rule.Ports) == 0
		for _, rp := range rule.Ports {
			if rp.Port == nil || rp.Port.String() == port || (rp.Port.IntValue() != 0 && int32(rp.Port.IntValue()) == portNumber[port]) {
				portOK = true
			}
		}
		if !portOK {
			continue
		}
		if len(rule.From) == 0 {
			return true
		}
		for _, f := range rule.From {
			switch {
			case f.IPBlock != nil:
				_, cidr, err := net.ParseCIDR(f.IPBlock.CIDR)
				if err != nil {
					t.Fatalf("ipBlock %q: %v", f.IPBlock.CIDR, err)
				}
				ip := net.ParseIP(p.ip)
				in := ip != nil && cidr.Contains(ip)
				for _, ex := range f.IPBlock.Except {
					if _, e, err := net.ParseCIDR(ex); err == nil && ip != nil && e.Contains(ip) {
						in = false
					}
				}
				if in {
					return true
				}
			case p.namespace == "":
			case f.NamespaceSelector != nil && f.PodSelector != nil:
				if selects(f.NamespaceSelector, p.nsLabels) && selects(f.PodSelector, p.podLabels) {
					return true
				}
			case f.NamespaceSelector != nil:
				if selects(f.NamespaceSelector, p.nsLabels) {
					return true
				}
			case f.PodSelector != nil:
				if p.namespace == np.Namespace && selects(f.PodSelector, p.podLabels) {
					return true
				}
			}
		}
	}
	return false
}

// The clients every profile is asked about.
var (
	gmpCollector = newPodPeer("GKE Managed Prometheus' collector", "gmp-system",
		map[string]string{"app.kubernetes.io/name": "collector", "app": "managed-prometheus-collector"}, "10.8.0.5")
	kpsPrometheus = newPodPeer("kube-prometheus-stack's Prometheus", "monitoring",
		map[string]string{"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/instance": "kube-prometheus-stack-prometheus",
			"prometheus": "kube-prometheus-stack-prometheus", "operator.prometheus.io/name": "kube-prometheus-stack-prometheus"}, "10.8.1.7")
	grafanaInMonitoring = newPodPeer("Grafana in monitoring", "monitoring", map[string]string{"app.kubernetes.io/name": "grafana"}, "10.8.1.9")
	prometheusElsewhere = newPodPeer("a pod labelled prometheus in a tenant's namespace", "team-a", map[string]string{"app.kubernetes.io/name": "prometheus"}, "10.8.2.3")
	tenantPod           = newPodPeer("a tenant's pod", "team-a", map[string]string{"app": "notebook"}, "10.8.2.4")
	kubelet             = peer{what: "the kubelet (from the pod's node)", fromNode: true}
	otherNode           = peer{what: "another node's kubelet address", ip: "10.0.5.1"}
)

// checkNetworkPolicy: the policy selects the exporter's pods, names ports
// the pod has, admits want and no one else to the metrics port, admits
// the kubelet to the probe port that the DaemonSet's probes use (and
// probeFrom's peers), and no pod of the cluster to the probe port.
func checkNetworkPolicy(t *testing.T, m *manifests, want peer, probeFrom ...peer) {
	t.Helper()
	if len(m.networkPolicies) != 1 {
		t.Fatalf("%s: %d NetworkPolicies, want 1", m.name, len(m.networkPolicies))
	}
	np := m.networkPolicies[0]
	ds := m.daemonSet(t)
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatalf("%s: podSelector: %v", m.name, err)
	}
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("%s: NetworkPolicy podSelector %v does not select the exporter's pods %v", m.name, np.Spec.PodSelector, ds.Spec.Template.Labels)
	}
	if np.Namespace != ds.Namespace {
		t.Errorf("%s: NetworkPolicy in namespace %q, DaemonSet in %q", m.name, np.Namespace, ds.Namespace)
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("%s: policyTypes %v, want [Ingress]", m.name, np.Spec.PolicyTypes)
	}
	c := ds.Spec.Template.Spec.Containers[0]
	ports := map[string]bool{}
	for _, p := range c.Ports {
		ports[p.Name] = true
	}
	for i, r := range np.Spec.Ingress {
		for _, p := range r.Ports {
			if p.Port == nil || !ports[p.Port.String()] || p.Protocol == nil || *p.Protocol != corev1.ProtocolTCP {
				t.Errorf("%s: ingress rule %d port %+v is not a TCP port of the pod (%v)", m.name, i, p, ports)
			}
		}
	}
	// The kubelet's probes use the probe port, which the policy leaves to
	// the node.
	for what, pr := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Port.String() != "probe" {
			t.Errorf("%s: %s probe %+v does not ask the probe port", m.name, what, pr)
		}
	}
	everyone := []peer{gmpCollector, kpsPrometheus, grafanaInMonitoring, prometheusElsewhere, tenantPod, otherNode}
	for _, p := range everyone {
		if got, wantIn := policyAdmits(t, np, c.Ports, "metrics", p), p.what == want.what; got != wantIn {
			t.Errorf("%s: %s admitted to the metrics port: %v, want %v", m.name, p.what, got, wantIn)
		}
		wantProbe := false
		for _, x := range probeFrom {
			wantProbe = wantProbe || x.what == p.what
		}
		if got := policyAdmits(t, np, c.Ports, "probe", p); got != wantProbe {
			t.Errorf("%s: %s admitted to the probe port: %v, want %v", m.name, p.what, got, wantProbe)
		}
	}
	if !policyAdmits(t, np, c.Ports, "probe", kubelet) {
		t.Errorf("%s: the kubelet's probes do not reach the probe port", m.name)
	}
}

func TestNetworkPolicyHelm(t *testing.T) {
	helm := tool(t, "helm", installHelm)
	render := func(args ...string) (*manifests, string, error) {
		all := []string{"template", release, chartDir, "--namespace", namespace}
		for i := 0; i < len(args); i++ {
			if args[i] == "-f" {
				all = append(all, "-f", args[i+1])
				i++
				continue
			}
			all = append(all, "--set", args[i])
		}
		out, errOut, err := helmCmd(t, helm, all...)
		if err != nil {
			return nil, string(errOut), err
		}
		return decodeManifests(t, "helm "+strings.Join(args, ","), out), "", nil
	}
	m, _, err := render()
	if err != nil {
		t.Fatal(err)
	}
	if len(m.networkPolicies) != 0 {
		t.Errorf("a NetworkPolicy by default: it is optional")
	}
	for _, tc := range []struct {
		name      string
		args      []string
		scraper   peer
		probeFrom []peer
	}{
		{"kube-prometheus-stack (the default profile)", []string{"networkPolicy.enabled=true"}, kpsPrometheus, nil},
		{"kube-prometheus-stack with a node CIDR for the probes", []string{"networkPolicy.enabled=true", "networkPolicy.probeFrom[0].ipBlock.cidr=10.0.0.0/16"}, kpsPrometheus, []peer{otherNode}},
		{"GKE Managed Prometheus (values-gke.yaml)", []string{"-f", chartDir + "/values-gke.yaml", "networkPolicy.enabled=true"}, gmpCollector, nil},
		{"GKE Managed Prometheus by name", []string{"networkPolicy.enabled=true", "networkPolicy.profile=gke-managed-prometheus"}, gmpCollector, nil},
		{"custom", []string{"networkPolicy.enabled=true", "networkPolicy.profile=custom",
			"networkPolicy.from[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=gmp-system",
			"networkPolicy.from[0].podSelector.matchLabels.app\\.kubernetes\\.io/name=collector"}, gmpCollector, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, errOut, err := render(tc.args...)
			if err != nil {
				t.Fatalf("%v: %s", err, errOut)
			}
			checkNetworkPolicy(t, m, tc.scraper, tc.probeFrom...)
		})
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"networkPolicy.enabled=true", "networkPolicy.profile=custom"}, "networkPolicy.from to name the scraper"},
		{[]string{"networkPolicy.enabled=true", "networkPolicy.profile=gmp"}, "want kube-prometheus-stack, gke-managed-prometheus or custom"},
	} {
		if _, errOut, err := render(tc.args...); err == nil || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: err %v, %s; want an error saying %q", tc.args, err, errOut, tc.want)
		}
	}
}

func TestNetworkPolicyKustomize(t *testing.T) {
	for _, tc := range []struct {
		dir     string
		profile profile
		scraper peer
	}{
		{"testdata/kustomize-network-policy", gke, gmpCollector},
		{"testdata/kustomize-network-policy-kube-prometheus-stack", gpuOperator, kpsPrometheus},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			m := decodeManifests(t, tc.dir, kustomizeBuild(t, tc.dir))
			checkDaemonSet(t, m.name, m.daemonSet(t), tc.profile)
			checkNetworkPolicy(t, m, tc.scraper)
		})
	}
}
