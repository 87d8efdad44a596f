#!/usr/bin/env bash
# Builds Switchyard's OCI image without a Docker daemon and without pulling a
# base image: the multi-call binary `switchyard` with a link to it under each
# service's name (run by that name it is that service; the chart runs them
# so), the node agent's own binary `switchyard-node-agent` (it runs on every
# GPU node: built small, see Cargo.toml's node-agent profile), the shared
# libraries they link (as ldd finds them here), the CA certificates, and an /etc/passwd with the non-root user
# 65532, packed with umoci into an OCI layout and copied by skopeo into a
# docker-archive that `docker load`, `kind load image-archive` and
# `ctr -n k8s.io images import` take. The same image as the Dockerfile's, for
# machines without Docker.
#
#   scripts/build-image.sh [--profile release|dev] [--bin-dir DIR] [--no-build]
#                          [--image NAME] [--tag TAG] [--out DIR]
#
# --profile   cargo profile to build: image (the default: for size,
#             whole-program, the node agent with the node-agent profile;
#             every GPU node pulls the image), release or dev
# --bin-dir   take both binaries from DIR (default: the profile's target
#             folder; with image, the agent from the node-agent profile's)
# --no-build  do not run cargo (the binaries must be there)
# --image     repository name (default: localhost/switchyard, the chart's default)
# --tag       tag (default: the chart's appVersion)
# --out       where the OCI layout `oci/` and `switchyard-<tag>.tar` go
#             (default: $CARGO_TARGET_DIR/image)
#
# Needs umoci and skopeo (Debian: apt-get install umoci skopeo;
# scripts/install-image-tools.sh does it). Timestamps come from
# SOURCE_DATE_EPOCH, or the last commit's time, so the same binaries give the
# same layer.
set -euo pipefail
cd "$(dirname "$0")/.."

# The names the multi-call binary answers to besides its own, linked to it
# (services/switchyard/src/main.rs).
SERVICES=(
    switchyard-inventory
    switchyard-stack-assigner
    switchyard-class-compiler
    switchyard-claim-allocator
    switchyard-alerter
)
export SWITCHYARD_CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SWITCHYARD_CACHE/target}"

profile=image
bin_dir=""
build=1
image=localhost/switchyard
tag=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' deploy/helm/switchyard/Chart.yaml)
out="$CARGO_TARGET_DIR/image"
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile="$2"; shift 2 ;;
        --bin-dir) bin_dir="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        --image) image="$2"; shift 2 ;;
        --tag) tag="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "build-image.sh: unknown argument $1 (see the script's header)" >&2; exit 2 ;;
    esac
done
case "$profile" in
    image | release) profile_dir=$profile ;;
    dev) profile_dir=debug ;;
    *) echo "build-image.sh: --profile is image, release or dev, not $profile" >&2; exit 2 ;;
esac
agent_dir="${bin_dir:-$CARGO_TARGET_DIR/$profile_dir}"
if [ -z "$bin_dir" ] && [ "$profile" = image ]; then
    agent_dir="$CARGO_TARGET_DIR/node-agent"
fi
bin_dir="${bin_dir:-$CARGO_TARGET_DIR/$profile_dir}"
binary="$bin_dir/switchyard"
agent="$agent_dir/switchyard-node-agent"
for tool in umoci skopeo ldd strip; do
    command -v "$tool" >/dev/null || {
        echo "build-image.sh: $tool is missing (scripts/install-image-tools.sh installs umoci and skopeo)" >&2
        exit 1
    }
done
certs=/etc/ssl/certs/ca-certificates.crt
[ -f "$certs" ] || { echo "build-image.sh: $certs is missing (Debian: ca-certificates)" >&2; exit 1; }

if [ "$build" = 1 ]; then
    cargo build --locked --profile "$profile" -p switchyard --bin switchyard
    agent_profile=$profile
    [ "$profile" = image ] && agent_profile=node-agent
    cargo build --locked --profile "$agent_profile" -p switchyard-node-agent --bin switchyard-node-agent
fi

epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | sed -n 1p)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc/ssl/certs" "$root/home/nonroot" "$root/tmp"
chmod 1777 "$root/tmp"
for b in "$binary" "$agent"; do
    [ -x "$b" ] || { echo "build-image.sh: $b is missing (build it, or drop --no-build)" >&2; exit 1; }
    # Debug info off, symbols kept (a panic's backtrace still names functions).
    strip --strip-debug -o "$root/usr/local/bin/$(basename "$b")" "$b"
    chmod 0755 "$root/usr/local/bin/$(basename "$b")"
done
for name in "${SERVICES[@]}"; do
    ln -s switchyard "$root/usr/local/bin/$name"
done
# The shared libraries and the dynamic loader, at the paths the binaries ask for.
for b in "$binary" "$agent"; do
    ldd "$b" | awk '/=> \// {print $3} /^\t\// {print $1}'
done | sort -u | while read -r lib; do
    cp -L --parents "$lib" "$root/"
done
# NVIDIA's libnvidia-ml.so.1, which the node agent loads at run time (the
# NVIDIA container runtime mounts it), links these; glibc keeps them beside libc.
libc_dir=$(ldd "$agent" | awk '/libc\.so\.6 => / {print $3}' | xargs dirname)
for lib in libpthread.so.0 libdl.so.2 librt.so.1; do
    cp -L --parents "$libc_dir/$lib" "$root/"
done
cp "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
if [ "$(id -u)" = 0 ]; then
    chown 65532:65532 "$root/home/nonroot"
    rootless=()
else
    rootless=(--rootless)
fi
find "$root" -exec touch -h -d "@$epoch" {} +

layout="$out/oci"
rm -rf "$layout"
mkdir -p "$out"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack "${rootless[@]}" --image "$layout:$tag" "$work/bundle"
cp -a "$root/." "$work/bundle/rootfs/"
umoci repack --image "$layout:$tag" \
    --history.created "$created" --history.created_by "scripts/build-image.sh" "$work/bundle"
umoci config --image "$layout:$tag" --no-history \
    --created "$created" \
    --os linux --architecture amd64 \
    --config.user 65532:65532 \
    --config.workingdir / \
    --config.entrypoint /usr/local/bin/switchyard \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin \
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --config.label org.opencontainers.image.title=switchyard \
    --config.label "org.opencontainers.image.description=Switchyard: the device-plugin and DRA GPU stacks side by side, and the migration between them" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.revision=$revision" \
    --config.label "org.opencontainers.image.created=$created" \
    --config.label org.opencontainers.image.licenses=Apache-2.0 \
    --manifest.annotation "org.opencontainers.image.ref.name=$tag"
umoci gc --layout "$layout"
archive="$out/switchyard-$tag.tar"
rm -f "$archive"
skopeo --insecure-policy copy --quiet "oci:$layout:$tag" "docker-archive:$archive:$image:$tag"
echo "image $image:$tag"
echo "  OCI layout      $layout (tag $tag)"
echo "  docker-archive  $archive"
echo "load it: docker load -i $archive | kind load image-archive $archive | ctr -n k8s.io images import $archive"
