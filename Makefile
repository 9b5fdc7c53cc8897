# Peregrine entry points. Every target installs what it needs first.
SHELL := /bin/bash
CARGO ?= cargo
ENGINE := engine
export CARGO_TERM_COLOR ?= never

include hack/go.mk

.PHONY: all deps build test test-engine lint fmt bench quickstart clean

all: build

deps:
	@bash hack/install-deps.sh

build: deps go-build
	cd $(ENGINE) && $(CARGO) build --release --workspace

## test: lint, then unit and integration tests (real engine processes on file-backed NVMe),
## then the operator's envtest suites (real kube-apiserver and etcd built from their Go modules).
test: deps lint test-engine go-test

test-engine:
	cd $(ENGINE) && $(CARGO) build --workspace && $(CARGO) test --workspace --no-fail-fast -- --test-threads=2

lint: deps go-lint go-verify
	cd $(ENGINE) && $(CARGO) fmt --all -- --check
	cd $(ENGINE) && $(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	cd $(ENGINE) && $(CARGO) fmt --all

## bench: Peregrine next to fio on the same kind of device file (bench/results/latest.json), then
## the POSIX path: fio through the mount with and without the interception library, and mdtest (posix.json).
bench: deps
	bash bench/run.sh
	bash bench/posix.sh

## quickstart: three engines on emulated NVMe, a pool, a container, 100 MiB written and read back.
quickstart: deps build
	bash hack/quickstart.sh

clean:
	cd $(ENGINE) && $(CARGO) clean
