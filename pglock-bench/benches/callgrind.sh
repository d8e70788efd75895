#!/usr/bin/env bash
# Client-side cost per operation, in instructions, measured with valgrind's callgrind.
#
#   pglock-bench/benches/callgrind.sh [--dsn URL] [--libs pglock,sqlx_raw] [--workloads W1_same,W2_try_held]
#                        [--cycles-lo 200] [--cycles-hi 1200] [--features metrics]
#                        [-- extra lockbench flags]
#
# For every lib and workload it runs the lockbench binary twice under callgrind in its
# fixed-cycle mode (`--cycles N`: exactly N timed ops after `--warmup-cycles` untimed ones, no
# background sampler), once with N = lo and once with N = hi, and prints
#     (instructions(hi) - instructions(lo)) / (hi - lo)
# so connection setup, probes, the warm-up and process start-up cancel out. What is left is
# the client's instructions per op: the library, sqlx, tokio, the kernel-call wrappers and the
# harness loop (two clock reads and a Vec push per op, the same for every lib). Only the client
# process is counted; PostgreSQL is not. Instructions spent opening connections (TCP, startup,
# SCRAM-SHA-256: `PgConnection::establish`, inclusive) are left out of the per-op figure: a pool
# that grows while it runs opens a different number of them in each run, which would swamp the
# difference. The sessions column (the lib's sessions in pg_stat_activity at the end of each
# run) shows whether the pool grew.
#
# Needs valgrind and a server (default: $BENCH_DSN, else postgres://postgres:postgres@127.0.0.1:5432/bench).
set -euo pipefail

DSN="${BENCH_DSN:-postgres://postgres:postgres@127.0.0.1:5432/bench}"
LIBS="pglock,pglock_defaultpool,sqlx_raw,sqlx_advisory"
WORKLOADS="W1_same,W2_try_held"
LO=200
HI=1200
FEATURES=""
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dsn) DSN="$2"; shift 2;;
    --libs) LIBS="$2"; shift 2;;
    --workloads) WORKLOADS="$2"; shift 2;;
    --cycles-lo) LO="$2"; shift 2;;
    --cycles-hi) HI="$2"; shift 2;;
    --features) FEATURES="$2"; shift 2;;
    --) shift; EXTRA=("$@"); break;;
    -h|--help) sed -n '2,17p' "$0"; exit 0;;
    *) echo "callgrind.sh: unknown argument $1" >&2; exit 2;;
  esac
done
command -v valgrind >/dev/null || { echo "callgrind.sh: valgrind not found" >&2; exit 2; }

cd "$(dirname "${BASH_SOURCE[0]}")/../.."
# Build (or reuse) the optimised bench binary and find its path.
BIN="$(cargo bench -p pglock-bench --bench lockbench --no-run ${FEATURES:+--features "$FEATURES"} \
  --message-format=json 2>/dev/null \
  | sed -n 's/.*"executable":"\([^"]*lockbench[^"]*\)".*/\1/p' | tail -1)"
[ -x "$BIN" ] || { echo "callgrind.sh: could not build the lockbench binary" >&2; exit 1; }

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

instructions() { # file -> total Ir of the run
  sed -n 's/^summary: *\([0-9]*\).*/\1/p' "$1" | head -1
}

establish() { # file -> Ir spent opening connections (TCP + startup + SCRAM), inclusive
  local v
  v=$(callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null \
    | awk '/PgConnection>::establish::\{\{closure\}\}/ {gsub(",", "", $1); print $1; exit}' || true)
  echo "${v:-0}"
}

printf '| workload | lib | instructions per op | sessions open at the end (lo/hi run) | ops counted |\n|---|---|---:|---:|---:|\n'
IFS=, read -r -a libs <<<"$LIBS"
IFS=, read -r -a wls <<<"$WORKLOADS"
for wl in "${wls[@]}"; do
  for lib in "${libs[@]}"; do
    for n in "$LO" "$HI"; do
      valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$lib.$wl.$n" \
        "$BIN" --dsn "$DSN" --lib "$lib" --workloads "$wl" --cycles "$n" "${EXTRA[@]}" \
        >"$TMP/out.$lib.$wl.$n" 2>"$TMP/err.$lib.$wl.$n" || {
          echo "callgrind.sh: $lib $wl --cycles $n failed:" >&2; tail -5 "$TMP/err.$lib.$wl.$n" >&2; exit 1; }
    done
    lo_ir=$(instructions "$TMP/cg.$lib.$wl.$LO")
    hi_ir=$(instructions "$TMP/cg.$lib.$wl.$HI")
    lo_est=$(establish "$TMP/cg.$lib.$wl.$LO")
    hi_est=$(establish "$TMP/cg.$lib.$wl.$HI")
    per=$(( (hi_ir - hi_est - lo_ir + lo_est) / (HI - LO) ))
    label=$(sed -n 's/.*"lib":"\([^"]*\)".*/\1/p' "$TMP/out.$lib.$wl.$HI" | head -1)
    conns() { sed -n 's/.*"connections":\([0-9]*\).*/\1/p' "$1" | head -1; }
    printf '| %s | %s | %d | %s/%s | %d |\n' "$wl" "${label:-$lib}" "$per" \
      "$(conns "$TMP/out.$lib.$wl.$LO")" "$(conns "$TMP/out.$lib.$wl.$HI")" "$((HI - LO))"
  done
done
