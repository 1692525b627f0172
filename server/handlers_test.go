package server

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
)

// Past --web.max-requests answers being prepared at once, a scrape gets 503
// at once; the slot comes back when the handler starts writing.
func TestMaxRequestsAnswers503(t *testing.T) {
	entered := make(chan struct{}, 8)
	release := make(chan struct{})
	h := LimitScrapes(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		fmt.Fprint(w, strings.Repeat("x", 3*writeChunk))
	}), 2)
	srv := httptest.NewServer(h)
	defer srv.Close()
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _ := get(t, srv.Client(), srv.URL, "", "")
			codes <- code
		}()
	}
	<-entered
	<-entered
	for i := 0; i < 3; i++ {
		code, body := get(t, srv.Client(), srv.URL, "", "")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "too many concurrent scrapes") {
			t.Errorf("scrape %d with both slots taken: %d %q", i, code, body)
		}
	}
	close(release)
	wg.Wait()
	for i := 0; i < 2; i++ {
		if code := <-codes; code != 200 {
			t.Errorf("a scrape that held a slot got %d", code)
		}
	}
	if code, _ := get(t, srv.Client(), srv.URL, "", ""); code != 200 {
		t.Errorf("after the slots came back: %d", code)
	}
}

// The HTTP server's own error lines (a TLS handshake that fails, as any
// client can cause) follow the log level: none at error, info or warn; at
// debug a bounded number, with a count of those left out.
func TestServerErrorLogFollowsLevel(t *testing.T) {
	for _, tc := range []struct {
		level   zerolog.Level
		atMost  int
		atLeast int
	}{
		{zerolog.ErrorLevel, 0, 0},
		{zerolog.InfoLevel, 0, 0},
		{zerolog.DebugLevel, serverErrorBurst + 10, 1},
	} {
		t.Run(tc.level.String(), func(t *testing.T) {
			var buf syncBuffer
			srv := newHTTPServer(http.NotFoundHandler(), zerolog.New(&buf).Level(tc.level))
			for i := 0; i < 1000; i++ {
				srv.ErrorLog.Printf("http: TLS handshake error from 10.0.0.%d:4000: EOF", i%250)
			}
			lines := strings.Count(buf.String(), "\n")
			if lines > tc.atMost || lines < tc.atLeast {
				t.Fatalf("1000 server errors made %d log lines at %s, want %d to %d:\n%.500s", lines, tc.level, tc.atLeast, tc.atMost, buf.String())
			}
			if lines > 0 && !strings.Contains(buf.String(), `"level":"debug"`) {
				t.Errorf("not at debug level: %.300s", buf.String())
			}
		})
	}
}

// guard marks a connection whose answer had a body written whole as one
// whose client takes its answers, and not one answered with a refusal; a
// request refused for want of room closes its connection, unless the
// connection has taken an answer (its client retries on it, after
// Retry-After).
func TestGuardMarksAnswersAndKeepsReadersOnRefusal(t *testing.T) {
	tr, dial, _ := acceptFrom(t, 0, 0)
	serve := func(c *trackedConn, h http.HandlerFunc) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/metrics", nil)
		rec := httptest.NewRecorder()
		guard(tr, h).ServeHTTP(rec, req.WithContext(withConn(req.Context(), c)))
		return rec
	}
	page := func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "gpu_up 1\n") }
	reader, refused := dial("127.0.0.2"), dial("127.0.0.2") // one address: neither may shed the other
	serve(refused, func(w http.ResponseWriter, _ *http.Request) { refuse(w, http.StatusUnauthorized) })
	serve(reader, page)
	tr.mu.Lock()
	marked, unmarked := reader.answered, refused.answered
	tr.mu.Unlock()
	if !marked || unmarked {
		t.Fatalf("after a page: answered %v; after a refusal without a body: answered %v; want true, false", marked, unmarked)
	}
	fillBudget(tr)
	if rec := serve(reader, page); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Connection") == "close" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("over the budget, a connection that took an answer: %d, Connection %q, Retry-After %q; want 503 keeping the connection, with Retry-After",
			rec.Code, rec.Header().Get("Connection"), rec.Header().Get("Retry-After"))
	}
	if rec := serve(refused, page); rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Connection") != "close" {
		t.Errorf("over the budget, a connection that took no answer: %d, Connection %q; want 503 closing it", rec.Code, rec.Header().Get("Connection"))
	}
}

// What marks a connection as one whose client takes its answers: a
// successful GET with a body. Neither a HEAD (its body is never sent), nor
// an error page, nor a refusal does.
func TestOnlyASuccessfulGetWithABodyMarksAnAnswerTaken(t *testing.T) {
	tr, dial, _ := acceptFrom(t, 0, 0)
	for _, tc := range []struct {
		method string
		h      http.HandlerFunc
		want   bool
	}{
		{"GET", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "gpu_up 1\n") }, true},
		{"HEAD", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "gpu_up 1\n") }, false},
		{"GET", func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "too many concurrent scrapes", http.StatusServiceUnavailable)
		}, false},
		{"GET", func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) }, false},
		{"GET", func(w http.ResponseWriter, _ *http.Request) { refuse(w, http.StatusUnauthorized) }, false},
	} {
		c := dial("127.0.0.2")
		req := httptest.NewRequest(tc.method, "/metrics", nil)
		rec := httptest.NewRecorder()
		guard(tr, tc.h).ServeHTTP(rec, req.WithContext(withConn(req.Context(), c)))
		tr.mu.Lock()
		got := c.answered
		tr.mu.Unlock()
		if got != tc.want {
			t.Errorf("%s answered %d: connection marked %v, want %v", tc.method, rec.Code, got, tc.want)
		}
	}
}

// A request refused for want of room keeps a connection that took an
// answer only if it has no body (net/http would read the body first); a
// request on it within refusedAgain of the last refusal is refused
// without looking for room, so that looping on refusals costs no walk over
// the connections, and the next one after that looks again.
func TestKeptConnectionsOnRefusal(t *testing.T) {
	tr, dial, clock := acceptFrom(t, 0, 0)
	c := dial("127.0.0.2")
	tr.markAnswered(c)
	stalled := streaming(tr, dial("127.0.0.2"), clock.now())
	fillBudget(tr)
	do := func(body bool) string {
		req := httptest.NewRequest("GET", "/metrics", nil)
		if body {
			req = httptest.NewRequest("GET", "/metrics", strings.NewReader("x"))
		}
		rec := httptest.NewRecorder()
		guard(tr, http.NotFoundHandler()).ServeHTTP(rec, req.WithContext(withConn(req.Context(), c)))
		if rec.Code != http.StatusServiceUnavailable {
			t.Fatalf("over the budget: %d, want 503", rec.Code)
		}
		return rec.Header().Get("Connection")
	}
	if got := do(true); got != "close" {
		t.Errorf("a refused request with a body: Connection %q, want close", got)
	}
	clock.add(stallGrace - refusedAgain/4) // the other connection does not stall yet
	if got := do(false); got == "close" {
		t.Error("a refused request without a body: connection closed, want it kept")
	}
	clock.add(refusedAgain / 2) // the other connection now stalls: there is room to take
	if got := do(false); got == "close" || !open(tr, stalled) {
		t.Errorf("a request within %s of a refusal: Connection %q, the stalled connection open %v; want it refused without shedding, the connection kept", refusedAgain, got, open(tr, stalled))
	}
	clock.add(refusedAgain)
	tr.mu.Lock()
	tr.budget = tr.used // the refused request's charge was given back
	tr.mu.Unlock()
	if !tr.startRequest(c, requestBytes, false) || open(tr, stalled) {
		t.Errorf("a request %s after the last refusal did not take the stalled connection's room", refusedAgain)
	}
}
