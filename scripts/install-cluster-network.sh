#!/usr/bin/env bash
# Builds the cluster's own plumbing that real nodes need for Services and
# DNS: kube-proxy from k8s.io/kubernetes (with the control plane's wrapper
# module: its staging modules replaced by their published versions), kubectl
# from the same module (a user's `kubectl port-forward` through the API
# server), and CoreDNS from github.com/coredns/coredns, from their Go modules through the
# module proxy, into the Switchyard cache ($SWITCHYARD_CACHE or
# ~/.cache/switchyard), keyed by versions; then packs CoreDNS as the image
# `localhost/coredns:v<version>` (a docker-archive beside the binaries, no
# base image) that a real node imports and runs as a Deployment. Idempotent:
# with everything in place it returns at once. With --print-dir it prints
# only the directory, once built.
#
# Needs umoci and skopeo (scripts/install-image-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
print_dir=0
[ "${1:-}" = --print-dir ] && print_dir=1

K8S_VERSION="${K8S_VERSION:-1.36.3}"
COREDNS_VERSION="${COREDNS_VERSION:-1.15.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/cluster-network/k8s-v$K8S_VERSION-coredns-v$COREDNS_VERSION"

have_all() {
    [ -x "$OUT/kube-proxy" ] && [ -x "$OUT/kubectl" ] && [ -x "$OUT/coredns" ] && [ -f "$OUT/coredns.tar" ]
}
if have_all; then
    if [ "$print_dir" = 1 ]; then echo "$OUT"; else echo "cluster network already built in $OUT"; fi
    exit 0
fi
if [ "$print_dir" = 1 ]; then
    "$0" >&2
    echo "$OUT"
    exit 0
fi
command -v go >/dev/null || { echo "install-cluster-network.sh: Go is needed" >&2; exit 1; }
for tool in umoci skopeo; do
    command -v "$tool" >/dev/null || { echo "install-cluster-network.sh: $tool is missing (scripts/install-image-tools.sh)" >&2; exit 1; }
done

mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-mod=mod CGO_ENABLED=0
started=$(date +%s)
say() { echo "   $* ($(( $(date +%s) - started ))s)"; }

if [ ! -x "$OUT/kube-proxy" ] || [ ! -x "$OUT/kubectl" ]; then
    say "kube-proxy and kubectl v$K8S_VERSION"
    minor="${K8S_VERSION#*.}"; staging_version="v0.$minor"
    mkdir -p "$work/k8s" && (
        cd "$work/k8s"
        go mod init switchyard.local/cluster-network >/dev/null 2>&1
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
        printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-proxy"\n\t_ "k8s.io/kubernetes/cmd/kubectl"\n)\n' > tools.go
        go mod tidy >/dev/null
        for cmd in kube-proxy kubectl; do
            go build -trimpath -ldflags "$ldflags" -o "$OUT/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
            mv "$OUT/$cmd.tmp" "$OUT/$cmd"
        done
    )
fi

if [ ! -x "$OUT/coredns" ]; then
    say "CoreDNS v$COREDNS_VERSION"
    mkdir -p "$work/coredns" && (
        cd "$work/coredns"
        go mod init switchyard.local/coredns >/dev/null 2>&1
        go mod edit -require "github.com/coredns/coredns@v$COREDNS_VERSION"
        printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/coredns/coredns"\n' > tools.go
        go mod tidy >/dev/null
        go build -trimpath -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=v$COREDNS_VERSION" \
            -o "$OUT/coredns.tmp" github.com/coredns/coredns
        mv "$OUT/coredns.tmp" "$OUT/coredns"
    )
fi

if [ ! -f "$OUT/coredns.tar" ]; then
    say "the image localhost/coredns:v$COREDNS_VERSION"
    rootfs="$work/coredns-rootfs"
    mkdir -p "$rootfs/bin" "$rootfs/etc/coredns"
    cp "$OUT/coredns" "$rootfs/bin/coredns"
    printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$rootfs/etc/passwd"
    find "$rootfs" -exec touch -h -d @0 {} +
    layout="$work/coredns-oci"
    umoci init --layout "$layout"
    umoci new --image "$layout:v$COREDNS_VERSION"
    umoci unpack --image "$layout:v$COREDNS_VERSION" "$work/coredns-bundle"
    cp -a "$rootfs/." "$work/coredns-bundle/rootfs/"
    umoci repack --image "$layout:v$COREDNS_VERSION" --history.created 1970-01-01T00:00:00Z \
        --history.created_by scripts/install-cluster-network.sh "$work/coredns-bundle"
    umoci config --image "$layout:v$COREDNS_VERSION" --no-history --created 1970-01-01T00:00:00Z \
        --os linux --architecture amd64 --config.workingdir / --config.user 65532:65532 \
        --config.entrypoint /bin/coredns
    umoci gc --layout "$layout"
    skopeo --insecure-policy copy --quiet "oci:$layout:v$COREDNS_VERSION" \
        "docker-archive:$OUT/coredns.tar.tmp:localhost/coredns:v$COREDNS_VERSION"
    mv "$OUT/coredns.tar.tmp" "$OUT/coredns.tar"
fi

# sed reads all of it: `head -1` may close the pipe while the program still
# writes, and pipefail then fails the script on the program's SIGPIPE.
"$OUT/kube-proxy" --version
"$OUT/kubectl" version --client | sed -n 1p
"$OUT/coredns" -version | sed -n 1p
echo "cluster network built in $OUT in $(( $(date +%s) - started ))s"
