//! An OpenTelemetry metrics pipeline that keeps its exports in memory, and readers of those
//! exports: the data points of one metric, and a check of every exported metric against
//! `pglock::telemetry::metrics::ALL`.

use std::collections::BTreeSet;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use pglock::telemetry::metrics::{ALL, Instrument, Kind};

/// A meter provider of the test's own, exporting into memory on demand.
pub struct Pipeline {
    exporter: InMemoryMetricExporter,
    provider: SdkMeterProvider,
}

impl Pipeline {
    pub fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Pipeline { exporter, provider }
    }

    pub fn meter(&self) -> opentelemetry::metrics::Meter {
        self.provider.meter("pglock-tests")
    }

    /// Flushes, then returns the latest export, checked against the declared instruments.
    pub fn collect(&self) -> ResourceMetrics {
        self.provider.force_flush().expect("flush");
        let export = self
            .exporter
            .get_finished_metrics()
            .expect("exported metrics")
            .pop()
            .expect("at least one export");
        assert_declared(&export);
        export
    }
}

/// One exported data point: its attributes, and its value (a sum's or a gauge's value, or a
/// histogram's sum, with its count).
#[derive(Debug)]
pub struct Point {
    pub attributes: Vec<(String, String)>,
    pub value: f64,
    pub count: u64,
}

impl Point {
    pub fn has(&self, wanted: &[(&str, &str)]) -> bool {
        wanted
            .iter()
            .all(|(k, v)| self.attributes.iter().any(|(ak, av)| ak == k && av == v))
    }
}

/// The declared instrument named `name`.
pub fn declared(name: &str) -> &'static Instrument {
    ALL.iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("{name} is not in telemetry::metrics::ALL"))
}

/// Every data point of `metric`, and the kind its data says it is.
fn read(metric: &Metric) -> (Kind, Vec<Point>) {
    fn attrs<'a>(it: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Vec<(String, String)> {
        it.map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect()
    }
    let point = |attributes, value: f64, count| Point {
        attributes,
        value,
        count,
    };
    let sum_kind = |monotonic| {
        if monotonic {
            Kind::Counter
        } else {
            Kind::UpDownCounter
        }
    };
    match metric.data() {
        AggregatedMetrics::F64(MetricData::Histogram(h)) => (
            Kind::Histogram,
            (h.data_points())
                .map(|p| point(attrs(p.attributes()), p.sum(), p.count()))
                .collect(),
        ),
        AggregatedMetrics::U64(MetricData::Sum(s)) => (
            sum_kind(s.is_monotonic()),
            (s.data_points())
                .map(|p| point(attrs(p.attributes()), p.value() as f64, 1))
                .collect(),
        ),
        AggregatedMetrics::I64(MetricData::Sum(s)) => (
            sum_kind(s.is_monotonic()),
            (s.data_points())
                .map(|p| point(attrs(p.attributes()), p.value() as f64, 1))
                .collect(),
        ),
        AggregatedMetrics::U64(MetricData::Gauge(g)) => (
            Kind::Gauge,
            (g.data_points())
                .map(|p| point(attrs(p.attributes()), p.value() as f64, 1))
                .collect(),
        ),
        other => panic!("unexpected data for {}: {other:?}", metric.name()),
    }
}

/// Every exported metric is declared in `ALL`, with the kind and unit it is exported with,
/// and carries only declared attributes.
pub fn assert_declared(export: &ResourceMetrics) {
    for metric in export.scope_metrics().flat_map(|scope| scope.metrics()) {
        let instrument = declared(metric.name());
        let (kind, points) = read(metric);
        assert_eq!(kind, instrument.kind, "{}", metric.name());
        assert_eq!(
            metric.unit(),
            instrument.unit.unwrap_or(""),
            "{}",
            metric.name()
        );
        for (key, _) in points.iter().flat_map(|p| &p.attributes) {
            assert!(
                instrument.attributes.contains(&key.as_str()),
                "{} carries {key}, not among its declared attributes {:?}",
                metric.name(),
                instrument.attributes
            );
        }
    }
}

/// Every data point of metric `name`.
pub fn all_points(export: &ResourceMetrics, name: &str) -> Vec<Point> {
    (export.scope_metrics())
        .flat_map(|scope| scope.metrics())
        .filter(|m| m.name() == name)
        .flat_map(|m| read(m).1)
        .collect()
}

/// The values of the points of `name` whose attributes include all of `wanted`: for counters
/// and gauges their value, for histograms their count and their sum.
pub fn points(export: &ResourceMetrics, name: &str, wanted: &[(&str, &str)]) -> Vec<f64> {
    let histogram = declared(name).kind == Kind::Histogram;
    let mut found = Vec::new();
    for point in all_points(export, name).iter().filter(|p| p.has(wanted)) {
        if histogram {
            found.push(point.count as f64);
        }
        found.push(point.value);
    }
    found
}

/// Every distinct attribute set of metric `name`: one per series.
pub fn series(export: &ResourceMetrics, name: &str) -> BTreeSet<Vec<(String, String)>> {
    all_points(export, name)
        .into_iter()
        .map(|mut p| {
            p.attributes.sort();
            p.attributes
        })
        .collect()
}

/// Every attribute key on any series of the metrics `names`.
pub fn attribute_keys(export: &ResourceMetrics, names: &[&str]) -> BTreeSet<String> {
    names
        .iter()
        .flat_map(|name| all_points(export, name))
        .flat_map(|p| p.attributes.into_iter().map(|(k, _)| k))
        .collect()
}
