// Package podmap maps the devices the kubelet hands to containers onto the
// GPUs and MIG instances that NVML sees on the node.
//
// It has three parts:
//
//   - device ID parsing (ParseDeviceID, ParseDRADevice): every ID format the
//     NVIDIA and GKE device plugins and the NVIDIA DRA driver report, detected
//     automatically, with no flag;
//   - resolution (Inventory.Resolve, Match): a parsed ID against the node's
//     inventory of GPUs and MIG instances, which the collector supplies;
//   - a kubelet PodResources v1 client (Client) that refreshes in the
//     background and publishes immutable snapshots, so that nothing on the
//     scrape path ever calls the kubelet.
//
// The simulation wing's sim/fakekubelet serves the real PodResourcesLister
// gRPC service on a unix socket for tests, demos and benchmarks.
package podmap

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// RefKind says which device ID format a DeviceRef was parsed from.
type RefKind int

const (
	// InvalidKind is the zero RefKind; no successfully parsed ref has it.
	InvalidKind RefKind = iota
	// GPUUUID is a whole GPU named by its UUID: "GPU-<uuid>", or a
	// time-slicing/MPS replica of it, "GPU-<uuid>::<n>" (NVIDIA device plugin).
	GPUUUID
	// MIGUUID is a MIG instance named by its own UUID: "MIG-<uuid>"
	// (optionally "::<n>" for a time-sliced MIG instance).
	MIGUUID
	// MIGLegacy is the pre-R470 MIG form "MIG-GPU-<uuid>/<gi>/<ci>": the
	// parent GPU's UUID, the GPU instance ID and the compute instance ID.
	MIGLegacy
	// GKEMinor is the GKE device plugin form "nvidia<minor>", where minor is
	// the NVML minor number (/dev/nvidia<minor>), not the NVML index;
	// optionally with "/gi<m>" (MIG GPU instance m) and/or "/vgpu<k>"
	// (time-sharing replica k).
	GKEMinor
	// DRADevice is a device of the NVIDIA DRA driver named "gpu-<n>" or
	// "gpu-<n>-mig-<...>" (see ParseDRADevice). Minor holds n. Raw holds the
	// DRA device name; Inventory.Resolve reads the MIG part from it.
	DRADevice
)

// String returns a short, stable name of the kind (usable as a label value).
func (k RefKind) String() string {
	switch k {
	case GPUUUID:
		return "gpu-uuid"
	case MIGUUID:
		return "mig-uuid"
	case MIGLegacy:
		return "mig-legacy"
	case GKEMinor:
		return "gke-minor"
	case DRADevice:
		return "dra"
	default:
		return "invalid"
	}
}

// DeviceRef is a parsed device ID. Fields that a format does not carry are
// empty strings or -1.
type DeviceRef struct {
	Raw             string  // the ID exactly as the kubelet reported it
	Kind            RefKind // which format Raw was in
	GPUUUID         string  // "GPU-..." for GPUUUID and MIGLegacy
	MIGUUID         string  // "MIG-..." for MIGUUID
	Minor           int     // GKE (or DRA) minor number, -1 if none
	GPUInstance     int     // legacy gi or GKE giM, -1 if none
	ComputeInstance int     // legacy ci, -1 if none
	Replica         int     // ::n or vgpuK, -1 if none
}

// ErrMalformedDeviceID is matched (errors.Is) by every error ParseDeviceID
// and ParseDRADevice return.
var ErrMalformedDeviceID = errors.New("malformed device ID")

// ParseError is the error ParseDeviceID and ParseDRADevice return: the ID (as
// given) and what was wrong with it.
type ParseError struct {
	ID     string
	Reason string
}

// maxIDLen bounds the length of an ID that is parsed at all. Real IDs are
// well under 100 bytes.
const maxIDLen = 512

// maxNumber bounds every number inside an ID (minor, gi, ci, replica).
const maxNumber = 1<<20 - 1

func (e *ParseError) Error() string {
	return fmt.Sprintf("device ID %q: %s", short(e.ID), e.Reason)
}

// short truncates s for error messages.
func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// Is reports whether target is ErrMalformedDeviceID.
func (e *ParseError) Is(target error) bool { return target == ErrMalformedDeviceID }

func parseErr(id, format string, args ...any) error {
	return &ParseError{ID: id, Reason: fmt.Sprintf(format, args...)}
}

const (
	gpuPrefix       = "GPU-"
	migPrefix       = "MIG-"
	migLegacyPrefix = "MIG-GPU-"
	gkePrefix       = "nvidia"
	replicaSep      = "::"
	uuidBodyLen     = 36 // 8-4-4-4-12 hex digits
)

const knownFormats = "GPU-<uuid>[::<n>], MIG-<uuid>[::<n>], MIG-GPU-<uuid>/<gi>/<ci> or nvidia<minor>[/gi<m>][/vgpu<k>]"

// ParseDeviceID parses a device ID reported by a device plugin through the
// kubelet. The format is detected from the ID itself:
//
//	GPU-<uuid>                    whole GPU (NVIDIA device plugin)
//	GPU-<uuid>::<n>               time-slicing / MPS replica n of that GPU
//	MIG-<uuid>                    MIG instance (also MIG-<uuid>::<n>)
//	MIG-GPU-<uuid>/<gi>/<ci>      MIG instance, pre-R470 form
//	nvidia<minor>                 whole GPU (GKE); minor = NVML minor number
//	nvidia<minor>/vgpu<k>         GKE time-sharing replica k
//	nvidia<minor>/gi<m>           GKE MIG GPU instance m
//	nvidia<minor>/gi<m>/vgpu<k>   GKE time-sharing on a MIG instance
//
// UUID bodies must be 8-4-4-4-12 hexadecimal digits; numbers must be decimal
// without leading zeros. On error the returned ref still has Raw set and all
// numeric fields -1, and the error (a *ParseError, matching
// ErrMalformedDeviceID) says what was wrong.
func ParseDeviceID(id string) (DeviceRef, error) {
	ref := DeviceRef{Raw: id, Minor: -1, GPUInstance: -1, ComputeInstance: -1, Replica: -1}
	bad := DeviceRef{Raw: id, Minor: -1, GPUInstance: -1, ComputeInstance: -1, Replica: -1}
	if id == "" {
		return bad, parseErr(id, "empty device ID")
	}
	if len(id) > maxIDLen {
		return bad, parseErr(id, "longer than %d bytes", maxIDLen)
	}

	base := id
	if i := strings.Index(id, replicaSep); i >= 0 {
		base = id[:i]
		rep := id[i+len(replicaSep):]
		if strings.HasPrefix(base, gkePrefix) {
			return bad, parseErr(id, "replica suffix %q is not used with GKE IDs (GKE writes /vgpu<k>)", replicaSep)
		}
		n, err := parseNumber(rep)
		if err != nil {
			return bad, parseErr(id, "replica after %q: %v", replicaSep, err)
		}
		ref.Replica = n
	}

	switch {
	case strings.HasPrefix(base, migLegacyPrefix):
		// MIG-GPU-<uuid>/<gi>/<ci>
		parts := strings.Split(base[len(migPrefix):], "/")
		if len(parts) != 3 {
			return bad, parseErr(id, "legacy MIG ID must be MIG-GPU-<uuid>/<gi>/<ci>, found %d part(s) separated by '/'", len(parts))
		}
		if err := checkUUIDBody(parts[0][len(gpuPrefix):]); err != nil {
			return bad, parseErr(id, "GPU UUID: %v", err)
		}
		gi, err := parseNumber(parts[1])
		if err != nil {
			return bad, parseErr(id, "GPU instance: %v", err)
		}
		ci, err := parseNumber(parts[2])
		if err != nil {
			return bad, parseErr(id, "compute instance: %v", err)
		}
		ref.Kind = MIGLegacy
		ref.GPUUUID = parts[0]
		ref.GPUInstance = gi
		ref.ComputeInstance = ci
	case strings.HasPrefix(base, migPrefix):
		if err := checkUUIDBody(base[len(migPrefix):]); err != nil {
			return bad, parseErr(id, "MIG UUID: %v", err)
		}
		ref.Kind = MIGUUID
		ref.MIGUUID = base
	case strings.HasPrefix(base, gpuPrefix):
		if err := checkUUIDBody(base[len(gpuPrefix):]); err != nil {
			return bad, parseErr(id, "GPU UUID: %v", err)
		}
		ref.Kind = GPUUUID
		ref.GPUUUID = base
	case strings.HasPrefix(base, gkePrefix):
		if err := parseGKE(base[len(gkePrefix):], &ref); err != nil {
			return bad, parseErr(id, "GKE ID: %v", err)
		}
		ref.Kind = GKEMinor
	default:
		return bad, parseErr(id, "unrecognised format (want %s)", knownFormats)
	}
	return ref, nil
}

// parseGKE parses what follows "nvidia": <minor>[/gi<m>][/vgpu<k>].
func parseGKE(s string, ref *DeviceRef) error {
	parts := strings.Split(s, "/")
	minor, err := parseNumber(parts[0])
	if err != nil {
		return fmt.Errorf("minor number: %v", err)
	}
	ref.Minor = minor
	rest := parts[1:]
	if len(rest) > 0 && strings.HasPrefix(rest[0], "gi") {
		gi, err := parseNumber(rest[0][2:])
		if err != nil {
			return fmt.Errorf("GPU instance %q: %v", short(rest[0]), err)
		}
		ref.GPUInstance = gi
		rest = rest[1:]
	}
	if len(rest) > 0 && strings.HasPrefix(rest[0], "vgpu") {
		k, err := parseNumber(rest[0][4:])
		if err != nil {
			return fmt.Errorf("replica %q: %v", short(rest[0]), err)
		}
		ref.Replica = k
		rest = rest[1:]
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected element %q (want nvidia<minor>[/gi<m>][/vgpu<k>])", short(rest[0]))
	}
	return nil
}

// parseNumber parses a non-negative decimal number without sign, leading
// zeros or anything else around it.
func parseNumber(s string) (int, error) {
	if s == "" {
		return 0, errors.New("missing number")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a decimal number", short(s))
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, fmt.Errorf("%q has a leading zero", short(s))
	}
	if len(s) > 7 {
		return 0, fmt.Errorf("%q is out of range", short(s))
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > maxNumber {
		return 0, fmt.Errorf("%q is out of range", short(s))
	}
	return n, nil
}

// checkUUIDBody checks the part of a GPU or MIG UUID after "GPU-"/"MIG-":
// 8-4-4-4-12 hexadecimal digits.
func checkUUIDBody(s string) error {
	if len(s) != uuidBodyLen {
		return fmt.Errorf("%q is not 8-4-4-4-12 hex digits (length %d, want %d)", short(s), len(s), uuidBodyLen)
	}
	if !isUUIDBody(s) {
		return fmt.Errorf("%q is not 8-4-4-4-12 hex digits", short(s))
	}
	return nil
}

func isUUIDBody(s string) bool {
	if len(s) != uuidBodyLen {
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
			if !isHex(c) {
				return false
			}
		}
	}
	return true
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// String returns the canonical form of the ID. For a ref that ParseDeviceID
// returned it equals Raw. For a DRADevice ref it is Raw (the DRA device name);
// for a UUID ref that ParseDRADevice found inside a DRA or CDI name it is the
// UUID form, not the DRA name.
func (r DeviceRef) String() string {
	rep := ""
	if r.Replica >= 0 {
		rep = replicaSep + strconv.Itoa(r.Replica)
	}
	switch r.Kind {
	case GPUUUID:
		return r.GPUUUID + rep
	case MIGUUID:
		return r.MIGUUID + rep
	case MIGLegacy:
		return fmt.Sprintf("%s%s/%d/%d%s", migPrefix, r.GPUUUID, r.GPUInstance, r.ComputeInstance, rep)
	case GKEMinor:
		var b strings.Builder
		fmt.Fprintf(&b, "%s%d", gkePrefix, r.Minor)
		if r.GPUInstance >= 0 {
			fmt.Fprintf(&b, "/gi%d", r.GPUInstance)
		}
		if r.Replica >= 0 {
			fmt.Fprintf(&b, "/vgpu%d", r.Replica)
		}
		return b.String()
	default:
		return r.Raw
	}
}

// IsMIG reports whether the ref names a MIG instance rather than a whole GPU.
// For DRADevice refs it reports whether the DRA name has a MIG part.
func (r DeviceRef) IsMIG() bool {
	switch r.Kind {
	case MIGUUID, MIGLegacy:
		return true
	case GKEMinor:
		return r.GPUInstance >= 0
	case DRADevice:
		_, mig, _ := splitDRAName(r.Raw)
		return mig != ""
	}
	return false
}

// IsShared reports whether the ref is one replica of a shared (time-sliced or
// MPS) device, which other containers may hold at the same time.
func (r DeviceRef) IsShared() bool { return r.Replica >= 0 }

// Validate checks that the fields of the ref are consistent with its Kind.
// Every ref that ParseDeviceID or ParseDRADevice returns without error
// validates.
func (r DeviceRef) Validate() error {
	neg := func(name string, v int) error {
		if v != -1 {
			return fmt.Errorf("%s ref has %s %d, want -1", r.Kind, name, v)
		}
		return nil
	}
	rng := func(name string, v int) error {
		if v < -1 || v > maxNumber {
			return fmt.Errorf("%s ref has %s %d out of range", r.Kind, name, v)
		}
		return nil
	}
	gpuUUID := func() error {
		if !strings.HasPrefix(r.GPUUUID, gpuPrefix) || !isUUIDBody(r.GPUUUID[len(gpuPrefix):]) {
			return fmt.Errorf("%s ref has malformed GPU UUID %q", r.Kind, r.GPUUUID)
		}
		return nil
	}
	var errs []error
	errs = append(errs, rng("minor", r.Minor), rng("GPU instance", r.GPUInstance),
		rng("compute instance", r.ComputeInstance), rng("replica", r.Replica))
	switch r.Kind {
	case GPUUUID:
		errs = append(errs, gpuUUID(), neg("minor", r.Minor), neg("GPU instance", r.GPUInstance),
			neg("compute instance", r.ComputeInstance))
		if r.MIGUUID != "" {
			errs = append(errs, fmt.Errorf("gpu-uuid ref has MIG UUID %q", r.MIGUUID))
		}
	case MIGUUID:
		if !strings.HasPrefix(r.MIGUUID, migPrefix) || !isUUIDBody(r.MIGUUID[len(migPrefix):]) {
			errs = append(errs, fmt.Errorf("mig-uuid ref has malformed MIG UUID %q", r.MIGUUID))
		}
		if r.GPUUUID != "" {
			errs = append(errs, fmt.Errorf("mig-uuid ref has GPU UUID %q", r.GPUUUID))
		}
		errs = append(errs, neg("minor", r.Minor), neg("GPU instance", r.GPUInstance),
			neg("compute instance", r.ComputeInstance))
	case MIGLegacy:
		errs = append(errs, gpuUUID(), neg("minor", r.Minor))
		if r.GPUInstance < 0 || r.ComputeInstance < 0 {
			errs = append(errs, errors.New("mig-legacy ref needs GPU and compute instance"))
		}
		if r.MIGUUID != "" {
			errs = append(errs, fmt.Errorf("mig-legacy ref has MIG UUID %q", r.MIGUUID))
		}
	case GKEMinor, DRADevice:
		if r.Minor < 0 {
			errs = append(errs, fmt.Errorf("%s ref has no minor number", r.Kind))
		}
		if r.GPUUUID != "" || r.MIGUUID != "" {
			errs = append(errs, fmt.Errorf("%s ref has a UUID", r.Kind))
		}
		errs = append(errs, neg("compute instance", r.ComputeInstance))
		if r.Kind == DRADevice {
			errs = append(errs, neg("GPU instance", r.GPUInstance), neg("replica", r.Replica))
			n, _, ok := splitDRAName(r.Raw)
			if !ok || n != r.Minor {
				errs = append(errs, fmt.Errorf("dra ref raw name %q does not name gpu-%d", r.Raw, r.Minor))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("invalid kind %d", int(r.Kind)))
	}
	return errors.Join(errs...)
}
