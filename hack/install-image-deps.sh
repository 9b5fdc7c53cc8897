#!/usr/bin/env bash
# Installs from Debian what hack/images.sh needs to build and load images without Docker or a
# registry: podman and buildah (builds), runc (the OCI runtime this machine needs; crun fails on
# its hybrid cgroup setup), debootstrap (the base image), containerd (for ctr, to import images
# into a cluster's containerd), uidmap and fuse-overlayfs (podman's recommends; unused as root on
# ext4 but cheap and needed for rootless use), containernetworking-plugins (podman run's default
# bridge network; the builds themselves use the host's network).
# Idempotent: packages already present are skipped without touching the network.
set -euo pipefail

PKGS=(podman buildah runc conmon debootstrap debian-archive-keyring containerd uidmap
      fuse-overlayfs containernetworking-plugins)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-image-deps: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # On a machine without an init system the containerd package's service start is skipped; where
  # systemd runs, it starts the host's containerd (images.sh only needs its ctr).
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
