#!/usr/bin/env bash
# Installs mdBook v0.4.52 and its link checker mdbook-linkcheck v0.7.7 from
# crates.io (`cargo install --locked`) into the Switchyard cache
# ($SWITCHYARD_CACHE or ~/.cache/switchyard)/mdbook/v0.4.52/bin, for the book
# in docs/ (`mdbook build docs`). mdbook-linkcheck runs as the book's second
# renderer and fails the build on a link to a missing file or heading. The
# 0.4 line is the one the link checker reads the book from. Idempotent: with
# both binaries in place it says so and returns at once.
set -euo pipefail

VERSION="${MDBOOK_VERSION:-0.4.52}"
LINKCHECK_VERSION="${MDBOOK_LINKCHECK_VERSION:-0.7.7}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/mdbook/v$VERSION"
if [ -x "$OUT/bin/mdbook" ] && [ -x "$OUT/bin/mdbook-linkcheck" ]; then
  echo "mdbook v$VERSION and mdbook-linkcheck v$LINKCHECK_VERSION already installed in $OUT"
  exit 0
fi
started=$(date +%s)
# Their own target directory: the workspace's is locked by its build.
export CARGO_TARGET_DIR="$CACHE/mdbook/target"
cargo install --locked --root "$OUT" --version "$VERSION" mdbook
cargo install --locked --root "$OUT" --version "$LINKCHECK_VERSION" mdbook-linkcheck
rm -rf "$CARGO_TARGET_DIR"
echo "built mdbook v$VERSION and mdbook-linkcheck v$LINKCHECK_VERSION in $(( $(date +%s) - started ))s: $OUT/bin"
