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
    /// The job's name: fixed by the application, so one series per job and outcome.
    job: opentelemetry::KeyValue,
}

impl JobMetrics {
    /// The instruments of the job `job`. Only the meter is taken from `choice`: a job's series
    /// carry its name, never a holder id.
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn build(choice: MeterChoice, job: &str) -> Self {
        #[cfg(feature = "metrics")]
        {
            use crate::telemetry::metrics as names;
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
                overruns: counter(names::JOB_OVERRUNS, "Job bodies cut off at their max hold"),
                extensions: counter(
                    names::JOB_EXTENSIONS,
                    "Requests to extend a running job's hold, by outcome",
                ),
                job: opentelemetry::KeyValue::new(crate::telemetry::job::JOB, job.to_owned()),
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
            m.overruns.add(1, std::slice::from_ref(&m.job));
        }
    }

    /// A request to extend a running job's hold ended with `outcome`, one of
    /// [`crate::telemetry::job::extension`].
    #[allow(dead_code)] // called by job extension, which is being built on its own branch
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
    /// The job's name and one more attribute.
    fn with(&self, key: &'static str, value: &'static str) -> [opentelemetry::KeyValue; 2] {
        [self.job.clone(), opentelemetry::KeyValue::new(key, value)]
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

    use super::*;
    use crate::telemetry::{job, metrics as names};

    /// Job extension is built elsewhere; until it calls this, the instrument is checked here.
    #[test]
    fn an_extension_is_counted_by_outcome_under_the_jobs_name() {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        let choice = MeterChoice {
            meter: Some(provider.meter("pglock-tests")),
            holder_id: true,
        };
        let metrics = JobMetrics::build(choice, "nightly");
        for outcome in [job::extension::EXTENDED, job::extension::CAPPED] {
            metrics.extension(outcome);
        }
        metrics.extension(job::extension::EXTENDED);
        provider.force_flush().expect("flush");
        let export = exporter.get_finished_metrics().expect("export");
        let metric = (export.last().expect("an export").scope_metrics())
            .flat_map(|scope| scope.metrics())
            .find(|m| m.name() == names::JOB_EXTENSIONS)
            .expect("the extensions counter");
        let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() else {
            panic!("not a counter: {metric:?}");
        };
        let mut counted: Vec<(Vec<String>, u64)> = (sum.data_points())
            .map(|p| {
                let attributes = p.attributes().map(|kv| format!("{}={}", kv.key, kv.value));
                (attributes.collect(), p.value())
            })
            .collect();
        counted.sort();
        let series = |outcome: &str, n| {
            let job = format!("{}=nightly", job::JOB);
            (vec![job, format!("{}={outcome}", job::OUTCOME)], n)
        };
        assert_eq!(counted, [series("capped", 1), series("extended", 2)]);
    }
}
