//! A leader election's instruments: who leads, terms won and ended, time to a new leader.

use std::time::Duration;

use super::MeterChoice;

/// The instruments of one candidate. Without the `metrics` feature this is an empty struct
/// whose methods compile to nothing.
#[derive(Default)]
pub(crate) struct LeaderMetrics {
    #[cfg(feature = "metrics")]
    instruments: Option<std::sync::Arc<Instruments>>,
}

#[cfg(feature = "metrics")]
struct Instruments {
    is_leader: opentelemetry::metrics::UpDownCounter<i64>,
    terms: opentelemetry::metrics::Counter<u64>,
    ended: opentelemetry::metrics::Counter<u64>,
    vacancy: opentelemetry::metrics::Histogram<f64>,
    /// The election's name, and the holder id when the builder opted in.
    attributes: Vec<opentelemetry::KeyValue>,
}

impl LeaderMetrics {
    /// The instruments of a candidate for `election` whose holder id is `holder_id`. Its
    /// leadership series shows 0 from now on.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn build(choice: MeterChoice, election: &str, holder_id: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            use crate::telemetry::{self, metrics as names};
            use opentelemetry::KeyValue;
            if choice.disabled {
                return Self::default();
            }
            let meter = (choice.meter).unwrap_or_else(|| opentelemetry::global::meter("pglock"));
            let mut attributes = vec![KeyValue::new(
                telemetry::leader::ELECTION,
                election.to_owned(),
            )];
            if choice.holder_id {
                attributes.push(KeyValue::new(telemetry::HOLDER_ID, holder_id.to_owned()));
            }
            let instruments = Instruments {
                is_leader: meter
                    .i64_up_down_counter(names::LEADER_IS_LEADER)
                    .with_description("1 while this candidate leads the election, 0 otherwise")
                    .build(),
                terms: meter
                    .u64_counter(names::LEADER_TERMS)
                    .with_description("Leadership terms won")
                    .build(),
                ended: meter
                    .u64_counter(names::LEADER_TERMS_ENDED)
                    .with_description("Leadership terms ended, by outcome")
                    .build(),
                vacancy: meter
                    .f64_histogram(names::LEADER_VACANCY)
                    .with_unit("s")
                    .with_description(
                        "Upper bound of how long the office was vacant before this candidate won",
                    )
                    .with_boundaries(super::SECONDS_BUCKETS.to_vec())
                    .build(),
                attributes,
            };
            // A follower's series exists from its start, so a dashboard sees it at 0.
            instruments.is_leader.add(0, &instruments.attributes);
            LeaderMetrics {
                instruments: Some(std::sync::Arc::new(instruments)),
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self::default()
    }

    /// A term was won after the office had been vacant for at most `vacancy`. The term counts
    /// as led until the returned guard is dropped.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn won(&self, vacancy: Duration) -> TermMetrics {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.terms.add(1, &m.attributes);
            m.vacancy.record(vacancy.as_secs_f64(), &m.attributes);
            m.is_leader.add(1, &m.attributes);
            return TermMetrics {
                open: Some((
                    std::sync::Arc::clone(m),
                    crate::telemetry::leader::outcome::DROPPED,
                )),
            };
        }
        TermMetrics::default()
    }
}

/// One term being led. Dropping it ends the term on the metrics: leadership back to 0, and the
/// term counted as ended with the outcome given to [`ended`](Self::ended), or as `dropped` if
/// the campaign itself was dropped first (its runtime shut down).
#[derive(Default)]
#[must_use = "dropping it ends the term on the metrics"]
pub(crate) struct TermMetrics {
    #[cfg(feature = "metrics")]
    open: Option<(std::sync::Arc<Instruments>, &'static str)>,
}

impl TermMetrics {
    /// The term ended with `outcome`, one of [`crate::telemetry::leader::outcome`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables, unused_mut))]
    pub(crate) fn ended(mut self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some((_, how)) = &mut self.open {
            *how = outcome;
        }
    }
}

#[cfg(feature = "metrics")]
impl Drop for TermMetrics {
    fn drop(&mut self) {
        if let Some((m, outcome)) = self.open.take() {
            m.is_leader.add(-1, &m.attributes);
            let mut attributes = m.attributes.clone();
            attributes.push(opentelemetry::KeyValue::new(
                crate::telemetry::leader::OUTCOME,
                outcome,
            ));
            m.ended.add(1, &attributes);
        }
    }
}
