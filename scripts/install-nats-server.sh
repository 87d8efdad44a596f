#!/usr/bin/env bash
# Installs the pinned nats-server into the Switchyard cache ($SWITCHYARD_CACHE or
# ~/.cache/switchyard)/bin, built from its Go module through the module proxy.
# Idempotent: a second run with the right version installed takes milliseconds.
set -euo pipefail

VERSION="${NATS_SERVER_VERSION:-2.15.2}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
BIN="$CACHE/bin/nats-server"

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "v$VERSION\$"; then
  echo "nats-server v$VERSION already installed at $BIN"
  exit 0
fi

command -v go >/dev/null || { echo "install-nats-server: Go is needed to build nats-server (apt-get install golang-go)" >&2; exit 1; }
mkdir -p "$CACHE/bin"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
echo "building nats-server v$VERSION from github.com/nats-io/nats-server/v2 ..."
GOBIN="$build" CGO_ENABLED=0 GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@v$VERSION"
install -m 0755 "$build/nats-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version
