//! Move one tenant to a dedicated store while everyone keeps writing, and prove that no event
//! was lost or written twice.
//!
//! Two event stores, `shared` and `dedicated`, are two schemas in one PostgreSQL. Four tenants
//! live on `shared`; writers from two "replicas" append events for all of them, each write
//! entering the tenant's write gate, reading the tenant's routing and writing where it says.
//! Meanwhile one tenant is bulk-copied to `dedicated`, switched to dual writes, and cut over,
//! with both replicas triggering the cutover at the same moment. At the end every event of
//! that tenant must be in `dedicated` exactly once, and every write must have gone where its
//! routing said.
//!
//! ```text
//! cargo run -p pglock-migration --example tenant_cutover
//! DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run -p pglock-migration --example tenant_cutover
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, as pglock's own tests do (`pglock_testing::database_url`). Everything the example creates lives in schemas named
//! after the run, dropped at the end.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pglock::PostgresLockManager;
use pglock_migration::{
    BoxError, CopyBatch, CopyRequest, Cutover, Error, EventCopier, MigrationConfig,
    MigrationCoordinator, PostgresMigrationStore, RoutingRepository, RoutingState, StoreRegistry,
    SyncLag, TenantRouting, WriteGate,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use uuid::Uuid;

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const SHARED: &str = "shared";
const DEDICATED: &str = "dedicated";
const TENANTS: usize = 4;
const SEEDED_PER_TENANT: usize = 200;
const WRITERS_PER_TENANT: usize = 2;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let url = pglock_testing::database_url();
    let run = &Uuid::new_v4().simple().to_string()[..8];
    let stores = EventStores::create(connect(url, 4).await?, run).await?;
    println!("== tenant_cutover (run {run}) ==");
    println!(
        "stores: '{SHARED}' and '{DEDICATED}' are schemas {} and {}; migration state in {}",
        stores.schema(SHARED),
        stores.schema(DEDICATED),
        stores.ops_schema
    );

    // Two replicas: each has its own pools, lock manager, store handle and coordinator.
    let replica = |name: &'static str| {
        let stores = stores.clone();
        async move {
            let migrations =
                PostgresMigrationStore::with_schema(connect(url, 4).await?, &stores.ops_schema)?;
            let locks = PostgresLockManager::builder(connect(url, 4).await?)
                .holder_id(name)
                .build();
            let coordinator = MigrationCoordinator::builder(
                Arc::new(migrations.clone()),
                Arc::new(stores.clone()),
            )
            .source_store_id(SHARED)
            .copier(Arc::new(stores.clone()))
            .sync_lag(Arc::new(stores.clone()))
            .lock_manager(Arc::new(locks))
            .build();
            BoxResult::Ok((migrations, coordinator))
        }
    };
    let (migrations_a, replica_a) = replica("replica-a").await?;
    let (migrations_b, replica_b) = replica("replica-b").await?;
    migrations_a.ensure_schema().await?;

    let tenants: Vec<Uuid> = (0..TENANTS).map(|_| Uuid::new_v4()).collect();
    let moving = tenants[2];
    for tenant in &tenants {
        migrations_a.ensure_routing(*tenant, SHARED).await?;
        for _ in 0..SEEDED_PER_TENANT {
            write(&stores.pool, &migrations_a, &stores, *tenant).await?;
        }
    }
    println!("seeded {TENANTS} tenants with {SEEDED_PER_TENANT} events each on '{SHARED}'");
    println!("moving tenant {moving}");

    // The writers: two per tenant, alternating between the replicas, until told to stop.
    let acked: Arc<Mutex<Vec<(Uuid, Uuid, TenantRouting)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for (n, tenant) in tenants
        .iter()
        .flat_map(|t| std::iter::repeat_n(*t, WRITERS_PER_TENANT))
        .enumerate()
    {
        let routing = if n % 2 == 0 {
            migrations_a.clone()
        } else {
            migrations_b.clone()
        };
        let (stores, acked, stop, pool) = (
            stores.clone(),
            acked.clone(),
            stop.clone(),
            connect(url, 2).await?,
        );
        writers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let (event, route) = write(&pool, &routing, &stores, tenant).await?;
                acked.lock().unwrap().push((tenant, event, route));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            BoxResult::Ok(())
        }));
    }
    println!(
        "{} writers are appending through the write gate",
        writers.len()
    );

    let config = MigrationConfig::default()
        .batch_size(100)
        .cutover_timeout(Duration::from_secs(2));
    let migration = replica_a.start_migration(moving, DEDICATED, config).await?;
    println!(
        "[start]     migration {} is {}",
        migration.id, migration.phase
    );
    let copied = replica_a.run_bulk_copy(migration.id).await?;
    println!(
        "[bulk copy] copied {} events in batches of {}; switched to {} under the write gate",
        copied.events_copied, config.batch_size, copied.phase
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let readiness = replica_b.cutover_readiness(migration.id).await?;
    println!("[readiness] replica-b asks: {readiness}");

    println!("[cutover]   replica-a and replica-b trigger the cutover at the same moment");
    let (a, b) = tokio::join!(
        replica_a.trigger_cutover(migration.id),
        replica_b.trigger_cutover(migration.id)
    );
    report("replica-a", a)?;
    report("replica-b", b)?;
    let routing = migrations_a.get_routing(moving).await?.expect("routed");
    println!(
        "[routing]   tenant {moving} is {} on '{}'",
        routing.state, routing.store_id
    );

    // Let the writers go on for a while on the new routing, then stop them.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await??;
    }
    let log = replica_a.store().audit_log(migration.id).await?;
    let events: Vec<&str> = log.iter().map(|entry| entry.event.as_str()).collect();
    println!("[audit]     {}", events.join(" -> "));

    let acked = acked.lock().unwrap().clone();
    let verdict = verify(&stores, &tenants, moving, &acked).await;
    stores.drop_all().await?;
    verdict?;
    println!("OK: no event was lost, duplicated or misrouted");
    Ok(())
}

/// Prints what one replica's cutover did. A cutover that did not switch is an expected
/// outcome here (the other replica won); any other error ends the example.
fn report(replica: &str, result: pglock_migration::Result<Cutover>) -> BoxResult<()> {
    match result {
        Ok(done) => println!(
            "            {replica}: switched the tenant in {:.1} ms (lock wait included)",
            done.duration_ms()
        ),
        Err(Error::Cutover(failed)) => println!(
            "            {replica}: did nothing, after {:.1} ms: {failed}",
            failed.duration_ms()
        ),
        Err(err) => return Err(err.into()),
    }
    Ok(())
}

/// One write: enter the tenant's gate, read its routing, append to every store it names,
/// commit. A cutover can neither switch the routing under this write nor miss it.
async fn write(
    pool: &PgPool,
    routing: &PostgresMigrationStore,
    stores: &EventStores,
    tenant: Uuid,
) -> BoxResult<(Uuid, TenantRouting)> {
    let event = Uuid::new_v4();
    let mut tx = pool.begin().await?;
    WriteGate::enter(&mut tx, tenant).await?;
    let route = routing
        .get_routing_in(&mut tx, tenant)
        .await?
        .ok_or("the tenant has no routing")?;
    for store in route.write_stores() {
        stores.append(&mut tx, store, tenant, event).await?;
    }
    tx.commit().await?;
    Ok((event, route))
}

/// The checks: for the moving tenant, every event in `dedicated` exactly once; for every
/// write, the stores its routing named, and only those.
async fn verify(
    stores: &EventStores,
    tenants: &[Uuid],
    moving: Uuid,
    acked: &[(Uuid, Uuid, TenantRouting)],
) -> BoxResult<()> {
    let mut after_cutover = 0;
    for &tenant in tenants {
        let shared = stores.events(SHARED, tenant).await?;
        let dedicated = stores.events(DEDICATED, tenant).await?;
        let shared_set: BTreeSet<Uuid> = shared.iter().copied().collect();
        let mine: Vec<&(Uuid, Uuid, TenantRouting)> =
            acked.iter().filter(|(t, _, _)| *t == tenant).collect();
        for (_, event, route) in &mine {
            let in_shared = shared_set.contains(event);
            let expected_in_shared = route.state != RoutingState::Migrated;
            if in_shared != expected_in_shared {
                return Err(
                    format!("event {event} misrouted (routing was {})", route.state).into(),
                );
            }
        }
        if tenant != moving {
            if !dedicated.is_empty() {
                return Err(format!("tenant {tenant} has events in '{DEDICATED}'").into());
            }
            continue;
        }
        let mut copies: HashMap<Uuid, usize> = HashMap::new();
        for event in &dedicated {
            *copies.entry(*event).or_default() += 1;
        }
        if let Some((event, n)) = copies.iter().find(|(_, n)| **n > 1) {
            return Err(format!("event {event} is in '{DEDICATED}' {n} times").into());
        }
        let expected: BTreeSet<Uuid> = shared
            .iter()
            .copied()
            .chain(mine.iter().map(|(_, event, _)| *event))
            .collect();
        let actual: BTreeSet<Uuid> = copies.keys().copied().collect();
        if expected != actual {
            let lost = expected.difference(&actual).count();
            let extra = actual.difference(&expected).count();
            return Err(format!("{lost} event(s) lost, {extra} unexpected").into());
        }
        after_cutover = mine
            .iter()
            .filter(|(_, _, route)| route.state == RoutingState::Migrated)
            .count();
        println!(
            "[check]     tenant {tenant}: {} events, all in '{DEDICATED}' exactly once; \
             {after_cutover} written after the cutover, none of them in '{SHARED}'",
            actual.len()
        );
    }
    if after_cutover == 0 {
        return Err("no write happened after the cutover".into());
    }
    println!(
        "[check]     the other {} tenants: every event in '{SHARED}' where it was written, none in '{DEDICATED}'",
        tenants.len() - 1
    );
    Ok(())
}

/// The application's event stores: one `events` table per store schema.
#[derive(Debug, Clone)]
struct EventStores {
    pool: PgPool,
    run: String,
    ops_schema: String,
}

impl EventStores {
    async fn create(pool: PgPool, run: &str) -> BoxResult<Self> {
        let stores = EventStores {
            pool,
            run: run.to_owned(),
            ops_schema: format!("tenant_cutover_{run}_ops"),
        };
        for store in [SHARED, DEDICATED] {
            // Schema names are built from constants and a hex run id: plain identifiers.
            let sql = format!(
                "CREATE SCHEMA {schema}; CREATE TABLE {schema}.events (\
                 position bigserial PRIMARY KEY, event_id uuid NOT NULL, tenant_id uuid NOT NULL, \
                 copied_from bigint)",
                schema = stores.schema(store)
            );
            sqlx::raw_sql(AssertSqlSafe(sql))
                .execute(&stores.pool)
                .await?;
        }
        Ok(stores)
    }

    fn schema(&self, store: &str) -> String {
        format!("tenant_cutover_{}_{store}", self.run)
    }

    async fn append(
        &self,
        conn: &mut PgConnection,
        store: &str,
        tenant: Uuid,
        event: Uuid,
    ) -> BoxResult<()> {
        let sql = format!(
            "INSERT INTO {}.events (event_id, tenant_id) VALUES ($1, $2)",
            self.schema(store)
        );
        sqlx::query(AssertSqlSafe(sql))
            .bind(event)
            .bind(tenant)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The tenant's events in `store`, duplicates included.
    async fn events(&self, store: &str, tenant: Uuid) -> BoxResult<Vec<Uuid>> {
        let sql = format!(
            "SELECT event_id FROM {}.events WHERE tenant_id = $1 ORDER BY position",
            self.schema(store)
        );
        Ok(sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?)
    }

    async fn drop_all(&self) -> BoxResult<()> {
        let sql = format!(
            "DROP SCHEMA {} CASCADE; DROP SCHEMA {} CASCADE; DROP SCHEMA IF EXISTS {} CASCADE",
            self.schema(SHARED),
            self.schema(DEDICATED),
            self.ops_schema
        );
        sqlx::raw_sql(AssertSqlSafe(sql))
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl StoreRegistry for EventStores {
    fn is_registered(&self, store_id: &str) -> bool {
        matches!(store_id, SHARED | DEDICATED)
    }

    async fn check_health(&self, store_id: &str) -> Result<(), BoxError> {
        let sql = format!("SELECT count(*) FROM {}.events", self.schema(store_id));
        sqlx::query(AssertSqlSafe(sql)).execute(&self.pool).await?;
        Ok(())
    }
}

/// Copies the tenant's events that the target does not have yet, in source order. Positions
/// come from a sequence, so concurrent writers commit them out of order: a copier that only
/// looked past the last copied position could miss a late commit below it. This one cannot,
/// and it is idempotent, as a copier must be.
#[async_trait]
impl EventCopier for EventStores {
    async fn copy_batch(&self, request: &CopyRequest<'_>) -> Result<CopyBatch, BoxError> {
        let sql = format!(
            "WITH copied AS (INSERT INTO {target}.events (event_id, tenant_id, copied_from) \
             SELECT s.event_id, s.tenant_id, s.position FROM {source}.events s \
             WHERE s.tenant_id = $1 AND NOT EXISTS \
                 (SELECT 1 FROM {target}.events t WHERE t.event_id = s.event_id) \
             ORDER BY s.position LIMIT $2 RETURNING copied_from) \
             SELECT count(*), max(copied_from) FROM copied",
            target = self.schema(request.target_store_id),
            source = self.schema(request.source_store_id),
        );
        let (copied, last): (i64, Option<i64>) = sqlx::query_as(AssertSqlSafe(sql))
            .bind(request.tenant_id)
            .bind(i64::from(request.batch_size))
            .fetch_one(&self.pool)
            .await?;
        Ok(CopyBatch::new(copied as u64, last))
    }

    async fn count_events(&self, tenant: Uuid, source: &str) -> Result<Option<u64>, BoxError> {
        let sql = format!(
            "SELECT count(*) FROM {}.events WHERE tenant_id = $1",
            self.schema(source)
        );
        let count: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(count as u64))
    }
}

/// Events in the source that the target lacks. With writes gated, the cutover measures it
/// while no write is in flight.
#[async_trait]
impl SyncLag for EventStores {
    async fn lag(&self, tenant: Uuid, source: &str, target: &str) -> Result<Option<u64>, BoxError> {
        let sql = format!(
            "SELECT count(*) FROM {}.events s WHERE s.tenant_id = $1 AND NOT EXISTS \
             (SELECT 1 FROM {}.events t WHERE t.event_id = s.event_id)",
            self.schema(source),
            self.schema(target)
        );
        let lag: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        Ok(Some(lag as u64))
    }
}

async fn connect(url: &str, max: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
}
