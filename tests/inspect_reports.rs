//! `pglock::inspect` against a real server: the reports must say exactly what `pg_locks` and
//! `pg_stat_activity` say, seen from outside the code under test.

mod common;

use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::{LockRow, advisory_locks_of, app_name, eventually, key, lock_rows, observer};
use pglock::inspect::{Error as InspectError, Inspector, LockReport, Session};
use pglock::{LockKey, LockMode, LockTarget, PostgresLockManager, lock_id, split_lock_id};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A manager whose holder id is the application name of its own pool.
async fn manager(label: &str) -> (PostgresLockManager, String) {
    let app = app_name(label);
    let pool = common::pool_named(2, &app).await;
    (common::manager_for(pool, &app).build(), app)
}

/// The one `pg_locks` row of the sessions of `app`.
async fn row_of(observer: &PgPool, app: &str) -> LockRow {
    let rows = advisory_locks_of(observer, app).await;
    assert_eq!(rows.len(), 1, "{app}: {rows:?}");
    rows.into_iter().next().expect("one row")
}

/// What `pg_stat_activity` says of `pid`, independently of the code under test.
#[derive(Debug, PartialEq)]
struct Activity {
    application_name: String,
    client_addr: Option<IpAddr>,
    client_port: Option<u16>,
    backend_start: DateTime<Utc>,
    state: String,
}

async fn activity(observer: &PgPool, pid: i32) -> Activity {
    let (application_name, client_addr, client_port, backend_start, state): (
        String,
        Option<String>,
        Option<i32>,
        DateTime<Utc>,
        String,
    ) = sqlx::query_as(
        "SELECT application_name, host(client_addr), client_port, backend_start, state \
         FROM pg_stat_activity WHERE pid = $1",
    )
    .bind(pid)
    .fetch_one(observer)
    .await
    .expect("pg_stat_activity");
    Activity {
        application_name,
        client_addr: client_addr.map(|addr| addr.parse().expect("an IP address")),
        client_port: client_port.and_then(|port| u16::try_from(port).ok()),
        backend_start,
        state,
    }
}

/// Asserts that `session` is the session `row` of `pg_locks` shows, with the details
/// `pg_stat_activity` shows for it, tagged with holder id `holder`.
async fn assert_session(observer: &PgPool, session: &Session, row: &LockRow, holder: &str) {
    assert_eq!(session.pid, Some(row.pid), "{session:?}");
    let mode = match row.mode.as_str() {
        "ExclusiveLock" => LockMode::Exclusive,
        "ShareLock" => LockMode::Shared,
        other => panic!("unexpected mode {other}"),
    };
    assert_eq!(session.mode, mode, "{session:?}");
    assert_eq!(session.holder_id.as_deref(), Some(holder), "{session:?}");
    let seen = activity(observer, row.pid).await;
    assert_eq!(seen.application_name, format!("pglock:{holder}"));
    assert_eq!(
        session.application_name.as_deref(),
        Some(seen.application_name.as_str())
    );
    assert_eq!(session.client_addr, seen.client_addr, "{session:?}");
    assert_eq!(session.client_port, seen.client_port, "{session:?}");
    assert_eq!(
        session.backend_start,
        Some(seen.backend_start),
        "{session:?}"
    );
    if row.granted {
        // A pinned session runs nothing while it holds its lock.
        assert_eq!(session.state.as_deref(), Some("idle"), "{session:?}");
    } else {
        assert_eq!(session.state.as_deref(), Some("active"), "{session:?}");
    }
}

fn held_for(session: &Session) -> Duration {
    session
        .held_or_waited_for
        .unwrap_or_else(|| panic!("a duration for {session:?}"))
}

fn report_of(reports: &[LockReport], lock_id: i64) -> &LockReport {
    let target = LockTarget::BigInt(lock_id);
    let mut found = reports.iter().filter(|report| report.target == target);
    let report = found
        .next()
        .unwrap_or_else(|| panic!("no report for {lock_id}: {reports:?}"));
    assert!(found.next().is_none(), "one report per lock: {reports:?}");
    report
}

fn holder_ids(sessions: &[Session]) -> Vec<&str> {
    sessions
        .iter()
        .map(|session| session.holder_id.as_deref().unwrap_or("?"))
        .collect()
}

/// Starts `manager` waiting for `key` in `mode` and returns once `pg_locks` shows it queued,
/// with the moment that was first seen.
async fn queue(
    observer: &PgPool,
    manager: &PostgresLockManager,
    app: &str,
    key: &str,
    mode: LockMode,
) -> (JoinHandle<pglock::Result<pglock::LockGuard>>, Instant) {
    let waiting = tokio::spawn({
        let (manager, key) = (manager.clone(), key.to_owned());
        async move {
            let timeout = Some(Duration::from_secs(60));
            match mode {
                LockMode::Shared => manager.acquire_shared(&key, timeout).await,
                _ => manager.acquire(&key, timeout).await,
            }
        }
    });
    eventually(&format!("{app} waits in pg_locks"), || async {
        advisory_locks_of(observer, app)
            .await
            .iter()
            .any(|row| !row.granted)
    })
    .await;
    (waiting, Instant::now())
}

#[tokio::test]
async fn reports_holders_sharers_and_queued_waiters_exactly() {
    let observer = observer().await;
    let (a, a_id) = manager("insp-a").await;
    let (b, b_id) = manager("insp-b").await;
    let (s1, s1_id) = manager("insp-s1").await;
    let (s2, s2_id) = manager("insp-s2").await;
    let mut waiters = Vec::new();
    for label in ["insp-w1", "insp-w2", "insp-w3"] {
        waiters.push(manager(label).await);
    }
    let (key_a, key_b, key_s) = (key("insp-a"), key("insp-b"), key("insp-s"));

    let before_a = Instant::now();
    let guard_a = a.acquire(&key_a, None).await.expect("a holds key_a");
    let a_granted = Instant::now();
    let guard_b = b.acquire(&key_b, None).await.expect("b holds key_b");
    let sharer_1 = s1.acquire_shared(&key_s, None).await.expect("s1 shares");
    let sharer_2 = s2
        .acquire_shared(&key_s, Some(Duration::from_secs(10)))
        .await
        .expect("s2 shares");

    // Three waiters on key_a, each queued only once the one before is visibly queued, so the
    // server's queue order is known: exclusive, shared, exclusive.
    let modes = [LockMode::Exclusive, LockMode::Shared, LockMode::Exclusive];
    let mut queued = Vec::new();
    for ((waiter, app), mode) in waiters.iter().zip(modes) {
        queued.push(queue(&observer, waiter, app, &key_a, mode).await);
    }
    // Let the first waiter wait for a known minimum.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let inspector = Inspector::new(observer.clone()).known_keys([key_a.clone(), key_s.clone()]);
    let asked = Instant::now();
    let reports = inspector.all().await.expect("inspect all");
    let elapsed_since = |at: Instant| asked.duration_since(at);

    // Reports are ordered by key space, then (classid, objid), one per lock.
    let ids: Vec<(i16, u32, u32)> = reports
        .iter()
        .map(|r| (r.target.objsubid(), r.classid, r.objid))
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "ordered, no duplicates");

    // key_a: one exclusive holder, three waiters in arrival order.
    let report = report_of(&reports, lock_id(&key_a));
    assert_eq!(report.key_name(), Some(key_a.as_str()), "a known key");
    assert_eq!(
        (report.classid, report.objid),
        split_lock_id(lock_id(&key_a))
    );
    assert_eq!(report.holders.len(), 1, "{report:?}");
    let holder = &report.holders[0];
    assert_session(&observer, holder, &row_of(&observer, &a_id).await, &a_id).await;
    let held = held_for(holder);
    assert!(
        held >= elapsed_since(a_granted),
        "held {held:?} is at least the time since the grant was seen"
    );
    assert!(
        held <= elapsed_since(before_a) + Duration::from_secs(2),
        "held {held:?}, but asked only {:?} ago",
        elapsed_since(before_a)
    );
    assert_eq!(
        holder_ids(&report.waiters),
        waiters
            .iter()
            .map(|(_, app)| app.as_str())
            .collect::<Vec<_>>(),
        "waiters in queue order"
    );
    // PostgreSQL 13 and older have no `pg_locks.waitstart`: there a waiter's wait is unknown,
    // and waiters are listed by the start of their statement (here, the queue order).
    let waitstart = common::pg14_or_later(&observer).await;
    for ((waiter, (_, app)), (_, seen_at)) in report.waiters.iter().zip(&waiters).zip(&queued) {
        let row = row_of(&observer, app).await;
        assert!(!row.granted);
        assert_session(&observer, waiter, &row, app).await;
        if !waitstart {
            assert!(
                waiter.since.is_none() && waiter.held_or_waited_for.is_none(),
                "no waitstart on this server, yet: {waiter:?}"
            );
            assert!(waiter.age.is_none(), "{waiter:?}");
            continue;
        }
        let waited = held_for(waiter);
        assert!(
            waited >= elapsed_since(*seen_at),
            "{app} waited {waited:?}, and was seen waiting {:?} before",
            elapsed_since(*seen_at)
        );
        assert!(waited <= elapsed_since(before_a) + Duration::from_secs(2));
        assert!(waiter.since.is_some());
    }
    if waitstart {
        assert!(held_for(&report.waiters[0]) >= Duration::from_millis(300));
        let waited: Vec<Duration> = report.waiters.iter().map(held_for).collect();
        assert!(
            waited.windows(2).all(|pair| pair[0] >= pair[1]),
            "the first in the queue has waited longest: {waited:?}"
        );
    }
    assert_eq!(
        report.waiters.iter().map(|w| w.mode).collect::<Vec<_>>(),
        modes
    );

    // key_b: held, but not a known key.
    let report = report_of(&reports, lock_id(&key_b));
    assert_eq!(report.key, None, "an unknown key is not guessed");
    assert_eq!(report.holders.len(), 1);
    assert!(report.waiters.is_empty());
    assert_session(
        &observer,
        &report.holders[0],
        &row_of(&observer, &b_id).await,
        &b_id,
    )
    .await;

    // key_s: two sharers, first granted first.
    let report = report_of(&reports, lock_id(&key_s));
    assert_eq!(report.key_name(), Some(key_s.as_str()));
    assert_eq!(
        holder_ids(&report.holders),
        [s1_id.as_str(), s2_id.as_str()]
    );
    assert!(report.waiters.is_empty());
    for (sharer, id) in report.holders.iter().zip([&s1_id, &s2_id]) {
        assert_eq!(sharer.mode, LockMode::Shared);
        assert_session(&observer, sharer, &row_of(&observer, id).await, id).await;
    }

    // Asking for one key gives the same report, with the key named.
    let one = inspector.key(&key_b).await.expect("inspect key_b");
    assert_eq!(one.key_name(), Some(key_b.as_str()));
    assert_eq!(one.holders.len(), 1);
    assert_eq!(one.holders[0].pid, Some(row_of(&observer, &b_id).await.pid));
    let by_id = inspector
        .by_lock_id(lock_id(&key_a))
        .await
        .expect("inspect key_a by id");
    assert_eq!(by_id.key_name(), Some(key_a.as_str()));
    assert_eq!(holder_ids(&by_id.holders), [a_id.as_str()]);
    assert_eq!(
        holder_ids(&by_id.waiters),
        holder_ids(&report_of(&reports, lock_id(&key_a)).waiters)
    );

    // The queue moves: once a lets go, w1 holds and w2, w3 wait.
    guard_a.release().await.expect("release a");
    let mut queued = queued.into_iter();
    let (first, _) = queued.next().expect("w1");
    let first = first.await.expect("join").expect("w1 takes key_a");
    let report = inspector.key(&key_a).await.expect("inspect key_a");
    assert_eq!(holder_ids(&report.holders), [waiters[0].1.as_str()]);
    assert_eq!(
        holder_ids(&report.waiters),
        [waiters[1].1.as_str(), waiters[2].1.as_str()]
    );

    first.release().await.expect("release w1");
    for (waiting, _) in queued {
        let guard = waiting.await.expect("join").expect("granted in turn");
        guard.release().await.expect("release");
    }
    for guard in [guard_b, sharer_1, sharer_2] {
        guard.release().await.expect("release");
    }
    for key in [&key_a, &key_b, &key_s] {
        let report = inspector.key(key).await.expect("inspect");
        assert!(report.is_free(), "{report:?}");
        assert_eq!(report.key_name(), Some(key.as_str()));
        assert_eq!(report.lock_id, lock_id(key));
    }
}

#[tokio::test]
async fn other_software_prefixes_and_two_int_locks() {
    let observer = observer().await;
    let (key_x, key_y, key_z) = (key("insp-x"), key("insp-y"), key("insp-z"));

    // Another program's session: a bigint lock (listed, no holder id) and a two-int4 lock whose
    // halves equal key_y's classid and objid (a different lock, in the other key space: listed
    // as the pair it is, never as key_y's).
    let app = app_name("other-software");
    let mut other = PgConnection::connect_with(&common::options(&app))
        .await
        .expect("connect");
    let (classid, objid) = split_lock_id(lock_id(&key_y));
    let pid: i32 = sqlx::query_scalar(
        "SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1), \
         pg_advisory_lock($2::int8::int4, $3::int8::int4)) AS locked",
    )
    .bind(lock_id(&key_x))
    .bind(i64::from(classid as i32))
    .bind(i64::from(objid as i32))
    .fetch_one(&mut other)
    .await
    .expect("lock");
    let two_int: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 \
         AND objsubid = 2",
    )
    .bind(pid)
    .fetch_one(&observer)
    .await
    .expect("pg_locks");
    assert_eq!(two_int, 1, "the two-int4 lock is held");

    // A manager with a prefix of its own.
    let prefixed_id = format!("h-{}", uuid::Uuid::new_v4().simple());
    let prefixed = PostgresLockManager::builder(common::pool(2).await)
        .holder_id(&prefixed_id)
        .application_name_prefix(Some("lk/"))
        .build();
    let guard = prefixed.acquire(&key_z, None).await.expect("acquire");

    let inspector = Inspector::new(observer.clone()).known_keys([&key_x, &key_y, &key_z]);
    let reports = inspector.all().await.expect("inspect");
    let report = report_of(&reports, lock_id(&key_x));
    assert_eq!(report.key_name(), Some(key_x.as_str()));
    assert_eq!(report.holders.len(), 1);
    let holder = &report.holders[0];
    assert_eq!(holder.pid, Some(pid));
    assert_eq!(holder.application_name.as_deref(), Some(app.as_str()));
    assert_eq!(holder.holder_id, None, "not a pglock session");
    assert_eq!(holder.state.as_deref(), Some("idle"));
    assert!(holder.held_or_waited_for.is_some());
    let pair = LockTarget::IntPair(classid as i32, objid as i32);
    assert!(
        reports
            .iter()
            .all(|r| r.target != LockTarget::BigInt(lock_id(&key_y))),
        "the pair is not key_y's lock"
    );
    let listed: Vec<&LockReport> = reports.iter().filter(|r| r.target == pair).collect();
    assert_eq!(listed.len(), 1, "the two-int4 lock is listed: {reports:?}");
    assert_eq!(listed[0].holders[0].pid, Some(pid));
    assert_eq!((listed[0].classid, listed[0].objid), (classid, objid));
    assert_eq!(listed[0].key, None, "not a known key");
    assert!(inspector.key(&key_y).await.expect("inspect").is_free());
    let by_pair = inspector
        .key(LockKey::pair(classid as i32, objid as i32))
        .await
        .expect("inspect");
    assert_eq!(by_pair.target, pair);
    assert_eq!(
        by_pair.key,
        Some(LockKey::pair(classid as i32, objid as i32))
    );
    assert_eq!(
        by_pair.holders.iter().map(|h| h.pid).collect::<Vec<_>>(),
        [Some(pid)]
    );

    let report = report_of(&reports, lock_id(&key_z));
    assert_eq!(
        report.holders[0].holder_id, None,
        "default prefix: no match"
    );
    assert_eq!(
        report.holders[0].application_name.as_deref(),
        Some(format!("lk/{prefixed_id}").as_str())
    );
    let custom = inspector.clone().application_name_prefix(Some("lk/"));
    let report = custom.key(&key_z).await.expect("inspect");
    assert_eq!(
        report.holders[0].holder_id.as_deref(),
        Some(prefixed_id.as_str())
    );
    guard.release().await.expect("release");

    // A holder running a statement may have been granted by it: no bound on its hold.
    let key_busy = key("insp-busy");
    let busy_app = app_name("busy");
    let busy = tokio::spawn({
        let (options, id) = (common::options(&busy_app), lock_id(&key_busy));
        async move {
            let mut conn = PgConnection::connect_with(&options).await.expect("connect");
            sqlx::query("SELECT pg_advisory_lock($1), pg_sleep(1.5)")
                .bind(id)
                .execute(&mut conn)
                .await
                .expect("lock and sleep");
        }
    });
    eventually("the busy session holds its lock", || async {
        lock_rows(&observer, lock_id(&key_busy))
            .await
            .iter()
            .any(|row| row.granted)
    })
    .await;
    let report = inspector.key(&key_busy).await.expect("inspect");
    assert_eq!(report.holders.len(), 1, "{report:?}");
    let holder = &report.holders[0];
    assert_eq!(holder.state.as_deref(), Some("active"));
    assert_eq!(holder.application_name.as_deref(), Some(busy_app.as_str()));
    assert_eq!((holder.since, holder.held_or_waited_for), (None, None));
    busy.await.expect("the busy session finishes");

    other.close().await.expect("close");
    eventually("the other program's locks are gone", || async {
        lock_rows(&observer, lock_id(&key_x)).await.is_empty()
    })
    .await;
    assert!(inspector.key(&key_x).await.expect("inspect").is_free());
}

#[tokio::test]
async fn locks_of_another_database_are_not_listed() {
    let observer = observer().await;
    let database = format!("pglock_test_other_{}", uuid::Uuid::new_v4().simple());
    // An identifier cannot be a bound parameter; this one is made of a prefix and hex digits.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {database}")))
        .execute(&observer)
        .await
        .expect("create the other database");

    let checks = tokio::spawn({
        let (observer, database) = (observer.clone(), database.clone());
        async move {
            let app = app_name("other-db");
            let pool = PgPoolOptions::new()
                .max_connections(2)
                .connect_with(common::options(&app).database(&database))
                .await
                .expect("connect to the other database");
            let locks = common::manager_for(pool.clone(), &app).build();
            let key = key("insp-other-db");
            let guard = locks.acquire(&key, None).await.expect("acquire there");

            // It is held: the other database's inspector sees it...
            let there = Inspector::new(pool.clone())
                .key(&key)
                .await
                .expect("inspect");
            assert_eq!(holder_ids(&there.holders), [app.as_str()]);
            // ...and this database's does not, though pg_locks shows it server-wide.
            assert_eq!(lock_rows(&observer, lock_id(&key)).await.len(), 1);
            let here = Inspector::new(observer.clone()).known_keys([&key]);
            let all = here.all().await.expect("inspect all");
            assert!(all.iter().all(|r| r.lock_id != lock_id(&key)), "{all:?}");
            assert!(here.key(&key).await.expect("inspect").is_free());

            guard.release().await.expect("release");
            drop(locks);
            pool.close().await;
        }
    });
    let outcome = checks.await;
    common::roles::drop_database_forcibly(&observer, &database)
        .await
        .expect("drop the other database");
    if let Err(err) = outcome {
        std::panic::resume_unwind(err.into_panic());
    }
}

#[tokio::test]
async fn an_unreachable_server_is_an_inspection_error() {
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://postgres@127.0.0.1:1/postgres")
        .expect("a valid URL");
    let inspector = Inspector::new(pool);
    let err: InspectError = inspector
        .key("leader:orders")
        .await
        .expect_err("unreachable");
    assert!(
        matches!(&err, InspectError::Connection { key: Some(key), .. } if *key == "leader:orders"),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .starts_with("Lock inspection failed for 'leader:orders': "),
        "{err}"
    );
    let err: InspectError = inspector.all().await.expect_err("unreachable");
    assert!(
        matches!(err, InspectError::Connection { key: None, .. }),
        "{err:?}"
    );
    assert!(std::error::Error::source(&err).is_some());
}
