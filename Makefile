# Peregrine entry points. Every target installs what it needs first.
SHELL := /bin/bash
CARGO ?= cargo
ENGINE := engine
export CARGO_TERM_COLOR ?= never

include hack/go.mk

.PHONY: all deps build test test-engine lint fmt bench quickstart demo demo-down e2e test-e2e images cluster-down clean chart-lint

all: build

deps:
	@bash hack/install-deps.sh

build: deps go-build
	cd $(ENGINE) && $(CARGO) build --release --workspace

## test: lint, then unit and integration tests (real engine processes on file-backed NVMe),
## then the operator's envtest suites (real kube-apiserver and etcd built from their Go modules),
## then the end-to-end suites on a real cluster brought up here and removed after (test-e2e).
test: deps lint test-engine go-test test-e2e

## test-e2e: make demo from the workspace's debug binaries, the e2e suites, then make demo-down.
test-e2e: deps engine-bin
	bash hack/e2e.sh

test-engine:
	cd $(ENGINE) && $(CARGO) build --workspace && $(CARGO) test --workspace --no-fail-fast -- --test-threads=2

lint: deps go-lint go-verify chart-lint
	cd $(ENGINE) && $(CARGO) fmt --all -- --check
	cd $(ENGINE) && $(CARGO) clippy --workspace --all-targets -- -D warnings
	@# The storage core speaks its own types: no gRPC, no async runtime.
	cd $(ENGINE) && if $(CARGO) tree -p peregrine-vos -e normal --prefix none | grep -E '^(tonic|tokio|hyper) '; then \
		echo "peregrine-vos must depend on neither gRPC nor an async runtime"; exit 1; fi

fmt:
	cd $(ENGINE) && $(CARGO) fmt --all

## bench: Peregrine next to fio on the same kind of device file (bench/results/latest.json), then
## the POSIX path: fio through the mount with and without the interception library, and mdtest (posix.json).
bench: deps
	bash bench/run.sh
	bash bench/posix.sh

## demo: a real single-node Kubernetes offline (hack/cluster.sh), Peregrine's images built locally,
## the operator, webhook and CSI driver installed, a ServerSet, a Pool, and a PVC mounted in a pod.
demo: deps
	bash hack/demo.sh

## demo-down: remove what `make demo` made: samples, volumes, the release, the cluster and its state.
demo-down:
	bash hack/demo.sh down

## e2e: the end-to-end suites (e2e/) on the cluster `make demo` leaves up (or any KUBECONFIG);
## the release stays installed (the uninstall suite runs only with E2E_UNINSTALL=1).
e2e: demo
	bash hack/images.sh testimages
	bash hack/images.sh --address $${PEREGRINE_CLUSTER_DIR:-/var/lib/peregrine-cluster}/containerd/containerd.sock import
	KUBECONFIG=$$(bash hack/cluster.sh up) $(GO) test ./e2e/ -count=1 -timeout 40m -v

## images: Peregrine's images and the CSI sidecars, offline (hack/images.sh; release binaries).
images: deps
	cd $(ENGINE) && $(CARGO) build --release --workspace
	bash hack/install-image-deps.sh && bash hack/images.sh base build sidecars

## cluster-down: stop the cluster `make demo` started (state kept; hack/cluster.sh down --purge drops it).
cluster-down:
	bash hack/cluster.sh down

## quickstart: three engines on emulated NVMe, a pool, a container, 100 MiB written and read back.
quickstart: deps build
	bash hack/quickstart.sh

clean:
	cd $(ENGINE) && $(CARGO) clean
