//! Tools for testing code that uses pglock, and for testing lock managers themselves.
//!
//! Add it to your `[dev-dependencies]` next to `pglock`:
//!
//! ```toml
//! [dev-dependencies]
//! pglock-testing = "0.3"
//! ```
//!
//! * [`conformance`]: the contract of [`LockManager`](pglock::LockManager) as executable cases.
//!   [`conformance_tests!`](crate::conformance_tests) turns them into one `#[tokio::test]` per
//!   case for any manager, yours included.
//! * [`database_url`]: a real PostgreSQL for tests, from `DATABASE_URL` or from a throwaway
//!   server started from the installed binaries and shared by every test binary of the run;
//!   [`TempPostgres`]: a server of a test's own, to stop, restart or reconfigure.
//! * [`TempPgBouncer`]: a PgBouncer of the tests' own in front of a server, in the
//!   [`PoolMode`] under test, to test code that runs behind one.
//! * [`Proxy`]: a TCP proxy in front of a server that a test blackholes, resets, delays or
//!   points elsewhere, for partitions and moving endpoints.
//! * [`search_path`]: schemas that shadow `pg_catalog`'s names, to check that statements name
//!   what they mean whatever the `search_path`.
//! * [`Stage`], [`pause_at`]: stop an operation of pglock's managers at a chosen await point,
//!   to test what happens when it is cancelled there.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Snippets build under `-D warnings`, as a user's code copied from them would.
#![doc(test(attr(deny(warnings), allow(dead_code))))]

pub mod conformance;
mod pgbouncer;
mod proxy;
pub mod search_path;
mod server;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

/// Locks `mutex`, carrying on after a panic of another holder: the mutexes of this crate guard
/// a child process handle, which a panic cannot leave half-changed.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub use pgbouncer::{HOW_TO_GET_PGBOUNCER, PoolMode, TempPgBouncer};
pub use pglock::hooks::{Stage, StageHook};
pub use proxy::Proxy;
pub use server::{TempPostgres, database_url, shared_server};

/// A hook that parks the first operation reaching `stage` until [`Pause::resume`] (or forever),
/// so a test can cancel the operation exactly there.
///
/// Give the hook to a manager by building it inside [`hooks::build_with`](pglock::hooks::build_with):
///
/// ```
/// use pglock::InMemoryLockManager;
/// use pglock_testing::{Stage, pause_at};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let (hook, pause) = pause_at(Stage::Register);
/// let hooks = pglock::hooks::Hooks::new().stage(hook);
/// let manager = pglock::hooks::build_with(hooks, || InMemoryLockManager::builder().build());
/// let acquire = manager.acquire("k", None);
/// tokio::select! {
///     _ = acquire => unreachable!("parked before it could register"),
///     _ = pause.reached() => {} // granted, not yet registered: the future is dropped here
/// }
/// assert_eq!(manager.held_lock_count(), 0);
/// // The cancelled acquisition left nothing behind.
/// assert!(matches!(manager.try_acquire("k").await.unwrap(), pglock::Attempt::Acquired(_)));
/// # }
/// ```
pub fn pause_at(stage: Stage) -> (StageHook, Pause) {
    let pause = Pause {
        inner: Arc::new(PauseInner {
            stage,
            armed: AtomicBool::new(true),
            reached: Notify::new(),
            resumed: Semaphore::new(0),
        }),
    };
    let inner = Arc::clone(&pause.inner);
    let hook: StageHook = Arc::new(move |stage, _key| {
        let inner = Arc::clone(&inner);
        Box::pin(async move {
            if stage == inner.stage && inner.armed.swap(false, Ordering::SeqCst) {
                inner.reached.notify_one();
                // Parked until resumed; a dropped operation simply never returns from here.
                let _ = inner.resumed.acquire().await.map(|permit| permit.forget());
            }
        })
    });
    (hook, pause)
}

/// The test's side of [`pause_at`].
#[derive(Debug, Clone)]
pub struct Pause {
    inner: Arc<PauseInner>,
}

#[derive(Debug)]
struct PauseInner {
    stage: Stage,
    armed: AtomicBool,
    reached: Notify,
    resumed: Semaphore,
}

impl Pause {
    /// How long [`Pause::reached`] waits for an operation to park before it panics.
    pub const BOUND: Duration = Duration::from_secs(30);

    /// Completes once an operation is parked at the stage.
    ///
    /// # Panics
    ///
    /// When no operation reaches the stage within [`Pause::BOUND`]: a test whose operation
    /// never gets there (it failed early, or waits elsewhere) fails instead of hanging.
    pub async fn reached(&self) {
        let reached = self.inner.reached.notified();
        if tokio::time::timeout(Self::BOUND, reached).await.is_err() {
            panic!(
                "no operation reached the stage {:?} within {:?}",
                self.inner.stage,
                Self::BOUND
            );
        }
    }

    /// Lets the parked operation continue.
    pub fn resume(&self) {
        self.inner.resumed.add_permits(1);
    }

    /// Parks the next operation that reaches the stage too.
    pub fn rearm(&self) {
        self.inner.armed.store(true, Ordering::SeqCst);
    }
}
