#!/usr/bin/env python3
"""Where one CPU's time goes per op: the bench's process, and the server's.

    python3 pglock-bench/benches/cpu_split.py [--libs pglock,sqlx_raw] \
        [--workloads W1_same,W2_try_held] [--reps 3] [--cpu 0] [--cycles-lo 2000] \
        [--cycles-hi 42000] [--period-us 250] [--baseline sqlx_raw] [--bin PATH] \
        [--jsonl out.jsonl] [-- lockbench flags...]
    python3 pglock-bench/benches/cpu_split.py --from out.jsonl [--baseline sqlx_raw]

Pins the local server's processes and the bench to one CPU (as `report.py --pin` does) and
samples that CPU with `perf record -e cpu-clock` (a sample every `--period-us` of CPU time,
whoever is running, kernel work included) while the bench runs one workload of one library in
its fixed-cycle mode. It does that twice, with `--cycles-lo` and `--cycles-hi` timed ops, and
divides the difference in samples by the difference in ops, so start-up, connecting and the
warm-up cancel out, as in `callgrind.sh`. Samples count for the `client` (the bench's process,
all its threads) or the `server` (processes named `postgres`); the JSON lines also keep `idle`
and `other`, which are not per-op figures: a run's start and end wait for different lengths
of time, so their differences can even be negative. Libraries alternate within each rep.

What for: pinned to one CPU an op is all CPU work, and `client + server` is its CPU time,
independent of the clocks each process keeps; it should agree with `wall` (the bench's own
timing of the same ops) within about 1 %, and the tool warns about a run that is 3 % off or in
which other processes took the CPU. The split between the two is what perf saw,
and is only as good as its calibration: run `sqlx_raw_x --raw-spin N` (a known client-only
cost) beside the floor. On the VM this was written on, the spin's cost landed about twice on
the client's side and was taken off the server's (docs/benchmarks/notebook.md, "Sampling the
pinned CPU instead"), so there only the sum was dependable.

Needs `perf` and the right to sample a whole CPU (root, or kernel.perf_event_paranoid <= 0), a
local server (the DSN's) and the right to change its processes' affinity. Prints medians over
the reps, the min-max of `client + server`, and each library's difference to `--baseline`
and speed relative to it, paired rep by rep. Standard library only.
"""

import argparse
import collections
import contextlib
import errno
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import PinnedServer, bench_binary  # noqa: E402

GROUPS = ("client", "server", "idle", "other")
# The workloads lockbench can run a fixed number of ops of (`--cycles`).
FIXED_CYCLE_WORKLOADS = ("W1_same", "W1_distinct", "W2_try_held")


def open_control(ctl, perf):
    """Opens perf's control fifo for writing once perf has opened it, or exits if perf ends
    first (no right to sample, say) rather than waiting for it forever."""
    while True:
        try:
            return os.fdopen(os.open(ctl, os.O_WRONLY | os.O_NONBLOCK), "w")
        except OSError as err:
            if err.errno != errno.ENXIO:  # ENXIO: nobody reads it yet
                raise
        if perf.poll() is not None:
            sys.exit(f"cpu_split.py: perf record ended: {perf.stderr.read().strip()[-500:]}")
        time.sleep(0.01)


def sampled_run(binary, flags, cpu, period_ns, tmp):
    """Runs the bench once, pinned to `cpu`, under `perf record` of that CPU; returns its
    result line and the samples per group."""
    data = os.path.join(tmp, "perf.data")
    ctl, ack = os.path.join(tmp, "ctl"), os.path.join(tmp, "ack")
    for path in (data, ctl, ack):
        if os.path.exists(path):
            os.remove(path)  # never read the last run's samples if this one writes none
    os.mkfifo(ctl)
    os.mkfifo(ack)
    # Started with sampling off (`-D -1`), then switched on through its control fifo: perf
    # acknowledges once it samples, and only then does the bench start, so no op goes unseen.
    perf = subprocess.Popen(
        ["perf", "record", "-D", "-1", f"--control=fifo:{ctl},{ack}", "-e", "cpu-clock",
         "-c", str(period_ns), "-C", str(cpu), "-o", data],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        with open_control(ctl, perf) as control, open(ack) as answer:
            control.write("enable\n")
            control.flush()
            if answer.readline().strip() != "ack":
                perf.wait()
                sys.exit("cpu_split.py: perf record did not start sampling: "
                         f"{perf.stderr.read().strip()[-500:]}")
        bench = subprocess.Popen([binary, *flags], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
        out, err = bench.communicate()
    finally:
        perf.send_signal(signal.SIGINT)  # perf writes its data and exits
        _, perf_err = perf.communicate()
    if not os.path.exists(data):
        sys.exit(f"cpu_split.py: perf record wrote nothing: {perf_err.strip()[-500:]}")
    if "lost" in perf_err.lower():  # e.g. "Processed N events and lost M chunks!"
        sys.exit(f"cpu_split.py: perf record lost samples; use a longer --period-us: "
                 f"{perf_err.strip()[-500:]}")
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if len(lines) != 1:
        sys.stderr.write(err[-2000:])
        sys.exit(f"cpu_split.py: expected one result line, got {len(lines)} "
                 f"(exit {bench.returncode})")
    script = subprocess.run(["perf", "script", "-i", data, "-F", "pid,comm"],
                            capture_output=True, text=True, check=True).stdout
    groups = dict.fromkeys(GROUPS, 0)
    for line in script.splitlines():
        # "<comm> <pid>"; a comm may contain spaces, the pid is the last field.
        comm, _, pid = line.strip().rpartition(" ")
        pid = int(pid)
        if pid == bench.pid:
            groups["client"] += 1
        elif pid == 0:
            groups["idle"] += 1
        elif comm == "postgres":
            groups["server"] += 1
        else:
            groups["other"] += 1
    return lines[0], groups


def per_op(lo, hi, period_us):
    """µs per op of each group, and the bench's own wall time per op, from two runs."""
    (line_lo, groups_lo), (line_hi, groups_hi) = lo, hi
    ops = line_hi["detail"]["n"] - line_lo["detail"]["n"]
    row = {g: (groups_hi[g] - groups_lo[g]) * period_us / ops for g in GROUPS}
    row["total"] = row["client"] + row["server"]
    row["wall"] = (line_hi["detail"]["elapsed_s"] - line_lo["detail"]["elapsed_s"]) * 1e6 / ops
    row["correct"] = line_lo["correct"] and line_hi["correct"]
    return row


def warn_if_off(row):
    """The run's own validity check: the samples must account for the bench's wall time, and
    nothing else may have taken the CPU during the ops."""
    off = row["total"] / row["wall"] - 1 if row["wall"] else float("inf")
    if abs(off) > 0.03 or row["other"] > 0.02 * row["wall"]:
        sys.stderr.write(
            f"cpu_split.py: warning: {row['workload']} {row['lib']} rep {row['rep'] + 1}: "
            f"client + server is {off:+.1%} off the wall time, other processes took "
            f"{row['other']:.2f} µs/op; this rep's numbers are doubtful\n")


def table(rows, baseline):
    """Medians over reps. The last columns pair each rep with the baseline's run in the same
    rep (as `report.py`'s ratios do), so drift between reps cancels: the median difference in
    µs per op, and the median of the baseline's time per op over the library's (its speed
    relative to the baseline)."""
    by = collections.defaultdict(list)
    base = {}
    for row in rows:
        if any(r["rep"] == row["rep"] for r in by[(row["workload"], row["lib"])]):
            sys.exit(f"cpu_split.py: {row['workload']} {row['lib']} rep {row['rep'] + 1} "
                     "appears twice: tabulate one run's lines at a time")
        by[(row["workload"], row["lib"])].append(row)
        if row["lib"] == baseline:
            base[(row["workload"], row["rep"])] = row
    out = ["| workload | lib | client µs/op | server µs/op | client + server (min-max) "
           f"| wall µs/op | − `{baseline}`: client, server, both | ×`{baseline}` speed "
           "| correct |",
           "|---|---|---:|---:|---:|---:|---:|---:|:---:|"]
    for (workload, lib), reps in sorted(by.items()):
        med = {k: statistics.median(r[k] for r in reps) for k in ("client", "server", "total",
                                                                    "wall")}
        paired = [(r, base[(workload, r["rep"])]) for r in reps
                  if lib != baseline and (workload, r["rep"]) in base]
        vs, speed = "-", "-"
        if paired:
            vs = ", ".join(f"{statistics.median(r[k] - b[k] for r, b in paired):+.2f}"
                           for k in ("client", "server", "total"))
            speed = f"{statistics.median(b['total'] / r['total'] for r, b in paired):.2f}"
        totals = [r["total"] for r in reps]
        out.append(
            f"| {workload} | {lib} | {med['client']:.2f} | {med['server']:.2f} | "
            f"{med['total']:.2f} ({min(totals):.2f}-{max(totals):.2f}) | {med['wall']:.2f} | "
            f"{vs} | {speed} | {sum(r['correct'] for r in reps)}/{len(reps)} |")
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--libs", default="pglock,sqlx_raw")
    parser.add_argument("--workloads", default="W1_same,W2_try_held")
    parser.add_argument("--baseline", default="sqlx_raw")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--cycles-lo", type=int, default=2000)
    parser.add_argument("--cycles-hi", type=int, default=42000)
    parser.add_argument("--period-us", type=int, default=250,
                        help="CPU time between two samples (default 250; shorter ones slow "
                             "the ops down)")
    parser.add_argument("--bin", help="the lockbench binary (default: build it)")
    parser.add_argument("--jsonl", help="also write one line per rep, workload and lib here")
    parser.add_argument("--from", dest="from_file", metavar="JSONL",
                        help="tabulate lines saved earlier with --jsonl; run nothing")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then lockbench flags")
    args = parser.parse_args()
    if args.from_file:
        with open(args.from_file) as f:
            print(table([json.loads(line) for line in f if line.startswith("{")], args.baseline))
        return
    if args.baseline not in args.libs.split(","):
        sys.exit(f"cpu_split.py: --baseline {args.baseline} is not among --libs")
    unknown = set(args.workloads.split(",")) - set(FIXED_CYCLE_WORKLOADS)
    if unknown:
        sys.exit(f"cpu_split.py: {', '.join(sorted(unknown))}: only "
                 f"{', '.join(FIXED_CYCLE_WORKLOADS)} run in fixed-cycle mode")
    if args.period_us <= 0:
        sys.exit("cpu_split.py: --period-us must be > 0")
    if not 0 < args.cycles_lo < args.cycles_hi:
        sys.exit("cpu_split.py: need 0 < --cycles-lo < --cycles-hi")
    if shutil.which("perf") is None or \
            subprocess.run(["perf", "--version"], capture_output=True).returncode != 0:
        sys.exit("cpu_split.py: perf not found (Debian: apt-get install linux-perf)")
    flags = [f for f in args.flags if f != "--"]
    binary = args.bin or bench_binary()
    rows = []
    # Each line is written as soon as it is measured, so a failure late in a long run keeps
    # what came before it.
    out = open(args.jsonl, "w") if args.jsonl else contextlib.nullcontext()
    with out, tempfile.TemporaryDirectory() as tmp, PinnedServer({args.cpu}):
        for rep in range(args.reps):
            for workload in args.workloads.split(","):
                for lib in args.libs.split(","):
                    sys.stderr.write(f"cpu_split.py: rep {rep + 1}/{args.reps} {workload} "
                                     f"{lib}\n")
                    runs = [sampled_run(binary, [*flags, "--lib", lib, "--workloads", workload,
                                                 "--cycles", str(n)],
                                        args.cpu, args.period_us * 1000, tmp)
                            for n in (args.cycles_lo, args.cycles_hi)]
                    row = per_op(*runs, args.period_us)
                    row.update(rep=rep, workload=workload, lib=runs[0][0]["lib"], flags=flags)
                    warn_if_off(row)
                    rows.append(row)
                    if args.jsonl:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
    print(table(rows, args.baseline))

if __name__ == "__main__":
    main()
