#!/usr/bin/env bash
# Builds the reference programs under tools/ (small Go programs on the official
# Kubernetes modules, which the Rust tests compare themselves with) into the
# Switchyard cache, keyed by a hash of their sources: a fresh clone on the same
# machine reuses them, a changed program is rebuilt. Prints each binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
command -v go >/dev/null || { echo "build-oracles.sh: Go is needed (apt-get install golang-go)" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
for dir in tools/*/; do
  name="$(basename "$dir")"
  # Sources, and files they embed (a JSON schema).
  hash="$(cat "$dir"go.mod "$dir"go.sum "$dir"*.go $(find "$dir" -mindepth 2 -type f -name '*.json' | sort) | sha256sum | cut -c1-16)"
  out="$CACHE/oracles/$name-$hash/$name"
  if [ ! -x "$out" ]; then
    started=$(date +%s)
    mkdir -p "$(dirname "$out")"
    (cd "$dir" && go build -trimpath -o "$out.tmp" .)
    mv "$out.tmp" "$out"
    echo "built $name in $(( $(date +%s) - started ))s"
  fi
  echo "$out"
done
