// Package fakehost writes what process accounting reads on a real node: a
// host /proc tree (stat and cgroup per PID) and the kubelet's
// /var/log/containers directory, for tests and the simulated node.
package fakehost

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Host is a generated host tree under one directory.
type Host struct {
	ProcRoot string
	LogDir   string
}

// New makes dir/proc and dir/containers. PID 1 exists, as on every host.
func New(dir string) (*Host, error) {
	h := &Host{ProcRoot: filepath.Join(dir, "proc"), LogDir: filepath.Join(dir, "containers")}
	for _, d := range []string{h.ProcRoot, h.LogDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return h, h.StartProcess(1, 1, "systemd", HostCgroup())
}

// Driver is the kubelet's cgroup driver.
type Driver int

// The cgroup layouts a node may have.
const (
	SystemdV2  Driver = iota // cgroup v2, systemd driver (GKE COS, most distributions today)
	CgroupfsV2               // cgroup v2, cgroupfs driver
	SystemdV1                // cgroup v1, systemd driver
	CgroupfsV1               // cgroup v1, cgroupfs driver
)

// Runtime is the container runtime, which names the container's scope.
type Runtime string

// Container runtimes.
const (
	Containerd Runtime = "cri-containerd"
	CRIO       Runtime = "crio"
	Docker     Runtime = "docker"
)

// PodCgroup is the cgroup file of a process in a pod container, as the
// kubelet and the runtime lay it out.
func PodCgroup(d Driver, rt Runtime, qos, podUID, containerID string) string {
	qosPart := func(sep string) string {
		if qos == "" || qos == "guaranteed" {
			return ""
		}
		return qos + sep
	}
	switch d {
	case SystemdV2, SystemdV1:
		uid := strings.ReplaceAll(podUID, "-", "_")
		slice := "/kubepods.slice/"
		pod := "kubepods-" + qosPart("-") + "pod" + uid + ".slice"
		if q := qosPart(""); q != "" {
			slice += "kubepods-" + q + ".slice/"
		}
		path := slice + pod + "/" + string(rt) + "-" + containerID + ".scope"
		if d == SystemdV2 {
			return "0::" + path + "\n"
		}
		return v1Lines(path)
	default:
		path := "/kubepods/" + qosPart("/") + "pod" + podUID + "/" + containerID
		if d == CgroupfsV2 {
			return "0::" + path + "\n"
		}
		return v1Lines(path)
	}
}

// HostCgroup is the cgroup file of a host process (a systemd service).
func HostCgroup() string { return "0::/system.slice/host-service.service\n" }

// DockerCgroup is the cgroup file of a plain Docker container (no pod).
func DockerCgroup(containerID string) string {
	return "0::/system.slice/docker-" + containerID + ".scope\n"
}

func v1Lines(path string) string {
	var b strings.Builder
	for i, c := range []string{"cpu,cpuacct", "memory", "devices", "pids", "name=systemd"} {
		fmt.Fprintf(&b, "%d:%s:%s\n", 12-i, c, path)
	}
	b.WriteString("0::/\n") // hybrid hosts show an empty v2 line
	return b.String()
}

// StartProcess writes /proc/<pid>/{stat,cgroup}, replacing any process that
// had the PID before (a reused PID gets a new directory, as in procfs).
func (h *Host) StartProcess(pid uint32, startTicks uint64, comm, cgroup string) error {
	dir := filepath.Join(h.ProcRoot, strconv.FormatUint(uint64(pid), 10))
	// The new directory is made while the old one still exists, so it gets
	// another inode, as a new process's /proc entry does.
	tmp := dir + ".new"
	_ = os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	// Fields 1-22 of proc(5); starttime is the 22nd.
	stat := fmt.Sprintf("%d (%s) S 1 %d %d 0 -1 4194560 100 0 0 0 10 5 0 0 20 0 8 0 %d 1000000 100 18446744073709551615\n",
		pid, comm, pid, pid, startTicks)
	if err := os.WriteFile(filepath.Join(tmp, "stat"), []byte(stat), 0o444); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(tmp, "cgroup"), []byte(cgroup), 0o444); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	return os.Rename(tmp, dir)
}

// StopProcess removes /proc/<pid>.
func (h *Host) StopProcess(pid uint32) error {
	return os.RemoveAll(filepath.Join(h.ProcRoot, strconv.FormatUint(uint64(pid), 10)))
}

// LogName is the kubelet's /var/log/containers name of a container.
func LogName(namespace, pod, container, containerID string) string {
	return pod + "_" + namespace + "_" + container + "-" + containerID + ".log"
}

// AddContainerLog creates the container's log link (a dangling symlink
// into /var/log/pods, as in a pod that mounts only /var/log/containers).
func (h *Host) AddContainerLog(namespace, pod, container, containerID string) error {
	name := filepath.Join(h.LogDir, LogName(namespace, pod, container, containerID))
	target := "/var/log/pods/" + namespace + "_" + pod + "/" + container + "/0.log"
	if err := os.Symlink(target, name); err != nil && !os.IsExist(err) {
		return err
	}
	return nil
}

// RemoveContainerLog removes it, as the kubelet does when the pod is deleted.
func (h *Host) RemoveContainerLog(namespace, pod, container, containerID string) error {
	err := os.Remove(filepath.Join(h.LogDir, LogName(namespace, pod, container, containerID)))
	if os.IsNotExist(err) {
		return nil
	}
	return err
}
