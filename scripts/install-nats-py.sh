#!/usr/bin/env bash
# Installs nats-py 2.16.0 from PyPI into a virtual environment in the
# Switchyard cache ($SWITCHYARD_CACHE or ~/.cache/switchyard)/python/nats-py-2.16.0/,
# for the test that runs the Python subscriber example
# (docs/integrations/follow_migration.py). Idempotent: with the environment in
# place it says so and returns at once.
set -euo pipefail

VERSION="${NATS_PY_VERSION:-2.16.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/python/nats-py-$VERSION"
if [ -x "$OUT/bin/python" ] && "$OUT/bin/python" -c "import nats" 2>/dev/null; then
  echo "nats-py $VERSION already installed in $OUT"
  exit 0
fi
command -v python3 >/dev/null || { echo "install-nats-py: python3 is needed" >&2; exit 1; }
started=$(date +%s)
rm -rf "$OUT"
python3 -m venv "$OUT"
"$OUT/bin/pip" install --quiet --disable-pip-version-check "nats-py==$VERSION"
echo "installed nats-py $VERSION in $(( $(date +%s) - started ))s: $OUT"
