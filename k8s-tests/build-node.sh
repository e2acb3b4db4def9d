#!/usr/bin/env bash
# Builds the real node's own parts for the control-plane test tier: the kubelet (from the same
# wrapper module as the control plane, go/kubernetes) and the sandbox ("pause") program
# (go/pause), into a directory keyed by the Kubernetes version and the pause source's hash.
# containerd, runc, the CNI plugins and busybox are Debian's packages (containerd, runc,
# containernetworking-plugins, busybox-static); the script warns when one is missing (the
# harness checks them at start: a skip, or a failure under CI=true).
#
#   k8s-tests/build-node.sh              build if needed, print the directory last
#   k8s-tests/build-node.sh --print-dir  only print the directory
#
# Environment: CLAWFLEET_K8S_CACHE_ROOT (default /var/cache/clawfleet-k8s).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gomods="$here/go"
k8s_version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ { print $2; exit }' "$gomods/kubernetes/go.mod")"
if [[ ! "$k8s_version" =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
    echo "build-node: could not read the k8s.io/kubernetes version from $gomods/kubernetes/go.mod (got '$k8s_version')" >&2
    exit 1
fi
pause_hash="$(cat "$gomods/pause/go.mod" "$gomods/pause/main.go" | sha256sum | cut -c1-12)"
root="${CLAWFLEET_K8S_CACHE_ROOT:-/var/cache/clawfleet-k8s}"
key="node-k8s${k8s_version#v}-pause${pause_hash}"
dir="$root/$key"
stamp="$dir/.complete"
if [[ "${1:-}" == "--print-dir" ]]; then
    echo "$dir"
    exit 0
fi

missing=()
for f in /usr/bin/containerd /usr/bin/containerd-shim-runc-v2 /usr/bin/ctr /usr/sbin/runc \
    /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback /bin/busybox; do
    [[ -x "$f" ]] || missing+=("$f")
done
if ((${#missing[@]})); then
    echo "build-node: warning: missing ${missing[*]}; the node also needs Debian's packages: apt-get install containerd runc containernetworking-plugins busybox-static" >&2
fi

complete() { [[ -f "$stamp" && -x "$dir/kubelet" && -x "$dir/pause" ]]; }
if complete; then
    echo "build-node: $key already built in $dir" >&2
    echo "$dir"
    exit 0
fi
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
fi
command -v go >/dev/null || { echo "build-node: no 'go' on PATH or in /usr/local/go/bin" >&2; exit 1; }
mkdir -p "$root"
exec 9>"$root/.build-node.lock"
flock 9
if complete; then
    echo "build-node: $key was built by another run meanwhile" >&2
    echo "$dir"
    exit 0
fi
start=$(date +%s)
mkdir -p "$dir"
rm -f "$stamp"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
minor="$(echo "$k8s_version" | cut -d. -f2)"
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$k8s_version -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
echo "build-node: building kubelet $k8s_version ..." >&2
(cd "$gomods/kubernetes" && go mod download && go build -trimpath -ldflags "$ldflags" -o "$dir/.kubelet.tmp" k8s.io/kubernetes/cmd/kubelet)
mv -f "$dir/.kubelet.tmp" "$dir/kubelet"
echo "build-node: building pause ..." >&2
(cd "$gomods/pause" && go build -trimpath -ldflags "-s -w" -o "$dir/.pause.tmp" .)
mv -f "$dir/.pause.tmp" "$dir/pause"
"$dir/kubelet" --version >&2
printf 'kubelet %s\npause %s\nbuilt %s in %s s\n' "$k8s_version" "$pause_hash" \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(($(date +%s) - start))" >"$dir/.complete.tmp"
mv -f "$dir/.complete.tmp" "$stamp"
echo "build-node: built $key in $(($(date +%s) - start)) s" >&2
echo "$dir"
