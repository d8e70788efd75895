//! What it costs to know that held locks are still held, as the server's lock table fills.
//!
//! `cargo bench -p pglock-bench --bench heartbeat` (against `DATABASE_URL`, or a throwaway server) times, with
//! 0, 1,000 and 10,000 advisory locks held by one session:
//!
//! * the heartbeat pglock sends a session that holds locks: a protocol `Sync` on that session;
//! * the `pg_locks` probe that earlier versions sent on a connection of their own, asking for
//!   every held lock at once (the statement is kept here, as measured, for the comparison).
//!
//! Each line printed is one JSON object: `{"held": N, "design": ..., "mean_us": ..., "p99_us": ...}`.

use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection};

/// The probe of pglock 0.2: which of the given (pid, lock id) pairs does the server not show
/// as granted.
const OLD_PROBE: &str = "SELECT h.i FROM unnest($1::int4[], $2::int8[]) \
     WITH ORDINALITY AS h(pid, id, i) \
     WHERE NOT EXISTS (SELECT 1 FROM pg_locks l \
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid \
        AND l.classid = (h.id >> 32)::oid AND l.objid = (h.id & 4294967295)::oid \
        AND l.objsubid = 1 AND l.mode = 'ExclusiveLock')";

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = pglock_testing::database_url();
    let mut holder = PgConnection::connect(url).await.expect("connect");
    let mut prober = PgConnection::connect(url).await.expect("connect");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .expect("pid");
    let mut held = 0_i64;
    for target in [0_i64, 1_000, 10_000] {
        sqlx::query("SELECT count(pg_advisory_lock(g)) FROM generate_series($1::int8, $2::int8) g")
            .bind(held + 1)
            .bind(target)
            .execute(&mut holder)
            .await
            .expect("take the locks");
        held = target;
        let mut pings = Vec::new();
        for _ in 0..500 {
            let started = Instant::now();
            holder.ping().await.expect("ping");
            pings.push(started.elapsed());
        }
        report(held, "heartbeat (Sync on the holding session)", &mut pings);
        let ids: Vec<i64> = (1..=held).collect();
        let pids = vec![pid; ids.len()];
        let mut probes = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            sqlx::query(OLD_PROBE)
                .bind(&pids)
                .bind(&ids)
                .fetch_all(&mut prober)
                .await
                .expect("probe");
            probes.push(started.elapsed());
        }
        report(held, "pg_locks probe (0.2, own connection)", &mut probes);
    }
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut holder)
        .await
        .expect("unlock");
}

fn report(held: i64, design: &str, sorted: &mut [Duration]) {
    sorted.sort();
    let mean = sorted.iter().sum::<Duration>() / u32::try_from(sorted.len()).unwrap_or(1);
    let p99 = sorted[(sorted.len() * 99).div_ceil(100).saturating_sub(1)];
    println!(
        "{{\"held\": {held}, \"design\": \"{design}\", \"mean_us\": {}, \"p99_us\": {}}}",
        mean.as_micros(),
        p99.as_micros()
    );
}
