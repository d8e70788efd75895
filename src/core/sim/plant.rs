//! Known bugs, planted one at a time into the engine, so the simulation shows it can find them.
//!
//! The engine asks [`planted!`](crate::core::planted) at each planting site; outside the crate's
//! own unit tests the macro is `false` and the site compiles away.

use std::cell::Cell;

/// A known bug the engine can be built with, in the simulation only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bug {
    /// Registration ignores a session that ended between the grant and the registry: its lock
    /// is gone and nobody tells the holder (the loss race).
    LossRace,
    /// A waiter cancelled just as the turn was handed to it keeps the turn: the key is stuck
    /// for every later caller of the manager.
    CancelledGrantKept,
    /// A release the server did not confirm keeps its place in the budget.
    SlotKeptOnFailedUnlock,
    /// The handoff limit is checked one too late: a session is handed on once more than allowed.
    HandoffPastLimit,
    /// `release_all` lets the locks go without telling their holders.
    ReleaseAllUntold,
    /// A handoff goes ahead whatever the server says of the session: a holder whose session
    /// ended unseen is told its release was confirmed.
    HandoffUnheard,
}

impl Bug {
    pub(crate) const ALL: [Bug; 6] = [
        Bug::LossRace,
        Bug::CancelledGrantKept,
        Bug::SlotKeptOnFailedUnlock,
        Bug::HandoffPastLimit,
        Bug::ReleaseAllUntold,
        Bug::HandoffUnheard,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Bug::LossRace => "loss-race",
            Bug::CancelledGrantKept => "cancelled-grant-kept",
            Bug::SlotKeptOnFailedUnlock => "slot-kept-on-failed-unlock",
            Bug::HandoffPastLimit => "handoff-past-limit",
            Bug::ReleaseAllUntold => "release-all-untold",
            Bug::HandoffUnheard => "handoff-unheard",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|bug| bug.name() == name)
    }
}

thread_local! {
    static PLANTED: Cell<Option<Bug>> = const { Cell::new(None) };
}

/// Whether `bug` is planted on this thread (the simulation runs each world on one thread).
pub(crate) fn is_planted(bug: Bug) -> bool {
    PLANTED.with(|planted| planted.get() == Some(bug))
}

/// Plants `bug` (or none) on this thread until the returned value is dropped.
pub(crate) fn plant(bug: Option<Bug>) -> Planted {
    PLANTED.with(|planted| planted.set(bug));
    Planted
}

/// Removes the planted bug when dropped.
pub(crate) struct Planted;

impl Drop for Planted {
    fn drop(&mut self) {
        PLANTED.with(|planted| planted.set(None));
    }
}
