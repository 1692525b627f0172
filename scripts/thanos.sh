#!/usr/bin/env bash
# Prints the path of a Thanos binary for `make test-thanos`, building it on
# first use into $(go env GOPATH)/bin/thanos-$VERSION (outside the repository).
#
# Thanos cannot be `go install`ed (its go.mod has replace directives) and
# needs a newer Go than this repository's go.mod: the module source is
# downloaded from the Go module proxy, copied out of the read-only module
# cache and built in the copy with GOTOOLCHAIN=$TOOLCHAIN. A cold build takes
# 10-50 minutes on two busy cores and gives a ~130 MB binary; later calls only
# print the path. THANOS_BIN=path skips the build and prints that path.
set -euo pipefail
VERSION=v0.42.5
TOOLCHAIN=go1.27.3
# Thanos' own build tags (.promu.yml): without slicelabels, Thanos Query
# panics decoding the label sets of its endpoints.
TAGS=slicelabels,netgo
if [ -n "${THANOS_BIN:-}" ]; then
  echo "$THANOS_BIN"
  exit 0
fi
GOBIN="$(go env GOPATH)/bin"
bin="$GOBIN/thanos-$VERSION"
if ! go version -m "$bin" 2>/dev/null | grep -q -- "-tags=$TAGS"; then
  echo "thanos.sh: building Thanos $VERSION with $TOOLCHAIN into $bin (10-50 minutes on a cold machine)" >&2
  tmp="$(mktemp -d)"
  trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
  # A module of its own, so that this repository's go.mod is not touched.
  (cd "$tmp" && go mod init thanosfetch >/dev/null 2>&1)
  # The download runs under $TOOLCHAIN too: Go refuses to extract a module
  # that needs a newer Go than the one running.
  json="$(cd "$tmp" && GOTOOLCHAIN="$TOOLCHAIN" GOFLAGS=-mod=mod go mod download -json "github.com/thanos-io/thanos@$VERSION")" || true
  dir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    echo "thanos.sh: go mod download did not give the source of github.com/thanos-io/thanos@$VERSION:" >&2
    printf '%s\n' "$json" >&2
    exit 1
  fi
  cp -R "$dir" "$tmp/src"
  chmod -R u+w "$tmp/src"
  (cd "$tmp/src" && GOTOOLCHAIN="$TOOLCHAIN" CGO_ENABLED=0 GOFLAGS=-mod=mod go build -tags "$TAGS" -o "$tmp/thanos" ./cmd/thanos) >&2
  mkdir -p "$GOBIN"
  mv "$tmp/thanos" "$bin"
fi
echo "$bin"
