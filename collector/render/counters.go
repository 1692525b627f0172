package render

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// CompatCounter is one line of a dcgm-exporter counters file
// (-f/--collectors): a DCGM field to serve, under the file's type and help.
type CompatCounter struct {
	// Field is the DCGM field name as the file writes it: the family's
	// name (an old name of a renamed field keeps its old name).
	Field string
	// ID is the field's DCGM ID (dcgm-exporter's own for DCGM_EXP_*).
	ID int
	// Type is gauge, counter or label (a label on every series, named
	// after the field).
	Type string
	Help string
	// Line is the line of the file it was read from.
	Line int
}

// CompatCounters is a parsed counters file.
type CompatCounters struct {
	// Source names the file, for log lines and errors.
	Source   string
	Counters []CompatCounter
	// Unknown are the lines whose field neither DCGM's headers nor
	// dcgm-exporter define as far as this exporter knows (a field of a DCGM
	// release newer than its table): left out, counted and logged, so
	// that a table that lags DCGM never stops an exporter from starting.
	Unknown []CompatCounter
}

// Counter types of a counters file. dcgm-exporter also accepts histogram
// and summary, and serves a single sample under them, which is no
// histogram or summary at all: refused with that reason.
const (
	CounterGauge   = "gauge"
	CounterCounter = "counter"
	CounterLabel   = "label"
)

// LoadCompatCounters reads and checks a counters file.
func LoadCompatCounters(path string) (*CompatCounters, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("counters file: %w", err)
	}
	return ParseCompatCounters(path, b)
}

// fieldName is the form of a DCGM field name: DCGM_FI_* or dcgm-exporter's
// DCGM_EXP_*, upper case.
var fieldName = regexp.MustCompile(`^DCGM_(FI|EXP)_[A-Z0-9_]+$`)

// ParseCompatCounters checks a counters file in dcgm-exporter's format: one
// `DCGM field name, prometheus type, help text` per line, `#` starting a
// comment line (after blanks too), blank lines ignored, a help text with a comma in double
// quotes. Every line that is wrong is reported, each with its line number
// and what to do. A well-formed line naming a field this exporter does not
// know is no mistake of the file's (DCGM and dcgm-exporter add fields): it
// goes to Unknown.
func ParseCompatCounters(source string, data []byte) (*CompatCounters, error) {
	// A comment indented (as a file pasted into YAML keeps it) is a comment
	// too; blanked rather than dropped, so that line numbers stay the file's.
	lines := strings.Split(string(data), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines[i] = ""
		}
	}
	r := csv.NewReader(strings.NewReader(strings.Join(lines, "\n")))
	r.Comment = '#'
	r.FieldsPerRecord = -1
	r.TrimLeadingSpace = true // `name, "help, with a comma"`
	out := &CompatCounters{Source: source}
	var errs []error
	bad := func(line int, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", source, line, fmt.Sprintf(format, a...)))
	}
	seen := map[string]int{}
	for {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				bad(pe.StartLine, "%v: write `DCGM field name, prometheus type, help text`, with a help text that holds a comma or a quote in double quotes (\"\" for a quote)", pe.Err)
				if errors.Is(pe.Err, csv.ErrQuote) || errors.Is(pe.Err, csv.ErrBareQuote) {
					break // the reader cannot find the next line after a quote error
				}
				continue
			}
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		line, _ := r.FieldPos(0)
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
		}
		if len(rec) == 1 && rec[0] == "" {
			continue // a line of blanks
		}
		if len(rec) != 3 {
			bad(line, "want 3 comma-separated fields (DCGM field name, prometheus type, help text), got %d: %q; put a help text that holds a comma in double quotes", len(rec), strings.Join(rec, ","))
			continue
		}
		name, typ, help := rec[0], rec[1], rec[2]
		if !fieldName.MatchString(name) {
			bad(line, "%q is no DCGM field name: names are upper case and start DCGM_FI_ (DCGM's, e.g. DCGM_FI_DEV_GPU_TEMP) or DCGM_EXP_ (dcgm-exporter's); check the spelling or delete the line", name)
			continue
		}
		switch typ {
		case CounterGauge, CounterCounter, CounterLabel:
		case "histogram", "summary":
			bad(line, "prometheus type %q of %s: a DCGM field is one value, which is no %s; use gauge or counter", typ, name, typ)
			continue
		default:
			bad(line, "prometheus type %q of %s: want gauge, counter or label", typ, name)
			continue
		}
		if prev, dup := seen[name]; dup {
			bad(line, "%s is listed again (first on line %d): delete one of the two lines", name, prev)
			continue
		}
		seen[name] = line
		f, ok := dcgmFieldNames()[name]
		if !ok {
			out.Unknown = append(out.Unknown, CompatCounter{Field: name, Type: typ, Help: help, Line: line})
			continue
		}
		if f.typ == 's' && typ != CounterLabel {
			bad(line, "%s is a text field: list it as label (it becomes a label of every series), not %s", name, typ)
			continue
		}
		if f.typ == 'b' {
			bad(line, "%s is a binary field, which no metric can carry; delete the line", name)
			continue
		}
		out.Counters = append(out.Counters, CompatCounter{Field: name, ID: f.id, Type: typ, Help: help, Line: line})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(out.Counters)+len(out.Unknown) == 0 {
		return nil, fmt.Errorf("%s: lists no field: give at least one `DCGM field name, prometheus type, help text` line", source)
	}
	return out, nil
}
