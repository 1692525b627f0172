package xid

import (
	"fmt"
	"regexp"
	"slices"
	"testing"
)

func TestLookupCategoryAndAction(t *testing.T) {
	cases := []struct {
		code             int
		category, action string
	}{
		{79, CategoryHardware, ActionRebootNode},
		{13, CategoryApplication, ActionRestartApp},
		{31, CategoryApplication, ActionRestartApp},
		{43, CategoryApplication, ActionRestartApp}, // DESIGN.md overrides the catalog's IGNORE
		{45, CategoryApplication, ActionRestartApp}, // DESIGN.md overrides the catalog's workflow
		{69, CategoryApplication, ActionRestartApp},
		{48, CategoryMemory, ActionResetGPU},
		{63, CategoryMemory, ActionNone},
		{64, CategoryMemory, ActionResetGPU},
		{92, CategoryMemory, ActionNone},
		{94, CategoryMemory, ActionRestartApp},
		{95, CategoryMemory, ActionResetGPU},
		{140, CategoryMemory, ActionResetGPU},
		{143, CategoryHardware, ActionResetGPU},
		{46, CategoryFirmware, ActionResetGPU},
		{62, CategoryFirmware, ActionResetGPU},
		{109, CategoryFirmware, ActionResetGPU},
		{119, CategoryFirmware, ActionResetGPU},
		{120, CategoryFirmware, ActionResetGPU},
		{74, CategoryNVLink, ActionCheckNVLink},
		{154, CategoryRecovery, ActionCheckRecoveryAction},
	}
	for code := 144; code <= 150; code++ {
		cases = append(cases, struct {
			code             int
			category, action string
		}{code, CategoryNVLink, ActionCheckNVLink})
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("xid%d", c.code), func(t *testing.T) {
			e := Lookup(c.code)
			if e.Code != c.code || e.Category != c.category || e.Action != c.action {
				t.Errorf("Lookup(%d) = %+v, want category %q action %q", c.code, e, c.category, c.action)
			}
			if e.Name == "" || e.Name == Lookup(-1).Name {
				t.Errorf("Lookup(%d) has no description: %+v", c.code, e)
			}
		})
	}
}

func TestLookupUnknown(t *testing.T) {
	for _, code := range []int{0, -1, 999, 1, 100000, 1 << 40} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			e := Lookup(code)
			if e.Code != code || e.Category != CategoryUnknown || e.Action != ActionCheckLogs || e.Name == "" {
				t.Errorf("Lookup(%d) = %+v, want an unknown entry", code, e)
			}
		})
	}
}

func TestCatalogCoversRequiredCodes(t *testing.T) {
	required := []int{8, 13, 31, 32, 38, 43, 45, 46, 48, 61, 62, 63, 64, 68, 69, 74, 79,
		92, 94, 95, 109, 110, 119, 120, 121, 140, 143, 144, 145, 146, 147, 148, 149, 150, 154}
	for _, code := range required {
		if Lookup(code).Category == CategoryUnknown {
			t.Errorf("Xid %d is not in the catalog", code)
		}
	}
}

func TestKnownIsSortedValidAndACopy(t *testing.T) {
	known := Known()
	if len(known) < 40 {
		t.Fatalf("Known() has %d entries", len(known))
	}
	label := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	cats, acts := Categories(), Actions()
	for i, e := range known {
		if i > 0 && known[i-1].Code >= e.Code {
			t.Errorf("Known() not sorted at %d: %d then %d", i, known[i-1].Code, e.Code)
		}
		if e.Category == CategoryUnknown || !slices.Contains(cats, e.Category) {
			t.Errorf("Xid %d: category %q", e.Code, e.Category)
		}
		if e.Action == ActionCheckLogs || !slices.Contains(acts, e.Action) {
			t.Errorf("Xid %d: action %q", e.Code, e.Action)
		}
		if !label.MatchString(e.Category) || !label.MatchString(e.Action) {
			t.Errorf("Xid %d: not label-friendly: %+v", e.Code, e)
		}
		if Lookup(e.Code) != e {
			t.Errorf("Lookup(%d) = %+v, Known has %+v", e.Code, Lookup(e.Code), e)
		}
	}
	known[0].Action = "tampered"
	if Lookup(known[0].Code).Action == "tampered" {
		t.Error("Known() returned the catalog itself, not a copy")
	}
	for _, a := range acts {
		if !label.MatchString(a) {
			t.Errorf("action %q is not label-friendly", a)
		}
	}
}
