//! OpenTelemetry metrics, when the `metrics` feature is on; nothing at all otherwise. This
//! file holds the lock managers' instruments; the recipes' are in the modules below.

mod job;
mod leader;
mod semaphore;

use std::time::Duration;

pub(crate) use self::job::JobMetrics;
pub(crate) use self::leader::LeaderMetrics;
pub(crate) use self::semaphore::SemaphoreMetrics;

use crate::{LockMode, LossCause};

/// The instruments of one manager. Without the `metrics` feature this is an empty struct whose
/// methods compile to nothing.
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    #[cfg(feature = "metrics")]
    instruments: Option<std::sync::Arc<Instruments>>,
}

#[cfg(feature = "metrics")]
struct Instruments {
    wait: opentelemetry::metrics::Histogram<f64>,
    acquisitions: opentelemetry::metrics::Counter<u64>,
    held: opentelemetry::metrics::UpDownCounter<i64>,
    budget: opentelemetry::metrics::Gauge<u64>,
    lost: opentelemetry::metrics::Counter<u64>,
    hold: opentelemetry::metrics::Histogram<f64>,
    /// Only when the builder opted in: every distinct holder id is a new series.
    holder: Option<opentelemetry::KeyValue>,
}

/// What a builder was told about metrics: none at all, which meter (none: the global one),
/// and whether to put the holder id on every series. Nothing at all without the `metrics`
/// feature.
#[cfg(feature = "metrics")]
#[derive(Default)]
pub(crate) struct MeterChoice {
    pub(crate) disabled: bool,
    pub(crate) meter: Option<opentelemetry::metrics::Meter>,
    pub(crate) holder_id: bool,
}
#[cfg(not(feature = "metrics"))]
pub(crate) type MeterChoice = NoMeter;

/// Stands in for a meter without the `metrics` feature.
#[cfg(not(feature = "metrics"))]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoMeter;

/// Bucket bounds, in seconds, of every duration histogram. The SDK's default bounds (0 to
/// 10 000) are made for milliseconds: in seconds every short wait would land in one bucket.
#[cfg(feature = "metrics")]
const SECONDS_BUCKETS: [f64; 19] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0, 900.0, 3600.0,
];

impl Metrics {
    /// The instruments of a manager whose holder id is `holder_id`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn build(choice: MeterChoice, holder_id: &str) -> Self {
        #[cfg(feature = "metrics")]
        if choice.disabled {
            return Self::default();
        }
        #[cfg(feature = "metrics")]
        return Self::new(
            &choice
                .meter
                .unwrap_or_else(|| opentelemetry::global::meter("pglock")),
            choice.holder_id.then_some(holder_id),
        );
        #[cfg(not(feature = "metrics"))]
        Self::default()
    }

    /// Whether there are instruments to feed: durations measured only for them are not
    /// measured otherwise.
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.instruments.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    #[cfg(feature = "metrics")]
    fn new(meter: &opentelemetry::metrics::Meter, holder_id: Option<&str>) -> Self {
        use crate::telemetry::metrics as names;
        let instruments = Instruments {
            wait: meter
                .f64_histogram(names::ACQUIRE_WAIT)
                .with_unit("s")
                .with_description("Time spent waiting in acquire / try_acquire, by outcome")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build(),
            acquisitions: meter
                .u64_counter(names::ACQUISITIONS)
                .with_description("Acquisition attempts, by operation, mode and outcome")
                .build(),
            held: meter
                .i64_up_down_counter(names::HELD)
                .with_description("Locks held right now")
                .build(),
            budget: meter
                .u64_gauge(names::BUDGET)
                .with_description("How many locks the manager may hold at once")
                .build(),
            lost: meter
                .u64_counter(names::LOST)
                .with_description("Held locks declared lost, by cause")
                .build(),
            hold: meter
                .f64_histogram(names::HOLD_DURATION)
                .with_unit("s")
                .with_description("How long locks were held, from the grant to the release")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build(),
            holder: holder_id
                .map(|id| opentelemetry::KeyValue::new(crate::telemetry::HOLDER_ID, id.to_owned())),
        };
        Metrics {
            instruments: Some(std::sync::Arc::new(instruments)),
        }
    }

    /// One acquisition attempt ended.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn acquisition(
        &self,
        operation: &'static str,
        mode: LockMode,
        outcome: &'static str,
        waited: Duration,
    ) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            use opentelemetry::KeyValue;
            let attributes = [
                KeyValue::new(crate::telemetry::metrics::OPERATION, operation),
                KeyValue::new(crate::telemetry::MODE, mode.as_str()),
                KeyValue::new(crate::telemetry::OUTCOME, outcome),
            ];
            m.with_holder(attributes, |attributes| {
                m.wait.record(waited.as_secs_f64(), attributes);
                m.acquisitions.add(1, attributes);
            });
        }
    }

    /// The number of held locks changed by `delta`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn held(&self, delta: i64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.instruments.as_ref().filter(|_| delta != 0) {
            m.with_holder([], |attributes| m.held.add(delta, attributes));
        }
    }

    /// The manager's budget of held locks is now `limit`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn budget(&self, limit: usize) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.with_holder([], |attributes| m.budget.record(limit as u64, attributes));
        }
    }

    /// A held lock was declared lost.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn lost(&self, cause: &LossCause) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            let cause = opentelemetry::KeyValue::new(crate::telemetry::CAUSE, cause.as_str());
            m.with_holder([cause], |attributes| m.lost.add(1, attributes));
        }
    }

    /// A lock held for `held` was let go: released, or handed to the next task.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn hold_time(&self, mode: LockMode, held: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            let mode = opentelemetry::KeyValue::new(crate::telemetry::MODE, mode.as_str());
            m.with_holder([mode], |attributes| {
                m.hold.record(held.as_secs_f64(), attributes);
            });
        }
    }
}

#[cfg(feature = "metrics")]
impl Instruments {
    /// Runs `record` with `attributes`, plus the holder id when it was opted in; without it,
    /// nothing is allocated.
    fn with_holder<const N: usize>(
        &self,
        attributes: [opentelemetry::KeyValue; N],
        record: impl FnOnce(&[opentelemetry::KeyValue]),
    ) {
        match &self.holder {
            None => record(&attributes),
            Some(holder) => {
                let mut all = Vec::with_capacity(N + 1);
                all.extend(attributes);
                all.push(holder.clone());
                record(&all);
            }
        }
    }
}
