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
//! | [`LockManager`] | The port: the contract every lock manager fulfils, usable generically or as `Arc<dyn LockManager>`. |
//! | [`PostgresLockManager`] | Session advisory locks on a few long-lived connections of your [`sqlx::PgPool`], each carrying any number of locks. |
//! | [`TransactionLock`] | An advisory lock inside your own sqlx transaction, released when it commits or rolls back; the one that works through PgBouncer in transaction pooling mode. |
//! | [`InMemoryLockManager`] | The same contract inside one process, for your unit tests. |
//! | [`LockManagerExt`] | Conveniences for every manager: [`with_lock`](LockManagerExt::with_lock), [`with_lock_shared`](LockManagerExt::with_lock_shared), [`try_with_lock`](LockManagerExt::try_with_lock), and guards for any key from [`lock`](LockManagerExt::lock) and [`try_lock`](LockManagerExt::try_lock). |
//! | [`LockGuard`] | Proof that a lock is held; release it with [`LockGuard::release`], or drop it; [`LockGuard::lost`] says when it is gone. |
//! | [`LockInfo`], [`LockMode`] | What was acquired: key, lock id, time, holder id, fencing token, mode. |
//! | [`LossSignal`], [`LossCause`] | How a holder learns that its lock was lost, and why. |
//! | [`FencingTable`] | Where [`PostgresLockManager`] keeps fencing tokens. |
//! | [`RowFence`] | The resource side of fencing for rows of your own tables: raise the fence before the read, write only while it holds. |
//! | [`LeaderElection`] | Leader election on any [`LockManager`]: a campaign, leadership as a `watch`, leader work cancelled when the lock is lost, graceful `resign`. |
//! | [`lock_id`], [`migration_lock_key`] | The frozen key-to-lock-id derivation, shared bit for bit with the Python original. |
//! | [`Error`], [`Result`] | The one error type of the crate. |
//! | [`telemetry`] | Span, field and metric names. |
//! | [`inspect`] | Who holds and who waits for each advisory lock, read from `pg_locks` and `pg_stat_activity`. |
//! | [`schedule`], [`ScheduledJob`] | Run a job at most once per time window across every process (ShedLock's `lockAtLeastFor` / `lockAtMostFor`), with its record in PostgreSQL. |
//! | `testing` (feature) | The conformance suite for any [`LockManager`] and a throwaway PostgreSQL server for tests. |
//!
//! # Example
//!
//! Build one manager per process and share it; `with_lock` waits for the lock, runs the body
//! while it is held, and releases it on every path, cancelling the body if the lock is lost.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use pglock::{LockManager, LockManagerExt, PostgresLockManager};
//!
//! # async fn run() -> pglock::Result<()> {
//! let pool = sqlx::PgPool::connect("postgres://localhost/app").await.expect("connect");
//! let locks: Arc<dyn LockManager> = Arc::new(PostgresLockManager::new(pool));
//!
//! // Wait at most two seconds, in PostgreSQL's queue, for the lock.
//! locks
//!     .with_lock("rebuild:orders", Some(Duration::from_secs(2)), |info| async move {
//!         println!("lock {} held since {}", info.lock_id, info.acquired_at);
//!     })
//!     .await?;
//!
//! // One replica of many runs the job; the others skip it.
//! let ran = locks.try_with_lock("nightly-report", |_| async { /* ... */ }).await?;
//! println!("ran here: {}", ran.is_some());
//! # Ok(()) }
//! ```
//!
//! Where the critical section does not fit a closure, [`LockManagerExt::lock`] and
//! [`LockManagerExt::try_lock`] hand out a [`LockGuard`].
//!
//! # Feature flags
//!
//! | feature | default | enables |
//! | --- | --- | --- |
//! | `testing` | no | [`testing`]: the conformance suite and a throwaway PostgreSQL server for tests. |
//! | `metrics` | no | OpenTelemetry metrics (see [`telemetry::metrics`]); builders gain `meter` and `metrics_holder_id` methods. |
//! | `cli` | no | The `pglock` command: `id` (a key's lock id), `holders` (an [`inspect`] report, filtered, watched, with an exit status that says held or free), `run` (a command under a lock, like `flock`) and `terminate` (end a stuck holder). |
//!
//! # Guarantees, briefly
//!
//! * **Mutual exclusion** between every holder on one PostgreSQL database, for keys that derive
//!   the same [`lock_id`], including Python services using the same scheme.
//! * **Cancel safety**: dropping any lock-touching future at any await point leaves no advisory
//!   lock behind and never returns a connection that may hold one to the pool.
//! * **A guard releases only its own acquisition**: a guard whose lock was already released
//!   through [`LockManager::release`] or [`LockManager::release_all`] does nothing on release or
//!   drop.
//! * **Deadlines are deadlines**: one timeout covers pool checkout and the wait on the server,
//!   and the wait happens on the server, in its FIFO queue, without client-side polling.
//! * **Lost locks are reported**: a lock whose session ended is declared lost within about one
//!   probe interval, and its guard's [`lost`](LockGuard::lost) signal fires.
//! * **Fencing**: with a [`FencingTable`], every acquisition carries a token larger than any
//!   before it for its key, so resources can refuse writes from a superseded holder; for a
//!   read-modify-write the resource must be fenced before the read ([`RowFence`]).
//!
//! Tenant live migration, the locks' main customer, is the companion crate `pglock-migration`,
//! built on this crate's public API.
//!
//! The repository's `docs/guide.md` is the user's guide, `docs/design.md` explains the design,
//! and `docs/failure-model.md` what is detected and how fast.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    rust_2018_idioms
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod core;
mod error;
mod ext;
pub mod fence;
mod guard;
mod identity;
mod info;
pub mod inspect;
mod key;
pub mod leader;
mod loss;
mod manager;
mod memory;
mod metrics;
mod postgres;
pub mod schedule;
mod scope;
pub mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod xact;

pub use crate::error::{Error, InvalidIdentifier, ReleaseFailure, Result};
pub use crate::ext::LockManagerExt;
pub use crate::fence::RowFence;
pub use crate::guard::{GuardBackend, LockGuard};
pub use crate::info::{LockInfo, LockMode};
pub use crate::key::{
    CUTOVER_OPERATION, LockKey, LockTarget, MIGRATION_OPERATION, lock_id, migration_key,
    migration_lock_key, split_lock_id,
};
pub use crate::leader::{LeaderElection, Leadership};
pub use crate::loss::{LossCause, LossSignal};
pub use crate::manager::{AcquireOptions, LockManager, Wait};
pub use crate::memory::{InMemoryLockManager, InMemoryLockManagerBuilder, InMemoryLockServer};
pub use crate::postgres::{FencingTable, PostgresLockManager, PostgresLockManagerBuilder};
pub use crate::schedule::ScheduledJob;
pub use crate::xact::TransactionLock;

/// The traits and types most code needs: `use pglock::prelude::*;`.
pub mod prelude {
    pub use crate::{LockGuard, LockInfo, LockKey, LockManager, LockManagerExt, LossCause};
}

// The Rust snippets of the README and the guide are compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../docs/guide.md")]
struct GuideDoctests;
