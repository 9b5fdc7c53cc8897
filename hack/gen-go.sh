#!/usr/bin/env bash
# Generates the Go side of the repository's contracts:
#   pkg/mgmtpb/            the management API client, from engine/proto/mgmt.proto (protoc + plugins)
#   api/v1alpha1/zz_generated.deepcopy.go, config/crd/bases/, config/rbac/role.yaml   (controller-gen)
#   charts/peregrine/crds/ byte-identical copies of config/crd/bases/ (Helm installs CRDs from there)
#
#   hack/gen-go.sh                 regenerate in place
#   hack/gen-go.sh --verify        regenerate into a temporary copy and fail when the committed files differ
#   hack/gen-go.sh --tools         only install the generators into bin/
#
# protoc comes from Debian (protobuf-compiler, installed by hack/install-deps.sh); the plugins and
# controller-gen are installed with `go install` at pinned versions into the repository's bin/.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROTOC_GEN_GO_VERSION="${PROTOC_GEN_GO_VERSION:-v1.36.11}"
PROTOC_GEN_GO_GRPC_VERSION="${PROTOC_GEN_GO_GRPC_VERSION:-v1.6.2}"
CONTROLLER_GEN_VERSION="${CONTROLLER_GEN_VERSION:-v0.20.1}"
LOCALBIN="${LOCALBIN:-$ROOT/bin}"
export GOTOOLCHAIN=local

# install NAME PACKAGE VERSION: go install into bin/ unless bin/NAME-VERSION is already there.
install_tool() {
  local name=$1 pkg=$2 ver=$3
  if [[ ! -x "$LOCALBIN/$name-$ver" ]]; then
    echo "gen-go: installing $pkg@$ver" >&2
    mkdir -p "$LOCALBIN"
    GOBIN="$LOCALBIN" go install "$pkg@$ver"
    mv "$LOCALBIN/$name" "$LOCALBIN/$name-$ver"
  fi
  ln -sf "$name-$ver" "$LOCALBIN/$name"
}

tools() {
  command -v protoc >/dev/null || { echo "gen-go: protoc not found; run hack/install-deps.sh (apt protobuf-compiler)" >&2; exit 1; }
  install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
  install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"
  install_tool controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen "$CONTROLLER_GEN_VERSION"
}

# generate DIR: regenerate every output under the tree DIR (the repository or a copy of it).
generate() {
  local dir=$1
  (
    cd "$dir"
    rm -f pkg/mgmtpb/*.pb.go
    PATH="$LOCALBIN:$PATH" protoc -I engine/proto \
      --go_out=. --go_opt=module=github.com/peregrine-storage/peregrine \
      --go-grpc_out=. --go-grpc_opt=module=github.com/peregrine-storage/peregrine \
      engine/proto/mgmt.proto
    "$LOCALBIN/controller-gen" object:headerFile=hack/boilerplate.go.txt paths=./api/...
    rm -f config/crd/bases/*.yaml
    "$LOCALBIN/controller-gen" crd paths=./api/... output:crd:artifacts:config=config/crd/bases
    mkdir -p charts/peregrine/crds
    rm -f charts/peregrine/crds/*.yaml
    cp config/crd/bases/*.yaml charts/peregrine/crds/
    "$LOCALBIN/controller-gen" rbac:roleName=peregrine-operator paths=./controllers/... paths=./csi/webhook/... output:rbac:artifacts:config=config/rbac
  )
}

GENERATED=(pkg/mgmtpb api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac/role.yaml charts/peregrine/crds)

case "${1:-}" in
  --tools) tools ;;
  --verify)
    tools
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    # A copy of what generation reads: the Go sources, the proto, the module files and the outputs.
    tar -C "$ROOT" --exclude=./engine/target --exclude=./bin --exclude=./.git -cf - \
      go.mod go.sum hack api controllers cmd pkg csi config charts/peregrine/crds engine/proto | tar -C "$tmp" -xf -
    generate "$tmp"
    status=0
    for p in "${GENERATED[@]}"; do
      if ! diff -r "$ROOT/$p" "$tmp/$p" >/dev/null; then
        echo "gen-go: $p is stale; run 'make go-generate' and commit the result" >&2
        diff -ru "$ROOT/$p" "$tmp/$p" | head -40 >&2 || true
        status=1
      fi
    done
    [[ $status == 0 ]] && echo "gen-go: generated files are up to date" >&2
    exit $status
    ;;
  "") tools; generate "$ROOT" ;;
  *) echo "gen-go.sh: unknown argument $1" >&2; exit 2 ;;
esac
