// Package deploy_test checks the deployment artefacts (Dockerfile, Helm chart,
// kustomize overlays) offline: it renders them, decodes every object strictly
// into the Go types of its API (Kubernetes', prometheus-operator's), checks
// GMP's objects against GMP's published CRD schemas, and checks the
// invariants a GPU-node DaemonSet must keep.
package deploy_test

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// repoRoot is the module root; go test runs in deploy/.
const repoRoot = ".."

// tool finds a test tool on PATH or in $(go env GOPATH)/bin. A missing tool
// skips the test on a developer machine and fails it in CI (env CI set), with
// the command that installs it.
func tool(t *testing.T, name, install string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", name)
			if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
				return p
			}
		}
	}
	msg := fmt.Sprintf("%s not found on PATH or in $(go env GOPATH)/bin; install it with: %s", name, install)
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// strictUnmarshal decodes YAML or JSON into v the way the API server's strict
// field validation does: unknown fields, duplicate fields and fields that
// match only case-insensitively are errors.
func strictUnmarshal(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// generic decodes YAML into plain maps and slices, for comparing documents
// whatever their key order and quoting.
func plainYAML(t *testing.T, data []byte) any {
	t.Helper()
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatalf("parse YAML: %v", err)
	}
	var v any
	if err := yaml.Unmarshal(j, &v); err != nil {
		t.Fatalf("parse JSON: %v", err)
	}
	return v
}

// manifests holds every object of one rendering, decoded into its type.
type manifests struct {
	name            string
	namespaces      []corev1.Namespace
	serviceAccounts []corev1.ServiceAccount
	services        []corev1.Service
	configMaps      []corev1.ConfigMap
	secrets         []corev1.Secret
	quotas          []corev1.ResourceQuota
	daemonSets      []appsv1.DaemonSet
	roles           []rbacv1.Role
	roleBindings    []rbacv1.RoleBinding
	clusterRoles    []rbacv1.ClusterRole
	clusterBindings []rbacv1.ClusterRoleBinding
	serviceMonitors []monitoringv1.ServiceMonitor
	podMonitors     []monitoringv1.PodMonitor
	promRules       []monitoringv1.PrometheusRule
	podMonitorings  []podMonitoring
	clusterRules    []clusterRules
	globalRules     []clusterRules
	networkPolicies []networkingv1.NetworkPolicy
	// raw keeps every document by "Kind/name" for generic comparisons.
	raw map[string][]byte
}

func (m *manifests) daemonSet(t *testing.T) *appsv1.DaemonSet {
	t.Helper()
	if len(m.daemonSets) != 1 {
		t.Fatalf("%s: want exactly one DaemonSet, got %d", m.name, len(m.daemonSets))
	}
	return &m.daemonSets[0]
}

type typeMeta struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
}

// decodeManifests splits a multi-document YAML stream and decodes each
// document strictly by apiVersion and kind; an unknown kind is an error.
func decodeManifests(t *testing.T, name string, stream []byte) *manifests {
	t.Helper()
	m := &manifests{name: name, raw: map[string][]byte{}}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: split YAML: %v", name, err)
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			t.Fatalf("%s: parse YAML: %v\n%s", name, err, doc)
		}
		if s := strings.TrimSpace(string(j)); s == "null" || s == "" {
			continue // a document of comments only
		}
		var tm typeMeta
		if err := yaml.Unmarshal(j, &tm); err != nil {
			t.Fatalf("%s: read kind: %v", name, err)
		}
		key := tm.Kind + "/" + tm.Metadata.Name
		if _, dup := m.raw[key]; dup {
			t.Errorf("%s: %s rendered twice", name, key)
		}
		m.raw[key] = doc
		var target any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 Namespace":
			target = appendNew(&m.namespaces)
		case "v1 ServiceAccount":
			target = appendNew(&m.serviceAccounts)
		case "v1 Service":
			target = appendNew(&m.services)
		case "v1 ConfigMap":
			target = appendNew(&m.configMaps)
		case "v1 Secret":
			target = appendNew(&m.secrets)
		case "v1 ResourceQuota":
			target = appendNew(&m.quotas)
		case "apps/v1 DaemonSet":
			target = appendNew(&m.daemonSets)
		case "rbac.authorization.k8s.io/v1 Role":
			target = appendNew(&m.roles)
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			target = appendNew(&m.roleBindings)
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			target = appendNew(&m.clusterRoles)
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			target = appendNew(&m.clusterBindings)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			target = appendNew(&m.serviceMonitors)
		case "monitoring.coreos.com/v1 PodMonitor":
			target = appendNew(&m.podMonitors)
		case "monitoring.coreos.com/v1 PrometheusRule":
			target = appendNew(&m.promRules)
		case "monitoring.googleapis.com/v1 PodMonitoring":
			target = appendNew(&m.podMonitorings)
		case "monitoring.googleapis.com/v1 ClusterRules":
			target = appendNew(&m.clusterRules)
		case "monitoring.googleapis.com/v1 GlobalRules":
			target = appendNew(&m.globalRules)
		case "networking.k8s.io/v1 NetworkPolicy":
			target = appendNew(&m.networkPolicies)
		default:
			t.Errorf("%s: unexpected object %s %s", name, tm.APIVersion, key)
			continue
		}
		schemaKind := tm.Kind
		if schemaKind == "GlobalRules" {
			// GMP's Rules, ClusterRules and GlobalRules share one spec
			// (RulesSpec); testdata/gmp-crds carries ClusterRules'.
			schemaKind = "ClusterRules"
		}
		if crd := gmpSchema(t, tm.APIVersion, schemaKind); crd != nil {
			// GMP: its published schema decides; the view type only reads.
			if errs := crd.validate(doc); len(errs) > 0 {
				t.Errorf("%s: %s does not pass GMP's CRD schema: %v", name, key, errs.ToAggregate())
			}
			if err := yaml.Unmarshal(doc, target); err != nil {
				t.Errorf("%s: %s: %v", name, key, err)
			}
			continue
		}
		if err := strictUnmarshal(doc, target); err != nil {
			t.Errorf("%s: %s does not decode strictly: %v", name, key, err)
		}
	}
	return m
}

func metaOf(t *testing.T, doc []byte) typeMeta {
	t.Helper()
	var tm typeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		t.Fatalf("read metadata: %v", err)
	}
	return tm
}

func appendNew[T any](s *[]T) *T {
	var zero T
	*s = append(*s, zero)
	return &(*s)[len(*s)-1]
}

// Views of GMP's objects, for reading only: what is valid is decided by GMP's
// published CRD schemas (crdschema_test.go), not by these types.

type podMonitoring struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
	Spec     struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port   intstr.IntOrString `json:"port"`
			Scheme string             `json:"scheme"`
			TLS    *struct {
				ServerName string `json:"serverName"`
			} `json:"tls"`
			BasicAuth *struct {
				Username string `json:"username"`
				Password struct {
					Secret *struct {
						Name string `json:"name"`
					} `json:"secret"`
				} `json:"password"`
			} `json:"basicAuth"`
		} `json:"endpoints"`
		TargetLabels *struct {
			Metadata *[]string `json:"metadata"`
		} `json:"targetLabels"`
	} `json:"spec"`
}

type clusterRules struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}
