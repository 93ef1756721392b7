#!/usr/bin/env bash
# Pin this module to one Kubernetes release: require k8s.io/kubernetes at VERSION and etcd's server at the version
# that release requires, and replace each staging module (k8s.io/api, k8s.io/client-go, ...) by its published
# v0.X.Y, read from the release's own go.mod (its `replace ... => ./staging/...` lines).
# Usage: controlplane/kubernetes/pin.sh v1.35.4
set -euo pipefail
cd "$(dirname "$0")"
version=${1:?usage: pin.sh vMAJOR.MINOR.PATCH}
staging=v0.${version#v1.}
release_mod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$release_mod")
{
  printf 'module ascendtrain/controlplane/kubernetes\n\ngo 1.25.0\n\nrequire (\n'
  printf '\tgo.etcd.io/etcd/server/v3 %s\n\tk8s.io/kubernetes %s\n)\n\n' "$etcd" "$version"
  awk -v v="$staging" '$2 == "=>" && $3 ~ /^\.\/staging\// {print "replace " $1 " => " $1 " " v}' "$release_mod"
} > go.mod
rm -f go.sum
go mod tidy
echo "pinned k8s.io/kubernetes $version (staging modules $staging, etcd server $etcd)"
