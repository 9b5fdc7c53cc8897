#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build, test and benchmark Peregrine.
# Idempotent: packages already present are skipped without touching the network.
set -euo pipefail

# e2fsprogs: the vos tests mount an ext2 host (mkfs.ext2) that cannot reserve blocks.
PKGS=(pkg-config protobuf-compiler liburing-dev libisal-dev fio fuse3 libfuse3-dev sqlite3 git rsync e2fsprogs)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt >/dev/null 2>&1 || true
