#!/usr/bin/env python3
"""Draws the benchmarks' front-page chart, `docs/benchmarks/summary.svg`.

    python3 pglock-bench/benches/summary_chart.py [--data docs/benchmarks/results/summary.json] \
        [--out docs/benchmarks/summary.svg]

It runs nothing: the figures are the notebook's (`docs/benchmarks/notebook.md`), copied into
`docs/benchmarks/results/summary.json` with the section each comes from. Update that file when a
newer run replaces a figure, then draw again; the same data gives the same file byte for byte.

The data file holds a list of series (libraries, with a colour each) and a list of panels. The
first panel spans the chart's width, the others share a row below it. A panel has rows, and a
row has one cell per library it measured, as a multiple of `sqlx_raw`:

* `{"ratio": [r, ...]}`: the ratios as the notebook gives them, one per run;
* `{"value": [v, ...], "floor": f}`: a figure per run and the floor's in the same run (v / f);
* `{"diff": d, "floor": f}`: the median of paired differences to the floor (1 + d / f).

Each cell is drawn as a dot at the median with a whisker from the lowest to the highest run.
Plain SVG on a white background (legible on GitHub's light and dark themes), standard
library only.
"""

import argparse
import json
import math
import statistics
from pathlib import Path
from xml.sax.saxutils import escape

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "benchmarks" / "results" / "summary.json"
OUT = ROOT / "docs" / "benchmarks" / "summary.svg"

WIDTH = 980
LEFT = 150  # row labels
RIGHT = 110  # row notes (connections)
ROW_H = 34
GAP = 30  # between panels
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"


def ratios(cell):
    if "ratio" in cell:
        return [float(r) for r in cell["ratio"]]
    if "value" in cell:
        return [float(v) / float(cell["floor"]) for v in cell["value"]]
    if "diff" in cell:
        return [1.0 + float(cell["diff"]) / float(cell["floor"])]
    raise ValueError(f"a cell needs ratio, value or diff: {cell}")


def fmt(v):
    return f"{v:.2f}" if v < 10 else f"{v:.1f}"


def text(x, y, s, size=12, anchor="start", fill="#000", weight="normal"):
    return (f"<text x='{x:.1f}' y='{y:.1f}' font-size='{size}' text-anchor='{anchor}' "
            f"font-weight='{weight}' fill='{fill}'>{escape(s)}</text>")


def line(x1, y1, x2, y2, stroke="#000", width=1.0, dash=None):
    d = f" stroke-dasharray='{dash}'" if dash else ""
    return (f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' "
            f"stroke='{stroke}' stroke-width='{width}'{d}/>")


def panel(p, series, x0, y0, w, notes):
    """Draws one panel with its plot area from x0 to x0 + w; returns (svg parts, height)."""
    out = []
    lo, hi = p["range"]
    log = p.get("scale") == "log"

    def sx(v):
        v = min(max(v, lo), hi)
        if log:
            f = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        else:
            f = (v - lo) / (hi - lo)
        return x0 + f * w

    out.append(text(x0 - LEFT + 10, y0 + 14, p["title"], size=13, weight="bold"))
    top = y0 + 36
    rows = p["rows"]
    bottom = top + ROW_H * len(rows)
    for i, row in enumerate(rows):
        if i % 2 == 0:
            out.append(f"<rect x='{x0 - LEFT + 6:.1f}' y='{top + i * ROW_H:.1f}' "
                       f"width='{LEFT - 6 + w + (RIGHT if notes else 8):.1f}' height='{ROW_H}' fill='#f3f3f3'/>")
    for t in p["ticks"]:
        out.append(line(sx(t), top, sx(t), bottom, stroke="#d9d9d9"))
        out.append(text(sx(t), bottom + 14, f"{t:g}", size=11, anchor="middle", fill="#333"))
    ref = p.get("reference")
    if ref is not None:
        out.append(line(sx(ref), top - 4, sx(ref), bottom, stroke="#444", width=1.5))
        out.append(text(sx(ref), top - 7, "sqlx_raw = 1", size=10, anchor="middle", fill="#444"))
    target = p.get("target")
    if target:
        out.append(line(sx(target["at"]), top - 4, sx(target["at"]), bottom, stroke="#c0392b",
                        width=1.5, dash="5,3"))
        out.append(text(sx(target["at"]) + 3, top - 7, target["label"], size=10, fill="#c0392b"))
    keys = [s["key"] for s in series]
    for i, row in enumerate(rows):
        yc = top + i * ROW_H + ROW_H / 2
        out.append(text(x0 - LEFT + 12, yc - 2, row["label"], size=12, weight="bold"))
        out.append(text(x0 - LEFT + 12, yc + 11, row.get("date", ""), size=9, fill="#555"))
        present = [k for k in keys if k in row["cells"]]
        # The first series' figure goes right of everything drawn in the row.
        right = max(sx(v) for k in present for v in ratios(row["cells"][k]))
        for j, key in enumerate(present):
            colour = next(s["colour"] for s in series if s["key"] == key)
            values = ratios(row["cells"][key])
            y = yc + (j - (len(present) - 1) / 2) * 6
            mid = statistics.median(values)
            if len(values) > 1:
                out.append(line(sx(min(values)), y, sx(max(values)), y, stroke=colour, width=2))
            out.append(f"<circle cx='{sx(mid):.1f}' cy='{y:.1f}' r='3.5' fill='{colour}' "
                       f"stroke='white' stroke-width='0.8'/>")
            if key == keys[0]:
                label = fmt(mid) if len(values) == 1 else f"{fmt(min(values))}-{fmt(max(values))}"
                out.append(text(right + 7, yc + 4, label, size=10, fill=colour, weight="bold"))
        if notes and row.get("note"):
            out.append(text(x0 + w + 10, yc + 4, row["note"], size=10, fill="#333"))
    out.append(line(x0, bottom, x0 + w, bottom, stroke="#888"))
    height = bottom - y0 + 20
    if p.get("footnote"):
        out.append(text(x0 - LEFT + 10, bottom + 32, p["footnote"], size=10, fill="#555"))
        height += 16
    return out, height


def draw(data):
    series = data["series"]
    body = [text(16, 24, data["title"], size=16, weight="bold"),
            text(16, 42, data["subtitle"], size=11, fill="#444")]
    x = 16
    for s in series:
        body.append(f"<circle cx='{x + 5}' cy='60' r='4.5' fill='{s['colour']}'/>")
        body.append(text(x + 14, 64, s["label"], size=11))
        x += 30 + 6.4 * len(s["label"])
    y = 78
    first, rest = data["panels"][0], data["panels"][1:]
    parts, h = panel(first, series, LEFT, y, WIDTH - LEFT - RIGHT, notes=True)
    body += parts
    y += h + GAP
    if rest:
        slot = WIDTH / len(rest)
        heights = []
        for k, p in enumerate(rest):
            parts, h = panel(p, series, k * slot + LEFT, y, slot - LEFT - 24, notes=False)
            body += parts
            heights.append(h)
        y += max(heights)
    body.append(text(16, y + 14, "Figures and their sources: docs/benchmarks.md (summary table) "
                     "and docs/benchmarks/notebook.md; data: docs/benchmarks/results/summary.json",
                     size=10, fill="#555"))
    height = int(y + 26)
    return "\n".join(
        [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' "
         f"viewBox='0 0 {WIDTH} {height}' {FONT} font-size='12'>",
         f"<rect width='{WIDTH}' height='{height}' fill='white'/>"]
        + body + ["</svg>", ""])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA), help="the figures (JSON)")
    parser.add_argument("--out", default=str(OUT), help="the SVG to write")
    args = parser.parse_args()
    with open(args.data, encoding="utf-8") as f:
        data = json.load(f)
    svg = draw(data)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"summary_chart.py: wrote {args.out}")


if __name__ == "__main__":
    main()
