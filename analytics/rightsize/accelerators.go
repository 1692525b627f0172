package rightsize

import (
	_ "embed"
	"fmt"
	"strings"
	"sync"

	"go.yaml.in/yaml/v3"
)

//go:embed accelerators.yaml
var acceleratorsYAML []byte

// AcceleratorFacts is one row of accelerators.yaml.
type AcceleratorFacts struct {
	GKE      []string `yaml:"gke"`
	NVML     []string `yaml:"nvml"`
	MemoryGB float64  `yaml:"memoryGB"`
	TFLOPS   float64  `yaml:"tflops"`
	Source   string   `yaml:"source"`
}

var (
	factsOnce sync.Once
	facts     []AcceleratorFacts
	factsErr  error
)

func loadFacts() {
	var f struct {
		Accelerators []AcceleratorFacts `yaml:"accelerators"`
	}
	if err := yaml.Unmarshal(acceleratorsYAML, &f); err != nil {
		factsErr = fmt.Errorf("accelerators.yaml: %w", err)
		return
	}
	for _, a := range f.Accelerators {
		if len(a.GKE)+len(a.NVML) == 0 || a.TFLOPS <= 0 || a.MemoryGB <= 0 || a.Source == "" {
			factsErr = fmt.Errorf("accelerators.yaml: row %v: want names, tflops, memoryGB and a source", a.GKE)
			return
		}
	}
	facts = f.Accelerators
}

// Facts returns the accelerator table. It panics if the embedded table
// does not parse, which a test catches.
func Facts() []AcceleratorFacts {
	factsOnce.Do(loadFacts)
	if factsErr != nil {
		panic(factsErr)
	}
	return facts
}

// normalName compares names the way GPU Feature Discovery writes NVML's:
// lower case, every run of characters other than letters and digits one "-".
func normalName(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

// LookupFacts finds the row of an accelerator by any of its names: GKE's
// accelerator label, the NVML model name, or GPU Feature Discovery's
// product label.
func LookupFacts(names ...string) (AcceleratorFacts, bool) {
	for _, n := range names {
		if n == "" {
			continue
		}
		want := normalName(n)
		for _, a := range Facts() {
			for _, k := range append(append([]string{}, a.GKE...), a.NVML...) {
				if normalName(k) == want {
					return a, true
				}
			}
		}
	}
	return AcceleratorFacts{}, false
}
