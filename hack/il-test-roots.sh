#!/usr/bin/env bash
# Root file systems that stand for container images with different C libraries, for the test of
# the interception library's check (csi/ilcheck): what a pod's check container meets.
#
#   glibc-2.31  Debian 11's libc6, libgcc-s1 and coreutils: a C library older than the library needs
#   glibc-host  this machine's /bin/true and the libraries the interception library links
#   musl        a program built with musl-gcc and musl's loader (as in Alpine)
#   static      busybox-static as /bin/sh and /bin/true: no loader at all
#
# Usage: hack/il-test-roots.sh [DIR]  (default ~/.cache/peregrine/il-roots); prints DIR.
# Cached: a root that exists is kept. Needs root (dpkg-deb keeps owners) and the package mirror.
set -euo pipefail

DIR="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/il-roots}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
mkdir -p "$DIR"

need=()
command -v musl-gcc >/dev/null || need+=(musl-tools)
[[ -x /bin/busybox ]] && /bin/busybox --help 2>&1 | grep -q BusyBox && ! ldd /bin/busybox >/dev/null 2>&1 || need+=(busybox-static)
if ((${#need[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# A root with /dev/null (os/exec and loaders use it) and the directories the test fills.
skeleton() {
  mkdir -p "$1/dev" "$1/opt/peregrine/il-host" "$1/opt/peregrine/il" "$1/tmp"
  [[ -e "$1/dev/null" ]] || mknod -m 666 "$1/dev/null" c 1 3
}

if [[ ! -e "$DIR/glibc-2.31/.done" ]]; then
  rm -rf "$DIR/glibc-2.31" && mkdir -p "$DIR/glibc-2.31"
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  curl -fsS -m 120 -o "$work/Packages.xz" "$MIRROR/dists/bullseye/main/binary-amd64/Packages.xz"
  xz -dc "$work/Packages.xz" | awk '/^Package: /{p=$2} /^Filename: /{ if (p=="libc6"||p=="libgcc-s1"||p=="coreutils") print $2 }' |
    while read -r f; do
      curl -fsS -m 300 -o "$work/${f##*/}" "$MIRROR/$f"
      dpkg-deb -x "$work/${f##*/}" "$DIR/glibc-2.31"
    done
  [[ -x "$DIR/glibc-2.31/bin/true" && -L "$DIR/glibc-2.31/lib64/ld-linux-x86-64.so.2" ]] ||
    { echo "il-test-roots: Debian 11 root incomplete" >&2; exit 1; }
  skeleton "$DIR/glibc-2.31"
  touch "$DIR/glibc-2.31/.done"
fi

if [[ ! -e "$DIR/glibc-host/.done" ]]; then
  rm -rf "$DIR/glibc-host" && mkdir -p "$DIR/glibc-host/bin"
  cp /bin/true "$DIR/glibc-host/bin/true"
  for lib in $(ldd /bin/true | grep -o '/[^ ]*') /lib/x86_64-linux-gnu/libgcc_s.so.1 /lib/x86_64-linux-gnu/libm.so.6; do
    mkdir -p "$DIR/glibc-host$(dirname "$lib")"
    cp -L "$lib" "$DIR/glibc-host$lib"
  done
  skeleton "$DIR/glibc-host"
  touch "$DIR/glibc-host/.done"
fi

if [[ ! -e "$DIR/musl/.done" ]]; then
  rm -rf "$DIR/musl" && mkdir -p "$DIR/musl/bin" "$DIR/musl/lib"
  printf 'int main(void) { return 0; }\n' > "$DIR/musl/true.c"
  musl-gcc -o "$DIR/musl/bin/true" "$DIR/musl/true.c"
  loader="$(readelf -l "$DIR/musl/bin/true" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')"
  [[ "$loader" == *ld-musl* ]] || { echo "il-test-roots: musl-gcc made no musl program ($loader)" >&2; exit 1; }
  mkdir -p "$DIR/musl$(dirname "$loader")"
  cp -L "$loader" "$DIR/musl$loader"
  skeleton "$DIR/musl"
  touch "$DIR/musl/.done"
fi

if [[ ! -e "$DIR/static/.done" ]]; then
  rm -rf "$DIR/static" && mkdir -p "$DIR/static/bin"
  cp /bin/busybox "$DIR/static/bin/sh"
  cp /bin/busybox "$DIR/static/bin/true"
  skeleton "$DIR/static"
  touch "$DIR/static/.done"
fi
echo "$DIR"
