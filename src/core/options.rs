//! What the engine is built with, and the part of it both managers' builders share.

use std::sync::Arc;
use std::time::Duration;

use super::Budget;
use crate::hooks::StageHook;
use crate::telemetry::Telemetry;
use crate::telemetry::instruments::Metrics;

pub(crate) struct Options {
    pub(crate) metrics: Metrics,
    pub(crate) holder_id: Arc<str>,
    pub(crate) tracing: bool,
    pub(crate) hook: Option<StageHook>,
    pub(crate) handoff: Option<HandoffLimits>,
    pub(crate) budget: Arc<Budget>,
    /// Tests only: a dropped guard always takes the path used when the registry is busy.
    pub(crate) defer_drops: bool,
    /// The waits of callers inside critical sections, shared with the backend that carries
    /// their probes.
    pub(crate) waits: Arc<super::Waits>,
}

/// When a holder releases while another task of the same manager waits for the key, the lock
/// goes straight to that task (its session never unlocks), at most `max_handoffs` times in a
/// row and for at most `max_hold` since the server granted it; then it goes back to the server
/// queue, so other processes waiting there get their turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandoffLimits {
    pub(crate) max_handoffs: u32,
    pub(crate) max_hold: Duration,
}

impl HandoffLimits {
    pub(crate) const DEFAULT: HandoffLimits = HandoffLimits {
        max_handoffs: 16,
        max_hold: Duration::from_millis(10),
    };
}

/// What every manager's builder takes: who the holder is, its telemetry, its budget.
#[derive(Default)]
pub(crate) struct CommonOptions {
    pub(crate) holder_id: Option<String>,
    pub(crate) telemetry: Telemetry,
    pub(crate) lock_budget: Option<usize>,
}

impl CommonOptions {
    /// The engine's options, with the hooks of [`build_with`](crate::hooks::build_with) if the
    /// manager is built inside it, and a generated holder id if none was given.
    pub(crate) fn into_options(self, handoff: Option<HandoffLimits>) -> Options {
        let holder_id = self
            .holder_id
            .unwrap_or_else(crate::identity::default_holder_id);
        let metrics = Metrics::build(self.telemetry.meter, &holder_id);
        let hooks = crate::hooks::current();
        Options {
            budget: Budget::new(self.lock_budget, metrics.clone()),
            metrics,
            holder_id: holder_id.into(),
            tracing: self.telemetry.tracing,
            hook: hooks.stage,
            handoff,
            defer_drops: hooks.defer_guard_drops,
            waits: Arc::default(),
        }
    }
}

impl std::fmt::Debug for CommonOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommonOptions")
            .field("holder_id", &self.holder_id)
            .field("tracing", &self.telemetry.tracing)
            .field("lock_budget", &self.lock_budget)
            .finish_non_exhaustive()
    }
}
