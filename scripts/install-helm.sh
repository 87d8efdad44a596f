#!/usr/bin/env bash
# Builds helm (v3) from its Go module, helm.sh/helm/v3, through the module proxy
# into the Switchyard cache ($SWITCHYARD_CACHE or ~/.cache/switchyard)/helm/<version>/helm,
# with the same version stamps as helm's own Makefile (the version, and the
# Kubernetes version `helm template` and `helm lint` assume, taken from the
# client-go helm is built with). Idempotent: with the binary in place it prints
# its path and returns at once. The chart tests (tests/tests/helm_chart/) use it.
set -euo pipefail

VERSION="${HELM_VERSION:-3.22.0}"
CACHE="${SWITCHYARD_CACHE:-$HOME/.cache/switchyard}"
OUT="$CACHE/helm/v$VERSION"
BIN="$OUT/helm"

if [ -x "$BIN" ] && "$BIN" version --template '{{.Version}}' 2>/dev/null | grep -qx "v$VERSION"; then
  echo "helm v$VERSION already installed at $BIN"
  exit 0
fi

command -v go >/dev/null || { echo "install-helm: Go is needed to build helm (apt-get install golang-go)" >&2; exit 1; }
mkdir -p "$OUT"
build="$(mktemp -d)"
trap 'rm -rf "$build"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod
started=$(date +%s)

echo "building helm v$VERSION from helm.sh/helm/v3 ..."
module="helm.sh/helm/v3@v$VERSION"
gomod="$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
# helm's Makefile: Kubernetes major = client-go major + 1, minor = client-go minor.
client_go="$(awk '$1 == "k8s.io/client-go" { print $2 }' "$gomod")"
client_go="${client_go#v}"
k8s_major=$(( ${client_go%%.*} + 1 ))
k8s_minor="$(echo "$client_go" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=v$VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags="$ldflags -X $pkg.k8sVersionMajor=$k8s_major -X $pkg.k8sVersionMinor=$k8s_minor"
done
GOBIN="$build" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@v$VERSION"
install -m 0755 "$build/helm" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" version
echo "helm v$VERSION built into $BIN in $(( $(date +%s) - started ))s"
