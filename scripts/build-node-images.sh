#!/usr/bin/env bash
# Builds the images the test kit's real nodes import into containerd, with no
# registry and no base image pulled: `localhost/pause:switchyard`, the
# sandbox image (the static pause program scripts/install-node-runtime.sh
# builds), and `localhost/busybox:switchyard`, Debian's busybox-static with
# its applets linked under /bin. Each goes into a docker-archive that
# `ctr -n k8s.io images import` takes, under
# $SWITCHYARD_CACHE/node-images/<hash of its inputs>/. Idempotent.
#
# Needs umoci and skopeo (scripts/install-image-tools.sh) and busybox-static
# (installed here when missing, as root).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
runtime_dir=$(scripts/install-node-runtime.sh --print-dir)
[ -x "$runtime_dir/pause" ] || { echo "build-node-images.sh: no pause program in '$runtime_dir'" >&2; exit 1; }
if [ ! -x /bin/busybox ] || ! /bin/busybox --list >/dev/null 2>&1 || ! dpkg -s busybox-static >/dev/null 2>&1; then
    if [ "$(id -u)" != 0 ]; then
        echo "build-node-images.sh: busybox-static is missing; as root: apt-get install busybox-static" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends busybox-static >/dev/null
fi
for tool in umoci skopeo; do
    command -v "$tool" >/dev/null || { echo "build-node-images.sh: $tool is missing (scripts/install-image-tools.sh)" >&2; exit 1; }
done

hash=$(cat "$runtime_dir/pause" /bin/busybox "$0" | sha256sum | cut -c1-16)
out="$CACHE/node-images/$hash"
if [ -f "$out/pause.tar" ] && [ -f "$out/busybox.tar" ]; then
    echo "node images in $out"
    exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# pack NAME ROOTFS ENTRYPOINT...: an image localhost/NAME:switchyard from ROOTFS.
pack() {
    local name="$1" rootfs="$2"; shift 2
    local layout="$work/$name-oci" entry=()
    for arg in "$@"; do entry+=(--config.entrypoint "$arg"); done
    find "$rootfs" -exec touch -h -d @0 {} +
    umoci init --layout "$layout"
    umoci new --image "$layout:switchyard"
    umoci unpack --image "$layout:switchyard" "$work/$name-bundle"
    cp -a "$rootfs/." "$work/$name-bundle/rootfs/"
    umoci repack --image "$layout:switchyard" --history.created 1970-01-01T00:00:00Z \
        --history.created_by scripts/build-node-images.sh "$work/$name-bundle"
    umoci config --image "$layout:switchyard" --no-history --created 1970-01-01T00:00:00Z \
        --os linux --architecture amd64 --config.workingdir / \
        --config.env PATH=/bin "${entry[@]}"
    umoci gc --layout "$layout"
    rm -f "$out/$name.tar.tmp"
    skopeo --insecure-policy copy --quiet "oci:$layout:switchyard" \
        "docker-archive:$out/$name.tar.tmp:localhost/$name:switchyard"
    mv "$out/$name.tar.tmp" "$out/$name.tar"
}

mkdir -p "$work/pause/bin"
cp "$runtime_dir/pause" "$work/pause/bin/pause"
pack pause "$work/pause" /bin/pause

mkdir -p "$work/busybox/bin" "$work/busybox/tmp" "$work/busybox/etc"
chmod 1777 "$work/busybox/tmp"
cp /bin/busybox "$work/busybox/bin/busybox"
for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$work/busybox/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$work/busybox/etc/passwd"
pack busybox "$work/busybox" /bin/sh

echo "node images in $out"
