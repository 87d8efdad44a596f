#!/usr/bin/env bash
# Builds the Kubernetes control plane the tests run against — kube-apiserver,
# kube-scheduler, kube-controller-manager from k8s.io/kubernetes and etcd from
# go.etcd.io/etcd — from the official Go modules through the module proxy,
# into the Switchyard cache ($SWITCHYARD_CACHE or ~/.cache/switchyard), keyed by
# version. Idempotent: with the binaries in place it returns at once.
#
# k8s.io/kubernetes requires its staging modules at v0.0.0 with local replaces,
# so it cannot be `go install`ed directly: a wrapper module requires it and
# replaces every staging module with its published v0.<minor>.<patch>. etcd's
# server module has local replaces too and gets its own wrapper.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.16}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/control-plane/k8s-v$K8S_VERSION-etcd-v$ETCD_VERSION"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager etcd)

have_all() {
  for b in "${BINARIES[@]}"; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
  echo "control plane v$K8S_VERSION (etcd v$ETCD_VERSION) already built in $OUT"
  exit 0
fi
command -v go >/dev/null || { echo "control-plane.sh: Go is needed (apt-get install golang-go)" >&2; exit 1; }

mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod

started=$(date +%s)
minor="${K8S_VERSION#*.}"; staging_version="v0.$minor"

echo "== kubernetes v$K8S_VERSION (staging modules at $staging_version)"
mkdir -p "$work/k8s" && cd "$work/k8s"
go mod init switchyard.local/control-plane >/dev/null 2>&1
go mod edit -require "k8s.io/kubernetes@v$K8S_VERSION"
gomod="$(go env GOMODCACHE)/k8s.io/kubernetes@v$K8S_VERSION/go.mod"
go mod download "k8s.io/kubernetes@v$K8S_VERSION"
for module in $(grep -E '=> \./staging/' "$gomod" | awk '{print $1}'); do
  go mod edit -replace "$module=$module@$staging_version"
done
ldflags="-s -w"
for var in gitVersion=v$K8S_VERSION gitMajor=1 gitMinor=${minor%%.*} gitTreeState=clean buildDate=1970-01-01T00:00:00Z; do
  ldflags="$ldflags -X k8s.io/component-base/version.$var -X k8s.io/client-go/pkg/version.$var"
done
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
GO
go mod tidy >/dev/null
for b in kube-apiserver kube-scheduler kube-controller-manager; do
  echo "   building $b ($(( $(date +%s) - started ))s)"
  go build -trimpath -ldflags "$ldflags" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b"
  mv "$OUT/$b.tmp" "$OUT/$b"
done

echo "== etcd v$ETCD_VERSION ($(( $(date +%s) - started ))s)"
mkdir -p "$work/etcd" && cd "$work/etcd"
go mod init switchyard.local/etcd >/dev/null 2>&1
go mod edit -require "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
go mod tidy >/dev/null
go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3
mv "$OUT/etcd.tmp" "$OUT/etcd"

"$OUT/kube-apiserver" --version
# sed reads all of it: `head -1` may close the pipe while etcd still writes,
# and under pipefail its SIGPIPE fails a build that succeeded (a cold CI run did).
"$OUT/etcd" --version | sed -n 1p
echo "control plane built in $OUT in $(( $(date +%s) - started ))s"
