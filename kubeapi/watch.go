package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ListWatch names what a list-watch reads: a collection (Path, such as
// /api/v1/pods or /apis/resource.k8s.io/v1/resourceslices) narrowed by
// selectors, whole objects or their metadata alone.
type ListWatch struct {
	Path          string
	FieldSelector string
	LabelSelector string
	// Metadata asks for PartialObjectMetadata: the API server sends each
	// object's metadata only (same RBAC verbs as the objects).
	Metadata bool
}

// Accept headers: the metadata-only forms name the list and item kinds the
// API server converts to; plain JSON as the fallback of an old server.
const (
	acceptJSON         = "application/json"
	acceptMetadataList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
	acceptMetadata     = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
)

// A Sink receives what a list-watch sees, in order, from one goroutine.
type Sink interface {
	// Replace hands over the whole collection after each (re)list.
	Replace(items []json.RawMessage)
	// Upsert is an object added or changed.
	Upsert(obj json.RawMessage)
	// Delete is an object deleted.
	Delete(obj json.RawMessage)
}

// WatchOptions tune Run; the zero value is the defaults.
type WatchOptions struct {
	// OnSynced is called after the first list has been handed to Replace.
	OnSynced func()
	// OnError is told of each failure (a list or watch refused, a
	// connection lost); Run goes on with backoff.
	OnError func(error)
	// BackoffMin and BackoffMax bound the wait between failed attempts
	// (default 1s and 30s, with jitter).
	BackoffMin, BackoffMax time.Duration
	// WatchTimeout is how long one watch request lasts before the API
	// server ends it and Run resumes from the last version (default a
	// random 5-10 minutes, as client-go's reflector).
	WatchTimeout time.Duration
	// PageSize is the list's page (limit); default 500.
	PageSize int
}

// listMeta is the part of a list's answer Run reads beside the items.
type listMeta struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
		Continue        string `json:"continue"`
	} `json:"metadata"`
	Items []json.RawMessage `json:"items"`
}

// objectVersion is the resourceVersion of one object.
type objectVersion struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
}

// event is one watch event.
type event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// errExpired says the watch's resourceVersion is too old: list again.
var errExpired = errors.New("the watched version expired (410 Gone): listing again")

// Run lists lw and watches it until ctx is done, handing everything to
// sink: a list, then watches that resume from the last version seen; a
// version that expired (410) lists again; any other failure is retried
// with backoff. Nothing blocks the caller's other work: Run is meant for a
// goroutine of its own.
func (c *Client) Run(ctx context.Context, lw ListWatch, sink Sink, opt WatchOptions) {
	if opt.BackoffMin <= 0 {
		opt.BackoffMin = time.Second
	}
	if opt.BackoffMax < opt.BackoffMin {
		opt.BackoffMax = max(30*time.Second, opt.BackoffMin)
	}
	if opt.PageSize <= 0 {
		opt.PageSize = 500
	}
	synced := false
	backoff := opt.BackoffMin
	fail := func(err error) bool {
		if opt.OnError != nil && ctx.Err() == nil {
			opt.OnError(err)
		}
		wait := backoff/2 + rand.N(backoff/2+1) //nolint:gosec // jitter, not a secret
		backoff = min(2*backoff, opt.BackoffMax)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
			return true
		}
	}
	for ctx.Err() == nil {
		rv, err := c.list(ctx, lw, sink, opt.PageSize)
		if err != nil {
			if !fail(fmt.Errorf("listing %s: %w", lw.Path, err)) {
				return
			}
			continue
		}
		if !synced {
			synced = true
			if opt.OnSynced != nil {
				opt.OnSynced()
			}
		}
		backoff = opt.BackoffMin
		for ctx.Err() == nil {
			next, progressed, err := c.watch(ctx, lw, sink, rv, opt.WatchTimeout)
			rv = next
			if progressed {
				backoff = opt.BackoffMin
			}
			if errors.Is(err, errExpired) {
				break
			}
			if err != nil {
				if !fail(fmt.Errorf("watching %s: %w", lw.Path, err)) {
					return
				}
			}
		}
	}
}

// list reads the whole collection, page by page, hands it to sink and
// returns the version to watch from.
func (c *Client) list(ctx context.Context, lw ListWatch, sink Sink, page int) (string, error) {
	var items []json.RawMessage
	cont := ""
	accept := acceptJSON
	if lw.Metadata {
		accept = acceptMetadataList
	}
	for {
		q := lw.query()
		q.Set("limit", strconv.Itoa(page))
		if cont != "" {
			q.Set("continue", cont)
		}
		var l listMeta
		if err := c.Get(ctx, lw.Path, q, accept, &l); err != nil {
			return "", err
		}
		items = append(items, l.Items...)
		if l.Metadata.Continue == "" {
			sink.Replace(items)
			return l.Metadata.ResourceVersion, nil
		}
		cont = l.Metadata.Continue
	}
}

// watch watches from rv until the API server ends the request, an error,
// or ctx: the last version seen, whether an event arrived, and why it
// ended (nil: the server's timeout).
func (c *Client) watch(ctx context.Context, lw ListWatch, sink Sink, rv string, timeout time.Duration) (string, bool, error) {
	if timeout <= 0 {
		timeout = 5*time.Minute + rand.N(5*time.Minute) //nolint:gosec // spreads the watches of many nodes
	}
	q := lw.query()
	q.Set("watch", "true")
	q.Set("allowWatchBookmarks", "true")
	q.Set("resourceVersion", rv)
	q.Set("timeoutSeconds", strconv.Itoa(int(timeout/time.Second)))
	accept := acceptJSON
	if lw.Metadata {
		accept = acceptMetadata
	}
	// A connection that stops answering without closing ends here too.
	wctx, cancel := context.WithTimeout(ctx, timeout+30*time.Second)
	defer cancel()
	resp, err := c.request(wctx, http.MethodGet, lw.Path, q, accept, "", nil)
	if err != nil {
		if IsStatus(err, http.StatusGone) {
			return rv, false, errExpired
		}
		return rv, false, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	progressed := false
	for {
		var ev event
		if err := dec.Decode(&ev); err != nil {
			if ctx.Err() != nil || wctx.Err() != nil {
				return rv, progressed, nil
			}
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return rv, progressed, nil
			}
			return rv, progressed, err
		}
		if ev.Type == "ERROR" {
			var st status
			if json.Unmarshal(ev.Object, &st) == nil && st.Code == http.StatusGone {
				return rv, progressed, errExpired
			}
			return rv, progressed, &StatusError{Code: st.Code, Reason: st.Reason, Message: st.Message}
		}
		var v objectVersion
		if err := json.Unmarshal(ev.Object, &v); err != nil {
			return rv, progressed, fmt.Errorf("a %s event that is not an object: %w", ev.Type, err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED":
			sink.Upsert(ev.Object)
		case "DELETED":
			sink.Delete(ev.Object)
		case "BOOKMARK":
		default:
			return rv, progressed, fmt.Errorf("unknown watch event type %q", ev.Type)
		}
		if v.Metadata.ResourceVersion != "" {
			rv = v.Metadata.ResourceVersion
		}
		progressed = true
	}
}

func (lw ListWatch) query() url.Values {
	q := url.Values{}
	if lw.FieldSelector != "" {
		q.Set("fieldSelector", lw.FieldSelector)
	}
	if lw.LabelSelector != "" {
		q.Set("labelSelector", lw.LabelSelector)
	}
	return q
}
