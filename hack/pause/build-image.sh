#!/usr/bin/env bash
# Builds the pause image without a container tool: pause.c compiled static, one layer holding
# /pause, an image config and a manifest, packed as a docker-archive tarball (the format of
# `docker save`), which `ctr images import` reads.
#
#   hack/pause/build-image.sh OUT.tar [TAG ...]     (default tag peregrine.local/pause:3.10)
#
# The tarball is reproducible: fixed mtimes, owners and ordering, so the image ID only changes when
# pause.c or the compiler does.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: build-image.sh OUT.tar [TAG ...]}"
shift
tags=("$@")
((${#tags[@]})) || tags=(peregrine.local/pause:3.10)

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The binary: static, stripped, no libc needed in the image.
mkdir -p "$work/rootfs"
gcc -static -O2 -s -Wall -Wextra -o "$work/rootfs/pause" "$here/pause.c"

# Deterministic tar: names sorted, mtime 0, root-owned.
det_tar() { # det_tar OUT DIR PATHS...
  local out="$1" dir="$2"
  shift 2
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime -C "$dir" -cf "$out" "$@"
}

# The layer: just /pause. Its sha256 is both the layer's diff_id and (uncompressed) its digest.
mkdir -p "$work/archive"
det_tar "$work/layer.tar" "$work/rootfs" pause
layer_sha="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
mkdir -p "$work/archive/$layer_sha"
mv "$work/layer.tar" "$work/archive/$layer_sha/layer.tar"

# The image config (OCI image config, which docker-archive uses as is). User 65535 as upstream's
# pause: the sandbox needs no privileges.
config="$(printf '{"architecture":"amd64","os":"linux","created":"1970-01-01T00:00:00Z","config":{"User":"65535:65535","Entrypoint":["/pause"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"hack/pause/build-image.sh"}]}' "$layer_sha")"
config_sha="$(printf '%s' "$config" | sha256sum | cut -d' ' -f1)"
printf '%s' "$config" >"$work/archive/$config_sha.json"

# The manifest: which config, which tags, which layers.
tag_list="$(printf '"%s",' "${tags[@]}")"
printf '[{"Config":"%s.json","RepoTags":[%s],"Layers":["%s/layer.tar"]}]' \
  "$config_sha" "${tag_list%,}" "$layer_sha" >"$work/archive/manifest.json"

det_tar "$out.tmp" "$work/archive" manifest.json "$config_sha.json" "$layer_sha"
mv "$out.tmp" "$out"
echo "pause image sha256:$config_sha (${tags[*]}) in $out" >&2
