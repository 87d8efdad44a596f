#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs the pinned nats-server the
# tests start (cached, idempotent), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
export SWITCHYARD_CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
# Build outputs live outside the clone, so a fresh clone on the same machine reuses them.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SWITCHYARD_CACHE/target}"
scripts/install-nats-server.sh
cargo test --workspace --locked "$@"
