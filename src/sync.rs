//! Small synchronisation helpers.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, carrying on after a panic of another holder. Every mutex locked this way
/// guards a critical section that only moves values around, so a panic cannot leave its data
/// half-changed, and refusing to go on would turn one panic into a dead manager.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
