#!/usr/bin/env bash
# Builds Helm from its Go module, offline-capable (only the Go module proxy is needed), into a cache
# directory and prints the binary's path on stdout.
#
#   hack/build-helm.sh             build (or reuse) and print .../helm-<version>/helm
#
# helm.sh/helm/v3 at HELM_VERSION through a small module in the cache dir (go get, then go build of
# helm.sh/helm/v3/cmd/helm), CGO_ENABLED=0, GOFLAGS=-mod=mod, as hack/build-coredns.sh builds
# CoreDNS. The version is stamped into the binary (internal/version), so `helm version` tells it. A
# stamp records what was built; nothing is rebuilt while the version, the Go version and the build
# recipe are unchanged. v3 rather than v4: v3.17+ has what the project uses (--take-ownership,
# values.schema.json) and is what most CI images and users run.
#
# Environment: HELM_VERSION (v3.22.0), HELM_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/helm-$HELM_VERSION).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${HELM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/helm-${HELM_VERSION}}"
BIN="$CACHE/helm"

log() { echo "build-helm: $*" >&2; }
die() { echo "build-helm: $*" >&2; exit 1; }

case "${1:-build}" in
  build) ;;
  -h|--help|help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) die "unknown argument $1" ;;
esac

build_helm() { # builds $BIN.new from the module; its text is part of the stamp
  local mod="$CACHE/src" t0=$SECONDS
  rm -rf "$mod" && mkdir -p "$mod"
  printf 'module peregrine.local/helm-build\n\ngo 1.26\n' >"$mod/go.mod"
  log "resolving modules for helm.sh/helm/v3@$HELM_VERSION"
  (cd "$mod" && go get "helm.sh/helm/v3@${HELM_VERSION}")
  # As helm's Makefile does: the Kubernetes version `helm template` and `helm lint` assume is
  # that of the client-go it is built with (else v1.20, which a chart's kubeVersion refuses).
  local kv minor
  kv="$(cd "$mod" && go list -m -f '{{.Version}}' k8s.io/client-go)"
  minor="$(sed -n 's/^v0\.\([0-9]*\)\..*/\1/p' <<<"$kv")"
  [[ -n "$minor" ]] || die "cannot tell the Kubernetes version of client-go $kv"
  local v=helm.sh/helm/v3
  log "compiling (CGO_ENABLED=$CGO_ENABLED, $(go env GOVERSION), Kubernetes 1.$minor)"
  (cd "$mod" && go build -trimpath \
    -ldflags "-s -w -X $v/internal/version.version=${HELM_VERSION} -X $v/internal/version.gitTreeState=clean \
      -X $v/pkg/lint/rules.k8sVersionMajor=1 -X $v/pkg/lint/rules.k8sVersionMinor=$minor \
      -X $v/pkg/chartutil.k8sVersionMajor=1 -X $v/pkg/chartutil.k8sVersionMinor=$minor" \
    -o "$BIN.new" $v/cmd/helm)
  log "built helm $HELM_VERSION in $((SECONDS - t0)) s"
}

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
want="$(printf 'helm %s\ngo %s\nrecipe %s\n' "$HELM_VERSION" "$(go env GOVERSION)" \
  "$(declare -f build_helm | sha256sum | cut -c1-16)")"
have="$(cat "$CACHE/helm.stamp" 2>/dev/null || true)"
if [[ -x "$BIN" && "$have" == "$want" ]]; then
  log "helm $HELM_VERSION up to date in $CACHE"
else
  mkdir -p "$CACHE"
  # Two builds at once (make lint and a test) would race on $BIN.new: queue them.
  exec 9>"$CACHE/.lock"
  flock 9
  have="$(cat "$CACHE/helm.stamp" 2>/dev/null || true)"
  if [[ ! -x "$BIN" || "$have" != "$want" ]]; then
    trap 'rm -f "$BIN.new"' EXIT
    build_helm
    "$BIN.new" version --short >/dev/null || die "the built helm does not run"
    mv "$BIN.new" "$BIN"
    trap - EXIT
    echo "$want" >"$CACHE/helm.stamp"
  fi
fi
echo "$BIN"
