#!/usr/bin/env bash
# Builds toxiproxy v2.5.0 (github.com/Shopify/toxiproxy/v2: its server and its
# CLI) from the Go module through the module proxy into the Switchyard cache
# ($SWITCHYARD_CACHE or ~/.cache/switchyard)/toxiproxy/v2.5.0/. The fault tests
# put the services' API-server traffic through it (latency, resets, timeouts).
# Idempotent: with both binaries in place it says so and returns at once.
set -euo pipefail

VERSION="${TOXIPROXY_VERSION:-2.5.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/toxiproxy/v$VERSION"
if [ -x "$OUT/toxiproxy-server" ] && [ -x "$OUT/toxiproxy-cli" ]; then
  echo "toxiproxy v$VERSION already installed in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "install-toxiproxy: Go is needed (apt-get install golang-go)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
mkdir -p "$OUT"
for cmd in server cli; do
  GOBIN="$work" go install -trimpath \
    -ldflags "-X github.com/Shopify/toxiproxy/v2.Version=$VERSION" \
    "github.com/Shopify/toxiproxy/v2/cmd/$cmd@v$VERSION"
  mv "$work/$cmd" "$OUT/toxiproxy-$cmd"
done
echo "built toxiproxy v$VERSION in $(( $(date +%s) - started ))s: $OUT"
