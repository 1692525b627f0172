// Package deploy_test checks the deployment artefacts (Dockerfile, Helm chart,
// kustomize overlays) offline: it renders them, decodes every object strictly
// into Kubernetes API types (or small local types for the CRDs), and checks the
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

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	serviceMonitors []serviceMonitor
	podMonitors     []podMonitor
	promRules       []prometheusRule
	podMonitorings  []podMonitoring
	clusterRules    []clusterRules
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
		case "networking.k8s.io/v1 NetworkPolicy":
			target = appendNew(&m.networkPolicies)
		default:
			t.Errorf("%s: unexpected object %s %s", name, tm.APIVersion, key)
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

// Local copies of the CRD schemas this project renders: only the fields it
// uses or documents, so that a misspelt field fails strict decoding.

// promRelabel is prometheus-operator's RelabelConfig.
type promRelabel struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

type secretOrConfigMap struct {
	Secret    *corev1.SecretKeySelector    `json:"secret,omitempty"`
	ConfigMap *corev1.ConfigMapKeySelector `json:"configMap,omitempty"`
}

// promTLSConfig is prometheus-operator's SafeTLSConfig.
type promTLSConfig struct {
	CA                 *secretOrConfigMap        `json:"ca,omitempty"`
	Cert               *secretOrConfigMap        `json:"cert,omitempty"`
	KeySecret          *corev1.SecretKeySelector `json:"keySecret,omitempty"`
	ServerName         *string                   `json:"serverName,omitempty"`
	InsecureSkipVerify *bool                     `json:"insecureSkipVerify,omitempty"`
	MinVersion         *string                   `json:"minVersion,omitempty"`
	MaxVersion         *string                   `json:"maxVersion,omitempty"`
}

type promBasicAuth struct {
	Username corev1.SecretKeySelector `json:"username"`
	Password corev1.SecretKeySelector `json:"password"`
}

// promEndpoint covers ServiceMonitor endpoints and PodMonitor
// podMetricsEndpoints alike.
type promEndpoint struct {
	Port              string         `json:"port,omitempty"`
	Path              string         `json:"path,omitempty"`
	Scheme            string         `json:"scheme,omitempty"`
	Interval          string         `json:"interval,omitempty"`
	ScrapeTimeout     string         `json:"scrapeTimeout,omitempty"`
	HonorLabels       bool           `json:"honorLabels,omitempty"`
	TLSConfig         *promTLSConfig `json:"tlsConfig,omitempty"`
	BasicAuth         *promBasicAuth `json:"basicAuth,omitempty"`
	Relabelings       []promRelabel  `json:"relabelings,omitempty"`
	MetricRelabelings []promRelabel  `json:"metricRelabelings,omitempty"`
}

type namespaceSelector struct {
	Any        bool     `json:"any,omitempty"`
	MatchNames []string `json:"matchNames,omitempty"`
}

type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *namespaceSelector   `json:"namespaceSelector,omitempty"`
		Endpoints         []promEndpoint       `json:"endpoints"`
	} `json:"spec"`
}

type podMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		JobLabel            string               `json:"jobLabel,omitempty"`
		Selector            metav1.LabelSelector `json:"selector"`
		NamespaceSelector   *namespaceSelector   `json:"namespaceSelector,omitempty"`
		PodMetricsEndpoints []promEndpoint       `json:"podMetricsEndpoints"`
	} `json:"spec"`
}

// promRuleGroup is prometheus-operator's RuleGroup (camelCase, unlike a
// Prometheus rules file's keep_firing_for and query_offset).
type promRuleGroup struct {
	Name        string            `json:"name"`
	Interval    string            `json:"interval,omitempty"`
	QueryOffset string            `json:"queryOffset,omitempty"`
	Limit       *int              `json:"limit,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Rules       []struct {
		Record        string            `json:"record,omitempty"`
		Alert         string            `json:"alert,omitempty"`
		Expr          string            `json:"expr"`
		For           string            `json:"for,omitempty"`
		KeepFiringFor string            `json:"keepFiringFor,omitempty"`
		Labels        map[string]string `json:"labels,omitempty"`
		Annotations   map[string]string `json:"annotations,omitempty"`
	} `json:"rules"`
}

type prometheusRule struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Groups []promRuleGroup `json:"groups"`
	} `json:"spec"`
}

type gmpSecretSelector struct {
	Secret *struct {
		Name      string `json:"name"`
		Key       string `json:"key"`
		Namespace string `json:"namespace,omitempty"`
	} `json:"secret,omitempty"`
}

type gmpTLS struct {
	ServerName         string             `json:"serverName,omitempty"`
	InsecureSkipVerify bool               `json:"insecureSkipVerify,omitempty"`
	MinVersion         string             `json:"minVersion,omitempty"`
	MaxVersion         string             `json:"maxVersion,omitempty"`
	CA                 *gmpSecretSelector `json:"ca,omitempty"`
	Cert               *gmpSecretSelector `json:"cert,omitempty"`
	Key                *gmpSecretSelector `json:"key,omitempty"`
}

type podMonitoring struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			// A port name here; GMP also takes a number.
			Port             string        `json:"port"`
			Scheme           string        `json:"scheme,omitempty"`
			Path             string        `json:"path,omitempty"`
			Interval         string        `json:"interval,omitempty"`
			Timeout          string        `json:"timeout,omitempty"`
			MetricRelabeling []promRelabel `json:"metricRelabeling,omitempty"`
			TLS              *gmpTLS       `json:"tls,omitempty"`
			BasicAuth        *struct {
				Username string            `json:"username,omitempty"`
				Password gmpSecretSelector `json:"password,omitempty"`
			} `json:"basicAuth,omitempty"`
		} `json:"endpoints"`
		TargetLabels *struct {
			Metadata *[]string `json:"metadata,omitempty"`
			FromPod  []struct {
				From string `json:"from"`
				To   string `json:"to,omitempty"`
			} `json:"fromPod,omitempty"`
		} `json:"targetLabels,omitempty"`
	} `json:"spec"`
}

// gmpRuleGroup is GMP's RuleGroup: no keepFiringFor, no limit.
type gmpRuleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []struct {
		Record      string            `json:"record,omitempty"`
		Alert       string            `json:"alert,omitempty"`
		Expr        string            `json:"expr"`
		For         string            `json:"for,omitempty"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"rules"`
}

type clusterRules struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Groups []gmpRuleGroup `json:"groups"`
	} `json:"spec"`
}
