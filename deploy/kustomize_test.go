package deploy_test

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// kustomizeBuild renders a kustomization the way `kubectl apply -k` does,
// with the kustomize library (no binary, nothing downloaded).
func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return out
}

var kustomizeCases = []struct {
	dir     string
	profile profile
	// The Helm values files that must render the same pod.
	helmValues []string
	check      func(t *testing.T, m *manifests)
}{
	{
		dir:     "kustomize/base",
		profile: generic,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 0)
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 0)
		},
	},
	{
		dir:        "kustomize/overlays/gke",
		profile:    gke,
		helmValues: []string{chartDir + "/values-gke.yaml"},
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 1)
			wantCount(t, m, "ClusterRules", len(m.clusterRules), 1)
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 0)
		},
	},
	{
		dir:        "kustomize/overlays/gpu-operator",
		profile:    gpuOperator,
		helmValues: []string{chartDir + "/values-gpu-operator.yaml"},
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 1)
			wantCount(t, m, "PrometheusRule", len(m.promRules), 1)
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 0)
		},
	},
	{
		// The compat component (components/dcgm-exporter-compat) on the
		// Prometheus Operator overlay: the flag, and the chart's scrape shape
		// for it (honorLabels false, gpu_*'s holder labels restored).
		dir:        "testdata/kustomize-compat-gpu-operator",
		profile:    gpuOperator,
		helmValues: []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-compat.yaml"},
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 1)
			checkCompatArg(t, m)
			checkSameServiceMonitor(t, m, []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-compat.yaml"})
		},
	},
	{
		// The node-condition component on the Prometheus Operator overlay:
		// the flag, the token, and the chart's ClusterRole to patch
		// nodes/status alone.
		dir:        "testdata/kustomize-node-condition-gpu-operator",
		profile:    gpuOperator,
		helmValues: []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-node-condition.yaml"},
		check: func(t *testing.T, m *manifests) {
			if args := m.daemonSet(t).Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--node-condition") {
				t.Errorf("%s: exporter args %v lack --node-condition", m.name, args)
			}
			wantCount(t, m, "ClusterRole", len(m.clusterRoles), 1)
			checkPodReader(t, m)
		},
	},
	{
		// Both API components: one ClusterRole each, the token once.
		dir:        "testdata/kustomize-dra-gpu-operator",
		profile:    gpuOperator,
		helmValues: []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-dra.yaml"},
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ClusterRole", len(m.clusterRoles), 2)
			checkPodReader(t, m)
		},
	},
	{
		dir:        "testdata/kustomize-compat-gke",
		profile:    gke,
		helmValues: []string{chartDir + "/values-gke.yaml", "testdata/values-compat.yaml"},
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 1)
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 0)
			checkCompatArg(t, m)
		},
	},
}

// checkCompatArg: the exporter serves the compatibility families.
func checkCompatArg(t *testing.T, m *manifests) {
	t.Helper()
	if args := m.daemonSet(t).Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--compat.dcgm-exporter") {
		t.Errorf("%s: exporter args %v lack --compat.dcgm-exporter", m.name, args)
	}
}

// checkSameServiceMonitor renders the chart with values and compares the
// scrape shape of its ServiceMonitor (honorLabels, relabelings) with the
// kustomization's: the two must scrape alike.
func checkSameServiceMonitor(t *testing.T, m *manifests, values []string) {
	t.Helper()
	helm := tool(t, "helm", installHelm)
	args := append([]string{"template", release, chartDir, "--namespace", namespace}, valuesArgs(values...)...)
	out, errOut, err := helmCmd(t, helm, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, errOut)
	}
	h := decodeManifests(t, "helm", out)
	if len(h.serviceMonitors) != 1 || len(m.serviceMonitors) != 1 {
		t.Fatalf("%s: %d ServiceMonitors from kustomize, %d from the chart; want one each", m.name, len(m.serviceMonitors), len(h.serviceMonitors))
	}
	ke, he := m.serviceMonitors[0].Spec.Endpoints, h.serviceMonitors[0].Spec.Endpoints
	if len(ke) != 1 || len(he) != 1 {
		t.Fatalf("%s: %d ServiceMonitor endpoints from kustomize, %d from the chart; want one each", m.name, len(ke), len(he))
	}
	for _, c := range []struct {
		what           string
		kustomize, hlm any
	}{
		{"honorLabels", ke[0].HonorLabels, he[0].HonorLabels},
		{"metricRelabelings", ke[0].MetricRelabelConfigs, he[0].MetricRelabelConfigs},
		{"relabelings", ke[0].RelabelConfigs, he[0].RelabelConfigs},
	} {
		if !equality.Semantic.DeepEqual(c.kustomize, c.hlm) {
			t.Errorf("%s: ServiceMonitor %s differs from the Helm chart's:\nkustomize: %+v\nhelm:      %+v", m.name, c.what, c.kustomize, c.hlm)
		}
	}
}

func TestKustomize(t *testing.T) {
	rules, gmpRules := readRulesFile(t), readGMPRulesFile(t)
	for _, tc := range kustomizeCases {
		t.Run(tc.dir, func(t *testing.T) {
			m := decodeManifests(t, tc.dir, kustomizeBuild(t, tc.dir))
			ds := m.daemonSet(t)
			checkDaemonSet(t, m.name, ds, tc.profile)
			checkScrapeWiring(t, m, "http")
			checkRules(t, m, rules, gmpRules)
			wantCount(t, m, "ServiceAccount", len(m.serviceAccounts), 1)
			wantCount(t, m, "ResourceQuota", len(m.quotas), 1)
			if len(m.roles)+len(m.roleBindings) != 0 {
				t.Errorf("%s: RBAC rendered: the exporter needs none", m.name)
			}
			if ds.Spec.Template.Spec.ServiceAccountName != m.serviceAccounts[0].Name {
				t.Errorf("%s: DaemonSet runs as %q, not the ServiceAccount %q", m.name, ds.Spec.Template.Spec.ServiceAccountName, m.serviceAccounts[0].Name)
			}

			// One namespace, admitted at Pod Security's privileged level
			// (hostPath volumes; a privileged container on GKE).
			if len(m.namespaces) != 1 {
				t.Fatalf("%s: want one Namespace, got %d", m.name, len(m.namespaces))
			}
			ns := m.namespaces[0]
			if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
				t.Errorf("%s: Namespace %s lacks pod-security.kubernetes.io/enforce=privileged", m.name, ns.Name)
			}
			for key, doc := range m.raw {
				tm := metaOf(t, doc)
				clusterScoped := tm.Kind == "Namespace" || tm.Kind == "ClusterRules" || tm.Kind == "ClusterRole" || tm.Kind == "ClusterRoleBinding"
				switch {
				case clusterScoped && tm.Metadata.Namespace != "":
					t.Errorf("%s: cluster-scoped %s has namespace %q", m.name, key, tm.Metadata.Namespace)
				case !clusterScoped && tm.Metadata.Namespace != ns.Name:
					t.Errorf("%s: %s is in namespace %q, want %s", m.name, key, tm.Metadata.Namespace, ns.Name)
				}
			}
			if tc.check != nil {
				tc.check(t, m)
			}
			if tc.helmValues != nil {
				checkSamePod(t, tc.dir, ds, tc.helmValues)
			}
		})
	}
}

// checkSamePod renders the chart with the matching profile and compares what
// the pod runs with: the two ways of deploying must not drift apart. Labels,
// names and the order of lists are not compared.
func checkSamePod(t *testing.T, where string, kds *appsv1.DaemonSet, values []string) {
	t.Helper()
	helm := tool(t, "helm", installHelm)
	args := append([]string{"template", release, chartDir, "--namespace", namespace}, valuesArgs(values...)...)
	out, errOut, err := helmCmd(t, helm, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, errOut)
	}
	hds := decodeManifests(t, "helm", out).daemonSet(t)

	ks, hs := &kds.Spec.Template.Spec, &hds.Spec.Template.Spec
	kc, hc := ks.Containers[0], hs.Containers[0]
	byName := func(env []corev1.EnvVar) map[string]corev1.EnvVar {
		m := map[string]corev1.EnvVar{}
		for _, e := range env {
			m[e.Name] = e
		}
		return m
	}
	mountsByName := func(ms []corev1.VolumeMount) map[string]corev1.VolumeMount {
		m := map[string]corev1.VolumeMount{}
		for _, v := range ms {
			m[v.Name] = v
		}
		return m
	}
	volumesByName := func(vs []corev1.Volume) map[string]corev1.Volume {
		m := map[string]corev1.Volume{}
		for _, v := range vs {
			m[v.Name] = v
		}
		return m
	}
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	for _, c := range []struct {
		what           string
		kustomize, hlm any
	}{
		{"args", sorted(kc.Args), sorted(hc.Args)},
		{"env", byName(kc.Env), byName(hc.Env)},
		{"ports", kc.Ports, hc.Ports},
		{"volumeMounts", mountsByName(kc.VolumeMounts), mountsByName(hc.VolumeMounts)},
		{"volumes", volumesByName(ks.Volumes), volumesByName(hs.Volumes)},
		{"securityContext", kc.SecurityContext, hc.SecurityContext},
		{"resources", kc.Resources, hc.Resources},
		{"livenessProbe", kc.LivenessProbe, hc.LivenessProbe},
		{"readinessProbe", kc.ReadinessProbe, hc.ReadinessProbe},
		{"image", kc.Image, hc.Image},
		{"pod securityContext", ks.SecurityContext, hs.SecurityContext},
		{"tolerations", ks.Tolerations, hs.Tolerations},
		{"affinity", ks.Affinity, hs.Affinity},
		{"priorityClassName", ks.PriorityClassName, hs.PriorityClassName},
		{"runtimeClassName", ks.RuntimeClassName, hs.RuntimeClassName},
		{"updateStrategy", kds.Spec.UpdateStrategy, hds.Spec.UpdateStrategy},
	} {
		t.Run(c.what, func(t *testing.T) {
			if !equality.Semantic.DeepEqual(c.kustomize, c.hlm) {
				t.Errorf("%s: %s differs from the Helm chart's:\nkustomize: %+v\nhelm:      %+v", where, c.what, c.kustomize, c.hlm)
			}
		})
	}
}
