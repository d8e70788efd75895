//! Many tasks waiting for keys another process holds, on sqlx's default pool shared with the
//! application: the application keeps its pool, the manager stays within its connection cap,
//! and each waiter is granted promptly once its key is free, whoever held it.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::child::{Reaped, instruction, role};
use common::clock::now_us;
use pglock::{PostgresLockManager, lock_id};
use rustix::process::{Pid, Signal, kill_process};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;

const ROLE: &str = "pglock-waits-holder=";
/// How far apart the holder releases its keys.
const RELEASE_EVERY: Duration = Duration::from_millis(25);
/// The bound on a grant after a pglock release (it notifies): the p99 target.
const NOTIFIED_P99: Duration = Duration::from_millis(100);
/// The documented bound after a release that sends no notification: one poll interval (the
/// default, 250 ms), plus room for the server to notice a killed client, a round trip and a
/// busy two-core machine.
const POLLED_BOUND: Duration = Duration::from_millis(250 + 500);
/// The manager's default connection cap.
const CAP: i64 = 4;

/// The keys of one run.
fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}:{i}")).collect()
}

/// A shuffled `0..n` (xorshift seeded from the clock: any order will do, and each run differs).
fn shuffled(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut x = now_us() | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

/// The holder process: takes every key, says so, and on "release" lets them go one every
/// [`RELEASE_EVERY`] in random order, printing each key's index and when its release began.
/// On "hold" it keeps them until it is killed.
async fn act_as_holder(spec: &str) {
    let (prefix, n) = spec.split_once('|').expect("prefix|n");
    let n: usize = n.parse().expect("n");
    let locks = PostgresLockManager::builder(common::pool(4).await)
        .holder_id(format!("waits-holder-{}", std::process::id()))
        .lock_budget(n + 10)
        .build();
    let mut guards = Vec::new();
    for key in keys(prefix, n) {
        guards.push(Some(
            locks
                .try_acquire(&key)
                .await
                .expect("try")
                .into_handle()
                .expect("free"),
        ));
    }
    println!("\nHELD");
    if instruction() != "release" {
        std::future::pending::<()>().await;
    }
    let mut next = tokio::time::Instant::now();
    for i in shuffled(n) {
        tokio::time::sleep_until(next).await;
        next += RELEASE_EVERY;
        let guard = guards[i].take().expect("held once");
        let at = now_us();
        guard.release().await.expect("release");
        println!("\nREL {i} {at}");
    }
    println!("\nREL END");
}

/// The waiting side: `n` tasks each acquire their key on `locks` (no deadline but a
/// generous one) and report when they were granted; the application's own queries run on
/// `pool` meanwhile. Returns each key's grant time, once every key is granted.
struct Waiters {
    grants: mpsc::UnboundedReceiver<(usize, u64)>,
    n: usize,
}

impl Waiters {
    fn start(locks: &PostgresLockManager, prefix: &str, n: usize) -> Waiters {
        let (tx, grants) = mpsc::unbounded_channel();
        for (i, key) in keys(prefix, n).into_iter().enumerate() {
            let (locks, tx) = (locks.clone(), tx.clone());
            tokio::spawn(async move {
                let guard = locks
                    .acquire(&key, Some(Duration::from_secs(120)))
                    .await
                    .expect("acquire");
                let at = now_us();
                guard.release().await.expect("release");
                let _ = tx.send((i, at));
            });
        }
        Waiters { grants, n }
    }

    async fn all(mut self) -> HashMap<usize, u64> {
        let mut granted = HashMap::new();
        while granted.len() < self.n {
            let (i, at) = common::within("every waiter granted", self.grants.recv())
                .await
                .expect("a waiter failed");
            granted.insert(i, at);
        }
        granted
    }
}

/// The manager's connections to the server, by its `application_name` tag.
async fn tagged_connections(observer: &PgPool, holder: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1")
        .bind(format!("pglock:{holder}"))
        .fetch_one(observer)
        .await
        .expect("pg_stat_activity")
}

/// How many waits the manager has flagged on the server (each a shared lock in the
/// two-integer namespace, held by its listener).
async fn flags(observer: &PgPool, holder: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ShareLock' \
         AND a.application_name = $1",
    )
    .bind(format!("pglock:{holder}"))
    .fetch_one(observer)
    .await
    .expect("pg_locks")
}

/// Until every waiter waits: one in the server's queue per wait session, the rest flagged.
async fn until_all_wait(observer: &PgPool, holder: &str, n: usize) {
    common::eventually("every waiter is waiting", || async {
        flags(observer, holder).await >= n as i64 - (CAP - 3)
    })
    .await;
}

/// The application's checks while the waits last: its query on the shared pool answers
/// within the 50 ms, and the manager's connections stay within its cap. Returns the
/// slowest answer.
async fn application_keeps_its_pool(pool: &PgPool, observer: &PgPool, holder: &str) -> Duration {
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = tokio::time::Instant::now();
        let one: i32 = sqlx::query_scalar("SELECT 1")
            .fetch_one(pool)
            .await
            .expect("the application's query");
        assert_eq!(one, 1);
        slowest = slowest.max(started.elapsed());
        let open = tagged_connections(observer, holder).await;
        assert!(
            open <= CAP,
            "the manager has {open} connections, over its cap of {CAP}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        slowest < Duration::from_millis(50),
        "the application waited {slowest:?} for its query"
    );
    slowest
}

/// Percentiles of `latencies`, in milliseconds.
fn percentiles(mut latencies: Vec<Duration>) -> (f64, f64, f64) {
    latencies.sort();
    let at = |q: f64| {
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    (at(0.5), at(0.99), at(1.0))
}

/// sqlx's default pool (10 connections), tagged so its sessions can be told apart.
async fn default_pool(app: &str) -> PgPool {
    PgPoolOptions::new()
        .connect_with(common::options(app))
        .await
        .expect("connect")
}

async fn released_by_pglock(test: &str, n: usize) {
    let prefix = common::key("waits");
    let (mut holder, output) = Reaped::spawn(test, ROLE, &format!("{prefix}|{n}"));
    output.until("HELD");
    let observer = common::observer().await;
    let app = common::app_name("waits-app");
    let pool = default_pool(&app).await;
    let locks = common::manager_for(pool.clone(), &app).build();
    let waiters = Waiters::start(&locks, &prefix, n);
    until_all_wait(&observer, &app, n).await;
    let slowest = application_keeps_its_pool(&pool, &observer, &app).await;
    holder.tell("release");
    let checks = application_keeps_its_pool(&pool, &observer, &app);
    let (slowest_releasing, granted) = tokio::join!(checks, waiters.all());
    let mut released = HashMap::new();
    loop {
        let line = output.until("REL ");
        let rest = line.split("REL ").nth(1).expect("REL").trim();
        if rest == "END" {
            break;
        }
        let (i, at) = rest.split_once(' ').expect("REL i at");
        released.insert(i.parse::<usize>().unwrap(), at.parse::<u64>().unwrap());
    }
    assert_eq!(released.len(), n, "the holder released every key");
    let latencies: Vec<Duration> = (0..n)
        .map(|i| Duration::from_micros(granted[&i].saturating_sub(released[&i])))
        .collect();
    let (p50, p99, max) = percentiles(latencies);
    println!(
        "{n} waiters, pglock holder: grant after release p50 {p50:.1} ms, p99 {p99:.1} ms, \
         max {max:.1} ms; the application's query at most {:?} / {:?}",
        slowest, slowest_releasing
    );
    assert!(
        p99 <= NOTIFIED_P99.as_secs_f64() * 1000.0,
        "p99 {p99:.1} ms after a notified release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_waiters_keep_the_pool_free_and_are_granted_promptly() {
    if let Some(spec) = role(ROLE) {
        return act_as_holder(&spec).await;
    }
    released_by_pglock(
        "sixty_four_waiters_keep_the_pool_free_and_are_granted_promptly",
        64,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fifty_six_waiters_keep_the_pool_free_and_are_granted_promptly() {
    if let Some(spec) = role(ROLE) {
        return act_as_holder(&spec).await;
    }
    released_by_pglock(
        "two_hundred_fifty_six_waiters_keep_the_pool_free_and_are_granted_promptly",
        256,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_killed_holder_are_granted_within_the_poll_bound() {
    if let Some(spec) = role(ROLE) {
        return act_as_holder(&spec).await;
    }
    let n = 64;
    let prefix = common::key("waits-killed");
    let (holder, output) = Reaped::spawn(
        "waiters_on_a_killed_holder_are_granted_within_the_poll_bound",
        ROLE,
        &format!("{prefix}|{n}"),
    );
    output.until("HELD");
    let observer = common::observer().await;
    let app = common::app_name("waits-killed");
    let pool = default_pool(&app).await;
    let locks = common::manager_for(pool.clone(), &app).build();
    let waiters = Waiters::start(&locks, &prefix, n);
    until_all_wait(&observer, &app, n).await;
    application_keeps_its_pool(&pool, &observer, &app).await;
    let killed = now_us();
    kill_process(Pid::from_child(&holder.0), Signal::KILL).expect("kill the holder");
    let granted = waiters.all().await;
    let latest = Duration::from_micros(granted.values().max().unwrap() - killed);
    println!("{n} waiters, killed holder: the last granted {latest:?} after the kill");
    assert!(latest <= POLLED_BOUND, "granted {latest:?} after the kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_a_plain_sql_holder_are_granted_within_the_poll_bound() {
    let n = 64;
    let prefix = common::key("waits-plain");
    let holder = common::pool(1).await;
    let mut conn = holder.acquire().await.expect("connect");
    let ids: Vec<i64> = keys(&prefix, n).iter().map(|k| lock_id(k)).collect();
    sqlx::query("SELECT count(pg_advisory_lock(id)) FROM unnest($1::int8[]) AS t(id)")
        .bind(&ids)
        .execute(&mut *conn)
        .await
        .expect("hold");
    let observer = common::observer().await;
    let app = common::app_name("waits-plain");
    let pool = default_pool(&app).await;
    let locks = common::manager_for(pool.clone(), &app).build();
    let waiters = Waiters::start(&locks, &prefix, n);
    until_all_wait(&observer, &app, n).await;
    let mut released = HashMap::new();
    let mut next = tokio::time::Instant::now();
    for i in shuffled(n) {
        tokio::time::sleep_until(next).await;
        next += RELEASE_EVERY;
        released.insert(i, now_us());
        let unlocked: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
            .bind(ids[i])
            .fetch_one(&mut *conn)
            .await
            .expect("unlock");
        assert!(unlocked);
    }
    let granted = waiters.all().await;
    let latencies: Vec<Duration> = (0..n)
        .map(|i| Duration::from_micros(granted[&i].saturating_sub(released[&i])))
        .collect();
    let (p50, p99, max) = percentiles(latencies);
    println!(
        "{n} waiters, plain SQL holder: grant after release p50 {p50:.1} ms, p99 {p99:.1} ms, \
         max {max:.1} ms"
    );
    assert!(
        max <= POLLED_BOUND.as_secs_f64() * 1000.0,
        "granted {max:.1} ms after a release that sent no notification"
    );
}
