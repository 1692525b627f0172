package deploy_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// No Docker engine runs in the tests: the Dockerfile is parsed and checked
// for the properties a build would otherwise reveal late, or never.

type instruction struct {
	cmd  string // upper case
	args string
	line int
}

type stage struct {
	name, image string
	instrs      []instruction
}

type dockerfile struct {
	syntax     string
	globalArgs map[string]string
	stages     []stage
}

func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	var instrs []instruction
	var syntax string
	var cur strings.Builder
	start, n := 0, 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if n == 1 {
			if v, ok := strings.CutPrefix(trimmed, "# syntax="); ok {
				syntax = v
			}
		}
		// Comment lines, also inside a continued instruction, are dropped.
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if body, cont := strings.CutSuffix(trimmed, `\`); cont {
			cur.WriteString(body + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		instrs = append(instrs, instruction{strings.ToUpper(cmd), strings.TrimSpace(args), start})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	d := dockerfile{syntax: syntax, globalArgs: map[string]string{}}
	for _, in := range instrs {
		switch {
		case in.cmd == "FROM":
			fields := strings.Fields(in.args)
			fields = slices.DeleteFunc(fields, func(s string) bool { return strings.HasPrefix(s, "--platform=") })
			s := stage{image: d.expand(fields[0])}
			if len(fields) == 3 && strings.EqualFold(fields[1], "AS") {
				s.name = fields[2]
			}
			d.stages = append(d.stages, s)
		case len(d.stages) == 0:
			if in.cmd != "ARG" {
				t.Errorf("%s:%d: only ARG may precede the first FROM, got %s", path, in.line, in.cmd)
				continue
			}
			k, v, _ := strings.Cut(in.args, "=")
			d.globalArgs[k] = v
		default:
			s := &d.stages[len(d.stages)-1]
			s.instrs = append(s.instrs, in)
		}
	}
	return d
}

var argRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// expand substitutes global ARG defaults, as FROM lines see them.
func (d dockerfile) expand(s string) string {
	return argRef.ReplaceAllStringFunc(s, func(m string) string {
		return d.globalArgs[argRef.FindStringSubmatch(m)[1]]
	})
}

func (d dockerfile) stage(name string) *stage {
	for i := range d.stages {
		if d.stages[i].name == name {
			return &d.stages[i]
		}
	}
	return nil
}

func (s *stage) all(cmd string) []instruction {
	var out []instruction
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in)
		}
	}
	return out
}

// pinnedRef reports whether an image reference names a version: a digest,
// or a tag other than latest.
func pinnedRef(ref string) bool {
	if strings.Contains(ref, "@sha256:") {
		return true
	}
	name := ref[strings.LastIndex(ref, "/")+1:]
	_, tag, ok := strings.Cut(name, ":")
	return ok && tag != "" && tag != "latest" && !strings.Contains(tag, "$")
}

// envSets reports whether an ENV instruction (key=value form) sets key to value.
func envSets(in instruction, key, value string) bool {
	for _, kv := range strings.Fields(in.args) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key && strings.Trim(v, `"`) == value {
			return true
		}
	}
	return false
}

func TestDockerfile(t *testing.T) {
	path := filepath.Join(repoRoot, "Dockerfile")
	d := parseDockerfile(t, path)

	if d.syntax != "" && !pinnedRef(d.syntax) {
		t.Errorf("syntax directive %q is not pinned to a version", d.syntax)
	}

	// Every base image pinned: no untagged reference, no :latest.
	names := map[string]bool{}
	for _, s := range d.stages {
		switch {
		case names[s.image]:
			// FROM an earlier stage.
		case s.image == "" || strings.Contains(s.image, "$"):
			t.Errorf("stage %q: base image %q does not resolve from the ARG defaults", s.name, s.image)
		case !pinnedRef(s.image):
			t.Errorf("stage %q: base image %q is not pinned (no tag, or latest)", s.name, s.image)
		}
		if s.name != "" {
			names[s.name] = true
		}
	}

	// The build stage: cgo, and the exporter's main package.
	build := d.stage("build")
	if build == nil {
		t.Fatal("no stage named build")
	}
	if !strings.HasPrefix(build.image, "golang:") {
		t.Errorf("build stage from %q, want the golang image", build.image)
	}
	if !slices.ContainsFunc(build.all("ENV"), func(in instruction) bool { return envSets(in, "CGO_ENABLED", "1") }) {
		t.Error("build stage does not set CGO_ENABLED=1: go-nvml and go-dcgm dlopen their libraries through cgo")
	}
	if !slices.ContainsFunc(build.all("RUN"), func(in instruction) bool {
		return strings.Contains(in.args, "go build") && strings.Contains(in.args, "./cmd/gpu-pool-exporter")
	}) {
		t.Error("build stage never runs go build ./cmd/gpu-pool-exporter")
	}

	// Two targets: runtime (the default, hence last) and dcgm.
	if last := d.stages[len(d.stages)-1]; last.name != "runtime" {
		t.Errorf("the last stage (docker build's default target) is %q, want runtime", last.name)
	}
	for _, target := range []string{"runtime", "dcgm"} {
		s := d.stage(target)
		if s == nil {
			t.Errorf("no target %q", target)
			continue
		}
		// The agent, the command for people and the simulated node's
		// binary, each copied from the build stage into /usr/bin.
		for _, bin := range []string{"gpu-pool-exporter", "gpupool", "gpu-pool-exporter-sim"} {
			if !slices.ContainsFunc(s.all("COPY"), func(in instruction) bool {
				f := strings.Fields(in.args)
				return slices.Contains(f, "--from=build") && slices.Contains(f, "/out/"+bin) && len(f) > 0 && f[len(f)-1] == "/usr/bin/"
			}) {
				t.Errorf("target %s does not copy %s from the build stage into /usr/bin/", target, bin)
			}
		}
		var entry []string
		if e := s.all("ENTRYPOINT"); len(e) > 0 {
			if err := json.Unmarshal([]byte(e[len(e)-1].args), &entry); err != nil {
				t.Errorf("target %s: ENTRYPOINT is not in exec form: %v", target, err)
			}
		}
		if !slices.Equal(entry, []string{"/usr/bin/gpu-pool-exporter"}) {
			t.Errorf("target %s: ENTRYPOINT %v, want [/usr/bin/gpu-pool-exporter]", target, entry)
		}
		// Non-root by default; the manifests document why they run as UID 0.
		users := s.all("USER")
		if len(users) == 0 {
			t.Errorf("target %s has no USER: it would run as root by default", target)
			continue
		}
		user, _, _ := strings.Cut(users[len(users)-1].args, ":")
		if user == "0" || user == "root" {
			t.Errorf("target %s runs as root by default", target)
		}
		if s.image == "" || strings.Contains(s.image, "static") || strings.Contains(s.image, "scratch") || strings.Contains(s.image, "alpine") {
			t.Errorf("target %s on %q: the cgo binary needs glibc", target, s.image)
		}
	}
	if s := d.stage("dcgm"); s != nil && !strings.HasPrefix(s.image, "nvcr.io/nvidia/cloud-native/dcgm:") {
		t.Errorf("dcgm target on %q, want NVIDIA's DCGM image (libdcgm.so.4 and its modules)", s.image)
	}

	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), "# Privileges:") {
		t.Error("the Dockerfile must document the privileges the exporter needs (a \"# Privileges:\" comment block)")
	}

	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(strings.Fields(string(ignore)), ".git") {
		t.Error(".dockerignore must exclude .git")
	}
}
