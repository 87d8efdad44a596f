#!/usr/bin/env bash
# Packs the nats-server that scripts/install-nats-server.sh builds from its Go
# module as the image `localhost/nats:<version>` — no base image, no
# registry — for the chart's bundled NATS on real nodes
# (`--set nats.bundled.image.repository=localhost/nats`). The server is static;
# the image holds it as /bin/nats-server and the user 1000 the chart runs it
# as. Writes a docker-archive that `ctr -n k8s.io images import` takes, under
# $SWITCHYARD_CACHE/nats-image/v<version>/nats.tar, and prints its path.
# Idempotent. Needs umoci and skopeo (scripts/install-image-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
VERSION="${NATS_SERVER_VERSION:-2.15.2}"
out="$CACHE/nats-image/v$VERSION"
if [ -f "$out/nats.tar" ]; then
    echo "$out/nats.tar"
    exit 0
fi
scripts/install-nats-server.sh >&2
for tool in umoci skopeo; do
    command -v "$tool" >/dev/null || { echo "build-nats-image.sh: $tool is missing (scripts/install-image-tools.sh)" >&2; exit 1; }
done
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
mkdir -p "$rootfs/bin" "$rootfs/etc" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
cp "$CACHE/bin/nats-server" "$rootfs/bin/nats-server"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnats:x:1000:1000:nats:/:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnats:x:1000:\n' >"$rootfs/etc/group"
find "$rootfs" -exec touch -h -d @0 {} +
layout="$work/oci"
umoci init --layout "$layout" >&2
umoci new --image "$layout:$VERSION" >&2
umoci unpack --image "$layout:$VERSION" "$work/bundle" >&2
cp -a "$rootfs/." "$work/bundle/rootfs/"
umoci repack --image "$layout:$VERSION" --history.created 1970-01-01T00:00:00Z \
    --history.created_by scripts/build-nats-image.sh "$work/bundle" >&2
umoci config --image "$layout:$VERSION" --no-history --created 1970-01-01T00:00:00Z \
    --os linux --architecture amd64 --config.workingdir / --config.user 1000:1000 \
    --config.env PATH=/bin --config.entrypoint /bin/nats-server >&2
umoci gc --layout "$layout" >&2
skopeo --insecure-policy copy --quiet "oci:$layout:$VERSION" \
    "docker-archive:$out/nats.tar.tmp:localhost/nats:$VERSION" >&2
mv "$out/nats.tar.tmp" "$out/nats.tar"
echo "$out/nats.tar"
