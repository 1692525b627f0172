package fragmentation

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestLoadPriceListExample(t *testing.T) {
	p, err := LoadPriceList("../../deploy/prices-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Date == "" || !strings.HasPrefix(p.Source, "https://") {
		t.Errorf("date %q, source %q: want both set", p.Date, p.Source)
	}
	// The NVML names of the GPUs on GKE's A2, A2 Ultra, A3 High and A3 Ultra
	// machines must be priced, by exact name.
	for _, model := range []string{"NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"} {
		if v, ok := p.PerGPUHour[model]; !ok || !(v > 0) {
			t.Errorf("example prices %q at %v (present %v)", model, v, ok)
		}
	}
}

func TestLoadPriceListMissingFile(t *testing.T) {
	_, err := LoadPriceList(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("error %v, want one naming the file", err)
	}
}

func TestParsePriceList(t *testing.T) {
	in := `# comment
date: 2025-03-06
source: "https://example.com/prices"
per_gpu_hour:
  NVIDIA H100 80GB HBM3: 11.06
  "NVIDIA A100-SXM4-80GB": 5
  free-gpu: 0
  tiny: 1e-3
`
	p, err := ParsePriceList("p.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := &PriceList{Date: "2025-03-06", Source: "https://example.com/prices", PerGPUHour: map[string]float64{
		"NVIDIA H100 80GB HBM3": 11.06, "NVIDIA A100-SXM4-80GB": 5, "free-gpu": 0, "tiny": 0.001,
	}}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got %+v, want %+v", p, want)
	}
	// date and source are optional; null is empty.
	p, err = ParsePriceList("p.yaml", []byte("date: ~\nper_gpu_hour: {a: 1}\n"))
	if err != nil || p.Date != "" || p.Source != "" || p.PerGPUHour["a"] != 1 {
		t.Errorf("got %+v, %v", p, err)
	}
}

func TestParsePriceListErrors(t *testing.T) {
	tests := []struct {
		name, in string
		contains []string
	}{
		{"empty", "", []string{"p.yaml: empty price list"}},
		{"comment only", "# nothing\n", []string{"p.yaml", "want a YAML mapping"}},
		{"syntax", "per_gpu_hour:\n  a: 1\n b: [\n", []string{"p.yaml: yaml:", "line"}},
		{"top-level sequence", "- a\n", []string{"p.yaml:1: top level is a sequence"}},
		{"unknown field", "per_gpu_hour: {a: 1}\nregion: us\n", []string{`p.yaml:2: unknown field "region"`, "want a YAML mapping with keys date, source and per_gpu_hour"}},
		{"misspelt field", "per_gpu_hours: {a: 1}\n", []string{`p.yaml:1: unknown field "per_gpu_hours"`}},
		{"missing prices", "date: x\n", []string{"p.yaml:1: missing field per_gpu_hour"}},
		{"empty prices", "per_gpu_hour: {}\n", []string{"p.yaml:1: field per_gpu_hour is a mapping; want a non-empty mapping"}},
		{"null prices", "per_gpu_hour:\n", []string{"p.yaml:1: field per_gpu_hour is empty (null)"}},
		{"prices sequence", "per_gpu_hour:\n  - 1\n", []string{"p.yaml:2: field per_gpu_hour is a sequence"}},
		{"negative", "per_gpu_hour:\n  a: 1\n  NVIDIA H100: -3.5\n", []string{`p.yaml:3: per_gpu_hour["NVIDIA H100"]: price -3.5 is negative`}},
		{"NaN", "per_gpu_hour:\n  a: .nan\n", []string{`p.yaml:2: per_gpu_hour["a"]: price .nan is not finite`}},
		{"Inf", "per_gpu_hour:\n  a: .inf\n", []string{`p.yaml:2: per_gpu_hour["a"]: price .inf is not finite`}},
		{"quoted", "per_gpu_hour:\n  a: \"3.93\"\n", []string{`p.yaml:2: per_gpu_hour["a"]: price "3.93" is a string`}},
		{"dollar", "per_gpu_hour:\n  a: $3.93\n", []string{`price "$3.93" is a string`}},
		{"bool", "per_gpu_hour:\n  a: true\n", []string{"is a boolean"}},
		{"null price", "per_gpu_hour:\n  a:\n", []string{`per_gpu_hour["a"]: price "" is empty (null)`}},
		{"nested price", "per_gpu_hour:\n  a: {usd: 1}\n", []string{`p.yaml:2: per_gpu_hour["a"]: price is a mapping`}},
		{"duplicate model", "per_gpu_hour:\n  a: 1\n  b: 2\n  a: 3\n", []string{`p.yaml:4: per_gpu_hour["a"]: model already priced on line 2`}},
		{"duplicate model case", "per_gpu_hour:\n  NVIDIA H200: 1\n  nvidia h200: 3\n", []string{`p.yaml:3: per_gpu_hour["nvidia h200"]: model already priced on line 2`}},
		{"empty model", "per_gpu_hour:\n  \"\": 1\n", []string{"p.yaml:2: per_gpu_hour: model name is a string"}},
		{"duplicate field", "date: a\ndate: b\nper_gpu_hour: {a: 1}\n", []string{"p.yaml:2: field date already given on line 1"}},
		{"date mapping", "date: {y: 1}\nper_gpu_hour: {a: 1}\n", []string{"p.yaml:1: field date is a mapping; want a string"}},
		{"two documents", "per_gpu_hour: {a: 1}\n---\nper_gpu_hour: {b: 1}\n", []string{"p.yaml:2: a second YAML document"}},
		{"alias price", "per_gpu_hour:\n  a: &x 1\n  b: *x\n", []string{`per_gpu_hour["b"]: price is an alias`}},
		{"merge key", "base: &b {a: 1}\nper_gpu_hour: {a: 1}\n", []string{`unknown field "base"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := ParsePriceList("p.yaml", []byte(tc.in))
			if err == nil {
				t.Fatalf("no error; got %+v", p)
			}
			for _, c := range tc.contains {
				if !strings.Contains(err.Error(), c) {
					t.Errorf("error %q does not contain %q", err, c)
				}
			}
		})
	}
}

func TestParsePriceFlag(t *testing.T) {
	got, err := ParsePriceFlag("NVIDIA H100 80GB HBM3=3.93, NVIDIA A100-SXM4-80GB = 1.60 ,free=0")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"NVIDIA H100 80GB HBM3": 3.93, "NVIDIA A100-SXM4-80GB": 1.6, "free": 0}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, blank := range []string{"", "  "} {
		if m, err := ParsePriceFlag(blank); err != nil || m == nil || len(m) != 0 {
			t.Errorf("ParsePriceFlag(%q) = %v, %v; want an empty map", blank, m, err)
		}
	}
}

func TestParsePriceFlagErrors(t *testing.T) {
	tests := []struct{ in, contains string }{
		{"H100", `price entry 1 ("H100"): missing "=PRICE"`},
		{"a=1,", "price entry 2 is empty (stray comma?)"},
		{"=1", `price entry 1 ("=1"): missing model name`},
		{"a=", `price "" is not a finite number`},
		{"a=cheap", `price "cheap" is not a finite number`},
		{"a=NaN", `price "NaN" is not a finite number`},
		{"a=inf", `price "inf" is not a finite number`},
		{"a=-1", "price -1 is negative"},
		{"a=1,A=2", `price entry 2 ("A=2"): model "a" already priced`},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			_, err := ParsePriceFlag(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.contains) || !strings.Contains(err.Error(), "; want ") {
				t.Errorf("ParsePriceFlag(%q) error = %v, want it to contain %q and what is wanted", tc.in, err, tc.contains)
			}
		})
	}
}

func TestLookup(t *testing.T) {
	p := &PriceList{PerGPUHour: map[string]float64{
		"NVIDIA H100 80GB HBM3": 11.06,
		"nvidia a100-sxm4-40gb": 3.67,
		"A100 80GB":             5.07,
		"A100":                  1,
		"H200":                  10.44,
		"H200 NVL":              9,
		"L4":                    0.7,
		"---":                   99, // no tokens: never matches by tokens
	}}
	tests := []struct {
		model string
		want  float64
		ok    bool
	}{
		{"NVIDIA H100 80GB HBM3", 11.06, true}, // exact
		{"NVIDIA A100-SXM4-40GB", 3.67, true},  // case-insensitive
		{"NVIDIA A100-SXM4-80GB", 5.07, true},  // tokens {a100, 80gb} beat {a100}
		{"NVIDIA A100 80GB PCIe", 5.07, true},  // same tokens
		{"NVIDIA A100-PCIE-40GB", 1, true},     // only "A100" matches
		{"NVIDIA H200", 10.44, true},           // {h200}
		{"NVIDIA H200 NVL", 9, true},           // {h200, nvl} is more specific
		{"NVIDIA L40S", 0, false},              // "L4" is not the token "L40S"
		{"NVIDIA H100 PCIe", 0, false},         // "NVIDIA H100 80GB HBM3" needs 80gb and hbm3
		{"", 0, false},
		{"---", 99, true}, // exact match still works
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.model), func(t *testing.T) {
			got, ok := p.Lookup(tc.model)
			if got != tc.want || ok != tc.ok {
				t.Errorf("Lookup(%q) = %v, %v; want %v, %v", tc.model, got, ok, tc.want, tc.ok)
			}
		})
	}
	// Ties between equally specific keys go to the smaller key, whatever
	// the map order: "A100 40GB" < "A100 SXM4".
	tie := &PriceList{PerGPUHour: map[string]float64{"A100 SXM4": 2, "A100 40GB": 1}}
	for i := 0; i < 20; i++ {
		if v, _ := tie.Lookup("NVIDIA A100-SXM4-40GB"); v != 1 {
			t.Fatalf("tie broken to %v, want 1", v)
		}
	}
	ci := &PriceList{PerGPUHour: map[string]float64{"NVIDIA h200": 2, "nvidia H200": 1}}
	for i := 0; i < 20; i++ {
		if v, _ := ci.Lookup("NVIDIA H200"); v != 2 { // "NVIDIA h200" < "nvidia H200"
			t.Fatalf("case-insensitive tie broken to %v, want 2", v)
		}
	}
	var nilList *PriceList
	if v, ok := nilList.Lookup("NVIDIA H200"); v != 0 || ok {
		t.Errorf("nil list: %v, %v", v, ok)
	}
}

func TestLookupAllocations(t *testing.T) {
	p := &PriceList{PerGPUHour: map[string]float64{"H100 80GB": 1, "A100": 2, "L4": 3}}
	if n := testing.AllocsPerRun(100, func() { p.Lookup("NVIDIA H100 80GB HBM3") }); n != 0 {
		t.Errorf("Lookup allocates %v times per call, want 0", n)
	}
}

func TestNextToken(t *testing.T) {
	var toks []string
	for rest := " NVIDIA A100-SXM4-80GB (rev ä1) "; ; {
		var tok string
		tok, rest = nextToken(rest)
		if tok == "" {
			break
		}
		toks = append(toks, tok)
	}
	want := []string{"NVIDIA", "A100", "SXM4", "80GB", "rev", "ä1"}
	if !reflect.DeepEqual(toks, want) {
		t.Errorf("tokens %q, want %q", toks, want)
	}
}

func TestSliceShare(t *testing.T) {
	tests := []struct {
		price         float64
		slices, total int
		want          float64
	}{
		{7, 1, 7, 1},   // 1g of a $7 GPU: 1/7
		{7, 3, 7, 3},   // 3g: 3/7
		{14, 7, 7, 14}, // 7g: all of it
		{7, 0, 7, 0},
		{7, 8, 7, 0},
		{7, 1, 0, 0},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%v/%d-of-%d", tc.price, tc.slices, tc.total), func(t *testing.T) {
			if got := SliceShare(tc.price, tc.slices, tc.total); math.Abs(got-tc.want) > 1e-12 {
				t.Errorf("SliceShare(%v, %d, %d) = %v, want %v", tc.price, tc.slices, tc.total, got, tc.want)
			}
		})
	}
}

func FuzzParsePriceList(f *testing.F) {
	seed, err := os.ReadFile("../../deploy/prices-example.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	for _, s := range []string{"", "per_gpu_hour: {a: 1}", "per_gpu_hour: {a: -1}", "a: &x [*x]", "per_gpu_hour: {a: .nan}",
		"---\n---\n", "per_gpu_hour:\n  ? [a]\n  : 1\n", "date: !!binary aGk=\nper_gpu_hour: {a: 0x10}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePriceList("fuzz.yaml", data)
		if err != nil {
			if p != nil {
				t.Fatalf("list with error %v", err)
			}
			if !strings.HasPrefix(err.Error(), "fuzz.yaml") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(p.PerGPUHour) == 0 {
			t.Fatal("accepted an empty price list")
		}
		for m, v := range p.PerGPUHour {
			if strings.TrimSpace(m) == "" || !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("accepted %q: %v", m, v)
			}
			if got, ok := p.Lookup(m); !ok || got != v {
				t.Fatalf("Lookup(%q) = %v, %v; want %v", m, got, ok, v)
			}
		}
	})
}

func FuzzParsePriceFlag(f *testing.F) {
	for _, s := range []string{"NVIDIA H100 80GB HBM3=3.93,NVIDIA A100-SXM4-80GB=1.60", "", ",", "a=", "=1", "a=1=2", "a=0x1p4", "a=1e400", "a=1,A=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParsePriceFlag(s)
		if err != nil {
			return
		}
		p := &PriceList{PerGPUHour: m}
		for k, v := range m {
			if k == "" || k != strings.TrimSpace(k) || strings.Contains(k, ",") || !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("ParsePriceFlag(%q) accepted %q=%v", s, k, v)
			}
			if got, ok := p.Lookup(k); !ok || got != v {
				t.Fatalf("Lookup(%q) = %v, %v; want %v", k, got, ok, v)
			}
		}
	})
}

func TestLoadPriceListRefusesHugeFiles(t *testing.T) {
	f := filepath.Join(t.TempDir(), "prices.yaml")
	big := []byte("per_gpu_hour:\n")
	for i := 0; len(big) <= MaxPriceFileBytes; i++ {
		big = fmt.Appendf(big, "  model-%d: 1.5\n", i)
	}
	if err := os.WriteFile(f, big, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadPriceList(f)
	if err == nil || !strings.Contains(err.Error(), "the limit is 262144 bytes (256 KiB)") {
		t.Fatalf("a %d-byte price list: %v", len(big), err)
	}
	// The same list cut below the limit loads.
	small := big[:bytes.LastIndexByte(big[:MaxPriceFileBytes], '\n')+1]
	if err := os.WriteFile(f, small, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadPriceList(f); err != nil {
		t.Fatalf("a %d-byte price list: %v", len(small), err)
	}
}
