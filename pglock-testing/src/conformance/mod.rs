//! The [`LockManager`] contract as executable cases.
//!
//! Each case is an async function that takes a *fresh* manager and panics if the manager breaks
//! the contract. Run them all with [`run_all`], or get one `#[tokio::test]` per case with
//! [`conformance_tests!`](crate::conformance_tests):
//!
//! ```
//! // tests/locks.rs of your crate (needs tokio with the `macros` and `rt` features)
//! pglock_testing::conformance_tests!(|| async { pglock::InMemoryLockManager::new() });
//! ```
//!
//! Cases use random keys, so they can run in parallel against one shared database. They check
//! what the trait promises for one holder; exclusion between holders is the business of the
//! cases [across managers](#across-managers). Neither checks crash release or fairness, which
//! are properties of an implementation.
//!
//! The first nine cases (`python.rs`) are those of the Python original's conformance suite;
//! the rest pin the properties pglock adds, one file per theme (`guards.rs`, `turns.rs`,
//! `kinds.rs`, `listing.rs`, `semaphores.rs`, `sets.rs`): guards that release only their own acquisition
//! and are told when their lock is taken away, cancellation, deadlines, callers of one manager
//! taking turns (sibling futures of one task included), nested critical sections refused at
//! once, the listing of held locks with their ages, several keys taken at once, and
//! [`Semaphore`](pglock::semaphore::Semaphore)s built on the manager.
//!
//! # Across managers
//!
//! A manager passes every case above even if its locks keep out nobody but its own callers:
//! one manager, however many tasks use it, is one holder. The cases across managers
//! (`across.rs`, listed by [`peer_cases`]) take [`Peers`]: two or more managers on one
//! backend, each a holder of its own, standing for the replicas of a service. They check that
//! an exclusive lock of one keeps the other out (its try is busy, its bounded acquisition
//! times out), that shared and exclusive exclude each other both ways while sharers of
//! different managers coexist, that a waiter of one manager is granted promptly (within two
//! seconds) once the other lets go by a release, a dropped guard or `release_all`, and never
//! before, and that keys held as a set (`acquire_all`, `with_locks`) each keep the other out.
//!
//! Give [`conformance_peer_tests!`](crate::conformance_peer_tests) a factory of peers on a
//! backend of their own (or on a shared one: the keys are random), such as two managers of
//! yours built on separate connection pools of one database:
//!
//! ```
//! # #![allow(unused_imports)] // the generated tests build only under `cfg(test)`
//! mod peers {
//!     use pglock::{InMemoryLockManager, InMemoryLockServer};
//!     use pglock_testing::conformance::Peers;
//!
//!     pglock_testing::conformance_peer_tests!(|| async {
//!         let server = InMemoryLockServer::new();
//!         Peers::new(["a", "b"].map(|id| {
//!             InMemoryLockManager::builder().server(&server).holder_id(id).build()
//!         }))
//!     });
//! }
//! ```
//!
//! One more case ([`take_away_cases`]) checks what the others see when a lock is lost: the
//! holder is told and forgets it, the other manager's waiter gets it, and the first manager
//! does not go on excluding the new holder. It needs a way to take a lock away from a manager
//! behind its back, which only the backend knows: give the peers a hook with
//! [`Peers::take_away_with`] (for PostgreSQL advisory locks, [`terminate_holders`] ends the
//! holding session) and add `, take_away` to the macro's arguments.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use pglock::{LockManager, LockManagerExt, LockMode};

mod across;
mod guards;
mod kinds;
mod listing;
mod peers;
mod python;
mod semaphores;
mod sets;
mod turns;

pub use across::*;
pub use guards::*;
pub use kinds::*;
pub use listing::*;
pub use peers::*;
pub use python::*;
pub use semaphores::*;
pub use sets::*;
pub use turns::*;

/// A boxed case future.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The manager a case runs against. Shared, because some cases act as two tasks of one
/// process.
pub type Manager = Arc<dyn LockManager>;

/// One conformance case: its name and its body.
#[derive(Clone, Copy)]
pub struct Case {
    /// The case's function name in this module.
    pub name: &'static str,
    /// Runs the case against a fresh manager.
    pub run: for<'a> fn(&'a Manager) -> CaseFuture<'a>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case").field("name", &self.name).finish()
    }
}

/// Makes [`cases`] from the list in `__conformance_case_names!`, the list
/// `conformance_tests!` is made from too.
macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        /// Every case, in order.
        pub fn cases() -> Vec<Case> {
            vec![$(Case { name: stringify!($name), run: |manager| Box::pin($name(manager)) }),*]
        }
    };
}

crate::__conformance_case_names!([cases]);

/// The conformance cases, by name, in order: the one list both `conformance::cases` and
/// [`conformance_tests!`](crate::conformance_tests) are made from. Expands to
/// `callback!(args... name, name, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_case_names {
    ([$($callback:tt)*] $($args:tt)*) => {
        $($callback)*!(
            $($args)*
            acquire_yields_info_for_the_requested_key,
            is_held_inside_and_outside_the_critical_section,
            error_in_the_critical_section_propagates_and_releases,
            try_acquire_succeeds_on_a_free_key_and_fails_on_a_held_one,
            release_makes_the_key_acquirable_again,
            release_of_a_never_held_key_is_not_held,
            acquire_with_timeout_on_a_held_key_times_out,
            different_keys_are_independent,
            release_all_returns_the_count_and_empties_the_registry,
            dropping_the_guard_releases,
            release_all_invalidates_guards,
            release_by_key_invalidates_the_guard,
            a_holder_is_told_when_its_lock_is_taken_away,
            cancelled_operations_leak_nothing,
            deadline_is_honoured,
            reacquiring_an_own_key_waits_for_the_local_holder,
            sibling_futures_of_one_task_take_turns,
            a_nested_acquisition_fails_at_once,
            a_bare_guard_queues_its_own_second_acquisition,
            shared_acquisition_is_reported_and_released,
            a_manager_holds_a_key_once_in_either_mode,
            try_acquire_hands_out_a_guard,
            a_ported_try_keeps_its_lock_until_its_key_is_released,
            keys_of_every_kind_are_locks_of_their_own,
            conveniences_release_on_every_path,
            the_listing_has_exactly_the_held_keys,
            held_for_grows_with_the_hold,
            released_keys_leave_the_listing,
            a_dropped_or_handed_over_key_is_a_new_acquisition,
            a_semaphore_hands_out_at_most_its_permits,
            a_semaphore_waiter_takes_the_next_permit_given_back,
            a_semaphore_acquire_gives_up_at_its_deadline,
            a_cancelled_semaphore_acquire_leaks_nothing,
            a_permit_is_told_when_its_slot_is_taken_away,
            several_keys_are_taken_all_or_nothing,
            overlapping_sets_in_opposite_orders_do_not_deadlock,
            a_cancelled_set_acquisition_leaks_nothing,
            a_set_is_told_when_any_of_its_locks_goes,
            with_locks_runs_under_every_key,
            a_set_release_reports_a_lock_it_could_not_release,
        );
    };
}

/// Generates one `#[tokio::test]` per conformance case for the manager that `$factory` builds.
///
/// `$factory` is an expression callable with no arguments that returns a future of the
/// manager, such as `|| async { MyManager::new() }`; it is called once per case. The calling
/// crate needs `tokio` with the `macros` and `rt` features. Put the invocation in a module of
/// its own so the generated test names do not collide:
///
/// ```
/// mod in_memory {
///     pglock_testing::conformance_tests!(|| async { pglock::InMemoryLockManager::new() });
/// }
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($factory:expr) => {
        $crate::__conformance_case_names!([$crate::__conformance_tests] $factory;);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $name() {
                let manager: $crate::conformance::Manager =
                    ::std::sync::Arc::new(($factory)().await);
                $crate::conformance::$name(&manager).await;
            }
        )*
    };
}

/// Runs every case, each against a fresh manager from `factory`, and panics on the first
/// failure with the case's name.
pub async fn run_all<F, Fut, M>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = M>,
    M: LockManager + 'static,
{
    for case in cases() {
        let manager: Manager = Arc::new(factory().await);
        eprintln!("conformance: {}", case.name);
        (case.run)(&manager).await;
    }
}

/// Runs `op` on another task, as a second caller of the same manager would.
pub(crate) async fn elsewhere<T, F, Fut>(manager: &Manager, op: F) -> T
where
    F: FnOnce(Manager) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(op(Arc::clone(manager)))
        .await
        .expect("the other task panicked")
}

/// `acquire(key, timeout)` from another task.
pub(crate) async fn acquire_elsewhere(
    manager: &Manager,
    key: &str,
    mode: LockMode,
    timeout: Option<Duration>,
) -> pglock::Result<pglock::LockGuard> {
    let key = key.to_owned();
    elsewhere(manager, move |m| async move {
        match mode {
            LockMode::Shared => m.acquire_shared(key, timeout).await,
            _ => m.acquire(key, timeout).await,
        }
    })
    .await
}

/// A key no other test run uses.
pub(crate) fn key(case: &str) -> String {
    format!("pglock-conformance:{case}:{}", uuid::Uuid::new_v4())
}

/// Generous bound for "eventually": a case waiting this long has failed.
pub(crate) const EVENTUALLY: Duration = Duration::from_secs(10);

/// Takes `key` with `try_acquire` and leaves it in the manager's registry, the Python
/// original's way, for cases that release it by key.
pub(crate) async fn hold(manager: &Manager, key: &str) {
    manager
        .try_acquire(key)
        .await
        .expect("try_acquire")
        .leak()
        .expect("a free key is granted");
}

/// `future`'s output, which must come at once: a nested acquisition that waits (for itself)
/// fails the case instead of hanging it.
pub(crate) async fn at_once<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(EVENTUALLY, future)
        .await
        .expect("answered at once, not left waiting for itself")
}

/// Polls every future in one task (as `join!` does for a list) until all are done.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|output| output.expect("every future finished"))
        .collect()
}

/// A random number for keys that must not collide across test runs.
pub(crate) fn rand_u32() -> u32 {
    (uuid::Uuid::new_v4().as_u128() & u128::from(u32::MAX)) as u32
}

/// Polls a future once (so it passes its first await point), then hands it back.
pub(crate) async fn futures_poll_once<F: Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
