//! Where a scheduled job keeps its record: a port, with a PostgreSQL table behind it in
//! production and memory in unit tests.
//!
//! The rules (which window a claim is for, when a claim may replace the record, what finishing
//! or giving up a run writes) are stated once here, as methods on [`JobSpec`], [`JobState`] and
//! [`JobRecord`]. [`InMemoryJobStore`](super::InMemoryJobStore) applies them under a mutex;
//! [`PostgresJobStore`](super::PostgresJobStore) says the same in SQL, so that one statement
//! claims atomically on the database's clock, and the scheduled-job tests run every case on
//! both.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::lease::Lease;
use super::{JobRun, Result, Skip};

/// A job's name and schedule, checked by the builder: what a store needs to know of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobSpec {
    /// The job's name, its record's key.
    pub name: String,
    /// The length of a window.
    pub period: Duration,
    /// How far windows are shifted from the whole periods since the Unix epoch.
    pub offset: Duration,
    /// How long before a window's start a claim already counts for that window.
    pub skew_tolerance: Duration,
    /// How long after a run starts no other run may start.
    pub min_hold: Duration,
    /// How long a run may hold the job unless it extends its hold.
    pub max_hold: Duration,
    /// How long a run may hold the job at most, from its claim, extensions included: the
    /// bound on [`JobRun::extend`](super::JobRun::extend). Equal to the max hold when runs may
    /// not extend.
    pub max_total_hold: Duration,
}

impl JobSpec {
    /// The start of the window a claim made at `now` is for: windows start at every whole
    /// period since the Unix epoch, shifted by the offset, and a claim up to the skew
    /// tolerance early counts for the next window.
    pub fn window_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        let (period, offset) = (micros(self.period), micros(self.offset));
        let shifted = now.timestamp_micros() - offset + micros(self.skew_tolerance);
        at_micros(shifted.div_euclid(period) * period + offset)
    }

    /// How long from `now` until the next window starts.
    pub fn until_next_window(&self, now: DateTime<Utc>) -> Duration {
        let (period, offset) = (micros(self.period), micros(self.offset));
        let since_start = (now.timestamp_micros() - offset).rem_euclid(period);
        Duration::from_micros((period - since_start).unsigned_abs())
    }

    /// The run a claimed `record` stands for, held through `lease`.
    pub(super) fn run_of(&self, record: JobRecord, lease: Arc<Lease>) -> JobRun {
        JobRun {
            job: self.name.clone(),
            window_start: record.window_start,
            window_end: record.window_start + chrono::Duration::microseconds(micros(self.period)),
            run: record.runs,
            started_at: record.claimed_at,
            holder_id: record.claimed_by,
            lease,
        }
    }
}

/// A job's record as a store saw it, next to the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobState {
    /// The store's clock when it read the record.
    pub now: DateTime<Utc>,
    /// The window a claim made now would be for.
    pub current_window: DateTime<Utc>,
    /// The job's record; `None` until its first claim.
    pub record: Option<JobRecord>,
}

impl JobState {
    /// The state of `spec`'s job at `now`, with its `record`.
    pub fn new(spec: &JobSpec, now: DateTime<Utc>, record: Option<JobRecord>) -> Self {
        JobState {
            now,
            current_window: spec.window_at(now),
            record,
        }
    }

    /// Why a claim made at this state is refused, or `None` when it may replace the record:
    /// the previous claim must be over (finished and past its min hold, or past its max hold),
    /// and either be for an earlier window or never have finished.
    pub fn skip(&self) -> Option<Skip> {
        let record = self.record.as_ref()?;
        let this_window_done = record.window_start >= self.current_window;
        match record.finished_at {
            Some(finished_at) if this_window_done => Some(Skip::AlreadyRan {
                run: record.runs,
                by: record.claimed_by.clone(),
                finished_at,
            }),
            _ if record.hold_until <= self.now => None,
            None => Some(Skip::Running {
                window_start: record.window_start,
                run: record.runs,
                by: record.claimed_by.clone(),
                expires_at: record.hold_until,
            }),
            Some(_) => Some(Skip::TooSoon {
                run: record.runs,
                until: record.hold_until,
            }),
        }
    }

    /// The record a claim by `holder_id` writes at this state, when [`skip`](Self::skip) lets
    /// it: the current window, the next run number, held until the max hold.
    pub fn claimed(&self, spec: &JobSpec, holder_id: &str) -> JobRecord {
        JobRecord {
            window_start: self.current_window,
            runs: self.record.as_ref().map_or(1, |record| record.runs + 1),
            claimed_by: Some(holder_id.to_owned()),
            claimed_at: self.now,
            finished_at: None,
            hold_until: self.now + chrono::Duration::microseconds(micros(spec.max_hold)),
            extensions: 0,
            extended_at: None,
        }
    }
}

/// A job's record: its latest claim.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobRecord {
    /// The window the latest claim was for.
    pub window_start: DateTime<Utc>,
    /// How many claims the job has had: the latest claim's run number.
    pub runs: i64,
    /// The holder id of the latest claim's manager.
    pub claimed_by: Option<String>,
    /// When the latest claim was made, by the store's clock.
    pub claimed_at: DateTime<Utc>,
    /// When its run finished; `None` while it runs, or if it never finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// No new claim before this moment.
    pub hold_until: DateTime<Utc>,
    /// How many times the latest claim's run extended its hold.
    pub extensions: i32,
    /// When it last did, by the store's clock.
    pub extended_at: Option<DateTime<Utc>>,
}

impl JobRecord {
    /// A record as a store read it, never extended (see [`extended`](Self::extended)).
    pub fn new(
        window_start: DateTime<Utc>,
        runs: i64,
        claimed_by: Option<String>,
        claimed_at: DateTime<Utc>,
        finished_at: Option<DateTime<Utc>>,
        hold_until: DateTime<Utc>,
    ) -> Self {
        JobRecord {
            window_start,
            runs,
            claimed_by,
            claimed_at,
            finished_at,
            hold_until,
            extensions: 0,
            extended_at: None,
        }
    }

    /// The record with its run's extensions, as a store read them: how many, and the last.
    pub fn extended(mut self, extensions: i32, extended_at: Option<DateTime<Utc>>) -> Self {
        self.extensions = extensions;
        self.extended_at = extended_at;
        self
    }

    /// Extends, at `now`, the hold of the run this record claims by `by`: it then holds until
    /// `by` from now, never past its claim plus the max total hold, and never less long than
    /// it already did. Counts the extension even when it changes nothing.
    pub fn extend(&mut self, spec: &JobSpec, now: DateTime<Utc>, by: Duration) -> Extension {
        let asked = now + chrono::Duration::microseconds(micros(by));
        let limit = self.claimed_at + chrono::Duration::microseconds(micros(spec.max_total_hold));
        self.hold_until = self.hold_until.max(asked.min(limit));
        self.extensions = self.extensions.saturating_add(1);
        self.extended_at = Some(now);
        Extension {
            hold_until: self.hold_until,
            capped: asked > limit,
        }
    }

    /// Records, at `now`, that the run finished: the claim holds on until the min hold past
    /// its start, or ends now if that has passed.
    pub fn finish(&mut self, spec: &JobSpec, now: DateTime<Utc>) {
        self.finished_at = Some(now);
        self.hold_until = self.min_hold_end(spec).max(now);
    }

    /// Gives the run up at `now` without finishing it: its window may be claimed again once
    /// the min hold has passed since the claim, instead of at the max hold.
    pub fn abandon(&mut self, spec: &JobSpec, now: DateTime<Utc>) {
        self.hold_until = self.hold_until.min(self.min_hold_end(spec).max(now));
    }

    fn min_hold_end(&self, spec: &JobSpec) -> DateTime<Utc> {
        self.claimed_at + chrono::Duration::microseconds(micros(spec.min_hold))
    }
}

/// What extending a run's hold did ([`JobRun::extend`](super::JobRun::extend)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Extension {
    /// The run now holds the job until this moment (the store's clock).
    pub hold_until: DateTime<Utc>,
    /// True when the hold stops short of what was asked, at the job's
    /// [`max_total_hold`](super::ScheduledJobBuilder::max_total_hold): extending again gains
    /// nothing.
    pub capped: bool,
}

impl Extension {
    /// What a store's extension did: the hold now ends at `hold_until`, short of what was
    /// asked if `capped`.
    pub fn new(hold_until: DateTime<Utc>, capped: bool) -> Self {
        Extension { hold_until, capped }
    }
}

/// Where a [`ScheduledJob`](super::ScheduledJob) keeps its record: the port its stores
/// implement.
///
/// Every method concerns the job `spec` names, and every time is the store's own clock, never
/// a caller's: all replicas of a job must use one store (one database, or one
/// [`InMemoryJobStore`](super::InMemoryJobStore) shared by a test's managers).
#[async_trait]
pub trait JobStore: Send + Sync + fmt::Debug {
    /// Makes the store ready for the job (a table checked, or created where the role may);
    /// called before the job's first run, again after a failure.
    async fn prepare(&self, spec: &JobSpec) -> Result<()>;

    /// The job's record and the store's clock.
    async fn state(&self, spec: &JobSpec) -> Result<JobState>;

    /// Claims the current window for `holder_id` if [`JobState::skip`] allows it, atomically
    /// with respect to every other claim of the job: the claimed record, or the state that
    /// refused the claim.
    async fn claim(
        &self,
        spec: &JobSpec,
        holder_id: &str,
    ) -> Result<std::result::Result<JobRecord, JobState>>;

    /// Records that run `run` finished ([`JobRecord::finish`]); false when the record no
    /// longer is that unfinished run (its claim expired and was taken over).
    async fn finish(&self, spec: &JobSpec, run: i64) -> Result<bool>;

    /// Gives run `run` up without finishing it ([`JobRecord::abandon`]), if the record still
    /// is that unfinished run.
    async fn abandon(&self, spec: &JobSpec, run: i64) -> Result<()>;

    /// Extends the hold of run `run` by `by` ([`JobRecord::extend`]), atomically with
    /// respect to claims, if the record still is that unfinished run; `None` otherwise (it
    /// finished, or its claim expired and was taken over).
    async fn extend(&self, spec: &JobSpec, run: i64, by: Duration) -> Result<Option<Extension>>;

    /// How long until the next window starts, by the store's clock.
    async fn until_next_window(&self, spec: &JobSpec) -> Result<Duration>;
}

/// Whole microseconds; the builder checked that every duration is at most a hundred years.
pub(super) fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).expect("at most a hundred years")
}

fn at_micros(micros: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(micros).expect("a window within chrono's range")
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).single().expect("valid")
    }

    fn spec(period: u64, offset: u64, tolerance: u64) -> JobSpec {
        JobSpec {
            name: "job".into(),
            period: Duration::from_secs(period),
            offset: Duration::from_secs(offset),
            skew_tolerance: Duration::from_secs(tolerance),
            min_hold: Duration::from_secs(5),
            max_hold: Duration::from_secs(50),
            max_total_hold: Duration::from_secs(80),
        }
    }

    fn state(now: i64, window: i64, record: Option<(i64, Option<i64>, i64)>) -> JobState {
        JobState {
            now: at(now),
            current_window: at(window),
            record: record.map(|(window_start, finished, hold_until)| JobRecord {
                window_start: at(window_start),
                runs: 7,
                claimed_by: Some("w".into()),
                claimed_at: at(window_start),
                finished_at: finished.map(at),
                hold_until: at(hold_until),
                extensions: 0,
                extended_at: None,
            }),
        }
    }

    #[test]
    fn windows_are_whole_periods_shifted_by_the_offset_and_claimed_early_by_the_tolerance() {
        let hourly = spec(3600, 600, 60);
        assert_eq!(hourly.window_at(at(7200 + 600)), at(7200 + 600));
        assert_eq!(hourly.window_at(at(7200 + 500)), at(3600 + 600));
        // Within the tolerance before a start: that window already.
        assert_eq!(hourly.window_at(at(7200 + 540)), at(7200 + 600));
        assert_eq!(hourly.window_at(at(7200 + 539)), at(3600 + 600));
        assert_eq!(
            hourly.until_next_window(at(7200 + 600)),
            Duration::from_secs(3600)
        );
        assert_eq!(
            hourly.until_next_window(at(7200 + 599)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn reasons_follow_the_claim_condition() {
        // Never claimed.
        assert_eq!(state(100, 100, None).skip(), None);
        // This window finished, whatever the hold.
        let done = state(130, 100, Some((100, Some(101), 110))).skip();
        assert!(
            matches!(done, Some(Skip::AlreadyRan { run: 7, .. })),
            "{done:?}"
        );
        // An earlier window finished, its min hold not over yet.
        let soon = state(101, 100, Some((40, Some(41), 105))).skip();
        assert_eq!(
            soon,
            Some(Skip::TooSoon {
                run: 7,
                until: at(105)
            })
        );
        // An earlier window finished and its hold is over.
        assert_eq!(state(106, 100, Some((40, Some(41), 105))).skip(), None);
        // Unfinished, not expired: running (this window or an earlier one).
        for window_start in [40, 100] {
            let running = state(101, 100, Some((window_start, None, 150))).skip();
            assert!(matches!(running, Some(Skip::Running { .. })), "{running:?}");
        }
        // Unfinished and expired: this window may be retried.
        assert_eq!(state(151, 100, Some((100, None, 150))).skip(), None);
    }

    #[test]
    fn finishing_holds_until_the_min_hold_and_giving_up_never_lengthens_a_claim() {
        let spec = spec(60, 0, 0);
        let mut claimed = state(100, 60, None).claimed(&spec, "w");
        assert_eq!((claimed.runs, claimed.hold_until), (1, at(150)));
        let mut abandoned = claimed.clone();
        claimed.finish(&spec, at(101));
        assert_eq!(
            (claimed.finished_at, claimed.hold_until),
            (Some(at(101)), at(105))
        );
        abandoned.abandon(&spec, at(101));
        assert_eq!(
            (abandoned.finished_at, abandoned.hold_until),
            (None, at(105))
        );
        abandoned.abandon(&spec, at(120));
        assert_eq!(abandoned.hold_until, at(105), "never later than it was");
    }

    #[test]
    fn extending_holds_from_now_up_to_the_limit_and_never_shortens() {
        // Claimed at 100: max hold 50 (until 150), max total hold 80 (never past 180).
        let spec = spec(60, 0, 0);
        let mut record = state(100, 60, None).claimed(&spec, "w");
        assert_eq!(record.hold_until, at(150));
        let grown = record.extend(&spec, at(120), Duration::from_secs(40));
        assert_eq!((grown.hold_until, grown.capped), (at(160), false));
        assert_eq!((record.extensions, record.extended_at), (1, Some(at(120))));
        // Less than it already holds: unchanged, not shortened.
        let same = record.extend(&spec, at(121), Duration::from_secs(1));
        assert_eq!((same.hold_until, same.capped), (at(160), false));
        // Past the limit: capped at the claim plus the max total hold.
        let capped = record.extend(&spec, at(150), Duration::from_secs(60));
        assert_eq!((capped.hold_until, capped.capped), (at(180), true));
        assert_eq!(record.extensions, 3);
    }
}
