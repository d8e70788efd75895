//! The write gate makes the cutover's write pause hold across processes: a write in flight
//! when the cutover starts commits before routing switches, a write that starts during the
//! cutover waits and then sees the new routing, and writers racing a whole migration lose and
//! misroute nothing.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{Harness, SOURCE, TARGET, TestLag, TestStores};
use common::{eventually, lock_rows, observer, pool_named, within};
use pglock::{InMemoryLockManager, InMemoryLockServer, LockManager};
use pglock_migration::{
    AuditEvent, BoxError, CopyBatch, CopyRequest, CutoverManager, EventCopier, MigrationConfig,
    MigrationCoordinator, MigrationPhase, PostgresMigrationStore, RoutingRepository, RoutingState,
    SyncLag, TenantRouting, WriteGate,
};
use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use uuid::Uuid;

/// The two event stores of a test: one table per store in the test's schema.
#[derive(Debug, Clone)]
struct EventTables {
    pool: PgPool,
    schema: String,
}

impl EventTables {
    async fn create(pool: PgPool, schema: &str) -> EventTables {
        let tables = EventTables {
            pool,
            schema: schema.to_owned(),
        };
        for store in [SOURCE, TARGET] {
            let sql = format!(
                "CREATE TABLE {} (position bigserial PRIMARY KEY, event_id uuid NOT NULL, \
                 tenant_id uuid NOT NULL, source_position bigint, \
                 written_at timestamptz NOT NULL DEFAULT clock_timestamp())",
                tables.table(store)
            );
            sqlx::query(AssertSqlSafe(sql))
                .execute(&tables.pool)
                .await
                .expect("create an event table");
        }
        tables
    }

    /// The table of `store`. Test schema names are plain identifiers; store ids are constants.
    fn table(&self, store: &str) -> String {
        format!("\"{}\".events_{store}", self.schema)
    }

    async fn insert(&self, conn: &mut PgConnection, store: &str, tenant: Uuid, event: Uuid) {
        let sql = format!(
            "INSERT INTO {} (event_id, tenant_id) VALUES ($1, $2)",
            self.table(store)
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(event)
            .bind(tenant)
            .execute(conn)
            .await
            .expect("append an event");
    }

    /// Every event id of `tenant` in `store`, duplicates included, in position order.
    async fn events(&self, store: &str, tenant: Uuid) -> Vec<Uuid> {
        let sql = format!(
            "SELECT event_id FROM {} WHERE tenant_id = $1 ORDER BY position",
            self.table(store)
        );
        sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await
            .expect("read events")
    }
}

/// Copies the tenant's source events that the target lacks. Positions come from a sequence,
/// so they are not in commit order: a copier that only looked past the last position could
/// miss an event committed late with a lower one; this one never does.
#[async_trait]
impl EventCopier for EventTables {
    async fn copy_batch(&self, request: &CopyRequest<'_>) -> Result<CopyBatch, BoxError> {
        let sql = format!(
            "WITH copied AS (INSERT INTO {target} (event_id, tenant_id, source_position) \
             SELECT s.event_id, s.tenant_id, s.position FROM {source} s \
             WHERE s.tenant_id = $1 AND NOT EXISTS \
                 (SELECT 1 FROM {target} t WHERE t.event_id = s.event_id) \
             ORDER BY s.position LIMIT $2 RETURNING source_position) \
             SELECT count(*), max(source_position) FROM copied",
            target = self.table(request.target_store_id),
            source = self.table(request.source_store_id),
        );
        let (copied, last): (i64, Option<i64>) = sqlx::query_as(AssertSqlSafe(sql))
            .bind(request.tenant_id)
            .bind(i64::from(request.batch_size))
            .fetch_one(&self.pool)
            .await?;
        Ok(CopyBatch::new(copied as u64, last))
    }
}

#[async_trait]
impl SyncLag for EventTables {
    async fn lag(&self, tenant: Uuid, source: &str, target: &str) -> Result<Option<u64>, BoxError> {
        let sql = format!(
            "SELECT (SELECT count(*) FROM {} WHERE tenant_id = $1) \
             - (SELECT count(*) FROM {} WHERE tenant_id = $1)",
            self.table(source),
            self.table(target)
        );
        let lag: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(lag.max(0) as u64))
    }
}

/// The start of a write: the gate entered and the routing read in the write's transaction,
/// the event appended to every store the routing names, not yet committed.
async fn begin_write(
    pool: &PgPool,
    routing: &PostgresMigrationStore,
    tables: &EventTables,
    tenant: Uuid,
    event: Uuid,
) -> (sqlx::PgTransaction<'static>, TenantRouting) {
    let mut tx = pool.begin().await.expect("begin");
    WriteGate::enter(&mut tx, tenant)
        .await
        .expect("enter the gate");
    let route = routing
        .get_routing_in(&mut tx, tenant)
        .await
        .expect("read routing")
        .expect("the tenant is routed");
    for store in route.write_stores() {
        tables.insert(&mut tx, store, tenant, event).await;
    }
    (tx, route)
}

async fn write(
    pool: &PgPool,
    routing: &PostgresMigrationStore,
    tables: &EventTables,
    tenant: Uuid,
    event: Uuid,
) -> TenantRouting {
    let (tx, route) = begin_write(pool, routing, tables, tenant, event).await;
    tx.commit().await.expect("commit");
    route
}

#[tokio::test]
async fn postgres_an_in_flight_write_drains_and_a_new_write_waits_for_the_new_routing() {
    let h = Harness::postgres().await;
    let schema = h.schema().unwrap().to_owned();
    let p = h.process("gate-cutover").await;
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let tables = EventTables::create(pool_named(2, "gate-tables").await, &schema).await;
    let routing =
        PostgresMigrationStore::with_schema(pool_named(2, "gate-routing").await, &schema).unwrap();
    let (writer_a, writer_b, writer_c) = (
        pool_named(2, &common::app_name("writer-a")).await,
        pool_named(2, &common::app_name("writer-b")).await,
        pool_named(2, &common::app_name("writer-c")).await,
    );
    let observer = observer().await;
    let gate_id = WriteGate::lock_id(tenant);
    let waiters = |n: usize| {
        let observer = observer.clone();
        async move {
            lock_rows(&observer, gate_id)
                .await
                .iter()
                .filter(|row| !row.granted)
                .count()
                == n
        }
    };

    // Writer A is in flight: inside the gate, routed for dual writes, not committed.
    let (event_a, event_b) = (Uuid::new_v4(), Uuid::new_v4());
    let (write_a, route_a) = begin_write(&writer_a, &routing, &tables, tenant, event_a).await;
    assert_eq!(route_a.state, RoutingState::DualWrite);

    // The cutover starts and waits for A to drain.
    let cutover = Arc::new(CutoverManager::new(
        p.locks.clone(),
        p.store.clone(),
        TestStores::new(),
    ));
    let cutting = tokio::spawn({
        let (cutover, lag) = (cutover.clone(), tables.clone());
        async move { cutover.execute_cutover(m.id, &lag).await }
    });
    eventually("the cutover waits for the write gate", || waiters(1)).await;
    let rows = lock_rows(&observer, gate_id).await;
    assert!(
        rows.iter()
            .any(|row| !row.granted && row.mode == "ExclusiveLock"),
        "{rows:?}"
    );
    assert!(!cutting.is_finished());
    let during = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        during.state,
        RoutingState::DualWrite,
        "nothing switches while a write is in flight"
    );

    // Writer B starts during the cutover: it waits behind it, and so is refused a try.
    let writing_b = tokio::spawn({
        let (routing, tables) = (routing.clone(), tables.clone());
        async move { write(&writer_b, &routing, &tables, tenant, event_b).await }
    });
    eventually("writer B waits behind the cutover", || waiters(2)).await;
    let mut probe = writer_c.begin().await.unwrap();
    assert!(
        !WriteGate::try_enter(&mut probe, tenant).await.unwrap(),
        "a new writer cannot overtake the waiting cutover"
    );
    probe.rollback().await.unwrap();
    assert!(!writing_b.is_finished());

    // A commits; the cutover gets the gate, switches, and lets B in.
    write_a.commit().await.expect("A commits");
    let result = within("the cutover", cutting).await.unwrap();
    assert!(result.is_ok(), "{result:?}");
    let route_b = within("B's write", writing_b).await.unwrap();
    assert_eq!(
        (route_b.state, route_b.store_id.as_str()),
        (RoutingState::Migrated, TARGET),
        "B read the routing the cutover committed"
    );
    assert_eq!(route_b.write_stores(), [TARGET]);

    assert_eq!(tables.events(SOURCE, tenant).await, [event_a]);
    assert_eq!(tables.events(TARGET, tenant).await, [event_a, event_b]);
    assert!(waiters(0).await);
}

/// Writers appending all along, from two "processes", while one tenant is bulk-copied,
/// switched to dual writes and cut over: every acknowledged event ends up in the target
/// exactly once, and each is in the stores its routing named.
#[tokio::test]
async fn postgres_writers_racing_a_migration_lose_and_misroute_nothing() {
    const WRITERS: usize = 4;
    const SEEDED: usize = 150;
    const WRITES_AFTER_CUTOVER: usize = 10;

    let h = Harness::postgres().await;
    let schema = h.schema().unwrap().to_owned();
    let p = h.process("race-coordinator").await;
    let tenant = Uuid::new_v4();
    let tables = EventTables::create(pool_named(4, "race-tables").await, &schema).await;
    let routing =
        PostgresMigrationStore::with_schema(pool_named(4, "race-routing").await, &schema).unwrap();
    routing
        .ensure_routing(tenant, SOURCE)
        .await
        .expect("route the tenant");
    for _ in 0..SEEDED {
        write(&tables.pool, &routing, &tables, tenant, Uuid::new_v4()).await;
    }
    let coordinator = MigrationCoordinator::builder(p.store.clone(), TestStores::new())
        .source_store_id(SOURCE)
        .copier(Arc::new(tables.clone()))
        .sync_lag(Arc::new(tables.clone()))
        .lock_manager(p.locks.clone())
        .build();

    // Every acknowledged write: its event and the routing it followed.
    let acked: Arc<Mutex<Vec<(Uuid, TenantRouting)>>> = Arc::default();
    let migrated = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for n in 0..WRITERS {
        let pool = pool_named(3, &common::app_name(&format!("race-writer-{n}"))).await;
        let (routing, tables, acked, migrated) = (
            routing.clone(),
            tables.clone(),
            acked.clone(),
            migrated.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut after = 0;
            while after < WRITES_AFTER_CUTOVER {
                let event = Uuid::new_v4();
                let route = write(&pool, &routing, &tables, tenant, event).await;
                if migrated.load(Ordering::SeqCst) {
                    after += 1;
                }
                acked.lock().unwrap().push((event, route));
            }
        }));
    }

    let config = MigrationConfig::default()
        .batch_size(500)
        .cutover_timeout(Duration::from_secs(10));
    let m = coordinator
        .start_migration(tenant, TARGET, config)
        .await
        .unwrap();
    let copied = coordinator.run_bulk_copy(m.id).await.unwrap();
    assert_eq!(copied.phase, MigrationPhase::DualWrite);
    assert!(copied.events_copied >= SEEDED as u64, "{copied:?}");
    coordinator
        .trigger_cutover(m.id)
        .await
        .expect("the cutover switches");
    migrated.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    let source = tables.events(SOURCE, tenant).await;
    let target = tables.events(TARGET, tenant).await;
    let mut in_target: HashMap<Uuid, usize> = HashMap::new();
    for event in &target {
        *in_target.entry(*event).or_default() += 1;
    }
    let duplicated: Vec<_> = in_target.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicated.is_empty(),
        "duplicated in the target: {duplicated:?}"
    );
    let all: BTreeSet<Uuid> = (tables.events(SOURCE, tenant).await.into_iter())
        .chain(acked.iter().map(|(event, _)| *event))
        .collect();
    let target_set: BTreeSet<Uuid> = target.iter().copied().collect();
    assert_eq!(
        target_set, all,
        "every event of the tenant is in the target"
    );
    let source_set: BTreeSet<Uuid> = source.iter().copied().collect();
    let mut states = BTreeSet::new();
    for (event, route) in &acked {
        states.insert(route.state.as_str());
        match route.state {
            RoutingState::Migrated => assert!(
                !source_set.contains(event),
                "{event} was routed to the target only, yet is in the source"
            ),
            _ => assert!(
                source_set.contains(event),
                "{event} was routed to the source, yet is not there"
            ),
        }
    }
    assert!(
        states.contains("migrated") && states.len() >= 2,
        "writers saw the migration happen: {states:?}"
    );
    // No write routed by the old routing landed after the switch: the last write to the source
    // happened before the cutover completed (both clocks are the server's).
    let completed = p
        .store
        .audit_log(m.id)
        .await
        .unwrap()
        .into_iter()
        .find(|entry| entry.event == AuditEvent::CutoverCompleted)
        .expect("the cutover is logged");
    let sql = format!(
        "SELECT max(written_at) FROM {} WHERE tenant_id = $1",
        tables.table(SOURCE)
    );
    let last_source_write: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(tenant)
        .fetch_one(&tables.pool)
        .await
        .unwrap();
    assert!(
        last_source_write < completed.occurred_at,
        "a write reached the source at {last_source_write} after the switch at {}",
        completed.occurred_at
    );
    assert_eq!(target.len(), SEEDED + acked.len());
    let routed_to_source = acked
        .iter()
        .filter(|(_, route)| route.state != RoutingState::Migrated)
        .count();
    assert_eq!(source.len(), SEEDED + routed_to_source);
}

/// With an in-memory lock manager, writers hold the gate through `enter_with`, and the
/// cutover drains them the same way.
#[tokio::test]
async fn memory_the_cutover_waits_for_a_writer_inside_the_gate() {
    let h = Harness::memory();
    let server = InMemoryLockServer::new();
    let cutover_locks: Arc<dyn LockManager> =
        Arc::new(InMemoryLockManager::builder().server(&server).build());
    let writer = InMemoryLockManager::builder().server(&server).build();
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = Arc::new(CutoverManager::new(
        cutover_locks,
        h.store.clone(),
        TestStores::new(),
    ));

    let inside = WriteGate::enter_with(&writer, tenant, None).await.unwrap();
    let cutting = tokio::spawn({
        let (cutover, lag) = (cutover.clone(), lag.clone());
        async move { cutover.execute_cutover(m.id, &*lag).await }
    });
    // The cutover cannot get past the gate while the writer is inside: a later writer is
    // refused, and nothing has been written.
    let other = InMemoryLockManager::builder().server(&server).build();
    eventually("the cutover queues for the gate", || async {
        match other
            .try_acquire_shared(&WriteGate::key(tenant))
            .await
            .unwrap()
        {
            pglock::Attempt::Acquired(probe) => {
                probe.release().await.unwrap();
                false
            }
            _busy => true,
        }
    })
    .await;
    assert_eq!(lag.calls(), 0);
    assert!(!cutting.is_finished());
    assert_eq!(
        h.store.get_migration(m.id).await.unwrap().unwrap().phase,
        MigrationPhase::DualWrite
    );

    inside.release().await.unwrap();
    let result = within("the cutover", cutting).await.unwrap();
    assert!(result.is_ok(), "{result:?}");
    let after = WriteGate::enter_with(&writer, tenant, Some(Duration::from_secs(10)))
        .await
        .expect("the gate is open again");
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(routing.write_stores(), [TARGET]);
    after.release().await.unwrap();
}
