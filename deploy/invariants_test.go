package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// profile is the kind of cluster a rendering targets.
type profile int

const (
	// generic: devices and NVML through the NVIDIA Container Toolkit.
	generic profile = iota
	// gke: Google-managed driver on the host, privileged container.
	gke
	// gpuOperator: the toolkit through RuntimeClass nvidia, standalone DCGM.
	gpuOperator
)

const (
	podResourcesDir = "/var/lib/kubelet/pod-resources"
	metricsPort     = 9947
	probePort       = 9948
)

// checkDaemonSet checks what every rendering of the exporter must keep, and
// what its profile adds.
func checkDaemonSet(t *testing.T, where string, ds *appsv1.DaemonSet, p profile) {
	t.Helper()
	errorf := func(format string, args ...any) {
		t.Helper()
		t.Errorf(where+": DaemonSet "+ds.Name+": "+format, args...)
	}
	spec := &ds.Spec.Template.Spec

	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		errorf("selector %v does not select its own pod template (labels %v)", ds.Spec.Selector, ds.Spec.Template.Labels)
	}

	// Scheduling: GPU nodes only, whatever the value of their taint.
	if !slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists && tol.Effect == ""
	}) {
		errorf("no toleration {key: nvidia.com/gpu, operator: Exists} for every effect: %+v", spec.Tolerations)
	}
	checkGPUNodeAffinity(t, where, spec.Affinity)
	if spec.PriorityClassName != "system-node-critical" {
		errorf("priorityClassName %q, want system-node-critical", spec.PriorityClassName)
	}
	if spec.HostNetwork || spec.HostPID || spec.HostIPC {
		errorf("host namespaces are not needed: hostNetwork=%v hostPID=%v hostIPC=%v", spec.HostNetwork, spec.HostPID, spec.HostIPC)
	}
	apiOn := len(spec.Containers) > 0 && slices.ContainsFunc(spec.Containers[0].Args, func(a string) bool {
		return strings.HasPrefix(a, "--compat.dcgm-exporter.kubernetes-enable-pod-") || a == "--kubernetes.resource-slices" || a == "--node-condition"
	})
	if !apiOn && (spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken) {
		errorf("automountServiceAccountToken must be false: the exporter calls the API only for pod labels and UIDs, ResourceSlices and the node condition")
	}
	if len(spec.InitContainers) != 0 {
		errorf("unexpected init containers")
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("%s: want one container, got %d", where, len(spec.Containers))
	}
	c := &spec.Containers[0]

	// Never take a GPU (or any NVIDIA resource) away from the workloads.
	for _, ctr := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		for _, list := range []corev1.ResourceList{ctr.Resources.Requests, ctr.Resources.Limits} {
			for name := range list {
				if strings.HasPrefix(string(name), "nvidia.com/") {
					errorf("container %s asks for %s", ctr.Name, name)
				}
			}
		}
		if len(ctr.Resources.Claims) != 0 {
			errorf("container %s claims DRA resources", ctr.Name)
		}
	}
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		errorf("no CPU request")
	}
	if _, ok := c.Resources.Requests[corev1.ResourceMemory]; !ok {
		errorf("no memory request")
	}
	if _, ok := c.Resources.Limits[corev1.ResourceMemory]; !ok {
		errorf("no memory limit")
	}
	checkImagePinned(t, where, c.Image)

	// Flags and port.
	args := map[string]string{}
	for _, a := range c.Args {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	if got := args["--web.listen-address"]; got != ":9947" {
		errorf("--web.listen-address=%q, want :9947", got)
	}
	if len(c.Ports) != 2 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != metricsPort || c.Ports[1].Name != "probe" || c.Ports[1].ContainerPort != probePort {
		errorf("want container ports metrics/%d and probe/%d, got %+v", metricsPort, probePort, c.Ports)
	}
	if got := args["--web.probe-address"]; got != fmt.Sprintf(":%d", probePort) {
		errorf("--web.probe-address=%q, want :%d", got, probePort)
	}
	if got := args["--kubelet.pod-resources-socket"]; path.Dir(got) != podResourcesDir {
		errorf("--kubelet.pod-resources-socket=%q is not inside the mounted %s", got, podResourcesDir)
	}

	// Probes: liveness on /healthz, readiness on /readyz, both on the probe
	// port (plain HTTP, no auth), and no credential anywhere in the DaemonSet.
	checkProbe(t, where+": liveness", c.LivenessProbe, "/healthz")
	checkProbe(t, where+": readiness", c.ReadinessProbe, "/readyz")

	// Environment.
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		env[e.Name] = e
	}
	if e, ok := env["NODE_NAME"]; !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		errorf("NODE_NAME must come from the downward API (spec.nodeName): %+v", e)
	}

	// Volumes: every mount has a volume; every hostPath is mounted read-only.
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
		v, ok := volumes[m.Name]
		if !ok {
			errorf("mount %s has no volume", m.Name)
			continue
		}
		if v.HostPath != nil && !m.ReadOnly {
			errorf("hostPath %s is mounted read-write at %s", v.HostPath.Path, m.MountPath)
		}
	}
	if v, m := volumes["pod-resources"], mounts["pod-resources"]; v.HostPath == nil || v.HostPath.Path != podResourcesDir || m.MountPath != podResourcesDir || !m.ReadOnly {
		errorf("the kubelet's %s must be mounted read-only at the same path: volume %+v mount %+v", podResourcesDir, v.VolumeSource, m)
	}

	// Each GPU's NUMA node comes from the host's sysfs:
	// NVML answers it only where GPUs are NUMA nodes.
	if v, m := volumes["sys"], mounts["sys"]; v.HostPath == nil || v.HostPath.Path != "/sys" || m.MountPath != "/host/sys" || !m.ReadOnly || args["--path.sysfs"] != "/host/sys" {
		errorf("the host's /sys must be mounted read-only at /host/sys and passed as --path.sysfs: volume %+v mount %+v flag %q", v.VolumeSource, m, args["--path.sysfs"])
	}

	// Security context.
	sc := c.SecurityContext
	if sc == nil {
		t.Fatalf("%s: no container securityContext", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		errorf("readOnlyRootFilesystem must be true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		errorf("runAsUser must be set to 0 explicitly (the kubelet socket is root's; the image defaults to 65532)")
	}
	privileged := sc.Privileged != nil && *sc.Privileged
	if privileged {
		if sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation {
			errorf("privileged with allowPrivilegeEscalation=false is rejected by the API server")
		}
	} else {
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			errorf("an unprivileged exporter must set allowPrivilegeEscalation=false")
		}
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			errorf("an unprivileged exporter must drop ALL capabilities and add none: %+v", sc.Capabilities)
		}
	}

	// What the profile adds.
	toolkit := env["NVIDIA_VISIBLE_DEVICES"].Value == "all" && env["NVIDIA_DRIVER_CAPABILITIES"].Value == "utility"
	_, ldPath := env["LD_LIBRARY_PATH"]
	runtimeClass := ""
	if spec.RuntimeClassName != nil {
		runtimeClass = *spec.RuntimeClassName
	}
	switch p {
	case generic, gpuOperator:
		if !toolkit {
			errorf("NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=utility are missing: the toolkit would inject no GPU")
		}
		// Without it the toolkit hides MIG devices.
		if env["NVIDIA_MIG_MONITOR_DEVICES"].Value != "all" {
			errorf("NVIDIA_MIG_MONITOR_DEVICES=all is missing: NVML would see no MIG devices in the container")
		}
		if ldPath {
			errorf("LD_LIBRARY_PATH is set although the toolkit provides NVML")
		}
		if privileged {
			errorf("privileged although the toolkit grants device access")
		}
		if p == gpuOperator {
			if runtimeClass != "nvidia" {
				errorf("runtimeClassName %q, want nvidia (the GPU Operator's toolkit)", runtimeClass)
			}
			if got := args["--dcgm.host-engine"]; got != "nvidia-dcgm.gpu-operator.svc:5555" {
				errorf("--dcgm.host-engine=%q, want the Operator's node-local nvidia-dcgm Service", got)
			}
		} else if runtimeClass != "" {
			errorf("runtimeClassName %q in the generic profile", runtimeClass)
		}
	case gke:
		if !privileged {
			errorf("on GKE the container must be privileged: without a GPU from the device plugin /dev/nvidia* is denied")
		}
		if _, ok := env["NVIDIA_VISIBLE_DEVICES"]; ok {
			errorf("NVIDIA_VISIBLE_DEVICES is meaningless on GKE (no toolkit)")
		}
		if got := env["LD_LIBRARY_PATH"].Value; got != "/usr/local/nvidia/lib64" {
			errorf("LD_LIBRARY_PATH=%q, want /usr/local/nvidia/lib64", got)
		}
		v, m := volumes["nvidia-driver"], mounts["nvidia-driver"]
		if v.HostPath == nil || v.HostPath.Path != "/home/kubernetes/bin/nvidia" || m.MountPath != "/usr/local/nvidia" || !m.ReadOnly {
			errorf("GKE's driver /home/kubernetes/bin/nvidia must be mounted read-only at /usr/local/nvidia: volume %+v mount %+v", v.VolumeSource, m)
		}
		if runtimeClass != "" {
			errorf("runtimeClassName %q on GKE", runtimeClass)
		}
	}
}

func checkGPUNodeAffinity(t *testing.T, where string, a *corev1.Affinity) {
	t.Helper()
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Errorf("%s: no required node affinity: the exporter would run on CPU nodes", where)
		return
	}
	var gkeTerm, nfdTerm bool
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if len(term.MatchExpressions) == 0 || len(term.MatchFields) != 0 {
			continue
		}
		// Beyond the selecting expression, only the step-aside during a GPU
		// Operator driver upgrade or MIG change (TestStepsAsideForDriverUpgrade).
		stepAside := true
		for _, x := range term.MatchExpressions[1:] {
			stepAside = stepAside && strings.HasPrefix(x.Key, "nvidia.com/gpu.deploy.") && x.Operator == corev1.NodeSelectorOpNotIn &&
				slices.Equal(x.Values, []string{"paused-for-driver-upgrade", "paused-for-mig-change"})
		}
		if !stepAside {
			continue
		}
		e := term.MatchExpressions[0]
		switch {
		case e.Key == "cloud.google.com/gke-accelerator" && e.Operator == corev1.NodeSelectorOpExists:
			gkeTerm = true
		case e.Key == "nvidia.com/gpu.present" && e.Operator == corev1.NodeSelectorOpIn && slices.Equal(e.Values, []string{"true"}):
			nfdTerm = true
		}
	}
	if !gkeTerm || !nfdTerm {
		t.Errorf("%s: node affinity must select cloud.google.com/gke-accelerator (Exists) OR nvidia.com/gpu.present=true, got %+v", where, a.NodeAffinity)
	}
}

func checkProbe(t *testing.T, where string, p *corev1.Probe, wantPath string) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("%s: want an HTTP probe on %s, got %+v", where, wantPath, p)
		return
	}
	if p.HTTPGet.Path != wantPath || p.HTTPGet.Port.String() != "probe" || p.HTTPGet.Scheme != corev1.URISchemeHTTP {
		t.Errorf("%s: probe %s on port %s (%s), want %s on probe over HTTP", where, p.HTTPGet.Path, p.HTTPGet.Port.String(), p.HTTPGet.Scheme, wantPath)
	}
	if len(p.HTTPGet.HTTPHeaders) != 0 {
		t.Errorf("%s: probe headers %+v: the probe port needs no credentials, and the DaemonSet must hold none", where, p.HTTPGet.HTTPHeaders)
	}
}

// checkImagePinned rejects an untagged image and the moving tag "latest".
func checkImagePinned(t *testing.T, where, image string) {
	t.Helper()
	if strings.Contains(image, "@sha256:") {
		return
	}
	name := image[strings.LastIndex(image, "/")+1:]
	_, tag, ok := strings.Cut(name, ":")
	if !ok || tag == "" || tag == "latest" {
		t.Errorf("%s: image %q is not pinned to a version tag or digest", where, image)
	}
}

// checkScrapeWiring checks that the Service and every scrape object select
// the exporter's pods on the metrics port, with the scheme the pods serve,
// under the job name the shipped rules select.
func checkScrapeWiring(t *testing.T, m *manifests, scheme string) {
	t.Helper()
	const job = "gpu-pool-exporter"
	ds := m.daemonSet(t)
	podLabels := labels.Set(ds.Spec.Template.Labels)
	if len(m.services) != 1 {
		t.Fatalf("%s: want one Service, got %d", m.name, len(m.services))
	}
	svc := m.services[0]
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
		t.Errorf("%s: Service selector %v does not select the exporter pods", m.name, svc.Spec.Selector)
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("%s: Service must expose the metrics port by name: %+v", m.name, svc.Spec.Ports)
	}
	selects := func(kind string, s metav1.LabelSelector, set labels.Set) {
		t.Helper()
		sel, err := metav1.LabelSelectorAsSelector(&s)
		if err != nil || sel.Empty() || !sel.Matches(set) {
			t.Errorf("%s: %s selector %v does not select %v", m.name, kind, s, set)
		}
	}
	nodeLabel := func(kind string, r []monitoringv1.RelabelConfig) {
		t.Helper()
		if !slices.ContainsFunc(r, func(r monitoringv1.RelabelConfig) bool {
			return slices.Equal(r.SourceLabels, []monitoringv1.LabelName{"__meta_kubernetes_pod_node_name"}) && r.TargetLabel == "node"
		}) {
			t.Errorf("%s: %s does not set the node label", m.name, kind)
		}
	}
	for _, sm := range m.serviceMonitors {
		selects("ServiceMonitor", sm.Spec.Selector, labels.Set(svc.Labels))
		if sm.Spec.JobLabel == "" || svc.Labels[sm.Spec.JobLabel] != job {
			t.Errorf("%s: ServiceMonitor jobLabel %q gives job=%q, and the shipped rules select job=%q", m.name, sm.Spec.JobLabel, svc.Labels[sm.Spec.JobLabel], job)
		}
		for _, e := range sm.Spec.Endpoints {
			if e.Port != "metrics" || e.Scheme.String() != scheme {
				t.Errorf("%s: ServiceMonitor endpoint %s/%s, want metrics/%s", m.name, e.Port, e.Scheme.String(), scheme)
			}
			if !e.HonorLabels && !restoresHolderLabels(e.MetricRelabelConfigs) {
				t.Errorf("%s: ServiceMonitor without honorLabels nor the metricRelabelings that restore gpu_*'s namespace/pod/container: they would become exported_*", m.name)
			}
			nodeLabel("ServiceMonitor", e.RelabelConfigs)
		}
	}
	for _, pm := range m.podMonitors {
		selects("PodMonitor", pm.Spec.Selector, podLabels)
		if pm.Spec.JobLabel == "" || podLabels[pm.Spec.JobLabel] != job {
			t.Errorf("%s: PodMonitor jobLabel %q gives job=%q, and the shipped rules select job=%q", m.name, pm.Spec.JobLabel, podLabels[pm.Spec.JobLabel], job)
		}
		for _, e := range pm.Spec.PodMetricsEndpoints {
			if e.Port == nil || *e.Port != "metrics" || e.Scheme.String() != scheme {
				t.Errorf("%s: PodMonitor endpoint %v/%s, want metrics/%s", m.name, e.Port, e.Scheme.String(), scheme)
			}
			if !e.HonorLabels && !restoresHolderLabels(e.MetricRelabelConfigs) {
				t.Errorf("%s: PodMonitor without honorLabels nor the metricRelabelings that restore gpu_*'s namespace/pod/container: they would become exported_*", m.name)
			}
			nodeLabel("PodMonitor", e.RelabelConfigs)
		}
	}
	for _, pm := range m.podMonitorings {
		selects("PodMonitoring", pm.Spec.Selector, podLabels)
		if pm.Metadata.Name != job {
			t.Errorf("%s: PodMonitoring %s: its name is the job label, and the shipped rules select job=%q", m.name, pm.Metadata.Name, job)
		}
		for _, e := range pm.Spec.Endpoints {
			if e.Port.String() != "metrics" || e.Scheme != scheme {
				t.Errorf("%s: PodMonitoring endpoint %s/%s, want metrics/%s", m.name, e.Port.String(), e.Scheme, scheme)
			}
		}
		permitted := []string{"container", "node", "pod", "top_level_controller_name", "top_level_controller_type"}
		if tl := pm.Spec.TargetLabels; tl == nil || tl.Metadata == nil || !slices.Contains(*tl.Metadata, "node") {
			t.Errorf("%s: PodMonitoring does not set the node label", m.name)
		} else {
			for _, l := range *tl.Metadata {
				if !slices.Contains(permitted, l) {
					t.Errorf("%s: PodMonitoring metadata label %q is not one GMP permits", m.name, l)
				}
				if l == "pod" || l == "container" {
					t.Errorf("%s: PodMonitoring adds target label %q, which renames the exporter's own %s label to exported_%s", m.name, l, l, l)
				}
			}
		}
	}
}

// checkRules compares the spec of every rendered rule object with the rules
// file, the single source of the rules: PrometheusRule with the file itself,
// GKE Managed Prometheus' ClusterRules and GlobalRules with its GMP variant
// (generated from it: GMP stores the exporter's and kube-state-metrics'
// namespace label as exported_namespace); an object labelled
// gpu-pool-exporter/rules-layer: shard|global with that layer's file, generated
// from those (alerts/gpu-pool-exporter[.gmp].<layer>.rules.yml).
func checkRules(t *testing.T, m *manifests, rulesFile, gmpRulesFile []byte) {
	t.Helper()
	check := func(key string, meta metav1.ObjectMeta, gmp bool) {
		t.Helper()
		source, data := rulesPath, rulesFile
		if gmp {
			source, data = gmpRulesPath, gmpRulesFile
		}
		if l := meta.Labels[rulesLayerLabel]; l != "" && l != "all" {
			source = strings.TrimSuffix(source, ".rules.yml") + "." + l + ".rules.yml"
			b, err := os.ReadFile(filepath.Join(repoRoot, source))
			if err != nil {
				t.Errorf("%s: %s is labelled %s=%s: %v", m.name, key, rulesLayerLabel, l, err)
				return
			}
			data = b
		}
		want := plainYAML(t, data)
		doc := plainYAML(t, m.raw[key])
		spec := doc.(map[string]any)["spec"]
		if !reflect.DeepEqual(spec, want) {
			t.Errorf("%s: %s spec differs from %s (run make generate); first difference: %s", m.name, key, source, firstDifference(spec, want))
		}
	}
	for _, r := range m.promRules {
		check("PrometheusRule/"+r.Name, r.ObjectMeta, false)
	}
	for _, r := range m.clusterRules {
		check("ClusterRules/"+r.Metadata.Name, r.Metadata, true)
	}
	for _, r := range m.globalRules {
		check("GlobalRules/"+r.Metadata.Name, r.Metadata, true)
	}
}

// rulesLayerLabel tells the node-level (shard) rule objects from the global
// ones in a sharded setup.
const rulesLayerLabel = "gpu-pool-exporter/rules-layer"

// firstDifference names the first rule group whose rendering differs, to keep
// failure messages short.
func firstDifference(got, want any) string {
	groups := func(v any) []any {
		m, _ := v.(map[string]any)
		g, _ := m["groups"].([]any)
		return g
	}
	g, w := groups(got), groups(want)
	for i := range max(len(g), len(w)) {
		if i >= len(g) || i >= len(w) || !reflect.DeepEqual(g[i], w[i]) {
			var name any
			if i < len(w) {
				name = w[i].(map[string]any)["name"]
			} else {
				name = g[i].(map[string]any)["name"]
			}
			b, _ := json.Marshal(name)
			return "group #" + strconv.Itoa(i) + " " + string(b)
		}
	}
	return "outside the groups"
}

// restoresHolderLabels says whether metric relabelings give the gpu_*
// families their namespace, pod and container back from exported_* (the
// compat scrape shape: honorLabels false, as dcgm-exporter is scraped).
func restoresHolderLabels(r []monitoringv1.RelabelConfig) bool {
	for _, l := range []string{"namespace", "pod", "container"} {
		if !slices.ContainsFunc(r, func(r monitoringv1.RelabelConfig) bool {
			return slices.Equal(r.SourceLabels, []monitoringv1.LabelName{"__name__", monitoringv1.LabelName("exported_" + l)}) &&
				r.TargetLabel == l && r.Regex == "gpu_.*;(.+)"
		}) {
			return false
		}
	}
	return true
}
