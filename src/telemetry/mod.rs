//! Names of the `tracing` spans and fields pglock emits.
//!
//! pglock speaks `tracing` only. To export its spans to OpenTelemetry, install
//! `tracing-opentelemetry` in your application's subscriber: each span below becomes an
//! OpenTelemetry span with the same name, and each field an attribute with the same key.
//!
//! | span | covers | fields |
//! | --- | --- | --- |
//! | [`ACQUIRE_SPAN`] | one `acquire` or `acquire_shared` call: the wait only, never the hold | [`KEY`], [`LOCK_ID`], [`MODE`], [`TIMEOUT_MS`] (absent when unbounded), [`HOLDER_ID`], [`OUTCOME`], [`WAITED_MS`] |
//! | [`TRY_ACQUIRE_SPAN`] | one `try_acquire` or `try_acquire_shared` call | [`KEY`], [`LOCK_ID`], [`MODE`], [`HOLDER_ID`], [`OUTCOME`] |
//! | [`RELEASE_SPAN`] | one release: by guard, by key, by `release_all`, or after a drop | [`KEY`], [`LOCK_ID`], [`MODE`], [`HOLDER_ID`], [`RELEASE_VIA`], [`OUTCOME`] |
//! | [`LOST_SPAN`] | a held lock declared lost (`WARN` level, with a `WARN` event) | [`KEY`], [`LOCK_ID`], [`MODE`], [`HOLDER_ID`], [`CAUSE`] |
//!
//! Every span's fields are declared when it opens and [`OUTCOME`] is recorded when it closes,
//! including [`outcome::CANCELLED`] when the caller dropped the future. Failures also set
//! `otel.status_code` to `ERROR`, which `tracing-opentelemetry` maps to the span status.
//! Spans are emitted at `INFO` level and can be switched off per manager with the builders'
//! `tracing(false)`.

// What emits these names: the managers' spans, and the instruments of the `metrics` feature.
pub(crate) mod instruments;
pub(crate) mod spans;

/// What every builder is told about telemetry: whether to emit spans, and which metrics to
/// record. Set through [`telemetry_setters!`], the same four setters on every builder.
pub(crate) struct Telemetry {
    pub(crate) tracing: bool,
    pub(crate) meter: instruments::MeterChoice,
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry {
            tracing: true,
            meter: instruments::MeterChoice::default(),
        }
    }
}

/// The telemetry setters of every builder (the managers', the leader election's, the
/// scheduled job's, the semaphore's), meaning the same on each: spans and metrics. Expands
/// inside the builder's `impl` block; `$($field).+` names the builder's [`Telemetry`].
macro_rules! telemetry_setters {
    ($($field:ident).+) => {
        /// Whether to emit spans and events (their names: [`telemetry`](crate::telemetry)).
        /// Default: on.
        pub fn tracing(mut self, enabled: bool) -> Self {
            self.$($field).+.tracing = enabled;
            self
        }

        /// Records the [metrics](crate::telemetry::metrics) through `meter`. Default:
        /// `opentelemetry::global::meter("pglock")`.
        #[cfg(feature = "metrics")]
        #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
        pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
            self.$($field).+.meter.meter = Some(meter);
            self
        }

        /// Whether to record the [metrics](crate::telemetry::metrics) at all. Off, no
        /// instruments are made and the clock is read only for deadlines (and for spans a
        /// subscriber wants), as without the `metrics` feature. Default: on.
        #[cfg(feature = "metrics")]
        #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
        pub fn metrics(mut self, enabled: bool) -> Self {
            self.$($field).+.meter.disabled = !enabled;
            self
        }

        /// Puts the holder id (the lock manager's) on every metric series as the
        /// `pglock.holder_id` attribute. Turn it on only when holder ids are few and stable:
        /// each distinct id is a new set of series (see
        /// [`telemetry::metrics`](crate::telemetry::metrics#cardinality)). Default: off.
        #[cfg(feature = "metrics")]
        #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
        pub fn metrics_holder_id(mut self, enabled: bool) -> Self {
            self.$($field).+.meter.holder_id = enabled;
            self
        }
    };
}
pub(crate) use telemetry_setters;

/// Records how an operation's span ended: the outcome it finished with, or
/// [`outcome::CANCELLED`] when its future was dropped first.
///
/// Every span of this crate and of `pglock-migration` declares an outcome field and records it
/// this way; it is public so that crates built on pglock can give their spans the same shape.
///
/// ```
/// use pglock::telemetry::SpanOutcome;
///
/// let span = tracing::info_span!("my.operation", my.outcome = tracing::field::Empty);
/// let mut outcome = SpanOutcome::new(span, "my.outcome");
/// // ... the operation; if this future is dropped here, the span says "cancelled" ...
/// outcome.finish("done", false);
/// ```
#[derive(Debug)]
pub struct SpanOutcome {
    span: tracing::Span,
    field: &'static str,
    done: bool,
}

impl SpanOutcome {
    /// Watches `span`, whose outcome field is `field`.
    pub fn new(span: tracing::Span, field: &'static str) -> Self {
        SpanOutcome {
            span,
            field,
            done: false,
        }
    }

    /// The span.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Records `outcome`, and `otel.status_code = ERROR` when the operation `failed`.
    pub fn finish(&mut self, outcome: &'static str, failed: bool) {
        self.span.record(self.field, outcome);
        if failed {
            self.span.record("otel.status_code", "ERROR");
        }
        self.done = true;
    }
}

impl Drop for SpanOutcome {
    fn drop(&mut self) {
        if !self.done {
            self.span.record(self.field, outcome::CANCELLED);
        }
    }
}

/// Span around the wait of one blocking acquisition.
pub const ACQUIRE_SPAN: &str = "pglock.acquire";
/// Span around one non-blocking acquisition.
pub const TRY_ACQUIRE_SPAN: &str = "pglock.try_acquire";
/// Span around one release.
pub const RELEASE_SPAN: &str = "pglock.release";
/// Span (at `WARN` level, with a `WARN` event inside) emitted when a held lock is declared lost.
pub const LOST_SPAN: &str = "pglock.lost";

/// Field: the lock key, as given.
pub const KEY: &str = "pglock.key";
/// Field: the advisory lock id derived from the key ([`lock_id`](crate::lock_id)).
pub const LOCK_ID: &str = "pglock.lock_id";
/// Field: the requested timeout in milliseconds; not recorded when the wait is unbounded.
pub const TIMEOUT_MS: &str = "pglock.timeout_ms";
/// Field: the manager's holder id, when it has one. On spans always; on metrics only when the
/// builder opted in (see [`metrics`](self::metrics#cardinality)).
pub const HOLDER_ID: &str = "pglock.holder_id";
/// Field: how the call ended; one of the [`outcome`] values.
pub const OUTCOME: &str = "pglock.outcome";
/// Field: milliseconds spent waiting, recorded when an acquisition ends.
pub const WAITED_MS: &str = "pglock.waited_ms";
/// Field: the lock mode, `exclusive` or `shared` ([`LockMode::as_str`](crate::LockMode::as_str)).
pub const MODE: &str = "pglock.mode";
/// Field: why a lock was declared lost. Spans carry the [`LossCause`](crate::LossCause) as its
/// English sentence (its `Display`); metrics carry its stable label,
/// [`LossCause::as_str`](crate::LossCause::as_str) (`not_on_server`, `unverifiable`,
/// `session_closed`, `simulated`).
pub const CAUSE: &str = "pglock.cause";
/// Field: what started a release; one of the [`via`] values.
pub const RELEASE_VIA: &str = "pglock.release_via";

/// Values of the [`OUTCOME`] field.
pub mod outcome {
    /// The lock was granted.
    pub const ACQUIRED: &str = "acquired";
    /// `try_acquire` found the lock held.
    pub const BUSY: &str = "busy";
    /// The deadline passed first.
    pub const TIMEOUT: &str = "timeout";
    /// The lock was released and the release confirmed.
    pub const RELEASED: &str = "released";
    /// The lock went straight to another task of the same manager that was waiting for it,
    /// without an unlock on the server.
    pub const HANDED_OVER: &str = "handed_over";
    /// A guard's release found its acquisition already released through the manager.
    pub const ALREADY_RELEASED: &str = "already_released";
    /// `release` named a key the manager does not hold.
    pub const NOT_HELD: &str = "not_held";
    /// The operation failed; the span's error status and events say why.
    pub const ERROR: &str = "error";
    /// The caller dropped the future before it finished.
    pub const CANCELLED: &str = "cancelled";
    /// A guard's release found its lock had been declared lost.
    pub const LOST: &str = "lost";
}

/// Values of the [`RELEASE_VIA`] field.
pub mod via {
    /// [`LockGuard::release`](crate::LockGuard::release).
    pub const GUARD: &str = "guard";
    /// A dropped guard, released in the background.
    pub const DROP: &str = "drop";
    /// [`LockManagerExt::release`](crate::LockManagerExt::release).
    pub const KEY: &str = "key";
    /// [`LockManager::release_all`](crate::LockManager::release_all).
    pub const RELEASE_ALL: &str = "release_all";
}

/// Names of the OpenTelemetry metrics recorded with the `metrics` feature: the lock managers',
/// the leader elections', the scheduled jobs' and the semaphores'.
///
/// | instrument | kind | unit | attributes |
/// | --- | --- | --- | --- |
/// | [`ACQUIRE_WAIT`](metrics::ACQUIRE_WAIT) | histogram | s | [`OPERATION`](metrics::OPERATION), [`MODE`], [`OUTCOME`] |
/// | [`ACQUISITIONS`](metrics::ACQUISITIONS) | counter | | the same |
/// | [`HOLD_DURATION`](metrics::HOLD_DURATION) | histogram | s | [`MODE`] |
/// | [`HELD`](metrics::HELD) | up-down counter (a gauge of locks held) | | none |
/// | [`BUDGET`](metrics::BUDGET) | gauge: the most locks the manager may hold at once | | none |
/// | [`LOST`](metrics::LOST) | counter | | [`CAUSE`] |
/// | [`LEADER_IS_LEADER`](metrics::LEADER_IS_LEADER) | up-down counter: 1 while the candidate leads, else 0 | | [`ELECTION`](leader::ELECTION) |
/// | [`LEADER_TERMS`](metrics::LEADER_TERMS) | counter: terms won | | [`ELECTION`](leader::ELECTION) |
/// | [`LEADER_TERMS_ENDED`](metrics::LEADER_TERMS_ENDED) | counter: terms ended | | [`ELECTION`](leader::ELECTION), [`leader::OUTCOME`] |
/// | [`LEADER_VACANCY`](metrics::LEADER_VACANCY) | histogram: time to a new leader, an upper bound | s | [`ELECTION`](leader::ELECTION) |
/// | [`JOB_RUNS`](metrics::JOB_RUNS) | counter: calls of `run` that did not skip | | [`JOB`](job::JOB), [`job::OUTCOME`] |
/// | [`JOB_SKIPS`](metrics::JOB_SKIPS) | counter | | [`JOB`](job::JOB), [`REASON`](job::REASON) |
/// | [`JOB_OVERRUNS`](metrics::JOB_OVERRUNS) | counter: bodies cut off at the end of their hold (the max hold, or later once extended) | | [`JOB`](job::JOB) |
/// | [`JOB_EXTENSIONS`](metrics::JOB_EXTENSIONS) | counter | | [`JOB`](job::JOB), [`job::OUTCOME`] ([`job::extension`] values) |
/// | [`SEMAPHORE_ACQUISITIONS`](metrics::SEMAPHORE_ACQUISITIONS) | counter: permits asked for | | [`SEMAPHORE`](semaphore::SEMAPHORE), [`OPERATION`](metrics::OPERATION), [`OUTCOME`] |
/// | [`SEMAPHORE_WAIT`](metrics::SEMAPHORE_WAIT) | histogram: the wait for a permit | s | the same |
/// | [`SEMAPHORE_HELD`](metrics::SEMAPHORE_HELD) | up-down counter: permits held through the process's handles | | [`SEMAPHORE`](semaphore::SEMAPHORE) |
///
/// [`ALL`](metrics::ALL) lists the same, for code: dashboards and their tests check their
/// queries against it.
///
/// The managers, elections, jobs and semaphores record through the meter given to their builders' `meter`
/// method, or through `opentelemetry::global::meter("pglock")`, so installing a global
/// `MeterProvider` is enough.
///
/// # Cardinality
///
/// Every attribute value comes from a short fixed list, so a manager produces a bounded number
/// of series whatever its keys and holders: keys are never attributes, and [`CAUSE`] is
/// [`LossCause::as_str`](crate::LossCause::as_str), a stable machine-readable label, never a
/// sentence. The holder id is left out by default: the generated one is unique per process and
/// per manager, so with it every restart and every replica would open new series. Opt in with
/// the builders' `metrics_holder_id(true)` (every builder has it) when your holder
/// ids are few and stable (pod names of a fixed set, say); every series of that manager or
/// election then also carries [`HOLDER_ID`].
///
/// The election and job names are attributes: they are fixed by your application's code (one
/// per election, one per job), so they add a few series each, not one per run or term. Do not
/// build them from ids, keys or tokens. Run numbers, fencing tokens and windows are never
/// attributes; the spans carry them.
///
/// # Hold time
///
/// [`HOLD_DURATION`](metrics::HOLD_DURATION) records, for every acquisition let go through a
/// release (of a guard, by key, by `release_all`, or of a dropped guard), the time from its
/// grant to the release. A lock handed straight to another task of the same manager counts as
/// released by the first task and granted to the next. Locks declared lost are counted by
/// [`LOST`](metrics::LOST) instead and are not in the histogram.
///
/// # Leadership
///
/// [`LEADER_IS_LEADER`](metrics::LEADER_IS_LEADER) is an up-down counter, so candidates of one
/// election in one process add up instead of overwriting each other: every candidate shows 0
/// from its start, +1 while it leads, and is back to 0 when its term ends, however it ends
/// (resigned, dropped, lost, or its campaign dropped with its runtime). It follows
/// [`LeaderElection::is_leader`](crate::LeaderElection::is_leader): on a graceful end it drops
/// to 0 when the candidate steps down, before the leader work is drained and the lock
/// released. Summed over the fleet, it says how many candidates lead each election.
///
/// [`LEADER_VACANCY`](metrics::LEADER_VACANCY), the time to a new leader, is recorded by the
/// candidate that wins, once per term: the time from its last attempt that found the lock
/// taken (or, if none did since, from the start of its campaign or the end of its own previous
/// term) to its win. It is an upper bound of how long the office was vacant as this candidate
/// saw it: the lock may have been freed any time after that attempt, and a campaign polls only
/// every retry interval plus jitter, so the value can exceed the true vacancy by up to one such
/// wait. A candidate that wins at its first attempt records how long that attempt took.
///
/// # Scheduled jobs
///
/// Every call of [`ScheduledJob::run`](crate::schedule::ScheduledJob::run) counts once: a skip
/// in [`JOB_SKIPS`](metrics::JOB_SKIPS) by [`Skip::as_str`](crate::schedule::Skip::as_str),
/// anything else in [`JOB_RUNS`](metrics::JOB_RUNS) by the span's outcome (a dropped future
/// counts as `cancelled`). [`JOB_OVERRUNS`](metrics::JOB_OVERRUNS) counts the bodies cut off at
/// the end of their hold (the max hold, or later once extended) when they are cut off, even if the run is then dropped before it returns.
///
/// # Buckets
///
/// The histograms are in seconds, with bucket bounds from 0.5 ms to one hour (0.0005, 0.001,
/// 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600).
/// A view in your `MeterProvider` can replace them.
pub mod metrics {
    use super::{CAUSE, HOLDER_ID, MODE, OUTCOME, job, leader, semaphore};

    /// Histogram of the time acquisitions spent waiting, in seconds.
    pub const ACQUIRE_WAIT: &str = "pglock.acquire.wait";
    /// Counter of acquisition attempts.
    pub const ACQUISITIONS: &str = "pglock.acquisitions";
    /// Histogram of how long locks were held, from grant to release, in seconds.
    pub const HOLD_DURATION: &str = "pglock.hold.duration";
    /// Up-down counter of the locks held now.
    pub const HELD: &str = "pglock.locks.held";
    /// Gauge of the manager's budget of held locks, once it is known.
    pub const BUDGET: &str = "pglock.locks.budget";
    /// Counter of held locks declared lost.
    pub const LOST: &str = "pglock.locks.lost";
    /// Up-down counter: 1 while the candidate leads its election, 0 otherwise.
    pub const LEADER_IS_LEADER: &str = "pglock.leader.is_leader";
    /// Counter of leadership terms won.
    pub const LEADER_TERMS: &str = "pglock.leader.terms";
    /// Counter of leadership terms ended, by [`leader::OUTCOME`].
    pub const LEADER_TERMS_ENDED: &str = "pglock.leader.terms.ended";
    /// Histogram, in seconds, of how long the office was vacant before this candidate won it:
    /// an upper bound (see [Leadership](self#leadership)).
    pub const LEADER_VACANCY: &str = "pglock.leader.vacancy";
    /// Counter of scheduled runs that did not skip, by [`job::OUTCOME`].
    pub const JOB_RUNS: &str = "pglock.job.runs";
    /// Counter of skipped runs, by [`job::REASON`].
    pub const JOB_SKIPS: &str = "pglock.job.skips";
    /// Counter of job bodies cut off at the end of their hold (the max hold, or later once
    /// extended).
    pub const JOB_OVERRUNS: &str = "pglock.job.overruns";
    /// Counter of requests to extend a running job's hold, by [`job::OUTCOME`] (one of the
    /// [`job::extension`] values).
    pub const JOB_EXTENSIONS: &str = "pglock.job.extensions";
    /// Counter of semaphore permits asked for, by [`OPERATION`] and [`OUTCOME`].
    pub const SEMAPHORE_ACQUISITIONS: &str = "pglock.semaphore.acquisitions";
    /// Histogram, in seconds, of the wait for a semaphore permit, by [`OPERATION`] and
    /// [`OUTCOME`].
    pub const SEMAPHORE_WAIT: &str = "pglock.semaphore.wait";
    /// Up-down counter of the permits held right now through the process's handles (leaked
    /// permits are the manager's, and no longer counted).
    pub const SEMAPHORE_HELD: &str = "pglock.semaphore.permits.held";
    /// Attribute: which operation, [`ACQUIRE`] or [`TRY_ACQUIRE`].
    pub const OPERATION: &str = "pglock.operation";
    /// `acquire` and `acquire_shared`; a semaphore's `acquire`.
    pub const ACQUIRE: &str = "acquire";
    /// `try_acquire` and `try_acquire_shared`; a semaphore's `try_acquire`.
    pub const TRY_ACQUIRE: &str = "try_acquire";

    /// The kind of an OpenTelemetry instrument, which decides how exporters aggregate and name
    /// it (a Prometheus counter gets `_total`, a histogram `_bucket`, `_sum` and `_count`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[non_exhaustive]
    pub enum Kind {
        /// A monotonic sum.
        Counter,
        /// A sum that goes up and down; exported as a gauge.
        UpDownCounter,
        /// The last value recorded.
        Gauge,
        /// A distribution over the [buckets](self#buckets).
        Histogram,
    }

    /// One metric this crate records: what a dashboard or an alert may refer to.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct Instrument {
        /// Its name, one of the constants above.
        pub name: &'static str,
        /// Its kind.
        pub kind: Kind,
        /// Its unit (`s` for seconds), if it has one.
        pub unit: Option<&'static str>,
        /// Every attribute its series may carry ([`HOLDER_ID`] only where it is opted in).
        pub attributes: &'static [&'static str],
    }

    const fn instrument(
        name: &'static str,
        kind: Kind,
        unit: Option<&'static str>,
        attributes: &'static [&'static str],
    ) -> Instrument {
        Instrument {
            name,
            kind,
            unit,
            attributes,
        }
    }

    const SECONDS: Option<&str> = Some("s");

    /// Every metric of the crate, the managers', elections', jobs' and semaphores'.
    pub const ALL: &[Instrument] = &[
        instrument(
            ACQUIRE_WAIT,
            Kind::Histogram,
            SECONDS,
            &[OPERATION, MODE, OUTCOME, HOLDER_ID],
        ),
        instrument(
            ACQUISITIONS,
            Kind::Counter,
            None,
            &[OPERATION, MODE, OUTCOME, HOLDER_ID],
        ),
        instrument(HOLD_DURATION, Kind::Histogram, SECONDS, &[MODE, HOLDER_ID]),
        instrument(HELD, Kind::UpDownCounter, None, &[HOLDER_ID]),
        instrument(BUDGET, Kind::Gauge, None, &[HOLDER_ID]),
        instrument(LOST, Kind::Counter, None, &[CAUSE, HOLDER_ID]),
        instrument(
            LEADER_IS_LEADER,
            Kind::UpDownCounter,
            None,
            &[leader::ELECTION, HOLDER_ID],
        ),
        instrument(
            LEADER_TERMS,
            Kind::Counter,
            None,
            &[leader::ELECTION, HOLDER_ID],
        ),
        instrument(
            LEADER_TERMS_ENDED,
            Kind::Counter,
            None,
            &[leader::ELECTION, leader::OUTCOME, HOLDER_ID],
        ),
        instrument(
            LEADER_VACANCY,
            Kind::Histogram,
            SECONDS,
            &[leader::ELECTION, HOLDER_ID],
        ),
        instrument(
            JOB_RUNS,
            Kind::Counter,
            None,
            &[job::JOB, job::OUTCOME, HOLDER_ID],
        ),
        instrument(
            JOB_SKIPS,
            Kind::Counter,
            None,
            &[job::JOB, job::REASON, HOLDER_ID],
        ),
        instrument(JOB_OVERRUNS, Kind::Counter, None, &[job::JOB, HOLDER_ID]),
        instrument(
            JOB_EXTENSIONS,
            Kind::Counter,
            None,
            &[job::JOB, job::OUTCOME, HOLDER_ID],
        ),
        instrument(
            SEMAPHORE_ACQUISITIONS,
            Kind::Counter,
            None,
            &[semaphore::SEMAPHORE, OPERATION, OUTCOME, HOLDER_ID],
        ),
        instrument(
            SEMAPHORE_WAIT,
            Kind::Histogram,
            SECONDS,
            &[semaphore::SEMAPHORE, OPERATION, OUTCOME, HOLDER_ID],
        ),
        instrument(
            SEMAPHORE_HELD,
            Kind::UpDownCounter,
            None,
            &[semaphore::SEMAPHORE, HOLDER_ID],
        ),
    ];
}

/// Names of the spans and fields emitted by [`LeaderElection`](crate::LeaderElection).
///
/// | span | covers | fields |
/// | --- | --- | --- |
/// | [`TERM_SPAN`](crate::telemetry::leader::TERM_SPAN) | one leadership term, from the acquisition to the step-down | [`KEY`], [`LOCK_ID`], [`HOLDER_ID`], [`FENCING_TOKEN`](crate::telemetry::leader::FENCING_TOKEN), [`OUTCOME`](crate::telemetry::leader::OUTCOME), [`CAUSE`] (when lost), [`TERM_MS`](crate::telemetry::leader::TERM_MS) |
///
/// Inside the term span: an `INFO` event `became leader` when it opens, and at its end an
/// `INFO` event `resigned` or a `WARN` event `leadership lost`. A term that ends without the
/// election's consent (lost, or released through the manager), or whose final release was not
/// confirmed, sets `otel.status_code = ERROR`. The lock manager's release span
/// nests inside the term span. A failed campaign attempt (database unreachable) is a `WARN`
/// event with [`KEY`] and [`HOLDER_ID`], outside any term. Attempts that find the lock held emit
/// nothing here; the manager's own [`TRY_ACQUIRE_SPAN`] (outcome `busy`) records each of them
/// unless its tracing is off. Switch the election's own spans off with
/// [`LeaderElectionBuilder::tracing`](crate::leader::LeaderElectionBuilder::tracing).
pub mod leader {
    /// Span around one leadership term (`INFO`; `ERROR` status when the term ends in a loss).
    pub const TERM_SPAN: &str = "pglock.leader.term";

    /// Field: the fencing token of the term's acquisition, when the manager mints them.
    pub const FENCING_TOKEN: &str = "pglock.leader.fencing_token";
    /// Field: how the term ended; one of the [`outcome`] values.
    pub const OUTCOME: &str = "pglock.leader.outcome";
    /// Field: how long the term lasted, in milliseconds.
    pub const TERM_MS: &str = "pglock.leader.term_ms";
    /// Metric attribute: the election's name, as given to
    /// [`LeaderElection::builder`](crate::LeaderElection::builder) (without the `leader:`
    /// prefix of its key). Names are fixed by the application's code, so series stay few.
    pub const ELECTION: &str = "pglock.leader.election";

    /// Values of the [`OUTCOME`] field.
    pub mod outcome {
        /// [`LeaderElection::resign`](crate::LeaderElection::resign) released the lock.
        pub const RESIGNED: &str = "resigned";
        /// The election's handle was dropped, and its campaign released the lock.
        pub const DROPPED: &str = "dropped";
        /// The manager declared the lock lost ([`CAUSE`](crate::telemetry::CAUSE) says why).
        pub const LOST: &str = "lost";
        /// The lock was released through the manager (`release` or `release_all`), not by
        /// the election.
        pub const RELEASED_ELSEWHERE: &str = "released_elsewhere";
    }
}

/// Names of the span and fields emitted by [`ScheduledJob::run`](crate::schedule::ScheduledJob::run).
///
/// | span | covers | fields |
/// | --- | --- | --- |
/// | [`RUN_SPAN`](job::RUN_SPAN) | one call of `run`: the check, the claim, the body, the record | [`JOB`](job::JOB), [`WINDOW_START`](job::WINDOW_START), [`RUN`](job::RUN) (when claimed), [`HOLDER_ID`], [`OUTCOME`](job::OUTCOME) |
///
/// The job lock's own acquire and release spans nest inside it. A run that was cut off, lost
/// its lock or failed sets `otel.status_code = ERROR`.
pub mod job {
    /// Span around one attempt to run a scheduled job.
    pub const RUN_SPAN: &str = "pglock.job.run";
    /// Field: the job's name.
    pub const JOB: &str = "pglock.job";
    /// Field: the start of the window, RFC 3339 (the claimed one, or the one a claim would
    /// have been for).
    pub const WINDOW_START: &str = "pglock.job.window_start";
    /// Field: the run number of the claim.
    pub const RUN: &str = "pglock.job.run_number";
    /// Field: how the attempt ended; one of the [`outcome`] values. On
    /// [`JOB_EXTENSIONS`](super::metrics::JOB_EXTENSIONS), one of the [`extension`] values.
    pub const OUTCOME: &str = "pglock.job.outcome";
    /// Metric attribute: why a run skipped, [`Skip::as_str`](crate::schedule::Skip::as_str).
    pub const REASON: &str = "pglock.job.reason";

    /// Values of the [`OUTCOME`] field. Skips use
    /// [`Skip::as_str`](crate::schedule::Skip::as_str): `already_ran`, `running`, `too_soon`,
    /// `busy`.
    pub mod outcome {
        /// The body ran to completion.
        pub const RAN: &str = "ran";
        /// The body was cut off at the max hold.
        pub const OVERRAN: &str = "overran";
        /// The job's lock was lost and the body cancelled.
        pub const LOST: &str = "lost";
        /// The attempt failed; the span's error status and events say why.
        pub const ERROR: &str = "error";
        /// The caller dropped the future.
        pub const CANCELLED: &str = "cancelled";
    }

    /// Values of the [`OUTCOME`] attribute of
    /// [`JOB_EXTENSIONS`](super::metrics::JOB_EXTENSIONS): how a request to extend a running
    /// job's hold ended.
    pub mod extension {
        /// The hold was extended as asked.
        pub const EXTENDED: &str = "extended";
        /// The hold was extended, but less than asked: up to its limit.
        pub const CAPPED: &str = "capped";
        /// The hold was not extended.
        pub const REFUSED: &str = "refused";
    }
}

/// Names of the spans and fields emitted by [`Semaphore`](crate::semaphore::Semaphore).
///
/// | span | covers | fields |
/// | --- | --- | --- |
/// | [`ACQUIRE_SPAN`](semaphore::ACQUIRE_SPAN) | one `acquire` (or the acquisition of `with_permit`): the wait only | [`SEMAPHORE`](semaphore::SEMAPHORE), [`PERMITS`](semaphore::PERMITS), [`HOLDER_ID`], [`TIMEOUT_MS`] (absent when unbounded), [`OUTCOME`], [`WAITED_MS`], [`SLOT`](semaphore::SLOT) (when acquired) |
/// | [`TRY_ACQUIRE_SPAN`](semaphore::TRY_ACQUIRE_SPAN) | one `try_acquire` (or `try_with_permit`'s) | the same, without [`TIMEOUT_MS`] |
///
/// [`OUTCOME`] is one of [`outcome`]'s `acquired`, `busy`, `timeout`, `error` or `cancelled`.
/// The lock manager's own spans for the turnstile and the slots nest inside. Switch them off
/// with [`SemaphoreBuilder::tracing`](crate::semaphore::SemaphoreBuilder::tracing).
pub mod semaphore {
    /// Span around the wait of one permit.
    pub const ACQUIRE_SPAN: &str = "pglock.semaphore.acquire";
    /// Span around one try for a permit.
    pub const TRY_ACQUIRE_SPAN: &str = "pglock.semaphore.try_acquire";
    /// Field and metric attribute: the semaphore's name, as given to
    /// [`Semaphore::builder`](crate::semaphore::Semaphore::builder). Names are fixed by the
    /// application's code, so series stay few.
    pub const SEMAPHORE: &str = "pglock.semaphore";
    /// Field: how many permits the semaphore has.
    pub const PERMITS: &str = "pglock.semaphore.permits";
    /// Field: the slot of the permit granted.
    pub const SLOT: &str = "pglock.semaphore.slot";
}
