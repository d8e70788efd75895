//! Who releases a guard's acquisition: one variant per backend of this crate.
//!
//! The public [`LockGuard`](crate::LockGuard) holds an [`Exit`], so its release is a `match`
//! rather than a boxed future (measured: 35,766 → 27,708 instructions an acquire-release
//! cycle), and `Custom` serves implementors of the port elsewhere. The enum lives here, above
//! the engine and the backends, which never name it nor the public guard; `guard.rs` makes a
//! guard of any acquisition whose backend has a variant. A new backend of this crate is one
//! variant and one `exit_of!` line below, and one line in `managers.rs`.

use crate::core::CoreGuard;
use crate::memory::MemoryBackend;
use crate::postgres::backend::PgBackend;
use crate::{LossSignal, Result};

use async_trait::async_trait;

/// Who releases a guard's acquisition.
pub(crate) enum Exit {
    Postgres(CoreGuard<PgBackend>),
    Memory(CoreGuard<MemoryBackend>),
    /// The engine's simulation, in the crate's own tests.
    #[cfg(test)]
    Sim(CoreGuard<crate::core::SimBackend>),
    Custom(Box<dyn GuardBackend>),
}

impl Exit {
    /// Releases the acquisition; `loss` is its guard's signal, which says why when it is gone.
    pub(crate) async fn release(self, loss: &LossSignal) -> Result<()> {
        match self {
            Exit::Postgres(guard) => guard.release(loss).await,
            Exit::Memory(guard) => guard.release(loss).await,
            #[cfg(test)]
            Exit::Sim(guard) => guard.release(loss).await,
            Exit::Custom(backend) => backend.release().await,
        }
    }

    /// Keeps the lock held in the manager's registry, without a guard.
    pub(crate) fn leak(self) {
        match self {
            Exit::Postgres(guard) => guard.leak(),
            Exit::Memory(guard) => guard.leak(),
            #[cfg(test)]
            Exit::Sim(guard) => guard.leak(),
            Exit::Custom(backend) => backend.leak(),
        }
    }
}

impl std::fmt::Debug for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Postgres(guard) => guard.fmt(f),
            Exit::Memory(guard) => guard.fmt(f),
            #[cfg(test)]
            Exit::Sim(guard) => guard.fmt(f),
            Exit::Custom(backend) => backend.fmt(f),
        }
    }
}

/// Each backend's guards go into their variant.
macro_rules! exit_of {
    ($backend:ty, $variant:ident) => {
        impl From<CoreGuard<$backend>> for Exit {
            fn from(guard: CoreGuard<$backend>) -> Self {
                Exit::$variant(guard)
            }
        }
    };
}

exit_of!(PgBackend, Postgres);
exit_of!(MemoryBackend, Memory);
#[cfg(test)]
exit_of!(crate::core::SimBackend, Sim);

/// The implementor's side of a [`LockGuard`](crate::LockGuard).
///
/// Implementations of [`LockManager`](crate::LockManager) hand one of these to
/// [`LockGuard::new`](crate::LockGuard::new). The guard calls exactly one of [`release`](GuardBackend::release) and
/// [`leak`](GuardBackend::leak), or neither, in which case it drops the backend.
///
/// # Contract
///
/// * **Drop releases.** Dropping a backend on which neither method was called must start
///   releasing its acquisition without blocking (typically on a spawned task). Dropping the
///   future returned by `release` before it completes must do the same.
/// * **Own acquisition only, and silently.** A backend releases only the acquisition it was
///   created for, and its own release does not fire the loss signal. If that acquisition went
///   already (declared lost, or released through the manager, both of which fire the signal),
///   `release` returns [`Error::LockLost`](crate::Error::LockLost) with the signal's cause and dropping does nothing,
///   even when the same key has been acquired again since.
/// * **Loss.** [`loss_signal`](GuardBackend::loss_signal) returns the acquisition's signal,
///   which the manager fires whenever the lock goes other than through this backend.
#[async_trait]
pub trait GuardBackend: Send + Sync + std::fmt::Debug + 'static {
    /// Releases the acquisition now; see [`LockGuard::release`](crate::LockGuard::release) for the meaning of the result.
    async fn release(self: Box<Self>) -> Result<()>;

    /// Hands the acquisition to the manager's registry without releasing it; see
    /// [`LockGuard::leak`](crate::LockGuard::leak).
    fn leak(self: Box<Self>);

    /// The signal fired when this acquisition goes other than through this backend.
    fn loss_signal(&self) -> LossSignal;
}
