//! The cutover: switching a dual-writing tenant to its target, under its cutover lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span, field::Empty};
use uuid::Uuid;

use super::gate::WriteGate;
use super::model::{AuditEvent, Migration, MigrationConfig, MigrationPhase, RoutingState};
use super::plugins::{StoreRegistry, SyncLag};
use super::store::{MigrationStore, RoutingChange, Transition};
use super::telemetry::{self, outcome};
use crate::{CUTOVER_OPERATION, Error, LockGuard, LockManager, migration_lock_key};

/// The default wait for the cutover lock: 0.5 s, as in the Python original.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

/// What a cutover did.
///
/// The fields are those of the Python original's `CutoverResult`, plus
/// [`failure`](Self::failure), which says why in a form code can match on.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CutoverResult {
    /// True when the tenant was switched to its target and the migration completed.
    pub success: bool,
    /// Wall-clock time of the whole call in milliseconds, including the wait for the lock.
    pub duration_ms: f64,
    /// How far the sync lag fell between the cutover's two measurements.
    pub events_synced: u64,
    /// Why the cutover did not happen, in the original's words where it had some.
    pub error_message: Option<String>,
    /// True when the cutover had moved the tenant into `cutover` and put it back into
    /// `dual_write` on the source. False when it failed before changing anything.
    pub rolled_back: bool,
    /// Why the cutover did not happen.
    pub failure: Option<CutoverFailure>,
}

impl CutoverResult {
    /// True when the cutover took less than 100 ms, the original's target.
    pub fn within_timeout(&self) -> bool {
        self.duration_ms < 100.0
    }
}

/// Why a cutover did not switch the tenant.
///
/// [`LockUnavailable`](Self::LockUnavailable), [`MigrationNotFound`](Self::MigrationNotFound),
/// [`AlreadyMigrated`](Self::AlreadyMigrated), [`WrongPhase`](Self::WrongPhase),
/// [`RoutingMissing`](Self::RoutingMissing), [`WrongRoutingState`](Self::WrongRoutingState),
/// [`UnknownTargetStore`](Self::UnknownTargetStore), and a [`Timeout`](Self::Timeout) while
/// draining writes, are found before anything is written. The others happen once the
/// migration is in `cutover`, which is then rolled back ([`CutoverResult::rolled_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CutoverFailure {
    /// The cutover lock (or the write gate) could not be taken in time: another process is
    /// cutting the tenant over, or the lock manager failed.
    LockUnavailable,
    /// There is no such migration.
    MigrationNotFound,
    /// The migration is already completed: another cutover switched the tenant.
    AlreadyMigrated,
    /// The migration is not in `dual_write`.
    WrongPhase,
    /// The tenant has no routing row.
    RoutingMissing,
    /// The tenant's routing is not in `dual_write`.
    WrongRoutingState,
    /// The target store is not in the application's registry.
    UnknownTargetStore,
    /// The cutover ran out of its time budget.
    Timeout,
    /// The sync lag could not be calculated.
    LagUnavailable,
    /// The sync lag is above the migration's maximum.
    LagTooHigh,
    /// The target store failed its health check.
    TargetUnhealthy,
    /// The migration or routing was changed by someone else while the cutover held the lock
    /// (an abort, or a lock that was lost).
    StateChanged,
    /// The routing row was written under a newer fencing token: this cutover's lock was lost.
    FenceRejected,
    /// The lock manager declared the cutover lock lost while the cutover ran; it was stopped
    /// and rolled back.
    LockLost,
    /// The migration store failed.
    Storage,
}

impl CutoverFailure {
    /// A snake_case name, as recorded in the [`FAILURE`](telemetry::FAILURE) span field.
    pub fn as_str(self) -> &'static str {
        match self {
            CutoverFailure::LockUnavailable => "lock_unavailable",
            CutoverFailure::MigrationNotFound => "migration_not_found",
            CutoverFailure::AlreadyMigrated => "already_migrated",
            CutoverFailure::WrongPhase => "wrong_phase",
            CutoverFailure::RoutingMissing => "routing_missing",
            CutoverFailure::WrongRoutingState => "wrong_routing_state",
            CutoverFailure::UnknownTargetStore => "unknown_target_store",
            CutoverFailure::Timeout => "timeout",
            CutoverFailure::LagUnavailable => "lag_unavailable",
            CutoverFailure::LagTooHigh => "lag_too_high",
            CutoverFailure::TargetUnhealthy => "target_unhealthy",
            CutoverFailure::StateChanged => "state_changed",
            CutoverFailure::LockLost => "lock_lost",
            CutoverFailure::FenceRejected => "fence_rejected",
            CutoverFailure::Storage => "storage",
        }
    }

    /// The failure that a store error stands for.
    fn of(err: &Error) -> Self {
        match err {
            Error::FenceRejected { .. } => CutoverFailure::FenceRejected,
            err if refused(err) => CutoverFailure::StateChanged,
            _ => CutoverFailure::Storage,
        }
    }
}

impl fmt::Display for CutoverFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// True for store errors that prove nothing was written: a refused compare-and-set or a
/// refused transition. Any other error leaves the outcome of a write unknown.
fn refused(err: &Error) -> bool {
    matches!(
        err,
        Error::MigrationNotFound { .. }
            | Error::PhaseChanged { .. }
            | Error::StaleCutoverAttempt { .. }
            | Error::InvalidPhaseTransition { .. }
            | Error::InvalidRoutingTransition { .. }
            | Error::RoutingNotFound { .. }
            | Error::RoutingStateChanged { .. }
            | Error::FenceRejected { .. }
    )
}

/// Options of one cutover.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CutoverOptions {
    /// The cutover's time budget once it holds the lock; default: the migration's
    /// [`cutover_timeout`](MigrationConfig::cutover_timeout). At least 100 ms.
    pub timeout: Option<Duration>,
}

impl CutoverOptions {
    /// Sets [`timeout`](Self::timeout).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// Switches dual-writing tenants to their target store, one tenant at a time across every
/// process, correctly.
///
/// [`execute_cutover`](Self::execute_cutover) runs the whole cutover under the tenant's
/// cutover lock, `migration_lock_key(tenant, "cutover")`, which it waits for at most
/// [`lock_timeout`](CutoverManagerBuilder::lock_timeout) (default 0.5 s). Holding it:
///
/// 1. It **re-reads and re-validates** everything: the migration must be in `dual_write`
///    (`completed` means another cutover won; `cutover` means an earlier attempt was
///    interrupted, and it is rolled back first), the routing must be in `dual_write`, the
///    target store must be registered. A cutover that fails here has changed nothing.
/// 2. It **closes the tenant's [write gate](WriteGate)**: it takes the gate exclusively, so
///    writes already inside drain and new writes wait, in every process.
/// 3. It **enters `cutover`**: phase `dual_write -> cutover`, routing
///    `dual_write -> cutover_paused` and the audit entry `cutover_initiated`, in one
///    compare-and-set transition stamped with a fresh attempt id.
/// 4. It measures the **sync lag** twice (the lag must be at most the migration's
///    `max_lag_events` both times) and checks the **target's health**, within the cutover's
///    time budget.
/// 5. It **completes or rolls back** in one transition while it still holds the lock and the
///    gate: `completed` + routing `migrated` on the target + `cutover_completed`, or
///    `dual_write` + routing `dual_write` on the source + `cutover_rolled_back` (and the error
///    recorded on the migration). Only then does it open the gate and release the lock.
///
/// # A cutover that cannot finish
///
/// * **An error** after step 3 is rolled back in step 5.
/// * **Cancellation**: if the future is dropped after step 3, a drop guard spawns the rollback
///   on the runtime. The spawned task owns the lock and gate guards and releases them only
///   after the rollback is written, so no other cutover can observe the intermediate state.
/// * **A crash** (or a drop outside any runtime) cannot run a rollback; the server frees the
///   locks when the session dies and the migration is left in `cutover`. The next cutover of
///   the tenant finds it there under the lock, which proves the attempt that wrote it is gone,
///   rolls it back (`cutover_rolled_back`, naming the interrupted attempt) and carries on.
///   Writers treat a leftover `cutover_paused` as `dual_write`, so no write is lost meanwhile.
/// * **A lost lock**: with fencing, every routing write of the cutover carries its lock's
///   fencing token and the routing row refuses tokens older than the newest it has seen, so
///   a cutover whose lock was taken over cannot switch routing behind the new holder's back;
///   and every write after step 3 is compare-and-set on the attempt id.
///
/// # Pool sizing
///
/// With a [`PostgresLockManager`](crate::PostgresLockManager), a cutover pins two of the lock
/// manager's connections (the lock and the gate) and runs its reads and writes on the store's
/// pool; size the pools so both are available.
pub struct CutoverManager {
    locks: Arc<dyn LockManager>,
    store: Arc<dyn MigrationStore>,
    stores: Arc<dyn StoreRegistry>,
    lock_timeout: Duration,
    tracing: bool,
}

impl CutoverManager {
    /// A manager with the default lock timeout.
    pub fn new(
        locks: Arc<dyn LockManager>,
        store: Arc<dyn MigrationStore>,
        stores: Arc<dyn StoreRegistry>,
    ) -> Self {
        Self::builder(locks, store, stores).build()
    }

    /// Configures a manager.
    pub fn builder(
        locks: Arc<dyn LockManager>,
        store: Arc<dyn MigrationStore>,
        stores: Arc<dyn StoreRegistry>,
    ) -> CutoverManagerBuilder {
        CutoverManagerBuilder {
            locks,
            store,
            stores,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            tracing: true,
        }
    }

    /// The key of a tenant's cutover lock: `"cutover:{tenant_id}"`.
    pub fn lock_key(tenant_id: Uuid) -> String {
        migration_lock_key(tenant_id, CUTOVER_OPERATION)
    }

    /// How long a cutover waits for its lock.
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// Cuts the migration's tenant over to its target, with the migration's settings.
    ///
    /// See [`execute_cutover_with`](Self::execute_cutover_with).
    ///
    /// # Cancel safety
    ///
    /// As for [`execute_cutover_with`](Self::execute_cutover_with).
    pub async fn execute_cutover(&self, migration_id: Uuid, lag: &dyn SyncLag) -> CutoverResult {
        self.execute_cutover_with(migration_id, lag, CutoverOptions::default())
            .await
    }

    /// Cuts the migration's tenant over to its target, as the [type](CutoverManager)
    /// documentation describes.
    ///
    /// It never returns an error: every way a cutover can fail is an unsuccessful
    /// [`CutoverResult`], whose [`failure`](CutoverResult::failure) says why and whose
    /// [`rolled_back`](CutoverResult::rolled_back) says whether anything had to be undone. On
    /// contention for the lock the message is the original's
    /// `Failed to acquire cutover lock: Failed to acquire lock 'cutover:<tenant>': Timeout after 0.5s`,
    /// and `duration_ms` is the real time spent waiting.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in the sense that matters here: dropping the future at any point leaves the
    /// tenant on its source in `dual_write` (or `normal`/`bulk_copy` if it was never further).
    /// Before the migration entered `cutover` nothing needs undoing and the locks are released
    /// as their guards drop; afterwards the rollback is spawned on the runtime and the locks
    /// are released once it is written.
    pub async fn execute_cutover_with(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
        options: CutoverOptions,
    ) -> CutoverResult {
        let started = Instant::now();
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::EXECUTE_SPAN,
                { telemetry::MIGRATION_ID } = %migration_id,
                { telemetry::TENANT_ID } = Empty,
                { telemetry::TARGET_STORE_ID } = Empty,
                { telemetry::TIMEOUT_MS } = Empty,
                { telemetry::LOCK_TIMEOUT_MS } = duration_ms(self.lock_timeout),
                { telemetry::ATTEMPT_ID } = Empty,
                { telemetry::FENCING_TOKEN } = Empty,
                { telemetry::OUTCOME } = Empty,
                { telemetry::FAILURE } = Empty,
                { telemetry::EVENTS_SYNCED } = Empty,
                { telemetry::ROLLED_BACK } = Empty,
                { telemetry::DURATION_MS } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let mut recorder = Recorder::new(span.clone());
        let result = self
            .execute(migration_id, lag, options, started, &span)
            .instrument(span.clone())
            .await;
        // As an i64: exporters such as tracing-opentelemetry turn a u64 into a string.
        let events_synced = i64::try_from(result.events_synced).unwrap_or(i64::MAX);
        span.record(telemetry::EVENTS_SYNCED, events_synced);
        span.record(telemetry::ROLLED_BACK, result.rolled_back);
        span.record(telemetry::DURATION_MS, result.duration_ms);
        match result.failure {
            None => recorder.finish(outcome::SUCCEEDED, false),
            Some(failure) => {
                span.record(telemetry::FAILURE, failure.as_str());
                recorder.finish(outcome::FAILED, true);
            }
        }
        result
    }

    async fn execute(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
        options: CutoverOptions,
        started: Instant,
        span: &Span,
    ) -> CutoverResult {
        let early = |failure, message: String| Outcome::failed(failure, message, 0, false);
        // Read once to learn the tenant, whose lock this is; everything is read again under it.
        let migration = match self.store.get_migration(migration_id).await {
            Ok(Some(migration)) => migration,
            Ok(None) => {
                let err = Error::MigrationNotFound { migration_id };
                return early(CutoverFailure::MigrationNotFound, err.to_string()).result(started);
            }
            Err(err) => return early(CutoverFailure::Storage, err.to_string()).result(started),
        };
        let tenant_id = migration.tenant_id;
        let budget = options
            .timeout
            .unwrap_or(migration.config.cutover_timeout)
            .max(MigrationConfig::MIN_CUTOVER_TIMEOUT);
        span.record(telemetry::TENANT_ID, tracing::field::display(tenant_id));
        span.record(
            telemetry::TARGET_STORE_ID,
            migration.target_store_id.as_str(),
        );
        span.record(telemetry::TIMEOUT_MS, duration_ms(budget));
        tracing::info!(%migration_id, %tenant_id, "Starting cutover for migration {migration_id}");

        let lock = match self
            .locks
            .acquire(&Self::lock_key(tenant_id), Some(self.lock_timeout))
            .await
        {
            Ok(lock) => lock,
            Err(err) => {
                tracing::warn!("Failed to acquire cutover lock for tenant {tenant_id}: {err}");
                let message = format!("Failed to acquire cutover lock: {err}");
                return early(CutoverFailure::LockUnavailable, message).result(started);
            }
        };
        let mut attempt = Attempt {
            plan: Rollback {
                store: Arc::clone(&self.store),
                migration_id,
                tenant_id,
                attempt_id: Uuid::new_v4(),
                source_store_id: migration.source_store_id.clone(),
                target_store_id: migration.target_store_id.clone(),
                fencing_token: lock.fencing_token,
                tracing: self.tracing,
            },
            locks: Arc::clone(&self.locks),
            stores: Arc::clone(&self.stores),
            budget,
            budget_started: Instant::now(),
            events_synced: 0,
            in_cutover: false,
            gate: None,
            lock: Some(lock),
        };
        span.record(
            telemetry::ATTEMPT_ID,
            tracing::field::display(attempt.plan.attempt_id),
        );
        if let Some(token) = attempt.plan.fencing_token {
            span.record(telemetry::FENCING_TOKEN, token);
        }
        // The locked section is this one future, raced against the lock's loss signal: a
        // cutover whose lock is declared lost stops at its next await point, and `finish`
        // rolls it back as for any other failure (its routing writes are fenced, too).
        let loss = attempt
            .lock
            .as_ref()
            .map(|lock| lock.loss_signal().clone())
            .unwrap_or_default();
        let prepared = tokio::select! {
            biased;
            cause = loss.lost() => Err(failure(
                CutoverFailure::LockLost,
                format!("The cutover lock was lost: {cause}"),
            )),
            prepared = attempt.prepare(lag) => prepared,
        };
        attempt.finish(prepared, started).await.result(started)
    }

    /// Says whether the migration's tenant could be cut over now, and if not, why.
    ///
    /// The checks and reasons are the Python original's, in its order, with two additions
    /// (the migration's phase and the target's registration):
    ///
    /// 1. `Unable to calculate sync lag`
    /// 2. `Sync lag too high: {n} events (max {m})`
    /// 3. `No routing configuration found for tenant`
    /// 4. `Invalid migration state: {state} (expected DUAL_WRITE)`
    /// 5. `Migration is in {phase} phase, expected DUAL_WRITE`
    /// 6. `Target store '{id}' is not registered`
    /// 7. `Cutover lock is already held by another process`: a `try_acquire` of the cutover
    ///    lock failed. When it succeeds the lock is released at once; `(true, None)` then means
    ///    "was free a moment ago", not "is reserved for you". It also says so when this
    ///    process holds the lock.
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::MigrationStorage`] and lock manager errors when
    /// a check cannot be made.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the probe's lock is released even if the future is dropped (as
    /// [`LockManager::try_acquire`] and [`LockManager::release`] are cancel safe), and nothing
    /// else is written.
    pub async fn validate_cutover_readiness(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
    ) -> crate::Result<(bool, Option<String>)> {
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::READINESS_SPAN,
                { telemetry::MIGRATION_ID } = %migration_id,
                { telemetry::TENANT_ID } = Empty,
                { telemetry::READY } = Empty,
                { telemetry::REASON } = Empty,
                { telemetry::OUTCOME } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let mut recorder = Recorder::new(span.clone());
        let result = self
            .readiness(migration_id, lag, &span)
            .instrument(span.clone())
            .await;
        match &result {
            Ok((ready, reason)) => {
                span.record(telemetry::READY, *ready);
                if let Some(reason) = reason {
                    span.record(telemetry::REASON, reason.as_str());
                }
                let value = if *ready {
                    outcome::READY
                } else {
                    outcome::NOT_READY
                };
                recorder.finish(value, false);
            }
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "cutover readiness check failed");
                recorder.finish(outcome::ERROR, true);
            }
        }
        result
    }

    async fn readiness(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
        span: &Span,
    ) -> crate::Result<(bool, Option<String>)> {
        let not_ready = |reason: String| Ok((false, Some(reason)));
        let migration = self
            .store
            .get_migration(migration_id)
            .await?
            .ok_or(Error::MigrationNotFound { migration_id })?;
        let tenant_id = migration.tenant_id;
        span.record(telemetry::TENANT_ID, tracing::field::display(tenant_id));
        let max = migration.config.max_lag_events;
        match lag
            .lag(
                tenant_id,
                &migration.source_store_id,
                &migration.target_store_id,
            )
            .await
        {
            Ok(Some(events)) if events > max => {
                return not_ready(format!("Sync lag too high: {events} events (max {max})"));
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return not_ready("Unable to calculate sync lag".to_owned()),
        }
        let Some(routing) = self.store.get_routing(tenant_id).await? else {
            return not_ready("No routing configuration found for tenant".to_owned());
        };
        if routing.state != RoutingState::DualWrite {
            return not_ready(format!(
                "Invalid migration state: {} (expected DUAL_WRITE)",
                routing.state
            ));
        }
        if migration.phase != MigrationPhase::DualWrite {
            return not_ready(format!(
                "Migration is in {} phase, expected DUAL_WRITE",
                migration.phase
            ));
        }
        if !self.stores.is_registered(&migration.target_store_id) {
            let err = Error::UnknownStore {
                store_id: migration.target_store_id.clone(),
            };
            return not_ready(err.to_string());
        }
        let key = Self::lock_key(tenant_id);
        if self.locks.try_acquire(&key).await?.is_none() {
            return not_ready("Cutover lock is already held by another process".to_owned());
        }
        self.locks.release(&key).await?;
        Ok((true, None))
    }
}

impl fmt::Debug for CutoverManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CutoverManager")
            .field("locks", &self.locks)
            .field("store", &self.store)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`CutoverManager`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct CutoverManagerBuilder {
    locks: Arc<dyn LockManager>,
    store: Arc<dyn MigrationStore>,
    stores: Arc<dyn StoreRegistry>,
    lock_timeout: Duration,
    tracing: bool,
}

impl CutoverManagerBuilder {
    /// How long a cutover waits for the tenant's cutover lock. Default: 0.5 s.
    pub fn lock_timeout(mut self, timeout: Duration) -> Self {
        self.lock_timeout = timeout;
        self
    }

    /// Whether to emit the [`telemetry`](super::telemetry) spans. Default: on.
    pub fn tracing(mut self, enabled: bool) -> Self {
        self.tracing = enabled;
        self
    }

    /// Builds the manager.
    pub fn build(self) -> CutoverManager {
        CutoverManager {
            locks: self.locks,
            store: self.store,
            stores: self.stores,
            lock_timeout: self.lock_timeout,
            tracing: self.tracing,
        }
    }
}

impl fmt::Debug for CutoverManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CutoverManagerBuilder")
            .field("lock_timeout", &self.lock_timeout)
            .field("tracing", &self.tracing)
            .finish_non_exhaustive()
    }
}

/// How an attempt ended, before its duration is known.
struct Outcome {
    failure: Option<(CutoverFailure, String)>,
    events_synced: u64,
    rolled_back: bool,
}

impl Outcome {
    fn failed(failure: CutoverFailure, message: String, events: u64, rolled_back: bool) -> Self {
        Outcome {
            failure: Some((failure, message)),
            events_synced: events,
            rolled_back,
        }
    }

    fn result(self, started: Instant) -> CutoverResult {
        let (failure, error_message) = match self.failure {
            Some((failure, message)) => (Some(failure), Some(message)),
            None => (None, None),
        };
        CutoverResult {
            success: failure.is_none(),
            duration_ms: duration_ms(started.elapsed()),
            events_synced: self.events_synced,
            error_message,
            rolled_back: self.rolled_back,
            failure,
        }
    }
}

/// A failure and its message.
type Failure = (CutoverFailure, String);

fn failure(kind: CutoverFailure, message: impl Into<String>) -> Failure {
    (kind, message.into())
}

/// One cutover attempt, from the moment it holds the cutover lock.
///
/// It owns the lock and gate guards, so that its drop guard can keep them until a rollback is
/// written.
struct Attempt {
    plan: Rollback,
    locks: Arc<dyn LockManager>,
    stores: Arc<dyn StoreRegistry>,
    budget: Duration,
    budget_started: Instant,
    events_synced: u64,
    /// True from just before this attempt's `cutover` transition is sent until its completion
    /// or rollback is known to be written (or known not to be needed): while true, dropping
    /// the attempt must roll back.
    in_cutover: bool,
    gate: Option<LockGuard>,
    lock: Option<LockGuard>,
}

impl Attempt {
    /// Everything up to the switch: validation, the gate, entering `cutover`, lag and health.
    async fn prepare(&mut self, lag: &dyn SyncLag) -> Result<(), Failure> {
        let store = Arc::clone(&self.plan.store);
        let (migration_id, tenant_id) = (self.plan.migration_id, self.plan.tenant_id);
        let read = |err: Error| failure(CutoverFailure::Storage, err.to_string());
        let load = || async {
            store
                .get_migration(migration_id)
                .await
                .map_err(read)?
                .ok_or_else(|| {
                    let err = Error::MigrationNotFound { migration_id };
                    failure(CutoverFailure::MigrationNotFound, err.to_string())
                })
        };

        let mut migration = load().await?;
        if migration.phase == MigrationPhase::Cutover {
            self.repair(&migration).await?;
            migration = load().await?;
        }
        match migration.phase {
            MigrationPhase::DualWrite => {}
            MigrationPhase::Completed => {
                return Err(failure(
                    CutoverFailure::AlreadyMigrated,
                    format!(
                        "Tenant {tenant_id} is already migrated to store '{}' \
                         (migration {migration_id} is completed)",
                        migration.target_store_id
                    ),
                ));
            }
            phase => {
                return Err(failure(
                    CutoverFailure::WrongPhase,
                    format!(
                        "Cannot perform cutover: migration is in {phase} phase (expected dual_write)"
                    ),
                ));
            }
        }
        let routing = store
            .get_routing(tenant_id)
            .await
            .map_err(read)?
            .ok_or_else(|| {
                failure(
                    CutoverFailure::RoutingMissing,
                    "No routing configuration found for tenant",
                )
            })?;
        if routing.state != RoutingState::DualWrite {
            return Err(failure(
                CutoverFailure::WrongRoutingState,
                format!(
                    "Invalid migration state: {} (expected DUAL_WRITE)",
                    routing.state
                ),
            ));
        }
        if routing.active_migration_id != Some(migration_id) {
            return Err(failure(
                CutoverFailure::StateChanged,
                format!(
                    "Routing of tenant {tenant_id} does not belong to migration {migration_id}"
                ),
            ));
        }
        if !self.stores.is_registered(&migration.target_store_id) {
            let err = Error::UnknownStore {
                store_id: migration.target_store_id.clone(),
            };
            return Err(failure(CutoverFailure::UnknownTargetStore, err.to_string()));
        }

        // Close the write gate: in-flight writes drain, new ones wait behind us.
        let remaining = self.remaining("while waiting for in-flight writes to drain")?;
        match self
            .locks
            .acquire(&WriteGate::key(tenant_id), Some(remaining))
            .await
        {
            Ok(gate) => self.gate = Some(gate),
            Err(err) if err.is_timeout() => {
                return Err(self.timeout("while waiting for in-flight writes to drain"));
            }
            Err(err) => {
                return Err(failure(
                    CutoverFailure::LockUnavailable,
                    format!("Failed to close the write gate: {err}"),
                ));
            }
        }

        let enter = self
            .plan
            .transition(MigrationPhase::DualWrite, MigrationPhase::Cutover)
            .attempt(None, Some(self.plan.attempt_id))
            .routing(self.plan.routing(
                RoutingState::DualWrite,
                RoutingState::CutoverPaused,
                &self.plan.source_store_id,
            ));
        // Armed before the write is sent: if this future is dropped mid-write, the write may
        // still commit, and the rollback (compare-and-set on this attempt) is then needed.
        self.in_cutover = true;
        if let Err(err) = store.apply_transition(&enter).await {
            if refused(&err) {
                self.in_cutover = false;
            }
            return Err((CutoverFailure::of(&err), err.to_string()));
        }

        // The gate is closed, so no write is in flight: the lag is final.
        let max = migration.config.max_lag_events;
        let first = self.measure(lag, &migration, max).await?;
        self.check_budget()?;
        let second = self.measure(lag, &migration, max).await?;
        self.events_synced = first.saturating_sub(second);
        self.check_budget()?;

        self.stores
            .check_health(&migration.target_store_id)
            .await
            .map_err(|err| {
                failure(
                    CutoverFailure::TargetUnhealthy,
                    format!("Target store health check failed: {err}"),
                )
            })
    }

    /// Rolls back an earlier attempt that left the migration in `cutover`. Holding the lock
    /// proves that attempt is gone.
    async fn repair(&self, migration: &Migration) -> Result<(), Failure> {
        let Some(interrupted) = migration.cutover_attempt else {
            return Ok(());
        };
        let plan = Rollback {
            attempt_id: interrupted,
            ..self.plan.clone()
        };
        let reason = format!(
            "Cutover attempt {interrupted} was interrupted before it finished; \
             rolled back by attempt {}",
            self.plan.attempt_id
        );
        plan.run(&reason)
            .await
            .map(|_| ())
            .map_err(|err| (CutoverFailure::of(&err), err.to_string()))
    }

    async fn measure(
        &self,
        lag: &dyn SyncLag,
        migration: &Migration,
        max: u64,
    ) -> Result<u64, Failure> {
        let measured = lag
            .lag(
                migration.tenant_id,
                &migration.source_store_id,
                &migration.target_store_id,
            )
            .await;
        match measured {
            Ok(Some(events)) if events > max => {
                tracing::warn!(
                    "Cutover failed for tenant {}: lag too high ({events} > {max})",
                    migration.tenant_id
                );
                Err(failure(
                    CutoverFailure::LagTooHigh,
                    format!("Sync lag too high for cutover: {events} events (max: {max})"),
                ))
            }
            Ok(Some(events)) => Ok(events),
            Ok(None) => Err(failure(
                CutoverFailure::LagUnavailable,
                "Unable to calculate sync lag",
            )),
            Err(err) => Err(failure(
                CutoverFailure::LagUnavailable,
                format!("Unable to calculate sync lag: {err}"),
            )),
        }
    }

    fn remaining(&self, context: &str) -> Result<Duration, Failure> {
        match self.budget.checked_sub(self.budget_started.elapsed()) {
            Some(remaining) if !remaining.is_zero() => Ok(remaining),
            _ => Err(self.timeout(context)),
        }
    }

    fn check_budget(&self) -> Result<(), Failure> {
        self.remaining("").map(|_| ())
    }

    fn timeout(&self, context: &str) -> Failure {
        let elapsed = duration_ms(self.budget_started.elapsed());
        let limit = duration_ms(self.budget);
        tracing::warn!(
            "Cutover timeout for tenant {}: {elapsed:.2}ms exceeded {limit:.2}ms",
            self.plan.tenant_id
        );
        let mut message = format!("Cutover timeout exceeded: {elapsed:.2}ms (limit: {limit:.2}ms)");
        if !context.is_empty() {
            message.push(' ');
            message.push_str(context);
        }
        (CutoverFailure::Timeout, message)
    }

    /// Writes the completion, or the rollback, then opens the gate and releases the lock.
    async fn finish(mut self, prepared: Result<(), Failure>, started: Instant) -> Outcome {
        // The last moment to notice a loss before the switch is written.
        let lost = self
            .lock
            .as_ref()
            .and_then(|lock| lock.loss_signal().cause());
        let prepared = match (prepared, lost) {
            (Ok(()), Some(cause)) => Err(failure(
                CutoverFailure::LockLost,
                format!("The cutover lock was lost: {cause}"),
            )),
            (prepared, _) => prepared,
        };
        let failed = match prepared {
            Ok(()) => {
                let complete = self
                    .plan
                    .transition(MigrationPhase::Cutover, MigrationPhase::Completed)
                    .attempt(Some(self.plan.attempt_id), None)
                    .routing(
                        self.plan
                            .routing(
                                RoutingState::CutoverPaused,
                                RoutingState::Migrated,
                                &self.plan.target_store_id,
                            )
                            .target(None)
                            .owner(None),
                    )
                    .cutover_stats(self.events_synced, duration_ms(started.elapsed()));
                match self.plan.store.apply_transition(&complete).await {
                    Ok(_) => {
                        self.in_cutover = false;
                        None
                    }
                    // The commit may have happened with its answer lost. Under the lock only
                    // this attempt can complete the migration, so `completed` means it did.
                    Err(err) if !refused(&err) && self.completed_anyway().await => {
                        self.in_cutover = false;
                        None
                    }
                    Err(err) => Some(failure(
                        CutoverFailure::of(&err),
                        format!("Failed to complete cutover: {err}"),
                    )),
                }
            }
            Err(failed) => Some(failed),
        };
        let outcome = match failed {
            None => Outcome {
                failure: None,
                events_synced: self.events_synced,
                rolled_back: false,
            },
            Some((kind, message)) => {
                let tenant = self.plan.tenant_id;
                match kind {
                    // Already logged where they were detected, as the original does.
                    CutoverFailure::Timeout | CutoverFailure::LagTooHigh => {}
                    CutoverFailure::Storage
                    | CutoverFailure::LagUnavailable
                    | CutoverFailure::TargetUnhealthy
                    | CutoverFailure::LockLost
                    | CutoverFailure::FenceRejected => {
                        tracing::error!("Cutover error for tenant {tenant}: {message}")
                    }
                    _ => tracing::warn!("Cutover not performed for tenant {tenant}: {message}"),
                }
                let rolled_back = self.in_cutover && self.roll_back(&message).await;
                Outcome::failed(kind, message, self.events_synced, rolled_back)
            }
        };
        self.release().await;
        outcome
    }

    async fn completed_anyway(&self) -> bool {
        matches!(
            self.plan.store.get_migration(self.plan.migration_id).await,
            Ok(Some(migration)) if migration.phase == MigrationPhase::Completed
        )
    }

    async fn roll_back(&mut self, reason: &str) -> bool {
        match self.plan.run(reason).await {
            Ok(rolled_back) => {
                self.in_cutover = false;
                rolled_back
            }
            // The rollback's outcome is unknown: stay armed, so the drop guard tries again.
            Err(_) => false,
        }
    }

    /// Opens the gate, then releases the lock. A failed release is logged by the lock manager
    /// and leaves nothing held (its session is closed).
    async fn release(&mut self) {
        if self.in_cutover {
            // A rollback whose outcome is unknown: leave it to the drop guard's retry.
            return;
        }
        if let Some(gate) = self.gate.take() {
            let _ = gate.release().await;
        }
        if let Some(lock) = self.lock.take() {
            let _ = lock.release().await;
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.in_cutover {
            // Nothing to undo; the guards release the locks as they drop.
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to roll back on: the next cutover of the tenant repairs it.
            return;
        };
        let plan = self.plan.clone();
        let (gate, lock) = (self.gate.take(), self.lock.take());
        runtime.spawn(async move {
            let _ = plan.run("Cutover was cancelled before it finished").await;
            // Only now may another cutover, or a writer, get in.
            if let Some(gate) = gate {
                let _ = gate.release().await;
            }
            if let Some(lock) = lock {
                let _ = lock.release().await;
            }
        });
    }
}

/// How to roll back one attempt: everything it needs, owned, so a spawned task can run it.
#[derive(Clone)]
struct Rollback {
    store: Arc<dyn MigrationStore>,
    migration_id: Uuid,
    tenant_id: Uuid,
    attempt_id: Uuid,
    source_store_id: String,
    target_store_id: String,
    fencing_token: Option<i64>,
    tracing: bool,
}

impl Rollback {
    fn transition(&self, from: MigrationPhase, to: MigrationPhase) -> Transition {
        let event = match to {
            MigrationPhase::Cutover => AuditEvent::CutoverInitiated,
            MigrationPhase::Completed => AuditEvent::CutoverCompleted,
            _ => AuditEvent::CutoverRolledBack,
        };
        Transition {
            migration_id: self.migration_id,
            tenant_id: self.tenant_id,
            from,
            to,
            expected_attempt: None,
            new_attempt: None,
            routing: None,
            error: None,
            event,
            message: None,
            events_synced: None,
            duration_ms: None,
        }
    }

    fn routing(&self, expected: RoutingState, state: RoutingState, store: &str) -> RoutingChange {
        RoutingChange::new(expected, state, store)
            .target(Some(self.target_store_id.clone()))
            .owner(Some(self.migration_id))
            .fencing_token(self.fencing_token)
    }

    /// Puts the migration back into `dual_write` on the source, if this attempt's `cutover` is
    /// still there. Returns whether it was; errors when the outcome is unknown.
    async fn run(&self, reason: &str) -> crate::Result<bool> {
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::ROLLBACK_SPAN,
                { telemetry::MIGRATION_ID } = %self.migration_id,
                { telemetry::TENANT_ID } = %self.tenant_id,
                { telemetry::ATTEMPT_ID } = %self.attempt_id,
                { telemetry::REASON } = reason,
                { telemetry::OUTCOME } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let mut recorder = Recorder::new(span.clone());
        let rollback = self
            .transition(MigrationPhase::Cutover, MigrationPhase::DualWrite)
            .attempt(Some(self.attempt_id), None)
            .routing(self.routing(
                RoutingState::CutoverPaused,
                RoutingState::DualWrite,
                &self.source_store_id,
            ))
            .error(format!("Cutover failed: {reason}"))
            .message(reason);
        let result = self
            .store
            .apply_transition(&rollback)
            .instrument(span.clone())
            .await;
        match result {
            Ok(_) => {
                recorder.finish(outcome::ROLLED_BACK, false);
                Ok(true)
            }
            // Nothing of this attempt is left to undo (it never entered `cutover`, or someone
            // else already moved the migration on).
            Err(err) if refused(&err) => {
                tracing::warn!(parent: &span, error = %err, "nothing to roll back");
                recorder.finish(outcome::FAILED, false);
                Ok(false)
            }
            Err(err) => {
                tracing::error!(parent: &span, error = %err, "cutover rollback failed");
                recorder.finish(outcome::ERROR, true);
                Err(err)
            }
        }
    }
}

/// Records a span's outcome when an operation ends, and `cancelled` if it never does.
pub(super) struct Recorder {
    span: Span,
    done: bool,
}

impl Recorder {
    pub(super) fn new(span: Span) -> Self {
        Recorder { span, done: false }
    }

    pub(super) fn finish(&mut self, value: &'static str, failed: bool) {
        self.span.record(telemetry::OUTCOME, value);
        if failed {
            self.span.record("otel.status_code", "ERROR");
        }
        self.done = true;
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.done {
            self.span.record(telemetry::OUTCOME, outcome::CANCELLED);
        }
    }
}

pub(super) fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
