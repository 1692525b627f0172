// Package collector is the orchestration of the exporter: it takes one
// sample of the node, joins it with who holds which device, derives the
// gauges no source gives, and renders the page that /metrics serves.
//
// The flow, once per --collect-interval, one way from top to bottom:
//
//	sources    nvmlsampler (NVML)   dcgm   xid (events)   podmap (kubelet)   procs (/proc, CRI)
//	              │                  │       │                 │                  │
//	sample     sample.NodeSample <───┘       │                 │                  │
//	           (dcgmmerge.go)                │                 │                  │
//	              │                          │                 │                  │
//	state      State: allocations.go <───────┼─────────────────┘                  │
//	                  usage.go <─────────────┼────────────────────────────────────┘
//	                  derived.go (fragmentation: idle, prices, free capacity)
//	                  XID counts <───────────┘
//	              │
//	render     registry Gather (metrics.go, health.go, compat.go, groups.go)
//	              │
//	           monotonic.go (counters never fall) -> nodesummary.go (lean folds)
//	              │
//	page       Page: plain and gzip bytes, landing page (landingpage.go), swapped in atomically
//
// Sources. Each data source is a subpackage that runs on its own and is
// read without blocking: nvmlsampler (NVML), dcgm (DCGM's host engine),
// xid (NVML's event set: a true counter of XID errors; DCGM's last XID
// reaches it straight from the DCGM source), procs (per-process
// accounting of shared GPUs: /proc and the container runtime). The
// kubelet's PodResources client is podmap/ at the top of the tree, as
// the project's layout names it: it serves other tools too.
//
// Sample. sample is the data model every source fills and the renderer
// reads; it belongs to no source. DCGM's values are merged into the
// NVML sample before anything else reads it (dcgmmerge.go), one way.
//
// State. exporter.go's SampleOnce joins the sample with the kubelet's
// allocations (allocations.go) and the per-process usage (usage.go), and
// computes the derived gauges (derived.go, with idle windows, prices and
// fragmentation from the fragmentation subpackage). The result is one
// immutable State.
//
// Render. A registry whose collector reads that State (metrics.go,
// health.go, the dcgm-exporter families of compat.go, the switches of
// groups.go) is gathered once per sample; monotonic.go keeps every
// counter from falling across resets and reconnects, and nodesummary.go
// folds the families the lean profile serves per node.
//
// Page. The encoded bytes (plain and gzip) and the landing page
// (landingpage.go, drawn by the status subpackage) are swapped in
// atomically. /metrics serves those bytes: no NVML, DCGM or kubelet call
// ever happens on the scrape path.
//
// Assembly. assemble.go builds all of it from the node's Sources (the
// driver's libraries, the kubelet's socket, the host's process tree) and one
// NodeConfig: the command, alerts/pages and the tests assemble the exporter
// the same way. The command takes the Sources from the real node, or with
// --simulate from the simulation wing (sim/), which no package here imports.
package collector
