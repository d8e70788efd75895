//! pglock runs as the application's own role: one that owns nothing and, on PostgreSQL 15 and
//! later, may not create in schema `public`.
//!
//! Each test makes a database of its own (so `public` is as a fresh database has it) and a
//! role with no privilege beyond connecting; the tables pglock uses are made by an admin with
//! the documented DDL and grants, as a user's migrations would. A missing privilege is a typed
//! error naming the object and the privilege, never a connection error; an inspection that
//! may not read the fencing table reports lower bounds instead.

mod common;

use std::time::Duration;

use common::roles::Sandbox;
use std::sync::Arc;

use pglock::schedule::{self, PostgresJobStore, RunOutcome, ScheduledJob};
use pglock::{Error, FencingTable, PostgresLockManager};

const BOUND: Duration = Duration::from_secs(10);

#[tokio::test]
async fn plain_locks_need_no_privilege() {
    let sandbox = Sandbox::new("plain").await;
    let locks = PostgresLockManager::new(sandbox.role_pool().await);
    locks
        .with_lock("roles:plain", Some(BOUND), |_| async {})
        .await
        .expect("a role that owns nothing takes advisory locks");
    locks.pool().close().await;
    sandbox.remove().await;
}

#[tokio::test]
async fn fencing_runs_as_a_role_that_owns_nothing_once_the_table_is_made_and_granted() {
    let sandbox = Sandbox::new("fencing").await;
    let table = FencingTable::default();
    let locks = PostgresLockManager::builder(sandbox.role_pool().await)
        .fencing(table.clone())
        .build();

    // No table, and no right to create one in public: typed, naming the schema and CREATE.
    let err = locks
        .acquire("roles:fenced", Some(BOUND))
        .await
        .expect_err("the table is missing");
    match &err {
        Error::PermissionDenied {
            object, privilege, ..
        } => {
            assert!(object.contains("schema \"public\""), "{object}");
            assert!(object.contains("pglock_fencing_tokens"), "{object}");
            assert_eq!(privilege, "CREATE");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    assert_eq!(locks.held_lock_count(), 0, "nothing was taken");
    let up_front = locks
        .ensure_fencing_table()
        .await
        .expect_err("the same check up front");
    assert!(
        matches!(up_front, Error::PermissionDenied { .. }),
        "{up_front:?}"
    );

    // The admin makes the table with the documented DDL, but grants nothing yet.
    sandbox.admin(&table.ddl()).await;
    let err = locks
        .acquire("roles:fenced", Some(BOUND))
        .await
        .expect_err("no grant yet");
    match &err {
        Error::PermissionDenied {
            object, privilege, ..
        } => {
            assert!(
                object.contains("table \"pglock_fencing_tokens\""),
                "{object}"
            );
            assert_eq!(privilege, "SELECT, INSERT, UPDATE");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }

    // The documented grant is enough: fenced acquisitions work and tokens increase.
    sandbox
        .admin(&format!(
            "GRANT SELECT, INSERT, UPDATE ON pglock_fencing_tokens TO {}",
            sandbox.role
        ))
        .await;
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let guard = locks
            .acquire("roles:fenced", Some(BOUND))
            .await
            .expect("fenced acquisition as the role");
        tokens.push(guard.info().fencing_token.expect("a token"));
        guard.release().await.expect("release");
    }
    assert!(
        tokens.windows(2).all(|pair| pair[0] < pair[1]),
        "{tokens:?}"
    );
    // A contended acquisition mints in its wait statement: the grant covers it too.
    let holder = PostgresLockManager::builder(sandbox.role_pool().await)
        .fencing(table)
        .build();
    let held = holder
        .acquire("roles:fenced", Some(BOUND))
        .await
        .expect("held");
    let (waited, released) = tokio::join!(locks.acquire("roles:fenced", Some(BOUND)), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await
    });
    released.expect("release");
    let waited = waited.expect("granted after the wait");
    assert!(waited.info().fencing_token > tokens.last().copied());
    waited.release().await.expect("release");
    locks.pool().close().await;
    holder.pool().close().await;
    sandbox.remove().await;
}

#[tokio::test]
async fn scheduled_jobs_run_as_a_role_that_owns_nothing_once_the_table_is_made_and_granted() {
    let sandbox = Sandbox::new("jobs").await;
    let locks = PostgresLockManager::new(sandbox.role_pool().await);
    let store = PostgresJobStore::new(locks.pool().clone());
    let job = ScheduledJob::builder(
        Arc::new(locks.clone()),
        Arc::new(store),
        "roles-job",
        Duration::from_secs(3600),
    )
    .build()
    .expect("valid");
    let err = job
        .run(|_| async {})
        .await
        .expect_err("the table is missing");
    match &err {
        schedule::Error::PermissionDenied {
            object, privilege, ..
        } => {
            assert!(object.contains("schema \"public\""), "{object}");
            assert_eq!(privilege, "CREATE");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    let table = pglock::schedule::JobTable::default();
    sandbox.admin(&table.ddl()).await;
    sandbox
        .admin(&format!(
            "GRANT SELECT, INSERT, UPDATE ON pglock_scheduled_jobs TO {}",
            sandbox.role
        ))
        .await;
    // The first check failed, so the job checks again and finds the table usable.
    match job.run(|_| async { 7 }).await.expect("runs as the role") {
        RunOutcome::Ran { value, .. } => assert_eq!(value, 7),
        other => panic!("expected a run, got {other:?}"),
    }
    locks.pool().close().await;
    sandbox.remove().await;
}

#[tokio::test]
async fn a_job_table_made_by_0_1_is_upgraded_by_its_owner_not_by_the_application_role() {
    let sandbox = Sandbox::new("jobs_upgrade").await;
    // pglock 0.1's table, made and granted by the migrations, without today's two columns.
    sandbox
        .admin(
            "CREATE TABLE pglock_scheduled_jobs (job text PRIMARY KEY, \
             window_start timestamptz NOT NULL, runs bigint NOT NULL, claimed_by text, \
             claimed_at timestamptz NOT NULL, finished_at timestamptz, \
             hold_until timestamptz NOT NULL)",
        )
        .await;
    let grant = format!(
        "GRANT SELECT, INSERT, UPDATE ON pglock_scheduled_jobs TO {}",
        sandbox.role
    );
    sandbox.admin(&grant).await;
    let locks = PostgresLockManager::new(sandbox.role_pool().await);
    let store = PostgresJobStore::new(locks.pool().clone());
    let job = ScheduledJob::builder(
        Arc::new(locks.clone()),
        Arc::new(store),
        "roles-upgrade",
        Duration::from_secs(3600),
    )
    .build()
    .expect("valid");
    match job
        .run(|_| async {})
        .await
        .expect_err("the role cannot add columns")
    {
        schedule::Error::PermissionDenied {
            object, privilege, ..
        } => {
            assert!(object.contains("extended_at, extensions"), "{object}");
            assert_eq!(privilege, "ownership");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    sandbox
        .admin(&pglock::schedule::JobTable::default().upgrade_ddl())
        .await;
    let outcome = job.run(|_| async { 7 }).await.expect("runs as the role");
    assert_eq!(outcome.into_value(), Some(7));
    locks.pool().close().await;
    sandbox.remove().await;
}

#[tokio::test]
async fn inspection_falls_back_to_lower_bounds_on_a_fencing_table_the_role_may_not_read() {
    use pglock::inspect::{Age, Inspector};
    let sandbox = Sandbox::new("inspect").await;
    sandbox.admin("CREATE SCHEMA locks").await;
    // Sees other roles' session states (so holders have ages), and nothing else.
    sandbox
        .admin(&format!("GRANT pg_read_all_stats TO {}", sandbox.role))
        .await;
    let options = (*sandbox.admin.connect_options()).clone();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .expect("connect as admin");
    let table = FencingTable::new("locks.tokens").expect("a valid name");
    let locks = PostgresLockManager::builder(pool.clone())
        .fencing(table.clone())
        .build();
    let guard = locks
        .acquire("roles:inspected", Some(BOUND))
        .await
        .expect("held");
    let inspector = Inspector::new(sandbox.role_pool().await).fencing_table(table);
    let age = || async {
        let report = inspector.key("roles:inspected").await.expect("no failure");
        report.holders[0].age
    };

    // No USAGE on the schema (where even looking the table up fails), then no SELECT.
    assert_eq!(age().await, Some(Age::AtLeast));
    sandbox
        .admin(&format!("GRANT USAGE ON SCHEMA locks TO {}", sandbox.role))
        .await;
    assert_eq!(age().await, Some(Age::AtLeast));
    sandbox
        .admin(&format!("GRANT SELECT ON locks.tokens TO {}", sandbox.role))
        .await;
    assert_eq!(age().await, Some(Age::Exact), "readable: the grant time");

    guard.release().await.expect("release");
    pool.close().await;
    sandbox.remove().await;
}

/// What the first lock session and the first contended waits set up, as a role that owns
/// nothing: the server check (a second session, a salted lock, `LISTEN`), the waiters' doorbell
/// (flags and release notifications, for waits without a connection of their own), and the
/// probes that find a cycle through two managers (markers, confirmed in `pg_locks` and
/// `pg_stat_activity`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_check_the_doorbell_and_cycle_probes_need_no_privilege() {
    let sandbox = Sandbox::new("paths").await;
    let pools = [
        sandbox.role_pool().await,
        sandbox.role_pool().await,
        sandbox.role_pool().await,
    ];
    let manager = |pool: &sqlx::PgPool| {
        PostgresLockManager::builder(pool.clone())
            .max_connections(3)
            .deadlock_timeout(Duration::from_millis(50))
            .build()
    };
    let (a, b, holder) = (manager(&pools[0]), manager(&pools[1]), manager(&pools[2]));
    let check = a
        .check_server()
        .await
        .expect("the check needs no privilege");
    assert!(check.notifications, "{check:?}");

    // Four keys held elsewhere, three connections: a wait rings the doorbell.
    let keys: Vec<String> = (0..4).map(|i| format!("roles:paths:{i}")).collect();
    let held = holder.acquire_all(&keys, Some(BOUND)).await.expect("held");
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| {
            let (a, k) = (a.clone(), k.clone());
            tokio::spawn(async move { a.acquire(&k, Some(BOUND)).await })
        })
        .collect();
    held.release().await.expect("release");
    for waiter in waiters {
        let guard = waiter.await.expect("join").expect("granted");
        guard.release().await.expect("release");
    }

    // A cycle through two managers: exactly one wait fails, found by probes.
    let outcomes = common::cycle::between(&a, &b, Some(BOUND)).await;
    let deadlocks = common::cycle::deadlocks(&outcomes);
    assert_eq!(deadlocks, 1, "{outcomes:?}");
    for pool in pools {
        pool.close().await;
    }
    sandbox.remove().await;
}
