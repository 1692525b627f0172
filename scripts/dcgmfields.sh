#!/usr/bin/env bash
# Regenerates collector/render/dcgmfields.go (every DCGM field name a
# dcgm-exporter counters file may hold) with scripts/dcgmfields, from:
#   DCGM_SRC           a checkout of github.com/NVIDIA/DCGM at $DCGM_TAG
#   DCGM_EXPORTER_SRC  a checkout of github.com/NVIDIA/dcgm-exporter at $EXPORTER_TAG
# and go-dcgm's copy of dcgm_fields.h at the version go.mod pins (module
# cache). `make generate` runs it; without the two checkouts it keeps the
# committed table and says how to regenerate it (TestDCGMFieldNames checks the
# table against go-dcgm's header in every `make test`).
set -euo pipefail
DCGM_TAG=v4.6.0
DCGM_COMMIT=51b65ccebf9d61e6593713a7d6b68e594d9d7975
EXPORTER_TAG=4.5.3-4.8.2
EXPORTER_COMMIT=691c92762eb551313c825f6efe4ceeee20982801
out=collector/render/dcgmfields.go
if [ -z "${DCGM_SRC:-}" ] || [ -z "${DCGM_EXPORTER_SRC:-}" ]; then
  echo "dcgmfields.sh: keeping $out; to regenerate it, set DCGM_SRC to a checkout of NVIDIA/DCGM at $DCGM_TAG and DCGM_EXPORTER_SRC to one of NVIDIA/dcgm-exporter at $EXPORTER_TAG" >&2
  exit 0
fi
# A checkout that is a git work tree must be at the pinned commit: the
# output cites it.
for pair in "$DCGM_SRC:$DCGM_COMMIT" "$DCGM_EXPORTER_SRC:$EXPORTER_COMMIT"; do
  dir="${pair%:*}" want="${pair##*:}"
  if got="$(git -C "$dir" rev-parse HEAD 2>/dev/null)" && [ "$got" != "$want" ]; then
    echo "dcgmfields.sh: $dir is at $got, not $want" >&2
    exit 1
  fi
done
godcgm="$(go list -m -f '{{.Dir}}' github.com/NVIDIA/go-dcgm)"
godcgm_version="$(go list -m -f '{{.Version}}' github.com/NVIDIA/go-dcgm)"
go run ./scripts/dcgmfields -o "$out" \
  -dcgm "$DCGM_SRC" -dcgm-version "$DCGM_TAG (commit $DCGM_COMMIT)" \
  -go-dcgm "$godcgm" -go-dcgm-version "$godcgm_version" \
  -exporter "$DCGM_EXPORTER_SRC" -exporter-version "$EXPORTER_TAG (commit $EXPORTER_COMMIT)"
