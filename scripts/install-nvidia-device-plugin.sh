#!/usr/bin/env bash
# Builds NVIDIA's device plugin for Kubernetes — `nvidia-device-plugin` and
# `gpu-feature-discovery` from the Go module github.com/NVIDIA/k8s-device-plugin
# through the module proxy — into the Switchyard cache ($SWITCHYARD_CACHE or
# ~/.cache/switchyard) under nvidia-device-plugin/<version>/, and packs both
# into the image `localhost/nvidia-device-plugin:<version>`, a docker-archive at
# <that dir>/nvidia-device-plugin.tar that `ctr -n k8s.io images import` takes.
# No registry, no base image pulled: umoci and skopeo, as in
# scripts/build-node-images.sh. Idempotent: with the binaries and an image from
# the same inputs (binaries, libraries, this script) in place it returns at
# once. The last line is always `nvidia device plugin image in <dir>`.
#
# The module has no replace directives, but `go install pkg@version` fails: it
# requires sigs.k8s.io/node-feature-discovery v0.15.7, which the module proxy
# does not serve (403), for GFD's NodeFeature output. So a wrapper module
# requires the plugin and, only when that version cannot be downloaded,
# replaces NFD with deploy/images/nvidia-device-plugin/nfd-compat (the two
# packages GFD imports, over the published NodeFeature API module).
#
# go-nvml is cgo (it dlopens libnvidia-ml.so.1 at run time; its symbols stay
# unresolved at link time and bind lazily), so the binaries are built with
# CGO_ENABLED=1 and link glibc dynamically; the image carries the libraries ldd
# finds here, at the same paths, plus glibc's libpthread, libdl, librt and libm,
# which NVIDIA's libnvidia-ml.so.1 links, and libgcc_s, which the Rust mock
# (libs/nvml-mock) links. It carries no libnvidia-ml: the node
# provides it (the tests mount a mock one). Both programs first dlopen plain
# `libnvidia-ml.so.1` through the loader's search path (the plugin's NVML
# handle alone prefers <--container-driver-root, default /driver-root>/usr/lib/
# x86_64-linux-gnu/...), so mount it at /usr/lib/x86_64-linux-gnu/
# libnvidia-ml.so.1 (or set LD_LIBRARY_PATH). Entrypoint
# /usr/bin/nvidia-device-plugin; run GFD by overriding the command with
# /usr/bin/gpu-feature-discovery. No shell.
#
# Cold build (empty Go module and build caches) on the 2-core dev machine:
# 80 s; with the modules already downloaded, about 70 s; the image alone takes
# a few seconds. Same inputs give the same bytes (timestamps at the epoch).
#
# Needs Go, gcc and libc6-dev (cgo), umoci and skopeo
# (scripts/install-image-tools.sh).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."

VERSION="${NVIDIA_DEVICE_PLUGIN_VERSION:-0.17.4}"
VERSION="v${VERSION#v}"
MODULE=github.com/NVIDIA/k8s-device-plugin
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/nvidia-device-plugin/$VERSION"
IMAGE="localhost/nvidia-device-plugin:$VERSION"
ARCHIVE="$OUT/nvidia-device-plugin.tar"
BINARIES=(nvidia-device-plugin gpu-feature-discovery)
# What a libnvidia-ml.so.1 mounted into the container links, found beside libc:
# NVIDIA's lists glibc's libpthread, libdl, librt and libm; the Rust mock
# (libs/nvml-mock, a cdylib) lists libgcc_s.
NVML_NEEDS=(libpthread.so.0 libdl.so.2 librt.so.1 libm.so.6 libgcc_s.so.1)

die() { echo "install-nvidia-device-plugin.sh: $*" >&2; exit 1; }
have_binaries() {
    for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
# The shared libraries the binaries link, as ldd resolves them here.
linked_libs() {
    for b in "${BINARIES[@]}"; do
        ldd "$OUT/$b" | awk '/=> \// {print $3} /^\t\// {print $1}'
    done | sort -u
}
libc_dir() {
    ldd "$OUT/nvidia-device-plugin" | awk '/libc\.so\.6 => / {print $3}' | xargs dirname
}
# What the image is made of: the binaries, the libraries it copies, this script.
image_inputs() {
    local dir
    dir=$(libc_dir)
    { cat "$self"; for b in "${BINARIES[@]}"; do cat "$OUT/$b"; done
      for lib in $(linked_libs); do cat "$lib"; done
      for lib in "${NVML_NEEDS[@]}"; do cat "$dir/$lib"; done
    } | sha256sum | cut -c1-64
}

if have_binaries && [ -f "$ARCHIVE" ] && [ -f "$OUT/image.inputs" ] \
    && [ "$(cat "$OUT/image.inputs")" = "$(image_inputs)" ]; then
    echo "nvidia device plugin image in $OUT"
    exit 0
fi
for tool in umoci skopeo ldd; do
    command -v "$tool" >/dev/null || die "$tool is missing (scripts/install-image-tools.sh installs umoci and skopeo)"
done

mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
started=$(date +%s)
say() { echo "   $* ($(( $(date +%s) - started ))s)"; }

if ! have_binaries; then
    command -v go >/dev/null || die "Go is needed"
    command -v "$(go env CC)" >/dev/null \
        || die "go-nvml needs cgo and $(go env CC) is missing; as root: apt-get install gcc libc6-dev"
    compat="$PWD/deploy/images/nvidia-device-plugin/nfd-compat"
    say "nvidia-device-plugin and gpu-feature-discovery $VERSION (cgo)"
    mkdir -p "$work/mod" && (
        cd "$work/mod"
        go mod init switchyard.local/nvidia-device-plugin >/dev/null 2>&1
        go mod edit -require "$MODULE@$VERSION"
        gomod=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
        [ -f "$gomod" ] || die "no go.mod for $MODULE@$VERSION from the module proxy"
        nfd="sigs.k8s.io/node-feature-discovery"
        nfd_version=$(awk -v m="$nfd" '$1 == m {print $2}' "$gomod")
        if [ -n "$nfd_version" ] && ! go mod download "$nfd@$nfd_version" 2>/dev/null; then
            say "$nfd@$nfd_version is not on the module proxy: using ${compat#"$OLDPWD"/}"
            [ -f "$compat/go.mod" ] || die "$compat/go.mod is missing"
            go mod edit -replace "$nfd=$compat"
        fi
        printf '//go:build tools\n\npackage tools\n\nimport (\n' >tools.go
        for b in "${BINARIES[@]}"; do printf '\t_ "%s/cmd/%s"\n' "$MODULE" "$b" >>tools.go; done
        printf ')\n' >>tools.go
        GOFLAGS=-mod=mod go mod tidy >/dev/null
        # go-nvml's own #cgo LDFLAGS leave the NVML symbols unresolved at link time.
        for b in "${BINARIES[@]}"; do
            say "building $b"
            CGO_ENABLED=1 go build -trimpath \
                -ldflags "-s -w -X $MODULE/internal/info.version=$VERSION" \
                -o "$OUT/$b.tmp" "$MODULE/cmd/$b"
            mv "$OUT/$b.tmp" "$OUT/$b"
        done
    )
fi

say "image $IMAGE"
root="$work/rootfs"
mkdir -p "$root/usr/bin" "$root/tmp" "$root/etc/kubernetes/node-feature-discovery/features.d"
chmod 1777 "$root/tmp"
for b in "${BINARIES[@]}"; do
    install -m 0755 "$OUT/$b" "$root/usr/bin/$b"
done
# The dynamic loader and glibc at the paths the binaries ask for.
for lib in $(linked_libs); do
    cp -L --parents "$lib" "$root/"
done
dir=$(libc_dir)
for lib in "${NVML_NEEDS[@]}"; do
    [ -f "$dir/$lib" ] || die "$dir/$lib is missing (libc6, libgcc-s1)"
    cp -L --parents "$dir/$lib" "$root/"
done
if find "$root" -name 'libnvidia-ml*' | grep -q .; then
    die "the image must not carry libnvidia-ml (the node provides it)"
fi
printf 'root:x:0:0:root:/root:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
find "$root" -exec touch -h -d @0 {} +
if [ "$(id -u)" = 0 ]; then rootless=(); else rootless=(--rootless); fi

layout="$work/oci"
umoci init --layout "$layout"
umoci new --image "$layout:$VERSION"
umoci unpack "${rootless[@]}" --image "$layout:$VERSION" "$work/bundle"
cp -a "$root/." "$work/bundle/rootfs/"
umoci repack --image "$layout:$VERSION" --history.created 1970-01-01T00:00:00Z \
    --history.created_by scripts/install-nvidia-device-plugin.sh "$work/bundle"
# The NVIDIA_* variables are the upstream image's: on a node with NVIDIA's
# container runtime they make it inject the driver; elsewhere they do nothing.
umoci config --image "$layout:$VERSION" --no-history --created 1970-01-01T00:00:00Z \
    --os linux --architecture amd64 --config.workingdir / \
    --config.entrypoint /usr/bin/nvidia-device-plugin \
    --config.env PATH=/usr/bin:/bin \
    --config.env NVIDIA_DISABLE_REQUIRE=true \
    --config.env NVIDIA_VISIBLE_DEVICES=all \
    --config.env NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    --config.label org.opencontainers.image.title=nvidia-device-plugin \
    --config.label "org.opencontainers.image.version=$VERSION" \
    --config.label "org.opencontainers.image.source=https://$MODULE" \
    --config.label "org.opencontainers.image.description=NVIDIA device plugin and GPU feature discovery, built by Switchyard's scripts/install-nvidia-device-plugin.sh" \
    --config.label org.opencontainers.image.licenses=Apache-2.0
umoci gc --layout "$layout"
rm -f "$ARCHIVE.tmp"
skopeo --insecure-policy copy --quiet "oci:$layout:$VERSION" "docker-archive:$ARCHIVE.tmp:$IMAGE"
mv "$ARCHIVE.tmp" "$ARCHIVE"
image_inputs >"$OUT/image.inputs"

for b in "${BINARIES[@]}"; do
    "$OUT/$b" --version
done
echo "built in $(( $(date +%s) - started ))s: $IMAGE in $ARCHIVE"
echo "nvidia device plugin image in $OUT"
