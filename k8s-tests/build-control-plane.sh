#!/usr/bin/env bash
# Builds the control-plane test tier's binaries (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) from the Go module proxy through the wrapper modules in go/, into a
# directory keyed by every version, so a machine pays the cold build once.
#
#   k8s-tests/build-control-plane.sh              build if needed, print the directory last
#   k8s-tests/build-control-plane.sh --print-dir  only print the directory
#
# Environment:
#   CLAWFLEET_K8S_CACHE_ROOT  parent of the keyed directories (default /var/cache/clawfleet-k8s)
#   CLAWFLEET_K8S_MIN_FREE_GB free disk demanded before a cold build (default 8)
#
# The keyed directory holds the five binaries, a stamp file (.complete) written after them,
# atomically (with the stamp present they are not rebuilt), and kwok's stage files (stages/,
# copied whenever one is missing). A flock on
# the cache root keeps two runs from building at once; the second waits, then finds the stamp.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gomods="$here/go"

# The versions come from the wrapper modules, so the key cannot drift from what is built.
mod_version() { # file module
    awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"
}
k8s_version="$(mod_version "$gomods/kubernetes/go.mod" k8s.io/kubernetes)"
etcd_version="$(mod_version "$gomods/etcd/go.mod" go.etcd.io/etcd/server/v3)"
kwok_version="$(mod_version "$gomods/kwok/go.mod" sigs.k8s.io/kwok)"
for v in "$k8s_version" "$etcd_version" "$kwok_version"; do
    if [[ ! "$v" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
        echo "build-control-plane: could not read a release version from the go.mod files in $gomods (got '$v')" >&2
        exit 1
    fi
done

root="${CLAWFLEET_K8S_CACHE_ROOT:-/var/cache/clawfleet-k8s}"
key="k8s${k8s_version#v}-etcd${etcd_version#v}-kwok${kwok_version#v}"
dir="$root/$key"
stamp="$dir/.complete"

if [[ "${1:-}" == "--print-dir" ]]; then
    echo "$dir"
    exit 0
fi

binaries=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
# kwok's shipped stage files the harness uses (paths under its kustomize/stage/).
stage_files=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml
    volume/fast/storage-class.yaml volume/fast/pvc-provision.yaml volume/fast/pv-bind.yaml
    volume/fast/pvc-delete.yaml volume/fast/pv-delete.yaml)
binaries_complete() {
    [[ -f "$stamp" ]] || return 1
    local b
    for b in "${binaries[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
}
stages_complete() {
    local f
    for f in "${stage_files[@]}"; do [[ -f "$dir/stages/$(basename "$f")" ]] || return 1; done
}
complete() { binaries_complete && stages_complete; }

step_start=0
step() { step_start=$(date +%s); echo "build-control-plane: $* ..." >&2; }
done_step() { echo "build-control-plane:   done in $(($(date +%s) - step_start)) s" >&2; }

if complete; then
    echo "build-control-plane: $key already built in $dir" >&2
    echo "$dir"
    exit 0
fi

# Go is preinstalled under /usr/local/go on the project's machines; PATH may lack it.
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
fi
command -v go >/dev/null || { echo "build-control-plane: no 'go' on PATH or in /usr/local/go/bin; the control-plane tier needs Go >= 1.26 to build its binaries" >&2; exit 1; }
mkdir -p "$root"
exec 9>"$root/.build.lock"
echo "build-control-plane: waiting for the build lock $root/.build.lock" >&2
flock 9
if complete; then
    echo "build-control-plane: $key was built by another run meanwhile" >&2
    echo "$dir"
    exit 0
fi

min_free_gb="${CLAWFLEET_K8S_MIN_FREE_GB:-8}"
for d in "$root" "$(go env GOCACHE)" "$(go env GOMODCACHE)"; do
    mkdir -p "$d"
    free_kb="$(df -Pk "$d" | awk 'NR == 2 { print $4 }')"
    if ((free_kb < min_free_gb * 1024 * 1024)); then
        echo "build-control-plane: only $((free_kb / 1024 / 1024)) GB free under $d; a cold build needs about $min_free_gb GB (module cache, build cache, binaries); set CLAWFLEET_K8S_MIN_FREE_GB to override" >&2
        exit 1
    fi
done

total_start=$(date +%s)
mkdir -p "$dir"
export CGO_ENABLED=0
# The go.sum files are committed and complete for linux/amd64; never rewrite them here.
export GOFLAGS="${GOFLAGS:-} -mod=readonly"

if ! binaries_complete; then
rm -f "$stamp"
step "downloading modules (kubernetes $k8s_version, etcd $etcd_version, kwok $kwok_version)"
for m in kubernetes etcd kwok; do (cd "$gomods/$m" && go mod download); done
done_step

k8s_minor="$(echo "$k8s_version" | cut -d. -f2)"
k8s_ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$k8s_minor"
    k8s_ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

build() { # module-dir binary-name package ldflags
    step "building $2"
    (cd "$gomods/$1" && go build -trimpath -ldflags "$4" -o "$dir/.$2.tmp" "$3")
    mv -f "$dir/.$2.tmp" "$dir/$2"
    done_step
}
build etcd etcd go.etcd.io/etcd/server/v3 "-s -w"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok \
    "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$k8s_version"
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
build kubernetes kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$k8s_ldflags"

"$dir/kube-apiserver" --version >&2
# Not `| head -1`: under pipefail, etcd can die of SIGPIPE when head exits first, which
# failed this script (and .ci/run with it) after a complete build.
etcd_version_line="$("$dir/etcd" --version)"
echo "${etcd_version_line%%$'\n'*}" >&2

printf 'kubernetes %s\netcd %s\nkwok %s\nbuilt %s in %s s\n' "$k8s_version" "$etcd_version" "$kwok_version" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(($(date +%s) - total_start))" >"$dir/.complete.tmp"
mv -f "$dir/.complete.tmp" "$stamp"
fi

if ! stages_complete; then
step "copying kwok's stage files"
kwok_src="$(cd "$gomods/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
rm -rf "$dir/.stages.tmp"
mkdir -p "$dir/.stages.tmp"
for f in "${stage_files[@]}"; do
    cp "$kwok_src/kustomize/stage/$f" "$dir/.stages.tmp/$(basename "$f")"
done
chmod 0644 "$dir/.stages.tmp"/*
rm -rf "$dir/stages"
mv "$dir/.stages.tmp" "$dir/stages"
done_step
fi
echo "build-control-plane: built $key in $(($(date +%s) - total_start)) s; $(du -sh "$dir" | cut -f1) in $dir" >&2
echo "$dir"
