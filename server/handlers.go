package server

import (
	"net/http"
	"strings"
	"time"
)

// guard is the first of the exporter's handlers on every listener: it
// charges the request to the memory budget (refusing it when there is no
// room for a client without credentials), and gives every write of every
// answer (refusals and errors included) a deadline, watching its progress.
func guard(t *tracker, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := connOf(r)
		h2 := r.ProtoMajor == 2
		if c != nil {
			cost := requestCost(r)
			if !t.startRequest(c, cost, h2) {
				// No room: the connection goes too (HTTP/2: GOAWAY),
				// unless it has shown credentials or taken an answer, and
				// the request has no body (net/http would read it before
				// answering a connection it keeps).
				if r.ContentLength == 0 && t.keepsOnRefusal(c) {
					w.Header().Set("Retry-After", "1")
				} else {
					w.Header().Set("Connection", "close")
				}
				refuse(w, http.StatusServiceUnavailable)
				return
			}
			defer t.endRequest(c, cost)
		}
		aw := &answerWriter{ResponseWriter: w, rc: http.NewResponseController(w), end: time.Now().Add(writeTimeout)}
		if c != nil && h2 {
			aw.progress = &c.stream // an HTTP/2 stream's writes do not show on the connection while its window is 0
		}
		aw.setDeadline()
		next.ServeHTTP(aw, r)
		aw.finish()
		if c != nil && aw.n > 0 && r.Method == http.MethodGet && aw.code/100 == 2 {
			if h2 {
				// What the stream still buffers leaves now, while the
				// request is charged and its progress watched: a client
				// holding its window at 0 takes none of it.
				aw.flush()
			}
			if !aw.failed {
				t.markAnswered(c)
			}
		}
	})
}

// requestCost is what the server holds for r while serving it.
func requestCost(r *http.Request) int64 {
	n := int64(requestBytes + len(r.RequestURI))
	for k, vs := range r.Header {
		for _, v := range vs {
			n += int64(2 * (len(k) + len(v))) // the bytes read, and the parsed copy
		}
	}
	return n
}

// refuse answers code with no body: an answer to a client without
// credentials never waits on that client's flow-control window.
func refuse(w http.ResponseWriter, code int) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(code)
}

// answerWriter writes an answer in chunks, each with a writeStall deadline
// (never past the answer's end), and reports the writes of an HTTP/2
// stream to its connection's progress.
type answerWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	end      time.Time
	progress *progress // nil: the connection's own writes tell
	n        int64     // bytes written
	failed   bool      // a write failed
	code     int       // the answer's status
}

func (a *answerWriter) WriteHeader(code int) {
	if a.code == 0 {
		a.code = code
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerWriter) setDeadline() {
	d := time.Now().Add(writeStall)
	if d.After(a.end) {
		d = a.end
	}
	_ = a.rc.SetWriteDeadline(d)
}

func (a *answerWriter) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		c := b[:min(len(b), writeChunk)]
		a.setDeadline()
		if a.progress != nil {
			a.progress.start(time.Now())
		}
		m, err := a.ResponseWriter.Write(c)
		if a.progress != nil {
			a.progress.done(time.Now(), m)
		}
		if a.code == 0 {
			a.code = http.StatusOK
		}
		n += m
		a.n += int64(m)
		if err != nil {
			a.failed = true
			return n, err
		}
		b = b[len(c):]
	}
	return n, nil
}

// finish gives what the answer still buffers, which the server sends after
// the handler (with a Content-Length when it is all there is), a deadline
// of its own.
func (a *answerWriter) finish() {
	if a.n > 0 {
		a.setDeadline()
	}
}

// flush sends what the answer still buffers, with a deadline and its
// progress watched; a failure counts as a failed write.
func (a *answerWriter) flush() {
	a.setDeadline()
	if a.progress != nil {
		a.progress.start(time.Now())
	}
	err := a.rc.Flush()
	if a.progress != nil {
		a.progress.done(time.Now(), 0)
	}
	if err != nil {
		a.failed = true
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (a *answerWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// refuseUnservable answers at once, before any slot, login or handler, a
// request that no endpoint serves: a method other than GET and HEAD (405,
// with Allow; OPTIONS * too), or a request with a body (413). A body is
// never read: the connection is closed after the answer, so a client
// sending it slowly holds neither a scrape slot nor a connection that
// cannot be evicted (net/http would otherwise drain up to 256 KiB of it, up
// to the read timeout).
//
// Requests under bodyPrefix ("" none) pass as they are: pprof's symbol
// lookup reads a POST body.
func refuseUnservable(next http.Handler, bodyPrefix string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bodyPrefix != "" && strings.HasPrefix(r.URL.Path, bodyPrefix) {
			next.ServeHTTP(w, r)
			return
		}
		hasBody := r.ContentLength != 0 // -1: chunked, or HTTP/2 without a length
		code := 0
		switch {
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			code = http.StatusMethodNotAllowed
		case hasBody:
			code = http.StatusRequestEntityTooLarge
		default:
			next.ServeHTTP(w, r)
			return
		}
		if hasBody {
			w.Header().Set("Connection", "close")
			// The body is not wanted: reading it must end now, not after
			// the client has sent it.
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
		refuse(w, code)
	})
}

// LimitScrapes answers 503 at once past limit scrapes being prepared,
// rather than queueing them: a scrape is cheap, so a pile-up means a
// misbehaving client. A scrape holds its slot until it starts writing its
// (pre-rendered) page: how fast the client reads is the connection's
// business (guard's deadlines), and a client that stops reading cannot
// keep a slot from the scraper. A request whose client has gone (an HTTP/2
// stream reset at once) takes no slot.
func LimitScrapes(h http.Handler, limit int) http.Handler {
	if limit <= 0 {
		return h
	}
	sem := make(chan struct{}, limit)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Err() != nil {
			return
		}
		select {
		case sem <- struct{}{}:
			sw := &slotWriter{ResponseWriter: w, release: func() { <-sem }}
			defer sw.give()
			h.ServeHTTP(sw, r)
		default:
			http.Error(w, "too many concurrent scrapes; raise --web.max-requests", http.StatusServiceUnavailable)
		}
	})
}

// slotWriter gives its scrape slot back at the first write.
type slotWriter struct {
	http.ResponseWriter
	release func()
	given   bool
}

func (s *slotWriter) give() {
	if !s.given {
		s.given = true
		s.release()
	}
}

func (s *slotWriter) Write(b []byte) (int, error) {
	s.give()
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection.
func (s *slotWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
