// Command benchrest is the memory-at-rest half of `make bench`: it runs the
// node agent (gpu-pool-exporter, built as the image builds it) on the real
// NVML path, a fake libnvidia-ml.so.1 serving an 8 x H100 node through the
// same dlopen and C calls as NVIDIA's, without a kubelet or DCGM, and
// prints:
//
//   - its resident memory at rest (VmRSS, and its anonymous and file-backed
//     parts, from /proc/PID/status) after -settle, the highest of the
//     readings taken every second until then; the fake library's own
//     mappings are named apart;
//   - that memory for the binary's file in each state of the page cache a
//     process can start from (see binaryStates): the file-backed part is
//     the pages of the binary a process maps, and how many of them a start
//     maps depends on how the file came into the page cache, not only on
//     its bytes. The target holds the states a node starts the agent in;
//   - the binary's size, what of it is loaded (text, rodata, pclntab) and
//     the number of packages it links;
//   - the ten packages whose initialisation costs most (GODEBUG=inittrace=1),
//     by bytes allocated and by time.
//
// It exits 1 when the resident memory a node would see is over -target-mib.
package main

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"golang.org/x/sys/unix"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/sim/fakenvml"
)

type config struct {
	agent    string
	gpus     int
	settle   time.Duration
	interval string
	target   float64
	packages int
	extra    []string
}

func main() {
	c := config{}
	flag.StringVar(&c.agent, "agent", "./gpu-pool-exporter", "the node agent's binary, built as the image builds it (-trimpath -ldflags '-s -w')")
	flag.IntVar(&c.gpus, "gpus", 8, "H100s on the fake driver")
	flag.DurationVar(&c.settle, "settle", time.Minute, "how long the agent runs while its memory is read every second (at rest: its samples and a scrape a second)")
	flag.StringVar(&c.interval, "collect-interval", "5s", "the agent's --collect-interval (its default)")
	flag.Float64Var(&c.target, "target-mib", 25, "the target for the agent's resident memory at rest, MiB")
	flag.IntVar(&c.packages, "packages", 0, "packages the binary links (go list -deps | wc -l), for the table; 0: not shown")
	extra := flag.String("agent-flags", "", "more flags for the agent, space-separated")
	flag.Parse()
	c.extra = strings.Fields(*extra)
	if err := run(os.Stdout, c); err != nil {
		fmt.Fprintf(os.Stderr, "benchrest: %v\n", err)
		os.Exit(1)
	}
}

// fakeDriver builds the fake libnvidia-ml and a node file of n H100s.
func fakeDriver(dir string, n int) (lib, node string, err error) {
	lib, err = fakenvml.NewBuilder(filepath.Join(dir, "lib")).Library(fakenvml.Full)
	if err != nil {
		return "", "", err
	}
	node = filepath.Join(dir, "node")
	return lib, node, fakenvml.NewNode(gpus.H100_SXM5_80GB, n, fakenvml.Full).WriteFile(node)
}

// memory is one reading of /proc/PID/status and smaps.
type memory struct {
	rss, anon, file int64 // bytes
	driver          int64 // resident in the fake library's own mappings
}

func readMemory(pid int, lib string) (memory, error) {
	var m memory
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "RssAnon:":
			m.anon = kb << 10
		case "RssFile:":
			m.file = kb << 10
		}
	}
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return m, err
	}
	inLib := false
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			inLib = len(f) >= 6 && f[5] == lib
			continue
		}
		if inLib && len(f) >= 2 && f[0] == "Rss:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			m.driver += kb << 10
		}
	}
	return m, sc.Err()
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start runs the agent on the fake driver with env added and waits until
// it serves a page with every GPU up.
func start(c config, bin, lib, node string, env []string) (*exec.Cmd, string, *bytes.Buffer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", nil, err
	}
	args := append([]string{"--nvml.library=" + lib, "--no-kubelet.enabled", "--dcgm.mode=off",
		"--web.listen-address=" + addr, "--collect-interval=" + c.interval, "--log.level=warn"}, c.extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), fakenvml.EnvNode+"="+node, "LD_LIBRARY_PATH="), env...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return nil, "", nil, err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if body, err := get("http://" + addr + "/metrics"); err == nil && strings.Count(body, "\ngpu_up{") == c.gpus {
			return cmd, addr, &logs, nil
		}
		if time.Now().After(deadline) {
			stop(cmd)
			return nil, "", nil, fmt.Errorf("the agent served no page with %d GPUs up within 30s:\n%s", c.gpus, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return "\n" + string(b), err
}

func stop(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// loaded is the size of the binary's sections a process maps from it:
// text, rodata and the pclntab (the symbol table and DWARF, where kept,
// are never loaded).
func loaded(bin string) (int64, map[string]int64, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return 0, nil, err
	}
	defer f.Close()
	secs := map[string]int64{}
	var total int64
	for _, s := range f.Sections {
		if s.Flags&elf.SHF_ALLOC == 0 || s.Type == elf.SHT_NOBITS {
			continue
		}
		secs[s.Name] = int64(s.Size)
		total += int64(s.Size)
	}
	return total, secs, nil
}

// initCost is one package's initialisation, from GODEBUG=inittrace=1.
type initCost struct {
	pkg    string
	clock  float64 // ms
	bytes  int64
	allocs int64
}

// initTrace starts the agent with GODEBUG=inittrace=1 and reads every
// package's init line.
func initTrace(c config, lib, node string) ([]initCost, error) {
	cmd, _, logs, err := start(c, c.agent, lib, node, []string{"GODEBUG=inittrace=1"})
	if err != nil {
		return nil, err
	}
	stop(cmd)
	var out []initCost
	for _, line := range strings.Split(logs.String(), "\n") {
		// init internal/bytealg @0.004 ms, 0.004 ms clock, 0 bytes, 0 allocs
		f := strings.Fields(line)
		if len(f) < 11 || f[0] != "init" {
			continue
		}
		ms, _ := strconv.ParseFloat(f[4], 64)
		b, _ := strconv.ParseInt(f[7], 10, 64)
		a, _ := strconv.ParseInt(f[9], 10, 64)
		out = append(out, initCost{pkg: f[1], clock: ms, bytes: b, allocs: a})
	}
	if len(out) == 0 {
		return nil, errors.New("GODEBUG=inittrace=1 printed no init line")
	}
	return out, nil
}

// cpuTicks is the process's user and system time, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces: the fields after it start at ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0, errors.New("short /proc/PID/stat")
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st, nil
}

// binaryState is one way the agent's file can be in the page cache when a
// process starts it.
type binaryState struct {
	name string
	// held: a node starts the agent in this state, so the target applies.
	held bool
	// copied: the agent runs from a copy written with write(2) (else from
	// the file the build wrote); dropped: the copy's pages are dropped from
	// the page cache before the start.
	copied, dropped bool
}

// binaryStates are the states measured. The file-backed pages a start maps
// follow the page cache's folios of the file, so the same bytes read
// differently: a file the Go linker has just written (through a shared
// mapping) is mapped almost whole, one written by write(2) or read back
// from disk maps about 3 MiB less of an 18 MiB binary (docs/performance.md).
// A node runs the agent from an image layer that the container runtime
// wrote with write(2), or read back from disk after a reboot or memory
// pressure took it out of the page cache; only a developer's freshly
// built binary starts as linked.
var binaryStates = []binaryState{
	{name: "unpacked (written by write(2), as containerd unpacks an image layer)", held: true, copied: true},
	{name: "read from disk (its pages dropped from the page cache first)", held: true, copied: true, dropped: true},
	{name: "as the linker left it (a fresh go build)"},
}

// copyFile writes src to dst with write(2), 32 KiB at a time as a tar
// extraction does (not copy_file_range, which io.Copy between two files
// would use), and syncs it; with drop, it then drops dst's pages from the
// page cache, so a start reads it from disk.
func copyFile(src, dst string, drop bool) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o700) //nolint:gosec // G302: an executable, run by its owner
	if err != nil {
		return err
	}
	// The struct wrappers hide ReadFrom and WriteTo: plain reads and writes.
	if _, err := io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, make([]byte, 32<<10)); err != nil {
		out.Close()
		return err
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return err
	}
	if drop {
		if err := unix.Fadvise(int(out.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			out.Close()
			return fmt.Errorf("dropping %s from the page cache: %w", dst, err)
		}
	}
	return out.Close()
}

// cached is the share of path's pages in the page cache (mincore(2)).
func cached(path string) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer func() { _ = unix.Munmap(m) }()
	page := os.Getpagesize()
	vec := make([]byte, (len(m)+page-1)/page)
	// x/sys/unix has no mincore wrapper on Linux.
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 { //nolint:gosec // G103: m and vec outlive the call
		return 0, fmt.Errorf("mincore %s: %w", path, errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return float64(n) / float64(len(vec)), nil
}

// atRest is one settled run of the agent.
type atRest struct {
	state      binaryState
	cachedFrom float64 // share of the binary in the page cache at its start
	peak, last memory
	cpuPerMin  float64
}

// settle starts bin and reads its memory every second, with a scrape a
// second, for c.settle.
func settle(c config, bin, lib, node string) (atRest, error) {
	var r atRest
	var err error
	if r.cachedFrom, err = cached(bin); err != nil {
		return r, err
	}
	cmd, addr, logs, err := start(c, bin, lib, node, nil)
	if err != nil {
		return r, err
	}
	defer stop(cmd)
	cpu0, err := cpuTicks(cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.settle)
	defer cancel()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
			// One scrape per second, as a Prometheus at a short interval.
			if _, err := get("http://" + addr + "/metrics"); err != nil {
				return r, fmt.Errorf("scrape: %v\n%s", err, logs.String())
			}
			m, err := readMemory(cmd.Process.Pid, lib)
			if err != nil {
				return r, err
			}
			r.last = m
			if m.rss > r.peak.rss {
				r.peak = m
			}
		}
	}
	cpu1, err := cpuTicks(cmd.Process.Pid)
	if err != nil {
		return r, err
	}
	// USER_HZ is 100 on Linux.
	r.cpuPerMin = float64(cpu1-cpu0) / 100 / c.settle.Minutes()
	return r, nil
}

func run(w io.Writer, c config) error {
	dir, err := os.MkdirTemp("", "benchrest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lib, node, err := fakeDriver(dir, c.gpus)
	if err != nil {
		return err
	}
	fi, err := os.Stat(c.agent)
	if err != nil {
		return err
	}
	total, secs, err := loaded(c.agent)
	if err != nil {
		return err
	}
	costs, err := initTrace(c, lib, node)
	if err != nil {
		return err
	}

	var runs []atRest
	for i, st := range binaryStates {
		bin := c.agent
		if st.copied {
			bin = filepath.Join(dir, fmt.Sprintf("agent-%d", i), filepath.Base(c.agent))
			if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
				return err
			}
			if err := copyFile(c.agent, bin, st.dropped); err != nil {
				return err
			}
		}
		r, err := settle(c, bin, lib, node)
		if err != nil {
			return fmt.Errorf("%s: %w", st.name, err)
		}
		r.state = st
		runs = append(runs, r)
	}

	fmt.Fprintf(w, "Node agent at rest (%d x H100 on the fake libnvidia-ml, no kubelet, no DCGM, --collect-interval=%s, a scrape a second, after %s), per state of its binary in the page cache at the start:\n\n", c.gpus, c.interval, c.settle)
	pk := "-"
	if c.packages > 0 {
		pk = strconv.Itoa(c.packages)
	}
	fmt.Fprintf(w, "%s: %s, loaded %s (text %s, rodata %s, pclntab %s), %s packages\n\n",
		filepath.Base(c.agent), mib(fi.Size()), mib(total), mib(secs[".text"]), mib(secs[".rodata"]), mib(secs[".gopclntab"]), pk)
	fmt.Fprintln(w, "| binary's page cache at the start | cached | RSS at rest (highest) | anonymous | file-backed | of it the fake driver's | CPU s/min | target |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	var over *atRest // the highest held run over the target
	var notes []string
	for i := range runs {
		r := &runs[i]
		verdict := "not held (no node starts it so)"
		switch {
		case r.state.dropped && r.cachedFrom > 0.5:
			// The drop did not take (tmpfs holds no file on disk): this
			// run measured another state, so it is shown, not held.
			verdict = "not held (the drop did not take)"
			notes = append(notes, fmt.Sprintf("The page cache kept %.0f%% of the binary after the drop: %s is likely tmpfs; set TMPDIR to a disk-backed folder.", 100*r.cachedFrom, dir))
		case r.state.held && float64(r.peak.rss)/(1<<20) > c.target:
			verdict = "OVER"
			if over == nil || r.peak.rss > over.peak.rss {
				over = r
			}
		case r.state.held:
			verdict = "met"
		}
		fmt.Fprintf(w, "| %s | %.0f%% | %s (last %s) | %s | %s | %s | %.2f | %.0f MiB: %s |\n",
			r.state.name, 100*r.cachedFrom, mib(r.peak.rss), mib(r.last.rss), mib(r.peak.anon), mib(r.peak.file), mib(r.peak.driver), r.cpuPerMin, c.target, verdict)
	}
	for _, n := range notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}

	fmt.Fprintln(w, "\nInitialisation (GODEBUG=inittrace=1), the ten costliest packages by bytes allocated, then by time:")
	fmt.Fprintln(w)
	byBytes := append([]initCost(nil), costs...)
	sort.SliceStable(byBytes, func(i, j int) bool { return byBytes[i].bytes > byBytes[j].bytes })
	byClock := append([]initCost(nil), costs...)
	sort.SliceStable(byClock, func(i, j int) bool { return byClock[i].clock > byClock[j].clock })
	var allBytes int64
	var allClock float64
	for _, ic := range costs {
		allBytes += ic.bytes
		allClock += ic.clock
	}
	fmt.Fprintln(w, "| # | package (bytes) | bytes | allocs | package (time) | ms |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for i := 0; i < 10 && i < len(costs); i++ {
		fmt.Fprintf(w, "| %d | %s | %d | %d | %s | %.2f |\n", i+1, byBytes[i].pkg, byBytes[i].bytes, byBytes[i].allocs, byClock[i].pkg, byClock[i].clock)
	}
	fmt.Fprintf(w, "| | all %d packages | %d | | | %.1f |\n", len(costs), allBytes, allClock)
	if over != nil {
		return fmt.Errorf("the agent holds %s at rest (%s), over the target of %.0f MiB", mib(over.peak.rss), over.state.name, c.target)
	}
	return nil
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
