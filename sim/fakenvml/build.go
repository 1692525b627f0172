package fakenvml

import (
	"bufio"
	"bytes"
	"debug/elf"
	"embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

//go:embed csrc/fakenvml.c branches/*.txt
var files embed.FS

// Full is the variant that exports every function the library implements.
const Full = "full"

// Branches are the driver branches with a variant of their own, oldest
// first. Each exports only the functions its branch's nvml.h declares
// (branches/<name>.txt says which header).
var Branches = []string{"r470", "r535", "r550", "r570", "r580"}

// Future is a driver after the newest branch that has dropped every
// function the newest nvml.h marks DEPRECATED (nvmlDeviceGetTemperature,
// nvmlDeviceGetCurrentClocksThrottleReasons, ...): an exporter that calls
// one without looking it up first dies on it with "symbol lookup error".
const Future = "future"

// FieldMax is NVML_FI_MAX of each branch's header: the first field ID its
// driver does not know.
var FieldMax = map[string]uint32{"r470": 161, "r535": 197, "r550": 200, "r570": 269, "r580": 274, Future: 274}

// BranchSymbols returns the functions a driver branch exports.
func BranchSymbols(branch string) (map[string]bool, error) {
	b, err := files.ReadFile("branches/" + branch + ".txt")
	if err != nil {
		return nil, fmt.Errorf("fakenvml: no driver branch %q (have %s, %s)", branch, strings.Join(Branches, ", "), Future)
	}
	syms := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			syms[l] = true
		}
	}
	return syms, sc.Err()
}

// Builder compiles the library once and links its variants into Dir.
type Builder struct {
	Dir string

	mu          sync.Mutex
	obj         string
	implemented []string
	libs        map[string]string
}

// NewBuilder builds into dir (a test's temporary directory).
func NewBuilder(dir string) *Builder { return &Builder{Dir: dir, libs: map[string]string{}} }

// nvmlHeaderDir finds NVIDIA's nvml.h in go-nvml's module: the library is
// compiled against it, so every prototype is checked against NVIDIA's.
func nvmlHeaderDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%v: %s", err, ee.Stderr)
		}
		return "", fmt.Errorf("fakenvml: finding go-nvml's nvml.h with go list: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	if _, err := os.Stat(filepath.Join(dir, "nvml.h")); err != nil {
		return "", fmt.Errorf("fakenvml: go-nvml's nvml.h is missing: %w", err)
	}
	return dir, nil
}

func cc() string {
	if c := os.Getenv("CC"); c != "" {
		return c
	}
	return "gcc"
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if errors.Is(err, exec.ErrNotFound) {
		return fmt.Errorf("fakenvml: the fake driver library is built with a C compiler: install gcc, or set CC (%v)", err)
	}
	if err != nil {
		return fmt.Errorf("fakenvml: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// compile builds the object file every variant links.
func (b *Builder) compile() error {
	if b.obj != "" {
		return nil
	}
	inc, err := nvmlHeaderDir()
	if err != nil {
		return err
	}
	src, err := files.ReadFile("csrc/fakenvml.c")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(b.Dir, 0o755); err != nil {
		return err
	}
	c := filepath.Join(b.Dir, "fakenvml.c")
	if err := os.WriteFile(c, src, 0o644); err != nil {
		return err
	}
	obj := filepath.Join(b.Dir, "fakenvml.o")
	if err := run(cc(), "-c", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-deprecated-declarations",
		"-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-I", inc, "-o", obj, c); err != nil {
		return err
	}
	b.obj = obj
	full, err := b.link(Full, nil)
	if err != nil {
		return err
	}
	b.implemented, err = Exports(full)
	return err
}

// link links one variant; keep nil exports every global function.
func (b *Builder) link(name string, keep []string) (string, error) {
	dir := filepath.Join(b.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	// nodelete: dlclose (go-nvml closes the library at every last Shutdown)
	// must not unmap functions the process has already bound.
	args := []string{"-shared", "-Wl,-soname,libnvidia-ml.so.1", "-Wl,-z,nodelete", "-o", lib, b.obj, "-lpthread"}
	if keep != nil {
		// A version script leaves everything but keep local: dlsym of a
		// function the branch lacks fails, as on that branch's driver.
		script := filepath.Join(dir, "exports.map")
		var s strings.Builder
		s.WriteString("{\n  global:\n")
		for _, k := range keep {
			fmt.Fprintf(&s, "    %s;\n", k)
		}
		s.WriteString("  local: *;\n};\n")
		if err := os.WriteFile(script, []byte(s.String()), 0o644); err != nil {
			return "", err
		}
		args = append(args, "-Wl,--version-script="+script)
	}
	if err := run(cc(), args...); err != nil {
		return "", err
	}
	return lib, nil
}

// Library returns the path of a variant's libnvidia-ml.so.1 (Full, or one
// of Branches), building it on first use.
func (b *Builder) Library(variant string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.libs[variant]; ok {
		return p, nil
	}
	if err := b.compile(); err != nil {
		return "", err
	}
	var keep []string
	if variant != Full {
		syms, err := BranchSymbols(variant)
		if err != nil {
			return "", err
		}
		for _, s := range b.implemented {
			if syms[s] {
				keep = append(keep, s)
			}
		}
	}
	p, err := b.link(variant, keep)
	if err != nil {
		return "", err
	}
	b.libs[variant] = p
	return p, nil
}

// Implemented lists the NVML functions the library implements.
func (b *Builder) Implemented() ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.compile(); err != nil {
		return nil, err
	}
	return append([]string(nil), b.implemented...), nil
}

// Exports lists the functions a shared library exports (its dynamic symbol
// table), as the dynamic loader sees them.
func Exports(lib string) ([]string, error) {
	f, err := elf.Open(lib)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Section != elf.SHN_UNDEF && strings.HasPrefix(s.Name, "nvml") {
			out = append(out, s.Name)
		}
	}
	sort.Strings(out)
	return out, nil
}
