#!/usr/bin/env bash
# The end-to-end suites (e2e/) on this machine's own cluster, as `make test` runs them:
#
#   1. hack/demo.sh: the images (from the Rust workspace's PROFILE binaries), the cluster, the Helm
#      release, the samples and the demo's training Job (which is itself a test: it checks every
#      byte it reads)
#   2. the test images for the interception check (hack/images.sh testimages), imported
#   3. the demo's Job, pod and PVC deleted (the suites use its ServerSet and Pool), then
#      go test ./e2e/ with E2E_UNINSTALL=1, so the last suite uninstalls the release and checks
#      that nothing is left
#   4. on success, hack/demo.sh down: the machine is left as it was (on failure the cluster stays
#      up for a look: KUBECONFIG is printed; `make demo-down` removes it)
#
# Environment: PROFILE (debug: what `cargo build --workspace` left; the dev profile is optimised),
# E2E_KEEP=1 keeps the cluster after a success too, and whatever e2e/ and hack/demo.sh read.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export PROFILE="${PROFILE:-debug}"
T0=$SECONDS
log() { printf '[e2e %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }

# The path is demo.sh's last line of output (a step may print more: a CI run once took all of
# it for the path, and kubectl fell back to localhost:8080).
KUBECONFIG="$(bash hack/demo.sh | tail -n 1)"
export KUBECONFIG
# The last suite uninstalls the release and wants no volume of the driver left (it would be
# stranded): the demo's workload and volume go first; its ServerSet and Pool are the suites' store.
log "the demo's workload and volume, before the suites"
KUBECTL="$(bash hack/build-kube.sh --node)/kubectl"
"$KUBECTL" delete --ignore-not-found --wait --timeout=300s -f config/samples/csi/training-job.yaml \
  -f config/samples/csi/pod.yaml -f config/samples/csi/pvc.yaml >&2
# (kubectl wait answers an error when no PV is left at all; the last suite checks none is.)
"$KUBECTL" wait --for=delete pv --all --timeout=300s >&2 || true
log "test images for the interception check"
bash hack/images.sh testimages
bash hack/images.sh --address "${PEREGRINE_CLUSTER_DIR:-/var/lib/peregrine-cluster}/containerd/containerd.sock" import
log "go test ./e2e/"
if ! E2E_UNINSTALL="${E2E_UNINSTALL:-1}" go test ./e2e/ -count=1 -timeout 40m -v; then
  log "the e2e suites failed; the cluster stays up: KUBECONFIG=$KUBECONFIG; make demo-down removes it"
  exit 1
fi
if [[ "${E2E_KEEP:-0}" == 1 ]]; then
  log "passed in $((SECONDS - T0)) s; the cluster stays up (E2E_KEEP=1): KUBECONFIG=$KUBECONFIG"
else
  bash hack/demo.sh down
  # Down stops every process the cluster started: none may still name its state directory.
  if left="$(pgrep -a -f "${PEREGRINE_CLUSTER_DIR:-/var/lib/peregrine-cluster}/")"; then
    log "processes of the cluster left after make demo-down:"$'\n'"$left"
    exit 1
  fi
  log "passed in $((SECONDS - T0)) s; the cluster is removed"
fi
