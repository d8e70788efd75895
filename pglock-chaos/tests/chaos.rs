//! The chaos suite's runs in the default `cargo test`: a short seeded run that must be valid
//! and recover from every kind of fault, and a shorter negative control, whose unfenced work
//! the checker must catch (so the checker is shown able to fail).
//!
//! Each run starts its own primary and standby (its restarts and failover disturb no other
//! test); the fenced resource lives in the test run's shared server, in tables of its own.

use std::path::PathBuf;
use std::time::Duration;

use pglock_chaos::checker::{AnomalyKind, Report, frozen_holders};
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
    for kind in FaultKind::ALL {
        let injected = outcome.records.iter().any(|r| {
            r.op == Op::Fault
                && r.outcome == Outcome::Ok
                && r.detail.as_deref() == Some(kind.name())
        });
        assert!(injected, "no {} fault was injected: {context}", kind.name());
    }
    for op in [Op::Section, Op::Increment, Op::Term, Op::Job] {
        assert!(
            report.count(op, Outcome::Ok) > 0,
            "no {op:?} succeeded: {context}"
        );
    }
    assert!(report.is_valid(), "anomalies: {context}");
    assert!(report.liveness_ok(), "slow recovery: {context}");
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
        frozen.late.is_empty(),
        "frozen holders kept their locks: {:#?}\n{context}",
        frozen.late
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_unfenced_work_in_the_negative_control() {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut config = config("control", 11, 8);
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
        !report.is_valid(),
        "the checker found nothing in the control: {context}"
    );
    let kinds: Vec<AnomalyKind> = report.anomalies.iter().map(|a| a.kind).collect();
    assert!(
        kinds.contains(&AnomalyKind::CounterMismatch)
            || kinds.contains(&AnomalyKind::OverlappingSections),
        "neither lost increments nor overlapping sections: {context}"
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
