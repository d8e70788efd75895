//! The crate's error type.

use uuid::Uuid;

use crate::model::{MigrationPhase, RoutingState};
use crate::plugins::BoxError;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `pglock-migration`.
///
/// The enum is `#[non_exhaustive]`. Rather than matching many variants, ask the questions:
///
/// | question | true for |
/// | --- | --- |
/// | [`is_refused`](Error::is_refused) | the store refused a change because of the state it found or the rules: nothing was written |
/// | [`lock_error`](Error::lock_error) | a failure of the lock manager ([`pglock::Error`]), such as a timeout on the write gate |
/// | [`cutover_error`](Error::cutover_error) | a cutover that ran and did not switch the tenant |
///
/// Each variant carries the ids it concerns (migration, tenant or store), so a log line alone
/// says which migration failed. Messages follow the Python original's where it had some.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock manager failed: the cutover lock or the write gate could not be taken in time,
    /// or the lock server was unreachable. Displays as the lock error itself.
    #[error(transparent)]
    Lock(#[from] pglock::Error),

    /// A cutover ran and did not switch the tenant; see [`CutoverError`](crate::CutoverError).
    #[error(transparent)]
    Cutover(#[from] crate::CutoverError),

    /// No migration has this id.
    #[error("Migration not found: {migration_id}")]
    MigrationNotFound {
        /// The id that was looked up.
        migration_id: Uuid,
    },

    /// A phase change that the migration state machine does not allow; nothing was written.
    ///
    /// Displays as `Invalid phase transition: {from} -> {to}`, as the Python original does.
    #[error("Invalid phase transition: {from} -> {to}")]
    InvalidPhaseTransition {
        /// The migration.
        migration_id: Uuid,
        /// The phase it was asked to leave.
        from: MigrationPhase,
        /// The phase it was asked to enter.
        to: MigrationPhase,
    },

    /// A compare-and-set phase change found the migration in another phase than expected:
    /// someone else moved it in the meantime. Nothing was written.
    #[error(
        "Migration {migration_id} is in {actual} phase, not {expected}: \
         {expected} -> {to} was not applied"
    )]
    PhaseChanged {
        /// The migration.
        migration_id: Uuid,
        /// The phase the change expected.
        expected: MigrationPhase,
        /// The phase the migration is in.
        actual: MigrationPhase,
        /// The phase the change would have moved it to.
        to: MigrationPhase,
    },

    /// A cutover tried to finish or roll back a `cutover` phase that another cutover attempt
    /// entered. Nothing was written.
    #[error(
        "Migration {migration_id} belongs to cutover attempt {}, not {expected}",
        or_none(.actual)
    )]
    StaleCutoverAttempt {
        /// The migration.
        migration_id: Uuid,
        /// The attempt that tried to write.
        expected: Uuid,
        /// The attempt recorded on the migration.
        actual: Option<Uuid>,
    },

    /// An operation that the migration's phase does not allow; nothing was written.
    ///
    /// Displays as `Cannot {operation}: migration is in {phase} phase`, as the Python original's
    /// `Cannot trigger cutover: migration is in bulk_copy phase`.
    #[error("Cannot {operation}: migration is in {phase} phase")]
    WrongPhase {
        /// The migration.
        migration_id: Uuid,
        /// What was asked, such as `trigger cutover`.
        operation: &'static str,
        /// The phase it is in.
        phase: MigrationPhase,
    },

    /// The tenant already has a migration in a non-terminal phase (enforced by the database).
    #[error(
        "Tenant {tenant_id} already has an active migration{}",
        prefixed(": ", .migration_id)
    )]
    ActiveMigrationExists {
        /// The tenant.
        tenant_id: Uuid,
        /// The active migration, when it could be read.
        migration_id: Option<Uuid>,
    },

    /// The tenant has no routing row.
    #[error("No routing configuration found for tenant {tenant_id}")]
    RoutingNotFound {
        /// The tenant.
        tenant_id: Uuid,
    },

    /// A compare-and-set routing change found the routing in another state than expected.
    /// Nothing was written.
    #[error("Routing of tenant {tenant_id} is {actual}, not {expected}")]
    RoutingStateChanged {
        /// The tenant.
        tenant_id: Uuid,
        /// The state the change expected.
        expected: RoutingState,
        /// The state the routing is in.
        actual: RoutingState,
    },

    /// A routing change that the routing state machine does not allow; nothing was written.
    #[error("Invalid routing transition: {from} -> {to}")]
    InvalidRoutingTransition {
        /// The tenant.
        tenant_id: Uuid,
        /// The state it was asked to leave.
        from: RoutingState,
        /// The state it was asked to enter.
        to: RoutingState,
    },

    /// The tenant is served by another store than the one a migration would move it from.
    #[error("Tenant {tenant_id} is served by store '{actual}', not '{expected}'")]
    StoreMismatch {
        /// The tenant.
        tenant_id: Uuid,
        /// The store the operation expected.
        expected: String,
        /// The store that serves the tenant.
        actual: String,
    },

    /// The routing row was written under a newer fencing token: the writer's lock was lost and
    /// taken by someone else since. Nothing was written.
    #[error(
        "Stale fencing token {token} for tenant {tenant_id}: \
         its routing was written with token {fence}"
    )]
    FenceRejected {
        /// The tenant.
        tenant_id: Uuid,
        /// The token that was presented.
        token: i64,
        /// The newest token the row has seen.
        fence: i64,
    },

    /// A store id that the application's store registry does not know.
    #[error("Target store '{store_id}' is not registered")]
    UnknownStore {
        /// The store id.
        store_id: String,
    },

    /// A cutover was asked of a coordinator built without a lock manager.
    ///
    /// The message is the Python original's, naming pglock's manager.
    #[error(
        "Cannot perform cutover: lock_manager not provided to coordinator. Provide a lock \
         manager (e.g. PostgresLockManager) when creating the coordinator to enable cutover \
         operations."
    )]
    LockManagerMissing,

    /// The coordinator lacks a plug-in the operation needs.
    ///
    /// Displays as `No {plugin} found for migration`, as the original's
    /// `No sync lag tracker found for migration`.
    #[error("No {plugin} found for migration")]
    PluginMissing {
        /// The migration.
        migration_id: Uuid,
        /// Which plug-in: `sync lag tracker` or `event copier`.
        plugin: &'static str,
    },

    /// A plug-in of the application (copier, lag, store registry) failed.
    #[error("{operation} failed for migration {migration_id}: {source}")]
    PluginFailed {
        /// The migration.
        migration_id: Uuid,
        /// What was being done, such as `Bulk copy`.
        operation: &'static str,
        /// The plug-in's error.
        #[source]
        source: BoxError,
    },

    /// The migration store could not be read or written; whether a write happened is unknown.
    #[error("Migration storage error while trying to {operation}: {source}")]
    Storage {
        /// What was being done, such as `apply a phase transition`.
        operation: &'static str,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },

    /// The role lacks a privilege the migration tables need, or may not create the missing
    /// tables ([`PostgresMigrationStore::ensure_schema`](crate::PostgresMigrationStore::ensure_schema)).
    /// Create them in your migrations with
    /// [`PostgresMigrationStore::ddl`](crate::PostgresMigrationStore::ddl) and grant what is
    /// named here (the store's documentation lists every grant).
    #[error("Migration store: permission denied: the role needs {privilege} on {object}")]
    PermissionDenied {
        /// The object, such as `table "pglock_tenant_routing"` or `schema "public"`.
        object: String,
        /// The privilege, such as `SELECT, INSERT, UPDATE` or `CREATE`.
        privilege: String,
    },

    /// A configured SQL identifier (a schema name) is not usable.
    #[error("Invalid identifier {name:?}: {reason}")]
    InvalidIdentifier {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Error {
    /// True when the store refused a change because of the state it found or the rules it
    /// enforces, so that nothing was written: a compare-and-set that found another phase,
    /// routing state, cutover attempt or a newer fencing token; a transition the state machines
    /// forbid; a missing migration or routing row; a phase that does not allow the operation;
    /// a second active migration; a tenant served by another store.
    ///
    /// False for failures whose outcome is unknown ([`Storage`](Error::Storage), a lock
    /// manager error) and for missing configuration or plug-ins.
    ///
    /// ```
    /// use pglock_migration::{Error, RoutingState};
    /// let refused = Error::RoutingStateChanged {
    ///     tenant_id: uuid::Uuid::nil(),
    ///     expected: RoutingState::DualWrite,
    ///     actual: RoutingState::Normal,
    /// };
    /// assert!(refused.is_refused());
    /// assert!(!Error::LockManagerMissing.is_refused());
    /// ```
    pub fn is_refused(&self) -> bool {
        matches!(
            self,
            Error::MigrationNotFound { .. }
                | Error::InvalidPhaseTransition { .. }
                | Error::PhaseChanged { .. }
                | Error::StaleCutoverAttempt { .. }
                | Error::WrongPhase { .. }
                | Error::ActiveMigrationExists { .. }
                | Error::RoutingNotFound { .. }
                | Error::RoutingStateChanged { .. }
                | Error::InvalidRoutingTransition { .. }
                | Error::StoreMismatch { .. }
                | Error::FenceRejected { .. }
        )
    }

    /// The lock manager's error, when the lock manager is what failed.
    pub fn lock_error(&self) -> Option<&pglock::Error> {
        match self {
            Error::Lock(err) => Some(err),
            _ => None,
        }
    }

    /// The cutover's failure, when a cutover ran and did not switch the tenant.
    pub fn cutover_error(&self) -> Option<&crate::CutoverError> {
        match self {
            Error::Cutover(err) => Some(err),
            _ => None,
        }
    }

    /// The migration this error concerns, when it names one.
    pub fn migration_id(&self) -> Option<Uuid> {
        match self {
            Error::MigrationNotFound { migration_id }
            | Error::InvalidPhaseTransition { migration_id, .. }
            | Error::PhaseChanged { migration_id, .. }
            | Error::StaleCutoverAttempt { migration_id, .. }
            | Error::WrongPhase { migration_id, .. }
            | Error::PluginMissing { migration_id, .. }
            | Error::PluginFailed { migration_id, .. } => Some(*migration_id),
            Error::ActiveMigrationExists { migration_id, .. } => *migration_id,
            Error::Cutover(err) => Some(err.migration_id),
            _ => None,
        }
    }
}

/// `Some(x)` as `x`, `None` as `none`.
fn or_none<T: std::fmt::Display>(value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(|| "none".to_owned(), ToString::to_string)
}

/// `Some(x)` as `{prefix}x`, `None` as nothing.
fn prefixed<T: std::fmt::Display>(prefix: &str, value: &Option<T>) -> String {
    value
        .as_ref()
        .map_or_else(String::new, |value| format!("{prefix}{value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant, classified: refused (nothing written) or not.
    #[test]
    fn refusals_are_exactly_the_changes_that_wrote_nothing() {
        let (m, t) = (Uuid::new_v4(), Uuid::new_v4());
        let (dw, cut) = (MigrationPhase::DualWrite, MigrationPhase::Cutover);
        let (normal, paused) = (RoutingState::Normal, RoutingState::CutoverPaused);
        let refused = [
            Error::MigrationNotFound { migration_id: m },
            Error::InvalidPhaseTransition {
                migration_id: m,
                from: dw,
                to: dw,
            },
            Error::PhaseChanged {
                migration_id: m,
                expected: dw,
                actual: cut,
                to: cut,
            },
            Error::StaleCutoverAttempt {
                migration_id: m,
                expected: t,
                actual: None,
            },
            Error::WrongPhase {
                migration_id: m,
                operation: "x",
                phase: dw,
            },
            Error::ActiveMigrationExists {
                tenant_id: t,
                migration_id: None,
            },
            Error::RoutingNotFound { tenant_id: t },
            Error::RoutingStateChanged {
                tenant_id: t,
                expected: normal,
                actual: paused,
            },
            Error::InvalidRoutingTransition {
                tenant_id: t,
                from: normal,
                to: paused,
            },
            Error::StoreMismatch {
                tenant_id: t,
                expected: "a".into(),
                actual: "b".into(),
            },
            Error::FenceRejected {
                tenant_id: t,
                token: 1,
                fence: 2,
            },
        ];
        for err in &refused {
            assert!(err.is_refused(), "{err:?}");
        }
        let not_refused = [
            Error::Lock(pglock::Error::NotHeld { key: "k".into() }),
            Error::UnknownStore {
                store_id: "s".into(),
            },
            Error::LockManagerMissing,
            Error::PluginMissing {
                migration_id: m,
                plugin: "event copier",
            },
            Error::PluginFailed {
                migration_id: m,
                operation: "Bulk copy",
                source: "x".into(),
            },
            Error::Storage {
                operation: "x",
                source: sqlx::Error::PoolTimedOut,
            },
            Error::InvalidIdentifier {
                name: String::new(),
                reason: "it is empty",
            },
        ];
        for err in &not_refused {
            assert!(!err.is_refused(), "{err:?}");
        }
    }

    #[test]
    fn lock_errors_keep_their_message_and_are_told_apart() {
        let err = Error::from(pglock::Error::NotHeld { key: "k".into() });
        assert_eq!(err.to_string(), "Lock 'k' is not held by this session");
        assert!(matches!(
            err.lock_error(),
            Some(pglock::Error::NotHeld { .. })
        ));
        assert!(Error::LockManagerMissing.lock_error().is_none());
    }
}
