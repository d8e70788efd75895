#!/usr/bin/env bash
# The public API of every published library crate of the workspace, one item a line, checked in
# under api/: a change to the API shows as a diff of api/<crate>.txt in review, and CI fails when
# the API changed without the listing.
#
#   scripts/api-listing.sh            # --check: compare with api/*.txt, fail with the diff
#   scripts/api-listing.sh --write    # write api/*.txt from the code as it is
#
# The crates: those of `cargo metadata` without `publish = false` that have a library target.
# For each, rustdoc's JSON output (unstable, hence RUSTC_BOOTSTRAP=1 on the stable toolchain),
# with all features, into its own target directory (target/api, or $PGLOCK_API_TARGET_DIR) so
# as not to wait on the lock of target/; then scripts/public-api.py turns it into the listing
# (what it lists and how it orders it: the header of that script). The API of a crate's workspace
# dependencies is written at their public paths (`pglock::LockManager`, not the module it is
# declared in), so their JSON comes first.
#
# Offline: cargo builds from its cache as `cargo check` would (CARGO_NET_OFFLINE=true is
# honoured); nothing is downloaded but the crates of Cargo.lock, as for any build.
# Needs python3 (standard library) and diff.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=check
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    --write) mode=write ;;
    -h | --help)
      sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *) echo "api-listing.sh: unknown option $arg (--check, --write)" >&2; exit 2 ;;
  esac
done

start=$SECONDS
root=$(pwd)
target_dir=${PGLOCK_API_TARGET_DIR:-$root/target/api}
out_dir=api

# `package lib-target-name features dependencies`, one a line, in an order where a crate comes
# after the workspace crates it depends on; features and dependencies comma-separated, or `-`.
crates=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
packages = json.load(sys.stdin)["packages"]
published = {}
for p in packages:
    if p["publish"] == []:
        continue
    libs = [t for t in p["targets"] if "lib" in t["kind"] or "proc-macro" in t["kind"]]
    if libs:
        published[p["name"]] = (p, libs[0]["name"])
done, order = set(), []
def visit(name):
    if name in done:
        return
    done.add(name)
    p, lib = published[name]
    deps = sorted({d["name"] for d in p["dependencies"] if d["name"] in published
                   and d["name"] != name and d.get("kind") in (None, "normal", "build")})
    for d in deps:
        visit(d)
    features = sorted(f for f in p["features"] if f != "default")
    order.append(" ".join([name, lib, ",".join(features) or "-", ",".join(deps) or "-"]))
for name in sorted(published):
    visit(name)
print("\n".join(order))
')
if [ -z "$crates" ]; then
  echo "api-listing.sh: no published library crate in the workspace" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
declare -A json_of
failed=() listed=()
while read -r name lib features deps; do
  listed+=("$name")
  echo "== $name: rustdoc JSON (all features)"
  RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$target_dir" \
    cargo rustdoc --quiet -p "$name" --all-features --lib -- -Z unstable-options --output-format json
  json="$target_dir/doc/$lib.json"
  json_of[$name]=$json
  dep_args=()
  if [ "$deps" != - ]; then
    IFS=, read -r -a dep_names <<<"$deps"
    for dep in "${dep_names[@]}"; do dep_args+=(--dep "${json_of[$dep]}"); done
  fi
  feature_arg=()
  if [ "$features" != - ]; then feature_arg=(--features "$features"); fi
  python3 scripts/public-api.py "$json" --package "$name" "${feature_arg[@]}" "${dep_args[@]}" \
    >"$tmp/$name.txt"
  listing="$out_dir/$name.txt"
  if [ "$mode" = write ]; then
    mkdir -p "$out_dir"
    if [ -f "$listing" ] && cmp -s "$tmp/$name.txt" "$listing"; then
      echo "   $listing unchanged ($(grep -vc '^//\|^$' "$listing") items)"
    else
      cp "$tmp/$name.txt" "$listing"
      echo "   wrote $listing ($(grep -vc '^//\|^$' "$listing") items)"
    fi
  elif [ ! -f "$listing" ]; then
    echo "   $listing is missing" >&2
    failed+=("$name")
  elif ! diff -u --label "$listing (checked in)" --label "$listing (the code)" "$listing" "$tmp/$name.txt"; then
    failed+=("$name")
  else
    echo "   $listing matches"
  fi
done <<<"$crates"

# A listing of a crate that is no longer a published library.
for file in "$out_dir"/*.txt; do
  [ -e "$file" ] || continue
  base=$(basename "$file" .txt)
  if [[ " ${listed[*]} " != *" $base "* ]]; then
    if [ "$mode" = write ]; then
      rm "$file"
      echo "   removed $file: $base is no longer a published library crate of the workspace"
    else
      echo "   $file lists no published library crate of the workspace" >&2
      failed+=("$base")
    fi
  fi
done

elapsed=$((SECONDS - start))
if [ "${#failed[@]}" -gt 0 ]; then
  echo >&2
  echo "the public API changed (${failed[*]}): review the diff, then run scripts/api-listing.sh --write and commit api/" >&2
  echo "api-listing.sh: ${#listed[@]} crates in ${elapsed} s" >&2
  exit 1
fi
echo "api-listing.sh: ${#listed[@]} crates in ${elapsed} s ($mode)"
