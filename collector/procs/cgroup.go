// Package procs maps the host PIDs that NVML reports to the Kubernetes
// containers they run in: /proc/<pid>/cgroup gives the container ID (and the
// pod UID), the kubelet's /var/log/containers names or the CRI API give the
// namespace, pod and container. It reads only host files (or one CRI call per
// new container) and caches per PID, so a process seen before costs no read.
package procs

import (
	"strings"
)

// CgroupRef is what a process's cgroup path says about its container.
type CgroupRef struct {
	// ContainerID is the runtime's container ID (64 hex digits), "" when the
	// process runs in no container (a host process).
	ContainerID string
	// Runtime is the runtime the cgroup name points at: containerd, cri-o,
	// docker, or "" for cgroupfs paths, which do not say.
	Runtime string
	// PodUID is the pod's UID with dashes, "" outside Kubernetes.
	PodUID string
}

// ParseCgroup reads the text of /proc/<pid>/cgroup. It understands cgroup v1
// (one line per hierarchy) and v2 ("0::/path"), the systemd cgroup driver
// (kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope, crio-<id>.scope,
// docker-<id>.scope) and the cgroupfs driver (/kubepods/burstable/pod<uid>/<id>,
// /docker/<id>). The deepest container ID wins: a container that made its own
// sub-cgroups is still that container.
func ParseCgroup(text string) CgroupRef {
	var best CgroupRef
	bestDepth := -1
	for len(text) > 0 {
		var line string
		line, text, _ = strings.Cut(text, "\n")
		// hierarchy-ID:controllers:path; the path may itself hold colons.
		_, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		_, path, ok := strings.Cut(rest, ":")
		if !ok {
			continue
		}
		ref, depth := parseCgroupPath(path)
		if depth > bestDepth || (depth == bestDepth && best.PodUID == "" && ref.PodUID != "") {
			best, bestDepth = ref, depth
		}
	}
	return best
}

// parseCgroupPath returns what one cgroup path says and the depth of the
// container ID in it (-1 when it holds none).
func parseCgroupPath(path string) (CgroupRef, int) {
	var ref CgroupRef
	depth := -1
	i := 0
	for path != "" {
		var seg string
		seg, path, _ = strings.Cut(path, "/")
		if seg == "" {
			continue
		}
		i++
		if uid, ok := podUIDOf(seg); ok {
			ref.PodUID = uid
			continue
		}
		if id, rt, ok := containerIDOf(seg); ok {
			ref.ContainerID, ref.Runtime = id, rt
			depth = i
		}
	}
	return ref, depth
}

// runtimePrefixes are the systemd scope names of container runtimes.
var runtimePrefixes = []struct{ prefix, runtime string }{
	{"cri-containerd-", "containerd"},
	{"crio-", "cri-o"},
	{"docker-", "docker"},
	{"containerd-", "containerd"},
	{"libpod-", "podman"},
}

// containerIDOf recognises a cgroup path segment naming a container.
func containerIDOf(seg string) (id, runtime string, ok bool) {
	if s, found := strings.CutSuffix(seg, ".scope"); found {
		if strings.HasPrefix(s, "crio-conmon-") {
			return "", "", false // CRI-O's monitor process, not the container
		}
		for _, p := range runtimePrefixes {
			if rest, ok := strings.CutPrefix(s, p.prefix); ok && isContainerID(rest) {
				return rest, p.runtime, true
			}
		}
		return "", "", false
	}
	if isContainerID(seg) { // cgroupfs driver: the bare ID
		return seg, "", true
	}
	return "", "", false
}

// podUIDOf recognises "pod<uid>" (cgroupfs) and "kubepods-<qos>-pod<uid>.slice"
// (systemd, which writes the UID's dashes as underscores).
func podUIDOf(seg string) (string, bool) {
	s := strings.TrimSuffix(seg, ".slice")
	i := strings.LastIndex(s, "pod")
	if i < 0 || (i > 0 && s[i-1] != '-') {
		return "", false
	}
	uid := strings.ReplaceAll(s[i+3:], "_", "-")
	if !isUID(uid) {
		return "", false
	}
	return uid, true
}

// isContainerID: containerd, CRI-O and Docker all use 64 lower-case hex digits.
func isContainerID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// isUID accepts an RFC 4122 UUID in its 36-character form.
func isUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
				return false
			}
		}
	}
	return true
}
