#!/usr/bin/env bash
# Prints a digest of the demo's migration log for each backend and seed:
# the sha256 of the log's segment files, which hold every record's bytes
# (the demo's times are simulated, so the same seed gives the same bytes).
# Compare two builds to show a change leaves the decisions byte-identical:
#   scripts/demo-digest.sh path/to/old/switchyard > old.txt
#   scripts/demo-digest.sh path/to/new/switchyard | diff old.txt -
set -euo pipefail
switchyard="${1:-${CARGO_TARGET_DIR:-target}/debug/switchyard}"
shape=(--nodes 6 --gpus-per-node 4 --workloads 9)
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for backend in deckhouse nvidia-operator; do
  for seed in 1 7 42; do
    dir="$work/$backend-$seed"
    "$switchyard" demo --backend "$backend" --seed "$seed" "${shape[@]}" --data-dir "$dir" >"$work/out" 2>&1 || {
      cat "$work/out" >&2
      echo "demo --backend $backend --seed $seed failed" >&2
      exit 1
    }
    printf '%-16s seed %-3s %s  %s records\n' "$backend" "$seed" \
      "$(cat "$dir"/*.seg | sha256sum | cut -c1-16)" "$(grep -o '^[0-9]* events' "$work/out" | cut -d' ' -f1)"
  done
done
