#!/usr/bin/env python3
"""Draw the guide's two timeline pictures as plain SVG (standard library only).

* `scheduled-job-window.svg` (docs/guide/scheduled-jobs.md): one window of a scheduled job,
  three replicas ticking around its start, the skew tolerance, the min hold and the max hold,
  with the outcome each replica gets (`src/schedule/store.rs`, `JobState::skip`).
* `frozen-holder.svg` (docs/guide/lost-locks.md): a holder frozen while it holds a key, the
  server ending its silent session after `silence_timeout`, the next holder's newer fencing
  token, and what the frozen holder is told when it runs again.

Usage: python3 docs/pictures/timelines.py   (rewrites both files next to this script)

The output is deterministic: the same script writes the same bytes.
"""

from pathlib import Path
from xml.sax.saxutils import escape

HERE = Path(__file__).resolve().parent
FONT = "DejaVu Sans, Arial, Helvetica, sans-serif"

INK = "#1f2328"  # text and axes
MUTED = "#57606a"  # secondary text
GRID = "#d0d7de"  # guides and separators
BLUE = "#0969da"  # a body running / a lock held
BLUE_LIGHT = "#ddf4ff"
GREEN = "#1a7f37"  # the min hold, accepted writes
GREEN_LIGHT = "#dafbe1"
ORANGE = "#bc4c00"  # the max hold
ORANGE_LIGHT = "#fff1e5"
AMBER = "#9a6700"  # the skew tolerance
AMBER_LIGHT = "#fff8c5"
RED = "#cf222e"  # cut off, ended, refused
GRAY_LIGHT = "#eaeef2"


def num(value: float) -> str:
    """A coordinate with at most one decimal, the same on every run."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


class Svg:
    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.parts: list[str] = []

    def add(self, element: str, **attrs) -> None:
        self.parts.append(f"<{element}{self._attrs(attrs)}/>")

    @staticmethod
    def _attrs(attrs: dict) -> str:
        out = []
        for key, value in attrs.items():
            if value is None:
                continue
            name = key.rstrip("_").replace("_", "-")
            if isinstance(value, float):
                value = num(value)
            out.append(f' {name}="{escape(str(value), {chr(34): "&quot;"})}"')
        return "".join(out)

    def rect(self, x, y, w, h, fill, stroke=None, dash=None, rx=2, width=1.0):
        self.add("rect", x=float(x), y=float(y), width=float(w), height=float(h), rx=rx,
                 fill=fill, stroke=stroke, stroke_width=width if stroke else None,
                 stroke_dasharray=dash)

    def line(self, x1, y1, x2, y2, stroke=INK, width=1.0, dash=None):
        self.add("line", x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2), stroke=stroke,
                 stroke_width=width, stroke_dasharray=dash)

    def text(self, x, y, content, size=12, anchor="start", weight=None, fill=INK, italic=False):
        attrs = self._attrs({
            "x": float(x), "y": float(y), "font_size": size, "text_anchor": anchor,
            "font_weight": weight, "font_style": "italic" if italic else None, "fill": fill,
        })
        self.parts.append(f"<text{attrs}>{escape(content)}</text>")

    def circle(self, x, y, r, fill, stroke=None, width=1.5):
        self.add("circle", cx=float(x), cy=float(y), r=r, fill=fill, stroke=stroke,
                 stroke_width=width if stroke else None)

    def path(self, d, fill="none", stroke=INK, width=1.0):
        self.add("path", d=d, fill=fill, stroke=stroke, stroke_width=width)

    def badge(self, x, y, label):
        """A numbered marker, explained in the notes under the chart."""
        self.circle(x, y, 8, INK)
        self.text(x, y + 4, label, size=11, anchor="middle", weight="bold", fill="white")

    def tick_mark(self, x, y, color=INK):
        """A timer firing: a small downward triangle above `y`."""
        self.path(f"M{num(x - 5)},{num(y - 9)} L{num(x + 5)},{num(y - 9)} L{num(x)},{num(y)} Z",
                  fill=color, stroke=color)

    def cross(self, x, y, color=RED, size=5):
        self.line(x - size, y - size, x + size, y + size, stroke=color, width=2.2)
        self.line(x - size, y + size, x + size, y - size, stroke=color, width=2.2)

    def bracket(self, x1, x2, y, label, color=INK, size=11, below=False):
        """A horizontal bracket from x1 to x2 with its label above (or below) it."""
        lip = 4 if below else -4
        self.path(f"M{num(x1)},{num(y + lip)} L{num(x1)},{num(y)} L{num(x2)},{num(y)} "
                  f"L{num(x2)},{num(y + lip)}", stroke=color, width=1.2)
        self.text((x1 + x2) / 2, y + (13 if below else -5), label, size=size, anchor="middle",
                  fill=color)

    def render(self, defs: str = "") -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
            f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
            f'font-family="{FONT}" font-size="12">\n'
        )
        background = f'<rect width="{self.width}" height="{self.height}" fill="white"/>\n'
        return head + defs + background + "\n".join(self.parts) + "\n</svg>\n"


def hatch(pattern_id: str, color: str, background: str) -> str:
    return (
        f'<defs><pattern id="{pattern_id}" width="6" height="6" patternUnits="userSpaceOnUse" '
        f'patternTransform="rotate(45)"><rect width="6" height="6" fill="{background}"/>'
        f'<line x1="0" y1="0" x2="0" y2="6" stroke="{color}" stroke-width="2"/></pattern></defs>\n'
    )


def piecewise(points):
    """A map from seconds to x through the (seconds, x) points, linear between them."""

    def x_of(seconds: float) -> float:
        for (s0, x0), (s1, x1) in zip(points, points[1:]):
            if s0 <= seconds <= s1:
                return x0 + (seconds - s0) * (x1 - x0) / (s1 - s0)
        raise ValueError(f"{seconds} s is off the axis")

    return x_of


def scheduled_job_window() -> str:
    """The guide's example job: period 5 min, skew tolerance 5 s (its default), min hold 1 min,
    max hold 4 min. Replica 1 ticks 3 s early, replica 2 on time, replica 3 30 s late."""
    svg = Svg(800, 540)
    # Seconds from t, the start of window N, to x; stretched near t so that seconds show.
    x = piecewise([(-25, 170), (-5, 215), (0, 255), (60, 430), (240, 640), (300, 740),
                   (310, 780)])
    claim, body_end, late = -3, 12, 30
    min_hold_end, max_hold_end = claim + 60, claim + 240
    left = 14

    svg.text(left, 24, "A scheduled job's window N: three replicas tick, one runs it",
             size=15, weight="bold")
    svg.text(left, 44, "The guide's example: period 5 min, skew tolerance 5 s (the default), "
             "min hold 1 min, max hold 4 min.", fill=MUTED)
    svg.text(left, 60, "Times by the database's clock; the axis is stretched near t.",
             fill=MUTED)

    # The windows, the axis and its ticks.
    top, bottom = 72, 88
    for start, end, label, fill in [(-25, 0, "window N − 1", GRAY_LIGHT),
                                    (0, 300, "window N", BLUE_LIGHT),
                                    (300, 310, "N+1", GRAY_LIGHT)]:
        svg.rect(x(start), top, x(end) - x(start), bottom - top, fill, stroke=GRID, rx=0)
        svg.text((x(start) + x(end)) / 2, bottom - 4, label, size=11, anchor="middle")
    svg.text(left, bottom - 4, "windows", size=11, fill=MUTED)
    axis = 96
    svg.line(x(-25), axis, x(310), axis)
    for seconds, label in [(-5, "t − 5 s"), (0, "t"), (60, "t + 1 min"),
                           (240, "t + 4 min"), (300, "t + 5 min")]:
        svg.line(x(seconds), axis, x(seconds), axis + 4)
        svg.text(x(seconds), axis + 16, label, size=11, anchor="middle")
    svg.text(left, axis + 16, "time", size=11, fill=MUTED)

    # The skew tolerance: a claim in the 5 s before t counts for window N.
    band_top, band_bottom = 124, 312
    svg.rect(x(-5), band_top, x(0) - x(-5), band_bottom - band_top, AMBER_LIGHT, rx=0)
    svg.line(x(-5), band_top, x(-5), band_bottom, stroke=AMBER, dash="3,3")
    for top_y, bottom_y in [(axis + 22, band_bottom), (350, 450)]:  # not across the heading
        svg.line(x(0), top_y, x(0), bottom_y, stroke=GRID, dash="4,3")
    svg.text(x(-5) - 6, band_top + 12, "skew tolerance:", size=11, anchor="end", fill=AMBER)
    svg.text(x(-5) - 6, band_top + 25, "a tick here claims", size=11, anchor="end", fill=AMBER)
    svg.text(x(-5) - 6, band_top + 38, "window N", size=11, anchor="end", fill=AMBER)

    def lane_label(y, name, detail):
        svg.text(left, y - 2, name, weight="bold")
        svg.text(left, y + 12, detail, size=11, fill=MUTED)

    # Replica 1: early, within the tolerance; it claims window N and runs the body.
    y1 = 158
    lane_label(y1, "replica 1", "ticks at t − 3 s")
    svg.tick_mark(x(claim), y1 - 9)
    svg.rect(x(claim), y1 - 7, x(body_end) - x(claim), 14, BLUE)
    svg.text((x(claim) + x(body_end)) / 2, y1 + 4, "body", size=11, anchor="middle",
             fill="white")
    svg.text(x(body_end) + 8, y1 - 2, "claims window N (run 7) and runs the body;")
    svg.text(x(body_end) + 8, y1 + 12, "it ends at t + 12 s: Ran, window N is done")
    # Its claim holds the job until the min hold has passed since the claim.
    yh = y1 + 26
    svg.rect(x(claim), yh, x(min_hold_end) - x(claim), 14, GREEN_LIGHT, stroke=GREEN)
    svg.text(x(claim) + 6, yh + 11, "min hold: 1 min from the claim", size=11, fill=GREEN)
    svg.text(x(min_hold_end) + 8, yh + 11, "no other run of the job starts before t + 57 s",
             size=11, fill=GREEN)

    # Replica 2: on time, while the body runs.
    y2 = 236
    lane_label(y2, "replica 2", "ticks at t")
    svg.tick_mark(x(0), y2 - 2)
    svg.text(x(0) + 10, y2 + 2, "the run has not finished: Skipped (Running)")

    # Replica 3: late, after the body ended, within the min hold.
    y3 = 282
    lane_label(y3, "replica 3", "ticks at t + 30 s")
    svg.tick_mark(x(late), y3 - 2)
    svg.text(x(late) + 10, y3 - 4, "window N ran to completion: Skipped (AlreadyRan);")
    svg.text(x(late) + 10, y3 + 10, "the same later in window N, past the min hold too",
             size=11, fill=MUTED)

    # The other ending: the body runs too long and the max hold cuts it off.
    sep = 322
    svg.line(left, sep, 786, sep, stroke=GRID)
    svg.text(left, sep + 20, "If instead the body runs too long", size=13, weight="bold")
    y4 = 372
    lane_label(y4, "replica 1", "the same claim")
    svg.tick_mark(x(claim), y4 - 9)
    svg.rect(x(claim), y4 - 7, x(max_hold_end) - x(claim), 14, BLUE)
    svg.text((x(claim) + x(max_hold_end)) / 2, y4 + 4, "body, still running", size=11,
             anchor="middle", fill="white")
    svg.line(x(max_hold_end), y4 - 13, x(max_hold_end), y4 + 13, stroke=RED, width=2.5)
    svg.text(x(max_hold_end) + 8, y4 + 4, "cut off", weight="bold", fill=RED)
    yh = y4 + 12
    svg.rect(x(claim), yh, x(max_hold_end) - x(claim), 14, ORANGE_LIGHT, stroke=ORANGE)
    svg.text(x(claim) + 6, yh + 11, "max hold: 4 min from the claim", size=11, fill=ORANGE)

    y5 = 432
    lane_label(y5, "replica 2", "ticks at t")
    svg.tick_mark(x(0), y5 - 2)
    svg.text(x(0) + 10, y5 + 2, "Skipped (Running): the unfinished claim holds the job "
             "until its max hold")

    notes = [
        "At the max hold the body is cut off (schedule::Error::Overran) and the job's lock is "
        "let go. Window N did not",
        "complete, so a later tick in window N may run it again. The min hold matters between "
        "windows: a replica ticking",
        "more than the tolerance early may run window N − 1 just before t; a punctual tick for "
        "window N then gets TooSoon.",
    ]
    for i, note in enumerate(notes):
        svg.text(left, 474 + 17 * i, note, size=11.5, fill=INK)
    return svg.render()


def frozen_holder() -> str:
    """A holder frozen with key K; silence_timeout 20 s (its default), pings every 2 s."""
    svg = Svg(800, 500)
    # Seconds since A froze, to x.
    origin, scale = -6, 15.0

    def x(seconds: float) -> float:
        return 200 + (seconds - origin) * scale

    last_heard, ended, resumed, stale_write = -1.2, 18.8, 25, 28
    left = 14
    end = x(33)

    svg.text(left, 24, "A frozen holder: the server frees its key after silence_timeout",
             size=15, weight="bold")
    svg.text(left, 44, "silence_timeout 20 s (the default); while A runs, a ping every "
             "probe_interval keeps its session heard.", fill=MUTED)

    axis = 70
    svg.line(x(origin), axis, end, axis)
    for seconds in range(-5, 36, 5):
        svg.line(x(seconds), axis, x(seconds), axis + 4)
        label = "0" if seconds == 0 else f"{seconds:+d} s".replace("-", "−")
        svg.text(x(seconds), axis + 16, label, size=11, anchor="middle")
    svg.text(left, axis + 16, "since A froze", size=11, fill=MUTED)

    for seconds in (0, ended, resumed):
        svg.line(x(seconds), axis + 24, x(seconds), 330, stroke=GRID, dash="4,3")

    def lane_label(y, name, detail=None):
        svg.text(left, y + (0 if detail else 4), name, weight="bold")
        if detail:
            svg.text(left, y + 14, detail, size=11, fill=MUTED)

    # Holder A, the process.
    ya = 128
    lane_label(ya, "holder A", "the process")
    svg.rect(x(origin), ya - 8, x(0) - x(origin), 16, GREEN)
    svg.text((x(origin) + x(0)) / 2, ya + 4, "runs, holds K", size=11, anchor="middle",
             fill="white")
    svg.rect(x(0), ya - 8, x(resumed) - x(0), 16, "url(#frozen)", stroke=MUTED)
    svg.rect((x(0) + x(resumed)) / 2 - 118, ya - 7, 236, 14, "white", rx=3)
    svg.text((x(0) + x(resumed)) / 2, ya + 4, "frozen (SIGSTOP, a paused VM): runs nothing",
             size=11, anchor="middle")
    svg.rect(x(resumed), ya - 8, end - x(resumed), 16, ORANGE)
    svg.text((x(resumed) + end) / 2, ya + 4, "runs again", size=11, anchor="middle",
             fill="white")
    svg.badge(x(0), ya - 20, "1")
    svg.badge(x(resumed), ya - 20, "4")

    # A's session on the server: heard by its pings, then unheard, then ended.
    ys = 190
    lane_label(ys, "A's session", "on the server")
    svg.rect(x(origin), ys - 8, x(ended) - x(origin), 16, BLUE_LIGHT, stroke=BLUE)
    svg.text(x(origin) + 6, ys + 4, "holds K (token 41)", size=11, fill=BLUE)
    for ping in (-5.2, -3.2, last_heard):
        svg.line(x(ping), ys + 9, x(ping), ys + 16, stroke=BLUE, width=2)
    svg.text((x(last_heard) + x(ended)) / 2, ys + 4, "unheard: no ping, no statement",
             size=11, anchor="middle", fill=BLUE)
    svg.bracket(x(last_heard), x(ended), ys - 14, "silence_timeout since it was last heard",
                color=INK)
    svg.cross(x(ended), ys)
    svg.text(x(ended) + 10, ys + 4, "ended, K freed", size=11, fill=RED)
    svg.badge(x(ended) + 112, ys, "2")
    svg.text(x(-1.2) + 6, ys + 17, "answered pings", size=10, fill=BLUE)

    # Holder B: waits in the server's queue, then gets K with a newer token.
    yb = 252
    lane_label(yb, "holder B")
    svg.rect(x(origin), yb - 8, x(ended) - x(origin), 16, "white", stroke=MUTED, dash="4,3")
    svg.text((x(origin) + x(ended)) / 2, yb + 4, "waits for K in the server's queue", size=11,
             anchor="middle", fill=MUTED)
    svg.rect(x(ended), yb - 8, end - x(ended), 16, BLUE)
    svg.text((x(ended) + end) / 2, yb + 4, "holds K (token 42)", size=11, anchor="middle",
             fill="white")
    svg.badge(x(ended), yb - 20, "3")

    # The fenced resource: writes by token.
    yr = 306
    lane_label(yr, "fenced write")
    svg.line(x(origin), yr, end, yr, stroke=GRID)
    for seconds, label, ok in [(-4, "A, 41: done", True), (21, "B, 42: done", True),
                               (stale_write, "A, 41: refused", False)]:
        if ok:
            svg.circle(x(seconds), yr, 5, GREEN)
        else:
            svg.cross(x(seconds), yr)
        svg.text(x(seconds), yr + 20, label, size=11, anchor="middle",
                 fill=GREEN if ok else RED)
    svg.badge(x(stale_write) + 14, yr - 14, "5")

    notes = [
        ("1", "A freezes (SIGSTOP, a paused VM): no pings, no statements. Its kernel keeps "
              "the connection open."),
        ("2", "silence_timeout after its last answered statement, the server ends the session "
              "(idle_session_timeout): K is freed."),
        ("3", "B, waiting in the server's queue, gets K at once, with a newer fencing token."),
        ("4", "A resumes: its guard reports LossCause::Expired before its work is polled again "
              "(guard.run: Error::LockLost)."),
        ("5", "A's write fenced with its old token is refused (StaleToken): the fence already "
              "holds B's higher token."),
    ]
    y = 352
    for label, note in notes:
        svg.badge(left + 8, y - 4, label)
        svg.text(left + 24, y, note, size=11.5)
        y += 19
    svg.text(left, y + 6, "PostgreSQL 13 and older have no idle_session_timeout: A keeps K on "
             "the server until it runs again, and B waits;", size=11.5, fill=MUTED)
    svg.text(left, y + 22, "A still learns Expired when it runs.", size=11.5, fill=MUTED)
    return svg.render(hatch("frozen", "#afb8c1", GRAY_LIGHT))


def main() -> None:
    for name, draw in [("scheduled-job-window.svg", scheduled_job_window),
                       ("frozen-holder.svg", frozen_holder)]:
        (HERE / name).write_text(draw(), encoding="utf-8")


if __name__ == "__main__":
    main()
