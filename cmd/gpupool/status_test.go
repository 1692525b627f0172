package main

import (
	"bytes"
	"context"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode"

	"golang.org/x/net/html"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/status"
)

// simulatedExporter runs the exporter on the built-in node (GPU 6
// time-sliced by chat-api-0, -1 and -2; chat-api-2 runs nothing) with a 10s
// idle window, and waits until chat-api-2 is idle.
func simulatedExporter(t *testing.T) string {
	t.Helper()
	r := startExporter(t, "--collect-interval=1s", "--idle.window=10s",
		"--kubelet.refresh-interval=1s", "--nvml.device-timeout=500ms")
	addr := r.addr
	var body string
	if !pollUntil(40*time.Second, func() bool {
		body = waitFor(t, "http://"+addr+status.Path, 200)
		n, err := status.Decode(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range n.GPUs {
			for _, u := range g.Units {
				for _, h := range u.Holders {
					if h.Pod == "chat-api-2" && h.Idle {
						return true
					}
				}
			}
		}
		return false
	}) {
		t.Fatalf("chat-api-2 never went idle; last status:\n%s\nlog:\n%s", body, r.logs.String())
	}
	return addr
}

// chatRows are the three pods time-slicing GPU 6.
var chatRows = []string{"chat-api-0", "chat-api-1", "chat-api-2"}

func TestStatusSubcommand(t *testing.T) {
	t.Parallel()
	addr := simulatedExporter(t)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url=" + addr}, &out, &errb); code != 0 {
		t.Fatalf("status exit %d: %s", code, errb.String())
	}
	lines := map[string]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		for _, p := range chatRows {
			if strings.Contains(l, "inference/"+p+"/server") {
				lines[p] = l
			}
		}
	}
	for _, p := range chatRows {
		l := lines[p]
		if !strings.HasPrefix(l, "6 ") || !strings.Contains(l, "GiB") || !strings.Contains(l, "(processes)") {
			t.Errorf("%s: row %q lacks GPU 6, its VRAM or its activity source\n%s", p, l, out.String())
		}
	}
	if !strings.Contains(lines["chat-api-2"], " 0.0 GiB ") || !strings.Contains(lines["chat-api-2"], " 0% (processes) ") || !strings.Contains(lines["chat-api-2"], "idle ") {
		t.Errorf("chat-api-2 runs nothing and is idle: %q", lines["chat-api-2"])
	}
	if strings.Contains(lines["chat-api-0"], "idle ") || strings.Contains(lines["chat-api-0"], " 0.0 GiB ") {
		t.Errorf("chat-api-0 works: %q", lines["chat-api-0"])
	}
	if !strings.Contains(out.String(), "(outside pods: 1 processes)") {
		t.Errorf("the Docker container outside any pod is missing:\n%s", out.String())
	}
	// JSON for scripts.
	out.Reset()
	if code := run(context.Background(), []string{"status", "--json", "--url=http://" + addr + "/"}, &out, &errb); code != 0 {
		t.Fatalf("status --json exit %d: %s", code, errb.String())
	}
	if _, err := status.Decode(&out); err != nil {
		t.Error(err)
	}
}

func TestStatusSubcommandErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"status", "--url=ftp://x"}, exitUsage, "want http or https"},
		{[]string{"status", "--url=" + freeAddr(t), "--timeout=2s"}, exitError, "cannot reach the exporter"},
		{[]string{"status", "--bogus"}, exitUsage, "unknown long flag"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(context.Background(), c.args, &out, &errb); code != c.code || !strings.Contains(errb.String(), c.want) {
				t.Errorf("%v: exit %d, %q; want exit %d and %q", c.args, code, errb.String(), c.code, c.want)
			}
		})
	}
}

// chromium finds a headless Chromium. Without one the test fails in CI (CI
// set) and is skipped elsewhere; make test installs it (scripts/install-tools.sh).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium not found on PATH (CI is set, so this test must run): run scripts/install-tools.sh (apt-get install chromium)")
	}
	t.Skip("chromium not found on PATH; install it with scripts/install-tools.sh (apt-get install chromium)")
	return ""
}

func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

// The landing page as a browser sees it: Chromium parses and lays out the
// page, and the DOM it dumps has, for each pod on GPU 6, a row with its
// VRAM and activity; chat-api-2's row is marked idle.
func TestStatusPageInChromium(t *testing.T) {
	t.Parallel()
	bin := chromium(t)
	addr := simulatedExporter(t)
	dom := runChromium(t, bin, "--dump-dom", "http://"+addr+"/")
	doc, err := html.Parse(bytes.NewReader(dom))
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ vram, activity, idle string }
	rows := map[string]row{}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "tr" && attr(n, "data-gpu") == "6" && attr(n, "data-pod") != "" {
			r := row{}
			for c := n.FirstChild; c != nil; c = c.NextSibling {
				if c.Type != html.ElementNode || c.Data != "td" {
					continue
				}
				cls := attr(c, "class")
				switch {
				case strings.Contains(cls, "vram"):
					r.vram = text(c)
				case strings.Contains(cls, "activity"):
					r.activity = text(c)
				case strings.Contains(cls, "idle-for"):
					r.idle = cls + " " + text(c)
				}
			}
			rows[attr(n, "data-pod")] = r
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	for _, p := range chatRows {
		r, ok := rows[p]
		if !ok || !strings.HasSuffix(r.vram, "GiB") || !strings.HasSuffix(r.activity, "(processes)") {
			t.Errorf("%s: row %+v in the browser's DOM lacks VRAM or activity; rows: %+v", p, r, rows)
		}
	}
	if r := rows["chat-api-2"]; r.vram != "0.0 GiB" || !strings.HasPrefix(r.activity, "0%") || !strings.Contains(r.idle, "idle-for idle") {
		t.Errorf("chat-api-2 runs nothing and is idle: %+v", r)
	}
	if r := rows["chat-api-0"]; r.vram == "0.0 GiB" || strings.Contains(r.idle, "idle-for idle") {
		t.Errorf("chat-api-0 works: %+v", r)
	}
	// And it renders: a screenshot of the window's size.
	shot := filepath.Join(t.TempDir(), "status.png")
	runChromium(t, bin, "--window-size=1400,900", "--screenshot="+shot, "http://"+addr+"/")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1400 || b.Dy() != 900 {
		t.Errorf("screenshot is %v", b)
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func text(n *html.Node) string {
	var b strings.Builder
	var f func(*html.Node)
	f = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			f(c)
		}
	}
	f(n)
	return strings.TrimSpace(b.String())
}

// Pod names reach the terminal without their control characters: an
// escape sequence or a carriage return in a name cannot rewrite the
// operator's screen.
func TestStatusSubcommandStripsControlCharacters(t *testing.T) {
	t.Parallel()
	addr := simulatedExporter(t)
	resp, err := http.Get("http://" + addr + status.Path)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	hostile := strings.ReplaceAll(string(page), `"chat-api-0"`, `"chat\u001b[2J\u001b]0;owned\u0007-api\r-0\u0085"`)
	if hostile == string(page) {
		t.Fatal("no chat-api-0 in /status.json: the test would prove nothing")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, hostile)
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"status", "--url=" + srv.URL}, &out, &errb); code != 0 {
		t.Fatalf("status exit %d: %s", code, errb.String())
	}
	for _, r := range out.String() {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			t.Fatalf("control character %U in the output:\n%q", r, out.String())
		}
	}
	if !strings.Contains(out.String(), "chat?[2J?]0;owned?-api?-0?") {
		t.Errorf("the hostile name is not shown with its control characters replaced:\n%s", out.String())
	}
}
