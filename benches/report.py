#!/usr/bin/env python3
"""Runs the lockbench binary several times and tabulates the results.

    python3 benches/report.py [--reps 3] [--baseline sqlx_raw] [--out report.md] \
        [--jsonl results.jsonl] -- [lockbench flags...]

Each rep is one run of the binary, in which every library runs every workload, libraries
alternating workload by workload. The table shows, per workload and library, the median of
`ops_per_s` over the reps with its min-max, the median p50/p99, how many reps were correct,
the largest connection count, and the ratio to the baseline library: the median over reps of
the ratio taken within each rep (so a machine that drifts between reps does not skew it).

Standard library only. The binary is built with `cargo bench --no-run` unless --bin is given.
"""

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict


def bench_binary():
    out = subprocess.run(
        ["cargo", "bench", "--bench", "lockbench", "--no-run", "--message-format=json"],
        check=True, capture_output=True, text=True,
    ).stdout
    exe = None
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("executable") and "lockbench" in msg["executable"]:
            exe = msg["executable"]
    if not exe:
        sys.exit("report.py: could not build the lockbench binary")
    return exe


def run_rep(binary, flags, rep):
    proc = subprocess.run([binary, *flags], capture_output=True, text=True)
    rows = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            row["rep"] = rep
            rows.append(row)
    if not rows:
        sys.stderr.write(proc.stderr[-2000:])
        sys.exit(f"report.py: rep {rep} printed no result line (exit {proc.returncode})")
    return rows


def fmt(x, digits=0):
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def table(rows, baseline):
    by = defaultdict(list)
    for row in rows:
        by[(row["workload"], row["lib"])].append(row)
    base = {(r["workload"], r["rep"]): r["ops_per_s"] for r in rows if r["lib"] == baseline}
    out = [
        f"| workload | lib | ops/s (median) | min-max | p50 ms | p99 ms | correct | conns | x{baseline} |",
        "|---|---|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    for (workload, lib), group in sorted(by.items(), key=lambda kv: (kv[0][0], -statistics.median(r["ops_per_s"] for r in kv[1]))):
        ops = [r["ops_per_s"] for r in group]
        ratios = [r["ops_per_s"] / base[(workload, r["rep"])] for r in group
                  if base.get((workload, r["rep"]))]
        p50 = [r["p50_ms"] for r in group if r["p50_ms"] is not None]
        p99 = [r["p99_ms"] for r in group if r["p99_ms"] is not None]
        out.append("| {} | {} | {} | {}-{} | {} | {} | {}/{} | {} | {} |".format(
            workload, lib, fmt(statistics.median(ops)), fmt(min(ops)), fmt(max(ops)),
            fmt(statistics.median(p50), 3) if p50 else "-",
            fmt(statistics.median(p99), 3) if p99 else "-",
            sum(1 for r in group if r["correct"]), len(group),
            max(r["connections"] for r in group),
            fmt(statistics.median(ratios), 2) if ratios else "-",
        ))
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline", default="sqlx_raw")
    parser.add_argument("--bin", help="the lockbench binary (default: build it)")
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--jsonl", help="also write every result line here")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then lockbench flags")
    args = parser.parse_args()
    flags = [f for f in args.flags if f != "--"]
    binary = args.bin or bench_binary()
    rows = []
    for rep in range(args.reps):
        sys.stderr.write(f"report.py: rep {rep + 1}/{args.reps}\n")
        rows.extend(run_rep(binary, flags, rep))
    text = table(rows, args.baseline)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    if not all(r["correct"] for r in rows if r["lib"] != "noop"):
        sys.exit(1)


if __name__ == "__main__":
    main()
