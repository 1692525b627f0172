package render

import (
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
	}
	if len(c.Counters) != len(want) {
		t.Fatalf("got %d counters, want %d: %+v", len(c.Counters), len(want), c.Counters)
	}
	for i := range want {
		if c.Counters[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", want[i].Line, c.Counters[i], want[i])
		}
	}
	unread := CompatUnread(c)
	if len(unread) != 1 || unread[0].Field != "DCGM_EXP_XID_ERRORS_COUNT" {
		t.Errorf("unread = %+v, want DCGM_EXP_XID_ERRORS_COUNT alone", unread)
	}
}

// Every wrong line is reported at once, each with its line and what to do.
func TestParseCompatCountersErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       []string
	}{
		{"unknown field", "DCGM_FI_DEV_GPU_TEMP, gauge, t\ndcgm_fi_dev_gpu_temp, gauge, t\n", []string{`f.csv:2: unknown DCGM field "dcgm_fi_dev_gpu_temp"`, "check the spelling"}},
		{"bad type", "\n\nDCGM_FI_DEV_GPU_TEMP, gague, t\n", []string{`f.csv:3: prometheus type "gague" of DCGM_FI_DEV_GPU_TEMP: want gauge, counter or label`}},
		{"histogram", "DCGM_FI_DEV_GPU_TEMP, histogram, t\n", []string{`f.csv:1: prometheus type "histogram"`, "use gauge or counter"}},
		{"two fields", "DCGM_FI_DEV_GPU_TEMP, gauge\n", []string{"f.csv:1: want 3 comma-separated fields", "got 2"}},
		{"unquoted comma", "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature, in C\n", []string{"f.csv:1: want 3 comma-separated fields", "got 4", "double quotes"}},
		{"text field as gauge", "DCGM_FI_DEV_NAME, gauge, name\n", []string{"f.csv:1: DCGM_FI_DEV_NAME is a text field: list it as label"}},
		{"listed twice", "DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n", []string{"f.csv:2: DCGM_FI_DEV_GPU_TEMP is listed again (first on line 1)"}},
		{"bare quote", "DCGM_FI_DEV_GPU_TEMP, gauge, 5\" wide\n", []string{"f.csv:1:", "double quotes"}},
		{"only comments", "# nothing\n\n", []string{"f.csv: lists no field"}},
		{"several", "DCGM_FI_X, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\nDCGM_FI_DEV_FB_USED, gauges, c\n", []string{"f.csv:1: unknown", "f.csv:3: prometheus type"}},
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

// The default list is dcgm-exporter's default-counters.csv (make generate
// keeps the built-in copy equal to deploy/'s).
func TestDefaultCompatCounters(t *testing.T) {
	c := DefaultCompatCounters()
	if len(CompatUnread(c)) != 0 {
		t.Errorf("the default list has fields the exporter does not read: %+v", CompatUnread(c))
	}
	if got := len(c.Counters); got != 26 {
		t.Errorf("the default list has %d fields, dcgm-exporter 4.5.3-4.8.2's has 26", got)
	}
}

// dcgmFieldNames knows every name of the dcgm_fields.h that go-dcgm (the
// binding this exporter builds with, at the version go.mod pins) carries,
// with the same ID: a counters file written for that DCGM release loads.
func TestDCGMFieldNames(t *testing.T) {
	dir := goDCGMDir(t)
	h, err := os.ReadFile(filepath.Join(dir, "pkg", "dcgm", "dcgm_fields.h"))
	if err != nil {
		t.Fatal(err)
	}
	number := regexp.MustCompile(`(?m)^#define (DCGM_FI_[A-Z0-9_]+)[ \t]+([0-9]+)[ \t]*$`)
	alias := regexp.MustCompile(`(?m)^#define (DCGM_FI_[A-Z0-9_]+)[ \t]+DCGM_FI_[A-Z0-9_]+[ \t]*//[ \t]*([0-9]+)$`)
	marker := regexp.MustCompile(`(FIRST|LAST)_(.*_)?ID$|^DCGM_FI_MAX_|UNKNOWN$|^DCGM_FI_INTERNAL_FIELDS_`)
	n := 0
	for _, re := range []*regexp.Regexp{number, alias} {
		for _, m := range re.FindAllStringSubmatch(string(h), -1) {
			if marker.MatchString(m[1]) {
				continue
			}
			n++
			id, _ := strconv.Atoi(m[2])
			f, ok := dcgmFieldNames[m[1]]
			switch {
			case !ok:
				t.Errorf("%s (ID %d) of go-dcgm's dcgm_fields.h is not in dcgmfields.go: regenerate it (scripts/dcgmfields.sh)", m[1], id)
			case f.id != id:
				t.Errorf("%s: ID %d in dcgmfields.go, %d in go-dcgm's dcgm_fields.h", m[1], f.id, id)
			}
		}
	}
	if n < 900 {
		t.Errorf("only %d names read from %s", n, dir)
	}
	for _, name := range []string{"DCGM_EXP_XID_ERRORS_COUNT", "DCGM_EXP_CLOCK_EVENTS_COUNT", "DCGM_EXP_GPU_HEALTH_STATUS", "DCGM_EXP_P2P_STATUS"} {
		if _, ok := dcgmFieldNames[name]; !ok {
			t.Errorf("dcgm-exporter's %s is not known", name)
		}
	}
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
	for _, name := range []string{"default-counters.csv", "dcp-metrics-included.csv"} {
		t.Run(name, func(t *testing.T) {
			c, err := LoadCompatCounters(filepath.Join("..", "..", "deploy", "dcgm-exporter", name))
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Counters) != 26 {
				t.Errorf("%d fields, want dcgm-exporter's 26", len(c.Counters))
			}
			if u := CompatUnread(c); len(u) != 0 {
				t.Errorf("fields this exporter does not read: %+v", u)
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
