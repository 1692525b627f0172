# syntax=docker/dockerfile:1.19
#
# gpu-pool-exporter images. Each carries three binaries, one per job:
#   /usr/bin/gpu-pool-exporter      the node agent (the entrypoint: the DaemonSet)
#   /usr/bin/gpupool                the command for people (status, fleet,
#                                   recommend, report): kubectl exec ... -- gpupool status
#   /usr/bin/gpu-pool-exporter-sim  the agent on a simulated GPU node, for a
#                                   try-out without GPUs:
#                                   docker run -p 9947:9947 --entrypoint /usr/bin/gpu-pool-exporter-sim IMAGE
# Two targets share one build stage:
#
#   docker build -t gpu-pool-exporter:dev .
#       default (the last stage, "runtime"): distroless glibc image, NVML only.
#   docker build --target dcgm -t gpu-pool-exporter:dev-dcgm .
#       adds NVIDIA's DCGM libraries (libdcgm.so.4 and its modules) for
#       --dcgm.mode=embedded. Not needed for --dcgm.mode=standalone, which talks
#       to an nv-hostengine elsewhere (GPU Operator's nvidia-dcgm) over TCP.
#
# Neither image carries the NVIDIA driver: libnvidia-ml.so.1 must come from the
# node, because it has to match the kernel module exactly. The binary dlopens it
# at run time (go-nvml, go-dcgm), which is why cgo is required and why the
# runtime image needs glibc.
#
# Privileges: what the exporter really needs on a node, and why.
#   - Open /dev/nvidiactl and /dev/nvidia<N> (mode 0666 on the node). The
#     obstacle is the device cgroup, not file permissions: a container that is
#     not given a GPU by the device plugin may not open them. Either the NVIDIA
#     Container Toolkit injects them (NVIDIA_VISIBLE_DEVICES=all, no GPU
#     request), or the container runs privileged (GKE, where no toolkit exists).
#     Requesting nvidia.com/gpu is never an option: it would take a GPU away.
#   - Connect to the kubelet's pod-resources socket
#     (/var/lib/kubelet/pod-resources/kubelet.sock): owned by root, mode 0755
#     or 0660 depending on the kubelet's umask, never writable by other users.
#     Connecting to a unix socket needs write permission on it, so the process
#     runs as UID 0. As the owner, root needs no capability for that: all
#     capabilities are dropped where the container is not privileged.
#   - Embedded DCGM's profiling metrics (SM/tensor/DRAM activity) need
#     CAP_SYS_ADMIN unless the driver was loaded with
#     NVreg_RestrictProfilingToAdminUsers=0: privileged, or use standalone DCGM.
#   - Nothing else: no host network, no host PID, no writes to the root
#     filesystem (readOnlyRootFilesystem), no Kubernetes API access.
# The images default to the unprivileged user 65532 so that `docker run` of the
# simulated node or a toolkit-injected GPU (docker run --gpus all) needs no root;
# the Kubernetes manifests in deploy/ set runAsUser: 0 for the socket above.
#
# Base images are pinned by version tag. distroless publishes no version tags:
# release pipelines should pin RUNTIME_IMAGE by digest (@sha256:...), e.g. with
# Renovate, which also keeps the other pins current.

ARG GO_VERSION=1.26.8
ARG RUNTIME_IMAGE=gcr.io/distroless/base-debian12:nonroot
# DCGM 4.6.1 is the version go-dcgm v1.4611.0 is built and tested against.
ARG DCGM_IMAGE=nvcr.io/nvidia/cloud-native/dcgm:4.6.1-1-ubuntu24.04

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# The binary is built natively for each platform (buildx runs the arm64 build
# under emulation): cgo cross-compiling would need a cross toolchain.
ENV CGO_ENABLED=1 \
    CGO_CFLAGS=-Wno-deprecated-declarations \
    GOTOOLCHAIN=local
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download
COPY . .
ARG VERSION=dev
ARG REVISION=unknown
# The -X settings fill prometheus/common/version (gpu_exporter_build_info);
# the linker ignores them if that package is not linked in.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w \
        -X github.com/prometheus/common/version.Version=${VERSION} \
        -X github.com/prometheus/common/version.Revision=${REVISION}" \
      -o /out/ ./cmd/gpu-pool-exporter ./cmd/gpupool ./cmd/gpu-pool-exporter-sim

# --target dcgm: NVIDIA's DCGM image, which carries libdcgm.so.4, the DCGM
# modules it loads and the C++ runtime they need, on Ubuntu 24.04 (glibc 2.39,
# newer than the build stage's 2.36, so the binary runs unchanged). Copying only
# libdcgm* into distroless would miss those dependencies.
FROM ${DCGM_IMAGE} AS dcgm
COPY --from=build /out/gpu-pool-exporter /out/gpupool /out/gpu-pool-exporter-sim /usr/bin/
USER 65532:65532
EXPOSE 9947
# Replaces the base image's nv-hostengine entrypoint; CMD is reset with it.
ENTRYPOINT ["/usr/bin/gpu-pool-exporter"]
CMD []

# Default target: glibc, CA certificates and tzdata; no shell, no package manager.
FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /out/gpu-pool-exporter /out/gpupool /out/gpu-pool-exporter-sim /usr/bin/
USER 65532:65532
EXPOSE 9947
ENTRYPOINT ["/usr/bin/gpu-pool-exporter"]
