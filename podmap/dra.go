package podmap

import (
	"strings"
)

// NVIDIA DRA driver names (k8s-dra-driver-gpu). "gpu.nvidia.com" is the
// current one; "gpu.resource.nvidia.com" is what releases before 2025 used.
// The driver's other kind of device, ComputeDomain IMEX channels
// ("compute-domain.nvidia.com"), holds no GPU and is ignored.
const (
	DRADriverNVIDIA       = "gpu.nvidia.com"
	DRADriverNVIDIALegacy = "gpu.resource.nvidia.com"
)

// DynamicRef is the DRA side of a Holding: one device of a ResourceClaim as
// the kubelet reports it in ContainerResources.DynamicResources.
type DynamicRef struct {
	ClaimName      string
	ClaimNamespace string
	DriverName     string
	PoolName       string
	DeviceName     string
	CDIDevices     []string // fully qualified CDI names, e.g. "k8s.gpu.nvidia.com/device=gpu-0"
	ShareID        string   // set for devices shared through consumable capacity; "" if none
}

// ParseDRADevice derives a DeviceRef from a DRA device of the NVIDIA DRA
// driver: its device name and its CDI device names.
//
// In order:
//
//  1. A MIG or GPU UUID ("MIG-<uuid>", "GPU-<uuid>") anywhere in the device
//     name or a CDI name gives a MIGUUID or GPUUUID ref (a MIG UUID wins).
//  2. A device name "gpu-<n>" gives a DRADevice ref for the whole GPU, and
//     "gpu-<n>-mig-<...>" one for a MIG device on it. The NVIDIA driver
//     writes the GPU's minor number as n since mid 2025 (its index before
//     that); Inventory.Resolve looks n up as a minor first and as an index
//     second. The MIG part is "<profile without dots>-<placement...>" in
//     current releases, "<profileID>-<start>-<size>" in early ones.
//  3. With no device name, the same names are looked for in the CDI names
//     ("k8s.gpu.nvidia.com/device=gpu-0",
//     "k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0").
//
// VFIO passthrough devices ("gpu-vfio-<n>") are rejected: NVML does not see
// them. Raw of the returned ref is the device name; for a DRADevice ref
// found through a CDI name it is the "gpu-<n>..." name inside it, and with
// no device name otherwise the first CDI name.
func ParseDRADevice(deviceName string, cdiDevices []string) (DeviceRef, error) {
	ref := DeviceRef{Raw: deviceName, Minor: -1, GPUInstance: -1, ComputeInstance: -1, Replica: -1}
	if deviceName == "" && len(cdiDevices) > 0 {
		ref.Raw = cdiDevices[0]
	}
	if len(deviceName) > maxIDLen {
		return ref, parseErr(deviceName, "DRA device name longer than %d bytes", maxIDLen)
	}

	// 1. UUIDs anywhere.
	var gpuUUID string
	for _, s := range append([]string{deviceName}, cdiDevices...) {
		if len(s) > maxIDLen {
			continue
		}
		if u := findUUID(s, migPrefix); u != "" {
			ref.Kind = MIGUUID
			ref.MIGUUID = u
			return ref, nil
		}
		if gpuUUID == "" {
			gpuUUID = findUUID(s, gpuPrefix)
		}
	}
	if gpuUUID != "" {
		ref.Kind = GPUUUID
		ref.GPUUUID = gpuUUID
		return ref, nil
	}

	// 2. The driver's canonical device names.
	if deviceName != "" {
		return draNameRef(ref, deviceName, deviceName)
	}

	// 3. The device name inside a CDI name.
	for _, cdi := range cdiDevices {
		name, ok := cdiDeviceName(cdi)
		if !ok {
			continue
		}
		if _, _, ok := splitDRAName(name); ok {
			return draNameRef(ref, cdi, name)
		}
	}
	if len(cdiDevices) == 0 {
		return ref, parseErr(deviceName, "DRA device has neither a device name nor CDI devices")
	}
	return ref, parseErr(ref.Raw, "no GPU or MIG UUID and no gpu-<n> name in the CDI device names")
}

// draNameRef fills ref from a canonical DRA device name.
func draNameRef(ref DeviceRef, id, name string) (DeviceRef, error) {
	if strings.HasPrefix(name, "gpu-vfio-") {
		return ref, parseErr(id, "VFIO passthrough device: not visible to NVML")
	}
	n, _, ok := splitDRAName(name)
	if !ok {
		return ref, parseErr(id, "DRA device name is not gpu-<n>[-mig-<...>] and holds no GPU or MIG UUID")
	}
	ref.Kind = DRADevice
	ref.Minor = n
	ref.Raw = name
	return ref, nil
}

// splitDRAName splits "gpu-<n>" and "gpu-<n>-mig-<rest>". For a whole GPU mig
// is "".
func splitDRAName(name string) (n int, mig string, ok bool) {
	s, found := strings.CutPrefix(name, "gpu-")
	if !found {
		return 0, "", false
	}
	num := s
	if i := strings.IndexByte(s, '-'); i >= 0 {
		num = s[:i]
		rest, isMIG := strings.CutPrefix(s[i:], "-mig-")
		if !isMIG || rest == "" {
			return 0, "", false
		}
		mig = rest
	}
	v, err := parseNumber(num)
	if err != nil {
		return 0, "", false
	}
	return v, mig, true
}

// cdiDeviceName returns the device part of a fully qualified CDI name
// "vendor/class=name". A claim-specific name "<claim uid>-gpu-0" loses its
// claim UID prefix.
func cdiDeviceName(cdi string) (string, bool) {
	i := strings.LastIndexByte(cdi, '=')
	if i < 0 {
		return "", false
	}
	name := cdi[i+1:]
	if len(name) > uuidBodyLen && name[uuidBodyLen] == '-' && isUUIDBody(name[:uuidBodyLen]) {
		name = name[uuidBodyLen+1:]
	}
	return name, name != ""
}

// findUUID returns the first prefix+<8-4-4-4-12 hex> in s that is not part of
// a longer hex run, or "".
func findUUID(s, prefix string) string {
	for off := 0; ; {
		i := strings.Index(s[off:], prefix)
		if i < 0 {
			return ""
		}
		start := off + i
		end := start + len(prefix) + uuidBodyLen
		if end <= len(s) && isUUIDBody(s[start+len(prefix):end]) &&
			(end == len(s) || !isAlnum(s[end])) &&
			(start == 0 || !isAlnum(s[start-1])) {
			return s[start:end]
		}
		off = start + 1
	}
}

func isAlnum(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// normaliseMIGProfile turns an NVML MIG profile name ("1g.10gb",
// "1g.10gb+me") into the form the NVIDIA DRA driver puts in device names
// ("1g10gb", "1g10gb-me"): lower case, dots removed, anything else outside
// [a-z0-9-] replaced by '-'.
func normaliseMIGProfile(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '.':
		case c >= 'A' && c <= 'Z':
			b.WriteByte(c + 'a' - 'A')
		case (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-':
			b.WriteByte(c)
		default:
			b.WriteByte('-')
		}
	}
	return strings.Trim(b.String(), "-")
}
