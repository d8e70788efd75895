//! OpenTelemetry metrics, when the `metrics` feature is on; nothing at all otherwise.

use std::time::Duration;

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
    lost: opentelemetry::metrics::Counter<u64>,
    holder: opentelemetry::KeyValue,
}

/// What a builder was given to record metrics with: a meter (or none, for the global one), or
/// nothing at all without the `metrics` feature.
#[cfg(feature = "metrics")]
pub(crate) type MeterChoice = Option<opentelemetry::metrics::Meter>;
#[cfg(not(feature = "metrics"))]
pub(crate) type MeterChoice = NoMeter;

/// Stands in for a meter without the `metrics` feature.
#[cfg(not(feature = "metrics"))]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct NoMeter;

impl Metrics {
    /// The instruments of a manager whose holder id is `holder_id`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn build(meter: MeterChoice, holder_id: &str) -> Self {
        #[cfg(feature = "metrics")]
        return Self::new(
            &meter.unwrap_or_else(|| opentelemetry::global::meter("pglock")),
            Some(holder_id),
        );
        #[cfg(not(feature = "metrics"))]
        Self::default()
    }

    #[cfg(feature = "metrics")]
    fn new(meter: &opentelemetry::metrics::Meter, holder_id: Option<&str>) -> Self {
        use crate::telemetry::metrics as names;
        let instruments = Instruments {
            wait: meter
                .f64_histogram(names::ACQUIRE_WAIT)
                .with_unit("s")
                .with_description("Time spent waiting in acquire / try_acquire, by outcome")
                .build(),
            acquisitions: meter
                .u64_counter(names::ACQUISITIONS)
                .with_description("Acquisition attempts, by operation, mode and outcome")
                .build(),
            held: meter
                .i64_up_down_counter(names::HELD)
                .with_description("Locks held right now")
                .build(),
            lost: meter
                .u64_counter(names::LOST)
                .with_description("Held locks declared lost, by cause")
                .build(),
            holder: opentelemetry::KeyValue::new(
                crate::telemetry::HOLDER_ID,
                holder_id.unwrap_or_default().to_owned(),
            ),
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
                m.holder.clone(),
            ];
            m.wait.record(waited.as_secs_f64(), &attributes);
            m.acquisitions.add(1, &attributes);
        }
    }

    /// The number of held locks changed by `delta`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn held(&self, delta: i64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = self.instruments.as_ref().filter(|_| delta != 0) {
            m.held.add(delta, std::slice::from_ref(&m.holder));
        }
    }

    /// A held lock was declared lost.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn lost(&self, cause: &LossCause) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            let cause = opentelemetry::KeyValue::new(crate::telemetry::CAUSE, cause.to_string());
            m.lost.add(1, &[cause, m.holder.clone()]);
        }
    }
}
