#!/usr/bin/env bash
# Builds the Kubernetes binaries and etcd from their Go modules, offline-capable (only the Go module
# proxy is needed), into a cache directory, and prints that directory's bin/ on stdout.
#
#   hack/build-kube.sh            kube-apiserver, kubectl, etcd (what envtest needs)
#   hack/build-kube.sh --node     also kube-controller-manager, kube-scheduler, kubelet, kube-proxy
#
# Kubernetes comes from k8s.io/kubernetes at KUBE_VERSION through a small module that replaces every
# staging module (the replace block of the kubernetes go.mod) with its published v0.x twin. etcd comes
# from go.etcd.io/etcd/server/v3 at ETCD_VERSION in its own module. A stamp file records what was
# built; nothing is rebuilt while the pinned versions, the Go version and the binary set are unchanged.
#
# Environment: KUBE_VERSION (v1.35.4), ETCD_VERSION (v3.6.16), KUBE_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/kube-$KUBE_VERSION).
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE="${KUBE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/kube-${KUBE_VERSION}}"
BIN="$CACHE/bin"

node=0
for arg in "$@"; do
  case "$arg" in
    --node) node=1 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "build-kube.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

kube_cmds=(kube-apiserver kubectl)
if [[ $node == 1 ]]; then
  kube_cmds+=(kube-controller-manager kube-scheduler kubelet kube-proxy)
fi

export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
go_version="$(go env GOVERSION)"
log() { echo "build-kube: $*" >&2; }

# The staging version twin of v1.35.4 is v0.35.4.
staging_version="v0.${KUBE_VERSION#v1.}"

stamp_of() { # name of what is built, one line per pinned input
  printf 'kubernetes %s\netcd %s\ngo %s\nbinaries %s\nscript %s\n' "$KUBE_VERSION" "$ETCD_VERSION" \
    "$go_version" "$1" "$(sha256sum "$0" | cut -c1-16)"
}

mkdir -p "$BIN"

# --- Kubernetes --------------------------------------------------------------------------------------
kube_build() {
  local want have missing=0 c
  want="$(stamp_of "${kube_cmds[*]}")"
  have="$(cat "$CACHE/kube.stamp" 2>/dev/null || true)"
  for c in "${kube_cmds[@]}"; do [[ -x "$BIN/$c" ]] || missing=1; done
  # A stamp for a superset (--node) also satisfies a build of the envtest set.
  if [[ $missing == 0 && ( "$have" == "$want" || "$have" == "$(stamp_of "kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy")" ) ]]; then
    log "kubernetes $KUBE_VERSION up to date in $BIN"
    return
  fi
  local mod="$CACHE/src/kube"
  rm -rf "$mod" && mkdir -p "$mod"
  local kmod
  kmod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@${KUBE_VERSION}" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "$kmod" ]] || { echo "build-kube: cannot find go.mod of k8s.io/kubernetes@$KUBE_VERSION" >&2; exit 1; }
  local go_directive
  go_directive="$(sed -n 's/^go //p' "$kmod")"
  {
    echo "module peregrine.local/kube-build"
    echo
    echo "go ${go_directive}"
    echo
    echo "require k8s.io/kubernetes ${KUBE_VERSION}"
    echo
    echo "replace ("
    # Every "k8s.io/x => ./staging/src/k8s.io/x" of the kubernetes go.mod becomes "k8s.io/x => k8s.io/x v0.N.M".
    sed -n '/^replace (/,/^)/s#^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*#\t\1 => \1 '"$staging_version"'#p' "$kmod"
    echo ")"
  } >"$mod/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for c in "${kube_cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
    echo ")"
  } >"$mod/tools.go"
  log "resolving modules for kubernetes $KUBE_VERSION ($(grep -c ' => ' "$mod/go.mod") staging replaces)"
  (cd "$mod" && go mod tidy)
  local date ldflags
  date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date -X $pkg.gitCommit=module-$KUBE_VERSION"
  done
  for c in "${kube_cmds[@]}"; do
    local t0=$SECONDS
    (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$BIN/$c.new" "k8s.io/kubernetes/cmd/$c")
    mv "$BIN/$c.new" "$BIN/$c"
    log "built $c in $((SECONDS - t0)) s"
  done
  echo "$want" >"$CACHE/kube.stamp"
}

# --- etcd --------------------------------------------------------------------------------------------
etcd_build() {
  local want have
  want="$(stamp_of etcd)"
  have="$(cat "$CACHE/etcd.stamp" 2>/dev/null || true)"
  if [[ -x "$BIN/etcd" && "$have" == "$want" ]]; then
    log "etcd $ETCD_VERSION up to date in $BIN"
    return
  fi
  local mod="$CACHE/src/etcd" t0=$SECONDS
  rm -rf "$mod" && mkdir -p "$mod"
  printf 'module peregrine.local/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$mod/tools.go"
  (cd "$mod" && go mod tidy)
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.new" go.etcd.io/etcd/server/v3)
  mv "$BIN/etcd.new" "$BIN/etcd"
  echo "$want" >"$CACHE/etcd.stamp"
  log "built etcd $ETCD_VERSION in $((SECONDS - t0)) s"
}

etcd_build
kube_build
echo "$BIN"
