//! The per-tenant write gate: writers share it, the cutover closes it.

use std::time::Duration;

use sqlx::PgTransaction;
use uuid::Uuid;

use crate::{Error, Result, WRITE_GATE_OPERATION};
use pglock::{
    LockGuard, LockManager, LockManagerExt, TransactionLock, lock_id, migration_lock_key,
};

/// A tenant's write gate: the advisory lock that makes the cutover's write pause hold across
/// processes.
///
/// Every write of a tenant that may be migrating takes the gate in **shared** mode for the
/// duration of its write transaction; many writers hold it at once and never wait for each
/// other. A cutover (and the switch from bulk copy to dual writes) takes it **exclusively**
/// through its [`LockManager`]. PostgreSQL queues lock requests in arrival order, so once the
/// cutover asks for the gate:
///
/// * writes already inside the gate finish and commit (they *drain*) before the cutover gets it;
/// * writes that start afterwards wait behind the cutover, and enter once the cutover has
///   committed the new routing and let the gate go.
///
/// A writer must therefore read the tenant's routing *after* entering the gate, in the same
/// transaction or later. Then no write can be routed by a routing that a cutover replaces
/// before the write commits.
///
/// # Writers on PostgreSQL
///
/// [`enter`](WriteGate::enter) takes the gate as a shared [`TransactionLock`] in the writer's
/// own transaction (`pg_advisory_xact_lock_shared`), so the gate is held exactly until that
/// transaction commits or rolls back, and costs no extra connection. The transaction must run on the database of the cutover's
/// [`PostgresLockManager`](pglock::PostgresLockManager): if the event stores live elsewhere,
/// open the gate transaction there and keep it open around the write.
///
/// ```no_run
/// use pglock_migration::{RoutingRepository, WriteGate};
/// # async fn run(pool: sqlx::PgPool, routing: &dyn RoutingRepository, tenant: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// WriteGate::enter(&mut tx, tenant).await?; // waits while a cutover switches this tenant
/// let route = routing.get_routing(tenant).await?.expect("routed tenant");
/// for store in route.write_stores() {
///     println!("append the event to {store}"); // your store's append
/// }
/// tx.commit().await?; // lets a waiting cutover in
/// # Ok(()) }
/// ```
///
/// # Writers without PostgreSQL
///
/// [`enter_with`](WriteGate::enter_with) takes the gate in shared mode through a
/// [`LockManager`] and returns its guard: hold the guard for the duration of the write. With an
/// [`InMemoryLockManager`](pglock::InMemoryLockManager) this lets unit tests play writers
/// racing a cutover.
#[derive(Debug, Clone, Copy)]
pub struct WriteGate;

impl WriteGate {
    /// The gate's lock key: `"write-gate:{tenant_id}"`.
    ///
    /// ```
    /// let tenant = uuid::Uuid::parse_str("123e4567-e89b-12d3-a456-426614174000").unwrap();
    /// assert_eq!(
    ///     pglock_migration::WriteGate::key(tenant),
    ///     "write-gate:123e4567-e89b-12d3-a456-426614174000",
    /// );
    /// ```
    pub fn key(tenant_id: Uuid) -> String {
        migration_lock_key(tenant_id, WRITE_GATE_OPERATION)
    }

    /// The gate's advisory lock id: [`lock_id`] of [`key`](WriteGate::key).
    pub fn lock_id(tenant_id: Uuid) -> i64 {
        lock_id(&Self::key(tenant_id))
    }

    /// Enters the gate for the rest of `tx`, waiting while a cutover holds it.
    ///
    /// The wait is bounded only by the transaction's own `lock_timeout` or
    /// `statement_timeout`, if set (the error then carries the server's message).
    ///
    /// # Errors
    ///
    /// [`Error::Lock`] with the errors of [`TransactionLock::acquire`]: `tx` not in a
    /// transaction block, a standby, the server's refusal, a broken connection.
    ///
    /// # Cancel safety
    ///
    /// As for [`TransactionLock::acquire`]: a dropped call leaves the transaction either
    /// without the gate or holding it until the transaction ends.
    pub async fn enter(tx: &mut PgTransaction<'_>, tenant_id: Uuid) -> Result<()> {
        Self::transaction_lock(tenant_id)
            .acquire(tx, None)
            .await
            .map_err(Error::Lock)
    }

    /// Enters the gate for the rest of `tx` if no cutover holds or awaits it; returns whether
    /// it did.
    ///
    /// # Errors
    ///
    /// As for [`enter`](WriteGate::enter).
    ///
    /// # Cancel safety
    ///
    /// As for [`TransactionLock::try_acquire`].
    pub async fn try_enter(tx: &mut PgTransaction<'_>, tenant_id: Uuid) -> Result<bool> {
        Self::transaction_lock(tenant_id)
            .try_acquire(tx)
            .await
            .map_err(Error::Lock)
    }

    /// The gate as a lock of the writer's transaction: shared, so writers never exclude each
    /// other, only the cutover's exclusive hold.
    fn transaction_lock(tenant_id: Uuid) -> TransactionLock {
        TransactionLock::shared(Self::key(tenant_id))
    }

    /// Enters the gate through `locks` in shared mode and returns the guard that holds it.
    ///
    /// # Errors
    ///
    /// The errors of [`LockManagerExt::acquire_shared`]: a timeout while a cutover holds the gate
    /// past `timeout`, and connection errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManagerExt::acquire_shared`].
    pub async fn enter_with(
        locks: &dyn LockManager,
        tenant_id: Uuid,
        timeout: Option<Duration>,
    ) -> pglock::Result<LockGuard> {
        locks.acquire_shared(Self::key(tenant_id), timeout).await
    }
}
