//! Draws a run: a self-contained SVG timeline of its operations and faults.
//!
//! Time runs left to right in seconds from the first record. Each worker process has a lane,
//! and the fenced resource one per key. Faults are translucent bands across every lane,
//! labelled by kind above the plot. A short run shows each operation as a bar coloured by its
//! outcome; a long one (more operations than [`Options::detail_limit`]) counts them in time
//! bins per lane and stacks the counts by outcome, so that a ten-minute run of 100k
//! operations stays a picture of a few thousand shapes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use crate::checker::{fault_kind, settled};
use crate::history::{Op, Outcome, Record};

/// How to draw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The width of the picture, in pixels.
    pub width: u32,
    /// Up to this many operations, each is drawn; beyond, they are counted in bins.
    pub detail_limit: usize,
    /// At most this many lanes of the resource; the keys beyond share one last lane.
    pub resource_lanes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            width: 1200,
            detail_limit: 4_000,
            resource_lanes: 16,
        }
    }
}

const LEFT: f64 = 190.0;
const RIGHT: f64 = 20.0;
const TITLE_H: f64 = 28.0;
const LABEL_ROWS: usize = 3;
const LABEL_ROW_H: f64 = 14.0;
const LANE_H: f64 = 40.0;
const LANE_PAD: f64 = 4.0;
const AXIS_H: f64 = 30.0;
/// Room for two rows of legend.
const LEGEND_H: f64 = 56.0;
const FONT: &str = "font-family=\"sans-serif\" font-size=\"11\"";

/// The colours of faults, by kind in name order (and again past the end of the list): none
/// of them the red, green or grey of the outcomes.
const FAULT_COLOURS: [&str; 10] = [
    "#9467bd", "#ff7f0e", "#1f77b4", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79",
    "#637939", "#843c39",
];

/// The timeline of a history, with the [`Options::default`].
pub fn timeline(history: &[Record]) -> String {
    timeline_with(history, &Options::default())
}

/// The timeline of a history.
pub fn timeline_with(history: &[Record], options: &Options) -> String {
    let history = &*settled(history);
    let Some(frame) = Frame::of(history, options) else {
        return empty(options.width);
    };
    let lanes = lanes(history, options.resource_lanes);
    let faults: Vec<&Record> = history.iter().filter(|r| r.op == Op::Fault).collect();
    let kinds: BTreeSet<&str> = faults.iter().map(|f| fault_kind(f)).collect();
    let colour = |kind: &str| {
        let at = kinds.iter().position(|k| *k == kind).unwrap_or(0);
        FAULT_COLOURS[at % FAULT_COLOURS.len()]
    };
    let drawn: usize = lanes.iter().map(|l| l.ops.len()).sum();
    let binned = drawn > options.detail_limit;
    let plot_top = TITLE_H + LABEL_ROWS as f64 * LABEL_ROW_H + 6.0;
    let plot_bottom = plot_top + LANE_H * lanes.len().max(1) as f64;
    let height = plot_bottom + AXIS_H + LEGEND_H;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{height}\" \
         viewBox=\"0 0 {w} {height}\" shape-rendering=\"crispEdges\" {FONT}>",
        w = options.width
    );
    let _ = writeln!(svg, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let bin_us = binned.then(|| bin_us(frame.span_us, frame.plot_w));
    title(&mut svg, history.len(), drawn, &frame, bin_us);
    for (i, lane) in lanes.iter().enumerate() {
        let top = plot_top + LANE_H * i as f64;
        lane_frame(&mut svg, lane, i, top, &frame, bin_us.is_some());
        match bin_us {
            Some(bin) => lane_bins(&mut svg, lane, top, &frame, bin),
            None => lane_ops(&mut svg, lane, top, &frame),
        }
    }
    fault_bands(&mut svg, &faults, &frame, plot_top, plot_bottom, &colour);
    axis(&mut svg, &frame, plot_top, plot_bottom);
    legend(
        &mut svg,
        plot_bottom + AXIS_H,
        options.width,
        &kinds,
        &colour,
    );
    svg.push_str("</svg>\n");
    svg
}

/// Where time goes on the page.
struct Frame {
    origin_us: u64,
    span_us: u64,
    plot_w: f64,
}

impl Frame {
    fn of(history: &[Record], options: &Options) -> Option<Self> {
        let first = history.iter().map(|r| r.start_us.min(r.end_us)).min()?;
        let last = history.iter().map(|r| r.start_us.max(r.end_us)).max()?;
        let plot_w = (f64::from(options.width) - LEFT - RIGHT).max(100.0);
        Some(Self {
            origin_us: first,
            span_us: (last - first).max(1),
            plot_w,
        })
    }

    fn x(&self, us: u64) -> f64 {
        LEFT + us.saturating_sub(self.origin_us) as f64 * self.plot_w / self.span_us as f64
    }
}

/// One lane: a worker process, or the resource's view of one key (or of the remaining keys).
struct Lane<'h> {
    name: String,
    ops: Vec<&'h Record>,
}

fn lanes(history: &[Record], resource_lanes: usize) -> Vec<Lane<'_>> {
    let mut workers: BTreeMap<(String, u64, &str), Vec<&Record>> = BTreeMap::new();
    let mut keys: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for record in history {
        match record.op {
            Op::Fault | Op::CounterFinal => {}
            Op::ResourceStart | Op::ResourceEnd | Op::ResourceAppend => {
                keys.entry(record.key.as_str()).or_default().push(record);
            }
            op if op.is_lock() => {}
            _ => workers
                .entry(natural(&record.process))
                .or_default()
                .push(record),
        }
    }
    let mut lanes: Vec<Lane<'_>> = workers
        .into_iter()
        .map(|((_, _, name), ops)| Lane {
            name: name.to_owned(),
            ops,
        })
        .collect();
    let shown = if keys.len() > resource_lanes {
        resource_lanes.saturating_sub(1)
    } else {
        keys.len()
    };
    let mut keys = keys.into_iter();
    for (key, ops) in keys.by_ref().take(shown) {
        lanes.push(Lane {
            name: format!("resource {key}"),
            ops,
        });
    }
    let rest: Vec<&Record> = keys.flat_map(|(_, ops)| ops).collect();
    if !rest.is_empty() {
        lanes.push(Lane {
            name: "resource, other keys".to_owned(),
            ops: rest,
        });
    }
    lanes
}

/// Sorts `w2` before `w10`: the name without its trailing digits, then their number.
fn natural(name: &str) -> (String, u64, &str) {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let number = name[stem.len()..].parse().unwrap_or(0);
    (stem.to_owned(), number, name)
}

fn outcome_colour(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Ok => "#2ca02c",
        Outcome::Fail => "#d62728",
        Outcome::Info => "#999999",
    }
}

fn title(svg: &mut String, records: usize, drawn: usize, frame: &Frame, bin_us: Option<u64>) {
    let how = match bin_us {
        Some(bin) => format!(
            "operations ended per {}, stacked by outcome (height relative to the lane's busiest bin)",
            seconds(bin)
        ),
        None => "each operation from its start to its end".to_owned(),
    };
    let text = format!(
        "{records} records, {drawn} operations over {}: {how}",
        seconds(frame.span_us)
    );
    let _ = writeln!(
        svg,
        "<text x=\"{LEFT}\" y=\"18\" font-size=\"13\">{}</text>",
        escape(&text)
    );
}

fn lane_frame(svg: &mut String, lane: &Lane<'_>, i: usize, top: f64, frame: &Frame, binned: bool) {
    let shade = if i.is_multiple_of(2) {
        "#f7f7f7"
    } else {
        "#ffffff"
    };
    let _ = writeln!(
        svg,
        "<rect x=\"{LEFT}\" y=\"{top}\" width=\"{:.1}\" height=\"{LANE_H}\" fill=\"{shade}\"/>",
        frame.plot_w
    );
    let label = if binned {
        format!("{} ({})", lane.name, lane.ops.len())
    } else {
        lane.name.clone()
    };
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
        LEFT - 6.0,
        top + LANE_H / 2.0 + 4.0,
        escape(&label)
    );
}

/// Every operation as a bar, one row per task of the process.
fn lane_ops(svg: &mut String, lane: &Lane<'_>, top: f64, frame: &Frame) {
    let tasks: BTreeSet<u32> = lane.ops.iter().map(|r| r.task).collect();
    let rows = tasks.len().clamp(1, 6);
    let row_h = (LANE_H - 2.0 * LANE_PAD) / rows as f64;
    for op in &lane.ops {
        let row = tasks.iter().position(|&t| t == op.task).unwrap_or(0) % rows;
        let y = top + LANE_PAD + row_h * row as f64;
        let x = frame.x(op.start_us);
        let w = (frame.x(op.end_us.max(op.start_us)) - x).max(1.0);
        let token = op.token.map_or(String::new(), |t| format!(" token {t}"));
        let tip = format!(
            "{}/{} {} {} on {}{token}, {} to {}",
            op.process,
            op.task,
            op.op.name(),
            op.outcome.name(),
            op.key,
            seconds(op.start_us.saturating_sub(frame.origin_us)),
            seconds(op.end_us.saturating_sub(frame.origin_us)),
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{}</title></rect>",
            (row_h - 1.0).max(1.0),
            outcome_colour(op.outcome),
            escape(&tip)
        );
    }
}

/// Operations counted per bin of time (by when they ended), stacked ok, fail, info.
fn lane_bins(svg: &mut String, lane: &Lane<'_>, top: f64, frame: &Frame, bin_us: u64) {
    let mut bins: BTreeMap<u64, [usize; 3]> = BTreeMap::new();
    for op in &lane.ops {
        let bin = op.end_us.saturating_sub(frame.origin_us) / bin_us;
        let at = Outcome::ALL
            .iter()
            .position(|&o| o == op.outcome)
            .unwrap_or(2);
        bins.entry(bin).or_default()[at] += 1;
    }
    let busiest = bins
        .values()
        .map(|c| c.iter().sum::<usize>())
        .max()
        .unwrap_or(1)
        .max(1);
    let full = LANE_H - 2.0 * LANE_PAD;
    for (bin, counts) in bins {
        let x = frame.x(frame.origin_us + bin * bin_us);
        // The last bin may reach past the end of the history: it stops at the plot's edge.
        let end = frame
            .x(frame.origin_us + (bin + 1) * bin_us)
            .min(LEFT + frame.plot_w);
        let w = (end - x).max(1.0);
        let mut bottom = top + LANE_H - LANE_PAD;
        for (outcome, count) in Outcome::ALL.into_iter().zip(counts) {
            if count == 0 {
                continue;
            }
            let h = full * count as f64 / busiest as f64;
            bottom -= h;
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{bottom:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill=\"{}\"/>",
                outcome_colour(outcome)
            );
        }
    }
}

/// Each fault as a band across all lanes, and its kind above the plot where there is room.
fn fault_bands(
    svg: &mut String,
    faults: &[&Record],
    frame: &Frame,
    plot_top: f64,
    plot_bottom: f64,
    colour: &dyn Fn(&str) -> &'static str,
) {
    // Where each row of labels is free again, so labels of close faults do not overlap.
    let mut free_from = [f64::MIN; LABEL_ROWS];
    for fault in faults {
        let kind = fault_kind(fault);
        let x = frame.x(fault.start_us);
        let w = (frame.x(fault.end_us.max(fault.start_us)) - x).max(1.5);
        let tip = format!(
            "{kind} on {}: {} to {}",
            fault.key,
            seconds(fault.start_us.saturating_sub(frame.origin_us)),
            seconds(fault.end_us.saturating_sub(frame.origin_us)),
        );
        let _ = writeln!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{plot_top:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{}\" \
             fill-opacity=\"0.18\"><title>{}</title></rect>",
            plot_bottom - plot_top,
            colour(kind),
            escape(&tip)
        );
        // About 6.5 pixels a character at this size.
        let text_w = 6.5 * kind.chars().count() as f64 + 4.0;
        if let Some(row) = free_from.iter().position(|&free| free <= x) {
            free_from[row] = x + text_w;
            let y = TITLE_H + LABEL_ROW_H * (row as f64 + 1.0);
            let _ = writeln!(
                svg,
                "<text x=\"{x:.1}\" y=\"{y:.1}\" fill=\"{}\">{}</text>",
                colour(kind),
                escape(kind)
            );
        }
    }
}

/// Ticks every 1, 2 or 5 times a power of ten seconds, about ten of them.
fn axis(svg: &mut String, frame: &Frame, plot_top: f64, plot_bottom: f64) {
    let step = nice_step(frame.span_us / 10);
    let right = LEFT + frame.plot_w;
    let _ = writeln!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{plot_bottom:.1}\" x2=\"{right:.1}\" y2=\"{plot_bottom:.1}\" stroke=\"#333\"/>"
    );
    let mut at = 0;
    while at <= frame.span_us {
        let x = frame.x(frame.origin_us + at);
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{plot_top:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ccc\" \
             stroke-width=\"0.5\"/>",
            plot_bottom + 4.0
        );
        let _ = writeln!(
            svg,
            "<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            plot_bottom + 16.0,
            escape(&seconds(at))
        );
        at += step;
    }
}

fn legend(
    svg: &mut String,
    top: f64,
    width: u32,
    kinds: &BTreeSet<&str>,
    colour: &dyn Fn(&str) -> &'static str,
) {
    let mut x = LEFT;
    let mut y = top + 14.0;
    let mut item = |svg: &mut String, fill: &str, opacity: f64, label: &str| {
        let item_w = 16.0 + 6.5 * label.chars().count() as f64 + 14.0;
        if x + item_w > f64::from(width) && x > LEFT {
            // The next row, rather than past the picture's edge.
            x = LEFT;
            y += 20.0;
        }
        let _ = writeln!(
            svg,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{fill}\" \
             fill-opacity=\"{opacity}\"/><text x=\"{:.1}\" y=\"{y:.1}\">{}</text>",
            y - 10.0,
            x + 16.0,
            escape(label)
        );
        x += item_w;
    };
    for outcome in Outcome::ALL {
        item(svg, outcome_colour(outcome), 1.0, outcome.name());
    }
    for kind in kinds {
        item(svg, colour(kind), 0.35, &format!("fault: {kind}"));
    }
}

/// The smallest of 1, 2, 5 times a power of ten microseconds that is at least `at_least`.
fn nice_step(at_least: u64) -> u64 {
    let mut power = 1u64;
    loop {
        for factor in [1, 2, 5] {
            if power * factor >= at_least {
                return power * factor;
            }
        }
        power *= 10;
    }
}

/// A bin wide enough that a bin is at least two pixels.
fn bin_us(span_us: u64, plot_w: f64) -> u64 {
    let at_least = (span_us as f64 * 2.0 / plot_w).ceil() as u64;
    nice_step(at_least.max(1_000))
}

/// Microseconds as seconds, with as many decimals as they need.
fn seconds(us: u64) -> String {
    let text = format!("{:.6}", us as f64 / 1e6);
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}s")
}

/// Text made safe for SVG's character data and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 has no way to carry other control characters, even escaped.
            c if c.is_control() && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn empty(width: u32) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"60\" {FONT}>\
         <text x=\"10\" y=\"30\">empty history</text></svg>\n"
    )
}
