#!/usr/bin/env bash
# Peregrine's container images without Docker and without a registry (docs/images.md).
#
#   hack/images.sh [flags] COMMAND...
#
# Commands (run in the order given; each is idempotent and cached):
#   base      debian:bookworm-slim made with debootstrap from the Debian mirror apt uses here,
#             imported into podman as docker.io/library/debian:bookworm-slim (skipped when present)
#   build     peregrine/{engine,operator,csi}:TAG from host binaries (Rust from
#             engine/target/PROFILE, Go built now) through the Dockerfile's prebuilt stages
#   sidecars  peregrine/csi-{provisioner,resizer,snapshotter} and peregrine/snapshot-controller (the
#             cluster add-on of hack/snapshot-addon.sh) built from their Go modules at the
#             pinned versions (binaries cached in CACHE/sidecars)
#   testimages  peregrine/e2e-glibc2.31 and peregrine/e2e-musl:TAG, images whose C library cannot
#             take the interception library, for the e2e suites (from hack/il-test-roots.sh)
#   import    every image above (test images when built), and the base, into a containerd's
#             k8s.io namespace (podman save | ctr import)
#   all       base build sidecars, then import when the containerd socket exists
#
# Flags and environment:
#   --profile P / PROFILE=P            Rust build profile to take binaries from (release; debug)
#   --address S / PEREGRINE_CONTAINERD_SOCK=S
#                                      containerd socket for import (/run/containerd/containerd.sock)
#   --tag T / IMAGE_TAG=T              tag of the peregrine images (dev)
#   REBUILD_BASE=1                     debootstrap the base again even if the image exists
#   STRIP=0                            keep the Rust binaries' debug info in the images
#   PEREGRINE_CACHE_DIR                cache root (~/.cache/peregrine)
#   PEREGRINE_CONTAINERD_SNAPSHOTTER   snapshotter ctr unpacks into (containerd's default)
#   CONTAINERS_CONF                    podman's config; by default one written to
#                                      CACHE/containers/containers.conf (runc, ulimits: MACHINE-NOTES)
#
# The Rust binaries are not built here: run `cargo build --release --workspace` in engine/ first
# (or PROFILE=debug after `cargo build --workspace`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

PROFILE="${PROFILE:-release}"
SOCK="${PEREGRINE_CONTAINERD_SOCK:-/run/containerd/containerd.sock}"
TAG="${IMAGE_TAG:-dev}"
CACHE="${PEREGRINE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/peregrine}"
SNAPSHOTTER="${PEREGRINE_CONTAINERD_SNAPSHOTTER:-}"

BASE_IMAGE=docker.io/library/debian:bookworm-slim
SUITE=bookworm
OUT="$ROOT/_out/images"
REPO=docker.io/peregrine
IMAGES=(engine operator csi)
# name  module@version  package
SIDECARS=(
  "csi-provisioner github.com/kubernetes-csi/external-provisioner/v5@v5.3.0 github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner"
  "csi-resizer github.com/kubernetes-csi/external-resizer@v1.14.0 github.com/kubernetes-csi/external-resizer/cmd/csi-resizer"
  "csi-snapshotter github.com/kubernetes-csi/external-snapshotter/v8@v8.3.0 github.com/kubernetes-csi/external-snapshotter/v8/cmd/csi-snapshotter"
  "snapshot-controller github.com/kubernetes-csi/external-snapshotter/v8@v8.3.0 github.com/kubernetes-csi/external-snapshotter/v8/cmd/snapshot-controller"
)

log() { echo "images: $*" >&2; }
die() { echo "images: error: $*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

cmds=()
while (($#)); do
  case "$1" in
    --profile) PROFILE="$2"; shift 2 ;;
    --profile=*) PROFILE="${1#*=}"; shift ;;
    --address) SOCK="$2"; shift 2 ;;
    --address=*) SOCK="${1#*=}"; shift ;;
    --tag) TAG="$2"; shift 2 ;;
    --tag=*) TAG="${1#*=}"; shift ;;
    -h|--help) usage 0 ;;
    base|build|sidecars|testimages|import|all) cmds+=("$1"); shift ;;
    *) echo "images: unknown argument: $1" >&2; usage ;;
  esac
done
((${#cmds[@]})) || usage

for t in podman debootstrap; do
  command -v "$t" >/dev/null || die "$t not found: run hack/install-image-deps.sh"
done

mkdir -p "$CACHE/containers" "$CACHE/sidecars"
# One run at a time per cache (two would debootstrap or tag over each other).
exec 9>"$CACHE/images.lock"
flock 9

# podman/buildah here need runc (crun fails on this hybrid cgroup setup) and explicit ulimits
# (root lacks CAP_SYS_RESOURCE, so the default rlimits cannot be raised); no systemd, no journald.
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
  export CONTAINERS_CONF="$CACHE/containers/containers.conf"
  conf='# Written by hack/images.sh (MACHINE-NOTES: "Images without a registry").
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
  [[ -f "$CONTAINERS_CONF" && "$(cat "$CONTAINERS_CONF")" == "$conf" ]] || printf '%s\n' "$conf" >"$CONTAINERS_CONF"
fi

declare -a TIMES=()
now() { date +%s.%N; }
timed() { # timed LABEL CMD...: runs CMD, records and prints its wall time
  local label="$1" t0 t1 dt
  shift
  t0=$(now)
  "$@"
  t1=$(now)
  dt=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
  TIMES+=("$label ${dt}s")
  log "$label: ${dt}s"
}

# ------------------------------------------------------------------------------------ base

# The mirror (and security mirror) apt uses here for SUITE, from apt's own view of its sources.
apt_uri() { # apt_uri SUITE (the $(...) are apt's fields, not the shell's)
  # shellcheck disable=SC2016
  apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null |
    awk -v s="$1" '$2 == s {print $1; exit}'
}

unmount_under() { # lazily unmounts everything mounted below $1, deepest first
  local dir="$1"
  awk -v d="$dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

base() {
  if [[ "${REBUILD_BASE:-0}" != 1 ]] && podman image exists "$BASE_IMAGE"; then
    log "base: $BASE_IMAGE present (REBUILD_BASE=1 to make it again)"
    return
  fi
  local mirror security work rootfs
  mirror="${DEBIAN_MIRROR:-$(apt_uri "$SUITE")}"
  security="${DEBIAN_SECURITY_MIRROR:-$(apt_uri "$SUITE-security")}"
  [[ -n "$mirror" ]] || die "no apt source for $SUITE found (set DEBIAN_MIRROR)"
  mirror="${mirror%/}"
  security="${security%/}"
  work="$(mktemp -d "${TMPDIR:-/var/tmp}/peregrine-base.XXXXXX")"
  rootfs="$work/rootfs"
  # shellcheck disable=SC2064
  trap "unmount_under '$work'; rm -rf '$work'" EXIT
  log "base: debootstrap --variant=minbase $SUITE from $mirror (log: $work/debootstrap.log)"
  if ! debootstrap --variant=minbase "$SUITE" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -20 "$work/debootstrap.log" >&2
    die "debootstrap failed"
  fi
  unmount_under "$work"

  # Slim it as the official debian:*-slim is: no docs, man pages or locales (now or on later apt
  # installs), no apt lists or package cache, and nothing of this host (hostname, resolv.conf).
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  {
    echo "deb $mirror $SUITE main"
    echo "deb $mirror $SUITE-updates main"
    [[ -z "$security" ]] || echo "deb $security $SUITE-security main"
  } >"$rootfs/etc/apt/sources.list"
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
    "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/var/log/* "$rootfs"/tmp/* "$rootfs"/root/.bash_history
  : >"$rootfs/etc/resolv.conf"
  echo localhost >"$rootfs/etc/hostname"

  log "base: podman import as $BASE_IMAGE"
  tar -C "$rootfs" --numeric-owner --xattrs --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . |
    podman import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["bash"]' \
      --change "LABEL org.opencontainers.image.description=debian $SUITE minbase (debootstrap from $mirror)" \
      - "$BASE_IMAGE" >/dev/null
  unmount_under "$work"
  rm -rf "$work"
  trap - EXIT
  log "base: $(podman image inspect --format '{{.Id}}' "$BASE_IMAGE" | cut -c1-12), $(size_of "$BASE_IMAGE")"
}

size_of() { podman image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1/1e6}'; }

# ----------------------------------------------------------------------------------- build

# install_bin SRC DST: copies SRC to DST (debug info stripped unless STRIP=0), leaving DST alone
# when the result is the same.
install_bin() {
  local src="$1" dst="$2" tmp="$2.tmp"
  cp "$src" "$tmp"
  if [[ "${STRIP:-1}" != 0 ]] && command -v strip >/dev/null; then
    strip --strip-debug "$tmp"
  fi
  chmod 0755 "$tmp"
  if cmp -s "$tmp" "$dst"; then rm -f "$tmp"; else mv -f "$tmp" "$dst"; fi
}

stage_binaries() {
  local target="$ROOT/engine/target/$PROFILE" f newer stale=() cargo="cargo build --workspace"
  [[ "$PROFILE" == debug ]] || cargo="cargo build --profile $PROFILE --workspace"
  mkdir -p "$OUT/bin"
  for f in peregrine-engine peregrine peregrine-agent peregrine-dataset peregrine-fuse libperegrine_il.so; do
    [[ -f "$target/$f" ]] ||
      die "$target/$f missing: run '$cargo' in engine/ (or PROFILE=debug for engine/target/debug)"
    newer="$(find "$ROOT/engine/crates" "$ROOT/engine/proto" -newer "$target/$f" -type f \( -name '*.rs' -o -name '*.proto' -o -name Cargo.toml \) -print -quit)"
    [[ -z "$newer" ]] || stale+=("$f (older than ${newer#"$ROOT"/})")
    install_bin "$target/$f" "$OUT/bin/$f"
  done
  ((${#stale[@]} == 0)) ||
    log "build: warning: engine/target/$PROFILE holds binaries older than their sources, the images get them as they are: ${stale[*]}"
  # The Go binaries are cheap to build (cached) and static without cgo: build them now rather
  # than trust bin/, which a default `go build` links against this host's libc.
  (cd "$ROOT" &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/bin/peregrine-operator" ./cmd/operator &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/bin/peregrine-csi" ./cmd/csi &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/bin/peregrine-il-check" ./cmd/il-check)
}

# podman_build IMAGE ARGS...: podman build tagged IMAGE, then drops the image IMAGE named before
# when the build left it without a name (ours; other dangling images are left alone).
podman_build() {
  local image="$1" old new
  shift
  old="$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)"
  podman build --pull=never --network=host --layers -t "$image" "$@" >"$OUT/build-${image##*/}.log" 2>&1 ||
    { tail -30 "$OUT/build-${image##*/}.log" >&2; die "podman build of $image failed (log: $OUT/build-${image##*/}.log)"; }
  new="$(podman image inspect --format '{{.Id}}' "$image")"
  if [[ -n "$old" && "$old" != "$new" ]] &&
     [[ "$(podman image inspect --format '{{len .RepoTags}}' "$old" 2>/dev/null)" == 0 ]]; then
    podman rmi "$old" >/dev/null 2>&1 || true
  fi
  log "build: $image ${new:0:12} $(size_of "$image")"
}

build() {
  podman image exists "$BASE_IMAGE" || die "$BASE_IMAGE missing: run '$0 base' first"
  mkdir -p "$OUT"
  timed "build: host binaries to _out/images/bin ($PROFILE)" stage_binaries
  local x
  for x in "${IMAGES[@]}"; do
    timed "build: $REPO/$x:$TAG" podman_build "$REPO/$x:$TAG" \
      --build-arg BINARIES=prebuilt --build-arg BASE_IMAGE="$BASE_IMAGE" \
      --target "$x" -f "$ROOT/Dockerfile" "$ROOT"
  done
  # The binaries stages' images (nameless once built) would pile up with every change of binaries.
  podman image prune -f --filter label=dev.peregrine.images.stage >/dev/null
}

# -------------------------------------------------------------------------------- sidecars

# sidecar_bin NAME MODULE@VERSION PKG: the static binary, built once in a module of its own (the Go
# proxy refuses these modules' version lists, so `go install pkg@version` fails; `go get` of the
# exact version in a module works).
sidecar_bin() {
  local name="$1" modver="$2" pkg="$3" version="${2##*@}"
  local dir="$CACHE/sidecars/$name-$version" bin="$CACHE/sidecars/$name-$version/$name"
  if [[ -x "$bin" ]]; then
    log "sidecars: $name $version cached"
    return
  fi
  mkdir -p "$dir"
  (
    cd "$dir"
    [[ -f go.mod ]] || go mod init "peregrine.local/sidecars/$name" >/dev/null 2>&1
    go get "$pkg@$version" >"$dir/go-get.log" 2>&1 || { cat "$dir/go-get.log" >&2; exit 1; }
    CGO_ENABLED=0 go build -mod=mod -trimpath -ldflags "-s -w -X main.version=$version" -o "$bin.tmp" "$pkg"
    mv -f "$bin.tmp" "$bin"
  ) || die "sidecars: building $name $version failed"
  log "sidecars: built $name $version ($(du -m "$bin" | cut -f1) MB; module $modver)"
}

sidecar_image() {
  local name="$1" modver="$2" version="${2##*@}"
  local dir="$CACHE/sidecars/$name-$version" ctx="$CACHE/sidecars/$name-$version/ctx"
  mkdir -p "$ctx"
  ln -f "$dir/$name" "$ctx/$name" 2>/dev/null || cp -f "$dir/$name" "$ctx/$name"
  # Static Go binary on an empty image, as upstream's distroless-static ones: the pods give only
  # args, and run as the user their securityContext names.
  cat >"$ctx/Containerfile" <<EOF
FROM scratch
COPY $name /$name
LABEL org.opencontainers.image.title="$name" \\
      org.opencontainers.image.version="$version" \\
      org.opencontainers.image.source="https://${modver%@*}" \\
      org.opencontainers.image.description="$name $version built from its Go module by hack/images.sh"
ENTRYPOINT ["/$name"]
EOF
  mkdir -p "$OUT"
  podman_build "$REPO/$name:$version" -f "$ctx/Containerfile" "$ctx"
}

sidecars() {
  local line name modver pkg
  for line in "${SIDECARS[@]}"; do
    read -r name modver pkg <<<"$line"
    timed "sidecars: $name binary" sidecar_bin "$name" "$modver" "$pkg"
    timed "sidecars: $REPO/$name:${modver##*@}" sidecar_image "$name" "$modver"
  done
}

# ----------------------------------------------------------------------------- test images

TEST_IMAGES=(e2e-glibc2.31 e2e-musl)

# testimages: root file systems of real C libraries (Debian 11's glibc 2.31 with coreutils; a musl
# program with busybox-static for sh and sha256sum) as images, for the interception check's e2e.
testimages() {
  local roots ctx
  roots="$(bash "$ROOT/hack/il-test-roots.sh")"
  ctx="$CACHE/testimages"
  rm -rf "$ctx" && mkdir -p "$ctx"
  cp -a "$roots/glibc-2.31" "$ctx/glibc" && rm -rf "$ctx/glibc/opt"
  cp -a "$roots/musl" "$ctx/musl" && rm -rf "$ctx/musl/opt"
  cp /bin/busybox "$ctx/musl/bin/busybox"
  ln -sf busybox "$ctx/musl/bin/sh" && ln -sf busybox "$ctx/musl/bin/sha256sum"
  printf 'FROM scratch\nCOPY . /\n' >"$ctx/Containerfile"
  timed "testimages: $REPO/e2e-glibc2.31:$TAG" podman_build "$REPO/e2e-glibc2.31:$TAG" -f "$ctx/Containerfile" "$ctx/glibc"
  timed "testimages: $REPO/e2e-musl:$TAG" podman_build "$REPO/e2e-musl:$TAG" -f "$ctx/Containerfile" "$ctx/musl"
}

# ---------------------------------------------------------------------------------- import

all_images() {
  local x line name modver pkg
  # The base too: pods of plain Debian (samples, the e2e suites' workloads) run on it.
  echo "$BASE_IMAGE"
  for x in "${IMAGES[@]}"; do echo "$REPO/$x:$TAG"; done
  for x in "${TEST_IMAGES[@]}"; do
    if podman image exists "$REPO/$x:$TAG"; then echo "$REPO/$x:$TAG"; fi
  done
  for line in "${SIDECARS[@]}"; do
    read -r name modver pkg <<<"$line"
    echo "$REPO/$name:${modver##*@}"
  done
}

import_one() {
  local image="$1" id marker tar
  id="$(podman image inspect --format '{{.Id}}' "$image" 2>/dev/null)" || die "$image missing: run '$0 build sidecars' first"
  # One marker per socket: which image ID that containerd last took under this name.
  marker="$CACHE/imported/$(printf '%s' "$SOCK" | sha256sum | cut -c1-16)/${image//\//_}"
  if [[ -f "$marker" && "$(cat "$marker")" == "$id" ]] &&
     ctr -n k8s.io --address "$SOCK" images ls -q 2>/dev/null | grep -qxF "$image"; then
    log "import: $image ${id:0:12} already in containerd"
    return
  fi
  tar="$(mktemp "${TMPDIR:-/var/tmp}/peregrine-image.XXXXXX.tar")"
  podman save --format docker-archive -o "$tar" "$image" 2>/dev/null ||
    { rm -f "$tar"; die "podman save $image failed"; }
  ctr -n k8s.io --address "$SOCK" images import ${SNAPSHOTTER:+--snapshotter "$SNAPSHOTTER"} "$tar" >/dev/null ||
    { rm -f "$tar"; die "ctr import of $image into $SOCK failed"; }
  rm -f "$tar"
  mkdir -p "$(dirname "$marker")"
  echo "$id" >"$marker"
  log "import: $image ${id:0:12} imported"
}

import() {
  command -v ctr >/dev/null || die "ctr not found: run hack/install-image-deps.sh"
  [[ -S "$SOCK" ]] || die "no containerd socket at $SOCK (--address or PEREGRINE_CONTAINERD_SOCK)"
  local image
  for image in $(all_images); do
    timed "import: $image" import_one "$image"
  done
}

# ------------------------------------------------------------------------------------ main

t_start=$(now)
for c in "${cmds[@]}"; do
  case "$c" in
    base) timed base base ;;
    build) build ;;
    sidecars) sidecars ;;
    testimages) testimages ;;
    import) import ;;
    all)
      timed base base
      build
      sidecars
      if [[ -S "$SOCK" ]]; then import; else log "all: no containerd socket at $SOCK: import skipped"; fi
      ;;
  esac
done
log "timings:"
for t in "${TIMES[@]}"; do log "  $t"; done
log "  total $(awk -v a="$t_start" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}')s"
log "images:"
for image in $(all_images); do
  if podman image exists "$image"; then log "  $image $(size_of "$image")"; fi
done
