//! A scheduled job's instruments: runs by outcome, skips by reason, overruns, extensions.

use super::MeterChoice;

/// The instruments of one job. Without the `metrics` feature this is an empty struct whose
/// methods compile to nothing.
#[derive(Default)]
pub(crate) struct JobMetrics {
    #[cfg(feature = "metrics")]
    instruments: Option<Instruments>,
}

#[cfg(feature = "metrics")]
struct Instruments {
    runs: opentelemetry::metrics::Counter<u64>,
    skips: opentelemetry::metrics::Counter<u64>,
    overruns: opentelemetry::metrics::Counter<u64>,
    extensions: opentelemetry::metrics::Counter<u64>,
    /// The job's name (fixed by the application, so one series per job and outcome), and the
    /// holder id when the builder opted in.
    attributes: Vec<opentelemetry::KeyValue>,
}

impl JobMetrics {
    /// The instruments of the job `job`, run through a manager whose holder id is
    /// `holder_id`.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn build(choice: MeterChoice, job: &str, holder_id: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            use crate::telemetry::metrics as names;
            use opentelemetry::KeyValue;
            if choice.disabled {
                return Self::default();
            }
            let mut attributes = vec![KeyValue::new(crate::telemetry::job::JOB, job.to_owned())];
            if choice.holder_id {
                attributes.push(KeyValue::new(
                    crate::telemetry::HOLDER_ID,
                    holder_id.to_owned(),
                ));
            }
            let meter = (choice.meter).unwrap_or_else(|| opentelemetry::global::meter("pglock"));
            let counter = |name: &'static str, description: &'static str| {
                meter
                    .u64_counter(name)
                    .with_description(description)
                    .build()
            };
            let instruments = Instruments {
                runs: counter(
                    names::JOB_RUNS,
                    "Scheduled runs that did not skip, by outcome",
                ),
                skips: counter(names::JOB_SKIPS, "Scheduled runs skipped, by reason"),
                overruns: counter(
                    names::JOB_OVERRUNS,
                    "Job bodies cut off at the end of their hold",
                ),
                extensions: counter(
                    names::JOB_EXTENSIONS,
                    "Requests to extend a running job's hold, by outcome",
                ),
                attributes,
            };
            JobMetrics {
                instruments: Some(instruments),
            }
        }
        #[cfg(not(feature = "metrics"))]
        Self::default()
    }

    /// A call of `run` that did not skip ended with `outcome`, one of
    /// [`crate::telemetry::job::outcome`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn run(&self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.runs
                .add(1, &m.with(crate::telemetry::job::OUTCOME, outcome));
        }
    }

    /// A call of `run` skipped; `reason` is [`Skip::as_str`](crate::schedule::Skip::as_str).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn skip(&self, reason: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.skips
                .add(1, &m.with(crate::telemetry::job::REASON, reason));
        }
    }

    /// A body was cut off at its max hold.
    pub(crate) fn overrun(&self) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.overruns.add(1, &m.attributes);
        }
    }

    /// A request to extend a running job's hold ended with `outcome`, one of
    /// [`crate::telemetry::job::extension`].
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn extension(&self, outcome: &'static str) {
        #[cfg(feature = "metrics")]
        if let Some(m) = &self.instruments {
            m.extensions
                .add(1, &m.with(crate::telemetry::job::OUTCOME, outcome));
        }
    }
}

#[cfg(feature = "metrics")]
impl Instruments {
    /// The job's attributes and one more.
    fn with(&self, key: &'static str, value: &'static str) -> Vec<opentelemetry::KeyValue> {
        let mut attributes = self.attributes.clone();
        attributes.push(opentelemetry::KeyValue::new(key, value));
        attributes
    }
}
