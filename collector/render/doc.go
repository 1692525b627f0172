// Package render turns a State (collector/state) into the page /metrics
// serves: the native families, dcgm-exporter's families, the landing page
// and /status.json. It reads the state and never changes it; the join
// never imports this package.
//
// The files, in the order of the render, each using only those before it:
//
//	groups.go       metric groups and profiles: every family is declared
//	                with its group, which decides whether it is served
//	fields.go       the per-device field families and device labels
//	health.go       board health and DCGM health watch families
//	allocations.go  holders, device states, kubelet capacity, per-container use
//	derived.go      idle allocations, prices, fragmentation
//	metrics.go      the state collector's families, in one pass over the state
//	compat.go       dcgm-exporter's families, from the same state
//	monotonic.go    counters kept from falling across resets and reconnects
//	nodesummary.go  the lean profile's per-node folds, after monotonic.go
//	landingpage.go  the landing page's view of the state
//	render.go       Renderer: registry gathered once per state, counters kept,
//	                families folded, plain and gzip bytes and the landing page
package render
