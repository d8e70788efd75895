//! The chaos suite's runs in the default `cargo test`: a short seeded run that must be valid
//! and recover from every kind of fault, and two shorter negative controls, each of which must
//! make the checker report its own kind of anomaly (so each part of the verdict is shown able
//! to fail): the fence taken away, and the lock itself broken.
//!
//! Each run starts its own primary and standby (its restarts and failover disturb no other
//! test); the fenced resource lives in the test run's shared server, in tables of its own.

use std::path::PathBuf;
use std::time::Duration;

use pglock_chaos::checker::{AnomalyKind, ModelOutcome, Report, frozen_holders};
use pglock_chaos::history::{Op, Outcome};
use pglock_chaos::nemesis::{FaultKind, Pace};
use pglock_chaos::run::{self, Config};
use pglock_chaos::spec::{Mode, Timing, WorkerSpec};

/// The runs share two cores with the rest of the tests: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The whole run, setup and finish included, is bounded by this.
const RUN_DEADLINE: Duration = Duration::from_secs(120);

fn config(name: &str, seed: u64, seconds: u64) -> Config {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{name}-{seed}"));
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_pglock-chaos"));
    Config::new(seed, Duration::from_secs(seconds), out, exe)
}

/// Runs `config`, checks it, and returns the report and what to print if it fails.
async fn run_and_check(config: &Config) -> (run::Outcome, Report, String) {
    let outcome = tokio::time::timeout(RUN_DEADLINE, run::run(config))
        .await
        .unwrap_or_else(|_| panic!("seed {}: the run took over {RUN_DEADLINE:?}", config.seed))
        .unwrap_or_else(|err| panic!("seed {}: the run could not be set up: {err}", config.seed));
    let report = run::check_and_write(config, &outcome).expect("write the reports");
    let by_kind: Vec<String> = AnomalyKind::ALL
        .iter()
        .map(|kind| format!("{}: {}", kind.name(), report.anomalies_of(*kind).count()))
        .collect();
    let context = format!(
        "seed {}\n{report}\nanomalies by kind: {}\nhistory: {}\nreports: {}\nproblems: {:?}",
        config.seed,
        by_kind.join(", "),
        outcome.history_path.display(),
        config.out_dir.display(),
        outcome.problems
    );
    (outcome, report, context)
}

/// How many anomalies of `kind` the report has.
fn count(report: &Report, kind: AnomalyKind) -> usize {
    report.anomalies_of(kind).count()
}

/// Whether some holds ended without a confirmed release: lost, or unconfirmed.
fn locks_went(report: &Report) -> bool {
    report.holds.lost + report.holds.unknown > 0
}

/// That the model searched every key to a verdict, and which keys it searched.
fn assert_model_decided(report: &Report, context: &str) {
    assert!(
        report.model_decided(),
        "the model search gave up: {context}"
    );
    assert!(
        report.model_operations() > 0,
        "the model checked no lock operation: {context}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_run_under_every_kind_of_fault_is_valid_and_recovers() {
    let _one = ONE_AT_A_TIME.lock().await;
    let config = config("short", 7, 18);
    let (outcome, report, context) = run_and_check(&config).await;
    eprintln!("{context}");
    assert!(
        outcome.problems.is_empty(),
        "the run itself went wrong: {context}"
    );
    for op in [Op::Section, Op::Read, Op::Increment, Op::Term, Op::Job] {
        assert!(
            report.count(op, Outcome::Ok) > 0,
            "no {op:?} succeeded: {context}"
        );
    }
    // The verdict: no anomaly, and every key's lock operations fit the model.
    assert!(report.is_valid(), "anomalies: {context}");
    assert_model_decided(&report, &context);
    let models: Vec<(&str, &str)> = report
        .model
        .iter()
        .map(|key| (key.key.as_str(), key.model))
        .collect();
    assert_eq!(
        models,
        [
            ("counter:0", "mutex"),
            ("counter:1", "mutex"),
            ("section:0", "reader-writer lock"),
            ("section:1", "reader-writer lock"),
        ],
        "{context}"
    );
    assert!(
        report
            .model
            .iter()
            .all(|key| key.outcome == ModelOutcome::Linearizable),
        "{context}"
    );
    // Locks went under the faults, so the checks saw more than clean hand-overs.
    assert!(
        report.holds.confirmed > 0,
        "no confirmed release: {context}"
    );
    assert!(locks_went(&report), "no lock was lost: {context}");
    assert!(report.liveness_ok(), "slow recovery: {context}");
    every_kind_of_fault_was_checked(&config, &outcome, &report, &context);
}

/// Every kind of fault was injected, and the checks that concern it had something to check:
/// a recovery measured after it, and, for long pauses, a lock held by a frozen worker.
fn every_kind_of_fault_was_checked(
    config: &Config,
    outcome: &run::Outcome,
    report: &Report,
    context: &str,
) {
    for kind in FaultKind::ALL {
        let injected = outcome.records.iter().any(|r| {
            r.op == Op::Fault
                && r.outcome == Outcome::Ok
                && r.detail.as_deref() == Some(kind.name())
        });
        assert!(injected, "no {} fault was injected: {context}", kind.name());
        let measured = report
            .liveness
            .iter()
            .find(|live| live.kind == kind.name())
            .is_some_and(|live| !live.recoveries_us.is_empty());
        assert!(
            measured,
            "no recovery measured after a {} fault: {context}",
            kind.name()
        );
    }
    // Every fault was recovered from before the run ended, however long its bound.
    let unrecovered: Vec<_> = report
        .recoveries
        .iter()
        .filter(|r| r.recovery_us.is_none())
        .map(|r| (&r.kind, &r.fault.key))
        .collect();
    assert!(
        unrecovered.is_empty(),
        "faults never recovered from: {unrecovered:?}\n{context}"
    );
    let bound = config
        .timing
        .silence
        .expect("the run has a silent-holder bound");
    let frozen = frozen_holders(&outcome.records, bound, Duration::from_millis(1_500));
    eprintln!(
        "frozen holders that lost a lock: {} (frozen waiters in line: {})",
        frozen.cases, frozen.frozen_waiters
    );
    assert!(
        frozen.cases > 0,
        "no lock was held across a long pause: the silent-holder check checked nothing: {context}"
    );
    assert!(
        frozen.late.is_empty(),
        "frozen holders kept their locks: {:#?}\n{context}",
        frozen.late
    );
}

/// The first control takes the fence away (the lock is sound): stale writes, accepted by the
/// resource, and nothing wrong with the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_unfenced_work_in_the_negative_control() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut config = config("control", 11, 5);
    config.mode = Mode::Unsafe;
    // Backends ended under their holders, often: each stale holder writes on.
    config.faults = vec![FaultKind::Terminate];
    config.pace = Pace {
        gap_ms: (60, 200),
        overlap: 1,
        ..config.pace
    };
    config.tail = Duration::from_secs(1);
    let (_, report, context) = run_and_check(&config).await;
    eprintln!("{context}");
    assert!(
        count(&report, AnomalyKind::StaleWrite) > 0,
        "the control's unfenced writes were not reported as stale writes: {context}"
    );
    assert_model_decided(&report, &context);
    assert!(locks_went(&report), "no lock was lost: {context}");
    // The lock is sound: by the holders' own account no two holds overlapped, and every key's
    // lock operations fit the model (this once failed on a pglock bug: docs/chaos.md, "A
    // finding"). Said of a history with holds pglock confirmed, not of an empty one.
    assert!(
        report.holds.confirmed >= 10,
        "too few confirmed holds to judge overlap on: {context}"
    );
    for kind in [
        AnomalyKind::OverlappingSections,
        AnomalyKind::NotLinearizable,
    ] {
        assert_eq!(
            count(&report, kind),
            0,
            "{kind} with a sound lock: {context}"
        );
    }
}

/// The second control breaks the lock (every exclusive lock taken shared) and keeps the fence:
/// overlapping sections and a model violation, and no stale write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_a_broken_lock_in_the_second_negative_control() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut config = config("broken-lock", 13, 3);
    config.mode = Mode::BrokenLock;
    // No fault: whatever goes wrong is the lock's doing.
    config.faults = Vec::new();
    config.tail = Duration::from_secs(1);
    let (_, report, context) = run_and_check(&config).await;
    eprintln!("{context}");
    assert!(
        count(&report, AnomalyKind::OverlappingSections) > 0,
        "the broken lock's overlapping holds were not reported: {context}"
    );
    assert!(
        count(&report, AnomalyKind::NotLinearizable) > 0,
        "the broken lock's history fitted the model: {context}"
    );
    assert_model_decided(&report, &context);
    // The fences held: the resource took nothing out of order, and recorded what it refused
    // the holders that overlapped.
    for kind in [AnomalyKind::StaleWrite, AnomalyKind::InterleavedSections] {
        assert_eq!(
            count(&report, kind),
            0,
            "{kind} with sound fences: {context}"
        );
    }
    assert!(
        report.count(Op::ResourceEnd, Outcome::Fail) > 0,
        "no refused section end was recorded: {context}"
    );
}

/// Stray worker arguments do not make a worker of a process spawned by anyone else: the
/// worker checks its parent's pid before it does anything.
#[test]
fn a_worker_whose_parent_is_not_the_one_named_refuses_to_run() {
    let spec = WorkerSpec {
        name: "w9".to_owned(),
        // Not this test's pid, which is the spawned process's parent.
        parent: std::process::id() + 1,
        lock_port: 9,
        resource_url: "postgres://postgres@127.0.0.1:9/postgres".to_owned(),
        prefix: "stray".to_owned(),
        tasks: 1,
        seed: 0,
        mode: Mode::Safe,
        timing: Timing::default(),
    };
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pglock-chaos"))
        .args(spec.to_args())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn the binary");
    let pid = rustix::process::Pid::from_child(&child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let Ok(status) = rx.recv_timeout(Duration::from_secs(20)) else {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        panic!("the would-be worker did not exit within 20 s");
    };
    let status = status.expect("its status");
    assert_eq!(status.code(), Some(2), "it should refuse, with code 2");
}
