package fragmentation

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestDefaultShapesFlag(t *testing.T) {
	got, err := ParseShapes(DefaultShapesFlag)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, DefaultShapes) {
		t.Errorf("ParseShapes(DefaultShapesFlag) = %+v, want DefaultShapes %+v", got, DefaultShapes)
	}
	if f := FormatShapes(DefaultShapes); f != DefaultShapesFlag {
		t.Errorf("FormatShapes(DefaultShapes) = %q, want %q", f, DefaultShapesFlag)
	}
	// The default weights sum to 1 (0.5+0.2+0.15+0.1+0.05), so F_n(M) is a
	// plain weighted sum.
	var sum float64
	for _, s := range DefaultShapes {
		sum += s.Weight
	}
	if math.Abs(sum-1) > 1e-12 {
		t.Errorf("default weights sum to %v, want 1", sum)
	}
}

func TestParseShapes(t *testing.T) {
	tests := []struct {
		in   string
		want []Shape
	}{
		{"1:1", []Shape{{Name: "1", GPUs: 1, Weight: 1}}},
		// Spaces are ignored; "02" is canonicalised to "2"; weights need
		// not sum to 1; zero weights are allowed next to a positive one.
		{" 02 : 3 , mig-1g.5gb+me:0 ", []Shape{
			{Name: "2", GPUs: 2, Weight: 3},
			{Name: "mig-1g.5gb+me", MIGProfile: "1g.5gb+me", Weight: 0},
		}},
		{"8:1e-1,mig-7g.80gb:.5", []Shape{
			{Name: "8", GPUs: 8, Weight: 0.1},
			{Name: "mig-7g.80gb", MIGProfile: "7g.80gb", Weight: 0.5},
		}},
		{"1024:1", []Shape{{Name: "1024", GPUs: 1024, Weight: 1}}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			got, err := ParseShapes(tc.in)
			if err != nil {
				t.Errorf("ParseShapes(%q): %v", tc.in, err)
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseShapes(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseShapesErrors(t *testing.T) {
	tests := []struct {
		in       string
		contains []string // every error must also show the expected form
	}{
		{"", []string{"no task shapes"}},
		{"   ", []string{"no task shapes"}},
		{"1", []string{`shape entry 1 ("1")`, `missing ":WEIGHT"`}},
		{"1:0.5,", []string{"shape entry 2", "empty entry"}},
		{"1:0.5,,2:1", []string{"shape entry 2", "empty entry"}},
		{":1", []string{"missing shape"}},
		{"1:", []string{`weight "" is not a finite number`}},
		{"1:abc", []string{`weight "abc"`}},
		{"1:NaN", []string{`weight "NaN" is not a finite number`}},
		{"1:+Inf", []string{"not a finite number"}},
		{"1:-0.5", []string{"weight -0.5 is negative"}},
		{"0:1", []string{`GPU count "0" is out of range`}},
		{"1025:1", []string{`GPU count "1025" is out of range; want 1 to 1024`}},
		{"99999999999999999999:1", []string{"out of range"}},
		{"-1:1", []string{`shape "-1" is neither a GPU count`}},
		{"+1:1", []string{`shape "+1" is neither`}},
		{"gpu:1", []string{`shape "gpu" is neither a GPU count nor "mig-"`}},
		{"MIG-1g.10gb:1", []string{"is neither"}},
		{"mig-:1", []string{`MIG shape "mig-" has no profile`}},
		{"mig-1g 10gb:1", []string{`contains ' '`}},
		{"mig-1g/10gb:1", []string{`contains '/'`}},
		{"1:1,01:2", []string{`shape entry 2 ("01:2"): shape "1" already given in entry 1`}},
		{"mig-1g.10gb:1,mig-1g.10gb:1", []string{"already given"}},
		{"1:0,2:0", []string{"weights sum to 0"}},
		{"1:1e308,2:1e308", []string{"weights sum to +Inf"}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			_, err := ParseShapes(tc.in)
			if err == nil {
				t.Errorf("ParseShapes(%q): no error", tc.in)
				return
			}
			msg := err.Error()
			for _, c := range tc.contains {
				if !strings.Contains(msg, c) {
					t.Errorf("ParseShapes(%q) error %q does not contain %q", tc.in, msg, c)
				}
			}
			if !strings.Contains(msg, "want") {
				t.Errorf("ParseShapes(%q) error %q does not say what is wanted", tc.in, msg)
			}
		})
	}
}

func FuzzParseShapes(f *testing.F) {
	for _, s := range []string{DefaultShapesFlag, "1:1", "", ",", "1:", ":", "mig-:1", "2:0,3:1e308", "mig-1g.5gb+me:0.1", "1:0x1p-2", "٣:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		shapes, err := ParseShapes(s)
		if err != nil {
			if shapes != nil {
				t.Fatalf("ParseShapes(%q) returned shapes with error %v", s, err)
			}
			return
		}
		var sum float64
		names := map[string]bool{}
		for _, sh := range shapes {
			if names[sh.Name] {
				t.Fatalf("ParseShapes(%q): duplicate name %q", s, sh.Name)
			}
			names[sh.Name] = true
			if !(sh.Weight >= 0) || math.IsInf(sh.Weight, 0) {
				t.Fatalf("ParseShapes(%q): bad weight %v", s, sh.Weight)
			}
			if (sh.GPUs > 0) == (sh.MIGProfile != "") || sh.GPUs < 0 || sh.GPUs > maxShapeGPUs {
				t.Fatalf("ParseShapes(%q): shape %+v is neither whole nor MIG", s, sh)
			}
			sum += sh.Weight
		}
		if !(sum > 0) {
			t.Fatalf("ParseShapes(%q): weights sum to %v", s, sum)
		}
		// Round trip: the formatted form parses to the same shapes.
		again, err := ParseShapes(FormatShapes(shapes))
		if err != nil || !reflect.DeepEqual(again, shapes) {
			t.Fatalf("round trip of %q via %q: %+v, %v; want %+v", s, FormatShapes(shapes), again, err, shapes)
		}
		// And Compute never panics on them.
		Compute(benchMIGNode(), shapes)
	})
}
