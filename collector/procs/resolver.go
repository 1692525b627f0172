package procs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Owner is who runs a process.
type Owner struct {
	// Found: the process exists under the proc root (NVML may list a PID
	// that has already exited, or the proc root is not the host's).
	Found bool
	// Cgroup is what the process's cgroup says; ContainerID "" is a host
	// process.
	Cgroup CgroupRef
	// Identity is the pod container, when the identity source knows it.
	Identity Identity
	// MPSServer: the process is an nvidia-cuda-mps-server. Under MPS it
	// holds the GPU's shared context for every client, and runs in the
	// MPS control daemon's container (a pod that holds no GPU) or on the
	// host: its memory is no pod's and no outside workload's.
	MPSServer bool
}

// mpsServerComm is nvidia-cuda-mps-server as /proc/<pid>/stat names it:
// the kernel keeps the first 15 bytes of a command name.
const mpsServerComm = "nvidia-cuda-mps"

// InPod reports whether the process runs in a known pod container.
func (o Owner) InPod() bool { return o.Identity.Known() }

// Config configures a Resolver.
type Config struct {
	// ProcRoot is the host's /proc as mounted in the exporter (default
	// /proc; in a pod without the host PID namespace, a read-only hostPath
	// mount such as /host/proc).
	ProcRoot string
	// Identities turns container IDs into pod names; nil leaves every
	// container unnamed (its processes count as outside any pod).
	Identities IdentitySource
	// MinRefresh is the least time between two refreshes of the identity
	// source when a container is unknown (default 5s).
	MinRefresh time.Duration
	// Now replaces time.Now in tests.
	Now func() time.Time
}

// Resolver maps PIDs to owners. It is not safe for concurrent use: the
// sampler calls it once per sample.
type Resolver struct {
	cfg         Config
	cache       map[uint32]*entry
	gen         uint64
	lastRefresh time.Time
	reads       int64
	refreshErr  error
	rootErr     error
}

type entry struct {
	inode uint64 // inode and change time of /proc/<pid>: a new process gets a new inode
	ctime int64
	start uint64 // starttime from /proc/<pid>/stat, in clock ticks since boot
	owner Owner
	seen  uint64
}

// evictAfter: entries unseen for this many samples are dropped.
const evictAfter = 60

// NewResolver builds a resolver.
func NewResolver(cfg Config) *Resolver {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.MinRefresh == 0 {
		cfg.MinRefresh = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Resolver{cfg: cfg, cache: map[uint32]*entry{}}
}

// CheckProcRoot says whether root looks like a host /proc, with what to do
// when it does not.
func CheckProcRoot(root string) error {
	if _, err := os.Stat(filepath.Join(root, "1", "cgroup")); err != nil {
		return fmt.Errorf("process accounting needs the host's /proc: %s/1/cgroup is not readable (%v); mount the host's /proc read-only (e.g. at /host/proc) and pass --procs.proc-root, or turn process accounting off with --no-procs.enabled", root, err)
	}
	return nil
}

// FileReads is the number of files read so far (the cache's cost).
func (r *Resolver) FileReads() int64 { return r.reads }

// Err is the identity source's last refresh error, nil when it worked.
func (r *Resolver) Err() error { return r.refreshErr }

// RootErr says why the last Resolve could not read the proc root (gone,
// unmounted, permission denied), nil when it could. Owners are then unknown,
// not "outside pods": a PID that cannot be looked up is not one that exited.
func (r *Resolver) RootErr() error { return r.rootErr }

// checkRoot reads what every host /proc has, PID 1's cgroup.
func (r *Resolver) checkRoot() error {
	if _, err := os.Stat(filepath.Join(r.cfg.ProcRoot, "1", "cgroup")); err != nil {
		return fmt.Errorf("cannot read the proc root %s: %w", r.cfg.ProcRoot, err)
	}
	return nil
}

// unreadable marks the proc root unreadable when err is not a process that
// has gone (ENOENT, ESRCH) but a root that cannot be read.
func (r *Resolver) unreadable(path string, err error) {
	if r.rootErr == nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
		r.rootErr = fmt.Errorf("cannot read the proc root %s: %s: %w", r.cfg.ProcRoot, path, err)
	}
}

// Resolve finds the owner of every PID. A PID whose /proc entry is the
// same as last time (same inode and change time) costs one stat and no read; a
// PID whose entry changed has its start time read, and only a new start
// time (a reused PID) reads its cgroup again.
func (r *Resolver) Resolve(ctx context.Context, pids []uint32) map[uint32]Owner {
	r.gen++
	out := make(map[uint32]Owner, len(pids))
	if r.rootErr = r.checkRoot(); r.rootErr != nil {
		return out
	}
	var unknown []*entry
	for _, pid := range pids {
		if _, done := out[pid]; done {
			continue
		}
		e := r.lookup(pid)
		if r.rootErr != nil {
			return map[uint32]Owner{}
		}
		if e == nil {
			out[pid] = Owner{}
			continue
		}
		e.seen = r.gen
		if e.owner.Cgroup.ContainerID != "" && !e.owner.Identity.Known() {
			r.identify(ctx, e)
			if !e.owner.Identity.Known() {
				unknown = append(unknown, e)
			}
		}
		out[pid] = e.owner
	}
	if len(unknown) > 0 && r.cfg.Identities != nil {
		now := r.cfg.Now()
		if r.lastRefresh.IsZero() || now.Sub(r.lastRefresh) >= r.cfg.MinRefresh {
			r.lastRefresh = now
			r.refreshErr = r.cfg.Identities.Refresh(ctx)
			for _, e := range unknown {
				r.identify(ctx, e)
			}
			for _, pid := range pids {
				if e := r.cache[pid]; e != nil && e.seen == r.gen {
					out[pid] = e.owner
				}
			}
		}
	}
	for pid, e := range r.cache {
		if r.gen-e.seen > evictAfter {
			delete(r.cache, pid)
		}
	}
	return out
}

func (r *Resolver) identify(ctx context.Context, e *entry) {
	if r.cfg.Identities == nil {
		return
	}
	if id, ok, err := r.cfg.Identities.Lookup(ctx, e.owner.Cgroup.ContainerID); err == nil && ok {
		e.owner.Identity = id
	}
}

// lookup returns the cache entry of a live PID, reading what changed.
func (r *Resolver) lookup(pid uint32) *entry {
	dir := filepath.Join(r.cfg.ProcRoot, strconv.FormatUint(uint64(pid), 10))
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		r.unreadable(dir, err)
		delete(r.cache, pid)
		return nil
	}
	ctime, inode := st.Ctim.Nano(), st.Ino
	e := r.cache[pid]
	if e != nil && e.ctime == ctime && e.inode == inode {
		return e
	}
	start, comm, err := r.startTime(dir)
	if err != nil {
		r.unreadable(filepath.Join(dir, "stat"), err)
		delete(r.cache, pid)
		return nil
	}
	if e != nil && e.start == start {
		e.ctime, e.inode = ctime, inode // the inode was made again, the process is the same
		return e
	}
	r.reads++
	cg, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil {
		r.unreadable(filepath.Join(dir, "cgroup"), err)
		delete(r.cache, pid)
		return nil
	}
	e = &entry{ctime: ctime, inode: inode, start: start, owner: Owner{Found: true, Cgroup: ParseCgroup(string(cg)), MPSServer: comm == mpsServerComm}}
	r.cache[pid] = e
	return e
}

// startTime reads field 22 of /proc/<pid>/stat, the process's start time,
// which tells a reused PID from the process that had it before, and field
// 2, its command name.
func (r *Resolver) startTime(dir string) (uint64, string, error) {
	r.reads++
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0, "", err
	}
	start, err := ParseStartTime(string(b))
	return start, ParseComm(string(b)), err
}

// ParseComm reads the command name of a /proc/<pid>/stat line: what lies
// between the first '(' and the last ')', "" when the line has none.
func ParseComm(stat string) string {
	i, j := strings.IndexByte(stat, '('), strings.LastIndexByte(stat, ')')
	if i < 0 || j <= i {
		return ""
	}
	return stat[i+1 : j]
}

// ParseStartTime reads the starttime field of a /proc/<pid>/stat line. The
// command name (field 2) may hold spaces and parentheses, so fields are
// counted from the last ')'.
func ParseStartTime(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no ')' after the command name")
	}
	f := strings.Fields(stat[i+1:])
	const idx = 22 - 3 // fields after the name start at 3 (state)
	if len(f) <= idx {
		return 0, fmt.Errorf("%d fields after the command name, want at least %d", len(f), idx+1)
	}
	return strconv.ParseUint(f[idx], 10, 64)
}
