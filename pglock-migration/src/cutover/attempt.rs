//! The steps of one cutover attempt, from the moment it holds the cutover lock.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use pglock::{LockGuard, LockManager, LockManagerExt, LossSignal};
use tokio::time::Instant;
use uuid::Uuid;

use super::outcome::{CutoverFailure, Ended, Failure, duration_ms};
use super::plan::Plan;
use super::rollback::{Rollback, RollbackGuard};
use crate::Error;
use crate::gate::WriteGate;
use crate::model::{Migration, MigrationPhase, RoutingState};
use crate::plugins::{StoreRegistry, SyncLag};
use crate::store::MigrationStore;

/// One cutover attempt: the migration it moves, what it may use, and its time budget.
pub(crate) struct Attempt {
    pub(crate) plan: Plan,
    pub(crate) store: Arc<dyn MigrationStore>,
    pub(crate) locks: Arc<dyn LockManager>,
    pub(crate) stores: Arc<dyn StoreRegistry>,
    pub(crate) budget: Budget,
    pub(crate) tracing: bool,
}

/// How a step after entering `cutover` ended: either nothing was written (the transition into
/// `cutover` was refused), or the attempt may be in `cutover` and must roll back.
enum Step {
    NothingWritten(Failure),
    Failed(Failure),
}

impl Attempt {
    /// Runs the attempt to its end: the switch, or the rollback; then lets the gate and the
    /// lock go. Each await point before the `cutover` transition owns at most the lock and the
    /// gate guards, which release as they drop; from just before it, a [`RollbackGuard`] owns
    /// them and rolls back unless disarmed.
    pub(crate) async fn run(self, lock: LockGuard, lag: &dyn SyncLag, started: Instant) -> Ended {
        // The locked section races the lock's loss signal: a cutover whose lock is declared lost,
        // or released through the manager, stops at its next await point and rolls back (its
        // routing writes are fenced, too). The loss signal, not `LockGuard::run`: the lock
        // moves into the rollback guard halfway, and `run` would also make the plug-ins' calls
        // a critical section of the cutover key (a nested `try_acquire` of it: `Reentrant`,
        // not `None`).
        let loss = lock.loss_signal().clone();
        let (migration, gate) = match until_lost(&loss, self.prepare()).await.and_then(|r| r) {
            Ok(prepared) => prepared,
            Err(failure) => {
                self.log(&failure);
                let _ = lock.release().await;
                return self.ended(Some((failure, false)), 0);
            }
        };
        // Armed before the transition is sent: if this future is dropped mid-write, the write
        // may still commit, and the rollback (compare-and-set on this attempt) is then needed.
        let guard = RollbackGuard::arm(self.rollback(), lock, gate);
        let mut events_synced = 0;
        let checked = until_lost(
            &loss,
            self.enter_and_check(&migration, lag, &mut events_synced),
        )
        .await
        .unwrap_or_else(|lost| Err(Step::Failed(lost)));
        match checked {
            Ok(()) => self.complete(guard, &loss, events_synced, started).await,
            Err(Step::NothingWritten(failure)) => {
                self.log(&failure);
                guard.disarm().release().await;
                self.ended(Some((failure, false)), events_synced)
            }
            Err(Step::Failed(failure)) => self.fail(guard, failure, events_synced).await,
        }
    }

    /// Re-reads and re-validates everything under the lock, then closes the write gate.
    async fn prepare(&self) -> Result<(Migration, LockGuard), Failure> {
        let migration = self.validated().await?;
        let gate = self.close_gate().await?;
        Ok((migration, gate))
    }

    async fn validated(&self) -> Result<Migration, Failure> {
        let mut migration = self.load().await?;
        if migration.phase == MigrationPhase::Cutover {
            self.repair(&migration).await?;
            migration = self.load().await?;
        }
        let (migration_id, tenant_id) = (self.plan.migration_id, self.plan.tenant_id);
        match migration.phase {
            MigrationPhase::DualWrite => {}
            MigrationPhase::Completed => {
                return Err(Failure::new(
                    CutoverFailure::AlreadyMigrated,
                    format!(
                        "Tenant {tenant_id} is already migrated to store '{}' \
                         (migration {migration_id} is completed)",
                        migration.target_store_id
                    ),
                ));
            }
            phase => {
                return Err(Failure::new(
                    CutoverFailure::WrongPhase,
                    format!(
                        "Cannot perform cutover: migration is in {phase} phase (expected dual_write)"
                    ),
                ));
            }
        }
        self.check_routing().await?;
        if !self.stores.is_registered(&migration.target_store_id) {
            let err = Error::UnknownStore {
                store_id: migration.target_store_id.clone(),
            };
            return Err(Failure::new(
                CutoverFailure::UnknownTargetStore,
                err.to_string(),
            ));
        }
        Ok(migration)
    }

    async fn load(&self) -> Result<Migration, Failure> {
        let migration_id = self.plan.migration_id;
        self.store
            .get_migration(migration_id)
            .await
            .map_err(|err| Failure::store(&err, ""))?
            .ok_or_else(|| {
                let err = Error::MigrationNotFound { migration_id };
                Failure::new(CutoverFailure::MigrationNotFound, err.to_string())
            })
    }

    async fn check_routing(&self) -> Result<(), Failure> {
        let (migration_id, tenant_id) = (self.plan.migration_id, self.plan.tenant_id);
        let routing = self
            .store
            .get_routing(tenant_id)
            .await
            .map_err(|err| Failure::new(CutoverFailure::Storage, err.to_string()))?
            .ok_or_else(|| {
                Failure::new(
                    CutoverFailure::RoutingMissing,
                    "No routing configuration found for tenant",
                )
            })?;
        if routing.state != RoutingState::DualWrite {
            return Err(Failure::new(
                CutoverFailure::WrongRoutingState,
                format!(
                    "Invalid migration state: {} (expected DUAL_WRITE)",
                    routing.state
                ),
            ));
        }
        if routing.active_migration_id != Some(migration_id) {
            return Err(Failure::new(
                CutoverFailure::StateChanged,
                format!(
                    "Routing of tenant {tenant_id} does not belong to migration {migration_id}"
                ),
            ));
        }
        Ok(())
    }

    /// Rolls back an earlier attempt that left the migration in `cutover`. Holding the lock
    /// proves that attempt is gone.
    async fn repair(&self, migration: &Migration) -> Result<(), Failure> {
        let Some(interrupted) = migration.cutover_attempt else {
            return Ok(());
        };
        let reason = format!(
            "Cutover attempt {interrupted} was interrupted before it finished; \
             rolled back by attempt {}",
            self.plan.attempt_id
        );
        let rollback = Rollback {
            plan: self.plan.for_attempt(interrupted),
            ..self.rollback()
        };
        rollback
            .run(&reason)
            .await
            .map(|_| ())
            .map_err(|err| Failure::store(&err, ""))
    }

    /// Closes the write gate: in-flight writes drain, new ones wait behind the cutover.
    async fn close_gate(&self) -> Result<LockGuard, Failure> {
        const DRAINING: &str = "while waiting for in-flight writes to drain";
        let remaining = self.budget.remaining(DRAINING)?;
        let key = WriteGate::key(self.plan.tenant_id);
        match self.locks.acquire(key, Some(remaining)).await {
            Ok(gate) => Ok(gate),
            Err(err) if err.is_timeout() => Err(self.budget.exceeded(DRAINING)),
            Err(err) => Err(Failure::new(
                CutoverFailure::LockUnavailable,
                format!("Failed to close the write gate: {err}"),
            )),
        }
    }

    /// Enters `cutover`, then measures the lag twice and checks the target's health.
    async fn enter_and_check(
        &self,
        migration: &Migration,
        lag: &dyn SyncLag,
        events_synced: &mut u64,
    ) -> Result<(), Step> {
        if let Err(err) = self.store.apply_transition(&self.plan.enter()).await {
            let failure = Failure::store(&err, "");
            return Err(match err.is_refused() {
                true => Step::NothingWritten(failure),
                false => Step::Failed(failure),
            });
        }
        // The gate is closed, so no write is in flight: the lag is final.
        let max = migration.config.max_lag_events;
        let first = self
            .measure(lag, migration, max)
            .await
            .map_err(Step::Failed)?;
        self.budget.check().map_err(Step::Failed)?;
        let second = self
            .measure(lag, migration, max)
            .await
            .map_err(Step::Failed)?;
        *events_synced = first.saturating_sub(second);
        self.budget.check().map_err(Step::Failed)?;
        self.stores
            .check_health(&migration.target_store_id)
            .await
            .map_err(|err| {
                Step::Failed(Failure::new(
                    CutoverFailure::TargetUnhealthy,
                    format!("Target store health check failed: {err}"),
                ))
            })
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
                Err(Failure::new(
                    CutoverFailure::LagTooHigh,
                    format!("Sync lag too high for cutover: {events} events (max: {max})"),
                ))
            }
            Ok(Some(events)) => Ok(events),
            Ok(None) => Err(Failure::new(
                CutoverFailure::LagUnavailable,
                "Unable to calculate sync lag",
            )),
            Err(err) => Err(Failure::new(
                CutoverFailure::LagUnavailable,
                format!("Unable to calculate sync lag: {err}"),
            )),
        }
    }

    /// Writes the completion while the lock and the gate are held, then lets them go; or rolls
    /// back if the completion cannot be written.
    async fn complete(
        &self,
        guard: RollbackGuard,
        loss: &LossSignal,
        events_synced: u64,
        started: Instant,
    ) -> Ended {
        // The last moment to notice a loss before the switch is written.
        if let Some(cause) = loss.cause() {
            let failure = Failure::new(
                CutoverFailure::LockLost,
                format!("The cutover lock was lost: {cause}"),
            );
            return self.fail(guard, failure, events_synced).await;
        }
        let complete = self
            .plan
            .complete(events_synced, duration_ms(started.elapsed()));
        match self.store.apply_transition(&complete).await {
            Ok(_) => {}
            // The commit may have happened with its answer lost. Under the lock only this
            // attempt can complete the migration, so `completed` means it did.
            Err(err) if !err.is_refused() && self.completed_anyway().await => {}
            Err(err) => {
                let failure = Failure::store(&err, "Failed to complete cutover: ");
                return self.fail(guard, failure, events_synced).await;
            }
        }
        guard.disarm().release().await;
        self.ended(None, events_synced)
    }

    async fn completed_anyway(&self) -> bool {
        matches!(
            self.store.get_migration(self.plan.migration_id).await,
            Ok(Some(migration)) if migration.phase == MigrationPhase::Completed
        )
    }

    /// Rolls back, then lets the gate and the lock go (or leaves that to the guard's retry).
    async fn fail(&self, guard: RollbackGuard, failure: Failure, events_synced: u64) -> Ended {
        self.log(&failure);
        let rolled_back = guard.roll_back(&failure.message).await;
        self.ended(Some((failure, rolled_back)), events_synced)
    }

    fn log(&self, failure: &Failure) {
        let (tenant, message) = (self.plan.tenant_id, &failure.message);
        match failure.kind {
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
    }

    fn rollback(&self) -> Rollback {
        Rollback {
            store: Arc::clone(&self.store),
            plan: self.plan.clone(),
            tracing: self.tracing,
        }
    }

    fn ended(&self, failure: Option<(Failure, bool)>, events_synced: u64) -> Ended {
        Ended {
            attempt_id: Some(self.plan.attempt_id),
            failure,
            events_synced,
        }
    }
}

/// Runs `work` until it ends or the lock goes (declared lost, or released through the
/// manager), whichever comes first.
async fn until_lost<F: Future>(loss: &LossSignal, work: F) -> Result<F::Output, Failure> {
    loss.run_until_lost(work).await.map_err(|cause| {
        Failure::new(
            CutoverFailure::LockLost,
            format!("The cutover lock was lost: {cause}"),
        )
    })
}

/// The cutover's time budget once it holds the lock.
pub(crate) struct Budget {
    pub(crate) limit: Duration,
    pub(crate) started: Instant,
    pub(crate) tenant_id: Uuid,
}

impl Budget {
    fn remaining(&self, context: &str) -> Result<Duration, Failure> {
        match self.limit.checked_sub(self.started.elapsed()) {
            Some(remaining) if !remaining.is_zero() => Ok(remaining),
            _ => Err(self.exceeded(context)),
        }
    }

    fn check(&self) -> Result<(), Failure> {
        self.remaining("").map(|_| ())
    }

    fn exceeded(&self, context: &str) -> Failure {
        let elapsed = duration_ms(self.started.elapsed());
        let limit = duration_ms(self.limit);
        tracing::warn!(
            "Cutover timeout for tenant {}: {elapsed:.2}ms exceeded {limit:.2}ms",
            self.tenant_id
        );
        let mut message = format!("Cutover timeout exceeded: {elapsed:.2}ms (limit: {limit:.2}ms)");
        if !context.is_empty() {
            message.push(' ');
            message.push_str(context);
        }
        Failure::new(CutoverFailure::Timeout, message)
    }
}
