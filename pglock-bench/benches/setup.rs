//! What a manager's first lock costs: the lock session's set-up, and (from 0.4) the proof that
//! the server's advisory locks exclude, made once per manager.
//!
//! `cargo bench -p pglock-bench --bench setup` (against `DATABASE_URL`, or a throwaway server)
//! times, over 40 reps each:
//!
//! * `connect`: one new connection, the floor of the proof (it opens a second session);
//! * `first lock`: a new manager's first `acquire` and `release`, on a pool with no connection
//!   open yet;
//! * `next lock`: the same manager's second `acquire` and `release`;
//! * `check_server`: `PostgresLockManager::check_server()` on a new manager (skipped with
//!   `--no-check`, for versions without it).
//!
//! Each line printed is one JSON object: `{"step": ..., "median_us": ..., "p90_us": ...}`.

use std::time::{Duration, Instant};

use pglock::PostgresLockManager;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};

const REPS: usize = 40;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let check = !std::env::args().any(|a| a == "--no-check");
    let url = pglock_testing::database_url();
    let fresh = || {
        PgPoolOptions::new()
            .max_connections(4)
            .min_connections(0)
            .connect_lazy(url)
            .expect("a pool")
    };
    let (mut connect, mut first, mut next, mut checks) = (vec![], vec![], vec![], vec![]);
    for rep in 0..REPS {
        let started = Instant::now();
        let conn = PgConnection::connect(url).await.expect("connect");
        connect.push(started.elapsed());
        conn.close().await.expect("close");

        let pool = fresh();
        let locks = PostgresLockManager::new(pool.clone());
        let key = format!("pglock-bench:setup:{rep}");
        let started = Instant::now();
        let guard = locks.acquire(key.as_str(), None).await.expect("first lock");
        guard.release().await.expect("release");
        first.push(started.elapsed());
        let started = Instant::now();
        let guard = locks.acquire(key.as_str(), None).await.expect("next lock");
        guard.release().await.expect("release");
        next.push(started.elapsed());
        pool.close().await;

        if check {
            let pool = fresh();
            checks.push(check_server(&pool).await);
            pool.close().await;
        }
    }
    report("connect", &mut connect);
    report("first lock", &mut first);
    report("next lock", &mut next);
    if check {
        report("check_server", &mut checks);
    }
}

/// The time `check_server` takes on a new manager of `pool`.
async fn check_server(pool: &sqlx::PgPool) -> Duration {
    let started = Instant::now();
    PostgresLockManager::new(pool.clone())
        .check_server()
        .await
        .expect("the server passes");
    started.elapsed()
}

fn report(step: &str, sorted: &mut [Duration]) {
    sorted.sort();
    let at = |share: usize| sorted[(sorted.len() * share).div_ceil(100).saturating_sub(1)];
    println!(
        "{{\"step\": \"{step}\", \"median_us\": {}, \"p90_us\": {}}}",
        at(50).as_micros(),
        at(90).as_micros()
    );
}
