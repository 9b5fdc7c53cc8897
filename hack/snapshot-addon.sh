#!/usr/bin/env bash
# The volume snapshot add-on of a cluster: the snapshot.storage.k8s.io v1 CRDs (VolumeSnapshotClass,
# VolumeSnapshot, VolumeSnapshotContent) and the snapshot-controller (Deployment and RBAC in
# kube-system), both from external-snapshotter v8.3.0 as published in its Go modules.
#
#   hack/snapshot-addon.sh install     apply CRDs, RBAC, Deployment; wait until it is available
#   hack/snapshot-addon.sh uninstall   delete them (refused while VolumeSnapshots or contents exist)
#
# Managed clusters (GKE, EKS add-ons, OpenShift) come with this add-on; bare clusters such as
# hack/cluster.sh's do not, and without it PVCs with a VolumeSnapshot dataSource stay Pending and
# VolumeSnapshots are never answered. Peregrine's CSI driver (config/csi) only brings the sidecar
# half (csi-snapshotter). The manifests are taken, not written: the CRDs from the client module's
# config/crd (the client version the v8.3.0 controller is built against), the Deployment and RBAC
# from the main module's deploy/kubernetes/snapshot-controller, with the image replaced by the
# local one `hack/images.sh sidecars` builds (nothing is pulled here).
#
# Environment: KUBECONFIG; KUBECTL (kubectl on PATH, else hack/build-kube.sh --node's);
# SNAPSHOT_CONTROLLER_IMAGE (peregrine/snapshot-controller:v8.3.0); ADDON_TIMEOUT (seconds, 300).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
MODULE=github.com/kubernetes-csi/external-snapshotter/v8
VERSION=v8.3.0
CLIENT_MODULE=github.com/kubernetes-csi/external-snapshotter/client/v8
IMAGE="${SNAPSHOT_CONTROLLER_IMAGE:-peregrine/snapshot-controller:$VERSION}"
TIMEOUT="${ADDON_TIMEOUT:-300}"
CRDS=(volumesnapshotclasses volumesnapshotcontents volumesnapshots)

log() { echo "snapshot-addon: $*" >&2; }
die() { echo "snapshot-addon: error: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

(($# == 1)) || usage
case "$1" in
  install|uninstall) cmd="$1" ;;
  -h|--help) usage 0 ;;
  *) usage ;;
esac

if [[ -z "${KUBECTL:-}" ]]; then
  KUBECTL="$(command -v kubectl || true)"
  [[ -n "$KUBECTL" ]] || KUBECTL="$(bash "$ROOT/hack/build-kube.sh" --node)/kubectl"
fi
k() { "$KUBECTL" "$@"; }

# module_dir MODULE@VERSION: the module's directory in the Go module cache (downloaded if missing).
# Run outside any module so that this repository's go.mod plays no part.
module_dir() {
  local dir
  dir="$(cd / && GOFLAGS=-mod=mod GOWORK=off go mod download -json "$1" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  [[ -n "$dir" && -d "$dir" ]] || die "go mod download $1 gave no directory"
  echo "$dir"
}

main_dir="$(module_dir "$MODULE@$VERSION")"
# The client version this controller is built with (its go.mod's require; its replace of
# ./client applies only inside its own repository).
client_version="$(awk -v m="$CLIENT_MODULE" '$1 == m && $2 ~ /^v/ {print $2; exit}' "$main_dir/go.mod")"
[[ -n "$client_version" ]] || die "$MODULE@$VERSION/go.mod requires no $CLIENT_MODULE"
client_dir="$(module_dir "$CLIENT_MODULE@$client_version")"
crd_files=()
for c in "${CRDS[@]}"; do
  f="$client_dir/config/crd/snapshot.storage.k8s.io_$c.yaml"
  [[ -f "$f" ]] || die "$f missing"
  crd_files+=(-f "$f")
done

# The controller's manifests through a kustomization of our own that only swaps the image (the
# upstream Deployment names registry.k8s.io/sig-storage/snapshot-controller with some tag).
work="$(mktemp -d "${TMPDIR:-/tmp}/snapshot-addon.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp "$main_dir"/deploy/kubernetes/snapshot-controller/{rbac-snapshot-controller,setup-snapshot-controller}.yaml "$work/"
chmod u+w "$work"/*.yaml
cat >"$work/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- rbac-snapshot-controller.yaml
- setup-snapshot-controller.yaml
images:
- name: registry.k8s.io/sig-storage/snapshot-controller
  newName: ${IMAGE%:*}
  newTag: ${IMAGE##*:}
EOF
k kustomize "$work" >"$work/controller.yaml"
grep -q "image: $IMAGE\$" "$work/controller.yaml" || die "the upstream Deployment's image was not replaced by $IMAGE"

case "$cmd" in
  install)
    log "CRDs from $CLIENT_MODULE@$client_version: ${CRDS[*]}"
    k apply --server-side --force-conflicts "${crd_files[@]}" >&2
    for c in "${CRDS[@]}"; do
      k wait --for=condition=Established "crd/$c.snapshot.storage.k8s.io" --timeout="${TIMEOUT}s" >&2
    done
    log "snapshot-controller $VERSION ($IMAGE) in kube-system"
    k apply --server-side --force-conflicts -f "$work/controller.yaml" >&2
    # Available only minReadySeconds (35 s, upstream's) after the pods are ready: the controller
    # exits within 30 s if it cannot list the CRDs, so a pod that stays up has found them.
    if ! k -n kube-system rollout status deployment/snapshot-controller --timeout="${TIMEOUT}s" >&2; then
      k -n kube-system get pods -l app.kubernetes.io/name=snapshot-controller -o wide >&2 || true
      die "snapshot-controller not available (image $IMAGE missing from the node? hack/images.sh sidecars import)"
    fi
    log "installed"
    ;;
  uninstall)
    # Deleting the CRDs deletes every snapshot object, and contents with finalizers would then
    # hang the deletion with no controller left to release them.
    if k get crd volumesnapshots.snapshot.storage.k8s.io >/dev/null 2>&1; then
      left="$(k get volumesnapshots -A -o name 2>/dev/null; k get volumesnapshotcontents -o name 2>/dev/null)"
      [[ -z "$left" ]] || die "snapshot objects remain; delete them first (their content is deleted by the CSI driver per deletionPolicy):
$left"
    fi
    k delete --ignore-not-found -f "$work/controller.yaml" >&2
    k delete --ignore-not-found "${crd_files[@]}" >&2
    log "uninstalled"
    ;;
esac
