#!/usr/bin/env bash
# Builds CoreDNS from its Go module, offline-capable (only the Go module proxy is needed), into a cache
# directory and prints the binary's path on stdout; or prints a Corefile for a single-node cluster.
#
#   hack/build-coredns.sh [build]        build (or reuse) and print .../coredns-<version>/coredns
#   hack/build-coredns.sh corefile [--kubeconfig PATH] [--context NAME] [--listen [IP]:PORT]
#                                  [--health-port N] [--ready-port N] [--nx-port N] [--upstream ADDR...]
#
# build: github.com/coredns/coredns at COREDNS_VERSION (its main package is the module root) through a
# small module in a temp dir (go get, then go build), CGO_ENABLED=0, default plugin set (plugin.cfg of
# that release). The binary must list kubernetes forward cache errors health ready loop reload
# loadbalance template bind. A stamp records what was built; nothing is rebuilt while the version, the
# Go version and the build recipe are unchanged (editing the Corefile part does not rebuild).
#
# corefile: one server block for "." on the listen address (bind IP when one is given) with the
# kubernetes plugin for cluster.local in-addr.arpa ip6.arpa (kubeconfig PATH [CONTEXT], pods insecure,
# fallthrough in-addr.arpa ip6.arpa, ttl 30), cache 30, errors, health and ready on 127.0.0.1, loop,
# reload, loadbalance. Nothing goes to the internet: every other name, and reverse names that fall
# through, are forwarded to a second server block on 127.0.0.1:NX_PORT that answers NXDOMAIN at once
# (template). --upstream (e.g. /etc/resolv.conf) forwards there instead, for a machine that is online.
#
# Environment: COREDNS_VERSION (v1.15.0), COREDNS_CACHE_DIR (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/coredns-$COREDNS_VERSION); for corefile: KUBECONFIG,
# COREDNS_KUBE_CONTEXT (none: the kubeconfig's current context), COREDNS_LISTEN (10.244.0.1:53),
# COREDNS_HEALTH_PORT (8080), COREDNS_READY_PORT (8181), COREDNS_NX_PORT (8053), COREDNS_UPSTREAM.
set -euo pipefail

COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
CACHE="${COREDNS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/coredns-${COREDNS_VERSION}}"
BIN="$CACHE/coredns"
REQUIRED_PLUGINS=(kubernetes forward cache errors health ready loop reload loadbalance template bind)

log() { echo "build-coredns: $*" >&2; }
die() { echo "build-coredns: $*" >&2; exit 1; }
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

# --- build -------------------------------------------------------------------------------------------
build_coredns() { # builds $BIN from the module; its text is part of the stamp
  local mod t0=$SECONDS
  mod="$(mktemp -d "${TMPDIR:-/tmp}/coredns-build.XXXXXX")"
  build_tmp="$mod"
  trap 'rm -rf "$build_tmp" "$BIN.new"' EXIT
  printf 'module peregrine.local/coredns-build\n\ngo 1.26\n' >"$mod/go.mod"
  log "resolving modules for github.com/coredns/coredns@$COREDNS_VERSION"
  (cd "$mod" && go get "github.com/coredns/coredns@${COREDNS_VERSION}")
  log "compiling (CGO_ENABLED=$CGO_ENABLED, $(go env GOVERSION))"
  (cd "$mod" && go build -trimpath \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=module-${COREDNS_VERSION}" \
    -o "$BIN.new" github.com/coredns/coredns)
  rm -rf "$mod"
  trap - EXIT
  log "built coredns $COREDNS_VERSION in $((SECONDS - t0)) s"
}

check_plugins() { # the binary has every plugin the Corefile (and a cluster) relies on
  local list p missing=()
  list="$("$1" -plugins)" || die "$1 -plugins failed"
  for p in "${REQUIRED_PLUGINS[@]}"; do
    grep -qx "[[:space:]]*$p" <<<"$list" || missing+=("$p")
  done
  [[ ${#missing[@]} == 0 ]] || die "$1 lacks plugins: ${missing[*]}"
}

cmd_build() {
  export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
  local want have
  want="$(printf 'coredns %s\ngo %s\ncgo %s\nrecipe %s\n' "$COREDNS_VERSION" "$(go env GOVERSION)" \
    "$CGO_ENABLED" "$(declare -f build_coredns | sha256sum | cut -c1-16)")"
  have="$(cat "$CACHE/coredns.stamp" 2>/dev/null || true)"
  if [[ -x "$BIN" && "$have" == "$want" ]]; then
    log "coredns $COREDNS_VERSION up to date in $CACHE"
  else
    mkdir -p "$CACHE"
    build_coredns
    check_plugins "$BIN.new"
    mv "$BIN.new" "$BIN"
    echo "$want" >"$CACHE/coredns.stamp"
  fi
  echo "$BIN"
}

# --- corefile ----------------------------------------------------------------------------------------
is_port() { [[ "$1" =~ ^[0-9]+$ ]] && (( $1 > 0 && $1 < 65536 )); }

cmd_corefile() {
  local kubeconfig="${KUBECONFIG:-}" context="${COREDNS_KUBE_CONTEXT:-}"
  local listen="${COREDNS_LISTEN:-10.244.0.1:53}" health="${COREDNS_HEALTH_PORT:-8080}"
  local ready="${COREDNS_READY_PORT:-8181}" nx="${COREDNS_NX_PORT:-8053}" upstream="${COREDNS_UPSTREAM:-}"
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --kubeconfig) kubeconfig="${2:?}"; shift 2 ;;
      --context) context="${2:?}"; shift 2 ;;
      --listen) listen="${2:?}"; shift 2 ;;
      --health-port) health="${2:?}"; shift 2 ;;
      --ready-port) ready="${2:?}"; shift 2 ;;
      --nx-port) nx="${2:?}"; shift 2 ;;
      --upstream) upstream="${2:?}"; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) die "corefile: unknown argument $1" ;;
    esac
  done
  [[ -n "$kubeconfig" ]] || die "corefile: no kubeconfig (--kubeconfig or KUBECONFIG)"
  [[ "$kubeconfig" != *:* ]] || die "corefile: one kubeconfig file, not a list: $kubeconfig"
  [[ "$kubeconfig" == /* ]] || kubeconfig="$PWD/$kubeconfig"
  [[ "$kubeconfig$context" != *[[:space:]\"\{\}#]* ]] || die "corefile: kubeconfig path or context with a space, quote, brace or #"
  # [IP]:PORT, IPv6 as [addr]:port
  local ip port
  if [[ "$listen" =~ ^\[([0-9a-fA-F:.]+)\]:([0-9]+)$ ]]; then
    ip="${BASH_REMATCH[1]}"; port="${BASH_REMATCH[2]}"
  elif [[ "$listen" =~ ^([0-9.]*):([0-9]+)$ ]]; then
    ip="${BASH_REMATCH[1]}"; port="${BASH_REMATCH[2]}"
  else
    die "corefile: --listen wants IP:PORT, [IPv6]:PORT or :PORT, not $listen"
  fi
  local p
  for p in "$port" "$health" "$ready" "$nx"; do is_port "$p" || die "corefile: bad port $p"; done
  [[ "$health" != "$ready" ]] || die "corefile: health and ready ports are both $health"
  if [[ -z "$upstream" && "$nx" == "$port" && ( -z "$ip" || "$ip" == 127.0.0.1 ) ]]; then
    die "corefile: the NXDOMAIN responder (127.0.0.1:$nx) collides with the listen address $listen"
  fi

  local forward_to="127.0.0.1:$nx"
  [[ -z "$upstream" ]] || forward_to="$upstream"
  cat <<EOF
# CoreDNS for a single-node Peregrine cluster (hack/build-coredns.sh corefile).
.:$port {
EOF
  [[ -z "$ip" ]] || echo "    bind $ip"
  cat <<EOF
    errors
    health 127.0.0.1:$health
    ready 127.0.0.1:$ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $kubeconfig${context:+ $context}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . $forward_to
    cache 30
    loop
    reload
    loadbalance
}
EOF
  if [[ -z "$upstream" ]]; then
    cat <<EOF
# Offline: names outside the cluster (and reverse names of no cluster address) get NXDOMAIN at once.
.:$nx {
    bind 127.0.0.1
    template ANY ANY {
        rcode NXDOMAIN
    }
}
EOF
  fi
}

case "${1:-build}" in
  build) shift || true; [[ $# == 0 ]] || die "build takes no arguments"; cmd_build ;;
  corefile) shift; cmd_corefile "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown subcommand $1 (build, corefile)" ;;
esac
