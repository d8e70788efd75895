//! Distributed locks for Rust services, built on PostgreSQL advisory locks.
//!
//! Some operations must run exactly once across a fleet of replicas: a tenant cutover, a schema
//! migration, a projection rebuild, a singleton job. `pglock` lets every replica ask PostgreSQL
//! "may I do this right now?" and get an answer that the whole fleet agrees on.
//!
//! # At a glance
//!
//! | item | what it is |
//! | --- | --- |
//! | [`LockManager`] | The port: the contract every lock manager fulfils, for implementors; services hold an `Arc<dyn LockManager>`. |
//! | [`LockManagerExt`] | The caller's API on every manager, for any kind of key: wait ([`acquire`](LockManagerExt::acquire)), try ([`try_acquire`](LockManagerExt::try_acquire)), run a closure under the lock ([`with_lock`](LockManagerExt::with_lock), [`try_with_lock`](LockManagerExt::try_with_lock)), for one key or several ([`acquire_all`](LockManagerExt::acquire_all) and kin), in either mode; [`release`](LockManagerExt::release), [`is_held`](LockManagerExt::is_held). |
//! | [`PostgresLockManager`] | Session advisory locks on a few long-lived connections of your [`sqlx::PgPool`], each carrying any number of locks, within a budget. It has the whole caller API inherently: no import needed. |
//! | [`InMemoryLockManager`] | The same contract inside one process, for your unit tests. |
//! | [`LockHandle`] | The one shape of everything an acquisition hands back: [`LockGuard`] (one lock), [`LockSet`] (several, all or nothing) and [`Permit`](semaphore::Permit) (a semaphore's slot): `info`, `loss_signal`, `run`, `release`, `leak`, and a drop that releases in the background. |
//! | [`Attempt`] | What every try that can hand back a lock answers: the handle, or `Busy`; never an `Option`, whose `.is_some()` would drop the lock at once. |
//! | [`LockKey`], [`lock_id`] | Keys: names (the frozen derivation, bit for bit the Python original's), raw ids, id pairs, sqlx's names. |
//! | [`LockInfo`], [`LockMode`] | What was acquired: key, lock id, time, holder id, fencing token, mode. |
//! | [`HeldLock`] | A lock a manager holds right now, with how long it has held it: what [`held_locks`](LockManager::held_locks) lists. |
//! | [`LossSignal`], [`LossCause`] | How a holder learns that its lock went, and why. |
//! | [`Error`], [`Result`] | Lock failures, and only those; each recipe below has an error of its own that wraps it. |
//! | [`TransactionLock`] | An advisory lock inside your own sqlx transaction, released when it ends; the one that works through PgBouncer in transaction pooling mode. |
//! | [`FencingTable`], [`fence`] | Fencing tokens minted with each acquisition, and the resource side for rows of your own tables ([`RowFence`]). |
//! | [`leader`] | [`LeaderElection`]: a campaign, leadership as a `watch`, leader work cancelled when the lock goes. |
//! | [`schedule`] | [`ScheduledJob`]: a job run at most once per time window across every process, with its record in PostgreSQL. |
//! | [`semaphore`] | [`Semaphore`]: at most N holders of a name at once, in arrival order. |
//! | [`inspect`] | Who holds and who waits for each advisory lock, read from `pg_locks` and `pg_stat_activity`. |
//! | [`telemetry`] | Span, field and metric names. |
//!
//! # One shape for every primitive
//!
//! A lock, a shared lock, a lock set, a semaphore permit, a transaction lock, leadership and a
//! scheduled run each take, try, scope, release and fail the same way: the same
//! `Option<Duration>` deadline (`None` waits as long as it takes, `Some(Duration::ZERO)` makes
//! one attempt), an [`Attempt`] from every try that can hand back a lock, a [`LockHandle`] for
//! what is held, and `# Cancel safety` on every async method. The table of every primitive by
//! verb, with what is absent on purpose and why, is the guide's
//! [primitives page](https://github.com/pglock-rs/pglock/blob/main/docs/guide/primitives.md).
//!
//! # Example
//!
//! Build one manager per process and share it; `with_lock` waits for the lock, runs the body
//! while it is held, and releases it on every path, cancelling the body if the lock goes.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use pglock::{LockManager, LockManagerExt, PostgresLockManager};
//!
//! # async fn run() -> pglock::Result<()> {
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await.expect("connect");
//! // Shared as the port; `LockManagerExt` gives it the caller's API.
//! let locks: Arc<dyn LockManager> = Arc::new(PostgresLockManager::new(pool));
//!
//! // Wait at most two seconds, in PostgreSQL's queue, for the lock.
//! locks
//!     .with_lock("rebuild:orders", Some(Duration::from_secs(2)), |info| async move {
//!         println!("lock {} held since {}", info.lock_id, info.acquired_at);
//!     })
//!     .await?;
//!
//! // Skip the work when another replica is doing it right now. (For a job on a timer, use
//! // `schedule::ScheduledJob`: a short run ends before a late replica tries, and runs twice.)
//! let ran = locks.try_with_lock("rebuild:search-index", |_| async { /* ... */ }).await?;
//! println!("ran here: {}", ran.is_some());
//! # Ok(()) }
//! ```
//!
//! Where the critical section does not fit a closure, [`acquire`](LockManagerExt::acquire)
//! and [`try_acquire`](LockManagerExt::try_acquire) hand out a [`LockGuard`].
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `metrics` | no | OpenTelemetry metrics of the managers, leader elections, scheduled jobs and semaphores (see [`telemetry::metrics`]); every builder gains `meter`, `metrics` and `metrics_holder_id`. |
//! | `test-hooks` | no | `pglock::hooks`: seams for cancellation tests, naming a lock operation's await points. `pglock-testing` turns it on; not for production code. |
//!
//! # The crates beside this one
//!
//! | crate | what it is |
//! | --- | --- |
//! | `pglock-testing` | The conformance suite any [`LockManager`] runs, a throwaway PostgreSQL (with standbys and crashes) and PgBouncer for tests, and pauses at a lock operation's await points. Add it to your dev-dependencies. |
//! | `pglock-cli` | The `pglock` command: `id` (a key's lock id), `holders` (an [`inspect`] report, filtered, watched, with an exit status that says held or free), `run` (a command under a lock, like `flock`) and `terminate` (end a stuck holder). |
//! | `pglock-migration` | Tenant live migration, the locks' main customer. |
//!
//! # Guarantees, briefly
//!
//! Each is stated in full on the item it belongs to:
//!
//! * [The contract](LockManager#the-contract) of every manager: callers of one manager take
//!   turns (only nesting fails, [`Error::Reentrant`]), the caller's deadline is the only bound,
//!   a holder is told whenever its lock goes, and every future is cancel safe.
//! * [`PostgresLockManager`]: mutual exclusion between every holder on one database, Python
//!   services using the same [`lock_id`] included; a bounded share of the pool and of the
//!   server's lock table; lost locks detected within about one probe interval.
//! * [`FencingTable`] and [`RowFence`]: tokens that let a resource refuse a superseded holder.
//!
//! Beyond this reference: [the guide](https://github.com/pglock-rs/pglock/blob/main/docs/guide/README.md), a page per task;
//! [defaults and limits](https://github.com/pglock-rs/pglock/blob/main/docs/defaults.md), in one table;
//! [guarantees](https://github.com/pglock-rs/pglock/blob/main/docs/guarantees.md), each with the test that defends it; the
//! [failure model](https://github.com/pglock-rs/pglock/blob/main/docs/failure-model.md) and the [design](https://github.com/pglock-rs/pglock/blob/main/docs/design.md).
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Every snippet, here and in the README and guide pages compiled below, builds under
// `-D warnings`, as a user's code copied from them would (their example functions are never
// called, hence `dead_code`).
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod attempt;
mod core;
#[cfg(test)]
mod defaults_table;
mod error;
mod exit;
mod ext;
pub mod fence;
mod guard;
mod handle;
#[cfg(feature = "test-hooks")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-hooks")))]
pub mod hooks;
// Without the feature the engine still names its stages; nothing can install a hook.
#[cfg(not(feature = "test-hooks"))]
#[allow(unreachable_pub, dead_code)]
mod hooks;
mod identity;
mod info;
pub mod inspect;
mod key;
pub mod leader;
mod lock_set;
mod loss;
mod manager;
mod managers;
mod memory;
mod postgres;
#[cfg(test)]
mod primitives_table;
pub mod schedule;
mod scope;
pub mod semaphore;
mod sql;
mod sync;
pub mod telemetry;
mod verbs;
mod wait;
mod xact;

pub use crate::attempt::Attempt;
pub use crate::error::{Error, InvalidIdentifier, ReleaseFailure, Result};
pub use crate::exit::GuardBackend;
pub use crate::ext::LockManagerExt;
pub use crate::fence::RowFence;
pub use crate::guard::LockGuard;
pub use crate::handle::LockHandle;
pub use crate::info::{HeldLock, LockInfo, LockMode};
pub use crate::key::{LockKey, LockTarget, lock_id, migration_lock_key, split_lock_id};
pub use crate::leader::{LeaderElection, Leadership};
pub use crate::lock_set::LockSet;
pub use crate::loss::{LossCause, LossSignal};
pub use crate::manager::LockManager;
pub use crate::memory::{InMemoryLockManager, InMemoryLockManagerBuilder, InMemoryLockServer};
pub use crate::postgres::{
    FencingTable, PostgresLockManager, PostgresLockManagerBuilder, ServerCheck,
};
pub use crate::schedule::ScheduledJob;
pub use crate::semaphore::Semaphore;
pub use crate::wait::{AcquireOptions, Wait};
pub use crate::xact::TransactionLock;

/// The traits and types most code needs: `use pglock::prelude::*;`.
pub mod prelude {
    pub use crate::{
        Attempt, LockGuard, LockHandle, LockInfo, LockKey, LockManager, LockManagerExt, LockSet,
        LossCause,
    };
}

// The Rust snippets of the README and the guide are compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/README.md")]
struct GuideIndexDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/getting-started.md")]
struct GuideGettingStartedDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/critical-sections.md")]
struct GuideCriticalSectionsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/primitives.md")]
struct GuidePrimitivesDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/lock-budget.md")]
struct GuideLockBudgetDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/transaction-locks.md")]
struct GuideTransactionLocksDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/lost-locks.md")]
struct GuideLostLocksDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/fencing.md")]
struct GuideFencingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/leader-election.md")]
struct GuideLeaderElectionDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/scheduled-jobs.md")]
struct GuideScheduledJobsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/semaphores.md")]
struct GuideSemaphoresDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/operating.md")]
struct GuideOperatingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/servers.md")]
struct GuideServersDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/errors.md")]
struct GuideErrorsDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/testing.md")]
struct GuideTestingDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide/interop.md")]
struct GuideInteropDoctests;
