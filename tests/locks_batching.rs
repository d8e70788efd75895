//! Many locks per round trip: tries and unlocks queued on one lock session run as one
//! statement, and each caller still gets its own answer.

mod common;

use std::collections::HashSet;

use common::proxy::Proxy;
use common::{app_name, key, lock_rows, observer, pool_named};
use futures::future::join_all;
use pglock::{PostgresLockManager, lock_id};
use sqlx::postgres::PgPoolOptions;

const TRIES: usize = 200;

#[tokio::test]
async fn tries_and_unlocks_queued_on_one_session_share_round_trips_and_keep_their_answers() {
    let observer = observer().await;
    let proxy = Proxy::start().await;
    let app = app_name("batching");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(proxy.options(&app))
        .await
        .expect("connect through the proxy");
    let locks = common::manager_for(pool, &app)
        .lock_sessions(1)
        .lock_budget(1_000)
        .build();
    // Opens the one lock session, so every try below queues on it.
    let warm = locks
        .acquire(key("batching-warm"), None)
        .await
        .expect("acquire");
    let rival = PostgresLockManager::new(pool_named(2, &app_name("batching-rival")).await);
    let keys: Vec<String> = (0..TRIES).map(|n| key(&format!("batching-{n}"))).collect();
    // Every tenth key is held elsewhere: those tries must be refused, the others granted.
    let mut elsewhere = Vec::new();
    for key in keys.iter().step_by(10) {
        elsewhere.push(rival.acquire(key, None).await.expect("acquire"));
    }

    let before = proxy.client_writes();
    let answers = join_all(keys.iter().map(|key| locks.try_acquire(key))).await;
    let writes = proxy.client_writes() - before;
    let mut guards = Vec::new();
    for (n, answer) in answers.into_iter().enumerate() {
        let answer = answer.expect("a try gets an answer, not an error");
        let guard = answer.into_handle();
        assert_eq!(guard.is_none(), n % 10 == 0, "key {n}: {guard:?}");
        guards.extend(guard);
    }
    println!("{TRIES} tries queued at once: {writes} round trips");
    assert!(
        writes <= (TRIES / 10) as u64,
        "{writes} round trips for {TRIES} tries"
    );
    // The server agrees, key by key: held by the one lock session, or by the rival.
    let mut pids = HashSet::new();
    for (n, key) in keys.iter().enumerate() {
        let rows = lock_rows(&observer, lock_id(key)).await;
        assert_eq!(rows.len(), 1, "key {n}");
        if n % 10 != 0 {
            pids.insert(rows[0].pid);
        }
    }
    assert_eq!(pids.len(), 1, "on one lock session");

    let before = proxy.client_writes();
    let released = join_all(guards.into_iter().map(|guard| guard.release())).await;
    let writes = proxy.client_writes() - before;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    println!(
        "{} releases queued at once: {writes} round trips",
        released.len()
    );
    assert!(
        writes <= (TRIES / 10) as u64,
        "{writes} round trips for the releases"
    );
    for (n, key) in keys.iter().enumerate() {
        let held = lock_rows(&observer, lock_id(key)).await.len();
        assert_eq!(held, usize::from(n % 10 == 0), "key {n}");
    }
    warm.release().await.expect("release");
    for guard in elsewhere {
        guard.release().await.expect("release");
    }
}
