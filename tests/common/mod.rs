//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod cli;
pub mod jobs;
pub mod otel;
pub mod pgbouncer;
pub mod proxy;

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The database of this test run (see `pglock::testing::database_url`).
pub fn url() -> &'static str {
    pglock::testing::database_url()
}

/// Connect options for the test database, tagged with `application_name` `app`.
pub fn options(app: &str) -> PgConnectOptions {
    let options: PgConnectOptions = url().parse().expect("a valid DATABASE_URL");
    options.application_name(app)
}

/// A new pool of at most `max` connections, tagged with `application_name` `app` so the
/// server's views can tell its sessions apart.
pub async fn pool_named(max: u32, app: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options(app))
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {}: {err}", url()))
}

/// A new pool of at most `max` connections.
pub async fn pool(max: u32) -> PgPool {
    pool_named(max, "pglock-tests").await
}

/// A unique `application_name` for one test's pool.
pub fn app_name(label: &str) -> String {
    format!(
        "pglock-{label}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A key no other test uses.
pub fn key(label: &str) -> String {
    format!("pglock-test:{label}:{}", uuid::Uuid::new_v4())
}

/// A manager on `pool` whose holder id is the pool's `application_name`, so the sessions it
/// tags (`pglock:{app}`) can be attributed to the pool.
pub fn manager_for(pool: PgPool, app: &str) -> pglock::PostgresLockManagerBuilder {
    pglock::PostgresLockManager::builder(pool).holder_id(app)
}

/// A pool for looking at the server's views from outside the code under test.
pub async fn observer() -> PgPool {
    pool_named(2, "pglock-observer").await
}

/// One advisory lock as `pg_locks` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRow {
    pub pid: i32,
    pub classid: i64,
    pub objid: i64,
    pub objsubid: i16,
    pub mode: String,
    pub granted: bool,
}

/// The `pg_locks` rows (granted or waiting) of the advisory lock `lock_id`.
pub async fn lock_rows(observer: &PgPool, lock_id: i64) -> Vec<LockRow> {
    let (classid, objid) = pglock::split_lock_id(lock_id);
    sqlx::query_as(
        "SELECT pid, classid::bigint AS classid, objid::bigint AS objid, objsubid, mode, granted \
         FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid \
         AND objid = $2::bigint::oid ORDER BY granted DESC, pid",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .fetch_all(observer)
    .await
    .expect("query pg_locks")
    .into_iter()
    .map(LockRow::from_tuple)
    .collect()
}

type LockTuple = (i32, i64, i64, i16, String, bool);

impl LockRow {
    fn from_tuple((pid, classid, objid, objsubid, mode, granted): LockTuple) -> Self {
        LockRow {
            pid,
            classid,
            objid,
            objsubid,
            mode,
            granted,
        }
    }
}

/// The advisory locks held or awaited by sessions of the pool tagged `app`: its idle
/// connections carry `app`, and those a manager with holder id `app` is using carry
/// `pglock:{app}` (see `manager_for`).
pub async fn advisory_locks_of(observer: &PgPool, app: &str) -> Vec<LockRow> {
    sqlx::query_as(
        "SELECT l.pid, l.classid::bigint AS classid, l.objid::bigint AS objid, l.objsubid, \
         l.mode, l.granted FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' \
         AND a.application_name IN ($1, left('pglock:' || $1, 63))",
    )
    .bind(app)
    .fetch_all(observer)
    .await
    .expect("query pg_locks")
    .into_iter()
    .map(LockRow::from_tuple)
    .collect()
}

/// One session as `pg_stat_activity` shows it.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub pid: i32,
    pub state: Option<String>,
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
    pub query: Option<String>,
    pub query_start: Option<chrono::DateTime<chrono::Utc>>,
    pub has_xmin: bool,
}

/// The sessions of the pool tagged `app` (see `advisory_locks_of`).
pub async fn sessions_of(observer: &PgPool, app: &str) -> Vec<SessionRow> {
    sqlx::query_as(
        "SELECT pid, state, wait_event_type, wait_event, query, query_start, \
         backend_xmin IS NOT NULL AS has_xmin \
         FROM pg_stat_activity WHERE application_name IN ($1, left('pglock:' || $1, 63)) \
         ORDER BY pid",
    )
    .bind(app)
    .fetch_all(observer)
    .await
    .expect("query pg_stat_activity")
    .into_iter()
    .map(SessionRow::from_tuple)
    .collect()
}

type SessionTuple = (
    i32,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<chrono::DateTime<chrono::Utc>>,
    bool,
);

impl SessionRow {
    fn from_tuple(row: SessionTuple) -> Self {
        let (pid, state, wait_event_type, wait_event, query, query_start, has_xmin) = row;
        SessionRow {
            pid,
            state,
            wait_event_type,
            wait_event,
            query,
            query_start,
            has_xmin,
        }
    }
}

/// Waits until `condition` holds, checking every 10 ms for up to 15 s.
///
/// Only for states that the server reaches on its own time with no signal to wait on (a
/// backend noticing that its client went away, a waiter showing up in `pg_locks`); it panics
/// with `what` if the state never comes.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asserts that no session of `app` holds or awaits an advisory lock and that every one of its
/// sessions is idle with no transaction open: what a pool must look like after any operation,
/// however it ended. Sessions closed by the code under test may take a moment to leave the
/// server's views, so this waits for that.
pub async fn assert_pool_clean(observer: &PgPool, app: &str) {
    eventually(
        &format!("the sessions of {app} hold no advisory lock"),
        || async { advisory_locks_of(observer, app).await.is_empty() },
    )
    .await;
    eventually(&format!("every session of {app} is idle"), || async {
        sessions_of(observer, app)
            .await
            .iter()
            .all(|s| s.state.as_deref() == Some("idle") && !s.has_xmin)
    })
    .await;
}

/// Helpers for the tests of `pglock::migration`: a harness that runs one scenario against the
/// in-memory store and lock managers or against PostgreSQL, and scriptable plug-ins.
pub mod migration {
    use std::collections::{HashMap, HashSet, VecDeque};
    use std::fmt;
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use async_trait::async_trait;
    use pglock::migration::{
        AuditEvent, BoxError, InMemoryMigrationStore, Migration, MigrationConfig,
        MigrationCoordinator, MigrationPhase, MigrationStore, NewMigration, PostgresMigrationStore,
        RoutingChange, RoutingState, StoreRegistry, SyncLag, Transition,
    };
    use pglock::{
        GuardBackend, InMemoryLockManager, InMemoryLockServer, LockGuard, LockInfo, LockManager,
        PostgresLockManager,
    };
    use tokio::sync::{Notify, Semaphore};
    use uuid::Uuid;

    pub const SOURCE: &str = "shared";
    pub const TARGET: &str = "dedicated";

    /// Which backend a scenario runs on.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Backend {
        Memory,
        Postgres,
    }

    /// One "process" of a scenario: its own store handle and lock manager (its own pool on
    /// PostgreSQL, its own holder on the in-memory lock server).
    #[derive(Debug, Clone)]
    pub struct Process {
        pub store: Arc<dyn MigrationStore>,
        pub locks: Arc<dyn LockManager>,
    }

    /// The shared ground of a scenario: one migration store (a fresh schema on PostgreSQL) and
    /// one lock server.
    pub struct Harness {
        pub backend: Backend,
        pub store: Arc<dyn MigrationStore>,
        memory_store: Option<InMemoryMigrationStore>,
        memory_locks: InMemoryLockServer,
        schema: Option<String>,
    }

    impl Harness {
        pub async fn new(backend: Backend) -> Harness {
            match backend {
                Backend::Memory => Harness::memory(),
                Backend::Postgres => Harness::postgres().await,
            }
        }

        pub fn memory() -> Harness {
            let store = InMemoryMigrationStore::new();
            Harness {
                backend: Backend::Memory,
                store: Arc::new(store.clone()),
                memory_store: Some(store),
                memory_locks: InMemoryLockServer::new(),
                schema: None,
            }
        }

        /// A store in a schema of its own, so listings and audits see only this test's rows.
        pub async fn postgres() -> Harness {
            let schema = format!("pglock_test_{}", &Uuid::new_v4().simple().to_string()[..12]);
            let store = PostgresMigrationStore::with_schema(
                super::pool_named(4, &super::app_name("mig-store")).await,
                &schema,
            )
            .expect("valid schema name");
            store.ensure_schema().await.expect("create the tables");
            Harness {
                backend: Backend::Postgres,
                store: Arc::new(store),
                memory_store: None,
                memory_locks: InMemoryLockServer::new(),
                schema: Some(schema),
            }
        }

        pub fn schema(&self) -> Option<&str> {
            self.schema.as_deref()
        }

        /// A new process: a store handle of its own (own pool on PostgreSQL) on the same data,
        /// and a lock manager of its own on the same lock server.
        pub async fn process(&self, name: &str) -> Process {
            match self.backend {
                Backend::Memory => Process {
                    store: Arc::new(self.memory_store.clone().expect("memory store")),
                    locks: Arc::new(
                        InMemoryLockManager::builder()
                            .server(&self.memory_locks)
                            .holder_id(name)
                            .build(),
                    ),
                },
                Backend::Postgres => {
                    let app = super::app_name(name);
                    let store = PostgresMigrationStore::with_schema(
                        super::pool_named(4, &app).await,
                        self.schema.as_deref().expect("schema"),
                    )
                    .expect("valid schema name");
                    let locks = PostgresLockManager::builder(super::pool_named(4, &app).await)
                        .holder_id(name)
                        .build();
                    Process {
                        store: Arc::new(store),
                        locks: Arc::new(locks),
                    }
                }
            }
        }

        /// A migration of `tenant` from SOURCE to TARGET, moved to `dual_write` directly.
        pub async fn dual_writing(&self, tenant: Uuid, config: MigrationConfig) -> Migration {
            dual_writing(&*self.store, tenant, config).await
        }

        pub async fn audit(&self, migration_id: Uuid) -> Vec<AuditEvent> {
            audit_events(&*self.store, migration_id).await
        }
    }

    /// Creates a migration of `tenant` from SOURCE to TARGET and moves it to `dual_write`.
    pub async fn dual_writing(
        store: &dyn MigrationStore,
        tenant: Uuid,
        config: MigrationConfig,
    ) -> Migration {
        let new = NewMigration::new(tenant, SOURCE, TARGET).config(config);
        let migration = store.create_migration(&new).await.expect("create");
        let route = |from, to| {
            RoutingChange::new(from, to, SOURCE)
                .target(Some(TARGET.to_owned()))
                .owner(Some(migration.id))
        };
        let copying = store
            .apply_transition(
                &Transition::new(
                    &migration,
                    MigrationPhase::BulkCopy,
                    AuditEvent::PhaseChanged,
                )
                .routing(route(RoutingState::Normal, RoutingState::BulkCopy)),
            )
            .await
            .expect("to bulk_copy");
        store
            .apply_transition(
                &Transition::new(
                    &copying,
                    MigrationPhase::DualWrite,
                    AuditEvent::PhaseChanged,
                )
                .routing(route(RoutingState::BulkCopy, RoutingState::DualWrite)),
            )
            .await
            .expect("to dual_write")
    }

    pub async fn audit_events(store: &dyn MigrationStore, migration_id: Uuid) -> Vec<AuditEvent> {
        store
            .audit_log(migration_id)
            .await
            .expect("audit log")
            .into_iter()
            .map(|entry| entry.event)
            .collect()
    }

    /// A coordinator of `process` with every plug-in.
    pub fn coordinator(
        process: &Process,
        stores: Arc<TestStores>,
        lag: Arc<TestLag>,
    ) -> MigrationCoordinator {
        MigrationCoordinator::builder(Arc::clone(&process.store), stores)
            .source_store_id(SOURCE)
            .sync_lag(lag)
            .lock_manager(Arc::clone(&process.locks))
            .build()
    }

    /// A store registry that knows SOURCE and TARGET (or what it is told), each healthy
    /// unless told otherwise.
    #[derive(Debug, Default)]
    pub struct TestStores {
        known: Mutex<HashSet<String>>,
        unhealthy: Mutex<HashMap<String, String>>,
    }

    impl TestStores {
        pub fn new() -> Arc<TestStores> {
            TestStores::with(&[SOURCE, TARGET])
        }

        pub fn with(ids: &[&str]) -> Arc<TestStores> {
            let stores = TestStores::default();
            stores
                .known
                .lock()
                .unwrap()
                .extend(ids.iter().map(|id| id.to_string()));
            Arc::new(stores)
        }

        pub fn set_unhealthy(&self, id: &str, message: &str) {
            self.unhealthy
                .lock()
                .unwrap()
                .insert(id.to_owned(), message.to_owned());
        }
    }

    #[async_trait]
    impl StoreRegistry for TestStores {
        fn is_registered(&self, store_id: &str) -> bool {
            self.known.lock().unwrap().contains(store_id)
        }

        async fn check_health(&self, store_id: &str) -> Result<(), BoxError> {
            match self.unhealthy.lock().unwrap().get(store_id) {
                Some(message) => Err(message.clone().into()),
                None => Ok(()),
            }
        }
    }

    /// A scriptable sync lag: scripted answers first, then a default; optionally slow, or
    /// parked on its next call until the test lets it go.
    #[derive(Default)]
    pub struct TestLag {
        script: Mutex<VecDeque<Option<u64>>>,
        default: Mutex<Option<u64>>,
        delay: Mutex<Option<Duration>>,
        hold: Mutex<Option<Hold>>,
        calls: AtomicUsize,
    }

    impl fmt::Debug for TestLag {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("TestLag")
                .field("calls", &self.calls())
                .finish_non_exhaustive()
        }
    }

    /// The test's side of a parked lag call.
    #[derive(Clone)]
    pub struct Hold {
        reached: Arc<Notify>,
        release: Arc<Semaphore>,
    }

    impl Hold {
        /// Completes once a call is parked.
        pub async fn reached(&self) {
            self.reached.notified().await;
        }

        /// Lets the parked call answer.
        pub fn release(&self) {
            self.release.add_permits(1);
        }
    }

    impl TestLag {
        /// Always answers `lag` (`None`: cannot be calculated).
        pub fn fixed(lag: Option<u64>) -> Arc<TestLag> {
            let test = TestLag::default();
            *test.default.lock().unwrap() = lag;
            Arc::new(test)
        }

        /// Answers these first, one per call.
        pub fn script(&self, answers: &[Option<u64>]) {
            self.script.lock().unwrap().extend(answers.iter().copied());
        }

        /// Takes `delay` before each answer (a slow lag source, not a synchronisation).
        pub fn slow(&self, delay: Duration) {
            *self.delay.lock().unwrap() = Some(delay);
        }

        /// Parks the next call until the returned hold is released.
        pub fn hold_next(&self) -> Hold {
            let hold = Hold {
                reached: Arc::new(Notify::new()),
                release: Arc::new(Semaphore::new(0)),
            };
            *self.hold.lock().unwrap() = Some(hold.clone());
            hold
        }

        pub fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl SyncLag for TestLag {
        async fn lag(&self, _: Uuid, _: &str, _: &str) -> Result<Option<u64>, BoxError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let hold = self.hold.lock().unwrap().take();
            if let Some(hold) = hold {
                hold.reached.notify_one();
                hold.release.acquire().await.expect("open").forget();
            }
            let delay = *self.delay.lock().unwrap();
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let scripted = self.script.lock().unwrap().pop_front();
            Ok(scripted.unwrap_or(*self.default.lock().unwrap()))
        }
    }

    /// A lock manager that stamps a fencing token on every acquisition, strictly increasing
    /// across every manager sharing `counter`: the lock core's coming fencing, played by a
    /// wrapper so the cutover's use of tokens can be tested today.
    #[derive(Debug, Clone)]
    pub struct Fenced {
        inner: Arc<dyn LockManager>,
        counter: Arc<AtomicI64>,
    }

    impl Fenced {
        pub fn new(inner: Arc<dyn LockManager>, counter: Arc<AtomicI64>) -> Fenced {
            Fenced { inner, counter }
        }

        fn stamp(&self, info: LockInfo) -> LockInfo {
            info.with_fencing_token(Some(self.counter.fetch_add(1, Ordering::SeqCst) + 1))
        }

        fn wrap(&self, guard: LockGuard) -> LockGuard {
            let info = self.stamp(guard.info().clone());
            LockGuard::new(info, Box::new(Wrapped(guard)))
        }
    }

    #[derive(Debug)]
    struct Wrapped(LockGuard);

    #[async_trait]
    impl GuardBackend for Wrapped {
        async fn release(self: Box<Self>) -> pglock::Result<bool> {
            self.0.release().await
        }

        fn leak(self: Box<Self>) {
            self.0.leak();
        }
    }

    #[async_trait]
    impl LockManager for Fenced {
        async fn acquire(&self, key: &str, timeout: Option<Duration>) -> pglock::Result<LockGuard> {
            Ok(self.wrap(self.inner.acquire(key, timeout).await?))
        }

        async fn try_acquire(&self, key: &str) -> pglock::Result<Option<LockInfo>> {
            Ok(self
                .inner
                .try_acquire(key)
                .await?
                .map(|info| self.stamp(info)))
        }

        async fn acquire_shared(
            &self,
            key: &str,
            timeout: Option<Duration>,
        ) -> pglock::Result<LockGuard> {
            Ok(self.wrap(self.inner.acquire_shared(key, timeout).await?))
        }

        async fn try_acquire_shared(&self, key: &str) -> pglock::Result<Option<LockInfo>> {
            Ok(self
                .inner
                .try_acquire_shared(key)
                .await?
                .map(|info| self.stamp(info)))
        }

        async fn release(&self, key: &str) -> pglock::Result<()> {
            self.inner.release(key).await
        }

        async fn release_all(&self) -> pglock::Result<usize> {
            self.inner.release_all().await
        }

        async fn is_held(&self, key: &str) -> bool {
            self.inner.is_held(key).await
        }

        fn held_lock_count(&self) -> usize {
            self.inner.held_lock_count()
        }

        fn holder_id(&self) -> Option<&str> {
            self.inner.holder_id()
        }
    }
}

/// Turns each scenario `async fn name(backend: Backend)` of the calling test file into two
/// tests, `memory::name` and `postgres::name`.
#[allow(unused_macros)]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backend::Memory).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Backend::Postgres).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use on_both_backends;
