//! The job store in memory, for unit tests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;

use super::Result;
use super::store::{Extension, JobRecord, JobSpec, JobState, JobStore};

/// A [`JobStore`] in memory, for unit tests of code that runs scheduled jobs: the rules of the
/// PostgreSQL store on the process's own clock.
///
/// Cloning gives another handle on the same records: jobs built on clones (and on managers
/// sharing an [`InMemoryLockServer`](crate::InMemoryLockServer)) play several replicas.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use pglock::InMemoryLockManager;
/// use pglock::schedule::{InMemoryJobStore, ScheduledJob};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::schedule::Result<()> {
/// let job = ScheduledJob::builder(
///     Arc::new(InMemoryLockManager::new()),
///     Arc::new(InMemoryJobStore::new()),
///     "nightly-report",
///     Duration::from_secs(3600),
/// )
/// .build()?;
/// assert!(job.run(|run| async move { run.run }).await?.ran());
/// // The same window again: skipped, it ran already.
/// assert!(!job.run(|_| async {}).await?.ran());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct InMemoryJobStore {
    records: Arc<Mutex<HashMap<String, JobRecord>>>,
}

impl InMemoryJobStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The record of `spec`'s job as it stands, and the clock.
    fn with_record<T>(&self, spec: &JobSpec, act: impl FnOnce(&mut JobState) -> T) -> T {
        let mut records = crate::sync::lock(&self.records);
        let record = records.get(&spec.name).cloned();
        let mut state = JobState::new(spec, Utc::now(), record);
        let out = act(&mut state);
        if let Some(record) = state.record {
            records.insert(spec.name.clone(), record);
        }
        out
    }
}

#[async_trait]
impl JobStore for InMemoryJobStore {
    async fn prepare(&self, _spec: &JobSpec) -> Result<()> {
        Ok(())
    }

    async fn state(&self, spec: &JobSpec) -> Result<JobState> {
        Ok(self.with_record(spec, |state| state.clone()))
    }

    async fn claim(
        &self,
        spec: &JobSpec,
        holder_id: &str,
    ) -> Result<std::result::Result<JobRecord, JobState>> {
        Ok(self.with_record(spec, |state| {
            if state.skip().is_some() {
                return Err(state.clone());
            }
            let claimed = state.claimed(spec, holder_id);
            state.record = Some(claimed.clone());
            Ok(claimed)
        }))
    }

    async fn finish(&self, spec: &JobSpec, run: i64) -> Result<bool> {
        Ok(self.with_record(spec, |state| {
            let now = state.now;
            match state.record.as_mut() {
                Some(record) if record.runs == run && record.finished_at.is_none() => {
                    record.finish(spec, now);
                    true
                }
                _ => false,
            }
        }))
    }

    async fn abandon(&self, spec: &JobSpec, run: i64) -> Result<()> {
        self.with_record(spec, |state| {
            let now = state.now;
            if let Some(record) = state.record.as_mut()
                && record.runs == run
                && record.finished_at.is_none()
            {
                record.abandon(spec, now);
            }
        });
        Ok(())
    }

    async fn extend(&self, spec: &JobSpec, run: i64, by: Duration) -> Result<Option<Extension>> {
        Ok(self.with_record(spec, |state| {
            let now = state.now;
            match state.record.as_mut() {
                Some(record) if record.runs == run && record.finished_at.is_none() => {
                    Some(record.extend(spec, now, by))
                }
                _ => None,
            }
        }))
    }

    async fn until_next_window(&self, spec: &JobSpec) -> Result<Duration> {
        Ok(spec.until_next_window(Utc::now()))
    }
}
