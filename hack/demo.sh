#!/usr/bin/env bash
# `make demo`: from a fresh machine to a PVC mounted in a pod, offline.
#
#   1. build: the engine workspace (release) and the Go binaries
#   2. images: debootstrap base, engine/operator/csi images from those binaries, CSI sidecars
#      (hack/images.sh)
#   3. a real single-node Kubernetes (hack/cluster.sh up), the images imported into its containerd
#   4. Peregrine installed with Helm (charts/peregrine; helm from hack/build-helm.sh): operator, CRDs,
#      webhook and the CSI driver, the same objects as config/default and config/csi
#   5. a ServerSet of three engines on emulated NVMe and a Pool (config/samples), then the CSI
#      samples: a StorageClass, a PVC and a pod that mounts it (with a subPath, an fsGroup and the
#      interception library preloaded)
#   6. what the pod sees: df of its volume and the file it writes
#
# Leaves the cluster up (KUBECONFIG printed at the end); `bash hack/cluster.sh down` stops it.
# Environment: PROFILE (release), DEMO_TIMEOUT (seconds to wait for each step, 600).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
PROFILE="${PROFILE:-release}"
WAIT="${DEMO_TIMEOUT:-600}"
T0=$SECONDS
log() { printf '[demo %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

log "dependencies"
bash hack/install-deps.sh
bash hack/install-cluster-deps.sh
bash hack/install-image-deps.sh

log "building the engine workspace ($PROFILE)"
if [[ "$PROFILE" == release ]]; then
  (cd engine && cargo build --release --workspace)
else
  (cd engine && cargo build --workspace)
fi

log "images"
PROFILE="$PROFILE" bash hack/images.sh base build sidecars

log "cluster"
# The sample ServerSet reserves 512 MiB of hugepages per engine.
export PEREGRINE_CLUSTER_HUGEPAGES="${PEREGRINE_CLUSTER_HUGEPAGES:-1024}"
KUBECONFIG="$(bash hack/cluster.sh up)"
export KUBECONFIG
CLUSTER_DIR="${PEREGRINE_CLUSTER_DIR:-/var/lib/peregrine-cluster}"
PROFILE="$PROFILE" bash hack/images.sh --address "$CLUSTER_DIR/containerd/containerd.sock" import
KUBECTL="$(bash hack/build-kube.sh --node)/kubectl"
KUBECTL="$KUBECTL" bash hack/snapshot-addon.sh install   # the cluster's snapshot add-on (CRDs, snapshot-controller), as managed clusters have
k() { "$KUBECTL" "$@"; }

log "installing Peregrine with Helm (charts/peregrine): operator, CRDs, webhook, CSI driver"
HELM="$(bash hack/build-helm.sh)"
# The local images (peregrine/*:dev, imported above; nothing to pull). The StorageClass comes
# from config/samples/csi below, so the chart's is off. --take-ownership adopts the same objects
# left by an install made with `kubectl apply -k config/default -k config/csi`.
"$HELM" upgrade --install peregrine charts/peregrine -n peregrine-system --create-namespace \
  --take-ownership --set imagePullPolicy=IfNotPresent --set storageClass.enabled=false \
  --wait --timeout "${WAIT}s" >&2
k -n peregrine-system rollout status daemonset/peregrine-csi-node --timeout="${WAIT}s" >&2

log "a ServerSet of three engines and a Pool"
k apply -f config/samples/storage_v1alpha1_serverset.yaml -f config/samples/storage_v1alpha1_pool.yaml >&2
k wait --for=condition=Ready serverset/tank --timeout="${WAIT}s" >&2
k wait --for=condition=Ready pool/tank --timeout="${WAIT}s" >&2
k get serversets,pools >&2

log "a StorageClass, a PVC and a pod"
k apply -f config/samples/csi/storageclass.yaml -f config/samples/csi/pvc.yaml -f config/samples/csi/pod.yaml >&2
k wait --for=jsonpath='{.status.phase}'=Bound pvc/peregrine-data --timeout="${WAIT}s" >&2
k wait --for=condition=Ready pod/peregrine-reader --timeout="${WAIT}s" >&2
sleep 2
log "what the pod sees"
k exec peregrine-reader -- sh -c 'id; df -h /data; ls -ln /data /data/out; tail -n 3 /data/out/log' >&2
k get pvc,pv >&2
log "done in $((SECONDS - T0)) s; the cluster stays up: KUBECONFIG=$KUBECONFIG ($KUBECTL); bash hack/cluster.sh down stops it"
echo "$KUBECONFIG"
