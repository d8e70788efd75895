//! The cutover: switching a dual-writing tenant to its target, under its cutover lock.
//!
//! `mod.rs` holds the public face; `attempt` the steps of one attempt under the lock; `plan`
//! its transitions; `rollback` the rollback and the guard that runs it unless disarmed;
//! `readiness` the readiness check; `outcome` what a cutover returns.

mod attempt;
mod outcome;
mod plan;
mod readiness;
mod rollback;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use pglock::{LockManager, LockManagerExt, migration_lock_key};
use tokio::time::Instant;
use tracing::{Instrument, Span, field::Empty};
use uuid::Uuid;

pub use outcome::{Cutover, CutoverError, CutoverFailure, CutoverResult};
pub use readiness::{NotReady, Readiness};

use self::attempt::{Attempt, Budget};
use self::outcome::{Ended, Failure, duration_ms};
use self::plan::Plan;
use crate::model::{Migration, MigrationConfig};
use crate::plugins::{StoreRegistry, SyncLag};
use crate::store::MigrationStore;
use crate::telemetry::{self, outcome as span_outcome};
use crate::{Error, Result};

/// The default wait for the cutover lock: 0.5 s, as in the Python original.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(500);

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
/// 2. It **closes the tenant's [write gate](crate::WriteGate)**: it takes the gate exclusively, so
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
/// * **Cancellation**: from just before step 3, the lock and gate guards belong to a rollback
///   guard that rolls back unless the attempt disarms it (on success, or once a rollback is
///   known to be written). If the future is dropped, the guard spawns the rollback on the
///   runtime and releases the locks only after it is written, so no other cutover can observe
///   the intermediate state. A rollback whose write fails with an unknown outcome is retried
///   the same way.
/// * **A crash** (or a drop outside any runtime) cannot run a rollback; the server frees the
///   locks when the session dies and the migration is left in `cutover`. The next cutover of
///   the tenant finds it there under the lock, which proves the attempt that wrote it is gone,
///   rolls it back (`cutover_rolled_back`, naming the interrupted attempt) and carries on.
///   Writers treat a leftover `cutover_paused` as `dual_write`, so no write is lost meanwhile.
/// * **A lost lock**: a cutover whose lock goes while it runs (declared lost by the lock
///   manager, or released through it with `release` or `release_all`) stops at its next await
///   point and rolls back. With fencing, every routing write of the cutover carries its lock's
///   fencing token and the routing row refuses tokens older than the newest it has seen, so
///   a cutover whose lock was taken over cannot switch routing behind the new holder's back;
///   and every write after step 3 is compare-and-set on the attempt id.
///
/// # Pool sizing
///
/// With a [`PostgresLockManager`](pglock::PostgresLockManager), a cutover pins two of the lock
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
        migration_lock_key(tenant_id, crate::CUTOVER_OPERATION)
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
    /// Every way a cutover can fail is a [`CutoverError`], whose
    /// [`failure`](CutoverError::failure) says why and whose
    /// [`rolled_back`](CutoverError::rolled_back) says whether anything had to be undone. On
    /// contention for the lock its message is the original's
    /// `Failed to acquire cutover lock: Failed to acquire lock 'cutover:<tenant>': Timeout after 0.5s`,
    /// and its duration is the real time spent waiting.
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
        let span = self.execute_span(migration_id);
        let mut recorder = telemetry::recorder(span.clone());
        let result = self
            .execute(migration_id, lag, options, started, &span)
            .instrument(span.clone())
            .await;
        let (events_synced, rolled_back, duration) = match &result {
            Ok(done) => (done.events_synced, false, done.duration),
            Err(failed) => (failed.events_synced, failed.rolled_back, failed.duration),
        };
        // As an i64: exporters such as tracing-opentelemetry turn a u64 into a string.
        span.record(
            telemetry::EVENTS_SYNCED,
            i64::try_from(events_synced).unwrap_or(i64::MAX),
        );
        span.record(telemetry::ROLLED_BACK, rolled_back);
        span.record(telemetry::DURATION_MS, duration_ms(duration));
        match &result {
            Ok(_) => recorder.finish(span_outcome::SUCCEEDED, false),
            Err(failed) => {
                span.record(telemetry::FAILURE, failed.failure.as_str());
                recorder.finish(span_outcome::FAILED, true);
            }
        }
        result
    }

    fn execute_span(&self, migration_id: Uuid) -> Span {
        if !self.tracing {
            return Span::none();
        }
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
    }

    async fn execute(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
        options: CutoverOptions,
        started: Instant,
        span: &Span,
    ) -> CutoverResult {
        let ended = match self
            .lock_and_run(migration_id, lag, options, started, span)
            .await
        {
            Ok(ended) | Err(ended) => ended,
        };
        ended.result(migration_id, started.elapsed())
    }

    /// Reads the migration once to learn its tenant, whose lock this is, takes the lock and
    /// runs the attempt, which reads everything again under it.
    async fn lock_and_run(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
        options: CutoverOptions,
        started: Instant,
        span: &Span,
    ) -> std::result::Result<Ended, Ended> {
        let migration = match self.store.get_migration(migration_id).await {
            Ok(Some(migration)) => migration,
            Ok(None) => {
                let err = Error::MigrationNotFound { migration_id };
                let failure = Failure::new(CutoverFailure::MigrationNotFound, err.to_string());
                return Err(Ended::early(failure));
            }
            Err(err) => {
                return Err(Ended::early(Failure::new(
                    CutoverFailure::Storage,
                    err.to_string(),
                )));
            }
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

        let lock = self
            .locks
            .acquire(Self::lock_key(tenant_id), Some(self.lock_timeout))
            .await
            .map_err(|err| {
                tracing::warn!("Failed to acquire cutover lock for tenant {tenant_id}: {err}");
                let message = format!("Failed to acquire cutover lock: {err}");
                Ended::early(Failure::new(CutoverFailure::LockUnavailable, message))
            })?;
        let attempt = self.attempt(&migration, lock.info().fencing_token, budget);
        span.record(
            telemetry::ATTEMPT_ID,
            tracing::field::display(attempt.plan.attempt_id),
        );
        if let Some(token) = attempt.plan.fencing_token {
            span.record(telemetry::FENCING_TOKEN, token);
        }
        Ok(attempt.run(lock, lag, started).await)
    }

    fn attempt(&self, migration: &Migration, token: Option<i64>, budget: Duration) -> Attempt {
        Attempt {
            plan: Plan::new(migration, Uuid::new_v4(), token),
            store: Arc::clone(&self.store),
            locks: Arc::clone(&self.locks),
            stores: Arc::clone(&self.stores),
            budget: Budget {
                limit: budget,
                started: Instant::now(),
                tenant_id: migration.tenant_id,
            },
            tracing: self.tracing,
        }
    }

    /// Says whether the migration's tenant could be cut over now, and if not, why.
    ///
    /// The checks and reasons are the Python original's, in its order, with two additions
    /// (the migration's phase and the target's registration); each [`NotReady`] displays as
    /// the original's text:
    ///
    /// 1. [`NotReady::LagUnavailable`]: `Unable to calculate sync lag`
    /// 2. [`NotReady::LagTooHigh`]: `Sync lag too high: {n} events (max {m})`
    /// 3. [`NotReady::RoutingMissing`]: `No routing configuration found for tenant`
    /// 4. [`NotReady::WrongRoutingState`]: `Invalid migration state: {state} (expected DUAL_WRITE)`
    /// 5. [`NotReady::WrongPhase`]: `Migration is in {phase} phase, expected DUAL_WRITE`
    /// 6. [`NotReady::UnknownTargetStore`]: `Target store '{id}' is not registered`
    /// 7. [`NotReady::LockHeld`]: `Cutover lock is already held by another process`: a
    ///    `try_acquire` of the cutover lock failed. When it succeeds the lock is released at
    ///    once; [`Readiness::Ready`] then means "was free a moment ago", not "is reserved for
    ///    you". It also says so when this process holds the lock, including when it is asked
    ///    from inside this process's own critical section on the cutover lock (where
    ///    `try_acquire` refuses the nested acquisition).
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::Storage`] and [`Error::Lock`] when a check
    /// cannot be made.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the probe's lock is released even if the future is dropped (as
    /// [`LockManagerExt::try_acquire`] and [`LockGuard::release`](pglock::LockGuard::release)
    /// are cancel safe, and the probe's guard releases the lock as it drops), and nothing else
    /// is written.
    pub async fn validate_cutover_readiness(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
    ) -> Result<Readiness> {
        let span = self.readiness_span(migration_id);
        let mut recorder = telemetry::recorder(span.clone());
        let result = self
            .readiness(migration_id, lag, &span)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(readiness) => {
                span.record(telemetry::READY, readiness.is_ready());
                if let Some(reason) = readiness.reason() {
                    span.record(telemetry::REASON, reason.to_string());
                }
                let value = match readiness {
                    Readiness::Ready => span_outcome::READY,
                    Readiness::NotReady(_) => span_outcome::NOT_READY,
                };
                recorder.finish(value, false);
            }
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "cutover readiness check failed");
                recorder.finish(span_outcome::ERROR, true);
            }
        }
        result
    }

    fn readiness_span(&self, migration_id: Uuid) -> Span {
        if !self.tracing {
            return Span::none();
        }
        tracing::info_span!(
            telemetry::READINESS_SPAN,
            { telemetry::MIGRATION_ID } = %migration_id,
            { telemetry::TENANT_ID } = Empty,
            { telemetry::READY } = Empty,
            { telemetry::REASON } = Empty,
            { telemetry::OUTCOME } = Empty,
            otel.status_code = Empty,
        )
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

    /// Whether to emit the [`telemetry`](crate::telemetry) spans. Default: on.
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
