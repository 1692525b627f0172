package simnode

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Driver branches the simulated node can pretend to be. A real driver
// exports only the NVML functions its nvml.h declares, and go-nvml binds
// lazily: calling a missing one kills the process with "symbol lookup
// error". The simulated node does the same (it panics), so a test on an old
// branch fails loudly if the exporter calls a function without probing it.
//
// addedIn lists, for the functions this node serves that are newer than
// R470, the first branch whose nvml.h declares them. Read from NVIDIA's
// headers in go-nvml's history: "Update nvml.h to v11.4" (R470), "NVML 11.6"
// (R510), "Bump to NVML version 12.2" (R535), "12.4" (R550), "12.8" (R570);
// not derived from the exporter's own probe table.
var addedIn = map[string]int{
	"nvmlDeviceGetMemoryInfo_v2":             510,
	"nvmlDeviceGetGpuInstanceProfileInfoV":   510,
	"nvmlDeviceGetCurrentClocksEventReasons": 535,
	"nvmlDeviceGetNumaNodeId":                550,
	"nvmlDeviceGetTemperatureV":              570,
}

// driverBranches are the branches a scenario may name (node.driverBranch).
var driverBranches = map[string]int{"R470": 470, "R510": 510, "R535": 535, "R550": 550, "R570": 570, "R580": 580}

func branchNames() string {
	var names []string
	for n := range driverBranches {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// branch is the node's driver branch number; the newest when unset.
func (n *Node) branch() int {
	if b, ok := driverBranches[n.Scenario.Node.DriverBranch]; ok {
		return b
	}
	return 580
}

// LookupSymbol implements nvmlsampler.SymbolLookup like go-nvml's
// Extensions().LookupSymbol: nil when the node's driver branch exports name.
func (n *Node) LookupSymbol(name string) error {
	if since, ok := addedIn[name]; ok && since > n.branch() {
		return fmt.Errorf("undefined symbol: %s (driver branch R%d)", name, n.branch())
	}
	return nil
}

// MissingCalls is how many calls hit a function the driver branch lacks
// (each also panics, as the real process would die).
func (n *Node) MissingCalls() int64 { return n.missingCalls.Load() }

// require is the dynamic linker's lazy binding: calling a function the
// driver lacks ends the process.
func (n *Node) require(name string) {
	if err := n.LookupSymbol(name); err != nil {
		n.missingCalls.Add(1)
		panic("symbol lookup error: " + err.Error())
	}
}

// WriteSysfs writes what the kernel shows of the node's GPUs under root
// (a stand-in for /sys): bus/pci/devices/<domain:bus:dev.fn>/numa_node, two
// sockets with the GPUs split evenly, as on a dual-socket x86 HGX server.
func (n *Node) WriteSysfs(root string) error {
	for _, d := range n.devices {
		// NVML's bus ID has an 8-digit domain, the kernel's 4.
		addr := strings.ToLower(d.mock.PciBusID[4:])
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(fmt.Sprintf("%d\n", d.numaNode())), 0o644); err != nil {
			return err
		}
	}
	return nil
}
