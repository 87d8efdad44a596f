#!/usr/bin/env bash
# Builds the nats CLI (github.com/nats-io/natscli, package ./nats; Go module
# version v0.5.0) through the module proxy into the Switchyard cache
# ($SWITCHYARD_CACHE or ~/.cache/switchyard)/natscli/v0.5.0/. The tests use it
# as an independent client of the nats-server they start
# (scripts/install-nats-server.sh): `nats sub` to watch what the services
# publish, `nats pub` to publish with headers. Idempotent: with the binary in
# place it says so and returns at once.
set -euo pipefail

VERSION="${NATSCLI_VERSION:-0.5.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/natscli/v$VERSION"
if [ -x "$OUT/nats" ]; then
  echo "nats (natscli module v$VERSION) already installed in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "install-natscli: Go is needed (apt-get install golang-go)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
mkdir -p "$OUT"
GOBIN="$work" go install -trimpath \
  "github.com/nats-io/natscli/nats@v$VERSION"
mv "$work/nats" "$OUT/nats"
echo "built nats (natscli module v$VERSION) in $(( $(date +%s) - started ))s: $OUT"
