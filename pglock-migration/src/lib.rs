//! Tenant live migration: move one tenant's events from a source event store to a target store
//! with no downtime, and switch it over exactly once, correctly, across processes.
//!
//! Built on [`pglock`]'s public API: any [`LockManager`](pglock::LockManager) takes the
//! cutover lock and the write gate. This mirrors the Python original's `MigrationCoordinator`
//! and `CutoverManager`, and fixes what the lock alone did not make correct there: state is
//! re-validated under the lock, completion and rollback are written before the lock is
//! released, the write pause holds across processes, and routing switches are fenced.
//!
//! ```toml
//! [dependencies]
//! pglock = "0.3"
//! pglock-migration = "0.3"
//! ```
//!
//! # At a glance
//!
//! | item | what it is |
//! | --- | --- |
//! | [`MigrationCoordinator`] | Start, status, pause/resume/abort, bulk copy to dual writes, trigger the cutover. |
//! | [`CutoverManager`] | The cutover itself, under `migration_lock_key(tenant, "cutover")`, and its readiness check. |
//! | [`CutoverResult`] = `Result<`[`Cutover`]`, `[`CutoverError`]`>`, [`CutoverFailure`] | What a cutover did, or why it did not. |
//! | [`Readiness`], [`NotReady`] | Whether a migration could be cut over now, and if not, why. |
//! | [`WriteGate`] | What writers take (shared) so that the cutover's write pause holds across processes. |
//! | [`MigrationStore`] (+ [`MigrationRepository`], [`RoutingRepository`], [`AuditLog`]) | The repositories: migrations, tenant routing, audit log. |
//! | [`PostgresMigrationStore`], [`InMemoryMigrationStore`] | The repositories on PostgreSQL, and in memory for unit tests. |
//! | [`EventCopier`], [`SyncLag`], [`StoreRegistry`] | What the application plugs in. |
//! | [`Error`], [`Result`] | The crate's error, wrapping [`pglock::Error`]; [`Error::is_refused`] tells a refused change (nothing written) from a failure. |
//! | [`telemetry`] | Span and field names. |
//!
//! # The life of a migration
//!
//! | phase | routing | writes go to | who moves it on |
//! | --- | --- | --- | --- |
//! | `pending` | `normal` | source | [`run_bulk_copy`](MigrationCoordinator::run_bulk_copy) |
//! | `bulk_copy` | `bulk_copy` | source; existing events are copied | `run_bulk_copy`, under the write gate for the last batch |
//! | `dual_write` | `dual_write` | source and target | [`trigger_cutover`](MigrationCoordinator::trigger_cutover) |
//! | `cutover` | `cutover_paused` | nowhere: the write gate is closed | the cutover, before it releases its lock |
//! | `completed` | `migrated` | target | (terminal) |
//! | `aborted`, `failed` | `normal` | source | (terminal) |
//!
//! A cutover that cannot finish (an error, a cancelled future, a lost lock) puts the
//! migration back into `dual_write` with the tenant on its source; a crashed one is repaired by
//! the next cutover of the tenant. See [`CutoverManager`] for the sequence and the argument.
//!
//! # Writers
//!
//! A write of a migrating tenant must enter the tenant's [`WriteGate`], then read the routing,
//! then write to every store of [`TenantRouting::write_stores`], then commit. The gate is what
//! makes "writes are paused during the cutover" true for every process, and what drains the
//! writes already under way before routing switches.
//!
//! # Unit tests without PostgreSQL
//!
//! [`InMemoryMigrationStore`] and [`InMemoryLockManager`](pglock::InMemoryLockManager) run the
//! whole workflow in memory, with the same rules; see the example on [`MigrationCoordinator`].
//!
//! # Design notes
//!
//! * **The write pause is a lock, not a flag.** The original paused writes with a flag in the
//!   cutover's own process. Here writers hold the tenant's gate in shared mode for each write
//!   transaction and the cutover takes it exclusively, so PostgreSQL's lock queue drains the
//!   writes in flight and holds back new ones in every process, and a crashed cutover cannot
//!   leave writes paused: its session, and with it the gate, dies with it.
//! * **Decide under the lock, write before releasing it.** The cutover reads the migration and
//!   the routing only once it holds the cutover lock, and writes its completion or rollback
//!   before it lets go. The coordinator writes nothing about a cutover outside the lock, so a
//!   cutover that could not take the lock leaves no trace (the original moved the phase to
//!   `cutover` and back and counted an error).
//! * **Every change is compare-and-set, and a cutover attempt has an id.** Entering `cutover`
//!   stamps the attempt's id on the migration; completion and rollback require it. An attempt
//!   that lost the race, or its lock, can neither finish nor undo another attempt's cutover.
//! * **Nothing is left in `cutover`.** From just before it enters `cutover`, an attempt's lock
//!   and gate belong to a rollback guard that rolls back unless disarmed; a dropped cutover's
//!   guard rolls back on a spawned task that keeps the lock and the gate until the rollback is
//!   written. A crashed one is rolled back by the next cutover of the tenant, which finds it
//!   under the lock.
//! * **One statement of each rule.** What a change does to the migration, routing and audit
//!   rows (compare-and-set, fencing, phase timestamps, audit records) is written once, as pure
//!   functions over the model; the PostgreSQL and in-memory stores only store their results.
//! * **Fencing.** The routing row keeps the newest fencing token that wrote it (`fence`) and
//!   refuses older ones; a token equal to the fence is the same acquisition writing again.
//! * **Every event is copied or dual-written, never both, never neither.** The bulk copy's last
//!   batches and the switch to dual writes happen under the write gate.

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

mod coordinator;
mod cutover;
mod error;
mod gate;
mod keys;
mod memory;
mod model;
mod plugins;
mod postgres;
mod rules;
mod store;
pub mod telemetry;

pub use coordinator::{
    DEFAULT_SOURCE_STORE_ID, MigrationCoordinator, MigrationCoordinatorBuilder, MigrationStatus,
};
pub use cutover::{
    Cutover, CutoverError, CutoverFailure, CutoverManager, CutoverManagerBuilder, CutoverOptions,
    CutoverResult, DEFAULT_LOCK_TIMEOUT, NotReady, Readiness,
};
pub use error::{Error, Result};
pub use gate::WriteGate;
pub use keys::{CUTOVER_OPERATION, MIGRATION_OPERATION, WRITE_GATE_OPERATION, migration_key};
pub use memory::InMemoryMigrationStore;
pub use model::{
    AuditEntry, AuditEvent, Migration, MigrationConfig, MigrationPhase, NewMigration, RoutingState,
    TenantRouting, UnknownName,
};
pub use plugins::{BoxError, CopyBatch, CopyRequest, EventCopier, StoreRegistry, SyncLag};
pub use postgres::PostgresMigrationStore;
pub use store::{
    AuditLog, MigrationRepository, MigrationStore, RoutingChange, RoutingRepository, Transition,
};

// The guide's page on this crate: its snippet (the three traits implemented, a migration run
// to its cutover) is compiled and run as a doc test here, where the crate is in scope.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide/migration.md")]
struct GuideMigrationDoctests;
