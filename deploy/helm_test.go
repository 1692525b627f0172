package deploy_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	chartDir    = "helm/gpu-pool-exporter"
	release     = "gpu-pool-exporter"
	namespace   = "gpu-pool-exporter"
	installHelm = "go install helm.sh/helm/v4/cmd/helm@v4.3.2 (about 6 minutes on a cold cache), or ./scripts/install-tools.sh"
)

// helmCmd runs helm with its config, cache and data directories in a
// temporary directory, so that nothing on the machine (repositories,
// plugins, registry logins) changes what is rendered.
func helmCmd(t *testing.T, helm string, args ...string) (stdout, stderr []byte, err error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command(helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"),
	)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

func valuesArgs(files ...string) []string {
	var args []string
	for _, f := range files {
		args = append(args, "-f", f)
	}
	return args
}

type helmCase struct {
	name    string
	values  []string // values files, after the chart's values.yaml
	sets    []string // --set
	profile profile
	check   func(t *testing.T, m *manifests)
}

var helmCases = []helmCase{
	{
		name:    "default",
		profile: generic,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 0)
			wantCount(t, m, "PrometheusRule", len(m.promRules), 0)
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 0)
			wantCount(t, m, "Secret", len(m.secrets), 0)
		},
	},
	{
		name:    "gke",
		values:  []string{chartDir + "/values-gke.yaml"},
		profile: gke,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 1)
			wantCount(t, m, "ClusterRules", len(m.clusterRules), 1)
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 0)
			wantCount(t, m, "ResourceQuota", len(m.quotas), 1)
		},
	},
	{
		name:    "gpu-operator",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 1)
			wantCount(t, m, "PrometheusRule", len(m.promRules), 1)
			wantCount(t, m, "PodMonitoring", len(m.podMonitorings), 0)
		},
	},
	{
		name:    "gpu-operator-sharded-rules",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		sets:    []string{"prometheusRule.layer=split"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "PrometheusRule", len(m.promRules), 2)
			wantLayers(t, m, "PrometheusRule", m.promRules[0].ObjectMeta, m.promRules[1].ObjectMeta)
		},
	},
	{
		name:    "gke-sharded-rules",
		values:  []string{chartDir + "/values-gke.yaml"},
		sets:    []string{"gmpRules.layer=split"},
		profile: gke,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ClusterRules", len(m.clusterRules), 1)
			wantCount(t, m, "GlobalRules", len(m.globalRules), 1)
			if t.Failed() {
				return
			}
			wantLayers(t, m, "ClusterRules+GlobalRules", m.clusterRules[0].Metadata, m.globalRules[0].Metadata)
		},
	},
	{
		name:    "gpu-operator-podmonitor",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		sets:    []string{"serviceMonitor.enabled=false", "podMonitor.enabled=true"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "PodMonitor", len(m.podMonitors), 1)
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 0)
		},
	},
	{
		name:    "lean-with-dcgm-exporter-names",
		sets:    []string{"exporter.collectors.profile=lean", "exporter.collectors.groups.media=true", "exporter.collectors.groups.process=false", "exporter.collectors.groups.node_summary=false", "exporter.compatDCGMExporter=true"},
		profile: generic,
		check: func(t *testing.T, m *manifests) {
			args := m.daemonSet(t).Spec.Template.Spec.Containers[0].Args
			for _, want := range []string{"--collector.profile=lean", "--collector.media", "--no-collector.process", "--no-collector.node_summary", "--compat.dcgm-exporter"} {
				if !slices.Contains(args, want) {
					t.Errorf("%s: DaemonSet args %v lack %s", m.name, args, want)
				}
			}
		},
	},
	{
		// dcgm-exporter's scrape shape: the DCGM_FI_* families arrive with
		// exported_namespace/pod/container as from dcgm-exporter's chart;
		// gpu_* get theirs back, so the shipped rules work as they are.
		name:    "gpu-operator-dcgm-exporter-compat",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		sets:    []string{"exporter.compatDCGMExporter=true"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "ServiceMonitor", len(m.serviceMonitors), 1)
			for _, e := range m.serviceMonitors[0].Spec.Endpoints {
				if e.HonorLabels || !restoresHolderLabels(e.MetricRelabelConfigs) {
					t.Errorf("%s: ServiceMonitor honorLabels %v, relabelings %+v: want false, with gpu_*'s labels restored", m.name, e.HonorLabels, e.MetricRelabelConfigs)
				}
			}
		},
	},
	{
		// The time-sliced profile names nvidia.com/gpu.shared, as a
		// dcgm-exporter on such a cluster does; the release line is the
		// exporter's default unless set.
		name:    "gpu-operator-time-sliced-dcgm-exporter-compat",
		values:  []string{chartDir + "/values-gpu-operator.yaml", chartDir + "/values-time-sliced.yaml"},
		sets:    []string{"exporter.compatDCGMExporter=true", "exporter.compatRelease=4.8.2"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			args := m.daemonSet(t).Spec.Template.Spec.Containers[0].Args
			for _, want := range []string{"--compat.dcgm-exporter", "--compat.dcgm-exporter.nvidia-resource-names=nvidia.com/gpu.shared", "--compat.dcgm-exporter.release=4.8.2"} {
				if !slices.Contains(args, want) {
					t.Errorf("%s: DaemonSet args %v lack %s", m.name, args, want)
				}
			}
		},
	},
	{
		// GKE's device plugin names every device nvidia.com/gpu: nothing to
		// add; no release line unless set.
		name:    "gke-dcgm-exporter-compat",
		values:  []string{chartDir + "/values-gke.yaml"},
		sets:    []string{"exporter.compatDCGMExporter=true"},
		profile: gke,
		check: func(t *testing.T, m *manifests) {
			for _, a := range m.daemonSet(t).Spec.Template.Spec.Containers[0].Args {
				if strings.HasPrefix(a, "--compat.dcgm-exporter.nvidia-resource-names") || strings.HasPrefix(a, "--compat.dcgm-exporter.release") {
					t.Errorf("%s: DaemonSet arg %s", m.name, a)
				}
			}
		},
	},
	{
		name:    "gpu-operator-dcgm-exporter-compat-podmonitor",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		sets:    []string{"exporter.compatDCGMExporter=true", "serviceMonitor.enabled=false", "podMonitor.enabled=true", "podMonitor.metricRelabelings[0].action=labeldrop", "podMonitor.metricRelabelings[0].regex=UUID"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			wantCount(t, m, "PodMonitor", len(m.podMonitors), 1)
			for _, e := range m.podMonitors[0].Spec.PodMetricsEndpoints {
				if e.HonorLabels || !restoresHolderLabels(e.MetricRelabelConfigs) || e.MetricRelabelConfigs[len(e.MetricRelabelConfigs)-1].Regex != "UUID" {
					t.Errorf("%s: PodMonitor honorLabels %v, relabelings %+v: want false, gpu_*'s labels restored, then the user's", m.name, e.HonorLabels, e.MetricRelabelConfigs)
				}
			}
		},
	},
	{
		// A counters file from the values, in a ConfigMap of the chart's:
		// mounted, named by the flag, and the compatibility scrape shape.
		name:    "gpu-operator-dcgm-exporter-counters",
		values:  []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-compat-counters.yaml"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			checkCountersFile(t, m, release+"-dcgm-exporter-counters", "dcgm-metrics.csv")
			var found bool
			for _, cm := range m.configMaps {
				if cm.Name != release+"-dcgm-exporter-counters" {
					continue
				}
				found = true
				if !strings.Contains(cm.Data["dcgm-metrics.csv"], "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter,") {
					t.Errorf("%s: the ConfigMap holds %q, not the values' counters file", m.name, cm.Data["dcgm-metrics.csv"])
				}
			}
			if !found {
				t.Errorf("%s: no ConfigMap %s-dcgm-exporter-counters", m.name, release)
			}
		},
	},
	{
		// The GPU Operator's own ConfigMap (dcgmExporter.config.name).
		name:    "gpu-operator-dcgm-exporter-counters-existing",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		sets:    []string{"exporter.compatCounters.existingConfigMap=custom-dcgm-metrics"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			checkCountersFile(t, m, "custom-dcgm-metrics", "dcgm-metrics.csv")
		},
	},
	{
		// Pod labels and UIDs: the flags, the token and a ClusterRole to
		// read pods (checkPodReader checks its rules in every case).
		name:    "gpu-operator-dcgm-exporter-pod-labels",
		values:  []string{chartDir + "/values-gpu-operator.yaml"},
		sets:    []string{"exporter.compatKubernetes.enablePodLabels=true", "exporter.compatKubernetes.enablePodUID=true", "exporter.compatKubernetes.podLabelAllowlistRegex[0]=^app[.]kubernetes[.]io/"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			args := m.daemonSet(t).Spec.Template.Spec.Containers[0].Args
			for _, want := range []string{"--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-pod-labels", "--compat.dcgm-exporter.kubernetes-enable-pod-uid", `--compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex=^app[.]kubernetes[.]io/`} {
				if !slices.Contains(args, want) {
					t.Errorf("%s: exporter args %v lack %s", m.name, args, want)
				}
			}
			wantCount(t, m, "ClusterRole", len(m.clusterRoles), 1)
		},
	},
	{
		// DRA: the dcgm-exporter page's dra_* labels (no API), the
		// ResourceSlice watch and the node condition: their flags, the
		// token, and one ClusterRole each (checkPodReader).
		name:    "gpu-operator-dra-node-condition",
		values:  []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-node-condition.yaml"},
		sets:    []string{"exporter.compatKubernetes.enableDRA=true", "exporter.draResourceSlices.enabled=true", "exporter.nodeCondition.type=example.com/GPUFault"},
		profile: gpuOperator,
		check: func(t *testing.T, m *manifests) {
			args := m.daemonSet(t).Spec.Template.Spec.Containers[0].Args
			for _, want := range []string{"--compat.dcgm-exporter", "--compat.dcgm-exporter.kubernetes-enable-dra", "--kubernetes.resource-slices", "--node-condition", "--node-condition.type=example.com/GPUFault"} {
				if !slices.Contains(args, want) {
					t.Errorf("%s: exporter args %v lack %s", m.name, args, want)
				}
			}
			wantCount(t, m, "ClusterRole", len(m.clusterRoles), 2)
		},
	},
	{
		name:    "gpu-operator-secured",
		values:  []string{chartDir + "/values-gpu-operator.yaml", "testdata/values-secured.yaml"},
		profile: gpuOperator,
		check:   checkSecured,
	},
	{
		name:    "gke-secured",
		values:  []string{chartDir + "/values-gke.yaml", "testdata/values-secured.yaml"},
		sets:    []string{"serviceMonitor.enabled=false", "prometheusRule.enabled=false"},
		profile: gke,
		check:   checkSecured,
	},
}

// checkPodReader: the exporter's service account is granted what its
// flags call the API server for and nothing else, each as a ClusterRole
// bound to it (podmap/apiserver runs each with exactly these rules on a
// real API server): get, list and watch pods with pod labels or UIDs; get,
// list and watch resourceslices with --kubernetes.resource-slices; patch
// nodes/status with --node-condition. Its token is mounted when any is
// on; with none there is no ClusterRole.
func checkPodReader(t *testing.T, m *manifests) {
	t.Helper()
	ds := m.daemonSet(t)
	args := ds.Spec.Template.Spec.Containers[0].Args
	type grant struct{ group, resource, verbs string }
	var want []grant
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--compat.dcgm-exporter.kubernetes-enable-pod-") }) {
		want = append(want, grant{"", "pods", "get,list,watch"})
	}
	if slices.Contains(args, "--kubernetes.resource-slices") {
		want = append(want, grant{"resource.k8s.io", "resourceslices", "get,list,watch"})
	}
	if slices.Contains(args, "--node-condition") {
		want = append(want, grant{"", "nodes/status", "patch"})
	}
	if len(want) == 0 {
		if len(m.clusterRoles)+len(m.clusterBindings) != 0 {
			t.Errorf("%s: a ClusterRole without pod labels or UIDs, ResourceSlices or the node condition: the exporter calls no API", m.name)
		}
		return
	}
	if a := ds.Spec.Template.Spec.AutomountServiceAccountToken; a == nil || !*a {
		t.Errorf("%s: the API server is called (%v) without the service account token mounted", m.name, want)
	}
	if len(m.clusterRoles) != len(want) || len(m.clusterBindings) != len(want) {
		t.Fatalf("%s: %d ClusterRoles and %d bindings, want %d of each (%v)", m.name, len(m.clusterRoles), len(m.clusterBindings), len(want), want)
	}
	var got []grant
	for _, r := range m.clusterRoles {
		if len(r.Rules) != 1 || len(r.Rules[0].APIGroups) != 1 || len(r.Rules[0].Resources) != 1 {
			t.Errorf("%s: ClusterRole %s rules %+v: want one group and resource each", m.name, r.Name, r.Rules)
			continue
		}
		got = append(got, grant{r.Rules[0].APIGroups[0], r.Rules[0].Resources[0], strings.Join(r.Rules[0].Verbs, ",")})
		bound := false
		for _, b := range m.clusterBindings {
			if b.RoleRef.Name == r.Name && len(b.Subjects) == 1 && b.Subjects[0].Kind == "ServiceAccount" && b.Subjects[0].Name == ds.Spec.Template.Spec.ServiceAccountName && b.Subjects[0].Namespace == namespace {
				bound = true
			}
		}
		if !bound {
			t.Errorf("%s: ClusterRole %s is not bound to the exporter's service account alone", m.name, r.Name)
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s: ClusterRoles grant %v, want %v exactly", m.name, got, want)
			break
		}
	}
}

// checkCountersFile: the counters file's ConfigMap is mounted, the flag
// names the file in it, and the DCGM_FI_* families are served and scraped
// as with --compat.dcgm-exporter.
func checkCountersFile(t *testing.T, m *manifests, configMap, key string) {
	t.Helper()
	pod := m.daemonSet(t).Spec.Template.Spec
	c := pod.Containers[0]
	for _, want := range []string{"--compat.dcgm-exporter", "--compat.dcgm-exporter.collectors=/etc/gpu-pool-exporter/dcgm-exporter/" + key} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("%s: exporter args %v lack %s", m.name, c.Args, want)
		}
	}
	mounted := false
	for _, vm := range c.VolumeMounts {
		if vm.MountPath != "/etc/gpu-pool-exporter/dcgm-exporter" {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == configMap && len(v.ConfigMap.Items) == 1 && v.ConfigMap.Items[0].Key == key {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("%s: ConfigMap %s (key %s) is not mounted at /etc/gpu-pool-exporter/dcgm-exporter", m.name, configMap, key)
	}
	for _, e := range m.serviceMonitors[0].Spec.Endpoints {
		if e.HonorLabels || !restoresHolderLabels(e.MetricRelabelConfigs) {
			t.Errorf("%s: ServiceMonitor honorLabels %v: want the compatibility scrape shape", m.name, e.HonorLabels)
		}
	}
}

// wantLayers: a sharded setup's two rule objects, node level then global.
func wantLayers(t *testing.T, m *manifests, kind string, shard, global metav1.ObjectMeta) {
	t.Helper()
	if shard.Labels[rulesLayerLabel] != "shard" || global.Labels[rulesLayerLabel] != "global" {
		t.Errorf("%s: %s objects %s and %s are labelled %s=%q and %q, want shard and global", m.name, kind,
			shard.Name, global.Name, rulesLayerLabel, shard.Labels[rulesLayerLabel], global.Labels[rulesLayerLabel])
	}
}

func wantCount(t *testing.T, m *manifests, kind string, got, want int) {
	t.Helper()
	if got != want {
		t.Errorf("%s: %d %s objects, want %d", m.name, got, kind, want)
	}
}

func TestHelmChart(t *testing.T) {
	helm := tool(t, "helm", installHelm)
	rules, gmpRules := readRulesFile(t), readGMPRulesFile(t)
	for _, tc := range helmCases {
		t.Run(tc.name, func(t *testing.T) {
			args := valuesArgs(tc.values...)
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}

			lint := append([]string{"lint", "--strict", chartDir}, args...)
			if out, errOut, err := helmCmd(t, helm, lint...); err != nil {
				t.Errorf("helm %s: %v\n%s%s", strings.Join(lint, " "), err, out, errOut)
			}

			tmpl := append([]string{"template", release, chartDir, "--namespace", namespace}, args...)
			out, errOut, err := helmCmd(t, helm, tmpl...)
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(tmpl, " "), err, errOut)
			}
			m := decodeManifests(t, "helm "+tc.name, out)
			checkDaemonSet(t, m.name, m.daemonSet(t), tc.profile)
			scheme := "http"
			if slices.Contains(tc.values, "testdata/values-secured.yaml") {
				scheme = "https"
			}
			checkScrapeWiring(t, m, scheme)
			checkRules(t, m, rules, gmpRules)
			checkDashboards(t, m)
			checkNamespaced(t, m)
			if len(m.roles)+len(m.roleBindings) != 0 && len(m.podMonitorings) == 0 {
				t.Errorf("%s: RBAC rendered without GMP: the exporter itself needs none", m.name)
			}
			checkPodReader(t, m)
			if tc.check != nil {
				tc.check(t, m)
			}
		})
	}
}

// TestHelmChartRejects checks that inconsistent values fail at render time
// with a message that says what to change.
func TestHelmChartRejects(t *testing.T) {
	helm := tool(t, "helm", installHelm)
	for _, tc := range []struct {
		name string
		sets []string
		want string
	}{
		{"tls without a secret", []string{"web.tls.enabled=true"}, "web.tls.secretName"},
		{"basic auth without a password", []string{"web.basicAuth.enabled=true"}, "web.basicAuth.password"},
		{"two scrape objects", []string{"serviceMonitor.enabled=true", "podMonitor.enabled=true"}, "not both"},
		{"privileged without escalation", []string{"securityContext.privileged=true"}, "allowPrivilegeEscalation"},
		{"two counters files", []string{"exporter.compatCounters.customMetrics=DCGM_FI_DEV_GPU_TEMP\\,gauge\\,t", "exporter.compatCounters.existingConfigMap=x"}, "not both"},
		{"credentials in another namespace", []string{"web.basicAuth.enabled=true", "web.basicAuth.password=x", "serviceMonitor.enabled=true", "serviceMonitor.namespace=monitoring"}, "release namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", release, chartDir, "--namespace", namespace}
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			_, errOut, err := helmCmd(t, helm, args...)
			if err == nil || !strings.Contains(string(errOut), tc.want) {
				t.Errorf("helm template --set %v: err=%v, stderr %q; want a failure mentioning %q", tc.sets, err, errOut, tc.want)
			}
		})
	}
}

// checkNamespaced: every namespaced object states its namespace, so that
// `helm template | kubectl apply -f -` lands where `helm install` would.
func checkNamespaced(t *testing.T, m *manifests) {
	t.Helper()
	for key, doc := range m.raw {
		tm := metaOf(t, doc)
		clusterScoped := tm.Kind == "ClusterRules" || tm.Kind == "GlobalRules" || tm.Kind == "Namespace" || tm.Kind == "ClusterRole" || tm.Kind == "ClusterRoleBinding"
		switch {
		case clusterScoped && tm.Metadata.Namespace != "":
			t.Errorf("%s: cluster-scoped %s has namespace %q", m.name, key, tm.Metadata.Namespace)
		case !clusterScoped && tm.Metadata.Namespace == "":
			t.Errorf("%s: %s has no namespace", m.name, key)
		}
		if len(tm.Metadata.Name) > 63 {
			t.Errorf("%s: %s: name longer than 63 characters", m.name, key)
		}
	}
}

// checkDashboards: one ConfigMap for Grafana's sidecar holding exactly
// dashboards/*.json, or none when there are no dashboards.
func checkDashboards(t *testing.T, m *manifests) {
	t.Helper()
	want := dashboardFiles(t, filepath.Join(repoRoot, "dashboards"))
	var cms []corev1.ConfigMap
	for _, cm := range m.configMaps {
		if cm.Labels["grafana_dashboard"] != "" {
			cms = append(cms, cm)
		}
	}
	if len(want) == 0 {
		wantCount(t, m, "dashboard ConfigMap", len(cms), 0)
		return
	}
	if len(cms) != 1 {
		t.Fatalf("%s: want one ConfigMap labelled grafana_dashboard, got %d", m.name, len(cms))
	}
	cm := cms[0]
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("%s: grafana_dashboard label %q, want \"1\"", m.name, cm.Labels["grafana_dashboard"])
	}
	var got []string
	for k, v := range cm.Data {
		got = append(got, k)
		if !json.Valid([]byte(v)) {
			t.Errorf("%s: dashboard %s is not valid JSON", m.name, k)
		}
		if src, err := os.ReadFile(filepath.Join(repoRoot, "dashboards", k)); err == nil && strings.TrimRight(string(src), "\n") != strings.TrimRight(v, "\n") {
			t.Errorf("%s: dashboard %s differs from dashboards/%s (run make generate)", m.name, k, k)
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		t.Errorf("%s: dashboards %v, want %v (run make generate)", m.name, got, want)
	}
}

// checkSecured checks TLS, basic auth and the price list end to end: the
// web config, the mounts, the probes and every scrape object.
func checkSecured(t *testing.T, m *manifests) {
	t.Helper()
	ds := m.daemonSet(t)
	c := ds.Spec.Template.Spec.Containers[0]
	secrets := map[string]corev1.Secret{}
	for _, s := range m.secrets {
		secrets[s.Name] = s
	}

	webCfg, ok := secrets[release+"-web-config"]
	if !ok {
		t.Fatalf("%s: no web config Secret", m.name)
	}
	var cfg struct {
		TLSServerConfig struct {
			CertFile   string `json:"cert_file"`
			KeyFile    string `json:"key_file"`
			MinVersion string `json:"min_version"`
		} `json:"tls_server_config"`
		BasicAuthUsers map[string]string `json:"basic_auth_users"`
	}
	if err := strictUnmarshal([]byte(webCfg.StringData["web-config.yml"]), &cfg); err != nil {
		t.Fatalf("%s: web config: %v", m.name, err)
	}
	if cfg.TLSServerConfig.CertFile != "/etc/gpu-pool-exporter/tls/tls.crt" || cfg.TLSServerConfig.KeyFile != "/etc/gpu-pool-exporter/tls/tls.key" || cfg.TLSServerConfig.MinVersion != "TLS13" {
		t.Errorf("%s: tls_server_config %+v", m.name, cfg.TLSServerConfig)
	}
	if h := cfg.BasicAuthUsers["prometheus"]; !strings.HasPrefix(h, "$2") {
		t.Errorf("%s: basic_auth_users %v: want a bcrypt hash for prometheus", m.name, cfg.BasicAuthUsers)
	}
	if !slices.Contains(c.Args, "--web.config.file=/etc/gpu-pool-exporter/web/web-config.yml") {
		t.Errorf("%s: --web.config.file missing: %v", m.name, c.Args)
	}
	if !slices.Contains(c.Args, "--idle.price-file=/etc/gpu-pool-exporter/prices/prices.yaml") {
		t.Errorf("%s: --idle.price-file missing: %v", m.name, c.Args)
	}
	mounts := map[string]string{}
	for _, vm := range c.VolumeMounts {
		mounts[vm.Name] = vm.MountPath
	}
	for name, want := range map[string]string{"web-config": "/etc/gpu-pool-exporter/web", "tls": "/etc/gpu-pool-exporter/tls", "idle-prices": "/etc/gpu-pool-exporter/prices"} {
		t.Run(name, func(t *testing.T) {
			if mounts[name] != want {
				t.Errorf("%s: volume %s mounted at %q, want %s", m.name, name, mounts[name], want)
			}
		})
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "tls" && (v.Secret == nil || v.Secret.SecretName != "gpu-pool-exporter-tls") {
			t.Errorf("%s: tls volume %+v", m.name, v.VolumeSource)
		}
	}

	// The probes use the probe port: plain HTTP, no Authorization header,
	// and no form of the password anywhere in the DaemonSet (anyone who can
	// read pods can read it).
	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		t.Run(name, func(t *testing.T) {
			if p.HTTPGet.Scheme != corev1.URISchemeHTTP || p.HTTPGet.Port.String() != "probe" || len(p.HTTPGet.HTTPHeaders) != 0 {
				t.Errorf("%s: %s probe %+v, want plain HTTP on the probe port without headers", m.name, name, p.HTTPGet)
			}
		})
	}
	dsJSON, err := json.Marshal(ds)
	if err != nil {
		t.Fatal(err)
	}
	basic := base64.StdEncoding.EncodeToString([]byte("prometheus:s3cret"))
	for _, secret := range []string{"s3cret", basic, "Authorization", cfg.BasicAuthUsers["prometheus"]} {
		if strings.Contains(string(dsJSON), secret) {
			t.Errorf("%s: the DaemonSet spec holds %q", m.name, secret)
		}
	}

	auth, ok := secrets[release+"-basic-auth"]
	if !ok || auth.Type != corev1.SecretTypeBasicAuth || auth.StringData["username"] != "prometheus" || auth.StringData["password"] != "s3cret" {
		t.Errorf("%s: basic-auth Secret %+v", m.name, auth)
	}
	for _, sm := range m.serviceMonitors {
		e := sm.Spec.Endpoints[0]
		if e.BasicAuth == nil || e.BasicAuth.Username.Name != auth.Name || e.BasicAuth.Password.Key != "password" {
			t.Errorf("%s: ServiceMonitor basicAuth %+v", m.name, e.BasicAuth)
		}
		if e.TLSConfig == nil || e.TLSConfig.ServerName == nil || *e.TLSConfig.ServerName != "gpu-pool-exporter" {
			t.Errorf("%s: ServiceMonitor tlsConfig %+v", m.name, e.TLSConfig)
		}
		if sm.Labels["release"] != "kube-prometheus-stack" {
			t.Errorf("%s: ServiceMonitor additionalLabels missing: %v", m.name, sm.Labels)
		}
	}
	for _, pm := range m.podMonitorings {
		e := pm.Spec.Endpoints[0]
		if e.BasicAuth == nil || e.BasicAuth.Username != "prometheus" || e.BasicAuth.Password.Secret == nil || e.BasicAuth.Password.Secret.Name != auth.Name {
			t.Errorf("%s: PodMonitoring basicAuth %+v", m.name, e.BasicAuth)
		}
		if e.TLS == nil || e.TLS.ServerName != "gpu-pool-exporter" {
			t.Errorf("%s: PodMonitoring tls %+v", m.name, e.TLS)
		}
		// GMP reads the credentials only when granted.
		if len(m.roles) != 1 || len(m.roleBindings) != 1 {
			t.Fatalf("%s: want a Role and RoleBinding for GMP's collector, got %d and %d", m.name, len(m.roles), len(m.roleBindings))
		}
		r, rb := m.roles[0], m.roleBindings[0]
		if len(r.Rules) != 1 || !slices.Equal(r.Rules[0].ResourceNames, []string{auth.Name, "gpu-pool-exporter-tls"}) || slices.ContainsFunc(r.Rules[0].Verbs, func(v string) bool { return v != "get" && v != "list" && v != "watch" }) {
			t.Errorf("%s: Role %+v must only read the basic-auth and CA Secrets", m.name, r.Rules)
		}
		if rb.RoleRef.Name != r.Name || len(rb.Subjects) != 1 || rb.Subjects[0].Namespace != "gmp-system" || rb.Subjects[0].Name != "collector" {
			t.Errorf("%s: RoleBinding %+v, want gmp-system/collector bound to %s", m.name, rb, r.Name)
		}
	}
	var prices bool
	for _, cm := range m.configMaps {
		if cm.Name == release+"-idle-prices" && strings.Contains(cm.Data["prices.yaml"], "default_per_gpu_hour") {
			prices = true
		}
	}
	if !prices {
		t.Errorf("%s: idle price ConfigMap missing", m.name)
	}
}
