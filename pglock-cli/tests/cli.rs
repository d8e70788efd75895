//! The `pglock` binary, run as a user would: `id`, `holders` (filters, `--watch`, the exit
//! status that says held or free), `--database-url`, usage errors, and the exit statuses the
//! help documents. `run` and `terminate` have files of their own.

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use common::cli::{Lines, exit_code, output, pglock, pglock_on_db, signal, stderr, stdout};
use common::{app_name, eventually, key, lock_rows, observer};
use pglock::inspect::Inspector;
use pglock::{lock_id, split_lock_id};
use serde_json::Value;

/// Runs the command against the test database.
fn with_database(args: &[&str]) -> Output {
    pglock_on_db(args).output().expect("run pglock")
}

#[test]
fn id_prints_the_lock_id_and_its_pg_locks_halves() {
    let output = pglock(&["id", "leader:orders"])
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

    guard.release().await.expect("release");
    let next = waiting.await.expect("join").expect("the waiter takes it");
    next.release().await.expect("release");

    let output = tokio::task::spawn_blocking({
        let key = key.clone();
        move || with_database(&["holders", &key])
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(3), "free");
    assert!(
        stdout(&output).ends_with("\n  free: no holders, no waiters\n"),
        "{}",
        stdout(&output)
    );
}

#[tokio::test]
async fn holders_shows_two_integer_keys_by_pair() {
    let app = app_name("cli-pair");
    let holder = common::manager_for(common::pool_named(2, &app).await, &app).build();
    // A pair of its own, and a bigint lock with the same halves, which is another lock. The
    // first half negative: `--pair -5,7` is a value, not a flag.
    let (a, b) = (-(random_i32() & 0x3fff_ffff) - 1, random_i32());
    let pair = pglock::LockKey::pair(a, b);
    let guard = holder.acquire(pair, None).await.expect("acquire the pair");
    let (pair_arg, twin) = (
        format!("{a},{b}"),
        pglock::LockTarget::IntPair(a, b).packed(),
    );
    let output = tokio::task::spawn_blocking({
        let pair_arg = pair_arg.clone();
        move || with_database(&["holders", "--json", "--pair", &pair_arg])
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let json: Value = serde_json::from_str(&stdout(&output)).expect("JSON");
    assert_eq!(json["pair"], serde_json::json!([a, b]));
    assert_eq!(json["objsubid"], 2);
    assert_eq!(json["holders"][0]["holder_id"], app.as_str());

    // Listed among every lock, as the pair it is; the bigint lock with its halves is free.
    let output = tokio::task::spawn_blocking(|| with_database(&["holders"]))
        .await
        .expect("join");
    let text = stdout(&output);
    assert!(
        text.contains(&format!("lock pair ({a}, {b}) (objsubid 2)")),
        "{text}"
    );
    let output =
        tokio::task::spawn_blocking(move || with_database(&["holders", "--id", &twin.to_string()]))
            .await
            .expect("join");
    assert_eq!(output.status.code(), Some(3), "{}", stdout(&output));
    guard.release().await.expect("release");
    let output =
        tokio::task::spawn_blocking(move || with_database(&["holders", "--pair", &pair_arg]))
            .await
            .expect("join");
    assert_eq!(output.status.code(), Some(3), "free once released");
}

/// A random 32-bit integer, so concurrent runs do not share pairs.
fn random_i32() -> i32 {
    i32::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..4]
            .try_into()
            .expect("4 bytes"),
    )
}

#[test]
fn usage_errors_exit_with_2() {
    for args in [
        &[][..],
        &["id"][..],
        &["frobnicate"][..],
        &["holders", "--id", "not-a-number"][..],
        &["holders", "some-key", "--id", "42"][..],
        &["holders", "--pair", "1"][..],
        &["holders", "--pair", "1,x"][..],
        &["holders", "--pair", "1,2", "--id", "42"][..],
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
        message.starts_with("pglock: error: cannot connect to the database: "),
        "{message}"
    );
    assert!(!message.contains("secret"), "never print the password");
}

#[test]
fn help_documents_every_exit_status() {
    let help = pglock(&["--help"]).output().expect("run pglock");
    assert_eq!(help.status.code(), Some(0));
    let text = stdout(&help);
    for line in [
        "Exit status:",
        "  0      success",
        "  1      runtime failure",
        "  2      usage error",
        "  3      holders: no matching lock is held (free)",
        "  4      terminate: declined at the prompt",
        "  75     run: the lock is held elsewhere",
        "  76     run: the lock was lost while the command ran",
        "  126    run: the command could not be executed",
        "  127    run: the command was not found",
        "  other  run: the command's exit status, or 128+N",
    ] {
        assert!(text.contains(line), "--help lacks {line:?}:\n{text}");
    }
    for command in ["holders", "run", "terminate"] {
        let help = pglock(&[command, "--help"]).output().expect("run pglock");
        assert!(stdout(&help).contains("Exit status:"), "{command} --help");
    }
}

#[test]
fn new_usage_errors_exit_with_2() {
    for args in [
        &["run", "k"][..],
        &["run", "k", "--timeout", "soon", "--", "true"][..],
        &["run", "k", "--no-wait", "--timeout", "1s", "--", "true"][..],
        &["holders", "--watch", "not-a-duration"][..],
        &["holders", "--older-than", "5 weeks"][..],
        &["terminate"][..],
    ] {
        let output = pglock_on_db(args).output().expect("run pglock");
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(output.stdout.is_empty(), "{args:?}");
        assert!(!output.stderr.is_empty(), "{args:?}");
    }
}

#[tokio::test]
async fn database_url_comes_from_the_flag_before_the_environment() {
    let key = key("cli-url");
    // The flag alone.
    let out = output(pglock(&["holders", &key, "--database-url", common::url()])).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // The flag wins over an unusable DATABASE_URL.
    let mut command = pglock(&["--database-url", common::url(), "holders", &key]);
    command.env("DATABASE_URL", "postgres://nobody:secret@127.0.0.1:1/none");
    let out = output(command).await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    // A bad flag is a usage error, and says which source was bad.
    let out = output(pglock_on_db(&["holders", "--database-url", "not a url"])).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--database-url is not a valid URL"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn the_exit_status_says_held_or_free_and_filters_pick_sessions() {
    let observer = observer().await;
    let app = app_name("cli-filter");
    let locks = common::manager_for(common::pool_named(2, &app).await, &app).build();
    let key = key("cli-filter");
    let run = |args: Vec<String>| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        output(pglock_on_db(&args)).await
    };
    let args = |extra: &[&str]| -> Vec<String> {
        ["holders", key.as_str()]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };

    assert_eq!(run(args(&[])).await.status.code(), Some(3), "free");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    assert_eq!(run(args(&[])).await.status.code(), Some(0), "held");

    // --holder: a pattern over the holder id.
    let pattern = format!("{}*", &app[..app.len() - 4]);
    let out = run(args(&["--holder", &pattern])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains(&app), "{}", stdout(&out));
    let out = run(args(&["--holder", "someone-else-*"])).await;
    assert_eq!(out.status.code(), Some(3));
    assert!(
        stdout(&out).ends_with("  free of matching sessions\n"),
        "{}",
        stdout(&out)
    );

    // --older-than: only holds at least that long (as far as the server can tell).
    let inspector = Inspector::new(observer.clone());
    eventually("the hold is 300 ms old", || async {
        let report = inspector.key(&key).await.expect("inspect");
        report.holders[0].held_or_waited_for >= Some(Duration::from_millis(300))
    })
    .await;
    assert_eq!(
        run(args(&["--older-than", "300ms"])).await.status.code(),
        Some(0)
    );
    assert_eq!(
        run(args(&["--older-than", "1h"])).await.status.code(),
        Some(3)
    );

    // Every lock of the database, filtered: ours alone, or nothing.
    let all = |extra: &[&str]| -> Vec<String> {
        ["holders", "--json"]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };
    let out = run(all(&["--holder", &app])).await;
    assert_eq!(out.status.code(), Some(0));
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let locks_shown: Vec<i64> = json
        .as_array()
        .expect("an array")
        .iter()
        .map(|lock| lock["lock_id"].as_i64().expect("id"))
        .collect();
    assert_eq!(locks_shown, [lock_id(&key)]);
    let out = run(all(&["--holder", "someone-else-*"])).await;
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(stdout(&out), "[]\n");
    let out = run(vec![
        "holders".into(),
        "--holder".into(),
        "someone-else-*".into(),
    ])
    .await;
    assert_eq!(
        stdout(&out),
        "no advisory lock held or awaited by a matching session\n"
    );

    guard.release().await.expect("release");
    assert_eq!(run(args(&[])).await.status.code(), Some(3), "free again");
}

#[tokio::test]
async fn watch_follows_the_lock_until_interrupted() {
    let app = app_name("cli-watch");
    let locks = common::manager_for(common::pool_named(2, &app).await, &app).build();
    let key = key("cli-watch");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let mut watcher = pglock_on_db(&["holders", &key, "--json", "--watch", "100ms"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the watch");
    let lines = Lines::stdout(&mut watcher);
    let holders = |line: &str| -> usize {
        let json: Value = serde_json::from_str(line).expect("one JSON object per line");
        json["holders"].as_array().expect("holders").len()
    };
    let first = lines.next().expect("a first look");
    assert_eq!(holders(&first), 1, "{first}");
    guard.release().await.expect("release");
    lines.until("a look that finds the lock free", |line| holders(line) == 0);
    signal(&watcher, rustix::process::Signal::TERM);
    assert_eq!(exit_code(watcher).await, Some(3), "the last look was free");

    // Interrupted while the lock is held, it exits 0.
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let mut watcher = pglock_on_db(&["holders", &key, "--watch=50ms"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the watch");
    let lines = Lines::stdout(&mut watcher);
    let heading = lines.until("a look", |line| line.starts_with("-- "));
    assert!(
        heading.ends_with(", every 50ms; Ctrl-C to stop"),
        "{heading}"
    );
    lines.until("the holder's row", |line| line.contains(&app));
    signal(&watcher, rustix::process::Signal::INT);
    assert_eq!(exit_code(watcher).await, Some(0), "the last look was held");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn holders_and_terminate_name_pg_catalog_whatever_the_search_path() {
    // Behind a search_path whose first schema shadows every pg_catalog name the command might
    // use with one that fails, it lists and ends holders as usual.
    let admin = common::pool_named(1, &app_name("cli-admin")).await;
    let schema = pglock_testing::search_path::shadowing(&admin)
        .await
        .expect("shadows");
    let separator = if common::url().contains('?') {
        '&'
    } else {
        '?'
    };
    let hostile = format!(
        "{}{separator}options=-c%20search_path%3D{schema}%2Cpg_catalog%2Cpublic",
        common::url()
    );
    let app = app_name("cli-hostile-holder");
    let holder = common::manager_for(common::pool_named(2, &app).await, &app).build();
    let key = key("cli-hostile");
    let guard = holder.acquire(&key, None).await.expect("acquire");
    let run = |args: Vec<String>| {
        let hostile = hostile.clone();
        tokio::task::spawn_blocking(move || {
            let mut command = pglock(&args.iter().map(String::as_str).collect::<Vec<_>>());
            command
                .env("DATABASE_URL", hostile)
                .output()
                .expect("run pglock")
        })
    };
    let shown = run(vec!["holders".into(), "--json".into(), key.clone()])
        .await
        .expect("join");
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let json: Value = serde_json::from_str(&stdout(&shown)).expect("JSON");
    assert_eq!(json["holders"][0]["holder_id"], app.as_str());
    let ended = run(vec!["terminate".into(), key.clone(), "--yes".into()])
        .await
        .expect("join");
    assert_eq!(ended.status.code(), Some(0), "{}", stderr(&ended));
    eventually("the holder's session is gone", || async {
        guard.loss_signal().is_lost()
            || lock_rows(&observer().await, lock_id(&key)).await.is_empty()
    })
    .await;
    pglock_testing::search_path::drop(&admin, &schema)
        .await
        .expect("drop");
}
