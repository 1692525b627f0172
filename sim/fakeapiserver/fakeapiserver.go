// Package fakeapiserver is a Kubernetes API server for the simulated node:
// collections of JSON objects served over real HTTP on loopback with the
// API server's list and watch protocol (resource versions, field
// selectors on the fields it is given, metadata-only answers,
// bookmarks, 410 Gone for a version older than its event log), and the
// GET and PATCH of a cluster-scoped object and of its status subresource
// (strategic merge: lists of conditions merged by type, as core/v1 Node
// declares them; a metadata.resourceVersion in the patch is a
// precondition, 409 Conflict when stale). Failures can be asked for
// (Fail: a 409, a 500, a refusal). The agent's kubeapi client talks to it
// as to a real one; the real kube-apiserver runs in podmap/apiserver's
// tests (make test-apiserver).
package fakeapiserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
)

// Object is one API object as JSON decodes it; metadata.namespace and
// metadata.name identify it.
type Object = map[string]any

// maxLog is how many events a collection keeps for watches to resume
// from; a watch from an older version gets 410 Gone, as from etcd's
// compaction.
const maxLog = 1000

type event struct {
	rv  int64
	typ string
	obj Object
}

type collection struct {
	objects map[string]Object // namespace/name -> object
	log     []event
	// oldest is the oldest version a watch may resume from: every event
	// after it is in log.
	oldest int64
	// selectable are the fields a field selector may name (the API server
	// allows only some per resource, such as spec.nodeName for pods).
	selectable []string
}

// Server is the fake API server.
type Server struct {
	srv *httptest.Server

	mu          sync.Mutex
	changed     *sync.Cond
	rv          int64
	collections map[string]*collection
	closed      bool
	// Requests counts the requests served, by method and path.
	requests map[string]int
	// fail are the answers asked for in place of the next requests.
	fail []failure
}

// failure answers the next Times requests of Method to Path with Code.
type failure struct {
	method, path string
	code, times  int
}

// Fail makes the next times requests of method to path answer code
// (409: Conflict, 500: InternalError, 403: Forbidden...) instead of
// being served.
func (s *Server) Fail(method, path string, code, times int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, failure{method, path, code, times})
}

// New starts a server with no collection.
func New() *Server {
	s := &Server{collections: map[string]*collection{}, requests: map[string]int{}}
	s.changed = sync.NewCond(&s.mu)
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is where the server listens.
func (s *Server) URL() string { return s.srv.URL }

// Client is a kubeapi client of the server.
func (s *Server) Client() (*kubeapi.Client, error) {
	return kubeapi.New(&kubeapi.Config{Host: s.srv.URL, UserAgent: "gpu-pool-exporter (simulated node)"})
}

// Close stops the server and ends every watch.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.changed.Broadcast()
	s.mu.Unlock()
	s.srv.CloseClientConnections()
	s.srv.Close()
}

// Requests returns how many requests were served per "METHOD path".
func (s *Server) Requests() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.requests))
	for k, v := range s.requests {
		out[k] = v
	}
	return out
}

// Serve makes path (such as /api/v1/pods) a collection whose field
// selectors may name the fields listed.
func (s *Server) Serve(path string, selectable ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.collections[path] == nil {
		s.collections[path] = &collection{objects: map[string]Object{}, selectable: selectable}
	}
}

func key(o Object) string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	return ns + "/" + name
}

// Set makes the collection at path hold exactly objs: objects not there
// before are added, changed ones modified, missing ones deleted, each an
// event with a resource version of its own.
func (s *Server) Set(path string, objs []Object) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collections[path]
	if c == nil {
		c = &collection{objects: map[string]Object{}}
		s.collections[path] = c
	}
	want := map[string]Object{}
	for _, o := range objs {
		want[key(o)] = o
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		o := clone(want[k])
		old, ok := c.objects[k]
		if ok && sameContent(old, o) {
			continue
		}
		typ := "ADDED"
		if ok {
			typ = "MODIFIED"
		}
		s.put(c, typ, k, o)
	}
	for k, old := range c.objects {
		if _, ok := want[k]; !ok {
			s.put(c, "DELETED", k, old)
		}
	}
	s.changed.Broadcast()
}

// Get returns a copy of the object at path with key namespace/name.
func (s *Server) Get(path, namespace, name string) (Object, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.collections[path]
	if c == nil {
		return nil, false
	}
	o, ok := c.objects[namespace+"/"+name]
	if !ok {
		return nil, false
	}
	return clone(o), true
}

// put records an event and applies it (s.mu held).
func (s *Server) put(c *collection, typ, k string, o Object) {
	s.rv++
	o = clone(o)
	md, _ := o["metadata"].(map[string]any)
	if md == nil {
		md = map[string]any{}
		o["metadata"] = md
	}
	md["resourceVersion"] = strconv.FormatInt(s.rv, 10)
	if typ == "DELETED" {
		delete(c.objects, k)
	} else {
		c.objects[k] = o
	}
	c.log = append(c.log, event{rv: s.rv, typ: typ, obj: o})
	if len(c.log) > maxLog {
		c.log = c.log[len(c.log)-maxLog:]
		c.oldest = c.log[0].rv - 1
	}
}

// Compact drops every event of every collection: watches from before now
// get 410 Gone and list again.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	for _, c := range s.collections {
		c.log, c.oldest = nil, s.rv
	}
	s.changed.Broadcast()
}

func sameContent(a, b Object) bool {
	strip := func(o Object) string {
		o = clone(o)
		if md, ok := o["metadata"].(map[string]any); ok {
			delete(md, "resourceVersion")
		}
		b, _ := json.Marshal(o)
		return string(b)
	}
	return strip(a) == strip(b)
}

func clone(o Object) Object {
	b, err := json.Marshal(o)
	if err != nil {
		panic(fmt.Sprintf("fakeapiserver: object not JSON: %v", err))
	}
	var out Object
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return out
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason, "message": msg})
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests[r.Method+" "+r.URL.Path]++
	for i := range s.fail {
		f := &s.fail[i]
		if f.times > 0 && f.method == r.Method && f.path == r.URL.Path {
			f.times--
			s.mu.Unlock()
			writeStatus(w, f.code, http.StatusText(f.code), "failure asked for by the test")
			return
		}
	}
	s.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		if c, name, _, ok := s.object(r.URL.Path); ok {
			s.getObject(w, c, name)
			return
		}
		s.get(w, r)
	case http.MethodPatch:
		s.patch(w, r)
	default:
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" is not served here")
	}
}

// selector is a parsed field selector: field=value terms.
type selector [][2]string

func parseSelector(q string, allowed []string) (selector, error) {
	var sel selector
	if q == "" {
		return nil, nil
	}
	for _, term := range strings.Split(q, ",") {
		f, v, ok := strings.Cut(term, "=")
		f = strings.TrimSuffix(f, "=")
		if !ok || !slices.Contains(allowed, f) {
			return nil, fmt.Errorf("field label not supported: %s", f)
		}
		sel = append(sel, [2]string{f, strings.TrimPrefix(v, "=")})
	}
	return sel, nil
}

func (sel selector) matches(o Object) bool {
	for _, t := range sel {
		var cur any = o
		for _, part := range strings.Split(t[0], ".") {
			m, _ := cur.(map[string]any)
			cur = m[part]
		}
		v, _ := cur.(string)
		if v != t[1] {
			return false
		}
	}
	return true
}

// metadataOnly says whether the client asked for PartialObjectMetadata.
func metadataOnly(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "as=PartialObjectMetadata")
}

func view(o Object, meta bool) Object {
	if !meta {
		return o
	}
	return Object{"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	c := s.collections[r.URL.Path]
	s.mu.Unlock()
	if c == nil {
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource "+r.URL.Path)
		return
	}
	q := r.URL.Query()
	sel, err := parseSelector(q.Get("fieldSelector"), c.selectable)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	meta := metadataOnly(r)
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		s.watch(w, r, c, sel, meta)
		return
	}
	s.mu.Lock()
	items := []Object{}
	keys := make([]string, 0, len(c.objects))
	for k := range c.objects {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if o := c.objects[k]; sel.matches(o) {
			items = append(items, view(o, meta))
		}
	}
	rv := s.rv
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"kind": "List", "apiVersion": "v1",
		"metadata": map[string]any{"resourceVersion": strconv.FormatInt(rv, 10)}, "items": items})
}

// watch streams the events after the request's resourceVersion until the
// client goes, the timeout ends the request, or the server closes.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, c *collection, sel selector, meta bool) {
	q := r.URL.Query()
	from, err := strconv.ParseInt(q.Get("resourceVersion"), 10, 64)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "a watch needs the resourceVersion of a list")
		return
	}
	timeout := 5 * time.Minute
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	deadline := time.Now().Add(timeout)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	enc := json.NewEncoder(w)
	// Wake the waiting loop when the client goes or the timeout passes.
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-r.Context().Done():
		case <-t.C:
		case <-done:
			return
		}
		s.mu.Lock()
		s.changed.Broadcast()
		s.mu.Unlock()
	}()
	for {
		// Take what is new under the lock; write it without: a slow reader
		// holds no one else up.
		s.mu.Lock()
		for !s.closed && r.Context().Err() == nil && time.Now().Before(deadline) && from >= s.rv {
			s.changed.Wait()
		}
		if s.closed || r.Context().Err() != nil || !time.Now().Before(deadline) {
			s.mu.Unlock()
			return
		}
		gone := from < c.oldest
		var out []any
		if !gone {
			for _, ev := range c.log {
				if ev.rv <= from || !sel.matches(ev.obj) {
					continue
				}
				out = append(out, map[string]any{"type": ev.typ, "object": view(ev.obj, meta)})
			}
			from = s.rv
			if len(out) == 0 && q.Get("allowWatchBookmarks") == "true" {
				out = append(out, map[string]any{"type": "BOOKMARK", "object": map[string]any{"metadata": map[string]any{"resourceVersion": strconv.FormatInt(from, 10)}}})
			}
		}
		s.mu.Unlock()
		if gone {
			_ = enc.Encode(map[string]any{"type": "ERROR", "object": map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure",
				"code": http.StatusGone, "reason": "Expired", "message": fmt.Sprintf("too old resource version: %d", from)}})
			return
		}
		for _, ev := range out {
			if err := enc.Encode(ev); err != nil {
				return
			}
		}
		if fl != nil {
			fl.Flush()
		}
	}
}

// object splits the path of a cluster-scoped object (COLLECTION/NAME) or
// of its status (COLLECTION/NAME/status) whose collection is served.
func (s *Server) object(path string) (c *collection, name string, status, ok bool) {
	p := strings.TrimSuffix(path, "/status")
	status = p != path
	i := strings.LastIndexByte(p, '/')
	if i <= 0 {
		return nil, "", false, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c = s.collections[p[:i]]
	return c, p[i+1:], status, c != nil
}

func (s *Server) getObject(w http.ResponseWriter, c *collection, name string) {
	s.mu.Lock()
	o, ok := c.objects["/"+name]
	if ok {
		o = clone(o)
	}
	s.mu.Unlock()
	if !ok {
		writeStatus(w, http.StatusNotFound, "NotFound", name+" not found")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(o)
}

// Strategic merge patch's content type, the one PATCH served here.
const strategicMergePatch = "application/strategic-merge-patch+json"

// patch applies a strategic-merge patch to a cluster-scoped object or its
// status: only status changes through /status, and only the rest without
// it, as the API server does.
func (s *Server) patch(w http.ResponseWriter, r *http.Request) {
	c, name, status, ok := s.object(r.URL.Path)
	if !ok {
		writeStatus(w, http.StatusNotFound, "NotFound", "the server could not find the requested resource "+r.URL.Path)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != strategicMergePatch {
		writeStatus(w, http.StatusUnsupportedMediaType, "UnsupportedMediaType", "the fake serves "+strategicMergePatch+" only, not "+ct)
		return
	}
	var p Object
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "the patch is not a JSON object: "+err.Error())
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := "/" + name
	o, ok := c.objects[k]
	if !ok {
		writeStatus(w, http.StatusNotFound, "NotFound", name+" not found")
		return
	}
	md, _ := o["metadata"].(map[string]any)
	if pmd, _ := p["metadata"].(map[string]any); pmd != nil {
		if want, ok := pmd["resourceVersion"].(string); ok && want != md["resourceVersion"] {
			writeStatus(w, http.StatusConflict, "Conflict", "the object has been modified; please apply your changes to the latest version and try again")
			return
		}
	}
	next := clone(o)
	for field, v := range p {
		if field == "metadata" || (field == "status") != status {
			continue // what the subresource does not write is dropped, as the API server does
		}
		next[field] = merge(next[field], v)
	}
	if !sameContent(o, next) {
		s.put(c, "MODIFIED", k, next)
		s.changed.Broadcast()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(c.objects[k])
}

// merge is a strategic merge of patch into cur: maps merge key by key
// (null deletes), a list of objects that all have a "type" merges by it
// (core/v1's conditions: patchMergeKey type), any other list is replaced.
func merge(cur, patch any) any {
	switch p := patch.(type) {
	case map[string]any:
		m, _ := cur.(map[string]any)
		out := map[string]any{}
		for k, v := range m {
			out[k] = v
		}
		for k, v := range p {
			if v == nil {
				delete(out, k)
				continue
			}
			out[k] = merge(out[k], v)
		}
		return out
	case []any:
		l, _ := cur.([]any)
		if !byType(p) || !byType(l) {
			return p
		}
		out := append([]any(nil), l...)
		for _, e := range p {
			pe := e.(map[string]any)
			i := slices.IndexFunc(out, func(x any) bool { return x.(map[string]any)["type"] == pe["type"] })
			if i < 0 {
				out = append(out, pe)
			} else {
				out[i] = merge(out[i], pe)
			}
		}
		return out
	}
	return patch
}

// byType: every element is an object with a string type.
func byType(l []any) bool {
	for _, e := range l {
		m, ok := e.(map[string]any)
		if !ok {
			return false
		}
		if _, ok := m["type"].(string); !ok {
			return false
		}
	}
	return true
}
