#!/usr/bin/env bash
# Builds the Kubernetes components the tests and the local cluster need, from Go
# modules, into a cache outside the repo. Nothing is downloaded prebuilt: no
# binary registry is reachable here. Rebuilds only what is missing.
#
# usage: test/tools/build.sh [component...]   (default: etcd kube-apiserver)
# Each tool lives in its own module under test/tools (kwok/, helm/, krew/) so
# their dependency graphs never touch the product's go.mod.
# prints the binary directory on its last line.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.7.3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${NVDRIVER_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nvdriver/bin/${K8S_VERSION}}"
mkdir -p "$cache"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kube-apiserver)

# Version stamps so the binaries report a real version (kwokctl and clients check it).
major=${K8S_VERSION#v}; major=${major%%.*}
minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=${major} -X ${pkg}.gitMinor=${minor}"
  ldflags+=" -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
done

for c in "${components[@]}"; do
  out="$cache/$c"
  mod=.
  if [ -x "$out" ]; then
    echo ">> $c: cached at $out" >&2
    continue
  fi
  case "$c" in
    etcd) pkg=./cmd/etcd; lf="-s -w" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler) pkg=k8s.io/kubernetes/cmd/$c; lf="$ldflags" ;;
    kwok|kwokctl) mod=kwok; pkg=sigs.k8s.io/kwok/cmd/$c; lf="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=0.8.0 -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}" ;;
    helm) mod=helm; pkg=helm.sh/helm/v3/cmd/helm; lf="-s -w -X helm.sh/helm/v3/internal/version.version=v3.22.0" ;;
    kubectl-krew) mod=krew; pkg=sigs.k8s.io/krew/cmd/krew; lf="-s -w" ;;
    validate-krew-manifest) mod=krew; pkg=sigs.k8s.io/krew/cmd/validate-krew-manifest; lf="-s -w" ;;
    gpu-operator) mod=nvidia; pkg=github.com/NVIDIA/gpu-operator/cmd/gpu-operator; lf="-s -w" ;;
    *) echo "error: unknown component $c (known: etcd kube-apiserver kube-controller-manager kube-scheduler kwok kwokctl helm kubectl-krew validate-krew-manifest gpu-operator)" >&2; exit 1 ;;
  esac
  echo ">> building $c (first build takes several minutes on 2 cores; later runs use the cache)" >&2
  start=$(date +%s)
  # Progress: a dot every 30s so a long cold build is visibly alive.
  ( while sleep 30; do printf '.' >&2; done ) & ticker=$!
  trap 'kill $ticker 2>/dev/null || true' EXIT
  if ! (cd "$here/$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$lf" -o "$out.tmp" "$pkg"); then
    kill $ticker 2>/dev/null || true
    rm -f "$out.tmp"
    echo "error: building $c failed" >&2
    exit 1
  fi
  kill $ticker 2>/dev/null || true
  mv "$out.tmp" "$out"
  echo "" >&2
  echo ">> $c built in $(( $(date +%s) - start ))s -> $out" >&2
done
echo "$cache"
