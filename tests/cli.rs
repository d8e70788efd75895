//! The `pglock` binary, run as a user would: its output, and its exit codes.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::{app_name, eventually, key, lock_rows, observer};
use pglock::{LockManager, lock_id, split_lock_id};
use serde_json::Value;

fn pglock(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pglock"));
    command.args(args);
    command
}

/// Runs the command against the test database.
fn with_database(args: &[&str]) -> Output {
    pglock(args)
        .env("DATABASE_URL", common::url())
        .output()
        .expect("run pglock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("UTF-8 output")
}

#[test]
fn id_prints_the_lock_id_and_its_pg_locks_halves() {
    let output = pglock(&["id", "leader:orders"])
        .env_remove("DATABASE_URL")
        .output()
        .expect("run pglock");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let id = lock_id("leader:orders");
    let (classid, objid) = split_lock_id(id);
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "key      \"leader:orders\"".to_owned(),
            format!("lock id  {id}"),
            format!("classid  {classid}"),
            format!("objid    {objid}"),
        ]
    );
    assert_eq!(
        lines[4],
        format!(
            "pg_locks WHERE locktype = 'advisory' AND classid = {classid} AND objid = {objid} \
             AND objsubid = 1"
        )
    );
    assert_eq!(lines.len(), 5);

    let output = pglock(&["id", "--json", "leader:orders"])
        .output()
        .expect("run pglock");
    assert_eq!(output.status.code(), Some(0));
    let json: Value = serde_json::from_str(&stdout(&output)).expect("JSON");
    assert_eq!(
        json,
        serde_json::json!({
            "key": "leader:orders", "lock_id": id, "classid": classid, "objid": objid,
        })
    );
}

#[tokio::test]
async fn holders_shows_the_holder_and_its_waiters() {
    let observer = observer().await;
    let (holder_app, waiter_app) = (app_name("cli-holder"), app_name("cli-waiter"));
    let holder = common::manager_for(common::pool_named(2, &holder_app).await, &holder_app).build();
    let waiter = common::manager_for(common::pool_named(2, &waiter_app).await, &waiter_app).build();
    let key = key("cli");
    let guard = holder.acquire(&key, None).await.expect("acquire");
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.acquire(&key, Some(Duration::from_secs(60))).await }
    });
    eventually("the waiter is queued", || async {
        lock_rows(&observer, lock_id(&key)).await.len() == 2
    })
    .await;
    let rows = lock_rows(&observer, lock_id(&key)).await;
    let (holder_pid, waiter_pid) = (rows[0].pid, rows[1].pid);
    assert!(rows[0].granted && !rows[1].granted, "{rows:?}");

    // The table for one key: the lock's heading, then holder and waiter rows.
    let output = tokio::task::spawn_blocking({
        let key = key.clone();
        move || with_database(&["holders", &key])
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    let (classid, objid) = split_lock_id(lock_id(&key));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "lock {} (classid {classid}, objid {objid}), key {key:?}",
            lock_id(&key)
        )
    );
    let cells = |line: &str| -> Vec<String> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        cells(lines[1]),
        [
            "ROLE",
            "PID",
            "MODE",
            "FOR",
            "HOLDER ID",
            "APPLICATION",
            "CLIENT",
            "STATE",
            "BACKEND START"
        ]
    );
    let holder_row = cells(lines[2]);
    assert_eq!(holder_row[0], "holder");
    assert_eq!(holder_row[1], holder_pid.to_string());
    assert_eq!(holder_row[2], "exclusive");
    assert_eq!(holder_row[4], holder_app);
    assert_eq!(holder_row[5], format!("pglock:{holder_app}"));
    assert_eq!(holder_row[7], "idle");
    let waiter_row = cells(lines[3]);
    assert_eq!(waiter_row[0], "waiter 1");
    assert_eq!(waiter_row[1], waiter_pid.to_string());
    assert_eq!(waiter_row[4], waiter_app);
    assert_eq!(waiter_row[7], "active");
    assert_eq!(lines.len(), 4, "{text}");

    // Every lock of the database: ours is among them.
    let output = tokio::task::spawn_blocking(|| with_database(&["holders"]))
        .await
        .expect("join");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains(&holder_pid.to_string()), "{text}");
    assert!(text.contains(&holder_app), "{text}");
    assert!(text.contains("key unknown"), "no key named: {text}");

    // JSON: one object for one key.
    let output = tokio::task::spawn_blocking({
        let key = key.clone();
        move || with_database(&["holders", "--json", &key])
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: Value = serde_json::from_str(&stdout(&output)).expect("JSON");
    assert_eq!(json["lock_id"], lock_id(&key));
    assert_eq!(json["key"], key.as_str());
    assert_eq!(json["holders"][0]["pid"], holder_pid);
    assert_eq!(json["holders"][0]["holder_id"], holder_app.as_str());
    assert_eq!(json["holders"][0]["mode"], "exclusive");
    assert!(json["holders"][0]["held_or_waited_for_secs"].is_f64());
    assert_eq!(json["waiters"][0]["pid"], waiter_pid);
    assert_eq!(json["waiters"].as_array().map(Vec::len), Some(1));

    // By lock id, with the key named through --known-key.
    let output = tokio::task::spawn_blocking({
        let (id, key) = (lock_id(&key).to_string(), key.clone());
        move || with_database(&["holders", "--json", "--id", &id, "--known-key", &key])
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: Value = serde_json::from_str(&stdout(&output)).expect("JSON");
    assert_eq!(json["key"], key.as_str());
    assert_eq!(json["holders"][0]["pid"], holder_pid);

    assert!(guard.release().await.expect("release"));
    let next = waiting.await.expect("join").expect("the waiter takes it");
    assert!(next.release().await.expect("release"));

    let output = tokio::task::spawn_blocking({
        let key = key.clone();
        move || with_database(&["holders", &key])
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(0));
    assert!(
        stdout(&output).ends_with("\n  free: no holders, no waiters\n"),
        "{}",
        stdout(&output)
    );
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [
        &[][..],
        &["id"][..],
        &["frobnicate"][..],
        &["holders", "--id", "not-a-number"][..],
        &["holders", "some-key", "--id", "42"][..],
    ] {
        let output = pglock(args).output().expect("run pglock");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(output.stdout.is_empty(), "{args:?}");
        assert!(!output.stderr.is_empty(), "{args:?}");
    }
    let help = pglock(&["--help"]).output().expect("run pglock");
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("holders"));
}

#[test]
fn holders_without_database_url_exits_with_2_and_says_why() {
    for unset in [None, Some(""), Some("  ")] {
        let mut command = pglock(&["holders"]);
        match unset {
            None => command.env_remove("DATABASE_URL"),
            Some(empty) => command.env("DATABASE_URL", empty),
        };
        let output = command.output().expect("run pglock");
        assert_eq!(output.status.code(), Some(2), "{unset:?}");
        assert!(output.stdout.is_empty());
        assert!(
            stderr(&output).starts_with("pglock: error: DATABASE_URL is not set"),
            "{}",
            stderr(&output)
        );
    }
    let output = pglock(&["holders"])
        .env("DATABASE_URL", "not a url")
        .output()
        .expect("run pglock");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("DATABASE_URL is not a valid URL"));
}

#[test]
fn an_unreachable_database_exits_with_1() {
    let output = pglock(&["holders", "--connect-timeout", "1"])
        .env(
            "DATABASE_URL",
            "postgres://postgres:secret@127.0.0.1:1/postgres",
        )
        .output()
        .expect("run pglock");
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(output.stdout.is_empty());
    let message = stderr(&output);
    assert!(
        message.starts_with("pglock: error: cannot connect to DATABASE_URL: "),
        "{message}"
    );
    assert!(!message.contains("secret"), "never print the password");
}
