//! The repositories: traits, and the changes they apply atomically.

use std::fmt;

use async_trait::async_trait;
use uuid::Uuid;

use crate::model::{
    AuditEntry, AuditEvent, Migration, MigrationPhase, NewMigration, RoutingState, TenantRouting,
};
use crate::{Error, Result};

/// The migrations table.
///
/// Reads, and the one write that touches nothing else: bulk-copy progress. Every phase change
/// goes through [`MigrationStore::apply_transition`], which writes the phase, the routing and
/// the audit log together.
#[async_trait]
pub trait MigrationRepository: Send + Sync + fmt::Debug {
    /// The migration `id`, if it exists.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store cannot be read.
    async fn get_migration(&self, id: Uuid) -> Result<Option<Migration>>;

    /// The tenant's migration in a non-terminal phase, if it has one.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store cannot be read.
    async fn active_migration_for_tenant(&self, tenant_id: Uuid) -> Result<Option<Migration>>;

    /// Every migration in a non-terminal phase, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store cannot be read.
    async fn list_active_migrations(&self) -> Result<Vec<Migration>>;

    /// Adds a copied batch to the migration's progress, if it is still in `bulk_copy`.
    ///
    /// `copied` is added to [`Migration::events_copied`]; `last_position` replaces
    /// [`Migration::last_source_position`]; `total`, when given, replaces
    /// [`Migration::events_total`].
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`], or [`Error::WrongPhase`] when the migration is not in
    /// `bulk_copy` (it is then not changed); [`Error::Storage`] when the store fails.
    async fn record_progress(
        &self,
        id: Uuid,
        copied: u64,
        last_position: Option<i64>,
        total: Option<u64>,
    ) -> Result<Migration>;
}

/// The routing table: which store serves each tenant.
#[async_trait]
pub trait RoutingRepository: Send + Sync + fmt::Debug {
    /// The tenant's routing, if it has a row.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store cannot be read.
    async fn get_routing(&self, tenant_id: Uuid) -> Result<Option<TenantRouting>>;

    /// Routes a tenant that has no row yet to `store_id` (state `normal`) and returns its
    /// routing; a tenant that has a row keeps it unchanged.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store fails.
    async fn ensure_routing(&self, tenant_id: Uuid, store_id: &str) -> Result<TenantRouting>;

    /// Applies `change` to the tenant's routing, compare-and-set on its state and fence.
    ///
    /// The row changes only if its state is `change.expected` and, when `change` carries a
    /// fencing token, the row's [`fence`](TenantRouting::fence) is not newer than the token;
    /// the fence then becomes the token. A token equal to the fence is accepted: it is the same
    /// lock acquisition writing again.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidRoutingTransition`] when `expected -> state` is not a routing
    ///   transition; nothing is read or written.
    /// * [`Error::RoutingNotFound`] when the tenant has no row.
    /// * [`Error::RoutingStateChanged`] when the state is not `expected`.
    /// * [`Error::FenceRejected`] when the row was written with a newer token.
    /// * [`Error::Storage`] when the store fails.
    async fn switch_routing(
        &self,
        tenant_id: Uuid,
        change: &RoutingChange,
    ) -> Result<TenantRouting>;
}

/// The audit log.
#[async_trait]
pub trait AuditLog: Send + Sync + fmt::Debug {
    /// The migration's entries, oldest first.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store cannot be read.
    async fn audit_log(&self, migration_id: Uuid) -> Result<Vec<AuditEntry>>;
}

/// Everything the coordinator and the cutover need, with the writes that must be atomic.
///
/// The crate ships [`PostgresMigrationStore`](crate::PostgresMigrationStore) and
/// [`InMemoryMigrationStore`](crate::InMemoryMigrationStore). An implementation must apply each
/// method below all-or-nothing: the migration row, the routing row and the audit entry change
/// together or not at all.
///
/// # Cancel safety
///
/// Every write of these traits must be cancel safe in the same sense: if its future is dropped,
/// the write has happened entirely or not at all (the PostgreSQL store runs each in one
/// transaction, which is rolled back if it does not commit). Callers that cannot tell which
/// (a dropped commit) re-read, or repeat the write as a compare-and-set that is refused when it
/// already happened.
#[async_trait]
pub trait MigrationStore: MigrationRepository + RoutingRepository + AuditLog {
    /// Creates a migration in `pending`, points the tenant's routing at it, and logs
    /// `migration_started`.
    ///
    /// A tenant without routing gets a row on `source_store_id`. A tenant with routing must be
    /// served by `source_store_id`, in state `normal` or `migrated` (a finished earlier
    /// migration); its state becomes `normal`.
    ///
    /// # Errors
    ///
    /// * [`Error::ActiveMigrationExists`] when the tenant already has a migration in a
    ///   non-terminal phase (the database enforces this, so concurrent creations from different
    ///   processes cannot both succeed).
    /// * [`Error::RoutingStateChanged`] when the tenant's routing is in another state, and
    ///   [`Error::StoreMismatch`] when it is served by another store.
    /// * [`Error::Storage`] when the store fails.
    async fn create_migration(&self, new: &NewMigration) -> Result<Migration>;

    /// Applies a phase change, compare-and-set, with its routing change and audit entry, all
    /// or nothing, and returns the migration as changed.
    ///
    /// # Errors
    ///
    /// * [`Error::InvalidPhaseTransition`] when `from -> to` is not a phase transition, and
    ///   [`Error::InvalidRoutingTransition`] when the routing change is not a routing
    ///   transition; nothing is read or written.
    /// * [`Error::MigrationNotFound`] when there is no such migration.
    /// * [`Error::PhaseChanged`] when the migration is not in `from` any more: someone else
    ///   moved it.
    /// * [`Error::StaleCutoverAttempt`] when `expected_attempt` is set and the migration was
    ///   moved into `cutover` by another attempt.
    /// * The errors of [`RoutingRepository::switch_routing`] for the routing change.
    /// * [`Error::Storage`] when the store fails.
    async fn apply_transition(&self, transition: &Transition) -> Result<Migration>;

    /// Pauses (`paused = true`) or resumes the bulk copy of a migration in a non-terminal
    /// phase, and logs `migration_paused` or `migration_resumed`.
    ///
    /// # Errors
    ///
    /// [`Error::MigrationNotFound`]; [`Error::WrongPhase`] when the migration is in a terminal
    /// phase; [`Error::Storage`] when the store fails.
    async fn set_paused(&self, id: Uuid, paused: bool, reason: Option<&str>) -> Result<Migration>;
}

/// A change of a tenant's routing, applied compare-and-set on its current state.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RoutingChange {
    /// The state the row must be in.
    pub expected: RoutingState,
    /// The new state.
    pub state: RoutingState,
    /// The store that serves the tenant afterwards.
    pub store_id: String,
    /// The target store afterwards.
    pub target_store_id: Option<String>,
    /// The migration that owns the routing afterwards.
    pub active_migration_id: Option<Uuid>,
    /// The fencing token of the lock under which the change is made, if any. The row rejects
    /// a token older than the newest it has seen.
    pub fencing_token: Option<i64>,
}

impl RoutingChange {
    /// Moves routing from `expected` to `state`, served by `store_id`, with no target, no
    /// owner and no fencing token; refine it with the other methods.
    pub fn new(expected: RoutingState, state: RoutingState, store_id: impl Into<String>) -> Self {
        RoutingChange {
            expected,
            state,
            store_id: store_id.into(),
            target_store_id: None,
            active_migration_id: None,
            fencing_token: None,
        }
    }

    /// Sets the target store.
    pub fn target(mut self, target_store_id: Option<String>) -> Self {
        self.target_store_id = target_store_id;
        self
    }

    /// Sets the owning migration.
    pub fn owner(mut self, migration_id: Option<Uuid>) -> Self {
        self.active_migration_id = migration_id;
        self
    }

    /// Sets the fencing token.
    pub fn fencing_token(mut self, token: Option<i64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// Checks that `expected -> state` is a routing transition.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidRoutingTransition`] when it is not.
    pub fn validate(&self, tenant_id: Uuid) -> Result<()> {
        if self.expected.can_become(self.state) {
            Ok(())
        } else {
            Err(Error::InvalidRoutingTransition {
                tenant_id,
                from: self.expected,
                to: self.state,
            })
        }
    }
}

/// A phase change with everything that must change with it.
///
/// Applied by [`MigrationStore::apply_transition`]: compare-and-set on the phase (and on the
/// cutover attempt when [`expected_attempt`](Self::expected_attempt) is set), the optional
/// routing change, an optional error recorded on the migration, and one audit entry.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Transition {
    /// The migration.
    pub migration_id: Uuid,
    /// Its tenant.
    pub tenant_id: Uuid,
    /// The phase it must be in.
    pub from: MigrationPhase,
    /// The phase it moves to.
    pub to: MigrationPhase,
    /// When set, the migration's [`cutover_attempt`](Migration::cutover_attempt) must be this.
    pub expected_attempt: Option<Uuid>,
    /// The cutover attempt stored afterwards (set when entering `cutover`, cleared otherwise).
    pub new_attempt: Option<Uuid>,
    /// The routing change made with the phase change.
    pub routing: Option<RoutingChange>,
    /// An error to record: increments the error count and sets the last error.
    pub error: Option<String>,
    /// The audit entry's event.
    pub event: AuditEvent,
    /// The audit entry's message.
    pub message: Option<String>,
    /// The audit entry's synced event count.
    pub events_synced: Option<u64>,
    /// The audit entry's duration.
    pub duration_ms: Option<f64>,
}

impl Transition {
    /// Moves `migration` from its current phase to `to`, logged as `event`.
    pub fn new(migration: &Migration, to: MigrationPhase, event: AuditEvent) -> Self {
        Transition::between(
            migration.id,
            migration.tenant_id,
            migration.phase,
            to,
            event,
        )
    }

    /// Moves the migration `migration_id` of `tenant_id` from `from` to `to`, logged as
    /// `event`.
    pub fn between(
        migration_id: Uuid,
        tenant_id: Uuid,
        from: MigrationPhase,
        to: MigrationPhase,
        event: AuditEvent,
    ) -> Self {
        Transition {
            migration_id,
            tenant_id,
            from,
            to,
            expected_attempt: None,
            new_attempt: None,
            routing: None,
            error: None,
            event,
            message: None,
            events_synced: None,
            duration_ms: None,
        }
    }

    /// Requires the current cutover attempt to be `expected` and stores `new` afterwards.
    pub fn attempt(mut self, expected: Option<Uuid>, new: Option<Uuid>) -> Self {
        self.expected_attempt = expected;
        self.new_attempt = new;
        self
    }

    /// Changes routing along with the phase.
    pub fn routing(mut self, change: RoutingChange) -> Self {
        self.routing = Some(change);
        self
    }

    /// Records an error on the migration.
    pub fn error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    /// Sets the audit entry's message.
    pub fn message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Sets the audit entry's synced events and duration.
    pub fn cutover_stats(mut self, events_synced: u64, duration_ms: f64) -> Self {
        self.events_synced = Some(events_synced);
        self.duration_ms = Some(duration_ms);
        self
    }

    /// Checks the phase and routing transitions against the state machines.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPhaseTransition`] or [`Error::InvalidRoutingTransition`].
    pub fn validate(&self) -> Result<()> {
        if !self.from.can_become(self.to) {
            return Err(Error::InvalidPhaseTransition {
                migration_id: self.migration_id,
                from: self.from,
                to: self.to,
            });
        }
        match &self.routing {
            Some(change) => change.validate(self.tenant_id),
            None => Ok(()),
        }
    }
}
