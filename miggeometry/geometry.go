// Package miggeometry is NVIDIA's MIG geometry of every MIG-capable GPU
// model the simulation supports, read from mig-geometry.yaml: profile names,
// IDs, compute and memory slices, instance limits, placements, the memory
// each profile has on the drivers it was captured on, and the board's
// framebuffer as NVML reports it, each with the source it comes from.
//
// Only the fakes read it (the simulated node and the fake libnvidia-ml), and
// tests that check the exporter's output against it, and `gpu-pool-exporter
// recommend`, for the sizes of MIG profiles no node of the cluster serves.
// The exporter itself must not: its names, slice counts and placements come
// from NVML, and a table it shared with its fakes could never disagree with
// it.
package miggeometry

import (
	"bytes"
	_ "embed"
	"fmt"
	"sort"
	"sync"

	"go.yaml.in/yaml/v3"
)

//go:embed mig-geometry.yaml
var data []byte

// Profile is one GPU instance profile of a model.
type Profile struct {
	Name string `yaml:"name"`
	// Index is the NVML profile constant the profile is asked for with
	// (NVML_GPU_INSTANCE_PROFILE_*); ID is the profile ID NVML answers.
	Index   int      `yaml:"index"`
	ID      int      `yaml:"id"`
	Compute int      `yaml:"compute"` // compute slices
	Memory  int      `yaml:"memory"`  // memory slices: the size of each placement
	Count   int      `yaml:"count"`   // instances one GPU holds
	Places  [][2]int `yaml:"placements"`
	// MemoryMiB is the instance memory the simulation serves: the figure
	// of the newest capture that lists the profile (see Table.Memory).
	MemoryMiB uint64 `yaml:"-"`
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

// Capture is one set of profile memory figures (GpuInstanceProfileInfo's
// memorySizeMB, or nvidia-smi mig -lgip's GiB column in MiB) taken on one
// driver from one source. Derived, when set, says how figures no capture
// gives were computed, and from what.
type Capture struct {
	Driver  string            `yaml:"driver"`
	Source  string            `yaml:"source"`
	Derived string            `yaml:"derived"`
	MiB     map[string]uint64 `yaml:"MiB"`
}

// Figure is one board memory figure: the framebuffer NVML reports
// (nvmlDeviceGetMemoryInfo's total, nvidia-smi's memory.total), the driver
// it was captured on and its source.
type Figure struct {
	MiB     uint64 `yaml:"MiB"`
	Driver  string `yaml:"driver"`
	Source  string `yaml:"source"`
	Derived string `yaml:"derived"`
}

// Table is the profile geometry boards of one memory size share.
type Table struct {
	// Cite names the sources (keys of the file's sources) of the profile
	// names, counts, IDs and placements; Derived says which of them no
	// source gives and how they were derived.
	Cite     []string  `yaml:"cite"`
	Derived  string    `yaml:"derived"`
	Profiles []Profile `yaml:"profiles"`
	// Memory are the captures of profile memory, oldest driver first.
	Memory []Capture `yaml:"memory"`
}

// Model is one GPU model's MIG geometry.
type Model struct {
	Model string `yaml:"model"`
	// NVMLNames are what nvmlDeviceGetName answers on the board (first)
	// and the names go-nvml's mock catalogue gives it.
	NVMLNames     []string `yaml:"nvmlNames"`
	PCIDeviceID   uint32   `yaml:"pciDeviceID"`
	Cite          []string `yaml:"cite"` // sources of the names and the PCI device ID
	Derived       string   `yaml:"derived"`
	Framebuffer   Figure   `yaml:"framebuffer"`
	ComputeSlices int      `yaml:"computeSlices"`
	MemorySlices  int      `yaml:"memorySlices"`
	MaxInstances  int      `yaml:"maxInstances"`
	TableName     string   `yaml:"table"`

	// MemoryMiB is the board's framebuffer as NVML reports it.
	MemoryMiB uint64 `yaml:"-"`
	// Profiles are the table's, with the memory the simulation serves.
	Profiles []Profile `yaml:"-"`
	// Table is the model's profile table with all its captures.
	Table *Table `yaml:"-"`
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

// file is mig-geometry.yaml.
type file struct {
	Sources        map[string]string `yaml:"sources"`
	Tables         map[string]*Table `yaml:"tables"`
	Models         []Model           `yaml:"models"`
	GPUInstanceIDs GPUInstanceIDs    `yaml:"gpuInstanceIDs"`
}

// GPUInstanceIDs are the GPU instance IDs captured on real boards, which
// Model.GPUInstanceID must give.
type GPUInstanceIDs struct {
	Cite     []string    `yaml:"cite"`
	Captures []IDCapture `yaml:"captures"`
}

// IDCapture is one GPU instance as nvidia-smi mig -lgi (or -cgi) printed
// it: the board's model, the profile, its placement and its ID.
type IDCapture struct {
	Model     string `yaml:"model"`
	Profile   string `yaml:"profile"`
	Placement [2]int `yaml:"placement"`
	ID        int    `yaml:"id"`
	Source    string `yaml:"source"`
	Driver    string `yaml:"driver"`
}

// GPUInstanceID is the ID the driver gives a GPU instance at placement p
// (mig-geometry.yaml's gpuInstanceIDs): the board's memory slices halved,
// quartered..., numbered level by level from the whole board, so a
// placement of size s at start is (memorySlices/s - 1) + start/s. The whole
// board is 0 and no other instance is: IDs do not count creations.
func (m *Model) GPUInstanceID(p Placement) int {
	if p.Size <= 0 || p.Size >= m.MemorySlices {
		return 0
	}
	return m.MemorySlices/p.Size - 1 + p.Start/p.Size
}

// IDCaptures are the GPU instance IDs captured on real boards.
func IDCaptures() []IDCapture {
	All()
	return parsed.GPUInstanceIDs.Captures
}

var (
	once    sync.Once
	parsed  file
	models  []Model
	errLoad error
)

func load() {
	f, err := parse(data)
	if err != nil {
		errLoad = fmt.Errorf("mig-geometry.yaml: %w", err)
		return
	}
	parsed, models = f, f.Models
}

// parse reads a geometry file and resolves each model's table and the
// memory the simulation serves.
func parse(b []byte) (file, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return file{}, err
	}
	for name, t := range f.Tables {
		if err := t.check(); err != nil {
			return file{}, fmt.Errorf("table %s: %w", name, err)
		}
	}
	for i := range f.Models {
		m := &f.Models[i]
		t, ok := f.Tables[m.TableName]
		if !ok {
			return file{}, fmt.Errorf("model %s: no table %q", m.Model, m.TableName)
		}
		m.Table = t
		m.MemoryMiB = m.Framebuffer.MiB
		m.Profiles = t.resolved()
		if err := m.check(); err != nil {
			return file{}, fmt.Errorf("model %s: %w", m.Model, err)
		}
	}
	return f, nil
}

// check rejects a capture that names a profile the table lacks and a
// profile no capture gives memory for.
func (t *Table) check() error {
	if len(t.Profiles) == 0 {
		return fmt.Errorf("no profiles")
	}
	names := map[string]bool{}
	for _, p := range t.Profiles {
		if names[p.Name] {
			return fmt.Errorf("profile %s listed twice", p.Name)
		}
		names[p.Name] = true
	}
	given := map[string]bool{}
	for i, c := range t.Memory {
		for n, mib := range c.MiB {
			if !names[n] {
				return fmt.Errorf("memory capture %d (%s) names profile %q, which the table does not list", i, c.Source, n)
			}
			if mib == 0 {
				return fmt.Errorf("memory capture %d (%s) gives %s no memory", i, c.Source, n)
			}
			given[n] = true
		}
	}
	for _, p := range t.Profiles {
		if !given[p.Name] {
			return fmt.Errorf("profile %s: no memory capture gives its memory", p.Name)
		}
	}
	return nil
}

// resolved are the table's profiles with the memory of the newest capture
// (the last in the table) that lists each of them.
func (t *Table) resolved() []Profile {
	out := make([]Profile, len(t.Profiles))
	for i, p := range t.Profiles {
		for _, c := range t.Memory {
			if mib, ok := c.MiB[p.Name]; ok {
				p.MemoryMiB = mib
			}
		}
		out[i] = p
	}
	return out
}

// check rejects a table row that no GPU could have.
func (m *Model) check() error {
	if m.ComputeSlices < 1 || m.MemorySlices < m.ComputeSlices || m.MemorySlices > 64 {
		return fmt.Errorf("computeSlices %d, memorySlices %d", m.ComputeSlices, m.MemorySlices)
	}
	if m.MemoryMiB == 0 || len(m.NVMLNames) == 0 {
		return fmt.Errorf("framebuffer %d MiB, %d NVML names", m.MemoryMiB, len(m.NVMLNames))
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

// Sources are the file's sources by key: what each citation refers to.
func Sources() map[string]string {
	All()
	return parsed.Sources
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
