//! A manager's budget of held locks: how many it may hold at once, so one manager cannot fill
//! the server's shared lock table, which every session of the database needs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The limit, and the locks held or being taken against it.
pub(crate) struct Budget {
    /// `UNSET` until a limit is given or derived: nothing is refused then.
    limit: AtomicUsize,
    /// Given by the user: never replaced by a derived default.
    explicit: bool,
    used: AtomicUsize,
    metrics: crate::telemetry::instruments::Metrics,
}

const UNSET: usize = usize::MAX;

/// One lock's place in the budget, given back as it drops.
pub(crate) struct Slot {
    budget: Arc<Budget>,
}

impl Budget {
    /// A budget of `limit` locks, or one to be derived later (`None`).
    pub(crate) fn new(
        limit: Option<usize>,
        metrics: crate::telemetry::instruments::Metrics,
    ) -> Arc<Self> {
        let budget = Budget {
            limit: AtomicUsize::new(limit.unwrap_or(UNSET)),
            explicit: limit.is_some(),
            used: AtomicUsize::new(0),
            metrics,
        };
        if let Some(limit) = limit {
            budget.metrics.budget(limit);
        }
        Arc::new(budget)
    }

    /// The limit in force, once there is one.
    pub(crate) fn limit(&self) -> Option<usize> {
        Some(self.limit.load(Ordering::SeqCst)).filter(|&limit| limit != UNSET)
    }

    /// Sets the default limit, unless the user gave one.
    pub(crate) fn set_default(&self, limit: usize) {
        if self.explicit {
            return;
        }
        let before = self.limit.swap(limit, Ordering::SeqCst);
        if before != limit {
            self.metrics.budget(limit);
        }
    }

    /// Takes a place for one more lock, or says `(held, limit)` when there is none.
    /// How many places are taken, for the simulation's invariants.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    pub(crate) fn reserve(self: &Arc<Self>) -> Result<Slot, (usize, usize)> {
        let limit = self.limit.load(Ordering::SeqCst);
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used < limit).then_some(used + 1)
            })
            .map(|_| Slot {
                budget: Arc::clone(self),
            })
            .map_err(|used| (used, limit))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_refused_at_the_limit_and_come_back_as_slots_drop() {
        let budget = Budget::new(Some(2), Default::default());
        let one = budget.reserve().expect("one");
        let two = budget.reserve().expect("two");
        assert_eq!(budget.reserve().err(), Some((2, 2)));
        drop(one);
        let three = budget.reserve().expect("a place came back");
        budget.set_default(100);
        assert_eq!(budget.limit(), Some(2), "a given limit is never replaced");
        drop((two, three));
    }

    #[test]
    fn an_unset_budget_refuses_nothing_until_a_default_is_derived() {
        let budget = Budget::new(None, Default::default());
        assert_eq!(budget.limit(), None);
        let held: Vec<Slot> = (0..3)
            .map(|_| budget.reserve().expect("no limit"))
            .collect();
        budget.set_default(3);
        assert_eq!(budget.limit(), Some(3));
        assert_eq!(budget.reserve().err(), Some((3, 3)));
        drop(held);
        assert!(budget.reserve().is_ok());
    }
}
