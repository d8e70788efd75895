//! Histories as JSON lines (written, shared, torn, read back), and the SVG timeline.

use std::sync::Arc;

use pglock_chaos::history::{
    HistoryWriter, Op, Outcome, Record, parse_jsonl, read_jsonl, read_jsonl_dir, write_jsonl,
};
use pglock_chaos::svg::{Options, timeline, timeline_with};

const S: u64 = 1_000_000;

fn record(process: &str, task: u32, op: Op, span: (u64, u64), outcome: Outcome) -> Record {
    Record {
        process: process.to_owned(),
        task,
        op,
        key: "k".to_owned(),
        start_us: span.0,
        end_us: span.1,
        outcome,
        token: Some(7),
        value: None,
        detail: None,
        holder: None,
        seq: None,
    }
}

fn fault(kind: &str, span: (u64, u64)) -> Record {
    Record {
        detail: Some(kind.to_owned()),
        token: None,
        ..record("nemesis", 0, Op::Fault, span, Outcome::Ok)
    }
}

/// A fresh directory under the target's temporary directory, for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_shared_writer_keeps_every_line_whole() {
    let path = scratch("shared-writer").join("w1.jsonl");
    let writer = Arc::new(HistoryWriter::append(&path).unwrap());
    let threads: Vec<_> = (0..4)
        .map(|task| {
            let writer = Arc::clone(&writer);
            std::thread::spawn(move || {
                for i in 0..50 {
                    let mut r = record("w1", task, Op::Increment, (i, i + 1), Outcome::Ok);
                    r.detail = Some(format!("\"quoted\" ünïcode\nline {i}"));
                    writer.write(&r).unwrap();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    // A second writer (another process, say) appends after the first one's lines.
    let later = HistoryWriter::append(&path).unwrap();
    later.write(&fault("kill", (100, 200))).unwrap();
    later.sync().unwrap();
    assert_eq!(later.path(), path);

    let history = read_jsonl(&path).unwrap();
    assert_eq!(history.len(), 201);
    for task in 0..4 {
        let starts: Vec<u64> = history
            .iter()
            .filter(|r| r.task == task && r.op == Op::Increment)
            .map(|r| r.start_us)
            .collect();
        assert_eq!(starts, (0..50).collect::<Vec<_>>(), "task {task}");
    }
    assert_eq!(history[200].detail.as_deref(), Some("kill"));

    // The files of a run's directory read as one history, other files left out.
    let dir = path.parent().unwrap();
    write_jsonl(dir.join("nemesis.jsonl"), &[fault("stop", (1, 2))]).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a history\n").unwrap();
    let all = read_jsonl_dir(dir).unwrap();
    assert_eq!(all.len(), 202);
    assert_eq!(
        all[0].detail.as_deref(),
        Some("stop"),
        "nemesis.jsonl before w1.jsonl"
    );
}

#[test]
fn a_whole_history_round_trips() {
    let path = scratch("round-trip").join("all.jsonl");
    let mut history: Vec<Record> = Op::ALL
        .into_iter()
        .zip(Outcome::ALL.into_iter().cycle())
        .enumerate()
        .map(|(i, (op, outcome))| record("w2", i as u32, op, (i as u64, i as u64 + 5), outcome))
        .collect();
    history[0].token = None;
    history[1].value = Some(-3);
    history[2].detail = Some("<broken pipe> & \"more\"".to_owned());
    write_jsonl(&path, &history).unwrap();
    assert_eq!(read_jsonl(&path).unwrap(), history);
    // The names the history spells are the ones reports print.
    let text = std::fs::read_to_string(&path).unwrap();
    for (line, record) in text.lines().zip(&history) {
        let op = format!("\"op\":\"{}\"", record.op.name());
        let outcome = format!("\"outcome\":\"{}\"", record.outcome.name());
        assert!(line.contains(&op) && line.contains(&outcome), "{line}");
    }
}

#[test]
fn torn_lines_are_skipped_but_garbage_is_an_error() {
    let whole = serde_json::to_string(&record("w1", 0, Op::Section, (1, 2), Outcome::Ok)).unwrap();
    let torn = format!("{whole}\n\n{whole}\n{}", &whole[..whole.len() / 2]);
    assert_eq!(parse_jsonl(&torn).unwrap().len(), 2);
    // Inside the file too: its process was restarted and went on appending.
    let inside = format!("{}\n{whole}\n", &whole[..10]);
    assert_eq!(parse_jsonl(&inside).unwrap().len(), 1);
    // A last line that is whole but has no newline is kept.
    assert_eq!(parse_jsonl(&format!("{whole}\n{whole}")).unwrap().len(), 2);
    let garbage = format!("{whole}\n{{\"process\": 1]\n{whole}\n");
    let error = parse_jsonl(&garbage).unwrap_err();
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
    assert!(error.to_string().starts_with("line 2:"), "{error}");
    // A whole object that is not a record is no torn line either.
    let missing = whole.replace(",\"task\":0", "");
    assert_ne!(missing, whole);
    assert!(parse_jsonl(&missing).is_err());
    assert!(parse_jsonl("").unwrap().is_empty());
}

#[test]
fn a_writer_reopening_a_torn_file_keeps_the_torn_line_apart() {
    let path = scratch("torn").join("w1.jsonl");
    let first = record("w1", 0, Op::Section, (1, 2), Outcome::Ok);
    // Killed in the middle of a line, inside a two-byte character.
    let mut cut = record("w1", 1, Op::Section, (3, 4), Outcome::Ok);
    cut.detail = Some("ünïcode".to_owned());
    let cut = serde_json::to_vec(&cut).unwrap();
    let at = cut.iter().position(|&b| b == 0xc3).unwrap() + 1;
    let mut file = serde_json::to_vec(&first).unwrap();
    file.push(b'\n');
    file.extend_from_slice(&cut[..at]);
    std::fs::write(&path, file).unwrap();
    // The restarted worker appends to the same file.
    let again = record("w1", 2, Op::Increment, (5, 6), Outcome::Info);
    HistoryWriter::append(&path).unwrap().write(&again).unwrap();
    assert_eq!(read_jsonl(&path).unwrap(), [first, again]);
}

/// Checks that `svg` is one well-formed element: tags nest, quotes pair, `&` starts an entity.
fn assert_well_formed(svg: &str) {
    assert!(svg.starts_with("<svg "), "{}", &svg[..svg.len().min(80)]);
    let mut open: Vec<&str> = Vec::new();
    let mut rest = svg;
    while let Some(lt) = rest.find('<') {
        assert_entities(&rest[..lt]);
        let gt = rest[lt..].find('>').expect("a tag is closed") + lt;
        let tag = &rest[lt + 1..gt];
        assert!(
            tag.matches('"').count().is_multiple_of(2) && !tag.contains('<'),
            "tag {tag}"
        );
        assert_entities(tag);
        let name = tag
            .trim_start_matches('/')
            .split([' ', '/', '\n'])
            .next()
            .unwrap();
        if tag.starts_with('/') {
            assert_eq!(open.pop(), Some(name), "closing {tag}");
        } else if !tag.ends_with('/') {
            open.push(name);
        }
        assert!(
            !open.is_empty() || gt + 1 >= rest.len() - 1,
            "one root element"
        );
        rest = &rest[gt + 1..];
    }
    assert!(open.is_empty(), "unclosed {open:?}");
    assert_eq!(rest.trim(), "");
}

fn assert_entities(text: &str) {
    for (at, _) in text.match_indices('&') {
        let entity = &text[at..];
        let known = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"];
        assert!(
            known.iter().any(|e| entity.starts_with(e)),
            "bare & in {text}"
        );
    }
}

#[test]
fn a_short_run_draws_every_operation_and_labels_its_faults() {
    let history = vec![
        record("w1", 0, Op::Section, (0, S / 2), Outcome::Ok),
        record("w1", 1, Op::Section, (S / 4, S), Outcome::Fail),
        record("w10", 0, Op::Increment, (S, 2 * S), Outcome::Info),
        record("w2", 0, Op::Job, (S, 3 * S), Outcome::Ok),
        record("<w&3>", 0, Op::Term, (0, 4 * S), Outcome::Ok),
        record("resource", 0, Op::ResourceStart, (S, S), Outcome::Ok),
        fault("kill", (S, 2 * S)),
        fault("partition \"a\"", (3 * S, 4 * S)),
    ];
    let svg = timeline(&history);
    assert_well_formed(&svg);
    assert_eq!(
        svg.matches("<title>").count(),
        8,
        "six operations and two faults"
    );
    for label in [
        ">kill</text>",
        ">partition &quot;a&quot;</text>",
        ">&lt;w&amp;3&gt;</text>",
    ] {
        assert!(svg.contains(label), "{label} in {svg}");
    }
    assert!(svg.contains(">resource k</text>"));
    // Lanes in natural order: w2 above w10.
    assert!(svg.find(">w2</text>").unwrap() < svg.find(">w10</text>").unwrap());
    for colour in ["#2ca02c", "#d62728", "#999999"] {
        assert!(svg.contains(colour), "{colour}");
    }
}

#[test]
fn a_long_busy_run_is_drawn_in_bins() {
    // Ten minutes, eight workers, 100k operations; a fault every 30 s.
    let mut history = Vec::with_capacity(100_020);
    for i in 0..100_000u64 {
        let start = i * 6_000;
        let outcome = Outcome::ALL[usize::from(i % 17 == 0) + usize::from(i % 51 == 0)];
        let worker = format!("w{}", i % 8 + 1);
        history.push(record(
            &worker,
            (i % 4) as u32,
            Op::Section,
            (start, start + 20_000),
            outcome,
        ));
    }
    for n in 0..20 {
        let kind = ["kill", "stop", "restart", "failover"][n % 4];
        history.push(fault(kind, (n as u64 * 30 * S, n as u64 * 30 * S + 5 * S)));
    }
    let svg = timeline(&history);
    assert_well_formed(&svg);
    assert!(svg.contains("operations ended per 2s"), "{}", &svg[..400]);
    let shapes = svg.matches("<rect").count();
    assert!(shapes < 20_000, "{shapes} shapes");
    assert!(svg.len() < 2_000_000, "{} bytes", svg.len());
    for kind in ["kill", "stop", "restart", "failover"] {
        assert!(svg.contains(&format!(">{kind}</text>")), "{kind}");
    }
    // With a higher limit, the same run is drawn operation by operation.
    let detailed = timeline_with(
        &history,
        &Options {
            detail_limit: 200_000,
            ..Options::default()
        },
    );
    assert!(detailed.matches("<rect").count() > 100_000);
}

#[test]
fn an_empty_history_is_still_a_picture() {
    let svg = timeline(&[]);
    assert_well_formed(&svg);
    assert!(svg.contains("empty history"));
}
