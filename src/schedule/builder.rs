//! Configuring a scheduled job, and refusing settings that cannot work.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Error, Result};
use super::{Inner, JobSpec, JobStore, ScheduledJob};
use crate::LockManager;
use crate::telemetry::Telemetry;
use crate::telemetry::instruments::JobMetrics;

/// The longest period or hold accepted: a hundred years.
const LONGEST: Duration = Duration::from_secs(100 * 366 * 24 * 3600);
/// The shortest period accepted.
const SHORTEST_PERIOD: Duration = Duration::from_millis(1);
/// The longest job name accepted, in bytes (it is the table's primary key).
const LONGEST_NAME: usize = 1024;

/// Builds a [`ScheduledJob`]. Every replica must build the job with the same settings.
#[must_use = "a builder does nothing until `build` is called"]
pub struct ScheduledJobBuilder {
    pub(super) locks: Arc<dyn LockManager>,
    pub(super) store: Arc<dyn JobStore>,
    pub(super) name: String,
    pub(super) period: Duration,
    pub(super) offset: Duration,
    pub(super) tolerance: Option<Duration>,
    pub(super) min_hold: Option<Duration>,
    pub(super) max_hold: Option<Duration>,
    pub(super) max_total_hold: Option<Duration>,
    pub(super) telemetry: Telemetry,
}

impl ScheduledJobBuilder {
    /// Shifts the windows by `offset` from the whole periods since the Unix epoch (UTC): a
    /// period of one day with an offset of 2 hours starts each window at 02:00 UTC. Must be
    /// shorter than the period. Default: zero.
    pub fn offset(mut self, offset: Duration) -> Self {
        self.offset = offset;
        self
    }

    /// How long before a window's start a claim already counts for that window, so replicas
    /// whose clocks run ahead of the database's, or that wake a little early, still run the
    /// window they meant. Must be shorter than the period. Default: a tenth of the period, at
    /// most 5 seconds.
    pub fn skew_tolerance(mut self, tolerance: Duration) -> Self {
        self.tolerance = Some(tolerance);
        self
    }

    /// How long after a run starts no other run may start, however soon it finishes
    /// (ShedLock's `lockAtLeastFor`). Must not exceed the max hold. Default: half the period,
    /// or the max hold if that is shorter.
    pub fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// How long a run may hold the job (ShedLock's `lockAtMostFor`): its body is cut off when
    /// this has passed, and a claim whose runner died expires after it. Make it longer than
    /// the longest run you expect, and longer than the manager's
    /// [`probe_interval`](crate::PostgresLockManagerBuilder::probe_interval) plus
    /// [`probe_grace`](crate::PostgresLockManagerBuilder::probe_grace) of a
    /// [`PostgresLockManager`](crate::PostgresLockManager), so that a runner cut off from the
    /// database has noticed before its claim expires. Default: the period.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// How long a run may hold the job at most, counted from its claim, when it extends its
    /// hold with [`JobRun::extend`](super::JobRun::extend) (ShedLock's `LockExtender`, with a
    /// bound): a run that keeps extending is cut off once this has passed, so a stuck job that
    /// keeps calling `extend` cannot hold the job for ever. Must not be shorter than the max
    /// hold. Default: the max hold, so runs cannot extend.
    pub fn max_total_hold(mut self, max_total_hold: Duration) -> Self {
        self.max_total_hold = Some(max_total_hold);
        self
    }

    crate::telemetry::telemetry_setters!(telemetry);

    /// Checks the settings and builds the job. Nothing touches the database yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidSchedule`] when the name is empty, longer than 1024 bytes or contains a
    /// NUL byte; when the period is shorter than a millisecond; when the offset or the skew
    /// tolerance is not shorter than the period; when the max hold is zero or shorter than the
    /// min hold; when the max total hold is shorter than the max hold; or when a duration
    /// exceeds a hundred years.
    pub fn build(self) -> Result<ScheduledJob> {
        let Checked {
            period,
            tolerance,
            min_hold,
            max_hold,
            max_total_hold,
        } = self.checked().map_err(|reason| Error::InvalidSchedule {
            job: self.name.clone(),
            reason,
        })?;
        Ok(ScheduledJob {
            inner: Arc::new(Inner {
                key: format!("scheduled-job:{}", self.name).into(),
                metrics: JobMetrics::build(
                    self.telemetry.meter,
                    &self.name,
                    self.locks.holder_id(),
                ),
                tracing: self.telemetry.tracing,
                spec: JobSpec {
                    name: self.name,
                    period,
                    offset: self.offset,
                    skew_tolerance: tolerance,
                    min_hold,
                    max_hold,
                    max_total_hold,
                },
                locks: self.locks,
                store: self.store,
            }),
        })
    }

    /// The schedule's durations with their defaults filled in, checked against each other;
    /// `Err` says what is wrong.
    fn checked(&self) -> std::result::Result<Checked, String> {
        check_name(&self.name).map_err(str::to_owned)?;
        let period = self.period;
        if period < SHORTEST_PERIOD {
            return Err(format!("the period ({period:?}) must be at least 1 ms"));
        }
        let max_hold = self.max_hold.unwrap_or(period);
        let min_hold = self.min_hold.unwrap_or_else(|| (period / 2).min(max_hold));
        let max_total_hold = self.max_total_hold.unwrap_or(max_hold);
        let tolerance = self
            .tolerance
            .unwrap_or_else(|| (period / 10).min(Duration::from_secs(5)));
        for (what, value) in [
            ("period", period),
            ("offset", self.offset),
            ("skew tolerance", tolerance),
            ("min hold", min_hold),
            ("max hold", max_hold),
            ("max total hold", max_total_hold),
        ] {
            if value > LONGEST {
                return Err(format!(
                    "the {what} ({value:?}) is longer than a hundred years"
                ));
            }
        }
        if self.offset >= period {
            return Err(format!(
                "the offset ({:?}) must be shorter than the period ({period:?})",
                self.offset
            ));
        }
        if tolerance >= period {
            return Err(format!(
                "the skew tolerance ({tolerance:?}) must be shorter than the period ({period:?})"
            ));
        }
        if max_hold.is_zero() {
            return Err("the max hold must not be zero".to_owned());
        }
        if min_hold > max_hold {
            return Err(format!(
                "the min hold ({min_hold:?}) must not exceed the max hold ({max_hold:?})"
            ));
        }
        if max_total_hold < max_hold {
            return Err(format!(
                "the max total hold ({max_total_hold:?}) must not be shorter than the max hold \
                 ({max_hold:?})"
            ));
        }
        Ok(Checked {
            period,
            tolerance,
            min_hold,
            max_hold,
            max_total_hold,
        })
    }
}

/// A schedule's durations, checked (the offset is used as given).
struct Checked {
    period: Duration,
    tolerance: Duration,
    min_hold: Duration,
    max_hold: Duration,
    max_total_hold: Duration,
}

fn check_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("the job name is empty");
    }
    if name.len() > LONGEST_NAME {
        return Err("the job name is longer than 1024 bytes");
    }
    if name.contains('\0') {
        return Err("the job name contains a NUL byte, which PostgreSQL text cannot hold");
    }
    Ok(())
}

impl fmt::Debug for ScheduledJobBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledJobBuilder")
            .field("name", &self.name)
            .field("period", &self.period)
            .field("offset", &self.offset)
            .field("skew_tolerance", &self.tolerance)
            .field("min_hold", &self.min_hold)
            .field("max_hold", &self.max_hold)
            .field("max_total_hold", &self.max_total_hold)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// The defaults `docs/defaults.md` documents, as the code has them (see `defaults_table`):
/// each formula is stated only if the code follows it at both ends of its range.
#[cfg(test)]
pub(crate) fn documented_defaults() -> Vec<(&'static str, String)> {
    // Durations in their `Debug` form: `defaults_table` reads them.
    let duration = |value: Duration| format!("{value:?}");
    let spec = |period: Duration, max_hold: Option<Duration>| {
        let mut builder = ScheduledJob::builder(
            Arc::new(crate::InMemoryLockManager::new()),
            Arc::new(super::InMemoryJobStore::new()),
            "j",
            period,
        );
        if let Some(max_hold) = max_hold {
            builder = builder.max_hold(max_hold);
        }
        builder.build().expect("valid").spec().clone()
    };
    let secs = Duration::from_secs;
    let (long, short) = (spec(secs(300), None), spec(secs(10), None));
    let capped = spec(secs(10), Some(secs(2)));
    let or_else = |holds: bool, formula: &str, value: Duration| {
        if holds {
            formula.to_owned()
        } else {
            duration(value)
        }
    };
    vec![
        (
            "ScheduledJob skew_tolerance",
            or_else(
                long.skew_tolerance == secs(5) && short.skew_tolerance == secs(1),
                "period / 10, at most 5 s",
                long.skew_tolerance,
            ),
        ),
        (
            "ScheduledJob min_hold",
            or_else(
                long.min_hold == secs(150) && capped.min_hold == secs(2),
                "period / 2, at most max_hold",
                long.min_hold,
            ),
        ),
        (
            "ScheduledJob max_hold",
            or_else(long.max_hold == secs(300), "period", long.max_hold),
        ),
        (
            "ScheduledJob max_total_hold",
            or_else(
                long.max_total_hold == long.max_hold && capped.max_total_hold == secs(2),
                "max_hold",
                long.max_total_hold,
            ),
        ),
        (
            "ScheduledJob offset",
            or_else(long.offset.is_zero(), "0 s", long.offset),
        ),
        (
            "ScheduledJob period",
            format!("at least {}", duration(SHORTEST_PERIOD)),
        ),
        ("ScheduledJob name", format!("at most {LONGEST_NAME} bytes")),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder(name: &str, period: Duration) -> ScheduledJobBuilder {
        ScheduledJob::builder(
            Arc::new(crate::InMemoryLockManager::new()),
            Arc::new(super::super::InMemoryJobStore::new()),
            name,
            period,
        )
    }

    fn reason(result: Result<ScheduledJob>) -> String {
        match result {
            Err(Error::InvalidSchedule { reason, .. }) => reason,
            other => panic!("expected InvalidSchedule, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn settings_that_cannot_work_are_refused_with_the_reason() {
        let secs = Duration::from_secs;
        assert!(reason(builder("", secs(1)).build()).contains("empty"));
        assert!(reason(builder("a\0b", secs(1)).build()).contains("NUL"));
        assert!(reason(builder(&"x".repeat(1025), secs(1)).build()).contains("1024"));
        assert!(reason(builder("j", Duration::from_micros(999)).build()).contains("1 ms"));
        assert!(reason(builder("j", secs(10)).offset(secs(10)).build()).contains("offset"));
        let tolerance = builder("j", secs(10)).skew_tolerance(secs(10)).build();
        assert!(reason(tolerance).contains("skew tolerance"));
        assert!(reason(builder("j", secs(10)).max_hold(Duration::ZERO).build()).contains("zero"));
        let holds = builder("j", secs(10))
            .min_hold(secs(3))
            .max_hold(secs(2))
            .build();
        assert!(reason(holds).contains("must not exceed"));
        let long = builder("j", LONGEST + secs(1)).build();
        assert!(reason(long).contains("hundred years"));
        let short = builder("j", secs(60))
            .max_hold(secs(10))
            .max_total_hold(secs(9))
            .build();
        assert!(reason(short).contains("max total hold (9s) must not be shorter"));
    }

    #[tokio::test]
    async fn defaults_follow_the_period() {
        let job = builder("j", Duration::from_secs(300))
            .build()
            .expect("valid");
        let spec = job.spec();
        let secs = Duration::from_secs;
        assert_eq!(
            spec.skew_tolerance,
            secs(5),
            "a tenth of the period, at most 5 s"
        );
        assert_eq!((spec.min_hold, spec.max_hold), (secs(150), secs(300)));
        assert_eq!(
            spec.max_total_hold,
            secs(300),
            "no extension unless asked for"
        );
        let job = builder("j", Duration::from_secs(10))
            .max_hold(Duration::from_secs(2))
            .build()
            .expect("the default min hold shrinks to the max hold");
        assert_eq!(job.spec().min_hold, secs(2));
        assert_eq!(job.spec().skew_tolerance, secs(1));
        assert_eq!(job.lock_key(), "scheduled-job:j");
    }
}
