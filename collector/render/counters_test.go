package render

import (
	"cmp"
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

func TestParseCompatCounters(t *testing.T) {
	c, err := ParseCompatCounters("mine.csv", []byte(`# Format
# DCGM FIELD, Prometheus metric type, help message

DCGM_FI_DEV_FB_TOTAL,  gauge, Total framebuffer (in MiB).
DCGM_FI_DEV_GPU_TEMP ,gauge,GPU temperature (in C).
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, "Double-bit volatile ECC errors, since the last reset."
DCGM_FI_DRIVER_VERSION, label, Driver Version
DCGM_EXP_XID_ERRORS_COUNT, gauge, XIDs in the window
DCGM_FI_DEV_GPU_TEMPERATURE_OF_THE_FUTURE, gauge, a field of a newer DCGM
DCGM_EXP_CLOCK_EVENTS_COUNT, gauge, clock events in the window
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []CompatCounter{
		{Field: "DCGM_FI_DEV_FB_TOTAL", ID: 250, Type: CounterGauge, Help: "Total framebuffer (in MiB).", Line: 4},
		{Field: "DCGM_FI_DEV_GPU_TEMP", ID: 150, Type: CounterGauge, Help: "GPU temperature (in C).", Line: 5},
		{Field: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", ID: 311, Type: CounterCounter, Help: "Double-bit volatile ECC errors, since the last reset.", Line: 6},
		{Field: "DCGM_FI_DRIVER_VERSION", ID: 1, Type: CounterLabel, Help: "Driver Version", Line: 7},
		{Field: "DCGM_EXP_XID_ERRORS_COUNT", ID: 9001, Type: CounterGauge, Help: "XIDs in the window", Line: 8},
		{Field: "DCGM_EXP_CLOCK_EVENTS_COUNT", ID: 9002, Type: CounterGauge, Help: "clock events in the window", Line: 10},
	}
	if len(c.Counters) != len(want) {
		t.Fatalf("got %d counters, want %d: %+v", len(c.Counters), len(want), c.Counters)
	}
	for i := range want {
		if c.Counters[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", want[i].Line, c.Counters[i], want[i])
		}
	}
	if len(c.Unknown) != 1 || c.Unknown[0] != (CompatCounter{Field: "DCGM_FI_DEV_GPU_TEMPERATURE_OF_THE_FUTURE", Type: CounterGauge, Help: "a field of a newer DCGM", Line: 9}) {
		t.Errorf("unknown = %+v, want DCGM_FI_DEV_GPU_TEMPERATURE_OF_THE_FUTURE (line 9) alone", c.Unknown)
	}
	unread := CompatUnread(c)
	if len(unread) != 1 || unread[0].Field != "DCGM_EXP_CLOCK_EVENTS_COUNT" {
		t.Errorf("unread = %+v, want DCGM_EXP_CLOCK_EVENTS_COUNT alone", unread)
	}
}

// Every wrong line is reported at once, each with its line and what to do.
func TestParseCompatCountersErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"no field name", "DCGM_FI_DEV_GPU_TEMP, gauge, t\ndcgm_fi_dev_gpu_temp, gauge, t\n", []string{`f.csv:2: "dcgm_fi_dev_gpu_temp" is no DCGM field name`, "check the spelling"}},
		{"unknown field with a bad type", "DCGM_FI_DEV_MADE_UP, gague, t\n", []string{`f.csv:1: prometheus type "gague" of DCGM_FI_DEV_MADE_UP`}},
		{"unknown field listed twice", "DCGM_FI_DEV_MADE_UP, gauge, t\nDCGM_FI_DEV_MADE_UP, gauge, t\n", []string{"f.csv:2: DCGM_FI_DEV_MADE_UP is listed again"}},
		{"bad type", "\n\nDCGM_FI_DEV_GPU_TEMP, gague, t\n", []string{`f.csv:3: prometheus type "gague" of DCGM_FI_DEV_GPU_TEMP: want gauge, counter or label`}},
		{"histogram", "DCGM_FI_DEV_GPU_TEMP, histogram, t\n", []string{`f.csv:1: prometheus type "histogram"`, "use gauge or counter"}},
		{"two fields", "DCGM_FI_DEV_GPU_TEMP, gauge\n", []string{"f.csv:1: want 3 comma-separated fields", "got 2"}},
		{"unquoted comma", "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature, in C\n", []string{"f.csv:1: want 3 comma-separated fields", "got 4", "double quotes"}},
		{"text field as gauge", "DCGM_FI_DEV_NAME, gauge, name\n", []string{"f.csv:1: DCGM_FI_DEV_NAME is a text field: list it as label"}},
		{"listed twice", "DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n", []string{"f.csv:2: DCGM_FI_DEV_GPU_TEMP is listed again (first on line 1)"}},
		{"bare quote", "DCGM_FI_DEV_GPU_TEMP, gauge, 5\" wide\n", []string{"f.csv:1:", "double quotes"}},
		{"only comments", "# nothing\n\n", []string{"f.csv: lists no field"}},
		{"several", "DCGM FI X, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\nDCGM_FI_DEV_FB_USED, gauges, c\n", []string{"f.csv:1: \"DCGM FI X\" is no DCGM field name", "f.csv:3: prometheus type"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseCompatCounters("f.csv", []byte(tc.file))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// Each release line's default list is the file deploy/ ships for it (make
// generate keeps the built-in copies equal to deploy/'s): every field known
// and served, as many as the line's file lists.
func TestDefaultCompatCounters(t *testing.T) {
	want := map[string]int{"4.8.2": 26, "4.8.3": 26, "4.9": 27, "4.10": 27}
	for _, rel := range CompatReleases {
		t.Run(rel.Name, func(t *testing.T) {
			c := rel.DefaultCounters()
			if u := CompatUnread(c); len(u) != 0 || len(c.Unknown) != 0 {
				t.Errorf("fields the exporter does not read: %+v; does not know: %+v", u, c.Unknown)
			}
			if got := len(c.Counters); got != want[rel.Name] {
				t.Errorf("the default list has %d fields, want %d", got, want[rel.Name])
			}
			shipped, err := LoadCompatCounters(filepath.Join("..", "..", "deploy", "dcgm-exporter", rel.Name, "default-counters.csv"))
			if err != nil {
				t.Fatal(err)
			}
			for i := range shipped.Counters {
				if shipped.Counters[i] != c.Counters[i] {
					t.Errorf("line %d: deploy/'s %+v, built in %+v: run make generate", shipped.Counters[i].Line, shipped.Counters[i], c.Counters[i])
				}
			}
		})
	}
	if DefaultCompatCounters() != CompatReleases[1].DefaultCounters() || CompatReleases[1].Name != DefaultCompatRelease {
		t.Errorf("without a counters file the families are not the default line's (%s)", DefaultCompatRelease)
	}
}

// dcgmFieldNames is go-dcgm's dcgm_fields.h (the binding this exporter
// builds with, at the version go.mod pins), later-names.csv and
// dcgm-exporter's own names, and nothing else: every header name with the
// same ID, every base-unit field with the legacy field the header says it
// replaces, every name not of the header from later-names.csv with its
// source, and none of those a name the header has since defined. A table
// that drifts from the header either way fails here until
// scripts/dcgmfields.sh writes it again.
func TestDCGMFieldNames(t *testing.T) {
	dir := goDCGMDir(t)
	h, err := os.ReadFile(filepath.Join(dir, "pkg", "dcgm", "dcgm_fields.h"))
	if err != nil {
		t.Fatal(err)
	}
	number := regexp.MustCompile(`(?m)^#define (DCGM_FI_[A-Z0-9_]+)[ \t]+([0-9]+)[ \t]*(?://.*)?$`)
	alias := regexp.MustCompile(`(?m)^#define (DCGM_FI_[A-Z0-9_]+)[ \t]+(DCGM_FI_[A-Z0-9_]+)[ \t]*(?://.*)?$`)
	marker := regexp.MustCompile(`(FIRST|LAST)_(.*_)?ID$|^DCGM_FI_MAX_|UNKNOWN$|^DCGM_FI_INTERNAL_FIELDS_`)
	ids := map[string]int{}
	for _, m := range number.FindAllStringSubmatch(string(h), -1) {
		if !marker.MatchString(m[1]) {
			ids[m[1]], _ = strconv.Atoi(m[2])
		}
	}
	aliases := map[string]string{}
	for _, m := range alias.FindAllStringSubmatch(string(h), -1) {
		if !marker.MatchString(m[1]) {
			aliases[m[1]] = m[2]
		}
	}
	for name, target := range aliases {
		for i := 0; i < 8 && aliases[target] != ""; i++ {
			target = aliases[target]
		}
		id, ok := ids[target]
		if !ok {
			t.Fatalf("go-dcgm's dcgm_fields.h: %s names %s, which has no ID", name, target)
		}
		ids[name] = id
	}
	header := map[string]bool{}
	for name, id := range ids {
		header[name] = true
		f, ok := dcgmFieldNames()[name]
		switch {
		case !ok:
			t.Errorf("%s (ID %d) of go-dcgm's dcgm_fields.h is not in dcgmfields.go: regenerate it (scripts/dcgmfields.sh)", name, id)
		case f.id != id:
			t.Errorf("%s: ID %d in dcgmfields.go, %d in go-dcgm's dcgm_fields.h", name, f.id, id)
		case f.source != "":
			t.Errorf("%s is in go-dcgm's dcgm_fields.h now: delete its line from scripts/dcgmfields/later-names.csv and regenerate dcgmfields.go", name)
		}
	}
	if len(header) < 900 {
		t.Errorf("only %d names read from %s", len(header), dir)
	}
	// The base-unit fields: "Deprecated: Use <new> instead." on the
	// legacy field's own numeric ID.
	replaced := regexp.MustCompile(`Deprecated: Use (DCGM_FI_[A-Z0-9_]+) instead\.?[ \t]*\n[ \t]*\*/[ \t]*\n#define (DCGM_FI_[A-Z0-9_]+)[ \t]+[0-9]+`)
	pairs := replaced.FindAllStringSubmatch(string(h), -1)
	if len(pairs) < 13 {
		t.Errorf("only %d legacy fields with a replacement read from go-dcgm's dcgm_fields.h, want the 13 base-unit fields 1600-1612 at least", len(pairs))
	}
	for _, m := range pairs {
		if got := dcgmFieldNames()[m[1]].replaces; got != m[2] {
			t.Errorf("%s replaces %s in go-dcgm's dcgm_fields.h, %q in dcgmfields.go: regenerate it", m[1], m[2], got)
		}
	}
	later := laterNames(t)
	for name, f := range dcgmFieldNames() {
		switch {
		case strings.HasPrefix(name, "DCGM_EXP_"):
		case f.source != "":
			if later[name] != f.source {
				t.Errorf("%s: source %q in dcgmfields.go, %q in later-names.csv: regenerate it", name, f.source, later[name])
			}
			if _, ok := dcgmFieldNames()[cmp.Or(f.replaces, "-")]; f.replaces != "" && !ok {
				t.Errorf("%s replaces %s, which is no field", name, f.replaces)
			}
		case !header[name]:
			t.Errorf("%s is in dcgmfields.go but neither in go-dcgm's dcgm_fields.h nor in later-names.csv: regenerate it", name)
		}
	}
	for name := range later {
		if _, ok := dcgmFieldNames()[name]; !ok {
			t.Errorf("%s of later-names.csv is not in dcgmfields.go: regenerate it", name)
		}
	}
	for _, name := range []string{"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_XID_ERRORS_TOTAL", "DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_CLOCK_EVENTS_TOTAL", "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS"} {
		if _, ok := dcgmFieldNames()[name]; !ok {
			t.Errorf("dcgm-exporter's %s is not known", name)
		}
	}
}

// laterNames reads scripts/dcgmfields/later-names.csv: name to source.
func laterNames(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "scripts", "dcgmfields", "later-names.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := csv.NewReader(f)
	r.Comment = '#'
	recs, err := r.ReadAll()
	if err != nil || len(recs) < 2 {
		t.Fatalf("later-names.csv: %v (%d lines)", err, len(recs))
	}
	out := map[string]string{}
	for _, rec := range recs[1:] {
		out[rec[0]] = rec[4]
	}
	return out
}

// goDCGMDir is the module directory of go-dcgm at the version go.mod pins.
func goDCGMDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-dcgm").Output()
	if err != nil {
		t.Skipf("no go command to find go-dcgm's module: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// The counters files the GPU Operator runs dcgm-exporter with (its image's
// /etc/dcgm-exporter/dcp-metrics-included.csv by default; default-counters.csv
// in dcgm-exporter's own chart), shipped in deploy/dcgm-exporter as
// examples, and the one deploy's chart test puts in a ConfigMap: each
// loads, and every field the first two list is served.
func TestShippedCountersFilesLoad(t *testing.T) {
	for _, name := range []string{"4.8.2/default-counters.csv", "4.8.2/dcp-metrics-included.csv", "4.8.3/default-counters.csv", "4.8.3/dcp-metrics-included.csv"} {
		t.Run(name, func(t *testing.T) {
			c, err := LoadCompatCounters(filepath.Join("..", "..", "deploy", "dcgm-exporter", name))
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Counters) != 26 {
				t.Errorf("%d fields, want dcgm-exporter's 26", len(c.Counters))
			}
			if u := CompatUnread(c); len(u) != 0 || len(c.Unknown) != 0 {
				t.Errorf("fields this exporter does not read: %+v; does not know: %+v", u, c.Unknown)
			}
		})
	}
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "testdata", "values-compat-counters.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	_, body, _ := strings.Cut(string(b), "customMetrics: |\n")
	if _, err := ParseCompatCounters("values-compat-counters.yaml", []byte(body)); err != nil {
		t.Error(err)
	}
}

// The XID families' field IDs the compat page switches on are the table's.
func TestXIDFieldIDs(t *testing.T) {
	if got := dcgmFieldNames()["DCGM_EXP_XID_ERRORS_COUNT"].id; got != fieldIDXIDCount {
		t.Errorf("DCGM_EXP_XID_ERRORS_COUNT is %d in the table, %d in compat.go", got, fieldIDXIDCount)
	}
	if got := dcgmFieldNames()["DCGM_EXP_XID_ERRORS_TOTAL"].id; got != fieldIDXIDTotal {
		t.Errorf("DCGM_EXP_XID_ERRORS_TOTAL is %d in the table, %d in compat.go", got, fieldIDXIDTotal)
	}
}
