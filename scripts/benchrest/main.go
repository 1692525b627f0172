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
//   - the binary's size, what of it is loaded (text, rodata, pclntab: on
//     this kernel a process's file-backed pages are about all of them) and
//     the number of packages it links;
//   - the ten packages whose initialisation costs most (GODEBUG=inittrace=1),
//     by bytes allocated and by time.
//
// It exits 1 when the resident memory is over -target-mib.
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

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"

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
func start(c config, lib, node string, env []string) (*exec.Cmd, string, *bytes.Buffer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", nil, err
	}
	args := append([]string{"--nvml.library=" + lib, "--no-kubelet.enabled", "--dcgm.mode=off",
		"--web.listen-address=" + addr, "--collect-interval=" + c.interval, "--log.level=warn"}, c.extra...)
	cmd := exec.Command(c.agent, args...)
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
	cmd, _, logs, err := start(c, lib, node, []string{"GODEBUG=inittrace=1"})
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

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

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

	cmd, addr, logs, err := start(c, lib, node, nil)
	if err != nil {
		return err
	}
	defer stop(cmd)
	cpu0, err := cpuTicks(cmd.Process.Pid)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.settle)
	defer cancel()
	var peak, last memory
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-t.C:
			// One scrape per second, as a Prometheus at a short interval.
			if _, err := get("http://" + addr + "/metrics"); err != nil {
				return fmt.Errorf("scrape: %v\n%s", err, logs.String())
			}
			m, err := readMemory(cmd.Process.Pid, lib)
			if err != nil {
				return err
			}
			last = m
			if m.rss > peak.rss {
				peak = m
			}
		}
	}

	cpu1, err := cpuTicks(cmd.Process.Pid)
	if err != nil {
		return err
	}
	// USER_HZ is 100 on Linux.
	cpuPerMin := float64(cpu1-cpu0) / 100 / c.settle.Minutes()

	fmt.Fprintf(w, "Node agent at rest (%d x H100 on the fake libnvidia-ml, no kubelet, no DCGM, --collect-interval=%s, a scrape a second, after %s):\n\n", c.gpus, c.interval, c.settle)
	fmt.Fprintln(w, "| binary | size | loaded (text + rodata + pclntab + data) | packages | RSS at rest (highest) | anonymous | file-backed | of it the fake driver's | CPU s/min | target |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	pk := "-"
	if c.packages > 0 {
		pk = strconv.Itoa(c.packages)
	}
	verdict := "met"
	over := float64(peak.rss)/(1<<20) > c.target
	if over {
		verdict = "OVER"
	}
	fmt.Fprintf(w, "| %s | %s | %s (text %s, rodata %s, pclntab %s) | %s | %s (last %s) | %s | %s | %s | %.2f | %.0f MiB: %s |\n",
		filepath.Base(c.agent), mib(fi.Size()), mib(total), mib(secs[".text"]), mib(secs[".rodata"]), mib(secs[".gopclntab"]), pk,
		mib(peak.rss), mib(last.rss), mib(peak.anon), mib(peak.file), mib(peak.driver), cpuPerMin, c.target, verdict)

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
	if over {
		return fmt.Errorf("the agent holds %s at rest, over the target of %.0f MiB", mib(peak.rss), c.target)
	}
	return nil
}
