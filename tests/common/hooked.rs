//! Managers built with test hooks (`pglock::hooks`): operations counted or parked at their
//! await points, or dropped guards forced onto their deferred path.

use pglock::hooks::{Hooks, StageHook, build_with};
use pglock::{InMemoryLockManager, InMemoryLockManagerBuilder};
use pglock::{PostgresLockManager, PostgresLockManagerBuilder};

/// Builds a manager with hooks.
pub trait BuildHooked {
    /// The manager built.
    type Manager;

    /// Builds the manager with `hooks`.
    fn build_hooked(self, hooks: Hooks) -> Self::Manager;

    /// Builds the manager with `hook` awaited at every await point.
    fn build_with_stage_hook(self, hook: StageHook) -> Self::Manager
    where
        Self: Sized,
    {
        self.build_hooked(Hooks::new().stage(hook))
    }

    /// Builds the manager with every dropped guard released on the deferred path.
    fn build_deferring_drops(self) -> Self::Manager
    where
        Self: Sized,
    {
        self.build_hooked(Hooks::new().defer_guard_drops())
    }
}

impl BuildHooked for InMemoryLockManagerBuilder {
    type Manager = InMemoryLockManager;

    fn build_hooked(self, hooks: Hooks) -> InMemoryLockManager {
        build_with(hooks, || self.build())
    }
}

impl BuildHooked for PostgresLockManagerBuilder {
    type Manager = PostgresLockManager;

    fn build_hooked(self, hooks: Hooks) -> PostgresLockManager {
        build_with(hooks, || self.build())
    }
}
