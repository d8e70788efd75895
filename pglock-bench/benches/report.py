#!/usr/bin/env python3
"""Runs the lockbench binary several times, tabulates the results and draws them.

    python3 pglock-bench/benches/report.py [--reps 3] [--baseline sqlx_raw] [--out report.md] \
        [--jsonl results.jsonl] [--charts DIR] [--chart-prefix P] [--pin CPU] \
        -- [lockbench flags...]
    python3 pglock-bench/benches/report.py --from a.jsonl [b.jsonl ...] [--charts DIR] ...

Each rep is one run of the binary, in which every library runs every workload, libraries
alternating workload by workload. `--from` reads result lines saved earlier (by `--jsonl`)
instead of running anything.

The table shows, per workload (and its parameter: K for W4, the task count N for W5) and
library, the median of `ops_per_s` over the reps with its min-max, the median p50/p90/p99, how
many reps were correct, the largest connection count, the ratio to the baseline library (the
median over reps of the ratio taken within each rep, so a machine that drifts between reps does
not skew it), and the client's and the server's CPU time per op (median; W1, W2, W4 and W5),
which show a library's own cost even where the ops/s are set by how fast the server's answers
arrive. The server's column shows `-` where the bench could not see the server's processes
(another machine, another pid namespace).

`--pin CPUS` (`0`, or `0,2`) runs the bench on those CPUs together with every process named
`postgres` on the machine (found with `pgrep`; other clusters too), and gives those processes
their CPUs back afterwards: on a machine where a round trip is mostly a CPU waking up, the
ops/s then count CPU work, the client's included. It needs a server running before it starts
(a throwaway one the bench starts itself inherits the bench's CPUs anyway) and the right to
change the server's affinity (root, or the server's own user).

Charts (hand-written SVG) go to `--charts DIR`, else next to the `--jsonl` file (or the first
`--from` file), named `<prefix><chart>.svg`; the prefix defaults to that file's name up to its
last `-`, so `2026-12-02-main.jsonl` gives `2026-12-02-throughput.svg` and so on. A chart is
written only when its workload is in the lines:

* `throughput.svg`: ops/s per workload and library, median with min-max error bars, and the
  ratio to the baseline above each bar;
* `w4-keys.svg`: W4 throughput against K (log axis);
* `w5-tasks.svg`: W5 throughput against the task count N (log axis), per library, with the
  ratio to the baseline at each point;
* `latency.svg`: p50, p90 and p99 per workload and library, one panel (own scale) per
  workload.

`--charts-only LIST` limits which are written (throughput,w4-keys,w5-tasks,latency).

Standard library only. The binary is built with `cargo bench -p pglock-bench --bench lockbench --no-run` unless --bin
is given.
"""

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from collections import defaultdict
from xml.sax.saxutils import escape


def bench_binary():
    out = subprocess.run(
        ["cargo", "bench", "-p", "pglock-bench", "--bench", "lockbench", "--no-run",
         "--message-format=json"],
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


def run_rep(binary, flags, rep, pin=None):
    pinned = None if pin is None else (lambda: os.sched_setaffinity(0, pin))
    proc = subprocess.run([binary, *flags], capture_output=True, text=True, preexec_fn=pinned)
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


def parse_cpus(text):
    """`--pin`'s CPU list: "0" or "0,2"."""
    try:
        cpus = {int(c) for c in text.split(",")}
    except ValueError:
        sys.exit(f"report.py: --pin takes CPU numbers separated by commas, not {text!r}")
    return cpus


def server_threads():
    """The thread ids of every process named `postgres` on the machine."""
    pids = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout
    tids = []
    for pid in pids.split():
        try:
            tids.extend(int(t) for t in os.listdir(f"/proc/{pid}/task"))
        except FileNotFoundError:
            pass  # gone since pgrep listed it
    return tids


class PinnedServer:
    """Pins the local server's processes to `cpus` for the `with` block, then gives each the
    affinity it had. Processes the server starts meanwhile inherit the pinned mask from the
    postmaster; those still running at the end get the widest mask the server had. Restores on
    an exception, Ctrl-C, SIGTERM and SIGHUP too (not on SIGKILL)."""

    def __init__(self, cpus):
        self.cpus, self.before, self.handlers = cpus, {}, {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGHUP):
            self.handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            tids = server_threads()
            if not tids:
                raise SystemExit("report.py: --pin found no process named postgres "
                                 "(a local server is needed)")
            for tid in tids:
                try:
                    self.before[tid] = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, self.cpus)
                except ProcessLookupError:
                    self.before.pop(tid, None)
                except OSError as err:
                    raise SystemExit(f"report.py: --pin could not pin server process {tid}: "
                                     f"{err}") from err
        except BaseException:
            self.__exit__()
            raise
        return self

    @staticmethod
    def _on_signal(signum, _frame):
        raise SystemExit(128 + signum)

    def __exit__(self, *exc):
        widest = set().union(*self.before.values())
        for tid in server_threads():
            try:
                if tid in self.before:
                    os.sched_setaffinity(tid, self.before[tid])
                elif widest and os.sched_getaffinity(tid) == self.cpus:
                    os.sched_setaffinity(tid, widest)
            except ProcessLookupError:
                pass
            except OSError as err:
                sys.stderr.write(f"report.py: could not give server process {tid} its CPUs "
                                 f"back: {err}\n")
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
        self.handlers = {}
        return False


def read_lines(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    row = json.loads(line)
                    row.setdefault("rep", 0)  # a bare lockbench line is one rep
                    rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Grouping and the table
# ---------------------------------------------------------------------------------------------

def param(row):
    """The parameter a workload runs at: W4's K, W5's task count N (None for the others)."""
    if row["workload"] == "W5_concurrent":
        return row.get("tasks")
    if row["workload"] == "W4_many_keys":
        return (row.get("detail") or {}).get("K")
    return None


def case_label(workload, p):
    if p is None:
        return workload
    return f"{workload} ({'N' if workload == 'W5_concurrent' else 'K'}={p:,})"


def p90(row):
    return ((row.get("detail") or {}).get("tail") or {}).get("p90_ms")


def cpu_us(row, side="client"):
    """CPU µs per op, the client's or the server's (on the lib's sessions; null for a server
    on another machine)."""
    return (row.get("detail") or {}).get(f"{side}_cpu_us")


def summarize(rows, baseline):
    """{(workload, param, lib): summary} with medians, min-max and the ratio to the baseline."""
    by = defaultdict(list)
    for row in rows:
        by[(row["workload"], param(row), row["lib"])].append(row)
    base = {(r["workload"], param(r), r["rep"]): r["ops_per_s"]
            for r in rows if r["lib"] == baseline}
    out = {}
    for (workload, p, lib), group in by.items():
        ops = [r["ops_per_s"] for r in group]
        ratios = [r["ops_per_s"] / base[(workload, p, r["rep"])] for r in group
                  if base.get((workload, p, r["rep"]))]

        def med(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        out[(workload, p, lib)] = {
            "ops": statistics.median(ops), "min": min(ops), "max": max(ops),
            "p50": med(r["p50_ms"] for r in group), "p90": med(p90(r) for r in group),
            "p99": med(r["p99_ms"] for r in group), "cpu": med(cpu_us(r) for r in group),
            "server_cpu": med(cpu_us(r, "server") for r in group),
            "correct": sum(1 for r in group if r["correct"]), "reps": len(group),
            "conns": max(r["connections"] for r in group),
            "ratio": statistics.median(ratios) if ratios else None,
        }
    return out


def case_order(key):
    workload, p, _ = key
    return (workload, p if p is not None else -1)


def fmt(x, digits=0):
    if x is None:
        return "-"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def table(summary, baseline):
    out = [
        f"| workload | lib | ops/s (median) | min-max | p50 ms | p90 ms | p99 ms | correct | conns "
        f"| x{baseline} | client CPU µs/op | server CPU µs/op |",
        "|---|---|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|",
    ]
    for key, s in sorted(summary.items(), key=lambda kv: (case_order(kv[0]), -kv[1]["ops"])):
        workload, p, lib = key
        out.append("| {} | {} | {} | {}-{} | {} | {} | {} | {}/{} | {} | {} | {} | {} |".format(
            case_label(workload, p), lib, fmt(s["ops"]), fmt(s["min"]), fmt(s["max"]),
            fmt(s["p50"], 3), fmt(s["p90"], 3), fmt(s["p99"], 3), s["correct"], s["reps"],
            s["conns"], fmt(s["ratio"], 2), fmt(s["cpu"], 2), fmt(s["server_cpu"], 2),
        ))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# SVG charts
# ---------------------------------------------------------------------------------------------

# One colour per library, the same in every chart; the floors in greys and browns, pglock in
# blues, the negative control in red.
COLOURS = {
    "sqlx_raw": "#7f7f7f",
    "sqlx_advisory": "#b8860b",
    "pglock": "#1f77b4",
    "pglock_defaultpool": "#17becf",
    "noop": "#d62728",
}
EXTRA_COLOURS = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#bcbd22"]
LIB_ORDER = ["sqlx_raw", "sqlx_advisory", "pglock", "pglock_defaultpool", "noop"]
# Names short enough for the latency panels' groups.
SHORT = {"sqlx_raw": "sqlx_raw", "sqlx_advisory": "advisory", "pglock": "pglock",
         "pglock_defaultpool": "defaultpool", "noop": "noop"}
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


def lib_colours(libs):
    colours, extra = {}, iter(EXTRA_COLOURS * 4)
    for lib in libs:
        colours[lib] = COLOURS.get(lib) or next(extra)
    return colours


def sort_libs(libs):
    return sorted(libs, key=lambda lib: (LIB_ORDER.index(lib) if lib in LIB_ORDER else 99, lib))


def shade(hex_colour, f):
    """`hex_colour` mixed with white (f > 0) or black (f < 0) by |f|."""
    rgb = [int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)]
    target = 255 if f > 0 else 0
    rgb = [round(c + (target - c) * abs(f)) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def nice_ticks(hi, n=5):
    """Round ticks from 0 to at least `hi`: steps of 1, 2 or 5 x 10^k."""
    if hi <= 0:
        return [0, 1]
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    ticks = [0.0]
    while ticks[-1] < hi:
        ticks.append(ticks[-1] + step)
    return ticks


def tick_label(v):
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:g}"
    return f"{v:.3g}"


class Svg:
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.parts = [
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' {FONT} font-size='12'>",
            f"<rect width='{width}' height='{height}' fill='white'/>",
        ]

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' "
                          f"stroke='{stroke}' stroke-width='{width}'{d}/>")

    def rect(self, x, y, w, h, fill, title=None, stroke="none"):
        t = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' "
                          f"height='{max(h, 0):.1f}' fill='{fill}' stroke='{stroke}'>{t}</rect>")

    def circle(self, x, y, r, fill, title=None):
        t = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r}' fill='{fill}'>{t}</circle>")

    def polyline(self, points, stroke, width=2):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(f"<polyline points='{pts}' fill='none' stroke='{stroke}' "
                          f"stroke-width='{width}'/>")

    def text(self, x, y, s, size=12, anchor="start", weight="normal", fill="#000", rotate=None):
        r = f" transform='rotate({rotate} {x:.1f} {y:.1f})'" if rotate is not None else ""
        self.parts.append(f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' "
                          f"text-anchor='{anchor}' font-weight='{weight}' fill='{fill}'{r}>"
                          f"{escape(str(s))}</text>")

    def legend(self, x, y, items, title=None):
        """Colour swatches in one row from (x, y); `items` is [(label, colour)]."""
        if title:
            self.text(x, y + 10, title, weight="bold")
            x += 7.5 * len(title) + 12
        for label, colour in items:
            self.rect(x, y, 12, 12, colour)
            self.text(x + 16, y + 10, label)
            x += 16 + 7 * len(label) + 18

    def save(self, path):
        self.parts.append("</svg>")
        with open(path, "w") as f:
            f.write("\n".join(self.parts) + "\n")


def y_axis(svg, left, top, height, ticks, label, scale, right=None):
    """Horizontal grid lines with tick labels, and the rotated axis label."""
    for t in ticks:
        y = scale(t)
        svg.line(left, y, right if right else svg.width - 20, y, "#e0e0e0")
        svg.text(left - 6, y + 4, tick_label(t), size=11, anchor="end")
    svg.line(left, top, left, top + height, "#000")
    svg.text(left - 58, top + height / 2, label, anchor="middle", rotate=-90)


def ratio_text(r):
    return f"×{r:.2f}"


def chart_throughput(summary, baseline, path, title):
    cases = sorted({(w, p) for (w, p, _) in summary}, key=lambda c: (c[0], c[1] or -1))
    libs = sort_libs({lib for (_, _, lib) in summary})
    colours = lib_colours(libs)
    group_w = max(60, 26 * len(libs) + 24)
    left, top, bottom = 90, 70, 110
    width = left + group_w * len(cases) + 30
    height = 460
    plot_h = height - top - bottom
    hi = max(s["max"] for s in summary.values())
    ticks = nice_ticks(hi * 1.2)
    scale = lambda v: top + plot_h - plot_h * v / ticks[-1]  # noqa: E731
    svg = Svg(width, height)
    svg.text(left, 22, title, size=15, weight="bold")
    svg.legend(left, 34, [(lib, colours[lib]) for lib in libs])
    svg.text(left, 62, f"bar: median over reps; whisker: min-max; above: median ratio to "
             f"{baseline} within each rep", size=11, fill="#555")
    y_axis(svg, left, top, plot_h, ticks, "ops/s (all tasks together)", scale)
    bar_w = (group_w - 24) / max(len(libs), 1)
    for i, (workload, p) in enumerate(cases):
        gx = left + i * group_w + 12
        for j, lib in enumerate(libs):
            s = summary.get((workload, p, lib))
            if not s:
                continue
            x = gx + j * bar_w
            y = scale(s["ops"])
            svg.rect(x + 1, y, bar_w - 2, scale(0) - y, colours[lib],
                     title=f"{lib} {case_label(workload, p)}: {s['ops']:,.0f} ops/s "
                           f"({s['min']:,.0f}-{s['max']:,.0f})")
            cx = x + bar_w / 2
            svg.line(cx, scale(s["min"]), cx, scale(s["max"]), "#000")
            svg.line(cx - 3, scale(s["min"]), cx + 3, scale(s["min"]), "#000")
            svg.line(cx - 3, scale(s["max"]), cx + 3, scale(s["max"]), "#000")
            if s["ratio"] is not None and lib != baseline:
                svg.text(cx + 3, scale(s["max"]) - 4, ratio_text(s["ratio"]), size=10,
                         anchor="start", rotate=-90)
        label_x = gx + (group_w - 24) / 2
        svg.text(label_x, scale(0) + 16, workload, size=11, anchor="middle")
        if p is not None:
            svg.text(label_x, scale(0) + 30, case_label(workload, p)[len(workload) + 1:],
                     size=11, anchor="middle")
        if i:
            svg.line(gx - 12, top, gx - 12, scale(0), "#f0f0f0")
    svg.line(left, scale(0), width - 20, scale(0), "#000")
    svg.text((left + width) / 2, height - 40, "workload", anchor="middle")
    svg.text(left, height - 14, "numbers above bars: ops/s as a multiple of "
             f"{baseline}'s (same workload, same rep); the libraries' own connections and "
             "pools are in docs/benchmarks.md", size=10, fill="#555")
    svg.save(path)


def chart_lines(summary, workload, baseline, path, title, x_label, y_label, note):
    """Throughput against a parameter (K or N) on a log x axis, one line per library."""
    points = {k: s for k, s in summary.items() if k[0] == workload and k[1] is not None}
    xs = sorted({p for (_, p, _) in points})
    libs = sort_libs({lib for (_, _, lib) in points})
    colours = lib_colours(libs)
    left, top, right, bottom = 90, 75, 170, 70
    width, height = 760, 460
    plot_w, plot_h = width - left - right, height - top - bottom
    hi = max(s["max"] for s in points.values())
    ticks = nice_ticks(hi * 1.1)
    scale_y = lambda v: top + plot_h - plot_h * v / ticks[-1]  # noqa: E731
    lo_x, hi_x = math.log10(min(xs)), math.log10(max(xs))
    span = (hi_x - lo_x) or 1.0
    pad = 0.08 * plot_w

    def scale_x(v):
        if len(xs) == 1:
            return left + plot_w / 2
        return left + pad + (plot_w - 2 * pad) * (math.log10(v) - lo_x) / span

    svg = Svg(width, height)
    svg.text(left, 22, title, size=15, weight="bold")
    svg.legend(left, 34, [(lib, colours[lib]) for lib in libs])
    svg.text(left, 64, note, size=11, fill="#555")
    if len(xs) > 1:
        svg.text(left + plot_w + 10, top - 8, f"× {baseline} at " + "/".join(f"{x:,}" for x in xs),
                 size=9, fill="#555")
    y_axis(svg, left, top, plot_h, ticks, y_label, scale_y, right=left + plot_w)
    svg.line(left, scale_y(0), left + plot_w, scale_y(0), "#000")
    for x in xs:
        svg.line(scale_x(x), scale_y(0), scale_x(x), scale_y(0) + 5, "#000")
        svg.text(scale_x(x), scale_y(0) + 18, f"{x:,}", size=11, anchor="middle")
    svg.text(left + plot_w / 2, height - 28, x_label, anchor="middle")
    # Ratio labels at the right end, sorted by height so that they do not overlap.
    ends = []
    for j, lib in enumerate(libs):
        # Each library's points a few pixels apart, so that the whiskers do not hide each other.
        dx = (j - (len(libs) - 1) / 2) * 5
        pts = [(x, points[(workload, x, lib)]) for x in xs if (workload, x, lib) in points]
        svg.polyline([(scale_x(x) + dx, scale_y(s["ops"])) for x, s in pts], colours[lib])
        for x, s in pts:
            cx = scale_x(x) + dx
            svg.line(cx, scale_y(s["min"]), cx, scale_y(s["max"]), colours[lib])
            svg.line(cx - 3, scale_y(s["min"]), cx + 3, scale_y(s["min"]), colours[lib])
            svg.line(cx - 3, scale_y(s["max"]), cx + 3, scale_y(s["max"]), colours[lib])
            svg.circle(cx, scale_y(s["ops"]), 4, colours[lib],
                       title=f"{lib} at {x:,}: {s['ops']:,.0f} ops/s "
                             f"({s['min']:,.0f}-{s['max']:,.0f})"
                             + (f", {ratio_text(s['ratio'])} {baseline}" if s["ratio"] else ""))
        last = pts[-1][1]
        ends.append((scale_y(last["ops"]), lib, [s["ratio"] for _, s in pts]))
    ends.sort()
    y_prev = -1e9
    for y, lib, ratios in ends:
        y = max(y, y_prev + 30)
        y_prev = y
        svg.text(left + plot_w + 10, y, lib, size=11, fill=colours[lib], weight="bold")
        if lib != baseline and all(r is not None for r in ratios):
            svg.text(left + plot_w + 10, y + 13,
                     " / ".join(ratio_text(r) for r in ratios), size=10, fill="#333")
    svg.save(path)


def chart_latency(summary, baseline, path, title):
    """One panel per workload (and parameter), each on its own linear scale: per library,
    three bars, p50, p90 and p99, from light to dark in the library's colour."""
    cases = sorted({(w, p) for (w, p, _) in summary}, key=lambda c: (c[0], c[1] or -1))
    libs = sort_libs({lib for (_, _, lib) in summary})
    colours = lib_colours(libs)
    cols = 3
    panel_w, panel_h = 330, 230
    rows = math.ceil(len(cases) / cols)
    top0 = 88
    width, height = cols * panel_w + 20, top0 + rows * panel_h + 30
    svg = Svg(width, height)
    svg.text(20, 22, title, size=15, weight="bold")
    svg.legend(20, 34, [(lib, colours[lib]) for lib in libs])
    x = 20 + sum(16 + 7 * len(lib) + 18 for lib in libs) + 20
    for k, (name, f) in enumerate((("p50", 0.55), ("p90", 0.25), ("p99", -0.15))):
        svg.rect(x + k * 52, 34, 12, 12, shade("#606060", f))
        svg.text(x + k * 52 + 16, 44, name)
    svg.text(20, 62, "ms per op (medians over reps), each panel on its own scale; above each "
             f"group: p99, as a multiple of {baseline}'s p99 (above {baseline}: its p99 in ms).",
             size=10, fill="#555")
    svg.text(20, 74, "W3: the handoff from one holder to the next (no p90); W4: one round of "
             "K acquisitions and K releases; W5: one task's acquire + release.", size=10,
             fill="#555")
    for i, (workload, p) in enumerate(cases):
        px = 10 + (i % cols) * panel_w
        py = top0 + (i // cols) * panel_h
        left, top = px + 62, py + 24
        plot_w, plot_h = panel_w - 80, panel_h - 62
        group = [(lib, summary[(workload, p, lib)]) for lib in libs
                 if (workload, p, lib) in summary]
        hi = max((s["p99"] or 0) for _, s in group) or 1.0
        ticks = nice_ticks(hi * 1.15, n=4)
        scale = lambda v: top + plot_h - plot_h * v / ticks[-1]  # noqa: E731
        svg.text(px + panel_w / 2, py + 12, case_label(workload, p), size=12,
                 anchor="middle", weight="bold")
        for t in ticks:
            svg.line(left, scale(t), left + plot_w, scale(t), "#e8e8e8")
            svg.text(left - 5, scale(t) + 4, tick_label(t), size=10, anchor="end")
        svg.line(left, top, left, top + plot_h, "#000")
        svg.line(left, scale(0), left + plot_w, scale(0), "#000")
        svg.text(px + 14, top + plot_h / 2, "ms", anchor="middle", rotate=-90, size=11)
        base_p99 = (summary.get((workload, p, baseline)) or {}).get("p99")
        slot = plot_w / max(len(group), 1)
        for j, (lib, s) in enumerate(group):
            x0 = left + j * slot + 4
            bw = (slot - 8) / 3
            for k, (name, f) in enumerate((("p50", 0.55), ("p90", 0.25), ("p99", -0.15))):
                v = s[name]
                if v is None:
                    continue
                svg.rect(x0 + k * bw, scale(v), bw - 1, scale(0) - scale(v),
                         shade(colours[lib], f), title=f"{lib} {name} {v:.3f} ms")
            if s["p99"] is not None:
                label = (ratio_text(s["p99"] / base_p99) if base_p99 and lib != baseline
                         else (f"{s['p99']:,.0f}" if s["p99"] >= 100 else f"{s['p99']:.3g}"))
                svg.text(x0 + (slot - 8) / 2, scale(s["p99"]) - 4, label, size=9,
                         anchor="middle", fill="#333" if lib != baseline else "#000",
                         weight="normal" if lib != baseline else "bold")
            svg.text(x0 + (slot - 8) / 2, scale(0) + 13, SHORT.get(lib, lib[:12]),
                     size=9, anchor="middle", fill=shade(colours[lib], -0.3))
    svg.save(path)


CHARTS = ["throughput", "w4-keys", "w5-tasks", "latency"]


def write_charts(summary, baseline, directory, prefix, only):
    os.makedirs(directory, exist_ok=True)
    written = []

    def path(name):
        p = os.path.join(directory, f"{prefix}{name}.svg")
        written.append(p)
        return p

    workloads = {w for (w, _, _) in summary}
    if "throughput" in only and summary:
        chart_throughput(summary, baseline, path("throughput"),
                         "Throughput per workload and library")
    if "w4-keys" in only and "W4_many_keys" in workloads:
        chart_lines(summary, "W4_many_keys", baseline, path("w4-keys"),
                    "W4_many_keys: throughput against K", "K (keys held at once by one holder; "
                    "log scale)", "keys/s (acquire + release)",
                    "point: median over reps; whisker: min-max; right: ratio to "
                    f"{baseline} at each K")
    if "w5-tasks" in only and "W5_concurrent" in workloads:
        chart_lines(summary, "W5_concurrent", baseline, path("w5-tasks"),
                    "W5_concurrent: throughput against the number of tasks",
                    "N (tasks in one process, each with a key of its own; log scale)",
                    "ops/s (all tasks together)",
                    "point: median over reps; whisker: min-max; right: ratio to "
                    f"{baseline} at each N")
    if "latency" in only and summary:
        chart_latency(summary, baseline, path("latency"), "Latency percentiles per op")
    return written


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--baseline", default="sqlx_raw")
    parser.add_argument("--bin", help="the lockbench binary (default: build it)")
    parser.add_argument("--from", dest="from_files", nargs="+", metavar="JSONL",
                        help="read these result lines instead of running the bench")
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--jsonl", help="also write every result line here")
    parser.add_argument("--charts", metavar="DIR",
                        help="write the SVG charts here (default: beside --jsonl or the first "
                             "--from file; none when there is neither)")
    parser.add_argument("--chart-prefix", help="chart file name prefix (default: the JSONL "
                        "file's name up to its last '-')")
    parser.add_argument("--charts-only", default=",".join(CHARTS),
                        help=f"comma list of {','.join(CHARTS)}")
    parser.add_argument("--pin", metavar="CPU",
                        help="run the bench and the local server's processes on this CPU")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then lockbench flags")
    args = parser.parse_args()
    flags = [f for f in args.flags if f != "--"]
    if args.from_files:
        rows = read_lines(args.from_files)
    else:
        binary = args.bin or bench_binary()
        rows = []
        pin = parse_cpus(args.pin) if args.pin is not None else None
        with PinnedServer(pin) if pin is not None else contextlib.nullcontext():
            for rep in range(args.reps):
                sys.stderr.write(f"report.py: rep {rep + 1}/{args.reps}\n")
                rows.extend(run_rep(binary, flags, rep, pin))
    summary = summarize(rows, args.baseline)
    text = table(summary, args.baseline)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.jsonl:
        with open(args.jsonl, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    source = args.jsonl or (args.from_files[0] if args.from_files else None)
    directory = args.charts or (os.path.dirname(source) or "." if source else None)
    if directory:
        if args.chart_prefix is not None:
            prefix = args.chart_prefix
        elif source:
            stem = os.path.basename(source).rsplit(".", 1)[0]
            prefix = stem.rsplit("-", 1)[0] + "-" if "-" in stem else ""
        else:
            prefix = ""
        only = {c.strip() for c in args.charts_only.split(",") if c.strip()}
        for p in write_charts(summary, args.baseline, directory, prefix, only):
            sys.stderr.write(f"report.py: wrote {p}\n")
    if not all(r["correct"] for r in rows if r["lib"] != "noop"):
        sys.exit(1)


if __name__ == "__main__":
    main()
