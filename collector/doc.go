// Package collector is the orchestration of the exporter: it takes one
// sample of the node, joins it with who holds which device, derives the
// gauges no source gives, and renders the page that /metrics serves.
//
// The flow, once per --collect-interval, one way from top to bottom, each
// package importing only those above it:
//
//	sources    nvmlsampler (NVML)   dcgm   xid (events)   podmap (kubelet)   procs (/proc, CRI)
//	              │                  │       │                 │                  │
//	sample     sample.NodeSample     │       │                 │                  │
//	              │                  │       │                 │                  │
//	state      Joiner.Join           │       │                 │                  │
//	              DCGM merge <───────┘       │                 │                  │
//	              allocations <──────────────┼─────────────────┘                  │
//	              usage <────────────────────┼────────────────────────────────────┘
//	              derived (fragmentation)    │
//	              XID counts <───────────────┘
//	              │  one immutable state.State
//	render     Renderer.Render: registry gathered once (native and dcgm-exporter
//	              │  families) -> counters never fall -> node_summary folds
//	              │  -> plain and gzip bytes, landing page
//	page       Exporter: the page swapped in atomically, served by ServeHTTP
//
// Sources. Each data source is a subpackage that runs on its own and is
// read without blocking: nvmlsampler (NVML), dcgm (DCGM's host engine),
// xid (NVML's event set: a true counter of XID errors; DCGM's last XID
// reaches it straight from the DCGM source), procs (per-process
// accounting of shared GPUs: /proc and the container runtime). The
// kubelet's PodResources client is podmap/ at the top of the tree, as
// the project's layout names it: it serves other tools too.
//
// Sample. sample is the data model every source fills, with the helpers
// every reader of a sample shares (its schedulable units, their health);
// it belongs to no source.
//
// State. state joins the sample with DCGM's values (merged into the sample
// before anything else reads it), the kubelet's allocations, the
// per-process usage, the derived gauges (with idle windows, prices and
// fragmentation from the fragmentation subpackage) and the XID counts:
// one immutable State per sample. It renders nothing.
//
// Render. render gathers a registry whose collector reads that State (the
// native families, the dcgm-exporter families, the groups that switch
// them) once per sample, keeps every counter from falling across resets
// and reconnects, folds the families the lean profile serves per node,
// and encodes the page with the landing page (drawn by the status
// subpackage).
//
// This package's files, each using only those before it:
//
//	exporter.go  Exporter: the sampling loop (sample, join, render), the page
//	             swapped in atomically, Ready, Alive and ServeHTTP, which
//	             serves those bytes: no NVML, DCGM or kubelet call ever
//	             happens on the scrape path
//	assemble.go  Assemble builds all of it from the node's Sources (the
//	             driver's libraries, the kubelet's socket, the host's
//	             process tree) and one NodeConfig: the agent, alerts/pages
//	             and the tests assemble the exporter the same way. The agent
//	             takes the Sources from the real node, or, in
//	             gpu-pool-exporter-sim, from the simulation wing (sim/), which
//	             no package here imports.
package collector
