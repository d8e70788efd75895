//! The migration coordinator: a tenant's migration from start to cutover.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tracing::{Instrument, Span, field::Empty};
use uuid::Uuid;

use crate::cutover::{Cutover, CutoverManager, DEFAULT_LOCK_TIMEOUT, Readiness};
use crate::gate::WriteGate;
use crate::model::{
    AuditEvent, Migration, MigrationConfig, MigrationPhase, NewMigration, RoutingState,
    TenantRouting,
};
use crate::plugins::{CopyRequest, EventCopier, StoreRegistry, SyncLag};
use crate::store::{MigrationStore, RoutingChange, Transition};
use crate::telemetry::{self, outcome};
use crate::{Error, Result};
use pglock::{LockManager, LockManagerExt};

/// The store id a tenant without routing is assumed to live on: `"default"`, as in the
/// Python original.
pub const DEFAULT_SOURCE_STORE_ID: &str = "default";

/// A migration together with its tenant's routing.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct MigrationStatus {
    /// The migration.
    pub migration: Migration,
    /// The tenant's routing, if it has a row.
    pub routing: Option<TenantRouting>,
    /// The share of events copied, from 0 to 100, when the total is known.
    pub progress_percent: Option<f64>,
}

/// Runs tenant migrations: start, bulk copy, dual writes, cutover; pause, resume, abort.
///
/// The coordinator keeps no state of its own: everything is in its [`MigrationStore`], so any
/// process may pick up any migration, and several coordinators (one per replica) may work on
/// the same store. What must not run twice at once, the cutover and the switch to dual writes,
/// runs under locks of its [`LockManager`].
///
/// The application plugs in its [`StoreRegistry`] (required), an [`EventCopier`] (for
/// [`run_bulk_copy`](Self::run_bulk_copy)), a [`SyncLag`] and a lock manager (for
/// [`trigger_cutover`](Self::trigger_cutover)).
///
/// ```
/// use std::sync::Arc;
/// use async_trait::async_trait;
/// use pglock::InMemoryLockManager;
/// use pglock_migration::*;
///
/// #[derive(Debug)]
/// struct TwoStores;
/// #[async_trait]
/// impl StoreRegistry for TwoStores {
///     fn is_registered(&self, store_id: &str) -> bool { matches!(store_id, "shared" | "dedicated") }
///     async fn check_health(&self, _store_id: &str) -> Result<(), BoxError> { Ok(()) }
/// }
///
/// #[derive(Debug)]
/// struct NoEvents; // a tenant with no events: nothing to copy, no lag
/// #[async_trait]
/// impl EventCopier for NoEvents {
///     async fn copy_batch(&self, _: &CopyRequest<'_>) -> Result<CopyBatch, BoxError> {
///         Ok(CopyBatch::caught_up())
///     }
/// }
/// #[async_trait]
/// impl SyncLag for NoEvents {
///     async fn lag(&self, _: uuid::Uuid, _: &str, _: &str) -> Result<Option<u64>, BoxError> {
///         Ok(Some(0))
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock_migration::Result<()> {
/// let store = Arc::new(InMemoryMigrationStore::new());
/// let coordinator = MigrationCoordinator::builder(store.clone(), Arc::new(TwoStores))
///     .source_store_id("shared")
///     .copier(Arc::new(NoEvents))
///     .sync_lag(Arc::new(NoEvents))
///     .lock_manager(Arc::new(InMemoryLockManager::new()))
///     .build();
///
/// let tenant = uuid::Uuid::new_v4();
/// let migration = coordinator.start_migration(tenant, "dedicated", MigrationConfig::default()).await?;
/// coordinator.run_bulk_copy(migration.id).await?; // now dual-writing
/// let done = coordinator.trigger_cutover(migration.id).await?;
/// assert_eq!(done.migration_id, migration.id);
/// let routing = store.get_routing(tenant).await?.unwrap();
/// assert_eq!((routing.store_id.as_str(), routing.state), ("dedicated", RoutingState::Migrated));
/// # Ok(()) }
/// ```
pub struct MigrationCoordinator {
    store: Arc<dyn MigrationStore>,
    stores: Arc<dyn StoreRegistry>,
    locks: Option<Arc<dyn LockManager>>,
    copier: Option<Arc<dyn EventCopier>>,
    lag: Option<Arc<dyn SyncLag>>,
    source_store_id: String,
    cutover_lock_timeout: Duration,
    tracing: bool,
}

impl MigrationCoordinator {
    /// Configures a coordinator on `store`, for the stores of `stores`.
    pub fn builder(
        store: Arc<dyn MigrationStore>,
        stores: Arc<dyn StoreRegistry>,
    ) -> MigrationCoordinatorBuilder {
        MigrationCoordinatorBuilder {
            store,
            stores,
            locks: None,
            copier: None,
            lag: None,
            source_store_id: DEFAULT_SOURCE_STORE_ID.to_owned(),
            cutover_lock_timeout: DEFAULT_LOCK_TIMEOUT,
            tracing: true,
        }
    }

    /// The store the coordinator keeps its state in.
    pub fn store(&self) -> &Arc<dyn MigrationStore> {
        &self.store
    }

    /// Starts migrating `tenant_id` to `target_store_id`: creates the migration in `pending`.
    ///
    /// The source is the store that serves the tenant now (its routing), or the coordinator's
    /// [`source_store_id`](MigrationCoordinatorBuilder::source_store_id) for a tenant without
    /// routing.
    ///
    /// # Errors
    ///
    /// * [`Error::UnknownStore`] when the target is not registered.
    /// * [`Error::ActiveMigrationExists`] when the tenant already has an active migration.
    /// * [`Error::RoutingStateChanged`] when the tenant's routing is mid-migration.
    /// * [`Error::Storage`] when the store fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the change is one all-or-nothing write, made or not.
    pub async fn start_migration(
        &self,
        tenant_id: Uuid,
        target_store_id: &str,
        config: MigrationConfig,
    ) -> Result<Migration> {
        if !self.stores.is_registered(target_store_id) {
            return Err(Error::UnknownStore {
                store_id: target_store_id.to_owned(),
            });
        }
        let source = match self.store.get_routing(tenant_id).await? {
            Some(routing) => routing.store_id,
            None => self.source_store_id.clone(),
        };
        let new = NewMigration::new(tenant_id, source, target_store_id).config(config);
        self.store.create_migration(&new).await
    }

    /// The migration `id`.
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::Storage`] when the store fails.
    pub async fn migration(&self, id: Uuid) -> Result<Migration> {
        self.store
            .get_migration(id)
            .await?
            .ok_or(Error::MigrationNotFound { migration_id: id })
    }

    /// The tenant's active migration, if any.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store fails.
    pub async fn migration_for_tenant(&self, tenant_id: Uuid) -> Result<Option<Migration>> {
        self.store.active_migration_for_tenant(tenant_id).await
    }

    /// The migration, its tenant's routing and its progress.
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::Storage`] when the store fails.
    pub async fn status(&self, id: Uuid) -> Result<MigrationStatus> {
        let migration = self.migration(id).await?;
        let routing = self.store.get_routing(migration.tenant_id).await?;
        Ok(MigrationStatus {
            progress_percent: migration.progress_percent(),
            migration,
            routing,
        })
    }

    /// Every migration in a non-terminal phase, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store fails.
    pub async fn list_active_migrations(&self) -> Result<Vec<Migration>> {
        self.store.list_active_migrations().await
    }

    /// Pauses the bulk copy: [`run_bulk_copy`](Self::run_bulk_copy) stops after its current
    /// batch and returns. The phase does not change.
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::WrongPhase`] for a finished migration;
    /// [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the change is one all-or-nothing write, made or not.
    pub async fn pause_migration(&self, id: Uuid, reason: Option<&str>) -> Result<Migration> {
        self.store.set_paused(id, true, reason).await
    }

    /// Resumes a paused bulk copy; call [`run_bulk_copy`](Self::run_bulk_copy) again to carry
    /// on from where it stopped.
    ///
    /// # Errors
    ///
    /// As for [`pause_migration`](Self::pause_migration).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the change is one all-or-nothing write, made or not.
    pub async fn resume_migration(&self, id: Uuid) -> Result<Migration> {
        self.store.set_paused(id, false, None).await
    }

    /// Aborts the migration: phase `aborted`, and the tenant back to `normal` on its source, in
    /// one transition.
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::WrongPhase`] for a finished migration;
    /// [`Error::PhaseChanged`] or [`Error::RoutingStateChanged`] when the migration moved
    /// meanwhile (read the status and try again); [`Error::Storage`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the change is one all-or-nothing write, made or not.
    pub async fn abort_migration(&self, id: Uuid, reason: &str) -> Result<Migration> {
        self.stop(id, MigrationPhase::Aborted, reason).await
    }

    /// Marks the migration failed: as [`abort_migration`](Self::abort_migration), with phase
    /// `failed` and the reason recorded as its last error.
    ///
    /// # Errors
    ///
    /// As for [`abort_migration`](Self::abort_migration).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the change is one all-or-nothing write, made or not.
    pub async fn fail_migration(&self, id: Uuid, reason: &str) -> Result<Migration> {
        self.stop(id, MigrationPhase::Failed, reason).await
    }

    async fn stop(&self, id: Uuid, to: MigrationPhase, reason: &str) -> Result<Migration> {
        let migration = self.migration(id).await?;
        if migration.phase.is_terminal() {
            return Err(Error::WrongPhase {
                migration_id: id,
                operation: if to == MigrationPhase::Aborted {
                    "abort migration"
                } else {
                    "fail migration"
                },
                phase: migration.phase,
            });
        }
        let (event, error) = match to {
            MigrationPhase::Aborted => (AuditEvent::MigrationAborted, None),
            _ => (AuditEvent::MigrationFailed, Some(reason)),
        };
        let mut transition = Transition::new(&migration, to, event)
            .attempt(migration.cutover_attempt, None)
            .message(reason);
        if let Some(error) = error {
            transition = transition.error(error);
        }
        let routing = self.store.get_routing(migration.tenant_id).await?;
        if let Some(routing) = routing.filter(|r| r.active_migration_id == Some(id)) {
            transition = transition.routing(RoutingChange::new(
                routing.state,
                RoutingState::Normal,
                migration.source_store_id.clone(),
            ));
        }
        self.store.apply_transition(&transition).await
    }

    /// Copies the tenant's existing events to the target, then switches it to dual writes.
    ///
    /// A `pending` migration moves to `bulk_copy` (routing `bulk_copy`: writes still go to the
    /// source only). Batches are copied from the migration's last recorded position, each
    /// batch's progress recorded as it completes, until a batch comes back smaller than asked
    /// for (the copier reached the end of what was there). Then, holding
    /// the tenant's [write gate](WriteGate) exclusively, so that no write is in flight, it copies
    /// what writers appended meanwhile and moves phase and routing to `dual_write` in one
    /// transition. Every event is thus either copied or dual-written, never both, never neither.
    ///
    /// Without a lock manager the last step runs without the gate, which is only safe when no
    /// writer appends to the tenant meanwhile.
    ///
    /// Returns the migration as it is now: in `dual_write`, or still in `bulk_copy` if it was
    /// paused (run it again after [`resume_migration`](Self::resume_migration)).
    ///
    /// # Errors
    ///
    /// * [`Error::PluginMissing`] without an [`EventCopier`].
    /// * [`Error::WrongPhase`] when the migration is past `bulk_copy`.
    /// * [`Error::PluginFailed`] when a batch fails; the migration stays in `bulk_copy` and a
    ///   new call resumes after the last recorded batch.
    /// * The lock manager's errors when the write gate cannot be taken within the migration's
    ///   cutover timeout; the migration stays in `bulk_copy`.
    /// * [`Error::WrongPhase`] or [`Error::PhaseChanged`] when the migration was aborted
    ///   meanwhile, and store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the migration in `bulk_copy` with its progress
    /// up to the last recorded batch (the switch to `dual_write` is one transition, made or
    /// not), and the gate guard releases the gate as it drops.
    pub async fn run_bulk_copy(&self, id: Uuid) -> Result<Migration> {
        let copier = self.copier.as_deref().ok_or(Error::PluginMissing {
            migration_id: id,
            plugin: "event copier",
        })?;
        let mut migration = self.migration(id).await?;
        match migration.phase {
            MigrationPhase::Pending => migration = self.start_bulk_copy(copier, &migration).await?,
            MigrationPhase::BulkCopy => {}
            phase => {
                return Err(Error::WrongPhase {
                    migration_id: id,
                    operation: "run bulk copy",
                    phase,
                });
            }
        }
        // Writers keep appending meanwhile, so "nothing left" may never come: stop at the first
        // short batch, and copy the rest with the writers held back.
        migration = self
            .copy_batches(copier, migration, CopyUntil::ShortBatch)
            .await?;
        if migration.is_paused {
            return Ok(migration);
        }
        self.switch_to_dual_writes(copier, migration).await
    }

    /// `pending -> bulk_copy`, routing `normal -> bulk_copy`, then the event count.
    async fn start_bulk_copy(
        &self,
        copier: &dyn EventCopier,
        migration: &Migration,
    ) -> Result<Migration> {
        let id = migration.id;
        let routing = RoutingChange::new(
            RoutingState::Normal,
            RoutingState::BulkCopy,
            migration.source_store_id.clone(),
        )
        .target(Some(migration.target_store_id.clone()))
        .owner(Some(id));
        let start = Transition::new(
            migration,
            MigrationPhase::BulkCopy,
            AuditEvent::PhaseChanged,
        )
        .routing(routing);
        let started = self.store.apply_transition(&start).await?;
        let total = copier
            .count_events(started.tenant_id, &started.source_store_id)
            .await
            .map_err(|source| Error::PluginFailed {
                migration_id: id,
                operation: "Counting events",
                source,
            })?;
        match total {
            Some(_) => self.store.record_progress(id, 0, None, total).await,
            None => Ok(started),
        }
    }

    /// Holding the write gate, so that no write is in flight: copies the last appends, then
    /// switches phase and routing to `dual_write`. The gate guard releases the gate if this
    /// future is dropped.
    async fn switch_to_dual_writes(
        &self,
        copier: &dyn EventCopier,
        migration: Migration,
    ) -> Result<Migration> {
        let id = migration.id;
        let gate = match &self.locks {
            Some(locks) => Some(
                locks
                    .acquire(
                        WriteGate::key(migration.tenant_id),
                        Some(migration.config.cutover_timeout),
                    )
                    .await?,
            ),
            None => {
                tracing::warn!(
                    migration_id = %id,
                    "switching to dual writes without a lock manager: writes racing the switch are not drained"
                );
                None
            }
        };
        let caught_up = self
            .copy_batches(copier, migration, CopyUntil::Empty)
            .await?;
        let routing = RoutingChange::new(
            RoutingState::BulkCopy,
            RoutingState::DualWrite,
            caught_up.source_store_id.clone(),
        )
        .target(Some(caught_up.target_store_id.clone()))
        .owner(Some(id));
        let switch = Transition::new(
            &caught_up,
            MigrationPhase::DualWrite,
            AuditEvent::PhaseChanged,
        )
        .routing(routing);
        let switched = self.store.apply_transition(&switch).await;
        if let Some(gate) = gate {
            let _ = gate.release().await;
        }
        switched
    }

    /// Copies batches until `until` or the migration is paused.
    async fn copy_batches(
        &self,
        copier: &dyn EventCopier,
        mut migration: Migration,
        until: CopyUntil,
    ) -> Result<Migration> {
        while !migration.is_paused {
            let request = CopyRequest {
                migration_id: migration.id,
                tenant_id: migration.tenant_id,
                source_store_id: &migration.source_store_id,
                target_store_id: &migration.target_store_id,
                after_position: migration.last_source_position,
                batch_size: migration.config.batch_size,
            };
            let request_size = request.batch_size;
            let batch =
                copier
                    .copy_batch(&request)
                    .await
                    .map_err(|source| Error::PluginFailed {
                        migration_id: migration.id,
                        operation: "Bulk copy",
                        source,
                    })?;
            if batch.copied == 0 {
                break;
            }
            let position = batch.last_position.or(migration.last_source_position);
            migration = self
                .store
                .record_progress(migration.id, batch.copied, position, None)
                .await?;
            if until == CopyUntil::ShortBatch && batch.copied < u64::from(request_size) {
                break;
            }
        }
        Ok(migration)
    }

    /// Cuts the migration's tenant over to its target, under the tenant's cutover lock.
    ///
    /// First the original's checks, in its order, each an error: the migration exists
    /// ([`Error::MigrationNotFound`]), it is in `dual_write` ([`Error::WrongPhase`], `Cannot
    /// trigger cutover: migration is in {phase} phase`; `cutover` is let through, as an
    /// interrupted cutover is repaired under the lock), the coordinator has a [`SyncLag`]
    /// ([`Error::PluginMissing`], `No sync lag tracker found for migration`) and a lock
    /// manager ([`Error::LockManagerMissing`]). Nothing is written by a failed check.
    ///
    /// Then it runs [`CutoverManager::execute_cutover`], which re-validates everything under
    /// the lock and writes the phase change, routing and audit itself, completion or rollback
    /// included, before it releases the lock. Unlike the original, the coordinator writes
    /// nothing outside the lock: a cutover that could not take the lock leaves the migration
    /// exactly as it was.
    ///
    /// # Errors
    ///
    /// The checks above, and [`Error::Storage`] when the migration cannot be read. Every
    /// failure of the cutover itself is an [`Error::Cutover`], whose
    /// [`CutoverError`](crate::CutoverError) says why and whether it rolled back.
    ///
    /// # Cancel safety
    ///
    /// As for [`CutoverManager::execute_cutover_with`]: dropping the future never leaves the
    /// tenant stuck in `cutover`.
    pub async fn trigger_cutover(&self, id: Uuid) -> Result<Cutover> {
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::TRIGGER_SPAN,
                { telemetry::MIGRATION_ID } = %id,
                { telemetry::TENANT_ID } = Empty,
                { telemetry::OUTCOME } = Empty,
                { telemetry::FAILURE } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let mut recorder = telemetry::recorder(span.clone());
        let result = self.trigger(id, &span).instrument(span.clone()).await;
        match &result {
            Ok(_) => recorder.finish(outcome::SUCCEEDED, false),
            Err(Error::Cutover(failed)) => {
                span.record(telemetry::FAILURE, failed.failure.as_str());
                recorder.finish(outcome::FAILED, true);
            }
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "cutover not triggered");
                recorder.finish(outcome::ERROR, true);
            }
        }
        result
    }

    async fn trigger(&self, id: Uuid, span: &Span) -> Result<Cutover> {
        let migration = self.migration(id).await?;
        span.record(
            telemetry::TENANT_ID,
            tracing::field::display(migration.tenant_id),
        );
        if !matches!(
            migration.phase,
            MigrationPhase::DualWrite | MigrationPhase::Cutover
        ) {
            return Err(Error::WrongPhase {
                migration_id: id,
                operation: "trigger cutover",
                phase: migration.phase,
            });
        }
        let lag = self.lag.as_deref().ok_or(Error::PluginMissing {
            migration_id: id,
            plugin: "sync lag tracker",
        })?;
        let cutover = self.cutover_manager()?;
        Ok(cutover.execute_cutover(id, lag).await?)
    }

    /// Asks [`CutoverManager::validate_cutover_readiness`] whether the migration could be cut
    /// over now.
    ///
    /// # Errors
    ///
    /// [`Error::PluginMissing`] without a [`SyncLag`], [`Error::LockManagerMissing`] without a
    /// lock manager, and the errors of the readiness check.
    ///
    /// # Cancel safety
    ///
    /// As for [`CutoverManager::validate_cutover_readiness`].
    pub async fn cutover_readiness(&self, id: Uuid) -> Result<Readiness> {
        let lag = self.lag.as_deref().ok_or(Error::PluginMissing {
            migration_id: id,
            plugin: "sync lag tracker",
        })?;
        self.cutover_manager()?
            .validate_cutover_readiness(id, lag)
            .await
    }

    /// The cutover manager the coordinator cuts over with.
    ///
    /// # Errors
    ///
    /// [`Error::LockManagerMissing`] when the coordinator has no lock manager.
    pub fn cutover_manager(&self) -> Result<CutoverManager> {
        let locks = self.locks.clone().ok_or(Error::LockManagerMissing)?;
        Ok(
            CutoverManager::builder(locks, Arc::clone(&self.store), Arc::clone(&self.stores))
                .lock_timeout(self.cutover_lock_timeout)
                .tracing(self.tracing)
                .build(),
        )
    }
}

/// When a run of copy batches stops (besides a pause).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CopyUntil {
    /// A batch smaller than asked for: the copier reached what was there when it started.
    ShortBatch,
    /// A batch that copied nothing.
    Empty,
}

impl fmt::Debug for MigrationCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrationCoordinator")
            .field("store", &self.store)
            .field("locks", &self.locks)
            .field("source_store_id", &self.source_store_id)
            .field("cutover_lock_timeout", &self.cutover_lock_timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`MigrationCoordinator`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct MigrationCoordinatorBuilder {
    store: Arc<dyn MigrationStore>,
    stores: Arc<dyn StoreRegistry>,
    locks: Option<Arc<dyn LockManager>>,
    copier: Option<Arc<dyn EventCopier>>,
    lag: Option<Arc<dyn SyncLag>>,
    source_store_id: String,
    cutover_lock_timeout: Duration,
    tracing: bool,
}

impl MigrationCoordinatorBuilder {
    /// The lock manager for the cutover lock and the write gate. Without one,
    /// [`trigger_cutover`](MigrationCoordinator::trigger_cutover) fails with
    /// [`Error::LockManagerMissing`].
    pub fn lock_manager(mut self, locks: Arc<dyn LockManager>) -> Self {
        self.locks = Some(locks);
        self
    }

    /// The event copier for [`run_bulk_copy`](MigrationCoordinator::run_bulk_copy).
    pub fn copier(mut self, copier: Arc<dyn EventCopier>) -> Self {
        self.copier = Some(copier);
        self
    }

    /// The sync lag for cutovers.
    pub fn sync_lag(mut self, lag: Arc<dyn SyncLag>) -> Self {
        self.lag = Some(lag);
        self
    }

    /// The store a tenant without routing lives on. Default: `"default"`.
    pub fn source_store_id(mut self, store_id: impl Into<String>) -> Self {
        self.source_store_id = store_id.into();
        self
    }

    /// How long a cutover waits for the tenant's cutover lock. Default: 0.5 s.
    pub fn cutover_lock_timeout(mut self, timeout: Duration) -> Self {
        self.cutover_lock_timeout = timeout;
        self
    }

    /// Whether to emit the [`telemetry`](crate::telemetry) spans. Default: on.
    pub fn tracing(mut self, enabled: bool) -> Self {
        self.tracing = enabled;
        self
    }

    /// Builds the coordinator.
    pub fn build(self) -> MigrationCoordinator {
        MigrationCoordinator {
            store: self.store,
            stores: self.stores,
            locks: self.locks,
            copier: self.copier,
            lag: self.lag,
            source_store_id: self.source_store_id,
            cutover_lock_timeout: self.cutover_lock_timeout,
            tracing: self.tracing,
        }
    }
}

impl fmt::Debug for MigrationCoordinatorBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MigrationCoordinatorBuilder")
            .field("source_store_id", &self.source_store_id)
            .field("cutover_lock_timeout", &self.cutover_lock_timeout)
            .finish_non_exhaustive()
    }
}
