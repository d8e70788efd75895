//! The records of a tenant migration: phases, routing states, the migration row, the routing row
//! and the audit log.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Where a migration is in its life.
///
/// ```text
/// pending -> bulk_copy -> dual_write -> cutover -> completed
///                             ^            |
///                             +------------+   (a cutover that cannot finish rolls back)
/// any non-terminal phase -> aborted | failed
/// ```
///
/// `completed`, `aborted` and `failed` are terminal. A tenant has at most one migration in a
/// non-terminal phase at a time; the database enforces it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigrationPhase {
    /// Created; nothing copied yet.
    Pending,
    /// The tenant's existing events are being copied to the target; writes go to the source.
    BulkCopy,
    /// Writes go to both stores; the target is caught up and ready for cutover.
    DualWrite,
    /// A cutover holds the tenant's cutover lock and write gate and is switching routing.
    Cutover,
    /// The tenant is served by the target store.
    Completed,
    /// Stopped by an operator; the tenant stays on the source.
    Aborted,
    /// Stopped by an unrecoverable error; the tenant stays on the source.
    Failed,
}

impl MigrationPhase {
    /// Every phase, in life order.
    pub const ALL: [MigrationPhase; 7] = [
        MigrationPhase::Pending,
        MigrationPhase::BulkCopy,
        MigrationPhase::DualWrite,
        MigrationPhase::Cutover,
        MigrationPhase::Completed,
        MigrationPhase::Aborted,
        MigrationPhase::Failed,
    ];

    /// The name stored in the database: `pending`, `bulk_copy`, `dual_write`, `cutover`,
    /// `completed`, `aborted` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationPhase::Pending => "pending",
            MigrationPhase::BulkCopy => "bulk_copy",
            MigrationPhase::DualWrite => "dual_write",
            MigrationPhase::Cutover => "cutover",
            MigrationPhase::Completed => "completed",
            MigrationPhase::Aborted => "aborted",
            MigrationPhase::Failed => "failed",
        }
    }

    /// True for `completed`, `aborted` and `failed`, which nothing leaves.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            MigrationPhase::Completed | MigrationPhase::Aborted | MigrationPhase::Failed
        )
    }

    /// Whether a migration may move from `self` to `next`.
    ///
    /// ```
    /// use pglock_migration::MigrationPhase::*;
    /// assert!(DualWrite.can_become(Cutover));
    /// assert!(Cutover.can_become(DualWrite)); // the cutover rollback
    /// assert!(Pending.can_become(Aborted));
    /// assert!(!BulkCopy.can_become(Cutover));
    /// assert!(!Completed.can_become(DualWrite));
    /// ```
    pub fn can_become(self, next: MigrationPhase) -> bool {
        use MigrationPhase::*;
        match (self, next) {
            (from, _) if from.is_terminal() => false,
            (_, Aborted | Failed) => true,
            (Pending, BulkCopy)
            | (BulkCopy, DualWrite)
            | (DualWrite, Cutover)
            | (Cutover, Completed)
            | (Cutover, DualWrite) => true,
            _ => false,
        }
    }
}

impl fmt::Display for MigrationPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MigrationPhase {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        MigrationPhase::ALL
            .into_iter()
            .find(|phase| phase.as_str() == name)
            .ok_or_else(|| UnknownName::new("migration phase", name))
    }
}

/// How a tenant's reads and writes are routed while it migrates.
///
/// ```text
/// normal -> bulk_copy -> dual_write -> cutover_paused -> migrated
///                            ^               |
///                            +---------------+   (cutover rollback)
/// any state -> normal
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RoutingState {
    /// No migration: everything goes to `store_id`.
    Normal,
    /// Writes go to the source, whose events are being copied to the target.
    BulkCopy,
    /// Writes go to both the source and the target.
    DualWrite,
    /// A cutover is switching the tenant. Writers inside the write gate never see this state
    /// from a live cutover (it holds the gate for as long as the state lasts); seen from inside
    /// the gate it means a cutover was interrupted, and routing is still that of `dual_write`.
    CutoverPaused,
    /// The tenant lives on the target, now `store_id`.
    Migrated,
}

impl RoutingState {
    /// Every state, in life order.
    pub const ALL: [RoutingState; 5] = [
        RoutingState::Normal,
        RoutingState::BulkCopy,
        RoutingState::DualWrite,
        RoutingState::CutoverPaused,
        RoutingState::Migrated,
    ];

    /// The name stored in the database: `normal`, `bulk_copy`, `dual_write`,
    /// `cutover_paused` or `migrated`.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingState::Normal => "normal",
            RoutingState::BulkCopy => "bulk_copy",
            RoutingState::DualWrite => "dual_write",
            RoutingState::CutoverPaused => "cutover_paused",
            RoutingState::Migrated => "migrated",
        }
    }

    /// Whether routing may move from `self` to `next`.
    ///
    /// ```
    /// use pglock_migration::RoutingState::*;
    /// assert!(DualWrite.can_become(CutoverPaused));
    /// assert!(CutoverPaused.can_become(DualWrite)); // the cutover rollback
    /// assert!(Migrated.can_become(Normal));
    /// assert!(!BulkCopy.can_become(Migrated));
    /// ```
    pub fn can_become(self, next: RoutingState) -> bool {
        use RoutingState::*;
        matches!(
            (self, next),
            (_, Normal)
                | (Normal, BulkCopy)
                | (BulkCopy, DualWrite)
                | (DualWrite, CutoverPaused)
                | (CutoverPaused, Migrated)
                | (CutoverPaused, DualWrite)
        )
    }
}

impl fmt::Display for RoutingState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RoutingState {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        RoutingState::ALL
            .into_iter()
            .find(|state| state.as_str() == name)
            .ok_or_else(|| UnknownName::new("routing state", name))
    }
}

/// A phase, state or audit event name that this version does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    kind: &'static str,
    name: String,
}

impl UnknownName {
    fn new(kind: &'static str, name: &str) -> Self {
        UnknownName {
            kind,
            name: name.to_owned(),
        }
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.kind, self.name)
    }
}

impl std::error::Error for UnknownName {}

/// Per-migration settings, stored with the migration.
///
/// ```
/// use std::time::Duration;
/// use pglock_migration::MigrationConfig;
///
/// let config = MigrationConfig::default()
///     .cutover_timeout(Duration::from_secs(2))
///     .max_lag_events(10)
///     .batch_size(500);
/// assert_eq!(config.cutover_timeout, Duration::from_secs(2));
/// // The floor of the original: a cutover gets at least 100 ms.
/// assert_eq!(MigrationConfig::default().cutover_timeout(Duration::ZERO).cutover_timeout,
///            Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationConfig {
    /// How long a cutover may take once it holds the cutover lock: draining in-flight writes,
    /// the lag checks and the switch. Default 500 ms, at least 100 ms.
    pub cutover_timeout: Duration,
    /// The largest sync lag, in events, at which a cutover may switch. Default 0.
    pub max_lag_events: u64,
    /// How many events the bulk copy asks the copier for at a time. Default 1000.
    pub batch_size: u32,
}

impl MigrationConfig {
    /// The smallest cutover timeout accepted; smaller values are raised to it.
    pub const MIN_CUTOVER_TIMEOUT: Duration = Duration::from_millis(100);

    /// Sets [`cutover_timeout`](Self::cutover_timeout), raised to at least
    /// [`MIN_CUTOVER_TIMEOUT`](Self::MIN_CUTOVER_TIMEOUT).
    pub fn cutover_timeout(mut self, timeout: Duration) -> Self {
        self.cutover_timeout = timeout.max(Self::MIN_CUTOVER_TIMEOUT);
        self
    }

    /// Sets [`max_lag_events`](Self::max_lag_events).
    pub fn max_lag_events(mut self, events: u64) -> Self {
        self.max_lag_events = events;
        self
    }

    /// Sets [`batch_size`](Self::batch_size), at least 1.
    pub fn batch_size(mut self, batch_size: u32) -> Self {
        self.batch_size = batch_size.max(1);
        self
    }
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            cutover_timeout: Duration::from_millis(500),
            max_lag_events: 0,
            batch_size: 1000,
        }
    }
}

/// What a new migration is made of; see
/// [`MigrationStore::create_migration`](crate::MigrationStore::create_migration).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NewMigration {
    /// The migration's id.
    pub id: Uuid,
    /// The tenant that moves.
    pub tenant_id: Uuid,
    /// The store the tenant lives on now.
    pub source_store_id: String,
    /// The store the tenant moves to.
    pub target_store_id: String,
    /// Settings.
    pub config: MigrationConfig,
    /// Who asked for it, free-form.
    pub created_by: Option<String>,
}

impl NewMigration {
    /// A migration of `tenant_id` from `source` to `target` with a fresh id and default
    /// settings.
    pub fn new(tenant_id: Uuid, source: impl Into<String>, target: impl Into<String>) -> Self {
        NewMigration {
            id: Uuid::new_v4(),
            tenant_id,
            source_store_id: source.into(),
            target_store_id: target.into(),
            config: MigrationConfig::default(),
            created_by: None,
        }
    }

    /// Sets the settings.
    pub fn config(mut self, config: MigrationConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets who asked for the migration.
    pub fn created_by(mut self, created_by: impl Into<String>) -> Self {
        self.created_by = Some(created_by.into());
        self
    }
}

/// One migration, as stored.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Migration {
    /// The migration's id.
    pub id: Uuid,
    /// The tenant that moves.
    pub tenant_id: Uuid,
    /// The store the tenant moves from.
    pub source_store_id: String,
    /// The store the tenant moves to.
    pub target_store_id: String,
    /// Where the migration is.
    pub phase: MigrationPhase,
    /// Settings.
    pub config: MigrationConfig,
    /// How many events the source held when the bulk copy counted them, if the copier can
    /// count.
    pub events_total: Option<u64>,
    /// How many events the bulk copy has copied.
    pub events_copied: u64,
    /// The source position of the last event copied; the bulk copy resumes after it.
    pub last_source_position: Option<i64>,
    /// The cutover attempt that moved the migration into `cutover`, while it is there.
    pub cutover_attempt: Option<Uuid>,
    /// Whether an operator paused the bulk copy.
    pub is_paused: bool,
    /// When it was paused.
    pub paused_at: Option<DateTime<Utc>>,
    /// Why it was paused.
    pub pause_reason: Option<String>,
    /// How many errors were recorded (failed cutovers, failed copy batches).
    pub error_count: u32,
    /// The last error recorded.
    pub last_error: Option<String>,
    /// When the last error was recorded.
    pub last_error_at: Option<DateTime<Utc>>,
    /// Who asked for the migration.
    pub created_by: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// When the bulk copy started.
    pub bulk_copy_started_at: Option<DateTime<Utc>>,
    /// When dual writes started.
    pub dual_write_started_at: Option<DateTime<Utc>>,
    /// When the last cutover attempt started.
    pub cutover_started_at: Option<DateTime<Utc>>,
    /// When it reached a terminal phase.
    pub finished_at: Option<DateTime<Utc>>,
}

impl Migration {
    /// The share of events copied, from 0 to 100, when the total is known.
    pub fn progress_percent(&self) -> Option<f64> {
        match self.events_total {
            Some(0) => Some(100.0),
            Some(total) => Some((self.events_copied as f64 / total as f64 * 100.0).min(100.0)),
            None => None,
        }
    }
}

/// How one tenant is routed, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TenantRouting {
    /// The tenant.
    pub tenant_id: Uuid,
    /// The store that serves the tenant: the source until the cutover, the target after.
    pub store_id: String,
    /// The store the tenant is moving to, while a migration is active.
    pub target_store_id: Option<String>,
    /// Where the routing is.
    pub state: RoutingState,
    /// The migration that owns this routing, while one is active.
    pub active_migration_id: Option<Uuid>,
    /// The newest fencing token that wrote this row; 0 before any.
    pub fence: i64,
    /// When the row last changed.
    pub updated_at: DateTime<Utc>,
}

impl TenantRouting {
    /// The stores a write of this tenant goes to now: the primary store first, then the
    /// target while dual-writing.
    ///
    /// Read the routing *after* entering the tenant's [write gate](crate::WriteGate), so a
    /// cutover cannot switch it between the read and the commit. `cutover_paused` is routed
    /// like `dual_write`: seen from inside the gate, it is the leftover of an interrupted
    /// cutover, and the tenant is still served by its source.
    pub fn write_stores(&self) -> Vec<&str> {
        match (self.state, &self.target_store_id) {
            (RoutingState::DualWrite | RoutingState::CutoverPaused, Some(target)) => {
                vec![self.store_id.as_str(), target.as_str()]
            }
            _ => vec![self.store_id.as_str()],
        }
    }
}

/// What an audit log entry records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AuditEvent {
    /// A migration was created.
    MigrationStarted,
    /// A phase change outside the cutover (`pending -> bulk_copy`, `bulk_copy -> dual_write`).
    PhaseChanged,
    /// The bulk copy was paused.
    MigrationPaused,
    /// The bulk copy was resumed.
    MigrationResumed,
    /// An operator aborted the migration.
    MigrationAborted,
    /// The migration was marked failed.
    MigrationFailed,
    /// A cutover took the lock and the write gate and moved the migration into `cutover`.
    CutoverInitiated,
    /// A cutover switched the tenant to the target.
    CutoverCompleted,
    /// A cutover could not finish and put the tenant back into `dual_write` on the source.
    CutoverRolledBack,
}

impl AuditEvent {
    /// Every event type.
    pub const ALL: [AuditEvent; 9] = [
        AuditEvent::MigrationStarted,
        AuditEvent::PhaseChanged,
        AuditEvent::MigrationPaused,
        AuditEvent::MigrationResumed,
        AuditEvent::MigrationAborted,
        AuditEvent::MigrationFailed,
        AuditEvent::CutoverInitiated,
        AuditEvent::CutoverCompleted,
        AuditEvent::CutoverRolledBack,
    ];

    /// The name stored in the database, such as `cutover_initiated`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuditEvent::MigrationStarted => "migration_started",
            AuditEvent::PhaseChanged => "phase_changed",
            AuditEvent::MigrationPaused => "migration_paused",
            AuditEvent::MigrationResumed => "migration_resumed",
            AuditEvent::MigrationAborted => "migration_aborted",
            AuditEvent::MigrationFailed => "migration_failed",
            AuditEvent::CutoverInitiated => "cutover_initiated",
            AuditEvent::CutoverCompleted => "cutover_completed",
            AuditEvent::CutoverRolledBack => "cutover_rolled_back",
        }
    }
}

impl fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AuditEvent {
    type Err = UnknownName;

    fn from_str(name: &str) -> Result<Self, UnknownName> {
        AuditEvent::ALL
            .into_iter()
            .find(|event| event.as_str() == name)
            .ok_or_else(|| UnknownName::new("audit event", name))
    }
}

/// One entry of a migration's audit log.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AuditEntry {
    /// Position in the log; entries of one migration are ordered by it.
    pub id: i64,
    /// The migration.
    pub migration_id: Uuid,
    /// The migration's tenant.
    pub tenant_id: Uuid,
    /// What happened.
    pub event: AuditEvent,
    /// The phase before, for phase changes.
    pub from_phase: Option<MigrationPhase>,
    /// The phase after, for phase changes.
    pub to_phase: Option<MigrationPhase>,
    /// Details: the reason of a pause or abort, the error of a rolled-back cutover.
    pub message: Option<String>,
    /// The cutover attempt, for cutover entries.
    pub cutover_attempt: Option<Uuid>,
    /// The fencing token the cutover held, when the lock manager mints them.
    pub fencing_token: Option<i64>,
    /// Events synced during the cutover, for `cutover_completed`.
    pub events_synced: Option<u64>,
    /// How long the cutover took, lock wait included, for `cutover_completed`.
    pub duration_ms: Option<f64>,
    /// When it was written.
    pub occurred_at: DateTime<Utc>,
}
