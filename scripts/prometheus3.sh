#!/usr/bin/env bash
# Prints the path of prometheus3: the Prometheus 3.x server that
# `make bench-rules` runs by default, built with `go install` from the same
# prometheus module version as promtool3 (scripts/install-tools.sh), without
# service discovery plugins (the benchmark uses file_sd only), into
# $(go env GOPATH)/bin/prometheus3 when missing or another version: about
# two minutes on warm Go caches (promtool3 built), 13 on cold ones. CI does
# not need it: the end-to-end test uses Debian's server of `make tools`.
set -euo pipefail
VERSION=v0.316.0
GOBIN="$(go env GOPATH)/bin"
bin="$GOBIN/prometheus3"
if ! go version -m "$bin" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/prometheus/prometheus[[:space:]]+$VERSION([[:space:]]|$)"; then
  echo "prometheus3.sh: building the Prometheus server (prometheus $VERSION, Prometheus 3.x) with go install" >&2
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  CGO_ENABLED=0 GOBIN="$tmp" go install -tags remove_all_sd \
    "github.com/prometheus/prometheus/cmd/prometheus@$VERSION" >&2
  mkdir -p "$GOBIN"
  mv "$tmp/prometheus" "$bin"
fi
echo "$bin"
