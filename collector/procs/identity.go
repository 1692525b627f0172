package procs

import (
	"context"
	"fmt"
	"os"
	"strings"
)

// Identity is the Kubernetes name of a container.
type Identity struct {
	Namespace, Pod, Container string
}

// Known reports whether the identity names a container.
func (i Identity) Known() bool { return i.Pod != "" }

// IdentitySource turns a container ID into its Kubernetes identity.
type IdentitySource interface {
	// Lookup returns the identity of the container, or ok=false when the
	// source does not know it (yet).
	Lookup(ctx context.Context, containerID string) (Identity, bool, error)
	// Refresh is called at most once per sample when an ID was unknown;
	// sources that list (the log directory) list again.
	Refresh(ctx context.Context) error
}

// LogDir reads identities from the kubelet's /var/log/containers: one
// symlink per container named <pod>_<namespace>_<container>-<id>.log, the
// convention log shippers rely on. Only the names are read, never the logs.
type LogDir struct {
	Dir   string
	byID  map[string]Identity
	lists int
}

// NewLogDir indexes dir once.
func NewLogDir(dir string) (*LogDir, error) {
	l := &LogDir{Dir: dir}
	if err := l.Refresh(context.Background()); err != nil {
		return nil, err
	}
	return l, nil
}

// Lookup implements IdentitySource.
func (l *LogDir) Lookup(_ context.Context, id string) (Identity, bool, error) {
	i, ok := l.byID[id]
	return i, ok, nil
}

// Lists is how many times the directory was listed (tests check the cache).
func (l *LogDir) Lists() int { return l.lists }

// Refresh implements IdentitySource: it lists the directory again.
func (l *LogDir) Refresh(context.Context) error {
	l.lists++
	ents, err := os.ReadDir(l.Dir)
	if err != nil {
		return fmt.Errorf("container log directory %s: %w (mount the host's /var/log/containers read-only, or set --procs.container-log-dir)", l.Dir, err)
	}
	m := make(map[string]Identity, len(ents))
	for _, e := range ents {
		if id, ident, ok := ParseLogName(e.Name()); ok {
			m[id] = ident
		}
	}
	l.byID = m
	return nil
}

// ParseLogName splits "<pod>_<namespace>_<container>-<id>.log". Pod and
// namespace names cannot hold underscores, container names neither, so the
// split is unambiguous.
func ParseLogName(name string) (id string, ident Identity, ok bool) {
	s, ok := strings.CutSuffix(name, ".log")
	if !ok {
		return "", Identity{}, false
	}
	pod, rest, ok1 := strings.Cut(s, "_")
	ns, rest, ok2 := strings.Cut(rest, "_")
	if !ok1 || !ok2 || pod == "" || ns == "" {
		return "", Identity{}, false
	}
	dash := strings.LastIndexByte(rest, '-')
	if dash <= 0 {
		return "", Identity{}, false
	}
	id = rest[dash+1:]
	if !isContainerID(id) {
		return "", Identity{}, false
	}
	return id, Identity{Namespace: ns, Pod: pod, Container: rest[:dash]}, true
}
