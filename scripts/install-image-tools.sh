#!/usr/bin/env bash
# umoci and skopeo, which scripts/build-image.sh packs the image with, from
# Debian's packages (idempotent: nothing to do when both are on PATH).
set -euo pipefail
if command -v umoci >/dev/null && command -v skopeo >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "install-image-tools.sh: umoci and skopeo are missing; as root: apt-get install umoci skopeo" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends umoci skopeo
umoci --version
skopeo --version
