//! How long a holder has held its lock, as `pglock::inspect` reports it: the true age of an
//! exclusive holder fenced with the inspector's fencing table, however busy its lock session;
//! a lower bound, flagged as such, for the others. Bounds are the test's own `Instant`s
//! around the acquisitions and the inspection.

mod common;

use std::time::Duration;

use common::{
    eventually_waiting, hold, hold_shared, keep_busy, key, observer, one_session_manager,
    unique_fencing_table,
};
use pglock::inspect::{Age, Inspector, Session};
use pglock::lock_id;
use tokio::time::Instant;

/// Long enough that a lower bound reset by later statements is far below the true age.
const LATER: Duration = Duration::from_millis(300);

/// The one holder of `key`, inspected between two instants of the test.
async fn holder(inspector: &Inspector, key: &str) -> (Session, Instant, Instant) {
    let before = Instant::now();
    let report = inspector.key(key).await.expect("inspect");
    let after = Instant::now();
    assert_eq!(report.holders.len(), 1, "{report:?}");
    (report.holders[0].clone(), before, after)
}

fn held_for(session: &Session) -> Duration {
    session
        .held_or_waited_for
        .unwrap_or_else(|| panic!("an age for {session:?}"))
}

/// Asserts that `session`'s age is the true one for a lock taken between `taking` and `taken`
/// and inspected between `before` and `after`.
fn assert_true_age(session: &Session, taking: Instant, taken: Instant, window: (Instant, Instant)) {
    let (before, after) = window;
    assert_eq!(session.age, Some(Age::Exact), "{session:?}");
    let (at_least, at_most) = (before - taken, after - taking);
    let age = held_for(session);
    assert!(
        age >= at_least && age <= at_most,
        "held for {age:?}, outside the true [{at_least:?}, {at_most:?}]: {session:?}"
    );
}

#[tokio::test]
async fn a_fenced_holder_shows_its_true_age_an_unfenced_one_a_lower_bound() {
    let observer = observer().await;
    let table = unique_fencing_table();
    let (fenced, _) = one_session_manager("ages-fenced", Some(&table)).await;
    let (plain, _) = one_session_manager("ages-plain", None).await;
    let (a, b, c, d, s) = (key("a"), key("b"), key("c"), key("d"), key("s"));

    let taking_a = Instant::now();
    hold(&fenced, a.as_str()).await;
    hold(&plain, c.as_str()).await;
    let taken_a = Instant::now();
    // Later, on the same sessions: more statements, B, a shared lock, D.
    keep_busy(&fenced, taken_a, LATER).await;
    let taking_b = Instant::now();
    hold(&fenced, b.as_str()).await;
    let taken_b = Instant::now();
    hold_shared(&fenced, s.as_str()).await;
    hold(&plain, d.as_str()).await;
    let plain_busy = Instant::now();
    keep_busy(&plain, plain_busy, Duration::ZERO).await;

    let inspector = Inspector::new(observer.clone()).fencing_table(table.clone());
    let (holder_a, before, after) = holder(&inspector, &a).await;
    assert_true_age(&holder_a, taking_a, taken_a, (before, after));
    assert!(held_for(&holder_a) >= LATER);
    let (holder_b, before, after) = holder(&inspector, &b).await;
    assert_true_age(&holder_b, taking_b, taken_b, (before, after));
    assert_eq!(holder_a.pid, holder_b.pid, "A and B share a lock session");

    // The unfenced holder of C: a lower bound from its session's latest statement, far below
    // the true age, and flagged.
    let (holder_c, _, after) = holder(&inspector, &c).await;
    assert_eq!(holder_c.age, Some(Age::AtLeast), "{holder_c:?}");
    assert!(
        held_for(&holder_c) <= after - plain_busy && held_for(&holder_c) < LATER,
        "a lower bound from the latest statement: {holder_c:?}"
    );
    // A sharer of the fenced manager keeps its lower bound.
    let (sharer, _, _) = holder(&inspector, &s).await;
    assert_eq!(sharer.age, Some(Age::AtLeast), "{sharer:?}");

    // Without the table, or with one that does not exist, A's age is a lower bound too.
    for inspector in [
        Inspector::new(observer.clone()),
        Inspector::new(observer.clone()).fencing_table(unique_fencing_table()),
    ] {
        let (holder_a, _, _) = holder(&inspector, &a).await;
        assert_eq!(holder_a.age, Some(Age::AtLeast), "{holder_a:?}");
        assert!(held_for(&holder_a) < LATER, "{holder_a:?}");
    }
    // Every lock of the database, at once: the same ages.
    let reports = inspector.all().await.expect("inspect");
    let of = |key: &str| {
        let id = lock_id(key);
        let report = reports.iter().find(|r| r.lock_id == id).expect("listed");
        report.holders[0].age
    };
    assert_eq!((of(&a), of(&c)), (Some(Age::Exact), Some(Age::AtLeast)));
    fenced.release_all().await.expect("release_all");
    plain.release_all().await.expect("release_all");
}

#[tokio::test]
async fn a_waited_for_lock_counts_from_its_grant_not_from_the_wait() {
    let observer = observer().await;
    let table = unique_fencing_table();
    let (blocker, _) = one_session_manager("ages-blocker", None).await;
    let (waiter, _) = one_session_manager("ages-waiter", Some(&table)).await;
    let key = key("waited");
    hold(&blocker, key.as_str()).await;
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.acquire(&key, Some(Duration::from_secs(60))).await }
    });
    eventually_waiting("the fenced manager waits", &observer, &key).await;
    keep_busy(&blocker, Instant::now(), LATER).await;
    let releasing = Instant::now();
    blocker.release(key.as_str()).await.expect("release");
    let guard = waiting.await.expect("join").expect("granted");
    let granted = Instant::now();

    let inspector = Inspector::new(observer.clone()).fencing_table(table);
    let (session, before, after) = holder(&inspector, &key).await;
    assert_true_age(&session, releasing, granted, (before, after));
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_grant_time_from_before_the_holders_session_is_not_its_own() {
    let observer = observer().await;
    let table = unique_fencing_table();
    let (fenced, _) = one_session_manager("ages-earlier", Some(&table)).await;
    let key = key("corner");
    // A fenced holder writes the row, and lets go.
    hold(&fenced, key.as_str()).await;
    fenced.release(key.as_str()).await.expect("release");
    // An unfenced manager whose session connects afterwards takes the key: the row's time is
    // not its grant, and the check tells, since it predates the session.
    let (plain, _) = one_session_manager("ages-later", None).await;
    hold(&plain, key.as_str()).await;
    let inspector = Inspector::new(observer.clone()).fencing_table(table);
    let (session, _, _) = holder(&inspector, &key).await;
    assert_eq!(session.age, Some(Age::AtLeast), "{session:?}");
    plain.release(key.as_str()).await.expect("release");
}
