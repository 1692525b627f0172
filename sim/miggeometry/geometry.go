// Package miggeometry is NVIDIA's MIG geometry of every MIG-capable GPU
// model the exporter supports, read from mig-geometry.yaml: profile names,
// IDs, compute and memory slices, memory sizes, instance limits and
// placements, written by hand from the MIG user guide.
//
// Only the fakes read it (the simulated node and the fake libnvidia-ml), and
// tests that check the exporter's output against it, and `gpu-pool-exporter
// recommend`, for the sizes of MIG profiles no node of the cluster serves.
// The exporter itself must not: its names, slice counts and placements come
// from NVML, and a table it shared with its fakes could never disagree with
// it.
package miggeometry

import (
	_ "embed"
	"fmt"
	"sort"
	"sync"

	"gopkg.in/yaml.v3"
)

//go:embed mig-geometry.yaml
var data []byte

// Profile is one GPU instance profile of a model.
type Profile struct {
	Name string `yaml:"name"`
	// Index is the NVML profile constant the profile is asked for with
	// (NVML_GPU_INSTANCE_PROFILE_*); ID is the profile ID NVML answers.
	Index     int      `yaml:"index"`
	ID        int      `yaml:"id"`
	Compute   int      `yaml:"compute"`   // compute slices
	Memory    int      `yaml:"memory"`    // memory slices: the size of each placement
	MemoryMiB uint64   `yaml:"memoryMiB"` // instance memory
	Count     int      `yaml:"count"`     // instances one GPU holds
	Places    [][2]int `yaml:"placements"`
}

// Placement is a possible placement: Size memory slices from Start.
type Placement struct{ Start, Size int }

// Placements are the profile's possible placements in NVML's order.
func (p Profile) Placements() []Placement {
	out := make([]Placement, len(p.Places))
	for i, x := range p.Places {
		out[i] = Placement{Start: x[0], Size: x[1]}
	}
	return out
}

// Model is one GPU model's MIG geometry.
type Model struct {
	Model         string    `yaml:"model"`
	NVMLNames     []string  `yaml:"nvmlNames"`
	MemoryMiB     uint64    `yaml:"memoryMiB"`
	ComputeSlices int       `yaml:"computeSlices"`
	MemorySlices  int       `yaml:"memorySlices"`
	MaxInstances  int       `yaml:"maxInstances"`
	Profiles      []Profile `yaml:"profiles"`
}

// ProfileByName finds a profile by its name.
func (m *Model) ProfileByName(name string) (Profile, bool) {
	for _, p := range m.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// ProfileByIndex finds a profile by its NVML profile constant.
func (m *Model) ProfileByIndex(index int) (Profile, bool) {
	for _, p := range m.Profiles {
		if p.Index == index {
			return p, true
		}
	}
	return Profile{}, false
}

// ProfileByID finds a profile by the profile ID NVML answers.
func (m *Model) ProfileByID(id int) (Profile, bool) {
	for _, p := range m.Profiles {
		if p.ID == id {
			return p, true
		}
	}
	return Profile{}, false
}

// ProfileNames are the model's profile names in table order (smallest first).
func (m *Model) ProfileNames() []string {
	out := make([]string, len(m.Profiles))
	for i, p := range m.Profiles {
		out[i] = p.Name
	}
	return out
}

var (
	once    sync.Once
	models  []Model
	errLoad error
)

func load() {
	var f struct {
		Models []Model `yaml:"models"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		errLoad = fmt.Errorf("mig-geometry.yaml: %w", err)
		return
	}
	for _, m := range f.Models {
		if err := m.check(); err != nil {
			errLoad = fmt.Errorf("mig-geometry.yaml: model %s: %w", m.Model, err)
			return
		}
	}
	models = f.Models
}

// check rejects a table row that no GPU could have.
func (m *Model) check() error {
	if m.ComputeSlices < 1 || m.MemorySlices < m.ComputeSlices || m.MemorySlices > 64 || len(m.Profiles) == 0 {
		return fmt.Errorf("computeSlices %d, memorySlices %d, %d profiles", m.ComputeSlices, m.MemorySlices, len(m.Profiles))
	}
	seen := map[int]bool{}
	for _, p := range m.Profiles {
		if seen[p.ID] {
			return fmt.Errorf("profile ID %d listed twice", p.ID)
		}
		seen[p.ID] = true
		if p.Compute < 1 || p.Compute > m.ComputeSlices || p.Count < 1 || len(p.Places) == 0 {
			return fmt.Errorf("profile %s: compute %d, count %d, %d placements", p.Name, p.Compute, p.Count, len(p.Places))
		}
		for _, x := range p.Places {
			if x[1] != p.Memory || x[0] < 0 || x[0]+x[1] > m.MemorySlices {
				return fmt.Errorf("profile %s: placement %v outside %d memory slices or not %d wide", p.Name, x, m.MemorySlices, p.Memory)
			}
		}
	}
	return nil
}

// All returns every model of the table, in table order. It panics if the
// embedded table does not parse, which a test catches.
func All() []Model {
	once.Do(load)
	if errLoad != nil {
		panic(errLoad)
	}
	return models
}

// ByModel finds a model by its simulator name (A100-SXM4-80GB).
func ByModel(name string) (*Model, bool) {
	for i := range All() {
		if models[i].Model == name {
			return &models[i], true
		}
	}
	return nil, false
}

// ByNVMLName finds a model by a device name NVML (or go-nvml's mock) gives it.
func ByNVMLName(name string) (*Model, bool) {
	for i := range All() {
		for _, n := range models[i].NVMLNames {
			if n == name {
				return &models[i], true
			}
		}
	}
	return nil, false
}

// ModelNames lists the table's model names, sorted.
func ModelNames() []string {
	var out []string
	for _, m := range All() {
		out = append(out, m.Model)
	}
	sort.Strings(out)
	return out
}
