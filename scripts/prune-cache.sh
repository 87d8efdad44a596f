#!/usr/bin/env bash
# Keeps the shared build cache from filling the disk. Cargo never deletes an
# artifact it no longer needs, so every change of features or dependencies
# leaves whole test binaries behind in the cached target dirs. When a target
# dir grows past SWITCHYARD_TARGET_MAX_GIB (default 30), or the disk under it
# has less than SWITCHYARD_MIN_FREE_GIB (default 15) free, it is emptied and
# the next build is a cold one: slower once, never a full disk.
set -euo pipefail
cache="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
max_gib="${SWITCHYARD_TARGET_MAX_GIB:-30}"
min_free_gib="${SWITCHYARD_MIN_FREE_GIB:-15}"
gib() { du -s --block-size=1G "$1" 2>/dev/null | cut -f1; }
free_gib() { df --output=avail --block-size=1G "$1" | tail -n1 | tr -d ' '; }

for dir in "${CARGO_TARGET_DIR:-$cache/target}" "$cache/fuzz-target"; do
  [ -d "$dir" ] || continue
  size=$(gib "$dir")
  free=$(free_gib "$dir")
  if [ "$size" -gt "$max_gib" ] || [ "$free" -lt "$min_free_gib" ]; then
    echo "prune-cache: $dir holds ${size} GiB with ${free} GiB free (limits: ${max_gib} GiB, ${min_free_gib} GiB free): emptying it"
    rm -rf "$dir"
  else
    echo "prune-cache: $dir holds ${size} GiB, ${free} GiB free: kept"
  fi
done
