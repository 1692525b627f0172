package nvmlsampler

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultSysfs is where sysfs is mounted; the deploy files mount the host's
// read-only at /host/sys and pass --path.sysfs.
const DefaultSysfs = "/sys"

// sysfsNUMANode reads the NUMA node of the PCI device with NVML bus ID busID
// ("00000000:18:00.0") from <sysfs>/bus/pci/devices/0000:18:00.0/numa_node,
// as NVIDIA's device plugin does: nvmlDeviceGetNumaNodeId answers only
// where GPUs are NUMA nodes themselves (R550+, Grace), not on x86. -1 (no
// NUMA affinity) and errors are reported as not found.
func sysfsNUMANode(sysfs, busID string) (int, bool) {
	addr, ok := sysfsPCIAddress(busID)
	if !ok || sysfs == "" {
		return 0, false
	}
	b, err := os.ReadFile(filepath.Join(sysfs, "bus", "pci", "devices", addr, "numa_node"))
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// sysfsPCIAddress turns NVML's bus ID (8 hex digits of domain) into the
// kernel's (4 digits, lower case).
func sysfsPCIAddress(busID string) (string, bool) {
	dom, rest, ok := strings.Cut(strings.ToLower(busID), ":")
	if !ok || rest == "" || strings.ContainsAny(rest, "/\\") {
		return "", false
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return "", false
	}
	return fmt.Sprintf("%04x:%s", d, rest), true
}
