// Package apiserver tests the pod metadata watch (podmap.MetaWatcher) and
// the exporter's pod labels and UIDs, DRA (ResourceClaims and
// ResourceSlices, device taints, the dcgm-exporter page's dra_* labels) and
// the node condition (its writes, its RBAC and docs/node-condition.md's
// ValidatingAdmissionPolicy) against a real kube-apiserver and etcd, on
// loopback only. `make test-apiserver` builds both once
// (scripts/apiserver.sh) and runs it; without APISERVER_TOOLS it is skipped,
// in CI too, as the Thanos suite is.
package apiserver

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/podmap"
)

// The identities of the token file: an administrator, the exporter's
// service account (granted what the Helm chart grants it) and a user with
// no grant at all.
const (
	adminToken    = "admin-token-for-the-test"
	exporterToken = "exporter-token-for-the-test"
	exporterUser  = "system:serviceaccount:gpu-pool-exporter:gpu-pool-exporter"
	nobodyToken   = "nobody-token-for-the-test"
)

// cluster is a running etcd and kube-apiserver.
type cluster struct {
	url     string
	dir     string
	version string
	// apiserver is the running kube-apiserver (nil while stopped), bin and
	// args how to start it again.
	apiserver *exec.Cmd
	bin       string
	args      []string
}

func toolsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("APISERVER_TOOLS")
	if dir == "" {
		// Opt-in like the Thanos suite: `make test` (and CI) cannot afford
		// the build of kube-apiserver and etcd, so it skips here.
		t.Skip("APISERVER_TOOLS is not set: `make test-apiserver` builds kube-apiserver and etcd (scripts/apiserver.sh) and runs this test")
	}
	return dir
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return port
}

// start runs bin with args until the test ends, its output in dir/name.log.
func start(t *testing.T, dir, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		logf.Close()
		if t.Failed() {
			tail(t, filepath.Join(dir, name+".log"), 30)
		}
	})
	return cmd
}

func tail(t *testing.T, path string, n int) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	t.Logf("last lines of %s:\n%s", filepath.Base(path), strings.Join(lines, "\n"))
}

// waitHTTP polls url (with the admin token, any certificate) until it
// answers 200.
func waitHTTP(t *testing.T, url string, timeout time.Duration) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test's own self-signed server on loopback
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within %s (last: %v)", url, timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startCluster runs etcd and kube-apiserver on loopback ports, with
// token authentication and RBAC.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	tools := toolsDir(t)
	dir := t.TempDir()
	etcdClient, etcdPeer := freePort(t), freePort(t)
	start(t, dir, "etcd", filepath.Join(tools, "etcd"),
		"--name=test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:"+etcdClient, "--advertise-client-urls=http://127.0.0.1:"+etcdClient,
		"--listen-peer-urls=http://127.0.0.1:"+etcdPeer, "--initial-advertise-peer-urls=http://127.0.0.1:"+etcdPeer,
		"--initial-cluster=test=http://127.0.0.1:"+etcdPeer, "--log-level=warn")
	waitHTTP(t, "http://127.0.0.1:"+etcdClient+"/health", 60*time.Second)

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(fmt.Sprintf("%s,admin,admin,\"system:masters\"\n%s,%s,exporter\n%s,nobody,nobody\n",
		adminToken, exporterToken, exporterUser, nobodyToken)), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	args := []string{"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + port,
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--etcd-servers=http://127.0.0.1:" + etcdClient,
		"--token-auth-file=" + tokens, "--authorization-mode=RBAC", "--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + keyFile,
		"--service-account-signing-key-file=" + keyFile, "--service-cluster-ip-range=10.0.0.0/24",
		// No controller manager makes each namespace's default service
		// account: pods are admitted without one.
		"--disable-admission-plugins=ServiceAccount",
		// Loopback only: the kubernetes Service's endpoint cannot be 127.0.0.1.
		"--endpoint-reconciler-type=none"}
	url := "https://127.0.0.1:" + port
	c := &cluster{url: url, dir: dir, bin: filepath.Join(tools, "kube-apiserver"), args: args}
	c.startAPIServer(t)
	c.version = c.serverVersion(t)
	t.Logf("kube-apiserver %s and etcd on loopback (%s)", c.version, url)
	return c
}

// startAPIServer starts kube-apiserver (again) and waits until it is
// ready; its certificates and etcd's data stay from the last run.
func (c *cluster) startAPIServer(t *testing.T) {
	t.Helper()
	c.apiserver = start(t, c.dir, "kube-apiserver", c.bin, c.args...)
	waitHTTP(t, c.url+"/readyz", 3*time.Minute)
}

// stopAPIServer kills kube-apiserver: its clients find nobody listening.
func (c *cluster) stopAPIServer(t *testing.T) {
	t.Helper()
	if c.apiserver == nil {
		return
	}
	_ = c.apiserver.Process.Kill()
	for i := 0; i < 100; i++ {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(c.url, "https://"), 100*time.Millisecond)
		if err != nil {
			break
		}
		conn.Close()
		time.Sleep(50 * time.Millisecond)
	}
	c.apiserver = nil
}

func (c *cluster) restConfig(token string) *rest.Config {
	return &rest.Config{Host: c.url, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

// serverVersion is the API server's /version.
func (c *cluster) serverVersion(t *testing.T) string {
	t.Helper()
	hc, err := rest.HTTPClientFor(c.restConfig(adminToken))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(c.url + "/version")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v version.Info
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("/version: %v", err)
	}
	return v.GitVersion
}

// client is the test's own client, for what an administrator does (RBAC,
// namespaces, pods): the dynamic client over objects built from the API
// types, so that the test links no typed clientset.
func (c *cluster) client(t *testing.T, token string) dynamic.Interface {
	t.Helper()
	k, err := dynamic.NewForConfig(c.restConfig(token))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	podsGVR                = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	namespacesGVR          = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	clusterRolesGVR        = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}
	clusterRoleBindingsGVR = schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}
)

// create creates obj (an API type with its TypeMeta set) as resource gvr in
// namespace ns ("" for a cluster-wide object) and decodes the server's
// answer into out (nil: not wanted).
func create(t *testing.T, admin dynamic.Interface, gvr schema.GroupVersionResource, ns string, obj, out any) {
	t.Helper()
	u, err := k8sruntime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	var res dynamic.ResourceInterface = admin.Resource(gvr)
	if ns != "" {
		res = admin.Resource(gvr).Namespace(ns)
	}
	got, err := res.Create(context.Background(), &unstructured.Unstructured{Object: u}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s: %v", gvr.Resource, u["metadata"], err)
	}
	if out != nil {
		if err := k8sruntime.DefaultUnstructuredConverter.FromUnstructured(got.Object, out); err != nil {
			t.Fatal(err)
		}
	}
}

// metaClient is the exporter's own client (kubeapi), from a kubeconfig as
// --kubernetes.kubeconfig gives it.
func (c *cluster) metaClient(t *testing.T, token string) *kubeapi.Client {
	t.Helper()
	cfg, err := kubeapi.LoadKubeconfig(c.kubeconfig(t, token))
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubeapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// kubeconfig writes a kubeconfig for token.
func (c *cluster) kubeconfig(t *testing.T, token string) string {
	t.Helper()
	path := filepath.Join(c.dir, "kubeconfig-"+token[:8])
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: u}}]
current-context: test
`, c.url, token)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// grantExporter gives the exporter's identity what the Helm chart's
// ClusterRole gives it with pod labels or UIDs on: get, list and watch
// pods (deploy's chart test checks the chart's rules are these).
func grantExporter(t *testing.T, admin dynamic.Interface) {
	t.Helper()
	role := &rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-pool-exporter-pods"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}}
	create(t, admin, clusterRolesGVR, "", role, nil)
	binding := &rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-pool-exporter-pods"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: "User", Name: exporterUser}}}
	create(t, admin, clusterRoleBindingsGVR, "", binding, nil)
}

func createPod(t *testing.T, admin dynamic.Interface, ns, name, node string, labels map[string]string) *corev1.Pod {
	t.Helper()
	if _, err := admin.Resource(namespacesGVR).Get(context.Background(), ns, metav1.GetOptions{}); err != nil {
		create(t, admin, namespacesGVR, "", &corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: ns}}, nil)
	}
	p := &corev1.Pod{}
	create(t, admin, podsGVR, ns, &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}, p)
	return p
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The watch, on a real API server: this node's pods only (the server
// applies the spec.nodeName field selector), with the RBAC the chart
// grants, their UIDs and allowed labels, following creations, label changes
// and deletions; an identity without the grant never syncs.
func TestMetaWatcherOnARealAPIServer(t *testing.T) {
	c := startCluster(t)
	admin := c.client(t, adminToken)
	grantExporter(t, admin)
	train := createPod(t, admin, "ml", "train-0", "node-a", map[string]string{"app.kubernetes.io/name": "train", "team": "research"})
	createPod(t, admin, "ml", "elsewhere-0", "node-b", map[string]string{"app.kubernetes.io/name": "other"})

	allow, err := podmap.ParseLabelAllowlist([]string{`^app\.kubernetes\.io/`})
	if err != nil {
		t.Fatal(err)
	}
	w, err := podmap.NewMetaWatcher(podmap.MetaConfig{Client: c.metaClient(t, exporterToken), NodeName: "node-a", Labels: true, LabelAllowlist: allow, Logger: zerolog.New(io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-w.FirstRefresh():
	case <-time.After(30 * time.Second):
		t.Fatal("the watcher did not sync within 30s")
	}
	m, ok := w.Lookup("ml", "train-0")
	if !ok || m.UID != string(train.UID) || len(m.Labels) != 1 || m.Labels["app.kubernetes.io/name"] != "train" {
		t.Errorf("train-0: %+v %v; want UID %s and app.kubernetes.io/name=train alone", m, ok, train.UID)
	}
	if _, ok := w.Lookup("ml", "elsewhere-0"); ok {
		t.Error("a pod of node-b is in node-a's cache: the field selector was not applied")
	}

	bctx := context.Background()
	infer := createPod(t, admin, "ml", "infer-0", "node-a", map[string]string{"app.kubernetes.io/name": "infer"})
	waitUntil(t, "infer-0 in the cache", func() bool { m, ok := w.Lookup("ml", "infer-0"); return ok && m.UID == string(infer.UID) })
	pods := admin.Resource(podsGVR).Namespace("ml")
	cur, err := pods.Get(bctx, "train-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	labels := cur.GetLabels()
	labels["app.kubernetes.io/name"] = "train-v2"
	cur.SetLabels(labels)
	if _, err := pods.Update(bctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "train-0's new label", func() bool {
		m, _ := w.Lookup("ml", "train-0")
		return m.Labels["app.kubernetes.io/name"] == "train-v2"
	})
	zero := int64(0)
	if err := pods.Delete(bctx, "infer-0", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "infer-0 gone", func() bool { _, ok := w.Lookup("ml", "infer-0"); return !ok })

	// Without the grant: no list, no sync.
	nobody, err := podmap.NewMetaWatcher(podmap.MetaConfig{Client: c.metaClient(t, nobodyToken), NodeName: "node-a", Logger: zerolog.New(io.Discard)})
	if err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithCancel(context.Background())
	ndone := make(chan struct{})
	go func() { defer close(ndone); nobody.Run(nctx) }()
	select {
	case <-nobody.FirstRefresh():
		t.Error("an identity without get/list/watch on pods synced")
	case <-time.After(3 * time.Second):
	}
	ncancel()
	<-ndone
}

// The exporter on the simulated node, its pods created on the real API
// server as running on its node: the DCGM_FI_* series of every held device
// carry the pod's UID and labels from the server, from the first page on.
func TestExporterPodLabelsOnARealAPIServer(t *testing.T) {
	c := startCluster(t)
	admin := c.client(t, adminToken)
	grantExporter(t, admin)
	// The built-in simulated node's pods (sim/simnode's default scenario).
	pods := map[string]*corev1.Pod{}
	for _, p := range []struct{ ns, name, app string }{
		{"ml-training", "llm-pretrain-0", "llm-pretrain"}, {"ml-training", "llm-pretrain-1", "llm-pretrain"},
		{"research", "notebook-alice", "notebook"}, {"inference", "chat-api-0", "chat-api"},
	} {
		pods[p.name] = createPod(t, admin, p.ns, p.name, "gpu-node-7", map[string]string{"app.kubernetes.io/name": p.app, "team": "t"})
	}
	bin := exporterBinary(t, c.dir)
	addr := "127.0.0.1:" + freePort(t)
	start(t, c.dir, "exporter", bin, "--web.listen-address="+addr, "--collect-interval=1s",
		"--node-name=gpu-node-7", "--compat.dcgm-exporter",
		"--compat.dcgm-exporter.kubernetes-enable-pod-uid", "--compat.dcgm-exporter.kubernetes-enable-pod-labels",
		"--compat.dcgm-exporter.kubernetes-pod-label-allowlist-regex=^app\\.kubernetes\\.io/",
		// chat-api-0 holds the time-sliced GPU 6 through nvidia.com/gpu.shared.
		"--compat.dcgm-exporter.nvidia-resource-names=nvidia.com/gpu.shared",
		"--kubernetes.kubeconfig="+c.kubeconfig(t, exporterToken))
	var page string
	waitUntil(t, "/readyz", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		r, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		page = string(b)
		return true
	})
	seen := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "DCGM_FI_DEV_GPU_TEMP{") {
			continue
		}
		for name, p := range pods {
			if !strings.Contains(l, `pod="`+name+`"`) {
				continue
			}
			seen[name] = true
			for _, want := range []string{`pod_uid="` + string(p.UID) + `"`, `app_kubernetes_io_name="` + p.Labels["app.kubernetes.io/name"] + `"`} {
				if !strings.Contains(l, want) {
					t.Errorf("the first ready page's series of %s lacks %s: %s", name, want, l)
				}
			}
			if strings.Contains(l, "team=") {
				t.Errorf("a label the allowlist leaves out is served: %s", l)
			}
		}
	}
	for name := range pods {
		if !seen[name] {
			t.Errorf("no DCGM_FI_DEV_GPU_TEMP series of %s on the first ready page", name)
		}
	}
}

// exporterBinary is the simulated node's binary: GPE_TEST_SIM_BINARY (make
// builds it once), else a build of cmd/gpu-pool-exporter-sim into dir.
func exporterBinary(t *testing.T, dir string) string {
	t.Helper()
	if b := os.Getenv("GPE_TEST_SIM_BINARY"); b != "" {
		return b
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := filepath.Join(dir, "gpu-pool-exporter-sim")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/gpu-pool-exporter-sim")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}
