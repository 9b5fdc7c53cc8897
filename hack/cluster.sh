#!/usr/bin/env bash
# A real single-node Kubernetes (v1.35.4), offline, on this machine.
#
#   hack/cluster.sh up        start (or find running) every component; prints the kubeconfig path on
#                             stdout, everything else goes to stderr
#   hack/cluster.sh down      stop what up started, unmount, detach loop devices, delete cni0 and the
#                             iptables chains, restore sysctls; state (PKI, etcd, images) is kept
#   hack/cluster.sh down --purge   also delete the state dir and /var/lib/kubelet
#   hack/cluster.sh status    each component, the node, hugepages, emulated NVMe (exit 1 unless all run)
#   hack/cluster.sh import IMAGE.tar...   import docker-archive/OCI tarballs into the k8s.io namespace
#   hack/cluster.sh ctr ARGS... / crictl ARGS... / kubectl ARGS...   the tools, pointed at this cluster
#
# What runs (binaries from hack/build-kube.sh --node, cached; Debian packages from
# hack/install-cluster-deps.sh): containerd (its own instance: config, root, state and socket under the
# state dir, runc with cgroupfs, restrict_oom_score_adj, sandbox image = the locally built pause image),
# etcd on 127.0.0.1:2379, kube-apiserver on :6443 (service range 10.96.0.0/16), controller-manager,
# scheduler, kubelet (cgroupfs, cgroup v1 allowed, webhook authn/authz, root dir /var/lib/kubelet made an
# rshared bind mount for Bidirectional propagation), kube-proxy (iptables mode), CoreDNS (built by
# hack/build-coredns.sh; cluster.local from the API, NXDOMAIN for anything else: offline) on 10.244.0.1,
# the pods' cluster DNS. Pods get 10.244.0.0/24
# on the bridge cni0 (host-local IPAM, masquerade, portmap); forwarding from pods to anything but cni0
# is dropped (chain PEREGRINE-ISOLATE in mangle FORWARD), so pod traffic stays on the machine. Pods with
# dnsPolicy Default get a resolv.conf that points at their own loopback.
#
# Hugepages: vm.nr_hugepages is raised to PEREGRINE_CLUSTER_HUGEPAGES (512 x 2 MiB = 1 GiB) before the
# kubelet starts, so hugepages-2Mi shows in the node's allocatable. Emulated NVMe: loop devices
# (direct I/O) over sparse files in $DIR/nvme, listed in $DIR/nvme/devices ("/dev/loopN FILE" lines).
#
# Environment:
#   PEREGRINE_CLUSTER_DIR        state dir (/var/lib/peregrine-cluster): pki/, kubeconfig/, etcd/,
#                                containerd/, logs/, run/ (pid files, saved sysctls), nvme/
#   PEREGRINE_CLUSTER_NVME       COUNTxSIZE of emulated NVMe devices (3x4G); 0 for none
#   PEREGRINE_CLUSTER_HUGEPAGES  2 MiB hugepages to reserve (512)
#   PEREGRINE_CLUSTER_API_PORT   kube-apiserver port (6443)
#
# Measured on the 2-core, 24 GiB Debian 12 machine (kube binaries, crictl and Debian packages already
# cached/installed; building them once adds ~5.5 min for kube, ~70 s for crictl, ~30 s for apt):
#   cold up (empty state dir: PKI, pause image, etcd bootstrap, node Ready, default SA)   12-13 s
#   warm up (after down; state kept, earlier pods come back)                             5-6 s
#   up when everything already runs                                                      ~1.2 s
#   down (a few pods running)                                                            ~10 s
set -euo pipefail

# --- Settings ----------------------------------------------------------------------------------------
HACK="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${PEREGRINE_CLUSTER_DIR:-/var/lib/peregrine-cluster}"
KUBELET_DIR=/var/lib/kubelet # fixed: CSI drivers and their manifests assume it
API_PORT="${PEREGRINE_CLUSTER_API_PORT:-6443}"
HUGEPAGES="${PEREGRINE_CLUSTER_HUGEPAGES:-512}"
NVME_SPEC="${PEREGRINE_CLUSTER_NVME:-3x4G}"

KUBE_VERSION=v1.35.4
CRICTL_VERSION=v1.34.0 # the Go proxy serves v1.34.0 and v1.37.0 of sigs.k8s.io/cri-tools, not v1.35.0
PAUSE_IMAGE=peregrine.local/pause:3.10
CLUSTER_CIDR=10.244.0.0/16
POD_CIDR=10.244.0.0/24 # the node's share of CLUSTER_CIDR; the bridge's subnet
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1 # first address of SERVICE_CIDR: the kubernetes Service
BRIDGE=cni0
DNS_IP=10.244.0.1 # the bridge's own address (the pods' gateway): CoreDNS answers there
CNI_NETWORK=peregrine # the CNI network name; the bridge/portmap plugins tag their iptables rules with it
ETCD_CLIENT_PORT=2379
ETCD_PEER_PORT=2380

PKI="$DIR/pki"
KCFG="$DIR/kubeconfig"
LOGS="$DIR/logs"
RUN="$DIR/run"
CTRD="$DIR/containerd"
SOCK="$CTRD/containerd.sock"
ADMIN_KUBECONFIG="$KCFG/admin.conf"
KBIN="" # the kube binaries' directory, set by kube_bin or kube_bin_cached
CRICTL_BIN="${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/crictl-$CRICTL_VERSION/crictl"

# Start order; down goes the other way.
COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns)

# Sysctls the kubelet, kube-proxy, the bridge plugin or this script may change; saved before the first
# change and restored by down.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)

T0=$SECONDS
log() { printf '[cluster %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- Small helpers -----------------------------------------------------------------------------------

need_root() { [[ $(id -u) == 0 ]] || die "must run as root (mounts, loop devices, iptables, containerd)"; }

# One cluster.sh at a time per state dir: two concurrent ups would start everything twice.
take_lock() {
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 600 9 || die "another cluster.sh holds $DIR/.lock"
}

node_name() { hostname | tr '[:upper:]' '[:lower:]'; }

# The host's primary IPv4 address: the one on the interface of the default route (found from the
# routing table, no traffic sent), else the first global address.
host_ip() {
  local dev ip
  dev="$(ip -4 -o route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}')"
  if [[ -n "$dev" ]]; then
    ip="$(ip -4 -o addr show dev "$dev" scope global | awk '{split($4, a, "/"); print a[1]; exit}')"
  fi
  [[ -n "${ip:-}" ]] || ip="$(ip -4 -o addr show scope global | awk '{split($4, a, "/"); print a[1]; exit}')"
  [[ -n "$ip" ]] || die "no global IPv4 address: the apiserver needs a non-loopback address to advertise"
  echo "$ip"
}

port_busy() { [[ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]]; }

# kube binaries: hack/build-kube.sh is a no-op when they are cached, and prints their directory.
kube_bin() {
  if [[ -z "$KBIN" ]]; then
    KBIN="$(GOTOOLCHAIN=local bash "$HACK/build-kube.sh" --node)" || die "hack/build-kube.sh --node failed"
  fi
}
# Finding the cached binaries without building (status, down).
kube_bin_cached() {
  KBIN="${KUBE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/peregrine/kube-$KUBE_VERSION}/bin"
}

kubectl_() { "$KBIN/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
ctr_() { ctr --address "$SOCK" --namespace k8s.io "$@"; }
crictl_() { "$CRICTL_BIN" --config "$DIR/crictl.yaml" "$@"; }

# wait_for SECONDS WHAT COMMAND...: polls COMMAND every 0.5 s.
wait_for() {
  local deadline=$((SECONDS + $1)) what="$2"
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
  log "$what ok"
}

# update_file DEST < content: replaces DEST only when the content differs; status 0 when it did.
# Rewriting an unchanged file is not harmless: kube-proxy exits when its config file is written to.
update_file() {
  local dest="$1"
  cat >"$dest.new"
  if cmp -s "$dest.new" "$dest"; then
    rm -f "$dest.new"
    return 1
  fi
  mv "$dest.new" "$dest"
}

# --- Processes ---------------------------------------------------------------------------------------
# Each component is started detached (own session, stdin closed, output to logs/NAME.log); its pid goes
# to run/NAME.pid and the binary it must be running to run/NAME.exe, so a recycled pid is never taken
# for ours.

pid_of() { # prints the pid if NAME runs, fails otherwise
  local name="$1" pid exe want
  pid="$(cat "$RUN/$name.pid" 2>/dev/null)" || return 1
  want="$(cat "$RUN/$name.exe" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 1
  [[ "${exe% (deleted)}" == "$want" ]] || return 1 # a rebuilt binary shows as "(deleted)"
  echo "$pid"
}

start_daemon() { # start_daemon NAME BINARY ARGS...
  local name="$1" bin="$2"
  shift 2
  local running
  if running="$(pid_of "$name")"; then
    # Same command line: nothing to do. Different (flags changed, host address changed): restart.
    if cmp -s <(printf '%s\0' "$bin" "$@") "/proc/$running/cmdline"; then
      log "$name already running (pid $running)"
      return
    fi
    log "$name runs with other arguments: restarting it"
    stop_daemon "$name"
  fi
  # Keep logs bounded across many ups: one rotation.
  if [[ -f "$LOGS/$name.log" ]] && (($(stat -c %s "$LOGS/$name.log") > 50 * 1024 * 1024)); then
    mv -f "$LOGS/$name.log" "$LOGS/$name.log.1"
  fi
  echo "=== $(date -Is) starting $bin $*" >>"$LOGS/$name.log"
  # Without job control a background job is not a process group leader, so setsid execs in place and
  # $! is the daemon's own pid. fd 9 (the lock) must not be inherited, or the daemon would hold it.
  setsid "$bin" "$@" </dev/null >>"$LOGS/$name.log" 2>&1 9>&- &
  local pid=$!
  readlink -f "$bin" >"$RUN/$name.exe"
  date +%s >"$RUN/$name.started"
  echo "$pid" >"$RUN/$name.pid"
  sleep 0.2
  if ! pid_of "$name" >/dev/null; then
    tail -n 20 "$LOGS/$name.log" >&2
    die "$name exited at once; log: $LOGS/$name.log"
  fi
  log "$name started (pid $pid, log $LOGS/$name.log)"
}

# stop_daemons GRACE_SECONDS NAME...: SIGTERM to all at once (each takes a second or two to shut
# down gracefully), SIGKILL to those still there after GRACE_SECONDS.
stop_daemons() {
  local grace="$1" name pid
  shift
  local -A pids=()
  for name in "$@"; do
    if pid="$(pid_of "$name")"; then
      pids[$name]=$pid
      kill -TERM "$pid" 2>/dev/null || true
    else
      rm -f "$RUN/$name.pid"
    fi
  done
  local deadline=$((SECONDS + grace))
  for name in "${!pids[@]}"; do
    pid=${pids[$name]}
    while [[ -d /proc/$pid ]] && ((SECONDS < deadline)); do sleep 0.1; done
    if [[ -d /proc/$pid ]]; then
      log "$name (pid $pid) ignored SIGTERM for ${grace}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
    rm -f "$RUN/$name.pid"
    log "$name stopped (pid $pid)"
  done
}
stop_daemon() { stop_daemons "${2:-20}" "$1"; } # stop_daemon NAME [GRACE_SECONDS]

# Fails (with the end of the log) when a component died while we waited for it.
alive_or_die() {
  pid_of "$1" >/dev/null && return
  tail -n 30 "$LOGS/$1.log" >&2
  die "$1 died; log: $LOGS/$1.log"
}

# --- Sysctls -----------------------------------------------------------------------------------------

save_sysctls() {
  [[ -f "$RUN/sysctl.saved" ]] && return # saved by an earlier up: those are the originals
  local k v
  for k in "${SYSCTLS[@]}"; do
    v="$(sysctl -n "$k" 2>/dev/null)" || continue
    printf '%s=%s\n' "$k" "$v"
  done >"$RUN/sysctl.saved.tmp"
  printf 'vm.nr_hugepages=%s\n' "$(sysctl -n vm.nr_hugepages)" >>"$RUN/sysctl.saved.tmp"
  mv "$RUN/sysctl.saved.tmp" "$RUN/sysctl.saved"
}

restore_sysctls() {
  [[ -f "$RUN/sysctl.saved" ]] || return 0
  local line k v now
  while IFS= read -r line; do
    k="${line%%=*}" v="${line#*=}"
    now="$(sysctl -n "$k" 2>/dev/null)" || continue
    if [[ "$k" == vm.nr_hugepages ]]; then
      # Someone else may have changed the count since; give back only what we set.
      local ours
      ours="$(cat "$RUN/hugepages.set" 2>/dev/null || echo)"
      if [[ "$now" != "$ours" ]]; then
        log "vm.nr_hugepages is $now, not the $ours up set: left as is"
        continue
      fi
    fi
    if [[ "$now" != "$v" ]]; then
      sysctl -qw "$k=$v" && log "restored $k=$v (was $now)"
    fi
  done <"$RUN/sysctl.saved"
  rm -f "$RUN/sysctl.saved" "$RUN/hugepages.set"
}

# Hugepages are read by the kubelet at start: reserve them first. Never lowers an existing reservation.
reserve_hugepages() {
  local now
  now="$(sysctl -n vm.nr_hugepages)"
  if ((now < HUGEPAGES)); then
    sysctl -qw vm.nr_hugepages="$HUGEPAGES"
    now="$(sysctl -n vm.nr_hugepages)"
    ((now >= HUGEPAGES)) || log "WARNING: asked for $HUGEPAGES hugepages, the kernel gave $now (fragmented memory)"
  fi
  echo "$now" >"$RUN/hugepages.set"
  log "hugepages: vm.nr_hugepages=$now ($((now * 2)) MiB)"
}

# --- PKI and kubeconfigs -----------------------------------------------------------------------------
# RSA 2048 everywhere, as kubeadm does: the keys every TLS client copes with.

pki_ca() { # pki_ca NAME CN
  [[ -f "$PKI/$1.crt" && -f "$PKI/$1.key" ]] && return
  openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 3650 \
    -keyout "$PKI/$1.key" -out "$PKI/$1.crt" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    2>/dev/null
}

pki_cert() { # pki_cert NAME CA SUBJECT client|server|both [SAN]
  local name="$1" ca="$2" subj="$3" usage="$4" san="${5:-}" eku
  [[ -f "$PKI/$name.crt" && -f "$PKI/$name.key" ]] && return
  case "$usage" in
    client) eku=clientAuth ;; server) eku=serverAuth ;; both) eku=serverAuth,clientAuth ;;
  esac
  local ext="$PKI/$name.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } >"$ext"
  openssl req -new -nodes -newkey rsa:2048 -keyout "$PKI/$name.key" \
    -out "$PKI/$name.csr" -subj "$subj" 2>/dev/null
  openssl x509 -req -sha256 -days 365 -in "$PKI/$name.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
  chmod 600 "$PKI/$name.key"
}

make_pki() {
  local ip="$1" node="$2"
  mkdir -p "$PKI" && chmod 700 "$PKI"
  # Certificates naming the host's address are remade when that address changed.
  if [[ "$(cat "$PKI/host-ip" 2>/dev/null)" != "$ip" ]]; then
    rm -f "$PKI"/apiserver.{crt,key} "$PKI"/kubelet-serving.{crt,key}
    echo "$ip" >"$PKI/host-ip"
  fi
  pki_ca ca peregrine-ca
  pki_ca front-proxy-ca peregrine-front-proxy-ca
  pki_cert apiserver ca /CN=kube-apiserver server \
    "IP:127.0.0.1,IP:$ip,IP:$SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:$node"
  pki_cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" client
  pki_cert front-proxy-client front-proxy-ca /CN=front-proxy-client client
  pki_cert admin ca "/O=system:masters/CN=kubernetes-admin" client
  pki_cert controller-manager ca /CN=system:kube-controller-manager client
  pki_cert scheduler ca /CN=system:kube-scheduler client
  pki_cert kubelet ca "/O=system:nodes/CN=system:node:$node" client
  pki_cert kubelet-serving ca "/O=system:nodes/CN=system:node:$node" server "DNS:$node,DNS:localhost,IP:$ip,IP:127.0.0.1"
  pki_cert kube-proxy ca /CN=system:kube-proxy client
  if [[ ! -f "$PKI/sa.key" ]]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    chmod 600 "$PKI/sa.key"
  fi
}

write_kubeconfig() { # write_kubeconfig NAME CERT_NAME
  local out="$KCFG/$1.conf" cert="$2"
  mkdir -p "$KCFG" && chmod 700 "$KCFG"
  cat >"$out.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: peregrine
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$cert.crt")
    client-key-data: $(base64 -w0 "$PKI/$cert.key")
contexts:
- name: peregrine
  context:
    cluster: peregrine
    user: $1
current-context: peregrine
EOF
  chmod 600 "$out.tmp"
  mv "$out.tmp" "$out"
}

make_kubeconfigs() {
  write_kubeconfig admin admin
  write_kubeconfig controller-manager controller-manager
  write_kubeconfig scheduler scheduler
  write_kubeconfig kubelet kubelet
  write_kubeconfig kube-proxy kube-proxy
}

# --- containerd, pause image, CNI --------------------------------------------------------------------

write_containerd_config() { # status 0 when config.toml changed
  local same=0
  mkdir -p "$CTRD/root" "$CTRD/state" "$CTRD/opt" "$DIR/cni/net.d" "$DIR/cni/ipam"
  # Own root/state/socket so a system containerd (if any) is never touched. Netns mounts under the
  # state dir so down finds them. opt plugin path moved off /opt.
  update_file "$CTRD/config.toml" <<EOF || same=1
version = 2
root = "$CTRD/root"
state = "$CTRD/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$SOCK"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: containers may not get an oom_score_adj below containerd's own.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  tolerate_missing_hugetlb_controller = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$DIR/cni/net.d"
    max_conf_num = 1
EOF
  local ret=$same
  update_file "$DIR/crictl.yaml" <<EOF || true
runtime-endpoint: unix://$SOCK
image-endpoint: unix://$SOCK
timeout: 30
EOF
  return "$ret"
}

# Bridge + host-local + portmap; containerd adds the loopback plugin for lo by itself. IPAM state in
# the state dir rather than /var/lib/cni, so it is ours alone.
write_cni_config() {
  update_file "$DIR/cni/net.d/10-peregrine.conflist" <<EOF || true
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$DIR/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

# The pause image: built from hack/pause when missing or when its sources changed, imported once.
ensure_pause_image() {
  local tar="$DIR/images/pause.tar"
  mkdir -p "$DIR/images"
  if [[ ! -f "$tar" || "$HACK/pause/pause.c" -nt "$tar" || "$HACK/pause/build-image.sh" -nt "$tar" ]]; then
    bash "$HACK/pause/build-image.sh" "$tar" "$PAUSE_IMAGE"
    ctr_ images rm "$PAUSE_IMAGE" >/dev/null 2>&1 || true
  fi
  if [[ -z "$(ctr_ images ls -q "name==$PAUSE_IMAGE" 2>/dev/null)" ]]; then
    ctr_ images import "$tar" >&2
    log "imported $PAUSE_IMAGE"
  fi
}

# crictl tears pod sandboxes down through CRI (so CNI DEL runs and netns are unmounted). Debian 12
# has no cri-tools: build it from its Go module once, cached like the kube binaries.
ensure_crictl() {
  [[ -x "$CRICTL_BIN" ]] && return
  local mod
  mod="$(dirname "$CRICTL_BIN")/src"
  log "building crictl $CRICTL_VERSION from its Go module (once, ~70 s)"
  rm -rf "$mod" && mkdir -p "$mod"
  printf 'module peregrine.local/crictl-build\n\ngo 1.24\n\nrequire sigs.k8s.io/cri-tools %s\n' "$CRICTL_VERSION" >"$mod/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/cri-tools/cmd/crictl"\n' >"$mod/tools.go"
  (cd "$mod" && export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 && go mod tidy >&2 &&
    go build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
      -o "$CRICTL_BIN.new" sigs.k8s.io/cri-tools/cmd/crictl >&2) || die "crictl build failed"
  mv "$CRICTL_BIN.new" "$CRICTL_BIN"
}

# --- Network isolation and iptables cleanup ----------------------------------------------------------

# Pod traffic stays on the machine: anything forwarded from the pod range to an interface other than
# the bridge (the uplink above all) is dropped, and so is anything forwarded into the pod range from
# elsewhere. In mangle FORWARD, which runs before filter FORWARD, so no ACCEPT that kube-proxy or a CNI
# plugin puts in filter can get ahead of it. Pod-to-host traffic (the apiserver behind 10.96.0.1) is
# INPUT, not FORWARD, and is unaffected.
isolate_pods() {
  if ! iptables -t mangle -S PEREGRINE-ISOLATE >/dev/null 2>&1; then
    iptables -t mangle -N PEREGRINE-ISOLATE
    iptables -t mangle -A PEREGRINE-ISOLATE -s "$CLUSTER_CIDR" ! -o "$BRIDGE" -j DROP
    iptables -t mangle -A PEREGRINE-ISOLATE -d "$CLUSTER_CIDR" ! -i "$BRIDGE" -j DROP
  fi
  iptables -t mangle -C FORWARD -j PEREGRINE-ISOLATE 2>/dev/null || iptables -t mangle -I FORWARD 1 -j PEREGRINE-ISOLATE
}

# Deletes the rules of TABLE printed by `-S` that match a grep -E pattern (comments make -S output
# shell-quoted, hence eval).
ipt_delete_rules() { # ipt_delete_rules CMD TABLE PATTERN
  local cmd="$1" table="$2" pattern="$3" rule
  { "$cmd" -t "$table" -S 2>/dev/null | grep -E '^-A ' | grep -E -- "$pattern" || true; } | while IFS= read -r rule; do
    eval "$cmd -t $table -D ${rule#-A }" 2>/dev/null || true
  done
}

chain_empty() { # chain_empty CMD TABLE CHAIN: no rule in it (only its -N line)
  [[ "$("$1" -t "$2" -S "$3" 2>/dev/null | grep -cv '^-N')" == 0 ]]
}

ipt_delete_chain() { # ipt_delete_chain CMD TABLE CHAIN: drops the jumps to it, flushes it, deletes it
  local cmd="$1" table="$2" chain="$3"
  ipt_delete_rules "$cmd" "$table" "-j $chain( |\$)"
  "$cmd" -t "$table" -F "$chain" 2>/dev/null || true
  "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
}

# What kube-proxy, the kubelet, the CNI plugins (for our network) and isolate_pods made, in IPv4 and
# IPv6. CNI chains of other users (podman uses CNI-* too) are kept: only rules tagged with our network
# name go, and the shared portmap chains only when no one has a port mapping left.
cleanup_iptables() {
  local cmd table chain
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    for table in filter nat mangle raw; do
      "$cmd" -t "$table" -S >/dev/null 2>&1 || continue
      # KUBE-* and PEREGRINE-*: all ours. Jumps first, then flush every chain (they jump to each
      # other), then delete them.
      local chains
      chains="$("$cmd" -t "$table" -S | awk '/^-N (KUBE-|PEREGRINE-)/ {print $2}')"
      for chain in $chains; do ipt_delete_rules "$cmd" "$table" "^-A [A-Z]+ .*-j $chain( |\$)"; done
      for chain in $chains; do "$cmd" -t "$table" -F "$chain" 2>/dev/null || true; done
      for chain in $chains; do "$cmd" -t "$table" -X "$chain" 2>/dev/null || true; done
      # CNI: rules tagged with our network, then per-pod chains (CNI-<hash>, CNI-DN-<hash>) left
      # empty. CNI-FORWARD/CNI-ADMIN (firewall plugin) are podman's, never ours.
      ipt_delete_rules "$cmd" "$table" "name: \\\\\"$CNI_NETWORK\\\\\""
      for chain in $("$cmd" -t "$table" -S | awk '/^-N CNI-(DN-)?[0-9a-f]+$/ {print $2}'); do
        if chain_empty "$cmd" "$table" "$chain"; then
          ipt_delete_chain "$cmd" "$table" "$chain"
        fi
      done
      if [[ "$table" == nat ]] && "$cmd" -t nat -S CNI-HOSTPORT-DNAT >/dev/null 2>&1 &&
        chain_empty "$cmd" nat CNI-HOSTPORT-DNAT; then
        for chain in CNI-HOSTPORT-DNAT CNI-HOSTPORT-SETMARK CNI-HOSTPORT-MASQ; do
          ipt_delete_chain "$cmd" nat "$chain"
        done
      fi
    done
  done
}

# --- Emulated NVMe -----------------------------------------------------------------------------------

nvme_count() { [[ "$NVME_SPEC" == *x* ]] && echo "${NVME_SPEC%%x*}" || echo "$NVME_SPEC"; }
nvme_size() { [[ "$NVME_SPEC" == *x* ]] && echo "${NVME_SPEC#*x}" || echo 4G; }

# Sparse files in $DIR/nvme, each behind a loop device with direct I/O (the engines use O_DIRECT and
# the page cache would only double the memory used). Existing files are reused as they are: their
# content is an engine's data.
prepare_nvme() {
  local count size i f dev
  count="$(nvme_count)" size="$(nvme_size)"
  [[ "$count" =~ ^[0-9]+$ ]] || die "PEREGRINE_CLUSTER_NVME=$NVME_SPEC: want COUNTxSIZE, e.g. 3x4G"
  mkdir -p "$DIR/nvme"
  : >"$DIR/nvme/devices.tmp"
  for ((i = 0; i < count; i++)); do
    f="$DIR/nvme/nvme$i.img"
    [[ -f "$f" ]] || truncate -s "$size" "$f"
    dev="$(losetup -n -O NAME -j "$f" | head -n1)"
    if [[ -z "$dev" ]]; then
      dev="$(losetup --find --show --direct-io=on "$f" 2>/dev/null)" || dev="$(losetup --find --show "$f")"
    fi
    echo "$dev $f" >>"$DIR/nvme/devices.tmp"
  done
  mv "$DIR/nvme/devices.tmp" "$DIR/nvme/devices"
  ((count == 0)) || log "emulated NVMe: $(awk '{printf "%s ", $1}' "$DIR/nvme/devices")($size each, list in $DIR/nvme/devices)"
}

release_nvme() {
  local f dev
  for f in "$DIR"/nvme/nvme*.img; do
    [[ -f "$f" ]] || continue
    for dev in $(losetup -n -O NAME -j "$f"); do
      losetup -d "$dev" && log "detached $dev ($f)"
    done
  done
  rm -f "$DIR/nvme/devices"
}

# --- Mounts ------------------------------------------------------------------------------------------

# The kubelet root dir as an rshared bind mount of itself: Bidirectional mount propagation (the CSI node
# plugin's mounts reaching other pods) needs the kubelet dir to be shared, and / is private here.
share_kubelet_dir() {
  mkdir -p "$KUBELET_DIR"
  if ! mountpoint -q "$KUBELET_DIR"; then
    mount --bind "$KUBELET_DIR" "$KUBELET_DIR"
    touch "$RUN/kubelet-bind"
  fi
  mount --make-rshared "$KUBELET_DIR"
}

# Unmounts everything below PATH, deepest first (lazily when busy: a dead FUSE daemon's mount), and
# PATH itself when asked.
unmount_below() { # unmount_below PATH [self]
  local path="$1" self="${2:-}" m
  while read -r m; do
    [[ -z "$m" ]] && continue
    if [[ "$m" == "$path" && "$self" != self ]]; then continue; fi
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "WARNING: cannot unmount $m"
  done < <(findmnt -rn -o TARGET | awk -v p="$path" '$0 == p || index($0, p "/") == 1' | sort -r)
}

# --- up ----------------------------------------------------------------------------------------------

write_kubelet_config() { # status 0 when config.yaml changed
  local same=0
  mkdir -p "$DIR/kubelet"
  # dnsPolicy Default: the pods' resolver is their own loopback, so name lookups fail fast and locally.
  printf 'nameserver 127.0.0.1\noptions ndots:1 timeout:1 attempts:1\n' | update_file "$DIR/kubelet/resolv.conf" || true
  update_file "$DIR/kubelet/config.yaml" <<EOF || same=1
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
# cgroup v1 (hybrid) machine without systemd as init.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
# With containerd's restrict_oom_score_adj, no CAP_SYS_RESOURCE is needed.
oomScoreAdj: 0
containerRuntimeEndpoint: unix://$SOCK
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: $DIR/kubelet/resolv.conf
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
registerNode: true
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
rotateCertificates: false
serverTLSBootstrap: false
# Images cannot be pulled again here: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The shared disk is often more than 85% full; evict only when really short.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1Gi
  imagefs.available: 1Gi
  nodefs.inodesFree: 1%
  imagefs.inodesFree: 1%
maxPods: 110
# Flexvolume drivers (none) looked up under the kubelet dir, not /usr/libexec, which it would create.
volumePluginDir: $KUBELET_DIR/volume-plugins
serializeImagePulls: false
containerLogMaxSize: 10Mi
EOF
  return "$same"
}

write_kube_proxy_config() { # status 0 when config.yaml changed
  local same=0
  mkdir -p "$DIR/kube-proxy"
  update_file "$DIR/kube-proxy/config.yaml" <<EOF || same=1
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $KCFG/kube-proxy.conf
mode: iptables
clusterCIDR: $CLUSTER_CIDR
hostnameOverride: $(node_name)
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the machine's conntrack settings alone (0 = do not set) and route_localnet off.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
nodePortAddresses: ["primary"]
EOF
  return "$same"
}

check_port() { # check_port COMPONENT PORT: before starting COMPONENT, its port must be free
  pid_of "$1" >/dev/null && return
  port_busy "$2" && die "port $2 (for $1) is taken by another process: $(ss -Hltnp "sport = :$2" | head -n1)"
  return 0
}

start_containerd() {
  if write_containerd_config && pid_of containerd >/dev/null; then
    log "containerd config changed: restarting it (containers keep running under their shims)"
    stop_daemon containerd 30
  fi
  write_cni_config
  if ! pid_of containerd >/dev/null; then
    rm -f "$SOCK"
    start_daemon containerd "$(command -v containerd)" --config "$CTRD/config.toml"
  fi
  wait_for 60 "containerd" ctr --address "$SOCK" version || { alive_or_die containerd; die "containerd not answering on $SOCK"; }
}

start_etcd() {
  check_port etcd "$ETCD_CLIENT_PORT"
  check_port etcd "$ETCD_PEER_PORT"
  start_daemon etcd "$KBIN/etcd" --name=peregrine --data-dir="$DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_CLIENT_PORT" --advertise-client-urls="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="peregrine=http://127.0.0.1:$ETCD_PEER_PORT" --log-level=warn
  wait_for 60 "etcd" etcd_healthy || { alive_or_die etcd; die "etcd not healthy"; }
}
etcd_healthy() { curl -fsS "http://127.0.0.1:$ETCD_CLIENT_PORT/health" | grep -q '"health":"true"'; }

start_apiserver() {
  local ip="$1"
  check_port kube-apiserver "$API_PORT"
  start_daemon kube-apiserver "$KBIN/kube-apiserver" \
    --advertise-address="$ip" --bind-address=0.0.0.0 --secure-port="$API_PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --client-ca-file="$PKI/ca.crt" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction --allow-privileged=true \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --profiling=false --v=1
  wait_for 120 "kube-apiserver" apiserver_ready || { alive_or_die kube-apiserver; die "kube-apiserver not ready"; }
}
apiserver_ready() { curl -fsS --cacert "$PKI/ca.crt" "https://127.0.0.1:$API_PORT/readyz" | grep -q '^ok'; }

start_controller_manager() {
  check_port kube-controller-manager 10257
  local kc="$KCFG/controller-manager.conf"
  start_daemon kube-controller-manager "$KBIN/kube-controller-manager" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --client-ca-file="$PKI/ca.crt" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" --root-ca-file="$PKI/ca.crt" \
    --service-account-private-key-file="$PKI/sa.key" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --use-service-account-credentials=true --controllers='*' --leader-elect=false \
    --allocate-node-cidrs=true --cluster-cidr="$CLUSTER_CIDR" --node-cidr-mask-size=24 \
    --service-cluster-ip-range="$SERVICE_CIDR" --cluster-name=peregrine \
    --flex-volume-plugin-dir="$KUBELET_DIR/volume-plugins" --v=1
}

start_scheduler() {
  check_port kube-scheduler 10259
  local kc="$KCFG/scheduler.conf"
  start_daemon kube-scheduler "$KBIN/kube-scheduler" \
    --kubeconfig="$kc" --authentication-kubeconfig="$kc" --authorization-kubeconfig="$kc" \
    --bind-address=127.0.0.1 --leader-elect=false --v=1
}

start_kubelet() {
  local ip="$1" node="$2"
  check_port kubelet 10250
  check_port kubelet 10248
  if write_kubelet_config && pid_of kubelet >/dev/null; then
    log "kubelet config changed: restarting it"
    stop_daemon kubelet
  fi
  share_kubelet_dir
  start_daemon kubelet "$KBIN/kubelet" --config="$DIR/kubelet/config.yaml" \
    --kubeconfig="$KCFG/kubelet.conf" --root-dir="$KUBELET_DIR" --cert-dir="$DIR/kubelet/pki" \
    --hostname-override="$node" --node-ip="$ip" --v=1
  wait_for 60 "kubelet healthz" curl -fsS http://127.0.0.1:10248/healthz || { alive_or_die kubelet; die "kubelet not healthy"; }
}

# The bridge is made here rather than by the bridge plugin at the first pod, so that CoreDNS can listen
# on its address before any pod exists (the plugin takes an existing bridge and address as they are).
ensure_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr show dev "$BRIDGE" | grep -q "inet $DNS_IP/" || ip addr add "$DNS_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

start_coredns() {
  local bin
  bin="$(bash "$HACK/build-coredns.sh")" || die "hack/build-coredns.sh failed"
  ensure_bridge
  mkdir -p "$DIR/coredns"
  bash "$HACK/build-coredns.sh" corefile --kubeconfig "$ADMIN_KUBECONFIG" --listen "$DNS_IP:53" |
    update_file "$DIR/coredns/Corefile" || true
  start_daemon coredns "$bin" -conf "$DIR/coredns/Corefile"
  wait_for 30 "CoreDNS ready" curl -fsS http://127.0.0.1:8181/ready || { alive_or_die coredns; die "CoreDNS not ready"; }
}

start_kube_proxy() {
  check_port kube-proxy 10256
  # kube-proxy exits by itself when its config file changes; stop it first so it is started anew.
  if write_kube_proxy_config && pid_of kube-proxy >/dev/null; then
    stop_daemon kube-proxy
  fi
  start_daemon kube-proxy "$KBIN/kube-proxy" --config="$DIR/kube-proxy/config.yaml" --v=1
}

# Ready, and said so by this kubelet: after a down/up the node object still carries the Ready=True
# of the kubelet before, so the heartbeat must be no older than the running kubelet.
node_ready() {
  local out status beat started
  out="$(kubectl_ get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null)" || return 1
  read -r status beat <<<"$out"
  [[ "$status" == True ]] || return 1
  started="$(cat "$RUN/kubelet.started" 2>/dev/null || echo 0)"
  (($(date -d "$beat" +%s) >= started - 1))
}

cmd_up() {
  need_root
  take_lock
  mkdir -p "$LOGS" "$RUN"
  # Packages and binaries (both no-ops once there).
  bash "$HACK/install-cluster-deps.sh" >&2 || die "hack/install-cluster-deps.sh failed"
  kube_bin
  ensure_crictl

  local ip node
  ip="$(host_ip)" # separate assignments: a failing host_ip must stop up
  node="$(node_name)"
  log "node $node, address $ip, state in $DIR"
  make_pki "$ip" "$node"
  make_kubeconfigs
  save_sysctls
  # Pod traffic crosses the bridge through iptables (br_netfilter), which kube-proxy's rules need.
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  isolate_pods
  prepare_nvme
  reserve_hugepages

  start_containerd
  ensure_pause_image
  start_etcd
  start_apiserver "$ip"
  start_controller_manager
  start_scheduler
  start_coredns
  start_kubelet "$ip" "$node"
  start_kube_proxy

  wait_for 60 "node $node registered" kubectl_ get node "$node" || { alive_or_die kubelet; die "node $node did not register"; }
  wait_for 120 "node $node Ready" node_ready "$node" || {
    kubectl_ describe node "$node" | sed -n '/Conditions:/,/Addresses:/p' >&2
    die "node $node not Ready; logs in $LOGS"
  }
  wait_for 60 "default ServiceAccount" kubectl_ -n default get serviceaccount default ||
    { alive_or_die kube-controller-manager; die "no default ServiceAccount"; }
  wait_for 60 "kube-proxy rules" iptables -t nat -S KUBE-SERVICES || { alive_or_die kube-proxy; die "kube-proxy wrote no rules"; }
  for c in "${COMPONENTS[@]}"; do alive_or_die "$c"; done

  log "up in $((SECONDS - T0)) s: kubeconfig $ADMIN_KUBECONFIG, containerd $SOCK, kubectl $KBIN/kubectl"
  echo "$ADMIN_KUBECONFIG"
}

# --- down --------------------------------------------------------------------------------------------

# Removes every pod sandbox through CRI: containers are stopped, CNI DEL runs (addresses, veths and
# per-pod iptables chains go), netns and shm mounts are released. Needs containerd, not the kubelet.
remove_sandboxes() {
  pid_of containerd >/dev/null || return 0
  [[ -x "$CRICTL_BIN" ]] || { log "WARNING: no crictl; sandboxes die with containerd, CNI DEL skipped"; return 0; }
  local ids
  ids="$(crictl_ pods -q 2>/dev/null || true)"
  [[ -z "$ids" ]] && return 0
  log "removing $(wc -w <<<"$ids") pod sandboxes"
  # shellcheck disable=SC2086
  crictl_ stopp $ids >/dev/null 2>&1 || true
  # shellcheck disable=SC2086
  crictl_ rmp -f $ids >/dev/null 2>&1 || true
}

# Shims of our containerd (their command line names our socket) that outlived it.
kill_our_shims() {
  local p cmdline
  for p in /proc/[0-9]*; do
    cmdline="$(tr '\0' ' ' 2>/dev/null <"$p/cmdline")" || continue
    [[ "$cmdline" == *containerd-shim* && "$cmdline" == *"-address $SOCK "* ]] || continue
    log "killing leftover shim ${p#/proc/}"
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  done
}

cmd_down() {
  need_root
  local purge=0
  [[ "${1:-}" == --purge ]] && purge=1
  [[ -d "$DIR" ]] || { log "nothing to do: no $DIR"; return 0; }
  take_lock
  kube_bin_cached
  mkdir -p "$RUN"

  # The kubelet first, so it restarts nothing; then the pods through CRI; then the rest.
  stop_daemons 20 coredns kube-proxy kubelet
  remove_sandboxes
  stop_daemon containerd 30
  kill_our_shims
  stop_daemons 20 kube-scheduler kube-controller-manager kube-apiserver
  stop_daemon etcd
  # Any component the ordered stops above miss (CoreDNS once was: left running, it served the
  # next cluster with the old cluster's credentials and held its ready port).
  stop_daemons 20 "${COMPONENTS[@]}"

  # Mounts: pod volumes under the kubelet dir, then the rshared bind itself if we made it; rootfs,
  # shm and netns mounts of containers under the state dir.
  unmount_below "$KUBELET_DIR"
  if [[ -f "$RUN/kubelet-bind" ]]; then
    while mountpoint -q "$KUBELET_DIR"; do umount "$KUBELET_DIR" 2>/dev/null || umount -l "$KUBELET_DIR"; done
    rm -f "$RUN/kubelet-bind"
    log "unmounted $KUBELET_DIR"
  fi
  unmount_below "$DIR"

  release_nvme
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link delete "$BRIDGE" && log "deleted bridge $BRIDGE"
  fi
  # Veths of pods whose CNI DEL never ran go with their netns; the bridge's IPAM records are stale.
  rm -rf "$DIR/cni/ipam"
  # Kube-proxy knows its own rules best; then the generic sweep for the kubelet's, CNI's and ours.
  if [[ -x "$KBIN/kube-proxy" ]]; then
    "$KBIN/kube-proxy" --cleanup >>"$LOGS/kube-proxy.log" 2>&1 || true
  fi
  cleanup_iptables
  log "iptables: KUBE-*, PEREGRINE-* and CNI rules of network $CNI_NETWORK removed"
  restore_sysctls

  if ((purge)); then
    rm -rf "$KUBELET_DIR"
    rm -rf "$DIR"
    log "purged $DIR and $KUBELET_DIR"
  fi
  log "down in $((SECONDS - T0)) s"
}

# --- status ------------------------------------------------------------------------------------------

cmd_status() {
  kube_bin_cached
  local c pid all=0 node
  node="$(node_name)"
  printf '%-24s %-8s %s\n' COMPONENT STATE PID
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "$c")"; then
      printf '%-24s %-8s %s\n' "$c" running "$pid"
    else
      printf '%-24s %-8s %s\n' "$c" stopped -
      all=1
    fi
  done
  echo
  if [[ -f "$ADMIN_KUBECONFIG" ]] && pid_of kube-apiserver >/dev/null && [[ -x "$KBIN/kubectl" ]]; then
    kubectl_ get node -o wide 2>&1 || true
    echo
    echo "allocatable: $(kubectl_ get node "$node" -o jsonpath='cpu={.status.allocatable.cpu} memory={.status.allocatable.memory} hugepages-2Mi={.status.allocatable.hugepages-2Mi} pods={.status.allocatable.pods}' 2>/dev/null)"
  else
    echo "node: apiserver not running"
  fi
  echo "hugepages: vm.nr_hugepages=$(sysctl -n vm.nr_hugepages)"
  if [[ -s "$DIR/nvme/devices" ]]; then
    echo "emulated NVMe:"
    while read -r dev f; do
      printf '  %s  %s  %s  direct-io=%s\n' "$dev" "$f" "$(numfmt --to=iec "$(stat -c %s "$f")")" \
        "$(losetup -n -O DIO "$dev" 2>/dev/null | tr -d ' ')"
    done <"$DIR/nvme/devices"
  else
    echo "emulated NVMe: none"
  fi
  echo "kubelet dir: $KUBELET_DIR ($(findmnt -n -o PROPAGATION "$KUBELET_DIR" 2>/dev/null || echo 'not mounted'))"
  echo "containerd socket: $SOCK"
  echo "kubeconfig: $ADMIN_KUBECONFIG"
  echo "logs: $LOGS"
  return "$all"
}

# --- main --------------------------------------------------------------------------------------------

usage() { sed -n '2,14p' "$0" >&2; }

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  status) shift; cmd_status "$@" ;;
  import)
    shift
    (($#)) || die "usage: cluster.sh import IMAGE.tar..."
    pid_of containerd >/dev/null || die "containerd is not running: hack/cluster.sh up first"
    for t in "$@"; do ctr_ images import "$t" >&2; done
    ;;
  ctr) shift; ctr_ "$@" ;;
  crictl) shift; crictl_ "$@" ;;
  kubectl) shift; kube_bin_cached; kubectl_ "$@" ;;
  -h | --help | help) usage ;;
  *) usage; exit 2 ;;
esac
