package podmap

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// testUUID returns a well-formed UUID body derived from n and a tag digit.
func testUUID(tag, n int) string {
	return fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", 0xabc00000+tag, n, n, tag, n*7919+tag)
}

// testInventory: GKE-like minors that differ from the indices.
//
//	index 0: minor 2, whole GPU
//	index 1: minor 0, MIG: gi 1 (3g.40gb), gi 2 (1g.10gb ci 0), gi 5 (1g.10gb ci 1), gi 9 (1g.10gb+me)
//	index 2: minor 1, MIG: gi 3 (7g.80gb) only
//	index 3: minor -1 (unknown), whole GPU
func testInventory() *Inventory {
	return &Inventory{GPUs: []InventoryGPU{
		{Index: 0, UUID: "GPU-" + testUUID(1, 0), Minor: 2},
		{Index: 1, UUID: "GPU-" + testUUID(1, 1), Minor: 0, MIG: []InventoryMIG{
			{UUID: "MIG-" + testUUID(2, 11), GPUInstance: 1, ComputeInstance: 0, Profile: "3g.40gb"},
			{UUID: "MIG-" + testUUID(2, 12), GPUInstance: 2, ComputeInstance: 0, Profile: "1g.10gb"},
			{UUID: "MIG-" + testUUID(2, 15), GPUInstance: 5, ComputeInstance: 1, Profile: "1g.10gb"},
			{UUID: "MIG-" + testUUID(2, 19), GPUInstance: 9, ComputeInstance: 0, Profile: "1g.10gb+me"},
		}},
		{Index: 2, UUID: "GPU-" + testUUID(1, 2), Minor: 1, MIG: []InventoryMIG{
			{UUID: "MIG-" + testUUID(2, 23), GPUInstance: 3, ComputeInstance: 0, Profile: "7g.80gb"},
		}},
		{Index: 3, UUID: "GPU-" + testUUID(1, 3), Minor: -1},
	}}
}

func TestResolve(t *testing.T) {
	inv := testInventory()
	g := func(i int) string { return inv.GPUs[i].UUID }
	whole := func(i int) Target { return Target{GPU: i, UUID: g(i), GPUInstance: -1, ComputeInstance: -1} }
	mig := func(i, gi int, p string) Target {
		for _, m := range inv.GPUs[i].MIG {
			if m.GPUInstance == gi {
				return Target{GPU: i, UUID: g(i), GPUInstance: gi, ComputeInstance: m.ComputeInstance, MIGProfile: p}
			}
		}
		return Target{GPU: i, UUID: g(i), GPUInstance: gi, MIGProfile: p}
	}
	tests := []struct {
		id   string
		want Target
		ok   bool
	}{
		{g(0), whole(0), true},
		{g(3), whole(3), true},
		{g(2) + "::4", whole(2), true},
		{strings.ToUpper(g(1)[:4]) + strings.ToUpper(g(1)[4:]), whole(1), true},
		{"GPU-" + testUUID(9, 9), Target{}, false},
		{"MIG-" + testUUID(2, 12), mig(1, 2, "1g.10gb"), true},
		{"MIG-" + testUUID(2, 23) + "::1", mig(2, 3, "7g.80gb"), true},
		{"MIG-" + testUUID(9, 9), Target{}, false},
		{"MIG-" + g(1) + "/1/0", mig(1, 1, "3g.40gb"), true},
		{"MIG-" + g(1) + "/5/1", mig(1, 5, "1g.10gb"), true},
		{"MIG-" + g(1) + "/5/0", mig(1, 5, "1g.10gb"), true}, // gi known, ci differs: the gi counts
		{"MIG-" + g(1) + "/4/0", Target{}, false},
		{"MIG-" + g(0) + "/1/0", Target{}, false}, // GPU without MIG
		{"MIG-GPU-" + testUUID(9, 9) + "/1/0", Target{}, false},
		// GKE: minor, not index.
		{"nvidia0", whole(1), true},
		{"nvidia1", whole(2), true},
		{"nvidia2", whole(0), true},
		{"nvidia3", Target{}, false}, // index 3 exists, but has no minor 3
		{"nvidia2/vgpu3", whole(0), true},
		{"nvidia0/gi2", mig(1, 2, "1g.10gb"), true},
		{"nvidia0/gi9/vgpu1", mig(1, 9, "1g.10gb+me"), true},
		{"nvidia1/gi3", mig(2, 3, "7g.80gb"), true},
		{"nvidia1/gi2", Target{}, false},
		{"nvidia2/gi0", Target{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			r, err := ParseDeviceID(tt.id)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := inv.Resolve(r)
			if ok != tt.ok || got != tt.want {
				t.Fatalf("Resolve(%s) = %+v, %v; want %+v, %v", tt.id, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestResolveDRA(t *testing.T) {
	inv := testInventory()
	g := func(i int) string { return inv.GPUs[i].UUID }
	whole := func(i int) Target { return Target{GPU: i, UUID: g(i), GPUInstance: -1, ComputeInstance: -1} }
	mig := func(i, gi int, p string) Target {
		for _, m := range inv.GPUs[i].MIG {
			if m.GPUInstance == gi {
				return Target{GPU: i, UUID: g(i), GPUInstance: gi, ComputeInstance: m.ComputeInstance, MIGProfile: p}
			}
		}
		return Target{GPU: i, UUID: g(i), GPUInstance: gi, MIGProfile: p}
	}
	tests := []struct {
		dev  string
		cdi  []string
		want Target
		ok   bool
	}{
		{"gpu-0", nil, whole(1), true}, // n is a minor first
		{"gpu-2", nil, whole(0), true},
		{"gpu-3", nil, whole(3), true},  // no minor 3: early drivers' index
		{"gpu-4", nil, Target{}, false}, // neither
		{"gpu-0-mig-3g40gb-1-4", nil, mig(1, 1, "3g.40gb"), true},
		{"gpu-0-mig-1g10gb-me-19-6", nil, mig(1, 9, "1g.10gb+me"), true}, // longest profile wins
		{"gpu-0-mig-1g10gb-19-0", nil, Target{}, false},                  // two 1g.10gb instances: ambiguous
		{"gpu-0-mig-2g20gb-14-0", nil, Target{}, false},                  // no such profile
		{"gpu-1-mig-7g80gb-0-7", nil, mig(2, 3, "7g.80gb"), true},
		{"gpu-1-mig-0-0-8", nil, mig(2, 3, "7g.80gb"), true}, // early form, single MIG instance
		{"gpu-0-mig-19-0-1", nil, Target{}, false},           // early form, several instances
		{"gpu-2-mig-1g10gb-0", nil, Target{}, false},         // GPU without MIG
		{"whatever", []string{"k8s.gpu.nvidia.com/device=MIG-" + testUUID(2, 15)}, mig(1, 5, "1g.10gb"), true},
		{"gpu-7", []string{"x/y=GPU-" + g(2)}, whole(2), true}, // the UUID wins over the name
	}
	for _, tt := range tests {
		t.Run(tt.dev, func(t *testing.T) {
			r, err := ParseDRADevice(tt.dev, tt.cdi)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := inv.Resolve(r)
			if ok != tt.ok || got != tt.want {
				t.Fatalf("Resolve(%s) = %+v, %v; want %+v, %v", tt.dev, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestResolveNilAndInvalid(t *testing.T) {
	var inv *Inventory
	r, _ := ParseDeviceID("nvidia0")
	if _, ok := inv.Resolve(r); ok {
		t.Error("nil inventory resolved")
	}
	bad, _ := ParseDeviceID("garbage")
	if _, ok := testInventory().Resolve(bad); ok {
		t.Error("invalid ref resolved")
	}
	// A DRADevice ref whose Raw is not a DRA name.
	if _, ok := testInventory().Resolve(DeviceRef{Kind: DRADevice, Raw: "x", Minor: 0}); ok {
		t.Error("bogus DRA ref resolved")
	}
}

func TestNormaliseMIGProfile(t *testing.T) {
	for in, want := range map[string]string{
		"1g.10gb": "1g10gb", "1g.10gb+me": "1g10gb-me", "4G.95GB": "4g95gb", "1g.24gb+gfx": "1g24gb-gfx", "": "", "..": "",
	} {
		t.Run(fmt.Sprintf("%q", in), func(t *testing.T) {
			if got := normaliseMIGProfile(in); got != want {
				t.Errorf("normaliseMIGProfile(%q) = %q, want %q", in, got, want)
			}
		})
	}
}

func TestMatch(t *testing.T) {
	inv := testInventory()
	mk := func(res, id string) Holding {
		r, err := ParseDeviceID(id)
		return Holding{Namespace: "ns", Pod: "p", Container: "c", Resource: res, DeviceID: id, Ref: r, ParseErr: err}
	}
	s := &Snapshot{Up: true, Holdings: []Holding{
		mk(ResourceGPU, inv.GPUs[0].UUID),
		mk(ResourceGPU, "nvidia0/gi2"),
		mk(ResourceGPU, "nvidia9"),       // not on this node
		mk(ResourceGPU, "bogus"),         // does not parse
		mk(ResourceGPUShared, "nvidia1"), // matched
	}}
	matched, unmatched := Match(s, inv)
	if len(matched) != 3 || len(unmatched) != 2 {
		t.Fatalf("matched %d, unmatched %d; want 3, 2", len(matched), len(unmatched))
	}
	if matched[0].Target.GPU != 0 || matched[1].Target.GPUInstance != 2 || matched[2].Target.GPU != 2 {
		t.Errorf("wrong targets: %+v", matched)
	}
	if matched[1].DeviceID != "nvidia0/gi2" {
		t.Errorf("holding not carried: %+v", matched[1].Holding)
	}
	if unmatched[0].DeviceID != "nvidia9" || unmatched[1].DeviceID != "bogus" || unmatched[1].ParseErr == nil {
		t.Errorf("unmatched = %+v", unmatched)
	}
	if m, u := Match(nil, inv); m != nil || u != nil {
		t.Error("nil snapshot matched something")
	}
	if m, u := Match(s, nil); len(m) != 0 || len(u) != len(s.Holdings) {
		t.Errorf("nil inventory: matched %d, unmatched %d", len(m), len(u))
	}
}

func TestUnmatchedLogger(t *testing.T) {
	var buf bytes.Buffer
	u := NewUnmatchedLogger(zerolog.New(&buf), 3)
	now := time.Unix(1e9, 0)
	u.Now = func() time.Time { return now }
	h := func(id string) Holding {
		r, err := ParseDeviceID(id)
		return Holding{Namespace: "ns", Pod: "p", Container: "c", Resource: ResourceGPU, DeviceID: id, Ref: r, ParseErr: err}
	}
	if n := u.Log(nil); n != 0 {
		t.Fatalf("nothing unmatched logged %d lines", n)
	}
	if n := u.Log([]Holding{h("nvidia9"), h("bogus"), h("nvidia9")}); n != 1 {
		t.Fatalf("first Log logged %d, want 1", n)
	}
	now = now.Add(time.Hour)
	if n := u.Log([]Holding{h("nvidia9"), h("bogus"), h("nvidia9")}); n != 0 {
		t.Fatalf("the same set logged %d, want 0", n)
	}
	out := buf.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, `"unmatched":3`) || !strings.Contains(out, `"not_understood":1`) ||
		!strings.Contains(out, `bogus\" held by ns/p/c: not understood`) || !strings.Contains(out, `nvidia9\" held by ns/p/c: names no`) {
		t.Fatalf("log output:\n%s", out)
	}
	// A change long after the last summary is logged at once; another
	// within the gap waits for it, then one line says what is new.
	now = now.Add(time.Second)
	if n := u.Log([]Holding{h("nvidia9"), h("bogus")}); n != 1 {
		t.Fatalf("a change an hour after the last summary logged %d, want 1", n)
	}
	buf.Reset()
	now = now.Add(time.Second)
	if n := u.Log([]Holding{h("nvidia9"), h("nvidia8")}); n != 0 {
		t.Fatalf("a change right after a summary logged %d, want 0 (not before the gap)", n)
	}
	now = now.Add(DefaultUnmatchedGap)
	if n := u.Log([]Holding{h("nvidia9"), h("nvidia8")}); n != 1 {
		t.Fatalf("a pending change after the gap logged %d, want 1", n)
	}
	if out := buf.String(); !strings.Contains(out, `"new":1`) || !strings.Contains(out, `"gone":1`) || !strings.Contains(out, `"examples":["nvidia.com/gpu \"nvidia8\"`) {
		t.Errorf("change summary: %s", out)
	}
	dra := Holding{Resource: DRADriverNVIDIA, DeviceID: "gpu-9", Dynamic: &DynamicRef{ClaimName: "cl", ClaimNamespace: "ns"}}
	buf.Reset()
	now = now.Add(time.Hour)
	u.Log([]Holding{dra})
	if !strings.Contains(buf.String(), `claim ns/cl`) {
		t.Errorf("DRA log lacks claim: %s", buf.String())
	}
	buf.Reset()
	now = now.Add(time.Hour)
	if n := u.Log(nil); n != 1 || !strings.Contains(buf.String(), "matches a GPU or MIG instance again") {
		t.Errorf("back to none: %d lines: %s", n, buf.String())
	}
	if NewUnmatchedLogger(zerolog.Nop(), 0).limit != DefaultUnmatchedLimit {
		t.Error("default limit not applied")
	}
}

// With 1,001 and with 50,000 unknown IDs, some of them changing on every
// sample for ten minutes of 5s samples, the log stays a handful of bounded
// lines: one summary per change and gap, never one line per ID per sample.
func TestUnmatchedLoggerBoundedUnderFlood(t *testing.T) {
	for _, n := range []int{1001, 50000} {
		var buf bytes.Buffer
		u := NewUnmatchedLogger(zerolog.New(&buf), 0)
		now := time.Unix(1e9, 0)
		u.Now = func() time.Time { return now }
		hs := make([]Holding, n)
		for i := range hs {
			id := fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i)
			r, err := ParseDeviceID(id)
			hs[i] = Holding{Namespace: "ns", Pod: fmt.Sprintf("p%d", i), Container: "c", Resource: ResourceGPU, DeviceID: id, Ref: r, ParseErr: err}
		}
		const samples = 120 // 10 minutes at 5s
		for s := 0; s < samples; s++ {
			if s >= samples/2 { // churn: one ID changes every sample
				hs[s%n].DeviceID = fmt.Sprintf("GPU-%08d-ffff-0000-0000-000000000000", s)
			}
			u.Log(hs)
			now = now.Add(5 * time.Second)
		}
		lines := strings.Count(buf.String(), "\n")
		// One for the first sample, then at most one per minute of churn.
		if lines < 2 || lines > 1+6 {
			t.Errorf("%d unknown IDs over %d samples: %d log lines, want 2 to 7", n, samples, lines)
		}
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if len(l) > 4096 {
				t.Errorf("%d unknown IDs: a %d-byte log line", n, len(l))
			}
		}
	}
}

// benchInventory: 8 GPUs with 7 MIG instances each.
func benchInventory() *Inventory {
	inv := &Inventory{}
	for i := 0; i < 8; i++ {
		g := InventoryGPU{Index: i, UUID: "GPU-" + testUUID(1, i), Minor: 7 - i}
		for m := 0; m < 7; m++ {
			g.MIG = append(g.MIG, InventoryMIG{
				UUID: "MIG-" + testUUID(2, i*10+m), GPUInstance: 7 + m, ComputeInstance: 0, Profile: "1g.10gb",
			})
		}
		inv.GPUs = append(inv.GPUs, g)
	}
	return inv
}

func BenchmarkMatch(b *testing.B) {
	inv := benchInventory()
	s := &Snapshot{Up: true}
	// 200 pods: each holds one MIG instance, in the three forms a node can
	// report (MIG UUID, GKE minor/gi, legacy), a few hold whole GPUs, and
	// some hold IDs not on the node.
	for p := 0; p < 200; p++ {
		gpu, m := (p/7)%8, p%7
		var id string
		switch p % 4 {
		case 0:
			id = inv.GPUs[gpu].MIG[m].UUID
		case 1:
			id = fmt.Sprintf("nvidia%d/gi%d", inv.GPUs[gpu].Minor, inv.GPUs[gpu].MIG[m].GPUInstance)
		case 2:
			id = fmt.Sprintf("MIG-%s/%d/0", inv.GPUs[gpu].UUID, inv.GPUs[gpu].MIG[m].GPUInstance)
		case 3:
			if p%8 == 3 {
				id = "nvidia99"
			} else {
				id = inv.GPUs[gpu].UUID + "::" + fmt.Sprint(m)
			}
		}
		r, err := ParseDeviceID(id)
		if err != nil {
			b.Fatal(err)
		}
		s.Holdings = append(s.Holdings, Holding{Namespace: "ns", Pod: fmt.Sprint("pod-", p), Container: "c",
			Resource: ResourceGPU, DeviceID: id, Ref: r})
	}
	matched, unmatched := Match(s, inv)
	if len(matched) != 175 || len(unmatched) != 25 {
		b.Fatalf("matched %d unmatched %d", len(matched), len(unmatched))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		Match(s, inv)
	}
}

// Match uses an index for UUID refs; it must agree with Resolve.
func TestMatchAgreesWithResolve(t *testing.T) {
	inv := testInventory()
	inv.GPUs = append(inv.GPUs, benchInventory().GPUs...)
	var ids []string
	for _, g := range inv.GPUs {
		ids = append(ids, g.UUID, strings.ToUpper(g.UUID), g.UUID+"::1")
		if g.Minor >= 0 {
			ids = append(ids, fmt.Sprintf("nvidia%d", g.Minor))
		}
		for _, m := range g.MIG {
			ids = append(ids, m.UUID, strings.ToUpper(m.UUID), fmt.Sprintf("MIG-%s/%d/%d", g.UUID, m.GPUInstance, m.ComputeInstance))
			if g.Minor >= 0 {
				ids = append(ids, fmt.Sprintf("nvidia%d/gi%d", g.Minor, m.GPUInstance))
			}
		}
	}
	ids = append(ids, "GPU-"+testUUID(9, 9), "MIG-"+testUUID(9, 9), "nvidia77")
	s := &Snapshot{}
	for _, id := range ids {
		r, err := ParseDeviceID(id)
		if err != nil {
			t.Fatal(err)
		}
		s.Holdings = append(s.Holdings, Holding{DeviceID: id, Ref: r})
	}
	matched, unmatched := Match(s, inv)
	if len(unmatched) < 3 {
		t.Errorf("only %d unmatched", len(unmatched))
	}
	for _, a := range matched {
		want, ok := inv.Resolve(a.Ref)
		if !ok || want != a.Target {
			t.Errorf("%s: Match gave %+v, Resolve %+v %v", a.DeviceID, a.Target, want, ok)
		}
	}
	for _, h := range unmatched {
		if got, ok := inv.Resolve(h.Ref); ok {
			t.Errorf("%s: unmatched by Match, Resolve gave %+v", h.DeviceID, got)
		}
	}
}

// NVIDIA's DRA driver names MIG devices
// gpu-<minor>-mig-<profile>-<profileID>-<placementStart>. With placements
// known, a 7 x 1g layout resolves instance by instance, and +me and -me
// profiles (the same once dots and signs are dropped) stay apart.
func TestResolveDRAByPlacement(t *testing.T) {
	g0 := "GPU-" + testUUID(1, 0)
	var migs []InventoryMIG
	for i := 0; i < 6; i++ {
		migs = append(migs, InventoryMIG{UUID: "MIG-" + testUUID(3, i), GPUInstance: 7 + i, Profile: "1g.10gb", HasPlacement: true, ProfileID: 19, PlacementStart: i})
	}
	migs = append(migs,
		InventoryMIG{UUID: "MIG-" + testUUID(3, 6), GPUInstance: 13, Profile: "1g.10gb+me", HasPlacement: true, ProfileID: 20, PlacementStart: 6},
		InventoryMIG{UUID: "MIG-" + testUUID(3, 7), GPUInstance: 14, Profile: "1g.10gb-me", HasPlacement: true, ProfileID: 47, PlacementStart: 7})
	inv := &Inventory{GPUs: []InventoryGPU{{Index: 0, UUID: g0, Minor: 0, MIG: migs}}}
	for _, tc := range []struct {
		name string
		gi   int
		ok   bool
	}{
		{"gpu-0-mig-1g10gb-19-0", 7, true},
		{"gpu-0-mig-1g10gb-19-3", 10, true},
		{"gpu-0-mig-1g10gb-19-5", 12, true},
		{"gpu-0-mig-1g10gb-19-6", 0, false}, // no 1g.10gb there
		{"gpu-0-mig-1g10gb-me-20-6", 13, true},
		{"gpu-0-mig-1g10gb-me-47-7", 14, true},
		{"gpu-0-mig-1g10gb-me-20-7", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref, err := ParseDRADevice(tc.name, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := inv.Resolve(ref)
			if ok != tc.ok || (ok && got.GPUInstance != tc.gi) {
				t.Errorf("%s: GPU instance %d, %v; want %d, %v", tc.name, got.GPUInstance, ok, tc.gi, tc.ok)
			}
		})
	}
}
