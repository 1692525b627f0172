#!/usr/bin/env bash
# Regenerates collector/render/dcgmfields.go (every DCGM field name a
# dcgm-exporter counters file may hold) with scripts/dcgmfields, from:
#   DCGM_SRC           a checkout of github.com/NVIDIA/DCGM at $DCGM_TAG
#   DCGM_EXPORTER_SRC  a checkout of github.com/NVIDIA/dcgm-exporter at $EXPORTER_TAG
# go-dcgm's copy of dcgm_fields.h at the version go.mod pins (module
# cache), and scripts/dcgmfields/later-names.csv (names of later DCGM
# releases known only from release notes, each with its source). `make generate` runs it; without the two checkouts it keeps the
# committed table and says how to regenerate it (TestDCGMFieldNames checks the
# table against go-dcgm's header in every `make test`).
set -euo pipefail
DCGM_TAG=v4.6.0
DCGM_COMMIT=51b65ccebf9d61e6593713a7d6b68e594d9d7975
# dcgm-exporter 4.6.0-4.8.3: the commit its release PR (#711) links to;
# internal/pkg/counters there names DCGM_EXP_XID_ERRORS_TOTAL and
# DCGM_EXP_CLOCK_EVENTS_TOTAL.
EXPORTER_TAG=4.6.0-4.8.3
EXPORTER_COMMIT=7ad58324b4447b64dc3dedf946b889b648b7f476
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
  -later scripts/dcgmfields/later-names.csv \
  -exporter "$DCGM_EXPORTER_SRC" -exporter-version "$EXPORTER_TAG (commit $EXPORTER_COMMIT)"
