#!/usr/bin/env bash
# Builds Jaeger v2 (github.com/jaegertracing/jaeger/cmd/jaeger, the
# OpenTelemetry-collector based single binary; Go module version v1.75.0)
# through the module proxy into the Switchyard cache ($SWITCHYARD_CACHE or
# ~/.cache/switchyard)/jaeger/v1.75.0/. The tests run it as an all-in-one with
# in-memory storage (tests/fixtures/jaeger.yaml): the services export their
# spans to its OTLP receivers and the tests read them back through its query
# API (/api/traces). `go install ...@v1.75.0` refuses the module (its go.mod
# replaces github.com/Shopify/sarama), so the module is downloaded and built as
# the main module, in the module cache, with its own go.mod and go.sum
# (-mod=readonly: nothing there is to change). No build tags: the module has
# none that leave out storage backends (its only constraint is badger's
# `!linux`); the binary serves the UI's placeholder page, not the UI (the
# module holds no built assets). Idempotent: with the binary in place it says
# so and returns at once.
set -euo pipefail

VERSION="${JAEGER_VERSION:-1.75.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/jaeger/v$VERSION"
if [ -x "$OUT/jaeger" ]; then
  echo "jaeger (module v$VERSION) already installed in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "install-jaeger: Go is needed (apt-get install golang-go)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
mkdir -p "$OUT"
src="$(cd "$work" && go mod download -json "github.com/jaegertracing/jaeger@v$VERSION" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
[ -d "$src" ] || { echo "install-jaeger: no source of github.com/jaegertracing/jaeger@v$VERSION" >&2; exit 1; }
(cd "$src" && GOBIN="$work" go install -trimpath -buildvcs=false ./cmd/jaeger)
mv "$work/jaeger" "$OUT/jaeger"
echo "built jaeger (module v$VERSION) in $(( $(date +%s) - started ))s: $OUT"
