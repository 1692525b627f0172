#!/usr/bin/env bash
# Prints the directory holding kube-apiserver and etcd for `make test-apiserver`,
# building them on first use into .tools/apiserver-$K8S_VERSION-etcd-$ETCD_VERSION/
# (ignored by git) from the module source the Go module proxy serves.
#
# Neither can be `go install`ed: k8s.io/kubernetes replaces its staging modules
# (k8s.io/api, client-go, ...) by directories that the module zip leaves out,
# and go.etcd.io/etcd/server/v3 replaces its sibling modules by ../ paths. The
# source is copied out of the read-only module cache, each of those replace
# directives is swapped for the published module of the same release
# (k8s.io/X v0.MINOR.PATCH for Kubernetes v1.MINOR.PATCH; etcd's api, client
# and pkg modules at the server's own version) and built in the copy. A cold
# build takes 5-20 minutes on two busy cores; later calls only print the path.
# APISERVER_TOOLS=dir skips the build and prints dir (it must hold both).
set -euo pipefail
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
# The staging modules of Kubernetes v1.X.Y are published as v0.X.Y.
STAGING_VERSION="v0.${K8S_VERSION#v1.}"
TOOLCHAIN="${APISERVER_TOOLCHAIN:-local}"

if [ -n "${APISERVER_TOOLS:-}" ]; then
  echo "$APISERVER_TOOLS"
  exit 0
fi
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$root/.tools/apiserver-$K8S_VERSION-etcd-$ETCD_VERSION"
if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
  echo "$out"
  exit 0
fi

start=$(date +%s)
echo "apiserver.sh: building kube-apiserver $K8S_VERSION and etcd $ETCD_VERSION into $out (5-20 minutes on a cold machine)" >&2
tmp="$(mktemp -d)"
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
# Kubernetes' source carries a go.work for its staging directories.
export GOWORK=off
# A module of its own, so that this repository's go.mod is not touched.
(cd "$tmp" && go mod init apiserverfetch >/dev/null 2>&1)

# source MODULE VERSION: the module's source directory in the module cache.
source_dir() {
  local json dir
  json="$(cd "$tmp" && GOTOOLCHAIN="$TOOLCHAIN" GOFLAGS=-mod=mod go mod download -json "$1@$2")" || true
  dir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    echo "apiserver.sh: go mod download did not give the source of $1@$2:" >&2
    printf '%s\n' "$json" >&2
    exit 1
  fi
  printf '%s\n' "$dir"
}

# unreplace DIR VERSION: every replace directive of DIR/go.mod that points at
# a local directory becomes a requirement of the published module at VERSION.
unreplace() {
  local dir="$1" version="$2" mod required
  # The modules the go.mod requires, read once (no grep -q in a pipe: under
  # pipefail its early exit fails the pipe).
  required="$(cd "$dir" && go mod edit -json | awk '/"Require"/{r=1} /"Exclude"|"Replace"/{r=0} r && /"Path"/{gsub(/[",]/, "", $2); print $2}')"
  for mod in $(cd "$dir" && go mod edit -json | sed -n '/"Replace": \[/,/^\t\]/p' |
    awk '/"Old"/{getline; gsub(/[",]/, "", $2); old=$2} /"New"/{getline; gsub(/[",]/, "", $2); if ($2 ~ /^\./) print old}'); do
    if printf '%s\n' "$required" | grep -qxF "$mod"; then
      (cd "$dir" && go mod edit -dropreplace="$mod" -require="$mod@$version")
    else
      (cd "$dir" && go mod edit -dropreplace="$mod")
    fi
  done
}

mkdir -p "$out"
k8s="$(source_dir k8s.io/kubernetes "$K8S_VERSION")"
cp -R "$k8s" "$tmp/kubernetes"
chmod -R u+w "$tmp/kubernetes"
unreplace "$tmp/kubernetes" "$STAGING_VERSION"
(cd "$tmp/kubernetes" && GOTOOLCHAIN="$TOOLCHAIN" CGO_ENABLED=0 GOFLAGS=-mod=mod \
  go build -trimpath -ldflags "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)" \
  -o "$tmp/kube-apiserver" ./cmd/kube-apiserver) >&2

etcd="$(source_dir go.etcd.io/etcd/server/v3 "$ETCD_VERSION")"
cp -R "$etcd" "$tmp/etcd"
chmod -R u+w "$tmp/etcd"
unreplace "$tmp/etcd" "$ETCD_VERSION"
(cd "$tmp/etcd" && GOTOOLCHAIN="$TOOLCHAIN" CGO_ENABLED=0 GOFLAGS=-mod=mod \
  go build -trimpath -o "$tmp/etcd-bin" .) >&2
"$tmp/etcd-bin" --version >&2

mv "$tmp/kube-apiserver" "$out/kube-apiserver"
mv "$tmp/etcd-bin" "$out/etcd"
echo "apiserver.sh: built in $(( $(date +%s) - start ))s" >&2
echo "$out"
