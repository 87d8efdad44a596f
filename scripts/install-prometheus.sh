#!/usr/bin/env bash
# Builds the Prometheus server of Prometheus 3.16.0 (github.com/prometheus/
# prometheus/cmd/prometheus, Go module version v0.316.0: the module promtool
# comes from) through the module proxy into the Switchyard cache
# ($SWITCHYARD_CACHE or ~/.cache/switchyard)/prometheus/v0.316.0/. The chart's
# test on real nodes runs it in the cluster network: it finds the release's
# pods through Kubernetes service discovery, scrapes them, evaluates the
# chart's alert rules and answers the dashboards' queries. Built with
# remove_all_sd and enable_kubernetes_sd: of the service discoveries, only
# Kubernetes' is compiled in. Without the builtinassets tag the binary serves
# no web UI (the module holds no built assets); the HTTP API is all the test
# uses. Idempotent: with the binary in place it says so and returns at once.
set -euo pipefail

VERSION="${PROMETHEUS_VERSION:-0.316.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/prometheus/v$VERSION"
if [ -x "$OUT/prometheus" ]; then
  echo "prometheus (module v$VERSION) already installed in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "install-prometheus: Go is needed (apt-get install golang-go)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
mkdir -p "$OUT"
GOBIN="$work" go install -trimpath -tags remove_all_sd,enable_kubernetes_sd \
  "github.com/prometheus/prometheus/cmd/prometheus@v$VERSION"
mv "$work/prometheus" "$OUT/prometheus"
echo "built prometheus (module v$VERSION) in $(( $(date +%s) - started ))s: $OUT"
