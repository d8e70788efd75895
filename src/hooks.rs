//! Seams for cancellation tests: the await points of lock operations, named, so a test can stop
//! an operation at one of them and cancel it exactly there.
//!
//! A manager has hooks only when it is built inside [`build_with`]; every other manager has
//! none, and its operations pass each await point at the cost of one branch. The
//! `pglock-testing` crate builds on this: its `pause_at` parks the first operation that reaches
//! a stage until the test resumes or drops it.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use pglock::hooks::{self, Hooks, Stage};
//! use pglock::InMemoryLockManager;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
//! let servers_asked = Arc::new(AtomicUsize::new(0));
//! let counted = Arc::clone(&servers_asked);
//! let hooks = Hooks::new().stage(Arc::new(move |stage, _key| {
//!     if stage == Stage::Server {
//!         counted.fetch_add(1, Ordering::SeqCst);
//!     }
//!     Box::pin(async {})
//! }));
//! let locks = hooks::build_with(hooks, || InMemoryLockManager::builder().build());
//! locks.acquire("k", None).await?.release().await?;
//! assert_eq!(servers_asked.load(Ordering::SeqCst), 1);
//! # Ok(()) }
//! ```

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// The await points of lock operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stage {
    /// Before waiting for the manager's own turn on the key.
    Turn,
    /// Before asking the server for the lock (a lock session, or a wait of its own).
    Server,
    /// After the server granted the lock, before the registry records it.
    Register,
    /// After the registry forgot the lock, before the unlock is sent.
    Unlock,
}

/// A hook awaited at every [`Stage`] with the key's display form; it may park the operation
/// there.
pub type StageHook =
    Arc<dyn Fn(Stage, &str) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static>;

/// The hooks a manager built inside [`build_with`] gets.
#[derive(Clone, Default)]
#[must_use = "hooks do nothing until a manager is built with them"]
pub struct Hooks {
    pub(crate) stage: Option<StageHook>,
    pub(crate) defer_guard_drops: bool,
}

impl Hooks {
    /// No hooks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Awaits `hook` at every await point of the manager's lock operations.
    pub fn stage(mut self, hook: StageHook) -> Self {
        self.stage = Some(hook);
        self
    }

    /// Makes every dropped guard release through the path a drop takes when the registry is
    /// busy at that moment (a task of its own), which is otherwise rare enough to go untested.
    pub fn defer_guard_drops(mut self) -> Self {
        self.defer_guard_drops = true;
        self
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("stage", &self.stage.is_some())
            .field("defer_guard_drops", &self.defer_guard_drops)
            .finish()
    }
}

thread_local! {
    static BUILDING_WITH: RefCell<Option<Hooks>> = const { RefCell::new(None) };
}

/// Calls `build` (which builds a manager: `|| InMemoryLockManager::builder().build()`) so
/// that every manager it builds gets `hooks`.
pub fn build_with<T>(hooks: Hooks, build: impl FnOnce() -> T) -> T {
    struct Restore(Option<Hooks>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BUILDING_WITH.with(|slot| *slot.borrow_mut() = self.0.take());
        }
    }
    let outer = BUILDING_WITH.with(|slot| slot.borrow_mut().replace(hooks));
    let _restore = Restore(outer);
    build()
}

/// The hooks of the manager being built now: none outside [`build_with`].
pub(crate) fn current() -> Hooks {
    BUILDING_WITH.with(|slot| slot.borrow().clone().unwrap_or_default())
}
