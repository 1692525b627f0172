package fragmentation

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DefaultShapesFlag is the flag form of DefaultShapes.
const DefaultShapesFlag = "1:0.5,2:0.2,4:0.15,8:0.1,mig-1g.10gb:0.05"

// DefaultShapes is a training-and-inference mix dominated by single-GPU jobs,
// with a tail of multi-GPU jobs and a small share of 1g MIG jobs. Shape names
// are the label values of gpu_fragmentation_gpus{shape}.
var DefaultShapes = []Shape{
	{Name: "1", GPUs: 1, Weight: 0.5},
	{Name: "2", GPUs: 2, Weight: 0.2},
	{Name: "4", GPUs: 4, Weight: 0.15},
	{Name: "8", GPUs: 8, Weight: 0.1},
	{Name: "mig-1g.10gb", MIGProfile: "1g.10gb", Weight: 0.05},
}

// maxShapeGPUs bounds the GPU count of a whole-GPU shape; no node comes close.
const maxShapeGPUs = 1024

// migShapePrefix introduces a MIG shape in the flag form.
const migShapePrefix = "mig-"

const shapeForm = `want comma-separated SHAPE:WEIGHT with SHAPE a GPU count ("2") or "mig-" and a MIG profile ("mig-1g.10gb") and WEIGHT a number >= 0, e.g. "` + DefaultShapesFlag + `"`

// ParseShapes parses a task-shape mix such as
// "1:0.5,2:0.2,4:0.15,8:0.1,mig-1g.10gb:0.05": comma-separated SHAPE:WEIGHT
// entries, SHAPE either a whole-GPU count (1 to 1024; the shape is named by
// its canonical decimal form, so "02" becomes "2") or "mig-" followed by a MIG
// profile name made of letters, digits and ".+_-" (named as written).
// Weights are finite numbers >= 0, at least one of them > 0; they need not sum
// to 1. Spaces around entries, names and weights are ignored. Shape names
// must be unique.
func ParseShapes(s string) ([]Shape, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("no task shapes; %s", shapeForm)
	}
	entries := strings.Split(s, ",")
	shapes := make([]Shape, 0, len(entries))
	var sum float64
	for i, e := range entries {
		sh, err := parseShape(e)
		if err != nil {
			return nil, fmt.Errorf("shape entry %d (%q): %w; %s", i+1, strings.TrimSpace(e), err, shapeForm)
		}
		for j := range shapes {
			if shapes[j].Name == sh.Name {
				return nil, fmt.Errorf("shape entry %d (%q): shape %q already given in entry %d; want each shape once", i+1, strings.TrimSpace(e), sh.Name, j+1)
			}
		}
		shapes = append(shapes, sh)
		sum += sh.Weight
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return nil, fmt.Errorf("task shape weights sum to %v; want a positive, finite sum (at least one weight > 0)", sum)
	}
	return shapes, nil
}

func parseShape(e string) (Shape, error) {
	e = strings.TrimSpace(e)
	if e == "" {
		return Shape{}, fmt.Errorf("empty entry (stray comma?)")
	}
	colon := strings.LastIndexByte(e, ':')
	if colon < 0 {
		return Shape{}, fmt.Errorf("missing \":WEIGHT\"")
	}
	name := strings.TrimSpace(e[:colon])
	wtext := strings.TrimSpace(e[colon+1:])
	if name == "" {
		return Shape{}, fmt.Errorf("missing shape before \":\"")
	}
	w, err := strconv.ParseFloat(wtext, 64)
	if err != nil || math.IsNaN(w) || math.IsInf(w, 0) {
		return Shape{}, fmt.Errorf("weight %q is not a finite number", wtext)
	}
	if w < 0 {
		return Shape{}, fmt.Errorf("weight %v is negative", w)
	}
	if strings.HasPrefix(name, migShapePrefix) {
		profile := name[len(migShapePrefix):]
		if profile == "" {
			return Shape{}, fmt.Errorf("MIG shape %q has no profile after %q", name, migShapePrefix)
		}
		for _, r := range profile {
			if !isProfileRune(r) {
				return Shape{}, fmt.Errorf("MIG profile %q contains %q (profile names are letters, digits and \".+_-\")", profile, r)
			}
		}
		return Shape{Name: name, MIGProfile: profile, Weight: w}, nil
	}
	for _, r := range name {
		if r < '0' || r > '9' {
			return Shape{}, fmt.Errorf("shape %q is neither a GPU count nor %q and a MIG profile", name, migShapePrefix)
		}
	}
	n, err := strconv.Atoi(name)
	if err != nil || n < 1 || n > maxShapeGPUs {
		return Shape{}, fmt.Errorf("GPU count %q is out of range; want 1 to %d", name, maxShapeGPUs)
	}
	return Shape{Name: strconv.Itoa(n), GPUs: n, Weight: w}, nil
}

func isProfileRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		r == '.' || r == '+' || r == '_' || r == '-'
}

// FormatShapes is the flag form of shapes, which ParseShapes reads back:
// whole-GPU shapes as their GPU count, MIG shapes as "mig-" and the profile.
// Names are not written; ParseShapes derives them.
func FormatShapes(shapes []Shape) string {
	var b strings.Builder
	for i := range shapes {
		if i > 0 {
			b.WriteByte(',')
		}
		if shapes[i].GPUs > 0 {
			b.WriteString(strconv.Itoa(shapes[i].GPUs))
		} else {
			b.WriteString(migShapePrefix)
			b.WriteString(shapes[i].MIGProfile)
		}
		b.WriteByte(':')
		b.WriteString(strconv.FormatFloat(shapes[i].Weight, 'g', -1, 64))
	}
	return b.String()
}
