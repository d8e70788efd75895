//! Rolling a cutover attempt back, and the guard that makes sure it happens.

use std::borrow::Cow;
use std::sync::Arc;

use pglock::LockGuard;
use tracing::{Instrument, Span, field::Empty};

use super::plan::Plan;
use crate::Result;
use crate::store::MigrationStore;
use crate::telemetry::{self, outcome};

/// Rolls one attempt back: everything it needs, owned, so a spawned task can run it.
#[derive(Debug, Clone)]
pub(crate) struct Rollback {
    pub(crate) store: Arc<dyn MigrationStore>,
    pub(crate) plan: Plan,
    pub(crate) tracing: bool,
}

impl Rollback {
    /// Puts the migration back into `dual_write` on the source, if this attempt's `cutover` is
    /// still there. Returns whether it was; errors when the outcome is unknown.
    pub(crate) async fn run(&self, reason: &str) -> Result<bool> {
        let span = self.span(reason);
        let mut recorder = telemetry::recorder(span.clone());
        let result = self
            .store
            .apply_transition(&self.plan.roll_back(reason))
            .instrument(span.clone())
            .await;
        match result {
            Ok(_) => {
                recorder.finish(outcome::ROLLED_BACK, false);
                Ok(true)
            }
            // Nothing of this attempt is left to undo: it never entered `cutover`, or someone
            // else moved the migration on.
            Err(err) if err.is_refused() => {
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

    fn span(&self, reason: &str) -> Span {
        if !self.tracing {
            return Span::none();
        }
        tracing::info_span!(
            telemetry::ROLLBACK_SPAN,
            { telemetry::MIGRATION_ID } = %self.plan.migration_id,
            { telemetry::TENANT_ID } = %self.plan.tenant_id,
            { telemetry::ATTEMPT_ID } = %self.plan.attempt_id,
            { telemetry::REASON } = reason,
            { telemetry::OUTCOME } = Empty,
            otel.status_code = Empty,
        )
    }
}

/// What a cutover attempt holds from the moment its `cutover` transition may have been written:
/// the cutover lock, the write gate, and the rollback.
///
/// Like tokio-util's `DropGuard`, it acts when dropped unless [disarmed](Self::disarm): an
/// armed guard that is dropped (a cancelled cutover, a rollback whose outcome is unknown)
/// spawns the rollback on the runtime, and releases the gate and the lock only once it is
/// written, so no other cutover or writer can see the attempt's intermediate state. Without a
/// runtime it cannot roll back; the locks then go as their guards drop, and the next cutover of
/// the tenant repairs the migration under the lock.
#[must_use = "dropping the guard rolls the attempt back"]
#[derive(Debug)]
pub(crate) struct RollbackGuard {
    armed: Option<Armed>,
}

#[derive(Debug)]
struct Armed {
    rollback: Rollback,
    reason: Cow<'static, str>,
    lock: LockGuard,
    gate: LockGuard,
}

/// The locks of a disarmed guard, released gate first so writers get in after the switch.
#[derive(Debug)]
pub(crate) struct Held {
    lock: LockGuard,
    gate: LockGuard,
}

impl Held {
    /// Opens the gate, then releases the lock. A failed release is logged by the lock manager
    /// and leaves nothing held (its session is closed).
    pub(crate) async fn release(self) {
        let _ = self.gate.release().await;
        let _ = self.lock.release().await;
    }
}

impl RollbackGuard {
    pub(crate) fn arm(rollback: Rollback, lock: LockGuard, gate: LockGuard) -> Self {
        RollbackGuard {
            armed: Some(Armed {
                rollback,
                reason: Cow::Borrowed("Cutover was cancelled before it finished"),
                lock,
                gate,
            }),
        }
    }

    /// Nothing needs undoing any more: hands the locks back.
    pub(crate) fn disarm(mut self) -> Held {
        let armed = self.armed.take().expect("a guard is armed until disarmed");
        Held {
            lock: armed.lock,
            gate: armed.gate,
        }
    }

    /// Rolls back now. Once the outcome is known (rolled back, or nothing left to roll back)
    /// the guard is disarmed and the locks released; returns whether it rolled back. When the
    /// outcome is unknown, the guard is dropped armed, so a spawned task tries again before
    /// the locks go.
    pub(crate) async fn roll_back(mut self, reason: &str) -> bool {
        let armed = self
            .armed
            .as_mut()
            .expect("a guard is armed until disarmed");
        armed.reason = Cow::Owned(reason.to_owned());
        match armed.rollback.run(reason).await {
            Ok(rolled_back) => {
                self.disarm().release().await;
                rolled_back
            }
            Err(_) => false,
        }
    }
}

impl Drop for RollbackGuard {
    fn drop(&mut self) {
        let Some(armed) = self.armed.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let _ = armed.rollback.run(&armed.reason).await;
            // Only now may another cutover, or a writer, get in.
            Held {
                lock: armed.lock,
                gate: armed.gate,
            }
            .release()
            .await;
        });
    }
}
