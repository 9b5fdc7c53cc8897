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
#   7. a training-like Job (config/samples/csi/training-job.yaml): a dataset of 2000 files
#      written, then read back in 3 shuffled epochs through the interception library, with its
#      progress, MiB/s and files/s
#
# Leaves the cluster up (KUBECONFIG printed at the end). `hack/demo.sh down` (make demo-down)
# removes it all: the samples and their volumes, the release, the snapshot add-on, then the
# cluster with its state, loop devices and emulated NVMe files (hack/cluster.sh down --purge).
# Environment: PROFILE (release), DEMO_TIMEOUT (seconds to wait for each step, 600).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
PROFILE="${PROFILE:-release}"
WAIT="${DEMO_TIMEOUT:-600}"
T0=$SECONDS
log() { printf '[demo %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# down: everything the demo made, in the order that lets each part clean up after itself (the
# volumes while the driver runs, the CRs while the operator runs), then the cluster.
if [[ "${1:-}" == down ]]; then
  if bash hack/cluster.sh status >/dev/null 2>&1; then
    export KUBECONFIG="${PEREGRINE_CLUSTER_DIR:-/var/lib/peregrine-cluster}/kubeconfig/admin.conf"
    KUBECTL="$(bash hack/build-kube.sh --node)/kubectl"
    k() { "$KUBECTL" "$@"; }
    log "the samples and their volumes"
    k delete --ignore-not-found --wait --timeout="${WAIT}s" -f config/samples/csi/training-job.yaml \
      -f config/samples/csi/pod.yaml -f config/samples/csi/pvc.yaml >&2
    # What a failed e2e run left (hack/e2e.sh keeps the cluster for a look): its namespace, whose
    # pods and PVCs would otherwise keep their volumes, and the wait below would wait them out.
    k delete namespace --ignore-not-found --wait --timeout="${WAIT}s" "${E2E_NAMESPACE:-peregrine-e2e}" >&2 || true
    k wait --for=delete pv --all --timeout="${WAIT}s" >&2 || true
    k delete --ignore-not-found --wait --timeout="${WAIT}s" -f config/samples/storage_v1alpha1_pool.yaml \
      -f config/samples/storage_v1alpha1_serverset.yaml -f config/samples/csi/storageclass.yaml >&2
    log "the release and the snapshot add-on"
    HELM="$(bash hack/build-helm.sh)"
    "$HELM" uninstall peregrine -n peregrine-system --wait --timeout "${WAIT}s" --ignore-not-found >&2
    KUBECTL="$KUBECTL" bash hack/snapshot-addon.sh uninstall >&2
  fi
  log "the cluster, its state and the demo's files"
  bash hack/cluster.sh down --purge >&2
  # The sample ServerSet's emulated NVMe and the node plugin's state (config/samples, config/csi),
  # unless something still holds them (engines of another cluster than the one stopped above).
  for f in /var/lib/peregrine/tank-nvme*.img; do
    [[ -e "$f" ]] || continue
    if fuser -s "$f" 2>/dev/null; then log "kept $f: a process still has it open"; else rm -f "$f"; fi
  done
  rm -rf /var/lib/peregrine/csi /var/lib/peregrine/il
  log "removed in $((SECONDS - T0)) s"
  exit 0
fi

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

# The engines' control plane runs with mutual TLS (docs/tls-kubernetes.md). Engines built before
# TLS refuse its configuration: with those only, the demo says so and runs without TLS, asked
# for explicitly (the chart's controlPlane.insecure and the ServerSet's spec.insecureControlPlane).
INSECURE=()
if ! grep -q allow_insecure "engine/target/$PROFILE/peregrine-engine"; then
  log "WARNING: engine/target/$PROFILE/peregrine-engine has no TLS on its control plane: the release and the ServerSet run it insecure"
  INSECURE=(--set controlPlane.insecure=true)
fi

log "installing Peregrine with Helm (charts/peregrine): operator, CRDs, webhook, CSI driver"
HELM="$(bash hack/build-helm.sh)"
# A cluster left by an earlier run (its node restarted with it) runs the images of that run:
# the ones imported above have the same tags, so nothing in the pod templates changes. What it
# runs is restarted below, so that the demo shows the code just built.
REUSED=0
if "$HELM" status peregrine -n peregrine-system >/dev/null 2>&1; then REUSED=1; fi
# The local images (peregrine/*:dev, imported above; nothing to pull). The StorageClass comes
# from config/samples/csi below, so the chart's is off. --take-ownership adopts the same objects
# left by an install made with `kubectl apply -k config/default -k config/csi`.
"$HELM" upgrade --install peregrine charts/peregrine -n peregrine-system --create-namespace \
  --take-ownership --set imagePullPolicy=IfNotPresent --set storageClass.enabled=false "${INSECURE[@]}" \
  --wait --timeout "${WAIT}s" >&2
if ((REUSED)); then
  log "the release was there already: its operator and CSI driver restarted on the new images"
  k -n peregrine-system rollout restart deployment/peregrine-operator deployment/peregrine-csi-controller \
    daemonset/peregrine-csi-node >&2
  k -n peregrine-system rollout status deployment/peregrine-operator --timeout="${WAIT}s" >&2
  k -n peregrine-system rollout status deployment/peregrine-csi-controller --timeout="${WAIT}s" >&2
fi
k -n peregrine-system rollout status daemonset/peregrine-csi-node --timeout="${WAIT}s" >&2

log "a ServerSet of three engines and a Pool"
if ((${#INSECURE[@]})); then
  sed 's/^spec:$/spec:\n  insecureControlPlane: true/' config/samples/storage_v1alpha1_serverset.yaml | k apply -f - >&2
else
  k apply -f config/samples/storage_v1alpha1_serverset.yaml >&2
fi
k apply -f config/samples/storage_v1alpha1_pool.yaml >&2
if ((REUSED)); then
  # The StatefulSet makes them again, from the template the new operator renders, on the new image.
  log "the engine pods and the reader pod of the earlier run replaced"
  k delete pod -l storage.peregrine.dev/serverset=tank --ignore-not-found --wait=false >&2
  k delete -f config/samples/csi/pod.yaml --ignore-not-found --wait --timeout="${WAIT}s" >&2
fi
k wait --for=condition=Ready serverset/tank --timeout="${WAIT}s" >&2
k wait --for=condition=Ready pool/tank --timeout="${WAIT}s" >&2
k get serversets,pools >&2
k get serverset tank -o jsonpath='{range .status.conditions[?(@.type=="ControlPlaneTLS")]}control plane TLS: {.status} {.reason}: {.message}{"\n"}{end}' >&2

log "a StorageClass, a PVC and a pod"
k apply -f config/samples/csi/storageclass.yaml -f config/samples/csi/pvc.yaml -f config/samples/csi/pod.yaml >&2
k wait --for=jsonpath='{.status.phase}'=Bound pvc/peregrine-data --timeout="${WAIT}s" >&2
k wait --for=condition=Ready pod/peregrine-reader --timeout="${WAIT}s" >&2
sleep 2
log "what the pod sees"
k exec peregrine-reader -- sh -c 'id; df -h /data; ls -ln /data /data/out; tail -n 3 /data/out/log' >&2
k get pvc,pv >&2

log "a training-like job: a dataset of many files written, then read back in shuffled epochs"
k delete job peregrine-train --ignore-not-found --wait >&2
k apply -f config/samples/csi/training-job.yaml >&2
# A failure shows the pod's own account and the space left, then stops the demo.
train_failed() {
  k describe job/peregrine-train >&2
  k describe pod -l job-name=peregrine-train >&2
  k logs -l job-name=peregrine-train --all-containers --tail=50 >&2 || true
  k exec peregrine-reader -- df -h /data >&2 || true
  df -h / >&2
  die "the training job $1"
}
# Its progress as it goes: the logs follow once the container started (after its check container).
deadline=$((SECONDS + WAIT))
until k logs -f job/peregrine-train >&2 2>/dev/null; do
  ((SECONDS < deadline)) || train_failed "did not start"
  sleep 2
done
# Complete or failed, whichever comes first.
k wait --for=jsonpath='{.status.conditions[?(@.status=="True")].type}' job/peregrine-train \
  --timeout="${WAIT}s" >&2 || true
[[ "$(k get job/peregrine-train -o jsonpath='{.status.succeeded}')" == 1 ]] || train_failed "did not complete"
k logs job/peregrine-train -c peregrine-il-check-0 >&2
log "done in $((SECONDS - T0)) s; the cluster stays up: KUBECONFIG=$KUBECONFIG ($KUBECTL); bash hack/cluster.sh down stops it"
echo "$KUBECONFIG"
