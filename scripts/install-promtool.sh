#!/usr/bin/env bash
# Builds promtool of Prometheus 3.16.0 (github.com/prometheus/prometheus, Go
# module version v0.316.0) through the module proxy into the Switchyard cache
# ($SWITCHYARD_CACHE or ~/.cache/switchyard)/promtool/v0.316.0/. The tests check
# the chart's alert rules with `promtool test rules` and the services' /metrics
# with `promtool check metrics`. Built with the remove_all_sd tag: promtool's
# rule and metric checks need none of Prometheus' service discoveries, which
# are most of its dependencies. Idempotent: with the binary in place it says
# so and returns at once.
set -euo pipefail

VERSION="${PROMTOOL_VERSION:-0.316.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/promtool/v$VERSION"
if [ -x "$OUT/promtool" ]; then
  echo "promtool (prometheus module v$VERSION) already installed in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "install-promtool: Go is needed (apt-get install golang-go)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
mkdir -p "$OUT"
GOBIN="$work" go install -trimpath -tags remove_all_sd \
  "github.com/prometheus/prometheus/cmd/promtool@v$VERSION"
mv "$work/promtool" "$OUT/promtool"
echo "built promtool (prometheus module v$VERSION) in $(( $(date +%s) - started ))s: $OUT"
