#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok) from its Go module through the module
# proxy into the Switchyard cache ($SWITCHYARD_CACHE or ~/.cache/switchyard)/kwok/<version>/,
# with the Stages kwok needs beside it. kwok gives the tests' kubelet-less Nodes
# and their pods a lifecycle: heartbeats and Ready, Running, deletion
# (libs/testkit/src/kwok.rs). Idempotent: with both in place it says so and
# returns at once.
#
# The kwok binary has no built-in stages: it takes them from its config files
# (--config) or, with --enable-crds=Stage, from Stage objects in the cluster.
# kwokctl writes its defaults into the config it hands kwok — the fast node
# stages (kustomize/stage/node/fast, heartbeat-with-lease when leases are on)
# and the fast pod stages (kustomize/stage/pod/fast) — and these are copied
# here verbatim from the same module version, into stages/.
set -euo pipefail

VERSION="${KWOK_VERSION:-0.8.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/kwok/v$VERSION"
BIN="$OUT/kwok"
STAGES=(
  node/fast/node-initialize.yaml
  node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
  pod/fast/pod-ready.yaml
  pod/fast/pod-complete.yaml
  pod/fast/pod-delete.yaml
)

have_binary() { [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "v$VERSION\b"; }
have_stages() {
  for s in "${STAGES[@]}"; do [ -f "$OUT/stages/$(basename "$s")" ] || return 1; done
}
if have_binary && have_stages; then
  echo "kwok v$VERSION already installed at $BIN (stages in $OUT/stages)"
  exit 0
fi

command -v go >/dev/null || { echo "install-kwok: Go is needed to build kwok (apt-get install golang-go)" >&2; exit 1; }
mkdir -p "$OUT"
export CGO_ENABLED=0 GOFLAGS=-mod=mod
started=$(date +%s)

if ! have_binary; then
  echo "building kwok v$VERSION from sigs.k8s.io/kwok ..."
  build="$(mktemp -d)"
  trap 'rm -rf "$build"' EXIT
  # The version stamp kwok's release build (hack/releases.sh) sets.
  ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v$VERSION"
  GOBIN="$build" go install -trimpath -ldflags "$ldflags" "sigs.k8s.io/kwok/cmd/kwok@v$VERSION"
  install -m 0755 "$build/kwok" "$BIN.tmp"
  mv "$BIN.tmp" "$BIN"
fi

module_dir="$(go mod download -json "sigs.k8s.io/kwok@v$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[ -d "$module_dir/kustomize/stage" ] || { echo "install-kwok: no kustomize/stage in $module_dir" >&2; exit 1; }
mkdir -p "$OUT/stages.tmp"
for s in "${STAGES[@]}"; do
  install -m 0644 "$module_dir/kustomize/stage/$s" "$OUT/stages.tmp/$(basename "$s")"
done
rm -rf "$OUT/stages"
mv "$OUT/stages.tmp" "$OUT/stages"

"$BIN" --version
echo "kwok v$VERSION built into $BIN, stages into $OUT/stages, in $(( $(date +%s) - started ))s"
