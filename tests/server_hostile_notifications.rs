//! Anybody who may connect can listen and notify on pglock's channels. A bystander role with
//! no privilege beyond connecting hears every probe and release notification during a storm
//! of real waits inside critical sections, and answers each with forgeries: the probe
//! replayed, the probe with a made-up hop that closes a cycle back to its sender (sent twice,
//! as a real second round would come), hops of real waits stitched into a cycle that does not
//! exist, over-long and garbled paths, random lock ids on the release channel. No wait fails,
//! every section completes, and a real cycle through two managers is still found, while the
//! bystander goes on.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::roles::Sandbox;
use futures::StreamExt;
use pglock::PostgresLockManager;
use sqlx::postgres::PgListener;
use sqlx::{PgConnection, PgPool, Row};

/// What the bystander heard and sent.
#[derive(Default)]
struct Tally {
    probes_heard: AtomicUsize,
    releases_heard: AtomicUsize,
    forged: AtomicUsize,
}

/// A random `u64`.
fn random() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// Lock ids (`bigint` advisory locks) held in this database right now, as the bystander may
/// read them in `pg_locks`.
async fn held_ids(conn: &mut PgConnection) -> Vec<i64> {
    sqlx::query(
        "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l \
         WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted \
         AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         LIMIT 12",
    )
    .fetch_all(conn)
    .await
    .map(|rows| rows.iter().map(|r| r.get::<i64, _>(0)).collect())
    .unwrap_or_default()
}

/// Takes, on the bystander's own session, the markers a manager's wait `hop` would hold if it
/// held `previous`'s lock against it (as `core/cycles/probe.rs` derives them, computed here
/// with the server's `sha256`): a forgery of the evidence, which only the role tells apart.
async fn forge_markers(conn: &mut PgConnection, hop: &str, previous: &str) {
    let parts: Vec<&str> = previous.split('.').collect();
    let (Some(wants), Some(mode)) = (parts.get(3), parts.get(4)) else {
        return;
    };
    let modes: &[&str] = if *mode == "x" { &["x", "s"] } else { &["x"] };
    for held_mode in modes {
        let _ = sqlx::query(
            r"WITH m AS (SELECT ('x' || encode(substring(sha256(
                convert_to('pglock wait marker v1', 'UTF8') || '\x00'::bytea
                || convert_to($1, 'UTF8') || '\x00'::bytea
                || convert_to($2 || '.' || $3, 'UTF8')) FROM 1 FOR 8), 'hex'))::bit(64)::bigint
                & 9223372036854775807 AS id)
             SELECT pg_try_advisory_lock_shared((id >> 32)::int, ((id << 32) >> 32)::int) FROM m",
        )
        .bind(hop)
        .bind(wants)
        .bind(held_mode)
        .execute(&mut *conn)
        .await;
    }
}

/// The forgeries answering one real probe (whose forged markers it takes on `conn`): `seen`
/// holds hops of real probes heard before.
async fn forgeries(
    conn: &mut PgConnection,
    probe: &str,
    held: &[i64],
    seen: &[String],
) -> Vec<String> {
    let mut out = vec![probe.to_owned(), probe.to_owned()];
    let hops: Vec<&str> = probe.split(',').collect();
    let _ = sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut *conn)
        .await;
    for id in held {
        // A made-up wait that wants a lock the sender may hold, older than every real one, so
        // the sender is the cycle's youngest, with its markers held: twice, as a confirming
        // round would come back.
        let hop = format!("{:x}.{:x}.0.{id}.x", random(), random() % 1000);
        forge_markers(conn, &hop, hops[hops.len() - 1]).await;
        let made_up = format!("{probe},{hop}");
        out.push(made_up.clone());
        out.push(made_up);
    }
    for other in seen.iter().rev().take(4) {
        // A real wait of another probe stitched after this one: both waits exist, the cycle
        // does not.
        let stitched = format!("{},{other}", hops[0]);
        out.push(stitched.clone());
        out.push(stitched);
    }
    let over_long = std::iter::repeat_n(hops[0], 80)
        .collect::<Vec<_>>()
        .join(",");
    out.push(over_long);
    out.push(format!("{probe},"));
    out.push(format!("{probe}.x"));
    out.push(probe.chars().take(probe.len() / 2).collect());
    out.push(format!(
        "{:x}.{:x}.{:x}.99999999999999999999.x",
        random(),
        random(),
        random()
    ));
    out.push(String::from_utf8_lossy(&random().to_le_bytes()).into_owned());
    out
}

/// Listens as the bystander until `stop`, answering everything it hears with forgeries.
async fn bystander(role: PgPool, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut listener = PgListener::connect_with(&role).await.expect("listen");
    listener
        .listen_all(["pglock_probe", "pglock_unlocked"])
        .await
        .expect("a role that may connect may listen");
    // Everything is sent on one connection: the bystander ignores what it sent itself.
    let mut sender = role.acquire().await.expect("connect");
    let own: Vec<i32> =
        sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE usename = current_user")
            .fetch_all(&mut *sender)
            .await
            .expect("own sessions");
    let mut seen: Vec<String> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let heard = tokio::time::timeout(Duration::from_millis(50), listener.recv()).await;
        let Ok(Ok(note)) = heard else { continue };
        if own.contains(&(note.process_id() as i32)) {
            continue;
        }
        let sent = if note.channel() == "pglock_probe" {
            tally.probes_heard.fetch_add(1, Ordering::SeqCst);
            let probe = note.payload().to_owned();
            let held = held_ids(&mut sender).await;
            let sent = forgeries(&mut sender, &probe, &held, &seen).await;
            seen.extend(probe.split(',').map(str::to_owned));
            if seen.len() > 64 {
                seen.drain(..32);
            }
            sent.into_iter()
                .map(|m| ("pglock_probe", m))
                .collect::<Vec<_>>()
        } else {
            tally.releases_heard.fetch_add(1, Ordering::SeqCst);
            let id = note.payload().to_owned();
            vec![
                ("pglock_unlocked", id.clone()),
                ("pglock_unlocked", (random() as i64).to_string()),
                ("pglock_unlocked", format!("{id}x")),
                ("pglock_unlocked", String::new()),
            ]
        };
        for (channel, payload) in sent {
            let notified = sqlx::query("SELECT pg_notify($1, $2)")
                .bind(channel)
                .bind(&payload)
                .execute(&mut *sender)
                .await;
            if notified.is_ok() {
                tally.forged.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// A manager of the test's own user on the sandbox database, probing after 5 ms.
async fn manager(sandbox: &Sandbox) -> PostgresLockManager {
    PostgresLockManager::builder(sandbox.admin_pool(4).await)
        .deadlock_timeout(Duration::from_millis(5))
        .wait_poll_interval(Duration::from_millis(10))
        .build()
}

/// 240 sections over three managers, each taking a second key after its first in one order
/// for everyone (so no cycle can form) and holding it for 5 ms: every one completes.
async fn ordered_storm(managers: &[PostgresLockManager]) {
    let keys: Vec<String> = (0..8)
        .map(|i| common::key(&format!("hostile-{i}")))
        .collect();
    let done = AtomicUsize::new(0);
    futures::stream::iter(0..240usize)
        .for_each_concurrent(24, |n| {
            let (locks, keys, done) = (managers[n % managers.len()].clone(), &keys, &done);
            async move {
                let first = n % 7;
                let second = keys[first + 1 + (n / 7) % (7 - first)].clone();
                let inner = locks.clone();
                let deadline = Some(Duration::from_secs(60));
                let outcome = locks
                    .with_lock(keys[first].as_str(), deadline, |_| async move {
                        inner
                            .with_lock(second.as_str(), deadline, |_| {
                                tokio::time::sleep(Duration::from_millis(5))
                            })
                            .await
                    })
                    .await;
                match outcome.and_then(|inner| inner) {
                    Ok(()) => done.fetch_add(1, Ordering::SeqCst),
                    Err(err) => panic!("section {n} failed under forged notifications: {err:?}"),
                };
            }
        })
        .await;
    assert_eq!(done.load(Ordering::SeqCst), 240);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_replayed_and_garbled_notifications_cost_no_wait_and_no_grant() {
    let sandbox = Sandbox::new("hostile").await;
    let managers = vec![
        manager(&sandbox).await,
        manager(&sandbox).await,
        manager(&sandbox).await,
    ];
    let (tally, stop) = (Arc::new(Tally::default()), Arc::new(AtomicBool::new(false)));
    let forging = tokio::spawn(bystander(
        sandbox.role_pool().await,
        Arc::clone(&tally),
        Arc::clone(&stop),
    ));

    ordered_storm(&managers).await;
    // A real cycle through two managers, found while the bystander forges.
    let outcomes =
        common::cycle::between(&managers[0], &managers[1], Some(Duration::from_secs(30))).await;
    stop.store(true, Ordering::SeqCst);
    forging.await.expect("the bystander ran to the end");

    let deadlocks = common::cycle::deadlocks(&outcomes);
    assert_eq!(
        deadlocks, 1,
        "the real cycle is still found, once: {outcomes:?}"
    );
    assert!(outcomes.iter().any(Result::is_ok), "{outcomes:?}");
    let (probes, releases, forged) = (
        tally.probes_heard.load(Ordering::SeqCst),
        tally.releases_heard.load(Ordering::SeqCst),
        tally.forged.load(Ordering::SeqCst),
    );
    println!("the bystander heard {probes} probes and {releases} releases and sent {forged}");
    assert!(probes >= 10, "the storm's waits probed: {probes}");
    assert!(releases >= 1, "releases were heard: {releases}");
    assert!(forged >= 200, "the bystander forged: {forged}");
    for locks in &managers {
        assert_eq!(locks.held_lock_count(), 0);
        locks.pool().close().await;
    }
    sandbox.remove().await;
}
