//! `pglock run KEY -- CMD`: the command runs under the lock, its exit status comes back, a held
//! lock is a documented exit status, a lost lock terminates the command, and signals sent to
//! pglock reach the command while pglock keeps the lock.

mod common;

use std::io::Write;
use std::process::{Child, Stdio};

use common::cli::{Lines, exit_code, output, pglock_on_db, signal, stderr, stdout};
use common::{app_name, eventually, key, lock_rows, observer};
use pglock::{PostgresLockManager, lock_id};
use rustix::process::Signal;
use sqlx::PgPool;

/// `pglock run KEY [options] -- sh -c SCRIPT`, with stdout and stderr piped.
fn run_sh(key: &str, options: &[&str], script: &str) -> Child {
    let mut args = vec!["run", key];
    args.extend_from_slice(options);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    pglock_on_db(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start pglock run")
}

/// The pid of the session holding `key`'s lock, and its application name.
async fn holder_of(observer: &PgPool, key: &str) -> (i32, String) {
    let pid = lock_rows(observer, lock_id(key)).await[0].pid;
    let app: String =
        sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(observer)
            .await
            .expect("pg_stat_activity");
    (pid, app)
}

async fn assert_free(observer: &PgPool, key: &str) {
    eventually("the lock is free", || async {
        lock_rows(observer, lock_id(key)).await.is_empty()
    })
    .await;
}

#[tokio::test]
async fn the_command_runs_under_the_lock_and_its_exit_status_comes_back() {
    let observer = observer().await;
    let key = key("cli-run");
    let holder = app_name("cli-run");
    let mut run = run_sh(
        &key,
        &["--holder-id", &holder],
        r#"echo "key=$PGLOCK_KEY id=$PGLOCK_LOCK_ID holder=$PGLOCK_HOLDER_ID"; read go; exit 7"#,
    );
    let lines = Lines::stdout(&mut run);
    let env = lines.next().expect("the command's first line");
    assert_eq!(
        env,
        format!("key={key} id={} holder={holder}", lock_id(&key))
    );
    // While the command runs, its pglock holds the lock, tagged with the holder id.
    let (_, app) = holder_of(&observer, &key).await;
    assert_eq!(app, format!("pglock:{holder}"));
    let rival = PostgresLockManager::new(common::pool(2).await);
    assert!(
        rival
            .try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none(),
        "held"
    );
    writeln!(run.stdin.take().expect("stdin"), "go").expect("let the command end");
    assert_eq!(exit_code(run).await, Some(7), "the command's own status");
    assert_free(&observer, &key).await;

    // A command ended by a signal: 128 + its number, as a shell reports it.
    let out = output(pglock_on_db(&["run", &key, "--", "sh", "-c", "kill -9 $$"])).await;
    assert_eq!(out.status.code(), Some(128 + 9), "{}", stderr(&out));
    // Success is 0, and pglock adds nothing to the command's output.
    let out = output(pglock_on_db(&[
        "run",
        &key,
        "--",
        "echo",
        "--not-an-option",
    ]))
    .await;
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), "--not-an-option\n".to_owned())
    );
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    assert_free(&observer, &key).await;
}

#[tokio::test]
async fn a_held_lock_is_exit_75_with_no_wait_or_after_the_timeout() {
    let observer = observer().await;
    let key = key("cli-busy");
    let rival = PostgresLockManager::new(common::pool(2).await);
    let guard = rival.acquire(&key, None).await.expect("acquire");
    for options in [&["--no-wait"][..], &["-n"][..], &["--timeout", "200ms"][..]] {
        let mut args = vec!["run", key.as_str()];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--", "echo", "ran"]);
        let out = output(pglock_on_db(&args)).await;
        assert_eq!(out.status.code(), Some(75), "{options:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "the command did not run");
        assert!(
            stderr(&out).contains("is held by another holder"),
            "{}",
            stderr(&out)
        );
    }
    let out = output(pglock_on_db(&[
        "run",
        &key,
        "-n",
        "--conflict-exit-code",
        "9",
        "--",
        "true",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(9));

    // Without a timeout, it waits for the lock, then runs.
    let mut waiting = run_sh(&key, &[], "echo ran");
    eventually("pglock waits in the lock queue", || async {
        lock_rows(&observer, lock_id(&key)).await.len() == 2
    })
    .await;
    guard.release().await.expect("release");
    assert_eq!(Lines::stdout(&mut waiting).next().as_deref(), Some("ran"));
    assert_eq!(exit_code(waiting).await, Some(0));
}

#[tokio::test]
async fn commands_that_cannot_run_are_126_or_127_and_the_lock_is_released() {
    let observer = observer().await;
    let key = key("cli-missing");
    let out = output(pglock_on_db(&["run", &key, "--", "/nonexistent/command"])).await;
    assert_eq!(out.status.code(), Some(127));
    assert!(stderr(&out).contains("command not found: /nonexistent/command"));
    let dir = std::env::temp_dir().join(format!("pglock-test-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir(&dir).expect("a directory");
    let out = output(pglock_on_db(&["run", &key, "--", dir.to_str().unwrap()])).await;
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    std::fs::remove_dir(&dir).expect("clean up");
    assert_free(&observer, &key).await;
}

#[tokio::test]
async fn a_lost_lock_terminates_the_command_and_exits_76() {
    let observer = observer().await;
    let key = key("cli-lost");
    // A command that stops when asked.
    let mut run = run_sh(
        &key,
        &["--probe-interval", "100ms"],
        r#"trap 'echo terminated; exit 0' TERM; echo started; while :; do sleep 0.05; done"#,
    );
    let (out, err) = (Lines::stdout(&mut run), Lines::stderr(&mut run));
    assert_eq!(out.next().as_deref(), Some("started"));
    let (pid, _) = holder_of(&observer, &key).await;
    terminate_backend(&observer, pid).await;
    assert_eq!(
        out.next().as_deref(),
        Some("terminated"),
        "the command got SIGTERM"
    );
    assert_eq!(exit_code(run).await, Some(76));
    let said = err.rest().join("\n");
    assert!(said.contains("was lost"), "{said}");

    // A command that ignores SIGTERM is killed after --kill-after.
    let mut run = run_sh(
        &key,
        &["--probe-interval", "100ms", "--kill-after", "300ms"],
        r#"trap '' TERM; echo started; while :; do sleep 0.05; done"#,
    );
    let (out, err) = (Lines::stdout(&mut run), Lines::stderr(&mut run));
    assert_eq!(out.next().as_deref(), Some("started"));
    let (pid, _) = holder_of(&observer, &key).await;
    terminate_backend(&observer, pid).await;
    assert_eq!(exit_code(run).await, Some(76));
    let said = err.rest().join("\n");
    assert!(said.contains("outlived --kill-after; killing it"), "{said}");
    assert_free(&observer, &key).await;
}

async fn terminate_backend(observer: &PgPool, pid: i32) {
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(observer)
        .await
        .expect("terminate");
}

#[tokio::test]
async fn sigterm_reaches_the_command_and_pglock_keeps_the_lock_until_it_exits() {
    let observer = observer().await;
    let key = key("cli-signal");
    let mut run = run_sh(
        &key,
        &[],
        r#"trap 'echo stopping; read done; exit 3' TERM; echo started; while :; do sleep 0.05; done"#,
    );
    let out = Lines::stdout(&mut run);
    assert_eq!(out.next().as_deref(), Some("started"));
    // SIGINT is for the terminal's process group: pglock neither dies of it nor passes it on.
    signal(&run, Signal::INT);
    signal(&run, Signal::TERM);
    assert_eq!(out.next().as_deref(), Some("stopping"));
    // The command is winding down, until told: pglock still holds the lock for it.
    assert_eq!(lock_rows(&observer, lock_id(&key)).await.len(), 1);
    writeln!(run.stdin.take().expect("stdin"), "done").expect("let the command end");
    assert_eq!(exit_code(run).await, Some(3));
    assert_free(&observer, &key).await;
}

#[tokio::test]
async fn shared_runs_share_the_lock_and_an_exclusive_holder_excludes_them() {
    let observer = observer().await;
    let key = key("cli-shared");
    let sharer = PostgresLockManager::new(common::pool(2).await);
    let shared = sharer
        .acquire_shared(&key, Some(std::time::Duration::from_secs(10)))
        .await
        .expect("acquire shared");
    // A shared run shares the lock with the holder; an exclusive one is refused.
    let out = output(pglock_on_db(&[
        "run", &key, "--shared", "-n", "--", "echo", "ran",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "ran");
    let out = output(pglock_on_db(&["run", &key, "-n", "--", "echo", "ran"])).await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "the command did not run");
    shared.release().await.expect("release");

    // Under an exclusive holder, a shared run is refused too.
    let guard = sharer
        .acquire(&key, Some(std::time::Duration::from_secs(10)))
        .await
        .expect("acquire");
    let out = output(pglock_on_db(&[
        "run", &key, "--shared", "-n", "--", "echo", "ran",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(75), "{}", stderr(&out));
    guard.release().await.expect("release");
    assert_free(&observer, &key).await;
}
