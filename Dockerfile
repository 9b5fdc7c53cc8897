# syntax=docker/dockerfile:1
# Peregrine's images, from one file: engine, operator and csi (docs/images.md).
#
# With Docker (or podman/buildah) and a registry, everything is compiled here:
#   docker build --target engine   -t peregrine/engine:dev .
#   docker build --target operator -t peregrine/operator:dev .
#   docker build --target csi      -t peregrine/csi:dev .
#
# Offline (hack/images.sh), the same runtime stages take binaries built on the host instead:
#   --build-arg BINARIES=prebuilt copies them from _out/images/bin/ in the build context, and the
#   Rust and Go stages are never run (nor their base images pulled).
#
# Image contents, and who relies on them:
# - engine: peregrine-engine, the peregrine CLI, peregrine-agent (the node agent's DaemonSet) and
#   peregrine-dataset (make demo's workload) on PATH, and /bin/sh (the ServerSet's pods run /bin/sh start-engine.sh, which execs
#   peregrine-engine with the shared config and the pod's own values as flags).
# - operator: peregrine-operator on PATH and at /peregrine-operator (config/manager runs that
#   path); runs as 65532 so that runAsNonRoot pods start without a runAsUser.
# - csi: peregrine-csi and peregrine-fuse on PATH (the node plugin finds peregrine-fuse there),
#   fusermount3 (fuse3), /usr/lib/peregrine/libperegrine_il.so, /bin/sh, cp, mv and chmod
#   (config/csi/node.yaml: the command wrapper and the init container that installs the library).
# None has an ENTRYPOINT: the pods give a command, and `podman run IMAGE peregrine-csi --help` works.

ARG RUST_IMAGE=rust:bookworm
ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=debian:bookworm-slim
# build: compile in the rust-build and go-build stages; prebuilt: copy from _out/images/bin/.
ARG BINARIES=build

# ---------------------------------------------------------------- build stages
FROM ${RUST_IMAGE} AS rust-build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      pkg-config protobuf-compiler liburing-dev libisal-dev libfuse3-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src/engine
COPY engine/ ./
# Release profile keeps line tables (debug = 1); the images carry symbols but not debug info.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/engine/target,id=peregrine-engine-target \
    cargo build --release --workspace --locked \
 && mkdir -p /out \
 && for f in peregrine-engine peregrine peregrine-agent peregrine-dataset peregrine-fuse libperegrine_il.so; do \
      cp target/release/$f /out/ && strip --strip-debug /out/$f; \
    done

FROM ${GO_IMAGE} AS go-build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY csi/ csi/
COPY internal/ internal/
COPY pkg/ pkg/
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o /out/peregrine-operator ./cmd/operator \
 && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o /out/peregrine-csi ./cmd/csi \
 && CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-s -w" -o /out/peregrine-il-check ./cmd/il-check

# ---------------------------------------------------------------- binaries, by BINARIES
# Each image's binaries from the build stages (engine-bin-build...) or from the context
# (engine-bin-prebuilt...); engine-bin etc. is the one BINARIES names. Per image, so that the
# operator image never waits for the Rust build. The label lets hack/images.sh prune the
# intermediate images these stages leave (podman build --layers).
FROM scratch AS engine-bin-build
LABEL dev.peregrine.images.stage=engine-bin-build
COPY --from=rust-build /out/peregrine-engine /out/peregrine /out/peregrine-agent /out/peregrine-dataset /
FROM scratch AS engine-bin-prebuilt
LABEL dev.peregrine.images.stage=engine-bin-prebuilt
COPY _out/images/bin/peregrine-engine _out/images/bin/peregrine _out/images/bin/peregrine-agent \
     _out/images/bin/peregrine-dataset /

FROM scratch AS operator-bin-build
LABEL dev.peregrine.images.stage=operator-bin-build
COPY --from=go-build /out/peregrine-operator /
FROM scratch AS operator-bin-prebuilt
LABEL dev.peregrine.images.stage=operator-bin-prebuilt
COPY _out/images/bin/peregrine-operator /

FROM scratch AS csi-bin-build
LABEL dev.peregrine.images.stage=csi-bin-build
COPY --from=go-build /out/peregrine-csi /out/peregrine-il-check /
COPY --from=rust-build /out/peregrine-fuse /out/libperegrine_il.so /
FROM scratch AS csi-bin-prebuilt
LABEL dev.peregrine.images.stage=csi-bin-prebuilt
COPY _out/images/bin/peregrine-csi _out/images/bin/peregrine-fuse _out/images/bin/libperegrine_il.so \
     _out/images/bin/peregrine-il-check /

# ":-build" repeats the default: buildah (1.28) picks the stages to run before it applies ARG
# defaults, and would skip engine-bin-build with a plain ${BINARIES}.
FROM engine-bin-${BINARIES:-build} AS engine-bin
FROM operator-bin-${BINARIES:-build} AS operator-bin
FROM csi-bin-${BINARIES:-build} AS csi-bin

# ---------------------------------------------------------------- runtime images
FROM ${BASE_IMAGE} AS engine
# libisal2: erasure codes and checksums (linked by every Rust binary); liburing2: not linked today
# (the io-uring crate issues the syscalls itself), kept for engines built against liburing.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libisal2 liburing2 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=engine-bin /peregrine-engine /peregrine /peregrine-agent /peregrine-dataset /usr/local/bin/
LABEL org.opencontainers.image.title="peregrine-engine" \
      org.opencontainers.image.description="Peregrine storage engine, admin CLI and node agent" \
      org.opencontainers.image.licenses="Apache-2.0"
CMD ["peregrine-engine", "--help"]

FROM ${BASE_IMAGE} AS operator
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=operator-bin /peregrine-operator /usr/local/bin/
RUN ln -s /usr/local/bin/peregrine-operator /peregrine-operator
LABEL org.opencontainers.image.title="peregrine-operator" \
      org.opencontainers.image.description="Peregrine Kubernetes operator (ServerSet, Pool, Container)" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
CMD ["peregrine-operator"]

FROM ${BASE_IMAGE} AS csi
# fuse3: fusermount3, which peregrine-fuse runs to unmount; libisal2 for peregrine-fuse and the library.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates fuse3 libisal2 liburing2 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY --from=csi-bin /peregrine-csi /peregrine-fuse /usr/local/bin/
COPY --from=csi-bin /libperegrine_il.so /usr/lib/peregrine/libperegrine_il.so
# Static: pods' check containers run it in their own images to see whether those bind the library.
COPY --from=csi-bin /peregrine-il-check /usr/lib/peregrine/peregrine-il-check
# The library reaches pods whose images lack ISA-L: its libisal.so.2 goes beside it (RUNPATH $ORIGIN).
RUN cp -L /usr/lib/*/libisal.so.2 /usr/lib/peregrine/libisal.so.2
LABEL org.opencontainers.image.title="peregrine-csi" \
      org.opencontainers.image.description="Peregrine CSI driver (controller and node), FUSE daemon and interception library" \
      org.opencontainers.image.licenses="Apache-2.0"
CMD ["peregrine-csi"]
