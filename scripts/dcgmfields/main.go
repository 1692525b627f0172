// Command dcgmfields writes collector/render/dcgmfields.go: every DCGM
// field name a dcgm-exporter counters file may hold (-f/--collectors), with
// its field ID and DCGM value type, so that the exporter knows each name a
// real file can list, served or not.
//
// Its sources are NVIDIA's: dcgmlib/dcgm_fields.h of NVIDIA/DCGM (every
// DCGM_FI_* name, the renamed ones' old names included, with its ID) and
// dcgmlib/src/dcgm_fields.cpp (each field's DCGM_FT_* value type), and
// internal/pkg/counters of NVIDIA/dcgm-exporter (its own DCGM_EXP_* names,
// numbered from 9001 there). Each is read from a checkout given by -dcgm
// and -exporter; the output names the tag and commit of each (-dcgm-version,
// -exporter-version). `make generate` runs it through scripts/dcgmfields.sh
// when DCGM_SRC and DCGM_EXPORTER_SRC name the checkouts.
package main

import (
	"bytes"
	"cmp"
	"encoding/csv"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// field is one name of the table.
type field struct {
	name string
	id   int
	// typ is DCGM's value type letter (d, i, s, b, t), '?' where
	// dcgm_fields.cpp registers the field under a computed ID.
	typ byte
	// alias is the name this one is an old spelling of ("" for a current
	// name).
	alias string
	// replaces is the legacy field whose value this one gives in the unit
	// its name states (the header's "Deprecated: Use <this> instead." on
	// the legacy field's own ID; later names: the release notes').
	replaces string
	// source is, for a name of a DCGM release whose header could not be
	// read (-later), where the name is known from; "" for a header's.
	source string
}

func main() {
	dcgmDir := flag.String("dcgm", "", "an NVIDIA/DCGM checkout")
	dcgmVersion := flag.String("dcgm-version", "", "its tag and commit, cited in the output")
	exporterDir := flag.String("exporter", "", "an NVIDIA/dcgm-exporter checkout")
	exporterVersion := flag.String("exporter-version", "", "its tag and commit, cited in the output")
	goDCGM := flag.String("go-dcgm", "", "the github.com/NVIDIA/go-dcgm module directory whose pkg/dcgm/dcgm_fields.h adds the names of the DCGM release it binds (optional)")
	goDCGMVersion := flag.String("go-dcgm-version", "", "its module version, cited in the output")
	later := flag.String("later", "", "a CSV of the field names of later DCGM releases whose headers were not available, each with where it is known from (name,id,replaces,same_id_as,source); optional")
	out := flag.String("o", "collector/render/dcgmfields.go", "the Go file to write")
	flag.Parse()
	if *dcgmDir == "" || *exporterDir == "" || *dcgmVersion == "" || *exporterVersion == "" {
		fail(fmt.Errorf("-dcgm, -dcgm-version, -exporter and -exporter-version are required"))
	}
	headers := []string{filepath.Join(*dcgmDir, "dcgmlib", "dcgm_fields.h")}
	if *goDCGM != "" {
		headers = append(headers, filepath.Join(*goDCGM, "pkg", "dcgm", "dcgm_fields.h"))
	}
	fields, err := dcgmFields(headers, filepath.Join(*dcgmDir, "dcgmlib", "src", "dcgm_fields.cpp"))
	if err != nil {
		fail(err)
	}
	if *later != "" {
		if fields, err = laterFields(*later, fields); err != nil {
			fail(err)
		}
	}
	exp, err := exporterFields(*exporterDir)
	if err != nil {
		fail(err)
	}
	sources := "NVIDIA/DCGM " + *dcgmVersion
	if *goDCGM != "" {
		sources += " and github.com/NVIDIA/go-dcgm " + *goDCGMVersion
	}
	src, err := render(fields, exp, sources, cmp.Or(*later, "none"), *exporterVersion)
	if err != nil {
		fail(err)
	}
	if err := os.WriteFile(*out, src, 0o644); err != nil {
		fail(err)
	}
	fmt.Printf("dcgmfields: wrote %s: %d DCGM names, %d dcgm-exporter names\n", *out, len(fields), len(exp))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "dcgmfields:", err)
	os.Exit(1)
}

var (
	defineNumber = regexp.MustCompile(`(?m)^#define (DCGM_FI_[A-Z0-9_]+)[ \t]+([0-9]+)[ \t]*(?://.*)?$`)
	defineAlias  = regexp.MustCompile(`(?m)^#define (DCGM_FI_[A-Z0-9_]+)[ \t]+(DCGM_FI_[A-Z0-9_]+)[ \t]*(?://.*)?$`)
	// notAField are the header's range markers and its "no field" ID.
	notAField = regexp.MustCompile(`^DCGM_FI_(.*_)?(FIRST|LAST)_(.*_)?(FIELD_)?ID$|^DCGM_FI_MAX_|^DCGM_FI_(SYSTEM_FIELD_)?UNKNOWN$|^DCGM_FI_INTERNAL_FIELDS_[0-9]+_(START|END)$`)
	populate  = regexp.MustCompile(`DcgmFieldsPopulateOneFieldWithFormatting\(\s*(\w+),\s*(DCGM_FT_\w+)`)
	loop      = regexp.MustCompile(`for \(unsigned int fieldId = (DCGM_FI_\w+); fieldId <= (DCGM_FI_\w+); fieldId\+\+\)`)
	// deprecatedFor is a legacy field's doc comment naming the field that
	// replaces it, right before its numeric #define.
	deprecatedFor = regexp.MustCompile(`Deprecated: Use (DCGM_FI_[A-Z0-9_]+) instead\.?[ \t]*\n[ \t]*\*/[ \t]*\n#define (DCGM_FI_[A-Z0-9_]+)[ \t]+([0-9]+)`)
)

// dcgmFields reads the names and IDs of the dcgm_fields.h headers (the
// first one's where they disagree) and the value types of dcgm_fields.cpp.
func dcgmFields(headers []string, cppPath string) ([]field, error) {
	cpp, err := os.ReadFile(cppPath)
	if err != nil {
		return nil, err
	}
	ids := map[string]int{}
	aliases := map[string]string{}
	replaces := map[string]string{} // successor -> legacy
	for _, path := range headers {
		h, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		for _, m := range defineNumber.FindAllStringSubmatch(string(h), -1) {
			if _, seen := ids[m[1]]; seen || notAField.MatchString(m[1]) {
				continue
			}
			id, _ := strconv.Atoi(m[2])
			ids[m[1]] = id
		}
		for _, m := range defineAlias.FindAllStringSubmatch(string(h), -1) {
			if _, seen := aliases[m[1]]; !seen && !notAField.MatchString(m[1]) {
				aliases[m[1]] = m[2]
			}
		}
		for _, m := range deprecatedFor.FindAllStringSubmatch(string(h), -1) {
			if _, seen := replaces[m[1]]; !seen {
				replaces[m[1]] = m[2]
			}
		}
	}
	for name := range aliases {
		delete(ids, name) // a name one header numbers and another renames
	}
	resolve := func(name string) (int, bool) {
		for range 8 { // an alias of an alias
			next, ok := aliases[name]
			if !ok {
				break
			}
			name = next
		}
		id, ok := ids[name]
		return id, ok
	}
	types := map[int]byte{}
	for _, m := range populate.FindAllStringSubmatch(string(cpp), -1) {
		id, ok := resolve(m[1])
		if !ok {
			continue // a loop's fieldId, below
		}
		types[id] = typeLetter(m[2])
	}
	for _, loc := range loop.FindAllStringSubmatchIndex(string(cpp), -1) {
		first, last := string(cpp[loc[2]:loc[3]]), string(cpp[loc[4]:loc[5]])
		m := populate.FindStringSubmatch(string(cpp[loc[1]:]))
		a, okA := resolve(first)
		b, okB := resolve(last)
		if m == nil || m[1] != "fieldId" || !okA || !okB {
			continue
		}
		for id := a; id <= b; id++ {
			types[id] = typeLetter(m[2])
		}
	}
	var out []field
	for name, id := range ids {
		t, ok := types[id]
		if !ok {
			t = '?'
		}
		out = append(out, field{name: name, id: id, typ: t, replaces: replaces[name]})
	}
	for legacy, successor := range replaces {
		a, okA := ids[legacy]
		b, okB := ids[successor]
		if !okA || !okB || a == b {
			return nil, fmt.Errorf("dcgm_fields.h: %s is deprecated for %s, which must be two fields with IDs of their own", legacy, successor)
		}
	}
	for name := range aliases {
		id, ok := resolve(name)
		target := aliases[name]
		for aliases[target] != "" {
			target = aliases[target]
		}
		if !ok {
			return nil, fmt.Errorf("dcgm_fields.h: %s names %s, which has no ID", name, aliases[name])
		}
		t, ok := types[id]
		if !ok {
			t = '?'
		}
		out = append(out, field{name: name, id: id, typ: t, alias: target})
	}
	if len(out) < 500 {
		return nil, fmt.Errorf("dcgm_fields.h: only %d field names found in %v", len(out), headers)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// laterFields adds the names of a -later CSV (name,id,replaces,same_id_as,
// source; '#' comments) to the header's. Each must be new to the headers
// and name a header's field: one it replaces under a new ID (a base-unit
// field: id is its own), or one whose ID it takes (a rename that keeps the
// ID: id is left empty).
func laterFields(path string, fields []field) ([]field, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	const head = "name,id,replaces,same_id_as,source"
	if len(recs) == 0 || strings.Join(recs[0], ",") != head {
		return nil, fmt.Errorf("%s: the first line must be %s", path, head)
	}
	known := map[string]field{}
	for _, f := range fields {
		known[f.name] = f
	}
	for i, rec := range recs[1:] {
		name, idText, repl, sameID, source := rec[0], rec[1], rec[2], rec[3], rec[4]
		if _, dup := known[name]; dup {
			return nil, fmt.Errorf("%s: %s is a name of the headers now: delete its line", path, name)
		}
		t, ok := known[cmp.Or(repl, sameID)]
		if source == "" || (repl == "") == (sameID == "") || !ok || t.alias != "" {
			return nil, fmt.Errorf("%s: line %d: want a source and one of replaces or same_id_as naming a current field of the headers", path, i+2)
		}
		nf := field{name: name, typ: '?', replaces: repl, source: source}
		if sameID != "" {
			nf.id, nf.typ = t.id, t.typ
		} else if nf.id, err = strconv.Atoi(idText); err != nil {
			return nil, fmt.Errorf("%s: line %d: id %q: %w", path, i+2, idText, err)
		}
		known[name] = nf
		fields = append(fields, nf)
	}
	sort.Slice(fields, func(i, j int) bool { return fields[i].name < fields[j].name })
	return fields, nil
}

func typeLetter(ft string) byte {
	switch ft {
	case "DCGM_FT_DOUBLE":
		return 'd'
	case "DCGM_FT_INT64":
		return 'i'
	case "DCGM_FT_STRING":
		return 's'
	case "DCGM_FT_BINARY":
		return 'b'
	case "DCGM_FT_TIMESTAMP":
		return 't'
	}
	return '?'
}

var (
	expConst = regexp.MustCompile(`(?m)^\s*(DCGMExp\w+)\s*=\s*"(DCGM_EXP_[A-Z0-9_]+)"`)
	expEnum  = regexp.MustCompile(`(?m)^\s*(DCGM\w+)\s+ExporterCounter\s*=\s*iota \+ 9000`)
	expName  = regexp.MustCompile(`(?m)case (DCGM\w+):\s*\n\s*return (DCGMExp\w+)`)
)

// exporterFields reads dcgm-exporter's own field names and the IDs its
// ExporterCounter enumeration gives them (iota + 9000 in a const block
// whose first entry is DCGMFIUnknown = 0).
func exporterFields(dir string) ([]field, error) {
	consts, err := os.ReadFile(filepath.Join(dir, "internal", "pkg", "counters", "const.go"))
	if err != nil {
		return nil, err
	}
	enum, err := os.ReadFile(filepath.Join(dir, "internal", "pkg", "counters", "exporter_counters.go"))
	if err != nil {
		return nil, err
	}
	names := map[string]string{} // Go constant -> field name
	for _, m := range expConst.FindAllStringSubmatch(string(consts), -1) {
		names[m[1]] = m[2]
	}
	ids := map[string]int{} // enum constant -> ID
	for i, m := range expEnum.FindAllStringSubmatch(string(enum), -1) {
		ids[m[1]] = 9001 + i
	}
	var out []field
	for _, m := range expName.FindAllStringSubmatch(string(enum), -1) {
		id, ok1 := ids[m[1]]
		name, ok2 := names[m[2]]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("dcgm-exporter: %s -> %s is not a known name and ID", m[1], m[2])
		}
		out = append(out, field{name: name, id: id, typ: 'i'})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("dcgm-exporter: no DCGM_EXP_* names in %s", dir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func render(fields, exp []field, dcgmSources, laterPath, exporterVersion string) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `// Code generated by scripts/dcgmfields; DO NOT EDIT.

package render

import "sync"

// dcgmFieldName is what NVIDIA's sources say of one field name.
type dcgmFieldName struct {
	// id is the DCGM field ID (dcgm-exporter's own numbering for DCGM_EXP_*).
	id int
	// typ is DCGM's value type letter.
	typ byte
	// alias is the current name of a renamed field's old name, "" for a
	// current name.
	alias string
	// replaces is the legacy field whose value this one gives in the unit
	// its name states (a base-unit field: DCGM_FI_DEV_SM_CLOCK_HERTZ
	// replaces DCGM_FI_DEV_SM_CLOCK, in MHz), "" for none.
	replaces string
	// source is, for a name of a later DCGM release whose header was not
	// available, where the name is known from; "" for a header's name.
	source string
}

// dcgmFieldNames are every field name of %s
// (dcgm_fields.h; each renamed field's old name too, with the ID of
// the name it became, and the legacy field each base-unit field replaces)
// with the value type NVIDIA/DCGM's
// dcgmlib/src/dcgm_fields.cpp registers it with ('d' double, 'i' int64,
// 's' string, 'b' binary, 't' timestamp; '?' where it registers a computed
// range or does not know the name), the names of later DCGM releases
// known only from release notes (%s, each with its source), and
// dcgm-exporter's own DCGM_EXP_* names (NVIDIA/dcgm-exporter %s,
// internal/pkg/counters). The table is built on first use: only the
// dcgm-exporter families read it, and an agent without them never holds it.
var dcgmFieldNames = sync.OnceValue(func() map[string]dcgmFieldName {
	return map[string]dcgmFieldName{
`, dcgmSources, laterPath, exporterVersion)
	for _, f := range append(append([]field(nil), fields...), exp...) {
		fmt.Fprintf(&b, "\t\t%q: {%d, '%c', %q, %q, %q},\n", f.name, f.id, f.typ, f.alias, f.replaces, f.source)
	}
	b.WriteString("\t}\n})\n")
	return format.Source(b.Bytes())
}
