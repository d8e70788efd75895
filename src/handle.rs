//! The one shape of what an acquisition hands back.

use std::fmt;
use std::future::Future;

use crate::{LossSignal, Result};

/// What every handle on held locks can do: [`LockGuard`](crate::LockGuard) (one lock, either
/// mode), [`LockSet`](crate::LockSet) (several, all or nothing) and
/// [`Permit`](crate::semaphore::Permit) (a semaphore's slot).
///
/// | method | what it does |
/// | --- | --- |
/// | [`info`](Self::info) | what was granted: key, lock id, mode, holder id, fencing token (one [`LockInfo`](crate::LockInfo) per lock) |
/// | [`loss_signal`](Self::loss_signal) | fires, with the cause, when a lock of the handle goes other than through the handle |
/// | [`run`](Self::run) | runs a body as the critical section of every lock of the handle, cancelled when one goes |
/// | [`release`](Self::release) | releases now, and says whether every release was confirmed |
/// | [`leak`](Self::leak) | keeps the locks held without the handle, in the manager's registry |
///
/// Dropping a handle is its fourth exit: the release then runs in the background (see
/// [`LockGuard`](crate::LockGuard)). Each type has the same methods inherently, so the trait
/// is needed only by code generic over handles; it is sealed, so the crate may add methods.
/// The [primitives table](crate#one-shape-for-every-primitive) says which primitive hands
/// back which handle.
pub trait LockHandle: Send + Sync + fmt::Debug + Sized + sealed::Sealed {
    /// What was granted: [`LockInfo`](crate::LockInfo) for one lock, `[LockInfo]` for a set.
    type Info: ?Sized + ToOwned + fmt::Debug;

    /// What was granted.
    fn info(&self) -> &Self::Info;

    /// The signal that fires when a lock of the handle goes other than through the handle:
    /// declared lost, or released through the manager.
    fn loss_signal(&self) -> &LossSignal;

    /// Runs `body` as the critical section of every lock of the handle; see
    /// [`LockGuard::run`](crate::LockGuard::run).
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`](crate::Error::LockLost) when a lock went before `body` finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body`; the locks stay held.
    fn run<F>(&self, body: F) -> impl Future<Output = Result<F::Output>> + Send
    where
        F: Future + Send;

    /// Releases every lock of the handle now; see
    /// [`LockGuard::release`](crate::LockGuard::release).
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`](crate::Error::LockLost) when a lock had gone already,
    /// [`Error::ReleaseFailed`](crate::Error::ReleaseFailed) when a release was not confirmed
    /// (its session was then closed, which frees the lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: what is not yet released is released in the background, as on drop.
    fn release(self) -> impl Future<Output = Result<()>> + Send;

    /// Keeps the locks held without the handle, owned by the manager's registry until
    /// [`release`](crate::LockManagerExt::release) or
    /// [`release_all`](crate::LockManager::release_all) names them, and returns what was
    /// granted.
    fn leak(self) -> <Self::Info as ToOwned>::Owned;
}

pub(crate) mod sealed {
    /// Only this crate's handles are [`LockHandle`](super::LockHandle)s.
    pub trait Sealed {}
}
