# Go side of Peregrine: operator, CRDs, generated management client, envtest suites.
# Included by the root Makefile (`include hack/go.mk`). Everything installs itself from the Go
# module proxy and Debian apt (protoc: protobuf-compiler, via hack/install-deps.sh).

GO ?= go
ENGINE ?= engine
CARGO ?= cargo
GO_PACKAGES := ./api/... ./controllers/... ./cmd/... ./pkg/... ./csi/... ./internal/... ./charts/...
# Where hack/build-kube.sh puts etcd, kube-apiserver and kubectl (override to share a cache).
KUBE_VERSION ?= v1.35.4
KUBE_CACHE_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/peregrine/kube-$(KUBE_VERSION)
PEREGRINE_ENGINE_BIN ?= $(CURDIR)/$(ENGINE)/target/debug/peregrine-engine
export GOTOOLCHAIN ?= local

.PHONY: go-generate go-verify go-lint go-build kube-bin kube-node-bin engine-bin go-test chart-lint

## go-generate: pkg/mgmtpb from engine/proto/mgmt.proto (protoc), deepcopy, CRDs and RBAC (controller-gen).
go-generate:
	bash hack/gen-go.sh

## go-verify: fail when the committed generated files differ from a fresh generation.
go-verify:
	bash hack/gen-go.sh --verify

## go-lint: gofmt and go vet.
go-lint:
	@out="$$(gofmt -l api controllers cmd pkg csi internal charts)"; if [ -n "$$out" ]; then echo "gofmt: not formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet $(GO_PACKAGES)

## chart-lint: helm lint --strict of charts/peregrine with its defaults and each profile (helm built by
## hack/build-helm.sh from its Go module, cached).
chart-lint:
	@helm="$$(bash hack/build-helm.sh)" && for v in "" values-gke.yaml values-onprem.yaml; do \
		"$$helm" lint --strict charts/peregrine $${v:+-f charts/peregrine/$$v} || exit 1; done

go-build:
	$(GO) build -o bin/peregrine-operator ./cmd/operator
	$(GO) build -o bin/peregrine-csi ./cmd/csi
	CGO_ENABLED=0 $(GO) build -o bin/peregrine-il-check ./cmd/il-check

## kube-bin: etcd, kube-apiserver and kubectl built from their Go modules (cached; ~6 min cold).
kube-bin:
	KUBE_VERSION=$(KUBE_VERSION) KUBE_CACHE_DIR=$(KUBE_CACHE_DIR) bash hack/build-kube.sh >/dev/null

## kube-node-bin: also kube-controller-manager, kube-scheduler, kubelet and kube-proxy for a real node.
kube-node-bin:
	KUBE_VERSION=$(KUBE_VERSION) KUBE_CACHE_DIR=$(KUBE_CACHE_DIR) bash hack/build-kube.sh --node >/dev/null

# The whole workspace, as test-engine builds it: the same feature set, so nothing recompiles.
engine-bin:
	cd $(ENGINE) && $(CARGO) build --workspace

## go-test: envtest suites on a real kube-apiserver + etcd, Pool/Container against real engines.
go-test: kube-bin engine-bin
	KUBEBUILDER_ASSETS=$(KUBE_CACHE_DIR)/bin PEREGRINE_ENGINE_BIN=$(PEREGRINE_ENGINE_BIN) \
		$(GO) test $(GO_PACKAGES) -count=1 -timeout 15m
