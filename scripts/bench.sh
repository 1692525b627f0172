#!/usr/bin/env bash
# make bench: the Go benchmarks, then a load run of the built binary on two
# simulated nodes (the built-in 8-GPU node, and 8 x 7 MIG instances with 200
# pods), printed as one markdown table, then hostile-client runs: memory
# under 8,000 slow connections (fails above the chart's 100 MiB limit), the
# scraper's latency beside a wrong-password flood, a scraper's (and the
# kubelet prober's) latency beside slow request bodies and slow bodies on the
# probe port (each fails when a scrape or probe is lost), and beside wrong
# passwords from 60,000 addresses, HTTP/2 streams held at window 0 (with and
# without basic auth), pipelines to the probe port never read, and pipelines
# of /metrics read slowly (each fails below 95% answered, a first login of
# 2 s or more, or RSS above 100 MiB), then the attacker's own choices, each
# with GOMEMLIMIT=100MiB and without: several attacks at once, a stolen
# password, the attacker on the prober's or the scraper's address, and a
# 10-minute soak of every attack with GPU faults (about 27 minutes in all;
# BENCH_ARGS="-soak-for 2m" shortens it). Run from the repository root.
#
# The node agent's memory at rest comes first (scripts/benchrest: the agent
# as the image builds it, on the fake libnvidia-ml with 8 H100s, no kubelet
# and no DCGM, started from its file as a node has it, unpacked or read from
# disk, and as the linker left it; BENCH_REST_ARGS go to it, e.g.
# BENCH_REST_ARGS="-settle 20s"); it fails make bench above 25 MiB in a
# node's states once the other runs are done.
#
# BENCHTIME (default 1s) is go test's -benchtime; BENCH_ARGS go to the load
# program (e.g. BENCH_ARGS="-scrapes 1000 -idle-samples 5"; a quick run of
# the attacks on held answers: BENCH_ARGS="-runs auth-addrs,h2-auth,h2-tls,probe-pipeline,slow-readers -attack-for 5s").
set -euo pipefail

cd "$(dirname "$0")/.."
export CGO_ENABLED=1

benchtime="${BENCHTIME:-1s}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "== Go benchmarks (-benchtime=${benchtime})"
go test -run xxx -bench . -benchmem -benchtime="${benchtime}" ./collector/ ./podmap/...

echo
echo "== the node agent at rest (built as the image builds it, on the fake libnvidia-ml)"
# As the Dockerfile builds it: what a node runs.
go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$work/gpu-pool-exporter" ./cmd/gpu-pool-exporter
go build -o "$work/benchrest" ./scripts/benchrest
# Its verdict is read after the other runs: an agent over its memory target
# fails make bench, but the load and attack figures are still printed.
rest=0
# shellcheck disable=SC2086 # BENCH_REST_ARGS is a list of flags
"$work/benchrest" -agent "$work/gpu-pool-exporter" -packages "$(go list -deps ./cmd/gpu-pool-exporter | wc -l)" ${BENCH_REST_ARGS:-} || rest=$?

echo
echo "== load run (built gpu-pool-exporter-sim, loopback)"
go build -o "$work/gpu-pool-exporter-sim" ./cmd/gpu-pool-exporter-sim
go build -o "$work/bench" ./scripts/bench
# shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
"$work/bench" -bin "$work/gpu-pool-exporter-sim" \
	-node "default 8 x H100 (built-in)=" \
	-node "8 x 7 MIG, 200 pods=scripts/bench/mig-8x7-200pods.yaml" \
	${BENCH_ARGS:-}
exit "$rest"
