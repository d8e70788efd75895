//! `pglock holders --fencing-table`: the true age of a fenced exclusive holder, and `>=` before
//! a lower bound, in the table and in JSON; what `--older-than` compares, and that `terminate`
//! reads no fencing table unless told; a missing table is no failure, a malformed name a usage
//! error.

mod common;

use std::time::Duration;

use common::cli::{output, pglock_on_db, stderr, stdout};
use common::{hold, keep_busy, key, one_session_manager, unique_fencing_table_name};
use pglock::FencingTable;
use serde_json::Value;
use tokio::time::Instant;

/// Long enough that a lower bound reset by later statements is far below the true age.
const LATER: Duration = Duration::from_millis(300);

/// Runs `pglock holders KEY` with `extra` arguments.
async fn holders(key: &str, extra: &[&str]) -> std::process::Output {
    let args: Vec<&str> = ["holders", key].iter().chain(extra).copied().collect();
    output(pglock_on_db(&args)).await
}

/// The FOR cell of the table's one holder row.
async fn for_cell(key: &str, extra: &[&str]) -> String {
    let out = holders(key, extra).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|line| line.trim_start().starts_with("holder "))
        .unwrap_or_else(|| panic!("a holder row: {text}"));
    let cells: Vec<&str> = row
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    cells[3].to_owned()
}

/// The one holder of the JSON report.
async fn json_holder(key: &str, extra: &[&str]) -> Value {
    let extra: Vec<&str> = ["--json"].iter().chain(extra).copied().collect();
    let out = holders(key, &extra).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    json["holders"][0].clone()
}

#[tokio::test]
async fn holders_shows_true_ages_and_marks_lower_bounds() {
    // The default table, which `holders` reads unless told otherwise and `terminate` does not.
    let name = FencingTable::DEFAULT_NAME.to_owned();
    let table = FencingTable::default();
    let (fenced, _) = one_session_manager("cli-ages-fenced", Some(&table)).await;
    let (plain, _) = one_session_manager("cli-ages-plain", None).await;
    let (a, c) = (key("cli-fenced"), key("cli-plain"));
    hold(&fenced, a.as_str()).await;
    hold(&plain, c.as_str()).await;
    let taken = Instant::now();
    keep_busy(&fenced, taken, LATER).await;
    keep_busy(&plain, taken, LATER).await;
    let with_table = ["--fencing-table", name.as_str()];

    // A: exact, at least as old as the time since it was taken.
    let cell = for_cell(&a, &with_table).await;
    assert!(!cell.starts_with(">="), "an exact age: {cell}");
    let asking = Instant::now();
    let holder = json_holder(&a, &with_table).await;
    assert_eq!(holder["age"], "exact", "{holder}");
    let secs = holder["held_or_waited_for_secs"].as_f64().expect("secs");
    assert!(secs >= (asking - taken).as_secs_f64(), "{holder}");
    // C, whose manager does not fence: a lower bound, marked.
    let cell = for_cell(&c, &with_table).await;
    assert!(cell.starts_with(">="), "a lower bound: {cell}");
    assert_eq!(json_holder(&c, &with_table).await["age"], "at_least");

    // --older-than compares what is shown: A's true age passes, C's lower bound does not,
    // though C was taken with A.
    let older = ["--older-than", "300ms", "--fencing-table", name.as_str()];
    assert_eq!(holders(&a, &older).await.status.code(), Some(0));
    // C's lower bound has been growing since its session's last statement: a statement now
    // restarts it, as a busy lock session's would.
    keep_busy(&plain, Instant::now(), Duration::ZERO).await;
    assert_eq!(holders(&c, &older).await.status.code(), Some(3));

    // terminate trusts a fencing table only when told to: without one, A's age is a lower
    // bound, restarted by its session's latest statement, and A is not old enough to end.
    keep_busy(&fenced, Instant::now(), Duration::ZERO).await;
    let out = output(pglock_on_db(&[
        "terminate",
        &a,
        "--older-than",
        "300ms",
        "--yes",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    // A table that does not exist is no failure: lower bounds.
    let missing = unique_fencing_table_name();
    let cell = for_cell(&a, &["--fencing-table", &missing]).await;
    assert!(cell.starts_with(">="), "{cell}");
    // A name that is no table name is a usage error.
    let out = holders(&a, &["--fencing-table", "a.b.c"]).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    fenced.release_all().await.expect("release_all");
    plain.release_all().await.expect("release_all");
}
