package deploy_test

// README's Install section and docs/deployment.md, run: every command that can
// run offline (helm install as helm template, kubectl apply -k as a kustomize
// build), checked against what they say it does. The other blocks of README
// and docs/ are run by readme_test.go at the top.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// block is one fenced code block of README.md or docs/deployment.md.
type block struct {
	file    string // from the top directory
	lang    string
	line    int    // of the opening fence
	section string // the "# " or "## " heading above it
	text    string
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// installDocs are the files whose install commands TestREADMEInstall runs:
// README's Install section and all of docs/deployment.md.
var installDocs = []struct{ file, section string }{
	{"README.md", "Install"},
	{"docs/deployment.md", ""},
}

// installBlocks returns the code blocks of installDocs.
func installBlocks(t *testing.T) []block {
	t.Helper()
	var blocks []block
	for _, d := range installDocs {
		for _, b := range fileBlocks(t, d.file) {
			if d.section == "" || b.section == d.section {
				blocks = append(blocks, b)
			}
		}
	}
	return blocks
}

func fileBlocks(t *testing.T, file string) []block {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	var section string
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && (strings.HasPrefix(l, "# ") || strings.HasPrefix(l, "## ")):
			section = strings.TrimLeft(l, "# ")
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &block{file: file, lang: strings.TrimPrefix(l, "```"), line: i + 1, section: section}
		case cur != nil && l == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += l + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: code block never closed", file, cur.line)
	}
	return blocks
}

// commands are a shell block's commands: comments dropped, continuation
// lines joined.
func commands(text string) []string {
	var cmds []string
	var cur string
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			cur += strings.TrimSuffix(l, `\`)
			continue
		}
		cmds = append(cmds, strings.Join(strings.Fields(cur+l), " "))
		cur = ""
	}
	return cmds
}

// rendered is one rendering of the chart or an overlay, by kind.
type rendered struct {
	where   string
	objects map[string][]map[string]any // by kind
	ds      appsv1.DaemonSet
}

func render(t *testing.T, where string, stream []byte) *rendered {
	t.Helper()
	r := &rendered{where: where, objects: map[string][]map[string]any{}}
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatalf("%s: %v", where, err)
		}
		if obj == nil {
			continue
		}
		kind, _ := obj["kind"].(string)
		r.objects[kind] = append(r.objects[kind], obj)
		if kind == "DaemonSet" {
			if err := yaml.UnmarshalStrict(doc, &r.ds); err != nil {
				t.Errorf("%s: DaemonSet: %v", where, err)
			}
		}
	}
	if n := len(r.objects["DaemonSet"]); n != 1 {
		t.Fatalf("%s: %d DaemonSets, want 1", where, n)
	}
	return r
}

func (r *rendered) container() corev1.Container { return r.ds.Spec.Template.Spec.Containers[0] }

// has checks README's words "creates a KIND".
func (r *rendered) has(t *testing.T, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		if len(r.objects[k]) == 0 {
			t.Errorf("%s: README says it creates a %s; it does not", r.where, k)
		}
	}
}

func (r *rendered) labelled(t *testing.T, kind, key, value string) {
	t.Helper()
	for _, o := range r.objects[kind] {
		labels, _ := o["metadata"].(map[string]any)["labels"].(map[string]any)
		if labels[key] != value {
			t.Errorf("%s: %s lacks the label %s=%s that README's --set gives it", r.where, kind, key, value)
		}
	}
}

// checkCommon holds what README's Install section says of every profile.
func (r *rendered) checkCommon(t *testing.T) {
	t.Helper()
	spec := r.ds.Spec.Template.Spec
	tolerated := false
	for _, tl := range spec.Tolerations {
		tolerated = tolerated || (tl.Key == "nvidia.com/gpu" && tl.Operator == corev1.TolerationOpExists)
	}
	if !tolerated {
		t.Errorf("%s: does not tolerate the nvidia.com/gpu taint whatever its value", r.where)
	}
	for _, c := range spec.Containers {
		for _, rl := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			if _, ok := rl["nvidia.com/gpu"]; ok {
				t.Errorf("%s: container %s requests nvidia.com/gpu", r.where, c.Name)
			}
		}
	}
}

// profileChecks are README's words on each profile, by values file or overlay.
var profileChecks = map[string]func(t *testing.T, r *rendered){
	"gke": func(t *testing.T, r *rendered) {
		r.has(t, "PodMonitoring", "ClusterRules", "ResourceQuota")
		c := r.container()
		mountedAt := map[string]string{}
		for _, m := range c.VolumeMounts {
			mountedAt[m.Name] = m.MountPath
		}
		found := false
		for _, v := range r.ds.Spec.Template.Spec.Volumes {
			if v.HostPath != nil && v.HostPath.Path == "/home/kubernetes/bin/nvidia" && mountedAt[v.Name] == "/usr/local/nvidia" {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: the host's /home/kubernetes/bin/nvidia is not mounted at /usr/local/nvidia", r.where)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if env["LD_LIBRARY_PATH"] != "/usr/local/nvidia/lib64" {
			t.Errorf("%s: LD_LIBRARY_PATH=%q, README says /usr/local/nvidia/lib64", r.where, env["LD_LIBRARY_PATH"])
		}
	},
	"gpu-operator": func(t *testing.T, r *rendered) {
		r.has(t, "ServiceMonitor", "PrometheusRule")
		if rc := r.ds.Spec.Template.Spec.RuntimeClassName; rc == nil || *rc != "nvidia" {
			t.Errorf("%s: not on the Operator's nvidia RuntimeClass", r.where)
		}
		if !slices.Contains(r.container().Args, "--dcgm.host-engine=nvidia-dcgm.gpu-operator.svc:5555") {
			t.Errorf("%s: args %q lack --dcgm.host-engine=nvidia-dcgm.gpu-operator.svc:5555", r.where, r.container().Args)
		}
	},
}

func profileOf(args []string) string {
	for _, a := range args {
		for p := range profileChecks {
			if strings.Contains(a, "values-"+p+".yaml") || strings.HasSuffix(a, "overlays/"+p) {
				return p
			}
		}
	}
	return ""
}

// chartImage is the image's one place: values.yaml's image.repository and
// Chart.yaml's appVersion.
func chartImage(t *testing.T) (repository, tag string) {
	t.Helper()
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
		} `json:"image"`
	}
	for f, v := range map[string]any{chartDir + "/Chart.yaml": &chart, chartDir + "/values.yaml": &values} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	return values.Image.Repository, chart.AppVersion
}

// sameObjects compares two renderings whatever their order and formatting.
func sameObjects(t *testing.T, what string, a, b []byte) {
	t.Helper()
	norm := func(stream []byte) []string {
		var docs []string
		dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(stream)))
		for {
			doc, err := dec.Read()
			if err != nil {
				break
			}
			var v any
			if yaml.Unmarshal(doc, &v) == nil && v != nil {
				j, _ := json.Marshal(v)
				docs = append(docs, string(j))
			}
		}
		slices.Sort(docs)
		return docs
	}
	if !slices.Equal(norm(a), norm(b)) {
		t.Errorf("%s: the two renderings differ", what)
	}
}

// kustomizeCLI is the standalone kustomize README names, and the
// sigs.k8s.io/kustomize/api version it is built from (its go.mod), which go.mod
// must require so that the library test renders what the CLI does.
const (
	kustomizeCLI      = "sigs.k8s.io/kustomize/kustomize/v5@v5.8.2"
	kustomizeCLIAPIVe = "v0.21.2"
)

// TestREADMEInstall runs every install command (README's Install section,
// docs/deployment.md) that can run offline: helm
// install as helm template, kubectl apply -k as a kustomize build (library,
// kubectl's own and the pinned CLI where installed), the image override; and
// checks what README says each creates.
func TestREADMEInstall(t *testing.T) {
	var docs []byte
	for _, d := range installDocs {
		b, err := os.ReadFile(filepath.Join(repoRoot, d.file))
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, b...)
	}
	if !bytes.Contains(docs, []byte("go install "+kustomizeCLI)) {
		t.Errorf("neither README nor docs/deployment.md tells users to install %s", kustomizeCLI)
	}
	gomod, _ := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if !regexp.MustCompile(`(?m)^\s*sigs\.k8s\.io/kustomize/api ` + regexp.QuoteMeta(kustomizeCLIAPIVe) + `\b`).Match(gomod) {
		t.Errorf("go.mod does not require sigs.k8s.io/kustomize/api %s, the library of %s", kustomizeCLIAPIVe, kustomizeCLI)
	}
	repo, tag := chartImage(t)
	var ran int
	for _, b := range installBlocks(t) {
		switch b.lang {
		case "yaml":
			checkImageBlock(t, b)
			ran++
			continue
		case "sh":
		default:
			t.Errorf("%s: a %q block the test does not know how to check", b.where(), b.lang)
			continue
		}
		for _, c := range commands(b.text) {
			args := strings.Fields(c)
			switch {
			case strings.HasPrefix(c, "kubectl create namespace "), strings.HasPrefix(c, "kubectl label namespace "), strings.HasPrefix(c, "docker push "):
				// needs a cluster or a registry
			case strings.HasPrefix(c, "docker build "):
				ref := args[slices.Index(args, "-t")+1]
				if !strings.HasSuffix(ref, ":"+tag) || args[len(args)-1] != "." {
					t.Errorf("%s: %q builds %s, want the chart's appVersion %s as tag, from the top directory", b.where(), c, ref, tag)
				}
			case strings.HasPrefix(c, "helm install "):
				ran++
				checkHelmInstall(t, b, args, repo, tag)
			case strings.HasPrefix(c, "kubectl apply -k "):
				ran++
				checkApplyK(t, b, fromRoot(args[3]))
			default:
				t.Errorf("%s: %q: a command the test does not know how to check", b.where(), c)
			}
		}
	}
	if ran < 5 {
		t.Errorf("ran %d of README's install commands, want at least 5 (3 helm install, 2 kubectl apply -k)", ran)
	}
}

func checkHelmInstall(t *testing.T, b block, args []string, repo, tag string) {
	t.Helper()
	helm := tool(t, "helm", installHelm)
	targs := []string{"template"}
	for _, a := range args[2:] {
		targs = append(targs, fromRoot(a))
	}
	out, errOut, err := helmCmd(t, helm, targs...)
	if err != nil {
		t.Errorf("%s: helm %s: %v\n%s", b.where(), strings.Join(targs, " "), err, errOut)
		return
	}
	r := render(t, b.where()+" helm "+strings.Join(targs, " "), out)
	r.checkCommon(t)
	if p := profileOf(args); p != "" {
		profileChecks[p](t, r)
	}
	wantRepo := repo
	for i, a := range args {
		if a != "--set" {
			continue
		}
		k, v, _ := strings.Cut(args[i+1], "=")
		switch {
		case k == "image.repository":
			wantRepo = v
		case strings.HasSuffix(k, ".additionalLabels.release"):
			kind := map[string]string{"serviceMonitor": "ServiceMonitor", "prometheusRule": "PrometheusRule"}[strings.Split(k, ".")[0]]
			r.labelled(t, kind, "release", v)
		default:
			t.Errorf("%s: --set %s: the test does not know what README says it does", b.where(), args[i+1])
		}
	}
	if got := r.container().Image; got != wantRepo+":"+tag {
		t.Errorf("%s: image %s, want %s:%s", r.where, got, wantRepo, tag)
	}
}

func goBin() string {
	out, _ := exec.Command("go", "env", "GOPATH").Output()
	return filepath.Join(strings.TrimSpace(string(out)), "bin")
}

// fromRoot turns a path as README gives it (from the top directory) into one
// from deploy/, where go test runs.
func fromRoot(arg string) string {
	if strings.HasPrefix(arg, "deploy/") {
		return filepath.Join(repoRoot, arg)
	}
	return arg
}

func checkApplyK(t *testing.T, b block, dir string) {
	t.Helper()
	out := kustomizeBuild(t, dir)
	r := render(t, b.where()+" kustomize build "+dir, out)
	r.checkCommon(t)
	profileChecks[profileOf([]string{dir})](t, r)
	ns := r.objects["Namespace"]
	if len(ns) != 1 || ns[0]["metadata"].(map[string]any)["labels"].(map[string]any)["pod-security.kubernetes.io/enforce"] != "privileged" {
		t.Errorf("%s: README says the overlay creates its namespace labelled pod-security.kubernetes.io/enforce=privileged", r.where)
	}
	repo, tag := chartImage(t)
	if got := r.container().Image; got != repo+":"+tag {
		t.Errorf("%s: image %s, the chart's is %s:%s", r.where, got, repo, tag)
	}
	// kubectl apply -k renders with kubectl's own kustomize; the standalone
	// CLI README names renders with the library above.
	if kubectl, err := exec.LookPath("kubectl"); err == nil {
		if kout, err := exec.Command(kubectl, "kustomize", dir).Output(); err != nil {
			t.Errorf("kubectl kustomize %s: %v", dir, err)
		} else {
			sameObjects(t, "kubectl kustomize "+dir+" and the kustomize library", kout, out)
		}
	}
	kustomize, err := exec.LookPath("kustomize")
	if err != nil {
		kustomize = filepath.Join(goBin(), "kustomize")
	}
	if _, err := os.Stat(kustomize); err != nil {
		msg := fmt.Sprintf("kustomize CLI not found; `go install %s` (make tools does) to compare it", kustomizeCLI)
		if os.Getenv("CI") != "" {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
		return
	}
	if v, _ := exec.Command(kustomize, "version").Output(); !strings.Contains(string(v), strings.Split(kustomizeCLI, "@")[1]) {
		t.Logf("%s is kustomize %s, not README's %s; not compared", kustomize, bytes.TrimSpace(v), kustomizeCLI)
		return
	}
	kout, err := exec.Command(kustomize, "build", dir).Output()
	if err != nil {
		t.Errorf("kustomize build %s: %v", dir, err)
		return
	}
	sameObjects(t, "kustomize build "+dir+" and the kustomize library", kout, out)
}

// checkImageBlock applies README's images: entry to a copy of the
// kustomizations and builds every overlay with it.
func checkImageBlock(t *testing.T, b block) {
	t.Helper()
	var block struct {
		Images []struct {
			Name, NewName, NewTag string
		} `json:"images"`
	}
	if err := yaml.UnmarshalStrict([]byte(b.text), &block); err != nil || len(block.Images) != 1 {
		t.Errorf("%s: not one kustomize images: entry: %v", b.where(), err)
		return
	}
	img := block.Images[0]
	tmp := t.TempDir()
	if err := os.CopyFS(tmp, os.DirFS("kustomize")); err != nil {
		t.Fatal(err)
	}
	kpath := filepath.Join(tmp, "base", "kustomization.yaml")
	raw, err := os.ReadFile(kpath)
	if err != nil {
		t.Fatal(err)
	}
	var k map[string]any
	if err := yaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	var entry map[string]any
	_ = yaml.Unmarshal([]byte(b.text), &entry)
	k["images"] = entry["images"]
	raw, _ = yaml.Marshal(k)
	if err := os.WriteFile(kpath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, o := range []string{"gke", "gpu-operator"} {
		r := render(t, b.where()+" in overlays/"+o, kustomizeBuild(t, filepath.Join(tmp, "overlays", o)))
		if got, want := r.container().Image, img.NewName+":"+img.NewTag; got != want {
			t.Errorf("%s: image %s, README says %s", r.where, got, want)
		}
	}
}

// TestImageOnePlace: the kustomize base names the image only through its
// images: entry, and that entry is the chart's image.
func TestImageOnePlace(t *testing.T) {
	repo, tag := chartImage(t)
	var k struct {
		Images []struct {
			Name, NewName, NewTag string
		} `json:"images"`
	}
	raw, err := os.ReadFile("kustomize/base/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) != 1 || k.Images[0].NewName != repo || k.Images[0].NewTag != tag {
		t.Fatalf("deploy/kustomize/base/kustomization.yaml images: %+v, want one entry with newName %s, newTag %s (the chart's image.repository and appVersion)", k.Images, repo, tag)
	}
	// No manifest names the image itself: the placeholder is the entry's name.
	err = filepath.WalkDir("kustomize", func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".yaml") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for i, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(l), "- "))
			if len(f) >= 2 && f[0] == "image:" && f[1] != k.Images[0].Name {
				t.Errorf("%s:%d: image %s; name the image only through the base's images: entry (%s)", p, i+1, f[1], k.Images[0].Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
