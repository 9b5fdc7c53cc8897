#!/usr/bin/env bash
# Installs from Debian what hack/cluster.sh needs to run a single-node Kubernetes offline:
# containerd and runc (container runtime), the CNI plugins (bridge, host-local, portmap, loopback in
# /usr/lib/cni), iptables (kube-proxy and the bridge plugin write rules with it), conntrack (kube-proxy
# flushes stale UDP entries with it), ethtool and socat (kubelet port-forward), openssl (PKI), gcc (the
# pause binary) and util-linux (losetup, mount).
#
# Idempotent: packages already installed are skipped without touching the network. cluster.sh runs
# its own containerd (own config, socket, root and state under its state dir), so whether a system
# containerd runs or not (Debian ships only a systemd unit for it) does not matter to it.
set -euo pipefail

PKGS=(containerd runc containernetworking-plugins iptables conntrack ethtool socat openssl gcc libc6-dev
      util-linux procps iproute2 kmod)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "install-cluster-deps: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  # Other sessions may be installing at the same time: wait for the dpkg lock instead of failing.
  apt_opts=(-o DPkg::Lock::Timeout=600)
  $SUDO apt-get "${apt_opts[@]}" update -qq
  $SUDO apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The CNI plugins cluster.sh configures must be there.
for plugin in bridge host-local portmap loopback; do
  [[ -x /usr/lib/cni/$plugin ]] || { echo "install-cluster-deps: /usr/lib/cni/$plugin missing" >&2; exit 1; }
done
