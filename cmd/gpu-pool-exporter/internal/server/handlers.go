package server

import (
	"net/http"
	"strings"
	"time"
)

// writeStall is the longest one write of a response may wait for the client
// to read: a client that stops reading (a full TCP window, an HTTP/2 stream
// held at window 0) loses its connection or stream then, not at the
// server's WriteTimeout.
const writeStall = 5 * time.Second

// writeTimeout bounds the whole response, however its writes went.
const writeTimeout = 30 * time.Second

// writeChunk is how much of a response one write hands over, each with a
// fresh writeStall deadline: a slow but moving client is served to the end.
const writeChunk = 32 << 10

// refuseUnservable answers at once, before any slot, login or handler, a
// request that no endpoint serves: a method other than GET and HEAD (405,
// with Allow), or a request with a body (413). A body is never read: the
// connection is closed after the answer, so a client sending it slowly
// holds neither a scrape slot nor a connection that cannot be evicted
// (net/http would otherwise drain up to 256 KiB of it, up to the read timeout).
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
		code, msg := 0, ""
		switch {
		case r.Method != http.MethodGet && r.Method != http.MethodHead:
			w.Header().Set("Allow", "GET, HEAD")
			code, msg = http.StatusMethodNotAllowed, "method "+r.Method+" not allowed: this endpoint answers GET and HEAD"
		case hasBody:
			code, msg = http.StatusRequestEntityTooLarge, "this endpoint takes no request body"
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
		http.Error(w, msg, code)
	})
}

// LimitScrapes answers 503 at once past limit scrapes being prepared,
// rather than queueing them: a scrape is cheap, so a pile-up means a
// misbehaving client. A scrape holds its slot until it starts writing its
// (pre-rendered) page: how fast the client reads is the connection's
// business, bounded by writeStall, and a client that stops reading cannot
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
			sw := &slotWriter{ResponseWriter: w, rc: http.NewResponseController(w), release: func() { <-sem },
				end: time.Now().Add(writeTimeout)}
			defer sw.done()
			h.ServeHTTP(sw, r)
		default:
			http.Error(w, "too many concurrent scrapes; raise --web.max-requests", http.StatusServiceUnavailable)
		}
	})
}

// slotWriter gives its scrape slot back at the first write, and writes in
// chunks, each with a writeStall deadline.
type slotWriter struct {
	http.ResponseWriter
	rc       *http.ResponseController
	release  func()
	released bool
	end      time.Time // no write deadline goes past this (the server's WriteTimeout)
	deadline bool      // a write deadline was set
}

func (s *slotWriter) done() {
	if !s.released {
		s.released = true
		s.release()
	}
	if s.deadline {
		s.setDeadline() // the last buffered bytes are flushed after the handler
	}
}

// setDeadline gives the next write writeStall, never past the response's end.
func (s *slotWriter) setDeadline() {
	d := time.Now().Add(writeStall)
	if d.After(s.end) {
		d = s.end
	}
	if s.rc.SetWriteDeadline(d) == nil {
		s.deadline = true
	}
}

func (s *slotWriter) Write(b []byte) (int, error) {
	if !s.released {
		s.released = true
		s.release()
	}
	n := 0
	for len(b) > 0 {
		c := b[:min(len(b), writeChunk)]
		s.setDeadline()
		m, err := s.ResponseWriter.Write(c)
		n += m
		if err != nil {
			return n, err
		}
		b = b[len(c):]
	}
	return n, nil
}

// Unwrap lets http.ResponseController reach the connection.
func (s *slotWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
