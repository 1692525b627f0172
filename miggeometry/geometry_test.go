package miggeometry

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestTableLoads(t *testing.T) {
	all := All()
	if len(all) < 10 {
		t.Fatalf("%d models; want every MIG-capable model", len(all))
	}
	for _, m := range all {
		t.Run(m.Model, func(t *testing.T) {
			// Every profile's placements together never need more than the
			// GPU's memory slices, and its instances no more compute than it has.
			for _, p := range m.Profiles {
				if p.Count*p.Compute > m.ComputeSlices {
					t.Errorf("%s: %d instances of %d compute slices exceed %d", p.Name, p.Count, p.Compute, m.ComputeSlices)
				}
				if len(p.Places) < p.Count {
					t.Errorf("%s: %d placements for %d instances", p.Name, len(p.Places), p.Count)
				}
				if p.MemoryMiB == 0 {
					t.Errorf("%s: no memory", p.Name)
				}
			}
			if _, ok := ByModel(m.Model); !ok {
				t.Errorf("ByModel(%q) not found", m.Model)
			}
			for _, n := range m.NVMLNames {
				if got, ok := ByNVMLName(n); !ok || got.Model != m.Model {
					t.Errorf("ByNVMLName(%q) = %v, %v", n, got, ok)
				}
			}
		})
	}
}

// TestProfilesWithinFramebufferShare: no profile of any capture has more
// memory than its memory slices' share of the framebuffer NVML reports on
// the board, the bound every capture of NVIDIA's boards keeps.
func TestProfilesWithinFramebufferShare(t *testing.T) {
	for _, m := range All() {
		for _, v := range shareViolations(&m) {
			t.Errorf("%s: %s", m.Model, v)
		}
	}
}

// TestEveryFigureCited: every table and model cites known sources, every
// memory figure and framebuffer names its source and the driver it was
// captured on, and a table's captures run from the oldest driver to the
// newest, so that the last one the simulation serves is the newest.
func TestEveryFigureCited(t *testing.T) {
	f, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range citationProblems(f) {
		t.Error(p)
	}
}

// The checks above catch what they are for: a figure over its share, as
// the H200's 144384 MiB 7g.141gb on a 143771 MiB board once was, a missing
// source or driver, a source that is not one of the file's or is cited
// nowhere, captures out of driver order, and (the loader) a capture of a
// profile the table lacks.
func TestChecksCatchBadRows(t *testing.T) {
	for _, tc := range []struct {
		name, find, replace, want string
	}{
		{"over share", "2g.x: 4480", "2g.x: 5000", "2g.x: 5000 MiB > 2/4 of the 9000 MiB framebuffer"},
		{"figure without source", "source: cap-new", `source: ""`, "memory 1: no source"},
		{"figure without driver", "driver: 580.105.08", `driver: ""`, `memory 1: driver ""`},
		{"unknown source", "cite: [doc]", "cite: [doc, nope]", `unknown source "nope"`},
		{"framebuffer without driver", "driver: 580.65.06", `driver: ""`, `framebuffer: driver ""`},
		{"drivers out of order", "driver: 535.104.12", "driver: 610.43.02", "driver 580.105.08 after 610.43.02"},
		{"source cited nowhere", "  doc: a document", "  doc: a document\n  stale: an unused source", `source "stale" is cited nowhere`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parse([]byte(strings.Replace(cleanFixture, tc.find, tc.replace, 1)))
			if err != nil {
				t.Fatal(err)
			}
			got := citationProblems(f)
			got = append(got, shareViolations(&f.Models[0])...)
			found := false
			for _, g := range got {
				found = found || strings.Contains(g, tc.want)
			}
			if !found {
				t.Errorf("problems %q; want one containing %q", got, tc.want)
			}
		})
	}
	f, err := parse([]byte(cleanFixture))
	if err != nil {
		t.Fatal(err)
	}
	if p := append(citationProblems(f), shareViolations(&f.Models[0])...); len(p) > 0 {
		t.Errorf("clean fixture: %q", p)
	}
	if _, err := parse([]byte(strings.Replace(cleanFixture, "2g.x: 4480", "2g.y: 4480", 1))); err == nil ||
		!strings.Contains(err.Error(), `names profile "2g.y"`) {
		t.Errorf("capture of an unknown profile: %v", err)
	}
}

// cleanFixture is a small geometry file with no problem, which the cases
// above break one line at a time.
const cleanFixture = `
sources:
  doc: a document
  cap-old: an old capture
  cap-new: a new capture
tables:
  t:
    cite: [doc]
    profiles:
      - {name: 1g.x, index: 0, id: 14, compute: 1, memory: 1, count: 4, placements: [[0,1],[1,1],[2,1],[3,1]]}
      - {name: 2g.x, index: 1, id: 5, compute: 2, memory: 2, count: 2, placements: [[0,2],[2,2]]}
    memory:
      - {driver: 535.104.12, source: cap-old, MiB: {1g.x: 2048, 2g.x: 4352}}
      - {driver: 580.105.08, source: cap-new, MiB: {1g.x: 2176, 2g.x: 4480}}
models:
  - {model: X, nvmlNames: [NVIDIA X], cite: [doc], framebuffer: {MiB: 9000, driver: 580.65.06, source: doc},
     computeSlices: 4, memorySlices: 4, maxInstances: 4, table: t}
gpuInstanceIDs: {cite: [doc], captures: [{model: X, profile: 1g.x, placement: [1,1], id: 4, source: cap-new, driver: 580.105.08}]}
`

// shareViolations lists the figures of m's table, captured or derived, that
// exceed their memory slices' share of m's framebuffer.
func shareViolations(m *Model) []string {
	var out []string
	for _, p := range m.Table.Profiles {
		for _, c := range m.Table.Memory {
			mib, ok := c.MiB[p.Name]
			if ok && mib*uint64(m.MemorySlices) > uint64(p.Memory)*m.MemoryMiB {
				out = append(out, fmt.Sprintf("%s: %d MiB > %d/%d of the %d MiB framebuffer (%s, driver %s)",
					p.Name, mib, p.Memory, m.MemorySlices, m.MemoryMiB, c.Source, c.Driver))
			}
		}
	}
	return out
}

// driverRe is a driver as a capture prints it, or "unstated" where the
// capture does not print one; either may carry a note in parentheses.
var driverRe = regexp.MustCompile(`^(\d{3}\.\d+(\.\d+)?|unstated)( \(.+\))?$`)

// citationProblems lists every citation or driver missing from f, and
// captures whose printed drivers run backwards.
func citationProblems(f file) []string {
	var out []string
	cited := map[string]bool{}
	cite := func(where string, keys []string) {
		if len(keys) == 0 {
			out = append(out, where+": no source")
		}
		for _, k := range keys {
			if _, ok := f.Sources[k]; !ok {
				out = append(out, fmt.Sprintf("%s: unknown source %q", where, k))
			}
			cited[k] = true
		}
	}
	figure := func(where, source, driver string) {
		if source == "" {
			out = append(out, where+": no source")
		} else {
			cite(where, []string{source})
		}
		if !driverRe.MatchString(driver) {
			out = append(out, fmt.Sprintf("%s: driver %q is neither a version nor \"unstated\"", where, driver))
		}
	}
	for name, t := range f.Tables {
		cite("table "+name, t.Cite)
		var last []int
		lastDriver := ""
		for i, c := range t.Memory {
			where := fmt.Sprintf("table %s memory %d", name, i)
			figure(where, c.Source, c.Driver)
			v := version(c.Driver)
			if v == nil {
				continue
			}
			if last != nil && less(v, last) {
				out = append(out, fmt.Sprintf("%s: driver %s after %s", where, c.Driver, lastDriver))
			}
			last, lastDriver = v, c.Driver
		}
	}
	cite("gpuInstanceIDs", f.GPUInstanceIDs.Cite)
	for i, c := range f.GPUInstanceIDs.Captures {
		figure(fmt.Sprintf("gpuInstanceIDs capture %d", i), c.Source, c.Driver)
	}
	for _, m := range f.Models {
		cite("model "+m.Model, m.Cite)
		figure("model "+m.Model+" framebuffer", m.Framebuffer.Source, m.Framebuffer.Driver)
	}
	for k := range f.Sources {
		if !cited[k] {
			out = append(out, fmt.Sprintf("source %q is cited nowhere", k))
		}
	}
	return out
}

// version is a printed driver version's numbers; nil for "unstated".
func version(driver string) []int {
	s, _, _ := strings.Cut(driver, " ")
	if s == "unstated" || s == "" {
		return nil
	}
	var v []int
	for _, f := range strings.Split(s, ".") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

func less(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

// GPU instance IDs: every capture's ID is the rule's, and on every board
// each placement of every profile has an ID no placement of another size
// or start shares, the whole board's 0 and no other.
func TestGPUInstanceIDs(t *testing.T) {
	caps := IDCaptures()
	if len(caps) == 0 {
		t.Fatal("no GPU instance ID captures")
	}
	for _, c := range caps {
		m, ok := ByModel(c.Model)
		if !ok {
			t.Errorf("capture of unknown model %s", c.Model)
			continue
		}
		p, ok := m.ProfileByName(c.Profile)
		if !ok || !slices.Contains(p.Places, c.Placement) {
			t.Errorf("%s: %s has no placement %v", c.Model, c.Profile, c.Placement)
			continue
		}
		if got := m.GPUInstanceID(Placement{Start: c.Placement[0], Size: c.Placement[1]}); got != c.ID {
			t.Errorf("%s %s at %d:%d: ID %d, captured %d (%s)", c.Model, c.Profile, c.Placement[0], c.Placement[1], got, c.ID, c.Source)
		}
	}
	for _, m := range All() {
		owner := map[int]Placement{}
		for _, p := range m.Profiles {
			for _, pl := range p.Placements() {
				if m.MemorySlices%pl.Size != 0 || pl.Start%pl.Size != 0 {
					t.Errorf("%s %s: placement %d:%d is not a node of the halving tree", m.Model, p.Name, pl.Start, pl.Size)
					continue
				}
				id := m.GPUInstanceID(pl)
				if o, ok := owner[id]; ok && o != pl {
					t.Errorf("%s: placements %v and %v both get ID %d", m.Model, o, pl, id)
				}
				owner[id] = pl
				if (id == 0) != (pl.Size == m.MemorySlices) {
					t.Errorf("%s %s at %d:%d: ID %d", m.Model, p.Name, pl.Start, pl.Size, id)
				}
			}
		}
	}
}
