// The packages' shape: which packages and files use which, and the doc.go
// of each package that names its files in the order of its flow.

package readme

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
)

// listedPackage is what `go list -export -json` says of a package.
type listedPackage struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
	CgoFiles   []string
	Imports    []string
}

// fileGraph is which files of one package use what other files of it
// declare (package-level names, methods and struct fields).
type fileGraph struct {
	Path  string
	Files []string
	// Uses are, per file, the objects declared in another file of the
	// package that it uses, by the declaring file.
	Uses map[string]map[string]map[types.Object]bool
}

// References is the number of distinct (file, object declared in another
// file) uses.
func (g *fileGraph) References() int {
	n := 0
	for _, to := range g.Uses {
		for _, objs := range to {
			n += len(objs)
		}
	}
	return n
}

// Edges is the number of ordered file pairs (a uses b).
func (g *fileGraph) Edges() int {
	n := 0
	for _, to := range g.Uses {
		n += len(to)
	}
	return n
}

// TwoWay lists the file pairs that use each other, each as "a.go<->b.go"
// with a before b, and what each uses of the other.
func (g *fileGraph) TwoWay() map[string]string {
	out := map[string]string{}
	for a, to := range g.Uses {
		for b, objs := range to {
			back := g.Uses[b][a]
			if a >= b || len(back) == 0 {
				continue
			}
			out[a+"<->"+b] = fmt.Sprintf("%s uses %s; %s uses %s", a, objectNames(objs), b, objectNames(back))
		}
	}
	return out
}

func objectNames(objs map[types.Object]bool) string {
	var names []string
	for o := range objs {
		name := o.Name()
		if f, ok := o.(*types.Func); ok {
			if recv := f.Signature().Recv(); recv != nil {
				name = types.TypeString(recv.Type(), func(*types.Package) string { return "" }) + "." + name
			}
		}
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// flowPatterns are the product's packages whose files must use each other
// one way: the collector, the agent, its server and API client, the
// analytics.
var flowPatterns = []string{"./collector/...", "./agent", "./server", "./kubeapi", "./analytics/fleet", "./analytics/promapi", "./analytics/rightsize"}

// productPackages are the packages of flowPatterns and every package they
// need, listed once per test binary.
var productPackages = sync.OnceValues(func() (map[string]*listedPackage, error) {
	return goList(flowPatterns...)
})

// listPackages is productPackages, or the test skipped without a go
// command.
func listPackages(t *testing.T) map[string]*listedPackage {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no go command to list the packages: %v", err)
	}
	pkgs, err := productPackages()
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// goList runs `go list -export -deps` on patterns from the module's root:
// every package they need, with its compiled export data.
func goList(patterns ...string) (map[string]*listedPackage, error) {
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,Export,GoFiles,CgoFiles,Imports"}, patterns...)...)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]*listedPackage{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs, nil
		} else if err != nil {
			return nil, err
		}
		pkgs[p.ImportPath] = &p
	}
}

// buildFileGraph type-checks a package's non-test files against its
// imports' export data and records which file uses what another declares.
func buildFileGraph(pkgs map[string]*listedPackage, path string) (*fileGraph, error) {
	p := pkgs[path]
	if p == nil {
		return nil, fmt.Errorf("%s was not listed", path)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	g := &fileGraph{Path: path, Uses: map[string]map[string]map[types.Object]bool{}}
	for _, name := range append(append([]string(nil), p.GoFiles...), p.CgoFiles...) {
		f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
		g.Files = append(g.Files, name)
	}
	sort.Strings(g.Files)
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		d := pkgs[path]
		if d == nil || d.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(d.Export)
	})
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	// FakeImportC: cgo's C.x resolve to nothing and say nothing; any other
	// error would leave uses unresolved, so it fails the graph.
	conf := types.Config{Importer: imp, FakeImportC: true}
	tpkg, err := conf.Check(path, fset, files, info)
	if err != nil {
		return nil, fmt.Errorf("type-checking %s: %v", path, err)
	}
	for id, obj := range info.Uses {
		if obj == nil || obj.Pkg() != tpkg || !obj.Pos().IsValid() {
			continue
		}
		from := filepath.Base(fset.Position(id.Pos()).Filename)
		to := filepath.Base(fset.Position(obj.Pos()).Filename)
		if from == to {
			continue
		}
		if g.Uses[from] == nil {
			g.Uses[from] = map[string]map[types.Object]bool{}
		}
		if g.Uses[from][to] == nil {
			g.Uses[from][to] = map[types.Object]bool{}
		}
		g.Uses[from][to][obj] = true
	}
	return g, nil
}

const modulePath = "github.com/gpu-pool-exporter/gpu-pool-exporter"

// The orchestration's packages, in the order of the flow: the data model
// every source fills, the join of a sample into state, the render of state
// into the page, and the exporter that runs the loop and serves the page.
// Each may import only those before it.
var flowPackages = []string{"collector/sample", "collector/state", "collector/render", "collector"}

// docOrderedPackages are the packages besides the flow's whose doc.go names
// their files in the order of their own flow.
var docOrderedPackages = []string{"agent", "server", "kubeapi", "analytics/fleet", "analytics/promapi", "analytics/rightsize"}

// unavoidableTwoWay lists the pairs of files of one package that use each
// other and must, with the reason ("package: a.go<->b.go", a before b).
// Every other pair of files is used one way.
var unavoidableTwoWay = map[string]string{
	"collector/dcgm: client.go<->client_real.go": "openReal is the build-tagged seam: client_real.go (cgo on Linux) or client_nocgo.go implements it over client.go's types, and DefaultOpen, in the file every build shares, calls it",
}

// TestPackagesFlowOneWay: each orchestration package imports only those
// before it in the flow, so the compiler holds the join apart from the
// render and both apart from the exporter.
func TestPackagesFlowOneWay(t *testing.T) {
	pkgs := listPackages(t)
	for i, p := range flowPackages {
		lp := pkgs[modulePath+"/"+p]
		if lp == nil {
			t.Fatalf("%s was not listed", p)
		}
		for _, later := range flowPackages[i+1:] {
			if slices.Contains(lp.Imports, modulePath+"/"+later) {
				t.Errorf("%s imports %s, which comes after it in the flow (%s)", p, later, strings.Join(flowPackages, " -> "))
			}
		}
	}
}

// TestFilesReferenceOneWay builds, for every package of flowPatterns, which
// file uses what another file of the package declares, and fails on a
// pair of files that use each other unless unavoidableTwoWay gives the
// reason. `go test -v -run TestFilesReferenceOneWay .` prints each
// package's figures.
func TestFilesReferenceOneWay(t *testing.T) {
	pkgs := listPackages(t)
	var paths []string
	for p := range pkgs {
		for _, pat := range flowPatterns {
			dir := modulePath + "/" + strings.TrimSuffix(strings.TrimPrefix(pat, "./"), "/...")
			if p == dir || (strings.HasSuffix(pat, "/...") && strings.HasPrefix(p, dir+"/")) {
				paths = append(paths, p)
			}
		}
	}
	sort.Strings(paths)
	if len(paths) < len(flowPackages) {
		t.Fatalf("listed %d packages of %v: %v", len(paths), flowPatterns, paths)
	}
	seen := map[string]bool{}
	for _, p := range paths {
		g, err := buildFileGraph(pkgs, p)
		if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(p, modulePath+"/")
		tw := g.TwoWay()
		t.Logf("%-24s files %2d  cross-file references %3d  file pairs used %3d  two-way pairs %d", rel, len(g.Files), g.References(), g.Edges(), len(tw))
		var keys []string
		for k := range tw {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			key := rel + ": " + k
			seen[key] = true
			if why, ok := unavoidableTwoWay[key]; ok {
				t.Logf("    %s (unavoidable: %s)", key, why)
				continue
			}
			t.Errorf("%s use each other: %s. Move what both need to one of them or to a file both use, or list the pair in unavoidableTwoWay with the reason", key, tw[k])
		}
	}
	for k := range unavoidableTwoWay {
		if !seen[k] {
			t.Errorf("unavoidableTwoWay lists %s, which no longer use each other: drop the entry", k)
		}
	}
}

// docFileName is a file name in a doc comment, not one of another package
// (state/join.go).
var docFileName = regexp.MustCompile(`(?:^|[^/\w])([a-z0-9_]+\.go)\b`)

// TestDocNamesFilesInFlowOrder: the doc.go of each orchestration package,
// and of docOrderedPackages, names every file of the package, and names them in the order of the
// flow: a file uses only the files named before it.
func TestDocNamesFilesInFlowOrder(t *testing.T) {
	pkgs := listPackages(t)
	for _, p := range append(slices.Clone(flowPackages), docOrderedPackages...) {
		t.Run(p, func(t *testing.T) {
			g, err := buildFileGraph(pkgs, modulePath+"/"+p)
			if err != nil {
				t.Fatal(err)
			}
			doc, err := parser.ParseFile(token.NewFileSet(), filepath.Join(pkgs[modulePath+"/"+p].Dir, "doc.go"), nil, parser.PackageClauseOnly|parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if doc.Doc == nil {
				t.Fatalf("%s/doc.go has no package comment", p)
			}
			at := map[string]int{}
			var order []string
			for _, m := range docFileName.FindAllStringSubmatch(doc.Doc.Text(), -1) {
				if _, ok := at[m[1]]; !ok {
					at[m[1]] = len(order)
					order = append(order, m[1])
				}
			}
			for _, f := range order {
				if !slices.Contains(g.Files, f) {
					t.Errorf("%s/doc.go names %s, which the package does not have", p, f)
				}
			}
			for _, f := range g.Files {
				if f == "doc.go" {
					continue
				}
				i, ok := at[f]
				if !ok {
					t.Errorf("%s/doc.go does not name %s: say where it sits in the flow", p, f)
					continue
				}
				for used, objs := range g.Uses[f] {
					if j, ok := at[used]; ok && j > i {
						t.Errorf("%s/doc.go names %s before %s, which it uses (%s): name them in the order of the flow", p, f, used, objectNames(objs))
					}
				}
			}
			t.Logf("%s: %s", p, strings.Join(order, " -> "))
		})
	}
}
