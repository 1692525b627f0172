#!/usr/bin/env bash
# Installs the tools the test suite needs on a fresh Debian machine with Go:
#   promtool and the Prometheus server (Debian's prometheus package, 2.42: 30 s
#   by apt-get), helm (go install), the kustomize CLI docs/deployment.md names (go
#   install: it builds in about a minute, under helm's five), promtool3:
#   Prometheus 3.x's promtool (go install of the prometheus module without its
#   service discovery plugins, which rule tests do not use), so that the rules
#   are tested on both major versions, and Debian's chromium for the landing
#   page's headless-browser test (about 75 s of apt-get, in the same apt-get
#   run), and golangci-lint for `make lint` (go install). The go installs run in parallel with each other and with apt-get.
# Idempotent: tools already present are kept (promtool3 if it is the pinned
# version), so a warm run takes seconds.
set -euo pipefail

GOBIN="$(go env GOPATH)/bin"
export PATH="$GOBIN:$PATH"
HELM_VERSION=v4.3.2
# Prometheus 3.x as a Go module version (alerts/rules_test.go names the same).
PROMTOOL3_VERSION=v0.316.0
# v5.8.2 is built from sigs.k8s.io/kustomize/api v0.21.2, the library go.mod
# requires; v5.8.3 needs Go 1.27.
KUSTOMIZE_VERSION=v5.8.2
# `make lint`'s linter; .golangci.yml is in its v2 format.
GOLANGCI_LINT_VERSION=v2.15.0

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)

helm_pid=""
if ! command -v helm >/dev/null 2>&1; then
  echo "install-tools: building helm $HELM_VERSION with go install (about 5 minutes on cold caches)"
  go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" &
  helm_pid=$!
fi

kustomize_pid=""
if ! kustomize version 2>/dev/null | grep -qx "$KUSTOMIZE_VERSION"; then
  echo "install-tools: building kustomize $KUSTOMIZE_VERSION with go install"
  go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" &
  kustomize_pid=$!
fi

golangci_pid=""
if ! { command -v golangci-lint >/dev/null 2>&1 &&
  go version -m "$(command -v golangci-lint)" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/golangci/golangci-lint/v2[[:space:]]+$GOLANGCI_LINT_VERSION([[:space:]]|$)"; }; then
  echo "install-tools: building golangci-lint $GOLANGCI_LINT_VERSION with go install (minutes on cold caches)"
  go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION" &
  golangci_pid=$!
fi

# promtool3: a versioned name next to Debian's promtool. `go install` cannot
# rename, so it builds into a scratch GOBIN and moves the binary.
promtool3_pid=""
if ! { command -v promtool3 >/dev/null 2>&1 &&
  go version -m "$(command -v promtool3)" 2>/dev/null | grep -Eq "^[[:space:]]+mod[[:space:]]+github.com/prometheus/prometheus[[:space:]]+$PROMTOOL3_VERSION([[:space:]]|$)"; }; then
  echo "install-tools: building promtool3 (prometheus $PROMTOOL3_VERSION, Prometheus 3.x) with go install (minutes on cold caches)"
  (
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    CGO_ENABLED=0 GOBIN="$tmp" go install -tags remove_all_sd \
      "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL3_VERSION"
    mv "$tmp/promtool" "$GOBIN/promtool3"
  ) &
  promtool3_pid=$!
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-tools: apt-get install ${need_apt[*]} (promtool and the server; chromium for the landing page test)"
  $SUDO apt-get update -qq
  # The package's init script would start a server on :9090; tests start their
  # own. Debian's way to keep a package's service from starting: invoke-rc.d
  # (and deb-systemd-invoke) ask /usr/sbin/policy-rc.d, and exit 101 means
  # "action forbidden". Ours lives for this apt-get run only; one already
  # there (container images ship one) is put back afterwards. Nothing is
  # stopped by name: a Prometheus of your own keeps running.
  policy=/usr/sbin/policy-rc.d
  saved_policy=""
  if [ -e "$policy" ]; then
    saved_policy="$(mktemp)"
    $SUDO cp -p "$policy" "$saved_policy"
  fi
  restore_policy() {
    if [ -n "$saved_policy" ]; then
      $SUDO cp -p "$saved_policy" "$policy" && rm -f "$saved_policy"
    else
      $SUDO rm -f "$policy"
    fi
  }
  trap restore_policy EXIT
  printf '#!/bin/sh\n# Written by scripts/install-tools.sh for its apt-get install; removed after it.\nexit 101\n' | $SUDO tee "$policy" >/dev/null
  $SUDO chmod 755 "$policy"
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 $SUDO apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need_apt[@]}" | sort -u) >/dev/null
  restore_policy
  trap - EXIT
fi

if [ -n "$helm_pid" ]; then
  wait "$helm_pid"
fi
if [ -n "$kustomize_pid" ]; then
  wait "$kustomize_pid"
fi
if [ -n "$promtool3_pid" ]; then
  wait "$promtool3_pid"
fi
if [ -n "$golangci_pid" ]; then
  wait "$golangci_pid"
fi
echo "install-tools: $(promtool --version 2>&1 | head -1); promtool3 prometheus $PROMTOOL3_VERSION; helm $(helm version --short 2>/dev/null); kustomize $(kustomize version 2>/dev/null); golangci-lint $GOLANGCI_LINT_VERSION; $(chromium --version 2>/dev/null)"
