// Package kubeapi is the agent's client of the Kubernetes API server: the
// few calls it makes (list and watch a collection, whole objects or their
// metadata alone; patch an object), over net/http and encoding/json.
//
// The agent's other API use is tiny, and client-go with apimachinery would
// be a quarter of its binary and of its memory at rest (the whole binary is
// resident: docs/performance.md), so it speaks the protocol itself: the
// list-watch of client-go's reflector (list, watch from the list's version
// with bookmarks, resume from the last version, list again on 410 Gone,
// backoff with jitter), in-cluster service accounts (the token file read
// again as it rotates) and kubeconfig files as kubectl reads them (paths
// relative to the file; exec plugins refused with what to use instead).
//
// Files, in the order a client uses them: config.go (where the API server
// is, who the client is), client.go (requests, errors, patch), watch.go
// (list-watch into a Sink).
package kubeapi
