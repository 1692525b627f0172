# The README's two commands: `make run` and `make test`.
export CGO_ENABLED := 1
# go-nvml's cgo code prints ~150 lines of deprecation warnings without this;
# flags of your own in CGO_CFLAGS are kept.
export CGO_CFLAGS := $(strip $(filter-out -Wno-deprecated-declarations,$(CGO_CFLAGS)) -Wno-deprecated-declarations)
export PATH := $(shell go env GOPATH)/bin:$(PATH)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/prometheus/common/version.Version=$(VERSION) -X github.com/prometheus/common/version.Revision=$(REVISION)

.PHONY: test test-matrix test-thanos test-apiserver tools vet lint build run bench bench-rules bench-rules-budget generate

# Test binaries run at once. Most packages spend their time waiting on
# processes they started (the exporter, promtool, Prometheus, helm), not on
# the CPU: more of them at once than go test's default of one per core.
TEST_PACKAGES ?= 6
# Parallel tests run at once within a package: the configuration matrix's
# cases and the tests of the real binary wait on the exporter's one-second
# samples, so more of them than go test's default of one per core.
TEST_PARALLEL ?= 8

## test: everything CI runs: tools, vet, lint, gofmt, race tests (unit, promtool, helm, end to end,
## generated files up to date)
test: tools vet lint
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	@# The binaries the tests run, built once (GPE_TEST_BINARY: the agent,
	@# GPE_TEST_SIM_BINARY: the simulated node's, GPE_TEST_GPUPOOL_BINARY: the
	@# command for people) rather than by each package that starts one: plain
	@# builds, stamped by Go from the checkout as a user's would be (whatever
	@# GOFLAGS says of -buildvcs).
	bin="$$(mktemp -d)" && trap 'rm -rf "$$bin"' EXIT && \
	go build -buildvcs=auto -o "$$bin/" ./cmd/gpu-pool-exporter ./cmd/gpu-pool-exporter-sim ./cmd/gpupool && \
	GPE_TEST_BINARY="$$bin/gpu-pool-exporter" GPE_TEST_SIM_BINARY="$$bin/gpu-pool-exporter-sim" GPE_TEST_GPUPOOL_BINARY="$$bin/gpupool" \
	go test -race -count=1 -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) ./...

## test-matrix: the whole configuration matrix (every model x MIG layout x sharing x profile x compat x DCGM x driver branch x board, about 23,000 pages); make test runs an all-pairs sample
test-matrix:
	GPE_MATRIX=full go test -count=1 -timeout 4h -run 'TestConfigurationMatrix' ./agent/

tools:
	./scripts/install-tools.sh

vet:
	go vet ./...

## lint: golangci-lint (pinned by scripts/install-tools.sh) with .golangci.yml
lint: tools
	golangci-lint run ./...

## generate: every generated file and copy (GMP rules, shard/global layers, promtool tests from real pages, dashboards, the Helm
## chart's files/, the kustomize rule objects, the built-in dcgm-exporter counters file), in that order; a second run changes nothing.
## `make test` fails while one is stale (scripts/generate's test). With DCGM_SRC and DCGM_EXPORTER_SRC (checkouts of
## NVIDIA/DCGM and NVIDIA/dcgm-exporter at the tags scripts/dcgmfields.sh names) it also rewrites the DCGM field table.
generate:
	./scripts/dcgmfields.sh
	go run ./scripts/generate

## build: the three binaries (gpu-pool-exporter: the node agent; gpupool: the command for people;
## gpu-pool-exporter-sim: the agent on a simulated node) in the checkout's top directory
build:
	go build -ldflags "$(LDFLAGS)" -o . ./cmd/gpu-pool-exporter ./cmd/gpupool ./cmd/gpu-pool-exporter-sim

## run: build the exporter on a simulated node (gpu-pool-exporter-sim), then run it (Ctrl-C stops it); ARGS="--web.listen-address=:9948" adds flags
# exec: the process is the exporter itself, not a shell or `go run` above it,
# so Ctrl-C and kill reach it.
# The build's own output (module downloads on a fresh machine) is shown only
# when it fails.
# A quick build, as a try-out wants it: no optimisation or inlining
# (-N -l) and no debug information, and only what the simulated node runs:
# no go-dcgm (nodcgm: its DCGM is sim/fakedcgm), Go's own resolver and user
# lookup (netgo, osusergo) instead of their cgo builds. On a fresh machine
# the standard library's HTTP and TLS compile while the modules download.
# The binary spends more CPU per sample, which a try-out does not notice;
# `make build` and the image build it optimised. Linked by Go's own linker
# (-linkmode=internal), not gcc as go-nvml's link flags ask: the link is
# the build's last step, alone on one core (a rebuild that only links
# again: 1.2-1.4 s against 2.0-2.2 s with gcc); those
# flags (--export-dynamic, unresolved NVML symbols left to the loader)
# serve the libnvidia-ml that a simulated node never loads.
# scripts/firstpage.sh measures a fresh clone's first page
# (docs/performance.md).
RUN_BUILD_FLAGS := -tags nodcgm,netgo,osusergo -gcflags "all=-N -l -dwarf=false" -ldflags "$(LDFLAGS) -s -w -linkmode=internal"
run:
	@echo "make run: building ./gpu-pool-exporter-sim (about a minute on a fresh machine)"
	@log=$$(mktemp); { \
		go build $(RUN_BUILD_FLAGS) net/http & warm=$$!; \
		go list $(RUN_BUILD_FLAGS) -deps ./cmd/gpu-pool-exporter-sim >/dev/null; listed=$$?; \
		wait $$warm && [ $$listed = 0 ] && \
		go build $(RUN_BUILD_FLAGS) -o gpu-pool-exporter-sim ./cmd/gpu-pool-exporter-sim; \
	} >$$log 2>&1 || { cat $$log; rm -f $$log; exit 1; }; rm -f $$log
	@exec ./gpu-pool-exporter-sim --log.format=console $(ARGS)

## bench: Go benchmarks, the agent's memory at rest on the fake driver, and load and attack runs against gpu-pool-exporter-sim; prints one table each
bench:
	./scripts/bench.sh

## bench-rules: the shipped rules in a real Prometheus (3.x, built on first use) scraping N synthetic
## GPU nodes and kube-state-metrics for ten pools; prints each group's evaluation time, the total per
## cycle, per node and head series. N=1000 needs about 3 GiB of memory and 12 minutes on 2 cores.
## PROMETHEUS=path: another server (docs/performance.md: "Rule evaluation at fleet size").
N ?= 200
RULES ?= alerts/gpu-pool-exporter.rules.yml
# The server: Prometheus 3.x built by scripts/prometheus3.sh (on first use);
# PROMETHEUS=prometheus for Debian's 2.42 of `make tools`.
PROMETHEUS ?=
BENCH_RULES_ARGS ?=
bench-rules:
	@work="$$(mktemp -d)" && trap 'rm -rf "$$work"' EXIT && \
	prom="$(PROMETHEUS)" && { [ -n "$$prom" ] || prom="$$(./scripts/prometheus3.sh)"; } && \
	go build -o "$$work/gpu-pool-exporter-sim" ./cmd/gpu-pool-exporter-sim && \
	go build -o "$$work/bench-rules" ./scripts/benchrules && \
	"$$work/bench-rules" -n $(N) -exporter "$$work/gpu-pool-exporter-sim" -rules $(RULES) -prometheus "$$prom" $(BENCH_RULES_ARGS)

## bench-rules-budget: the rules' cost against its budget, one run after another on an otherwise idle
## machine (about 45 minutes, the last run 12 GiB of memory): a shard of 1,000 nodes of a 10,000-node cluster within 7% of its 15 s on
## Prometheus 3.x and within 10% on Debian's 2.42, a shard of 2,000 within 10% on 3.x (each by wall
## time and by rule CPU), the global layer at 30,000 nodes within 10% of its minute. Fails if any is over.
SHARD_RULES := alerts/gpu-pool-exporter.shard.rules.yml
GLOBAL_RULES := alerts/gpu-pool-exporter.global.rules.yml
bench-rules-budget:
	@failed="" && \
	{ $(MAKE) --no-print-directory bench-rules N=1000 RULES=$(SHARD_RULES) BENCH_RULES_ARGS="-cycles 3 -cluster-nodes 10000 -budget 7" || failed="$$failed shard-1000-3.x"; } && \
	{ $(MAKE) --no-print-directory bench-rules N=1000 RULES=$(SHARD_RULES) PROMETHEUS=prometheus BENCH_RULES_ARGS="-cycles 3 -cluster-nodes 10000 -budget 10" || failed="$$failed shard-1000-2.42"; } && \
	{ $(MAKE) --no-print-directory bench-rules N=2000 RULES=$(SHARD_RULES) BENCH_RULES_ARGS="-cycles 3 -cluster-nodes 10000 -budget 10" || failed="$$failed shard-2000-3.x"; } && \
	{ $(MAKE) --no-print-directory bench-rules N=30000 RULES=$(GLOBAL_RULES) BENCH_RULES_ARGS="-shard-rules=$(SHARD_RULES) -interval 60s -cycles 2 -timeout 60m -budget 10" || failed="$$failed global-30000-3.x"; } && \
	if [ -n "$$failed" ]; then echo "bench-rules-budget: over budget or failed:$$failed" >&2; exit 1; fi

## test-thanos: the sharded rules on Thanos (two Prometheus shards with sidecars, Query, Ruler) against
## the flat rules on one Prometheus (docs/sharded.md). Not part of `make test`: the first run builds
## Thanos (scripts/thanos.sh, 10-50 minutes and a Go toolchain download); later runs take about 3 minutes.
test-thanos:
	@thanos="$$(./scripts/thanos.sh)" && THANOS="$$thanos" go test -count=1 -v -timeout 20m -run TestGlobalRulesOnThanos ./alerts/thanos/

## test-apiserver: the pod metadata watch (pod UIDs and labels for --compat.dcgm-exporter.kubernetes-enable-pod-*),
## DRA (claims and ResourceSlices as NVIDIA's DRA driver publishes them, device taints, the dra_* labels) and the
## node condition (--node-condition, its RBAC and the documented ValidatingAdmissionPolicy) against a real
## kube-apiserver and etcd on loopback, and the exporter's pages with them. Not part of `make test`:
## the first run builds both from their module source into .tools/ (scripts/apiserver.sh, about 25 minutes on two
## busy cores); later runs take about a minute.
test-apiserver:
	@tools="$$(./scripts/apiserver.sh)" && APISERVER_TOOLS="$$tools" go test -count=1 -v -timeout 15m ./podmap/apiserver/
