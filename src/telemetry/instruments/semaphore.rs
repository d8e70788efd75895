//! A semaphore's instruments: permits asked for by outcome, the wait, permits held.

use std::time::Duration;

use super::MeterChoice;

/// The instruments of one semaphore handle (and its clones). Without the `metrics` feature
/// this is an empty struct whose methods compile to nothing.
#[derive(Default)]
pub(crate) struct SemaphoreMetrics {
    #[cfg(feature = "metrics")]
    instruments: Option<Instruments>,
}

#[cfg(feature = "metrics")]
struct Instruments {
    acquisitions: opentelemetry::metrics::Counter<u64>,
    wait: opentelemetry::metrics::Histogram<f64>,
    held: opentelemetry::metrics::UpDownCounter<i64>,
    /// The semaphore's name, and the holder id when the builder opted in.
    attributes: Vec<opentelemetry::KeyValue>,
}

impl SemaphoreMetrics {
    /// The instruments of the semaphore `name`, used through a manager whose holder id is
    /// `holder_id`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn build(choice: MeterChoice, name: &str, holder_id: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            use crate::telemetry::{self, metrics as names};
            use opentelemetry::KeyValue;
            if choice.disabled {
                return Self::default();
            }
            let meter = (choice.meter).unwrap_or_else(|| opentelemetry::global::meter("pglock"));
            let mut attributes = vec![KeyValue::new(
                telemetry::semaphore::SEMAPHORE,
                name.to_owned(),
            )];
            if choice.holder_id {
                attributes.push(KeyValue::new(telemetry::HOLDER_ID, holder_id.to_owned()));
            }
            let instruments = Instruments {
                acquisitions: meter
                    .u64_counter(names::SEMAPHORE_ACQUISITIONS)
                    .with_description("Permits asked for, by operation and outcome")
                    .build(),
                wait: meter
                    .f64_histogram(names::SEMAPHORE_WAIT)
                    .with_unit("s")
                    .with_description("Time spent waiting for a permit, by operation and outcome")
                    .with_boundaries(super::SECONDS_BUCKETS.to_vec())
                    .build(),
                held: meter
                    .i64_up_down_counter(names::SEMAPHORE_HELD)
                    .with_description("Permits held right now through this process's handles")
                    .build(),
                attributes,
            };
            instruments.held.add(0, &instruments.attributes);
            SemaphoreMetrics {
                instruments: Some(instruments),
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self::default()
    }

    /// Whether there are instruments to feed.
    pub(crate) fn is_on(&self) -> bool {
        #[cfg(feature = "metrics")]
        return self.instruments.is_some();
        #[cfg(not(feature = "metrics"))]
        false
    }

    /// One `acquire` or `try_acquire` (`operation`) ended with `outcome` after `waited`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn acquisition(
        &self,
        operation: &'static str,
        outcome: &'static str,
        waited: Duration,
    ) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            use opentelemetry::KeyValue;
            let mut attributes = m.attributes.clone();
            attributes.push(KeyValue::new(
                crate::telemetry::metrics::OPERATION,
                operation,
            ));
            attributes.push(KeyValue::new(crate::telemetry::OUTCOME, outcome));
            m.wait.record(waited.as_secs_f64(), &attributes);
            m.acquisitions.add(1, &attributes);
        }
    }

    /// The permits held through this semaphore's handles changed by `delta`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn held(&self, delta: i64) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.held.add(delta, &m.attributes);
        }
    }
}
