//! How long an acquisition waits, in the one form it keeps from the caller to the backend.

use std::time::Duration;

use crate::LockMode;

/// How [`LockManager::lock`](crate::LockManager::lock) should take a lock: in which mode, and how long to wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireOptions {
    /// Exclusive or shared.
    pub mode: LockMode,
    /// Whether, and how long, to wait for another holder.
    pub wait: Wait,
}

impl AcquireOptions {
    /// Options for `mode`, waiting as `wait` says.
    pub fn new(mode: LockMode, wait: Wait) -> Self {
        AcquireOptions { mode, wait }
    }
}

/// How long an acquisition waits for another holder to let go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wait {
    /// One attempt; a held key is `Ok(None)`, not an error.
    No,
    /// At most this long from the call; then [`Error::Timeout`](crate::Error::Timeout). Zero
    /// makes one attempt that fails with the timeout when the key is held.
    For(Duration),
    /// As long as it takes.
    Forever,
}

impl Wait {
    /// The bound of a `Wait::For`; `None` for the others.
    pub(crate) fn bound(self) -> Option<Duration> {
        match self {
            Wait::For(timeout) => Some(timeout),
            Wait::No | Wait::Forever => None,
        }
    }
}

impl From<Option<Duration>> for Wait {
    /// `None` waits forever, `Some(t)` at most `t`: the `timeout` argument of
    /// [`acquire`](crate::LockManagerExt::acquire).
    fn from(timeout: Option<Duration>) -> Self {
        timeout.map_or(Wait::Forever, Wait::For)
    }
}
