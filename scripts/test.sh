#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the pinned nats-server,
# builds the Kubernetes control plane the tests start, the real nodes' runtime
# (kubelet, containerd, runc, CNI plugins, crictl; about 4 minutes the first
# time) and images (pause, busybox), helm, kwok, toxiproxy, promtool and the
# Prometheus server, jaeger, the nats CLI, umoci and skopeo (Debian's
# packages, for the image test) and the Go
# reference programs (all cached, idempotent; the control plane takes about 6
# minutes the first time, jaeger about 7, kwok about 3), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
export SWITCHYARD_CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
# Build outputs live outside the clone, so a fresh clone on the same machine reuses them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SWITCHYARD_CACHE/target}"
scripts/install-nats-server.sh
scripts/control-plane.sh
scripts/install-node-runtime.sh
scripts/install-helm.sh
scripts/install-kwok.sh
scripts/install-toxiproxy.sh
scripts/install-promtool.sh
scripts/install-prometheus.sh
scripts/install-jaeger.sh
scripts/install-natscli.sh
scripts/install-nats-py.sh
scripts/install-image-tools.sh
scripts/build-node-images.sh
scripts/install-cluster-network.sh
scripts/build-nats-image.sh >/dev/null
scripts/install-nvidia-device-plugin.sh >/dev/null
scripts/build-oracles.sh >/dev/null
cargo test --workspace --locked "$@"
