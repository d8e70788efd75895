//! What the application plugs in: copying events, measuring the lag, knowing the stores.

use std::fmt;

use async_trait::async_trait;
use uuid::Uuid;

/// The error type of the application's plug-ins.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// One bulk-copy request: copy the next batch of a tenant's events.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyRequest<'a> {
    /// The migration being copied.
    pub migration_id: Uuid,
    /// The tenant whose events are copied.
    pub tenant_id: Uuid,
    /// The store to read from.
    pub source_store_id: &'a str,
    /// The store to write to.
    pub target_store_id: &'a str,
    /// Copy events after this source position; `None` means from the first event.
    pub after_position: Option<i64>,
    /// Copy at most this many events.
    pub batch_size: u32,
}

/// What one copied batch did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CopyBatch {
    /// How many events were copied; 0 means the target has caught up.
    pub copied: u64,
    /// The source position of the last event copied; the next batch starts after it.
    pub last_position: Option<i64>,
}

impl CopyBatch {
    /// A batch of `copied` events ending at source position `last_position`.
    pub fn new(copied: u64, last_position: Option<i64>) -> Self {
        CopyBatch {
            copied,
            last_position,
        }
    }

    /// Nothing left to copy.
    pub fn caught_up() -> Self {
        CopyBatch::default()
    }
}

/// Copies a tenant's events from one store to another, in batches, from a resumable position.
///
/// The coordinator stores the position after every batch, so a bulk copy that stops (an
/// error, a pause, a crash) resumes after the last batch it recorded. A batch copied but not
/// recorded (a crash in between) is asked for again: make `copy_batch` idempotent, for
/// example by skipping events whose id the target already has.
///
/// ```
/// use async_trait::async_trait;
/// use pglock_migration::{BoxError, CopyBatch, CopyRequest, EventCopier};
///
/// #[derive(Debug)]
/// struct NothingToCopy;
///
/// #[async_trait]
/// impl EventCopier for NothingToCopy {
///     async fn copy_batch(&self, _request: &CopyRequest<'_>) -> Result<CopyBatch, BoxError> {
///         Ok(CopyBatch::caught_up())
///     }
/// }
/// ```
#[async_trait]
pub trait EventCopier: Send + Sync + fmt::Debug {
    /// Copies up to `request.batch_size` of the tenant's events that come after
    /// `request.after_position` in the source, in source order, and says how far it got.
    async fn copy_batch(&self, request: &CopyRequest<'_>) -> Result<CopyBatch, BoxError>;

    /// How many events of the tenant the source holds, for progress reporting; `None` when
    /// the copier cannot tell. Called once when the bulk copy starts.
    async fn count_events(
        &self,
        _tenant_id: Uuid,
        _source_store_id: &str,
    ) -> Result<Option<u64>, BoxError> {
        Ok(None)
    }
}

/// Measures how far the target is behind the source for a tenant.
///
/// The cutover measures the lag while it holds the tenant's write gate, so no write of the
/// tenant is in flight: the number is final.
#[async_trait]
pub trait SyncLag: Send + Sync + fmt::Debug {
    /// How many of the tenant's events the source has that the target does not; `None` when
    /// it cannot be calculated (the cutover then fails with `Unable to calculate sync lag`).
    async fn lag(
        &self,
        tenant_id: Uuid,
        source_store_id: &str,
        target_store_id: &str,
    ) -> Result<Option<u64>, BoxError>;
}

/// The event stores the application can route tenants to.
///
/// Migrations may only target a registered store, and a cutover checks the target's health
/// before it switches anything.
#[async_trait]
pub trait StoreRegistry: Send + Sync + fmt::Debug {
    /// Whether the application can route tenants to `store_id`.
    fn is_registered(&self, store_id: &str) -> bool;

    /// Checks that `store_id` answers, for example by reading its current position.
    async fn check_health(&self, store_id: &str) -> Result<(), BoxError>;
}
