#!/usr/bin/env bash
# Builds the clawfleet packages from a clean clone with one command:
#
#   packaging/build.sh
#
# -> target/packages/clawfleet-hostd_<v>-1_amd64.deb        clawfleet-hostd-<v>-1.x86_64.rpm
#    target/packages/clawfleet-coordinator_<v>-1_amd64.deb  clawfleet-coordinator-<v>-1.x86_64.rpm
#    target/packages/SHA256SUMS, SHA256SUMS.sig   checksums and their SSH signature
#    target/packages/allowed_signers              the key SHA256SUMS.sig verifies against
#    target/packages/test/        the same packages with a higher version (.deb <v>+pkgtest1-1,
#                                 .rpm release 1.pkgtest1), only for the upgrade/downgrade
#                                 tests; never publish these.
#
# The release binaries are built once (`cargo build --release --locked`, stripped by the
# workspace release profile) and packaged as they are into both formats by packaging/mkpkg.py
# with Debian's own tools (dpkg-deb, dpkg-shlibdeps from dpkg-dev; rpmbuild from the `rpm`
# package), from [package.metadata.deb] / [package.metadata.generate-rpm] in the crates'
# Cargo.toml. No cargo plugin is compiled (cargo-deb and cargo-generate-rpm cost a cold
# machine ~20 minutes).
# hostd is built in a cargo invocation of its own: built together with the coordinator, its
# dependencies would get the coordinator's features (tracing-subscriber's regex filter among
# them) and the shipped binary would grow past its 6 MiB budget. A release build never has
# hostd's dev-dependencies, so never its test-only fault hooks. The test gateway is built
# with the coordinator (it adds no features to it): the demo and the release-mode tests
# install target/release/clawfleet-test-gateway on their hosts.
#
# SHA256SUMS is signed with `ssh-keygen -Y sign -n clawfleet-packages` by the key in
# CLAWFLEET_SIGNING_KEY (an OpenSSH ed25519 private key file; a release uses the project's
# release key, see the README, "Verifying packages"). Without it, a key is generated for this
# build only and thrown away: the signature then only shows that signing works.
#
#   packaging/build.sh hostd-binary   only builds the shipped hostd binary and prints its path
#                                     (hostd's benchmark measures it; no packaging tools needed)
#
# Environment: CARGO_TARGET_DIR (default target), CLAWFLEET_PACKAGES_DIR (default
# $CARGO_TARGET_DIR/packages), CLAWFLEET_SKIP_TEST_PACKAGES=1 to leave out target/packages/test,
# CLAWFLEET_SIGNING_KEY and CLAWFLEET_SIGNING_PRINCIPAL (default release@clawfleet).
set -euo pipefail
cd "$(dirname "$0")/.."

# The one definition of the shipped hostd binary's build.
build_hostd() {
  cargo build --release --locked -p clawfleet-hostd
}

if [ "${1:-}" = hostd-binary ]; then
  build_hostd >&2
  dir="${CARGO_TARGET_DIR:-target}"
  case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac
  echo "$dir/release/hostd"
  exit 0
fi

PACKAGES=(hostd coordinator)
SIGNATURE_NAMESPACE=clawfleet-packages
principal="${CLAWFLEET_SIGNING_PRINCIPAL:-release@clawfleet}"

target_dir="${CARGO_TARGET_DIR:-target}"
out="${CLAWFLEET_PACKAGES_DIR:-$target_dir/packages}"
start=$(date +%s%N)
elapsed() { local ms=$(( ($(date +%s%N) - start) / 1000000 )); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }
step() { printf '== %s (%ss)\n' "$*" "$(elapsed)"; }

step "packaging tools"
# Debian package names of the tools mkpkg.py and the signature use.
need=()
command -v python3 >/dev/null || need+=(python3)
command -v dpkg-shlibdeps >/dev/null || need+=(dpkg-dev)
command -v rpmbuild >/dev/null || need+=(rpm)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
if [ ${#need[@]} -gt 0 ]; then
  echo "packaging/build.sh: missing tools; install them with: apt-get install --no-install-recommends ${need[*]}" >&2
  exit 1
fi

step "release binaries (built once for both formats, hostd on its own)"
build_hostd
cargo build --release --locked -p clawfleet-coordinator -p clawfleet-test-gateway
echo "hostd: $(stat -c %s "$target_dir/release/hostd") bytes (budget 6 MiB = 6291456)"

# File times and build dates from the last commit, so a rebuild of the same commit gives the
# same package contents (mkpkg.py clamps file dates to SOURCE_DATE_EPOCH, rpmbuild takes
# its build time from it). Set only now: some build
# scripts rerun when it changes, and the release build must not depend on it.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
export SOURCE_DATE_EPOCH

rm -rf "$out"
mkdir -p "$out"

for p in "${PACKAGES[@]}"; do
  step ".deb clawfleet-$p"
  packaging/mkpkg.py deb "$p" "$out"
  step ".rpm clawfleet-$p"
  packaging/mkpkg.py rpm "$p" "$out"
done

if [ "${CLAWFLEET_SKIP_TEST_PACKAGES:-0}" != 1 ]; then
  # The upgrade/downgrade tests install these over the real packages and back.
  mkdir -p "$out/test"
  for p in "${PACKAGES[@]}"; do
    deb=$(ls "$out/clawfleet-${p}_"*.deb)
    version=$(dpkg-deb -f "$deb" Version)
    step ".deb clawfleet-$p ${version%-*}+pkgtest1-${version##*-} (tests only)"
    packaging/mkpkg.py deb "$p" "$out/test" --deb-version "${version%-*}+pkgtest1-${version##*-}"
    step ".rpm clawfleet-$p release ${version##*-}.pkgtest1 (tests only)"
    packaging/mkpkg.py rpm "$p" "$out/test" --release "${version##*-}.pkgtest1"
  done
fi

step "SHA256SUMS and its signature"
(cd "$out" && sha256sum -- *.deb *.rpm > SHA256SUMS)
key="${CLAWFLEET_SIGNING_KEY:-}"
if [ -z "$key" ]; then
  keydir=$(mktemp -d)
  trap 'rm -rf "$keydir"' EXIT
  key="$keydir/ephemeral_ed25519"
  ssh-keygen -q -t ed25519 -N '' -C "$principal (ephemeral, this build only)" -f "$key"
  echo "CLAWFLEET_SIGNING_KEY is not set: signed with a key made for this build only"
fi
# The public half: KEY.pub beside it, else derived from it (asks for a passphrase-protected
# key's passphrase).
if [ -f "$key.pub" ]; then pub=$(cat "$key.pub"); else pub=$(ssh-keygen -y -f "$key"); fi
printf '%s namespaces="%s" %s\n' "$principal" "$SIGNATURE_NAMESPACE" "$pub" > "$out/allowed_signers"
rm -f "$out/SHA256SUMS.sig"
ssh-keygen -q -Y sign -f "$key" -n "$SIGNATURE_NAMESPACE" "$out/SHA256SUMS"
ssh-keygen -Y verify -f "$out/allowed_signers" -I "$principal" -n "$SIGNATURE_NAMESPACE" \
  -s "$out/SHA256SUMS.sig" < "$out/SHA256SUMS"
step "done"
ls -l "$out" "$out/test" 2>/dev/null | grep -v '^total'
