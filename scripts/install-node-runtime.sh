#!/usr/bin/env bash
# Builds what a real node runs — kubelet, containerd with its runc shim, runc,
# the CNI plugins (bridge, host-local, loopback, portmap), crictl and a static
# pause program for the sandbox image — from their Go modules through the
# module proxy, into the Switchyard cache ($SWITCHYARD_CACHE or
# ~/.cache/switchyard), keyed by versions. Idempotent: with the binaries in
# place it returns at once. The test kit's `RealNode` starts them.
#
# kubelet comes from k8s.io/kubernetes with the control plane's wrapper module
# (its staging modules replaced by their published versions); runc needs cgo
# and libseccomp (Debian: libseccomp-dev, installed here when missing and run
# as root). With --print-dir it prints only the directory, once built.
set -euo pipefail
cd "$(dirname "$0")/.."
print_dir=0
[ "${1:-}" = --print-dir ] && print_dir=1

K8S_VERSION="${K8S_VERSION:-1.36.3}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-2.4.2}"
RUNC_VERSION="${RUNC_VERSION:-1.5.3}"
CNI_VERSION="${CNI_VERSION:-1.10.0}"
CRICTL_VERSION="${CRICTL_VERSION:-1.37.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/node-runtime/k8s-v$K8S_VERSION-containerd-v$CONTAINERD_VERSION-runc-v$RUNC_VERSION-cni-v$CNI_VERSION-crictl-v$CRICTL_VERSION"
BINARIES=(kubelet containerd containerd-shim-runc-v2 ctr runc crictl pause
    cni/bridge cni/host-local cni/loopback cni/portmap)

have_all() {
    for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
    if [ "$print_dir" = 1 ]; then echo "$OUT"; else echo "node runtime already built in $OUT"; fi
    exit 0
fi
if [ "$print_dir" = 1 ]; then
    "$0" >&2
    echo "$OUT"
    exit 0
fi
command -v go >/dev/null || { echo "install-node-runtime.sh: Go is needed" >&2; exit 1; }
if ! pkg-config --exists libseccomp 2>/dev/null; then
    if [ "$(id -u)" != 0 ]; then
        echo "install-node-runtime.sh: runc needs libseccomp; as root: apt-get install libseccomp-dev pkg-config" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends libseccomp-dev pkg-config gcc libc6-dev >/dev/null
fi

mkdir -p "$OUT/cni"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod
started=$(date +%s)
say() { echo "   $* ($(( $(date +%s) - started ))s)"; }

# Installs one package at a version into $OUT (GOBIN), then moves it to $2.
install_pkg() {
    local pkg="$1" dest="$2"; shift 2
    GOBIN="$work/bin" go install -trimpath "$@" "$pkg"
    local name="${pkg%@*}"; name="${name##*/}"
    mv "$work/bin/$name" "$OUT/$dest"
}

if [ ! -x "$OUT/kubelet" ]; then
    say "kubelet v$K8S_VERSION"
    minor="${K8S_VERSION#*.}"; staging_version="v0.$minor"
    mkdir -p "$work/k8s" && (
        cd "$work/k8s"
        go mod init switchyard.local/node-runtime >/dev/null 2>&1
        go mod edit -require "k8s.io/kubernetes@v$K8S_VERSION"
        go mod download "k8s.io/kubernetes@v$K8S_VERSION"
        gomod="$(go env GOMODCACHE)/k8s.io/kubernetes@v$K8S_VERSION/go.mod"
        for module in $(grep -E '=> \./staging/' "$gomod" | awk '{print $1}'); do
            go mod edit -replace "$module=$module@$staging_version"
        done
        ldflags="-s -w"
        for var in gitVersion=v$K8S_VERSION gitMajor=1 gitMinor=${minor%%.*} gitTreeState=clean buildDate=1970-01-01T00:00:00Z; do
            ldflags="$ldflags -X k8s.io/component-base/version.$var -X k8s.io/client-go/pkg/version.$var"
        done
        printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kubelet"\n' > tools.go
        go mod tidy >/dev/null
        CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$OUT/kubelet.tmp" k8s.io/kubernetes/cmd/kubelet
        mv "$OUT/kubelet.tmp" "$OUT/kubelet"
    )
fi

containerd="github.com/containerd/containerd/v2"
cd_ldflags="-s -w -X $containerd/version.Version=v$CONTAINERD_VERSION"
for b in containerd ctr containerd-shim-runc-v2; do
    [ -x "$OUT/$b" ] && continue
    say "$b v$CONTAINERD_VERSION"
    CGO_ENABLED=0 install_pkg "$containerd/cmd/$b@v$CONTAINERD_VERSION" "$b" \
        -tags no_btrfs -ldflags "$cd_ldflags"
done

if [ ! -x "$OUT/runc" ]; then
    say "runc v$RUNC_VERSION"
    CGO_ENABLED=1 install_pkg "github.com/opencontainers/runc@v$RUNC_VERSION" runc \
        -tags seccomp -ldflags "-s -w -X main.version=$RUNC_VERSION"
fi

for p in main/bridge ipam/host-local main/loopback meta/portmap; do
    [ -x "$OUT/cni/${p##*/}" ] && continue
    say "CNI ${p##*/} v$CNI_VERSION"
    CGO_ENABLED=0 install_pkg "github.com/containernetworking/plugins/plugins/$p@v$CNI_VERSION" \
        "cni/${p##*/}" -ldflags "-s -w"
done

if [ ! -x "$OUT/crictl" ]; then
    say "crictl v$CRICTL_VERSION"
    CGO_ENABLED=0 install_pkg "sigs.k8s.io/cri-tools/cmd/crictl@v$CRICTL_VERSION" crictl -ldflags "-s -w"
fi

if [ ! -x "$OUT/pause" ]; then
    say "pause (deploy/images/pause)"
    (cd deploy/images/pause && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/pause" .)
fi

"$OUT/kubelet" --version
"$OUT/containerd" --version
"$OUT/runc" --version | sed -n 1p
echo "node runtime built in $OUT in $(( $(date +%s) - started ))s"
