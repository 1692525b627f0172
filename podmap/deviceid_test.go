package podmap

import (
	"errors"
	"strings"
	"testing"
)

const (
	uuidA = "6f2a1b3c-9d4e-4f50-8a61-72b3c4d5e6f7"
	uuidB = "0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9" // upper case hex is accepted
	uuidM = "a0b1c2d3-e4f5-5a6b-9c7d-8e9fa0b1c2d3"
)

// ref builds an expected DeviceRef with -1 for the absent numbers.
func ref(raw string, kind RefKind, mod func(*DeviceRef)) DeviceRef {
	r := DeviceRef{Raw: raw, Kind: kind, Minor: -1, GPUInstance: -1, ComputeInstance: -1, Replica: -1}
	if mod != nil {
		mod(&r)
	}
	return r
}

func TestParseDeviceID(t *testing.T) {
	tests := []struct {
		id   string
		want DeviceRef
	}{
		{"GPU-" + uuidA, ref("GPU-"+uuidA, GPUUUID, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidA })},
		{"GPU-" + uuidB, ref("GPU-"+uuidB, GPUUUID, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidB })},
		{"GPU-" + uuidA + "::0", ref("GPU-"+uuidA+"::0", GPUUUID, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidA; r.Replica = 0 })},
		{"GPU-" + uuidA + "::17", ref("GPU-"+uuidA+"::17", GPUUUID, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidA; r.Replica = 17 })},
		{"MIG-" + uuidM, ref("MIG-"+uuidM, MIGUUID, func(r *DeviceRef) { r.MIGUUID = "MIG-" + uuidM })},
		{"MIG-" + uuidM + "::3", ref("MIG-"+uuidM+"::3", MIGUUID, func(r *DeviceRef) { r.MIGUUID = "MIG-" + uuidM; r.Replica = 3 })},
		{"MIG-GPU-" + uuidA + "/1/0", ref("MIG-GPU-"+uuidA+"/1/0", MIGLegacy, func(r *DeviceRef) {
			r.GPUUUID = "GPU-" + uuidA
			r.GPUInstance = 1
			r.ComputeInstance = 0
		})},
		{"MIG-GPU-" + uuidA + "/13/2::4", ref("MIG-GPU-"+uuidA+"/13/2::4", MIGLegacy, func(r *DeviceRef) {
			r.GPUUUID = "GPU-" + uuidA
			r.GPUInstance = 13
			r.ComputeInstance = 2
			r.Replica = 4
		})},
		{"nvidia0", ref("nvidia0", GKEMinor, func(r *DeviceRef) { r.Minor = 0 })},
		{"nvidia7", ref("nvidia7", GKEMinor, func(r *DeviceRef) { r.Minor = 7 })},
		{"nvidia12", ref("nvidia12", GKEMinor, func(r *DeviceRef) { r.Minor = 12 })},
		{"nvidia0/vgpu1", ref("nvidia0/vgpu1", GKEMinor, func(r *DeviceRef) { r.Minor = 0; r.Replica = 1 })},
		{"nvidia3/vgpu0", ref("nvidia3/vgpu0", GKEMinor, func(r *DeviceRef) { r.Minor = 3; r.Replica = 0 })},
		{"nvidia0/gi2", ref("nvidia0/gi2", GKEMinor, func(r *DeviceRef) { r.Minor = 0; r.GPUInstance = 2 })},
		{"nvidia1/gi0", ref("nvidia1/gi0", GKEMinor, func(r *DeviceRef) { r.Minor = 1; r.GPUInstance = 0 })},
		{"nvidia0/gi2/vgpu1", ref("nvidia0/gi2/vgpu1", GKEMinor, func(r *DeviceRef) { r.Minor = 0; r.GPUInstance = 2; r.Replica = 1 })},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			got, err := ParseDeviceID(tt.id)
			if err != nil {
				t.Fatalf("ParseDeviceID(%q) error: %v", tt.id, err)
			}
			if got != tt.want {
				t.Fatalf("ParseDeviceID(%q)\n got %+v\nwant %+v", tt.id, got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
			if s := got.String(); s != tt.id {
				t.Errorf("String() = %q, want %q", s, tt.id)
			}
		})
	}
}

func TestParseDeviceIDMalformed(t *testing.T) {
	tests := []struct {
		id     string
		reason string // substring of the error
	}{
		{"", "empty device ID"},
		{"gpu-0", "unrecognised format"},
		{"foo", "unrecognised format"},
		{"0", "unrecognised format"},
		{" GPU-" + uuidA, "unrecognised format"},
		{strings.Repeat("x", 600), "longer than"},
		{"GPU-", "GPU UUID"},
		{"GPU-" + uuidA[:35], "length 35"},
		{"GPU-" + uuidA + "0", "length 37"},
		{"GPU-" + strings.Replace(uuidA, "6f", "zz", 1), "not 8-4-4-4-12 hex digits"},
		{"GPU-" + strings.ReplaceAll(uuidA, "-", "_"), "not 8-4-4-4-12 hex digits"},
		{"GPU-" + uuidA + " ", "length 37"},
		{"GPU-" + uuidA + "::", "missing number"},
		{"GPU-" + uuidA + "::x", "not a decimal number"},
		{"GPU-" + uuidA + "::-1", "not a decimal number"},
		{"GPU-" + uuidA + "::01", "leading zero"},
		{"GPU-" + uuidA + "::99999999999", "out of range"},
		{"GPU-" + uuidA + "::1::2", "not a decimal number"},
		{"::1", "unrecognised format"},
		{"MIG-", "MIG UUID"},
		{"MIG-" + uuidM + "/1/0", "MIG UUID"},
		{"MIG-GPU-" + uuidA, "found 1 part"},
		{"MIG-GPU-" + uuidA + "/1", "found 2 part"},
		{"MIG-GPU-" + uuidA + "/1/0/3", "found 4 part"},
		{"MIG-GPU-" + uuidA + "//0", "GPU instance: missing number"},
		{"MIG-GPU-" + uuidA + "/1/", "compute instance: missing number"},
		{"MIG-GPU-" + uuidA + "/a/0", "GPU instance"},
		{"MIG-GPU-" + uuidA + "/1/b", "compute instance"},
		{"MIG-GPU-bad/1/0", "GPU UUID"},
		{"nvidia", "minor number: missing number"},
		{"nvidiactl", "minor number"},
		{"nvidia-uvm", "minor number"},
		{"nvidia01", "leading zero"},
		{"nvidia0/", `unexpected element ""`},
		{"nvidia0/gi", "GPU instance"},
		{"nvidia0/gix", "GPU instance"},
		{"nvidia0/vgpu", "replica"},
		{"nvidia0/vgpu01", "leading zero"},
		{"nvidia0/vgpu1/gi2", `unexpected element "gi2"`},
		{"nvidia0/gi1/gi2", `unexpected element "gi2"`},
		{"nvidia0/gi1/vgpu2/x", `unexpected element "x"`},
		{"nvidia0/mig1", `unexpected element "mig1"`},
		{"nvidia0::1", "not used with GKE IDs"},
		{"NVIDIA0", "unrecognised format"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			got, err := ParseDeviceID(tt.id)
			if err == nil {
				t.Fatalf("ParseDeviceID(%q) = %+v, want error", tt.id, got)
			}
			if !errors.Is(err, ErrMalformedDeviceID) {
				t.Errorf("error %v does not match ErrMalformedDeviceID", err)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.ID != tt.id {
				t.Errorf("error %v is not a *ParseError for the ID", err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not say %q", err, tt.reason)
			}
			want := ref(tt.id, InvalidKind, nil)
			if got != want {
				t.Errorf("ref on error = %+v, want %+v", got, want)
			}
			if got.Validate() == nil {
				t.Errorf("invalid ref validates")
			}
		})
	}
}

func TestParseErrorTruncatesLongIDs(t *testing.T) {
	_, err := ParseDeviceID("GPU-" + strings.Repeat("a", 200))
	if err == nil || len(err.Error()) > 300 {
		t.Fatalf("error too long or missing: %v", err)
	}
}

func TestRefKindString(t *testing.T) {
	want := map[RefKind]string{
		InvalidKind: "invalid", GPUUUID: "gpu-uuid", MIGUUID: "mig-uuid",
		MIGLegacy: "mig-legacy", GKEMinor: "gke-minor", DRADevice: "dra", RefKind(99): "invalid",
	}
	for k, s := range want {
		if k.String() != s {
			t.Errorf("RefKind(%d).String() = %q, want %q", int(k), k.String(), s)
		}
	}
}

func TestRefPredicates(t *testing.T) {
	tests := []struct {
		id          string
		mig, shared bool
	}{
		{"GPU-" + uuidA, false, false},
		{"GPU-" + uuidA + "::2", false, true},
		{"MIG-" + uuidM, true, false},
		{"MIG-GPU-" + uuidA + "/1/0", true, false},
		{"nvidia0", false, false},
		{"nvidia0/vgpu1", false, true},
		{"nvidia0/gi1", true, false},
		{"nvidia0/gi1/vgpu0", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			r, err := ParseDeviceID(tt.id)
			if err != nil {
				t.Fatal(err)
			}
			if r.IsMIG() != tt.mig || r.IsShared() != tt.shared {
				t.Errorf("%s: IsMIG=%v IsShared=%v, want %v %v", tt.id, r.IsMIG(), r.IsShared(), tt.mig, tt.shared)
			}
		})
	}
}

func TestValidateCatchesInconsistentRefs(t *testing.T) {
	good, _ := ParseDeviceID("GPU-" + uuidA)
	bad := []DeviceRef{
		{},
		func() DeviceRef { r := good; r.Minor = 3; return r }(),
		func() DeviceRef { r := good; r.GPUUUID = "GPU-x"; return r }(),
		func() DeviceRef { r := good; r.MIGUUID = "MIG-" + uuidM; return r }(),
		func() DeviceRef { r := good; r.Replica = -5; return r }(),
		ref("", MIGUUID, func(r *DeviceRef) { r.MIGUUID = "MIG-nope" }),
		ref("", MIGLegacy, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidA; r.GPUInstance = 1 }),
		ref("", GKEMinor, nil),
		ref("", GKEMinor, func(r *DeviceRef) { r.Minor = 1; r.GPUUUID = "GPU-" + uuidA }),
		ref("gpu-1", DRADevice, func(r *DeviceRef) { r.Minor = 2 }),
		ref("gpu-1", DRADevice, func(r *DeviceRef) { r.Minor = 1; r.Replica = 0 }),
	}
	for i, r := range bad {
		if err := r.Validate(); err == nil {
			t.Errorf("%d: %+v validates", i, r)
		}
	}
}

func FuzzParseDeviceID(f *testing.F) {
	for _, s := range []string{
		"GPU-" + uuidA, "GPU-" + uuidA + "::3", "MIG-" + uuidM, "MIG-" + uuidM + "::0",
		"MIG-GPU-" + uuidA + "/1/0", "MIG-GPU-" + uuidB + "/7/1::2",
		"nvidia0", "nvidia3/vgpu1", "nvidia0/gi2", "nvidia0/gi2/vgpu1",
		"", "nvidia", "GPU-", "MIG-GPU-", "::", "nvidia0/gi", "GPU-" + uuidA + "::01",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		r, err := ParseDeviceID(id)
		if err != nil {
			if !errors.Is(err, ErrMalformedDeviceID) {
				t.Fatalf("error %v is not ErrMalformedDeviceID", err)
			}
			if r.Kind != InvalidKind || r.Raw != id {
				t.Fatalf("ref on error %+v", r)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("parsed ref %+v does not validate: %v", r, err)
		}
		if r.String() != id {
			t.Fatalf("String() = %q, want %q", r.String(), id)
		}
		again, err := ParseDeviceID(r.String())
		if err != nil || again != r {
			t.Fatalf("re-parse of %q = %+v, %v; want %+v", r.String(), again, err, r)
		}
		// A parsed ID always resolves consistently: never panics on an
		// empty or nil inventory.
		var nilInv *Inventory
		if _, ok := nilInv.Resolve(r); ok {
			t.Fatal("nil inventory resolved")
		}
		if _, ok := (&Inventory{}).Resolve(r); ok {
			t.Fatal("empty inventory resolved")
		}
	})
}

func TestParseDRADevice(t *testing.T) {
	claimUID := "3d5a8f0e-1c2b-4a6d-9e8f-7a6b5c4d3e2f"
	tests := []struct {
		name string
		dev  string
		cdi  []string
		want DeviceRef
	}{
		{"index name", "gpu-0", []string{"k8s.gpu.nvidia.com/device=gpu-0"},
			ref("gpu-0", DRADevice, func(r *DeviceRef) { r.Minor = 0 })},
		{"two digit", "gpu-12", nil, ref("gpu-12", DRADevice, func(r *DeviceRef) { r.Minor = 12 })},
		{"mig current", "gpu-1-mig-1g10gb-19-3", nil, ref("gpu-1-mig-1g10gb-19-3", DRADevice, func(r *DeviceRef) { r.Minor = 1 })},
		{"mig placement", "gpu-0-mig-3g40gb-4-7", nil, ref("gpu-0-mig-3g40gb-4-7", DRADevice, func(r *DeviceRef) { r.Minor = 0 })},
		{"mig early", "gpu-2-mig-19-0-1", nil, ref("gpu-2-mig-19-0-1", DRADevice, func(r *DeviceRef) { r.Minor = 2 })},
		{"gpu uuid in device name", "GPU-" + uuidA, nil,
			ref("GPU-"+uuidA, GPUUUID, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidA })},
		{"gpu uuid in cdi name", "dev0", []string{"nvidia.com/gpu=GPU-" + uuidA},
			ref("dev0", GPUUUID, func(r *DeviceRef) { r.GPUUUID = "GPU-" + uuidA })},
		{"mig uuid wins over gpu uuid", "gpu-0-mig-x", []string{"nvidia.com/gpu=GPU-" + uuidA, "nvidia.com/mig=MIG-" + uuidM},
			ref("gpu-0-mig-x", MIGUUID, func(r *DeviceRef) { r.MIGUUID = "MIG-" + uuidM })},
		{"uuid embedded in name", "x-MIG-" + uuidM + "-y", nil,
			ref("x-MIG-"+uuidM+"-y", MIGUUID, func(r *DeviceRef) { r.MIGUUID = "MIG-" + uuidM })},
		{"claim cdi only", "", []string{"k8s.gpu.nvidia.com/claim=" + claimUID + "-gpu-3"},
			ref("k8s.gpu.nvidia.com/claim="+claimUID+"-gpu-3", DRADevice, func(r *DeviceRef) { r.Minor = 3; r.Raw = "gpu-3" })},
		{"device cdi only", "", []string{"bogus", "k8s.gpu.nvidia.com/device=gpu-4"},
			ref("gpu-4", DRADevice, func(r *DeviceRef) { r.Minor = 4 })},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDRADevice(tt.dev, tt.cdi)
			if err != nil {
				t.Fatalf("error: %v", err)
			}
			if got != tt.want {
				t.Fatalf("\n got %+v\nwant %+v", got, tt.want)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestParseDRADeviceMalformed(t *testing.T) {
	tests := []struct {
		name, dev string
		cdi       []string
		reason    string
	}{
		{"nothing", "", nil, "neither a device name nor CDI devices"},
		{"vfio", "gpu-vfio-0", nil, "VFIO"},
		{"other name", "imex-channel-0", nil, "is not gpu-<n>"},
		{"leading zero", "gpu-01", nil, "is not gpu-<n>"},
		{"empty mig", "gpu-0-mig-", nil, "is not gpu-<n>"},
		{"not mig", "gpu-0-foo", nil, "is not gpu-<n>"},
		{"no number", "gpu-", nil, "is not gpu-<n>"},
		{"bad cdi", "", []string{"k8s.gpu.nvidia.com/device=foo", "nonsense"}, "no GPU or MIG UUID"},
		{"uuid too short", "GPU-" + uuidA[:30], nil, "is not gpu-<n>"},
		{"uuid glued to hex", "GPU-" + uuidA + "ab", nil, "is not gpu-<n>"},
		{"too long", strings.Repeat("g", 600), nil, "longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseDRADevice(tt.dev, tt.cdi)
			if err == nil {
				t.Fatalf("= %+v, want error", got)
			}
			if !errors.Is(err, ErrMalformedDeviceID) || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q: want ErrMalformedDeviceID saying %q", err, tt.reason)
			}
			if got.Kind != InvalidKind {
				t.Errorf("kind %v on error", got.Kind)
			}
		})
	}
}

func FuzzParseDRADevice(f *testing.F) {
	f.Add("gpu-0", "k8s.gpu.nvidia.com/device=gpu-0")
	f.Add("gpu-1-mig-1g10gb-19-0", "")
	f.Add("", "k8s.gpu.nvidia.com/claim=3d5a8f0e-1c2b-4a6d-9e8f-7a6b5c4d3e2f-gpu-3")
	f.Add("x", "nvidia.com/gpu=GPU-"+uuidA)
	f.Add("gpu-vfio-0", "")
	f.Fuzz(func(t *testing.T, dev, cdi string) {
		var cdis []string
		if cdi != "" {
			cdis = []string{cdi}
		}
		r, err := ParseDRADevice(dev, cdis)
		if err != nil {
			if !errors.Is(err, ErrMalformedDeviceID) || r.Kind != InvalidKind {
				t.Fatalf("error %v with ref %+v", err, r)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("ref %+v does not validate: %v", r, err)
		}
		testInventory().Resolve(r) // must not panic
	})
}
