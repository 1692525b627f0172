package readme

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/render"
)

// linkedDocs are the markdown files whose relative links TestDocsLinks
// checks: README.md, docs/*.md, CHANGELOG.md and the READMEs beside the rules
// and dashboards.
func linkedDocs(t *testing.T) []string {
	t.Helper()
	files := docFiles(t)
	for _, f := range []string{"CHANGELOG.md", "alerts/README.md", "dashboards/README.md"} {
		if _, err := os.Stat(f); err == nil {
			files = append(files, f)
		}
	}
	return files
}

// proseLines returns a markdown file's lines with fenced code blocks and
// inline code blanked, so that links and names are read from prose only.
func proseLines(text string) []string {
	lines := strings.Split(text, "\n")
	inCode := false
	inline := regexp.MustCompile("`[^`]*`")
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
			lines[i] = ""
			continue
		}
		if inCode {
			lines[i] = ""
			continue
		}
		lines[i] = inline.ReplaceAllString(l, "``")
	}
	return lines
}

// anchors are the heading anchors GitHub gives a markdown file: lower case,
// punctuation other than - and _ dropped, spaces as -, repeats numbered.
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		if h == "" || !strings.HasPrefix(l, strings.Repeat("#", len(l)-len(strings.TrimLeft(l, "#")))+" ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinks: every relative link of README.md and docs/*.md names a file
// that exists and, with a #fragment, a heading of that file.
func TestDocsLinks(t *testing.T) {
	var checked int
	for _, file := range linkedDocs(t) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range proseLines(string(text)) {
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, frag, _ := strings.Cut(target, "#")
				resolved := file
				if path != "" {
					resolved = filepath.Join(filepath.Dir(file), path)
				}
				st, err := os.Stat(resolved)
				if err != nil {
					t.Errorf("%s:%d: link %s: %s does not exist", file, i+1, target, resolved)
					continue
				}
				if frag == "" {
					continue
				}
				if st.IsDir() || !strings.HasSuffix(resolved, ".md") {
					t.Errorf("%s:%d: link %s: an anchor into %s, which is not a markdown file", file, i+1, target, resolved)
					continue
				}
				body, err := os.ReadFile(resolved)
				if err != nil {
					t.Fatal(err)
				}
				if !anchors(string(body))[frag] {
					t.Errorf("%s:%d: link %s: %s has no heading with anchor #%s", file, i+1, target, resolved, frag)
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d relative links, want at least the README's table of contents", checked)
	}
}

// familyName is a metric family name as the docs write it: the exporter's own
// (gpu_...) or dcgm-exporter's (DCGM_FI_...), or a prefix with a trailing *.
var familyName = regexp.MustCompile("`((?:gpu|DCGM_FI|go|process)_[A-Za-z0-9_]*\\*?)`")

// documentedFamilies returns the families named in the first column of the
// markdown tables of file whose header's first cell is header, in the rows
// that keep says to keep (nil: all).
func documentedFamilies(t *testing.T, file, header string, keep func(cells []string) bool) map[string]int {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	inTable := false
	for i, l := range strings.Split(string(text), "\n") {
		if !strings.HasPrefix(l, "|") {
			inTable = false
			continue
		}
		cells := strings.Split(l, "|")
		if !inTable {
			inTable = strings.TrimSpace(cells[1]) == header
			continue
		}
		if keep != nil && !keep(cells[1:]) {
			continue
		}
		for _, m := range familyName.FindAllStringSubmatch(cells[1], -1) {
			out[m[1]] = i + 1
		}
	}
	if len(out) == 0 {
		t.Fatalf("%s: no table headed %q naming metric families", file, header)
	}
	return out
}

// servedPage runs the built exporter on the simulated node with args and
// returns its page once DCGM, the pod map and the compatibility byte rates
// (which need two samples) are on it.
func servedPage(t *testing.T, bin string, args ...string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, append([]string{"--collect-interval=1s", "--web.listen-address=" + addr}, args...)...)
	// Stopped as a user stops it (Ctrl-C), not with the default SIGKILL,
	// and in a TMPDIR of its own: the simulated node's files (sysfs tree,
	// kubelet socket, host /proc) must be gone once it has exited.
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cancel()
		_ = cmd.Wait()
		if left, _ := os.ReadDir(tmp); len(left) > 0 {
			t.Errorf("the simulated node left %d entries in TMPDIR after Ctrl-C (first: %s)", len(left), left[0].Name())
		}
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the simulated node's page never had DCGM, the pod map and the compatibility rates; log:\n%s", logs.String())
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		page := string(body)
		if strings.Contains(page, `gpu_exporter_collector_up{collector="podmap"} 1`) &&
			strings.Contains(page, `gpu_exporter_collector_up{collector="dcgm"} 1`) &&
			strings.Contains(page, "\nDCGM_FI_PROF_PCIE_TX_BYTES{") {
			return page
		}
	}
}

var typeLine = regexp.MustCompile(`(?m)^# TYPE (\S+) `)

// absentOnSimulatedNode are the families the code registers that the built-in
// simulated node cannot show, and why.
var absentOnSimulatedNode = map[string]string{
	"gpu_retired_pages":                                   "page retirement: pre-Ampere GPUs only",
	"gpu_row_remap_banks_low_availability":                "served only for GPUs with banks short of spare rows; the default scenario has none",
	"gpu_mig_mode_pending":                                "served only while a MIG mode change waits for a GPU reset; the default scenario has none",
	"gpu_retired_pages_pending":                           "page retirement: pre-Ampere GPUs only",
	"gpu_kubelet_unmatched_device_ids":                    "every kubelet device ID matches a device",
	"gpu_xid_errors_total":                                "no XID in the default scenario",
	"gpu_last_xid_timestamp_seconds":                      "no XID in the default scenario",
	"gpu_xid_first_timestamp_seconds":                     "no XID in the default scenario",
	"gpu_xid_last_timestamp_seconds":                      "no XID in the default scenario",
	"gpu_mig_xid_errors_total":                            "no XID in the default scenario",
	"gpu_ecc_uncorrected_last_increase_timestamp_seconds": "no ECC error in the default scenario",
	"gpu_fault_active":                                    "served only while a GPU has a fault; the default scenario has none",
	"gpu_dra_device_taint":                                "only with --kubernetes.resource-slices, while a DRA driver taints a device; the default scenario uses a device plugin",
}

// TestDocsMetricFamilies compares the metric families of docs/metrics.md (our
// names) and docs/migration-dcgm-exporter.md (dcgm-exporter's) with what the
// exporter serves, both ways: every family on the simulated node's fullest
// page (--collector.profile=full --compat.dcgm-exporter, a price list) and
// every family the code registers is documented; every documented family is
// served there, or registered and absent on the simulated node for a reason
// given above. Every gpu_ name the docs mention anywhere is a family, a
// family prefix, or a label.
func TestDocsMetricFamilies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	// make test builds the simulated node's binary once for every package
	// (GPE_TEST_SIM_BINARY).
	bin := os.Getenv("GPE_TEST_SIM_BINARY")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "gpu-pool-exporter-sim")
		if out, err := exec.Command("go", "build", "-o", bin, "./cmd/gpu-pool-exporter-sim").CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	page := servedPage(t, bin, "--collector.profile=full", "--compat.dcgm-exporter", "--idle.price=NVIDIA H100 80GB HBM3=11.06")
	served := map[string]bool{}
	for _, m := range typeLine.FindAllStringSubmatch(page, -1) {
		served[m[1]] = true
	}
	registered := map[string]bool{}
	for name := range render.FamilyGroups() {
		registered[name] = true
	}
	for _, name := range render.CompatFamilyNames() {
		registered[name] = true
	}

	documented := documentedFamilies(t, "docs/metrics.md", "name", nil)
	// The name table's rows of dcgm-exporter families the compatibility
	// switch serves: not its labels, nor the one it says it does not serve.
	compatServed := func(cells []string) bool {
		return !strings.Contains(cells[0], "(label)") && strings.TrimSpace(cells[1]) != "none"
	}
	for name, line := range documentedFamilies(t, "docs/migration-dcgm-exporter.md", "dcgm-exporter (unit)", compatServed) {
		if strings.HasPrefix(name, "DCGM_FI_") {
			documented[name] = line
		}
	}
	where := func(name string) string {
		if strings.HasPrefix(name, "DCGM_FI_") {
			return "docs/migration-dcgm-exporter.md"
		}
		return "docs/metrics.md"
	}
	// go_* and process_* are client_golang's own, documented as groups.
	isDocumented := func(name string) bool {
		if _, ok := documented[name]; ok {
			return true
		}
		for d := range documented {
			if p, ok := strings.CutSuffix(d, "*"); ok && strings.HasPrefix(name, p) {
				return true
			}
		}
		return false
	}
	for _, name := range sortedKeys(served) {
		if !isDocumented(name) {
			t.Errorf("%s is served on the simulated node but not documented in %s", name, where(name))
		}
	}
	for _, name := range sortedKeys(registered) {
		if !isDocumented(name) {
			t.Errorf("%s is registered by the code but not documented in %s", name, where(name))
		}
	}
	for name, line := range documented {
		if strings.HasSuffix(name, "*") {
			continue
		}
		switch {
		case served[name]:
		case !registered[name]:
			t.Errorf("%s:%d: %s is documented but the exporter has no such family", where(name), line, name)
		case absentOnSimulatedNode[name] == "":
			t.Errorf("%s:%d: %s is documented and registered but not served on the simulated node's full page; say why in absentOnSimulatedNode", where(name), line, name)
		}
	}
	for name := range absentOnSimulatedNode {
		if served[name] {
			t.Errorf("%s is served on the simulated node now; remove it from absentOnSimulatedNode", name)
		}
	}

	// Names in prose and tables anywhere: a family, a prefix of families, or
	// a label.
	known := map[string]bool{}
	for n := range served {
		known[n] = true
	}
	for n := range registered {
		known[n] = true
	}
	// Labels and label values that begin with gpu_.
	labels := map[string]bool{
		"gpu_instance": true, // label
		"gpu_idle":     true, // gpu_clock_event_active's reason
		"gpu_reset":    true, // a recovery action, a scenario's recoveryAction
	}
	mention := regexp.MustCompile(`(?:^|[^A-Za-z0-9_:.{$-])(gpu_[a-z0-9_]+)(\*|:)?`)
	for _, file := range docFiles(t) {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, l := range strings.Split(string(text), "\n") {
			for _, m := range mention.FindAllStringSubmatch(l, -1) {
				name, suffix := m[1], m[2]
				switch {
				case suffix == ":": // a recording rule's name
				case suffix == "*" || strings.HasSuffix(name, "_"):
					p := strings.TrimSuffix(name, "*")
					if !slices.ContainsFunc(sortedKeys(known), func(k string) bool { return strings.HasPrefix(k, p) }) {
						t.Errorf("%s:%d: %s* matches no family", file, i+1, p)
					}
				case known[name], labels[name]:
				default:
					t.Errorf("%s:%d: %s is not a metric family the exporter serves", file, i+1, name)
				}
			}
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
