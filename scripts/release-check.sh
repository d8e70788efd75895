#!/usr/bin/env bash
# Release check: would the published crates publish, and does the version say what changed?
#
#  1. `cargo publish --dry-run` of every published crate of the workspace, together: each is
#     packaged and then built from its package alone, against the other crates' packages
#     (not yet on the registry), as crates.io would get them.
#  2. cargo-semver-checks of each published library that the last release had, against that
#     release built from git: a change that breaks its API needs a major version (for 0.x, the
#     minor: 0.3 -> 0.4), a new API a minor one (for 0.x, the patch).
#
# Options:
#   --allow-dirty  package a work tree with uncommitted changes (CI runs on a clean clone).
#   --offline      no network: `cargo package` instead of `cargo publish --dry-run` (the same
#                  packaging and build, without asking the registry whether the versions are
#                  taken), and every cargo command offline. CARGO_NET_OFFLINE=true does the same.
#                  Needs the dependencies in cargo's cache and cargo-semver-checks installed.
set -euo pipefail
cd "$(dirname "$0")/.."

# The last release, 0.3.0: the tree CHANGELOG's 0.3.0 section describes, the last commit
# before 0.3.1's fix (its later commits changed docs, tests and scripts, no API). After the
# next release, pin that release's commit here.
BASELINE_VERSION=0.3.0
BASELINE_REV=5a28b3be25bb36c1b4e2f6faa537d87fa2d54d0e

allow_dirty=()
offline=false
case "${CARGO_NET_OFFLINE:-}" in true | 1) offline=true ;; esac
for arg in "$@"; do
  case "$arg" in
    --allow-dirty) allow_dirty=(--allow-dirty) ;;
    --offline) offline=true ;;
    *) echo "release-check.sh: unknown option $arg (--allow-dirty, --offline)" >&2; exit 2 ;;
  esac
done
if $offline; then export CARGO_NET_OFFLINE=true; fi

git cat-file -e "$BASELINE_REV^{commit}" 2>/dev/null || {
  echo "the baseline commit $BASELINE_REV is not in this clone (a shallow clone?): fetch it" >&2
  exit 1
}

# The published crates (no `publish = false`), and among them the libraries that existed at
# the baseline: `name manifest-path-relative-to-the-root lib|bin features|-`, one a line.
root=$(pwd)
crates=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, os, sys
for p in json.load(sys.stdin)["packages"]:
    if p["publish"] == []:
        continue
    lib = any("lib" in t["kind"] for t in p["targets"])
    features = any(f != "default" for f in p["features"])
    print(p["name"], os.path.relpath(p["manifest_path"], sys.argv[1]), "lib" if lib else "bin",
          "features" if features else "-")
' "$root")
published=() libraries=() with_features=()
while read -r name manifest kind features; do
  published+=("$name")
  if [ "$kind" = lib ] && git cat-file -e "$BASELINE_REV:$manifest" 2>/dev/null; then
    libraries+=("$name")
    if [ "$features" = features ]; then with_features+=("$name"); fi
  fi
done <<<"$crates"

start=$SECONDS
packages=()
for name in "${published[@]}"; do packages+=(-p "$name"); done
if $offline; then
  echo "== packaging and building ${published[*]} (offline: cargo package)"
  cargo package "${packages[@]}" "${allow_dirty[@]}"
else
  echo "== cargo publish --dry-run: ${published[*]}"
  cargo publish "${packages[@]}" --dry-run "${allow_dirty[@]}"
fi
echo "== packages built from their contents in $((SECONDS - start)) s"

start=$SECONDS
if ! command -v cargo-semver-checks >/dev/null; then
  echo "== installing cargo-semver-checks"
  cargo install cargo-semver-checks --locked
fi
echo "== $(cargo semver-checks --version) against $BASELINE_VERSION ($BASELINE_REV): ${libraries[*]}"
semver_packages=()
for name in "${libraries[@]}"; do semver_packages+=(-p "$name"); done
if [ ${#semver_packages[@]} = 0 ]; then
  echo "no published library existed at $BASELINE_REV: nothing to compare" >&2
  exit 1
fi
# cargo-semver-checks builds each crate's documentation in a workspace of its own, each with
# its own target directory; one shared build directory compiles the dependencies once instead
# of six times (about 75 s instead of 5 minutes on two cores). If it reports a rustdoc format
# it does not know, the toolchain is newer than it: `cargo install cargo-semver-checks --locked
# --force`.
export CARGO_BUILD_BUILD_DIR="$root/target/semver-build"
# With every feature on (cargo-semver-checks' default), then, for the crates that have
# features, with the default ones only: an item moved behind a feature is gone for the users
# who do not turn it on, which the first pass cannot see.
failed=0
cargo semver-checks "${semver_packages[@]}" --baseline-rev "$BASELINE_REV" || failed=1
for name in "${with_features[@]}"; do
  echo "== $name with its default features only"
  cargo semver-checks -p "$name" --baseline-rev "$BASELINE_REV" --default-features || failed=1
done
echo "== semver checks in $((SECONDS - start)) s"
if [ "$failed" != 0 ]; then
  echo "the version does not say what changed since $BASELINE_VERSION (above): raise it" >&2
  exit 1
fi
