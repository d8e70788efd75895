//! Lock models for [`check`](super::check): a mutex, a reader-writer lock, a counting
//! semaphore. Their operations are [`LockCall`]s: a holder takes the lock, is refused it, or
//! lets it go.
//!
//! A holder is a number the caller gives each client (a worker's task, say). Every model
//! refuses a release by a holder that does not hold the lock, and a second acquisition by a
//! holder that already holds it (pglock's managers hold a key at most once).

use pglock::LockMode;

use super::Model;

/// One lock operation of one holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockCall {
    /// Who.
    pub holder: u32,
    /// What.
    pub action: Action,
}

/// What a holder did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// It took the lock, in this mode.
    Acquire(LockMode),
    /// It asked for the lock in this mode without waiting, and was told the lock was held.
    Refused(LockMode),
    /// It let the lock go.
    Release,
}

/// A mutual-exclusion lock: one holder at a time. Shared acquisitions are not its operations
/// and never fit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mutex;

impl Model for Mutex {
    type Input = LockCall;
    /// The holder, if any.
    type State = Option<u32>;

    fn init(&self) -> Option<u32> {
        None
    }

    fn step(&self, state: &Option<u32>, call: &LockCall) -> Option<Option<u32>> {
        match (call.action, *state) {
            (Action::Acquire(LockMode::Exclusive), None) => Some(Some(call.holder)),
            (Action::Refused(LockMode::Exclusive), Some(holder)) => Some(Some(holder)),
            (Action::Release, Some(holder)) if holder == call.holder => Some(None),
            _ => None,
        }
    }
}

/// The state of a [`RwLock`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RwState {
    /// No holder.
    Free,
    /// One exclusive holder.
    Writer(u32),
    /// Shared holders, in ascending order.
    Readers(Vec<u32>),
}

/// A reader-writer lock: one exclusive holder, or any number of shared ones.
///
/// A refused exclusive request fits whenever the lock is held. A refused shared request fits
/// whenever the lock is held too, not only by a writer: PostgreSQL refuses a shared try that
/// would jump ahead of a waiting exclusive request, and the model does not follow waiters.
#[derive(Debug, Clone, Copy, Default)]
pub struct RwLock;

impl Model for RwLock {
    type Input = LockCall;
    type State = RwState;

    fn init(&self) -> RwState {
        RwState::Free
    }

    fn step(&self, state: &RwState, call: &LockCall) -> Option<RwState> {
        let holder = call.holder;
        match (call.action, state) {
            (Action::Acquire(LockMode::Exclusive), RwState::Free) => Some(RwState::Writer(holder)),
            (Action::Acquire(LockMode::Shared), RwState::Free) => {
                Some(RwState::Readers(vec![holder]))
            }
            (Action::Acquire(LockMode::Shared), RwState::Readers(readers)) => {
                let at = readers.binary_search(&holder).err()?;
                let mut readers = readers.clone();
                readers.insert(at, holder);
                Some(RwState::Readers(readers))
            }
            (Action::Refused(_), RwState::Writer(_) | RwState::Readers(_)) => Some(state.clone()),
            (Action::Release, RwState::Writer(writer)) if *writer == holder => Some(RwState::Free),
            (Action::Release, RwState::Readers(readers)) => {
                let at = readers.binary_search(&holder).ok()?;
                let mut readers = readers.clone();
                readers.remove(at);
                Some(if readers.is_empty() {
                    RwState::Free
                } else {
                    RwState::Readers(readers)
                })
            }
            _ => None,
        }
    }
}

/// A counting semaphore of `permits`: each acquisition takes one permit, in either mode. A
/// holder takes at most one at a time.
#[derive(Debug, Clone, Copy)]
pub struct Semaphore {
    /// How many holders at once.
    pub permits: usize,
}

impl Model for Semaphore {
    type Input = LockCall;
    /// The holders, in ascending order.
    type State = Vec<u32>;

    fn init(&self) -> Vec<u32> {
        Vec::new()
    }

    fn step(&self, holders: &Vec<u32>, call: &LockCall) -> Option<Vec<u32>> {
        match call.action {
            Action::Acquire(_) if holders.len() < self.permits => {
                let at = holders.binary_search(&call.holder).err()?;
                let mut holders = holders.clone();
                holders.insert(at, call.holder);
                Some(holders)
            }
            Action::Refused(_) if holders.len() >= self.permits => Some(holders.clone()),
            Action::Release => {
                let at = holders.binary_search(&call.holder).ok()?;
                let mut holders = holders.clone();
                holders.remove(at);
                Some(holders)
            }
            _ => None,
        }
    }
}
