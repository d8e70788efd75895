//! An OpenTelemetry pipeline that keeps finished spans in memory, for span assertions.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing::subscriber::DefaultGuard;
use tracing_subscriber::layer::SubscriberExt;

/// Installed as the `tracing` subscriber of the current thread only (`set_default`), so tests
/// running in parallel in one binary each see only their own spans. That needs `current_thread`
/// runtimes: a span emitted by a task pglock spawns (a dropped guard's release, a dropped
/// cutover's rollback) must run on this thread to reach this subscriber.
pub struct Capture {
    pub exporter: InMemorySpanExporter,
    // Dropping the provider shuts the exporter down, which discards its spans: keep it alive.
    _provider: SdkTracerProvider,
    _subscriber: DefaultGuard,
}

impl Capture {
    pub fn install() -> Self {
        let exporter = InMemorySpanExporter::default();
        // The simple processor exports every span synchronously as it ends.
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("pglock-tests"));
        let subscriber =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        Capture {
            exporter,
            _provider: provider,
            _subscriber: subscriber,
        }
    }

    /// Every span finished so far.
    pub fn finished_spans(&self) -> Vec<SpanData> {
        self.exporter
            .get_finished_spans()
            .expect("the in-memory exporter hands out its spans")
    }

    /// The one finished span named `name`.
    pub fn only(&self, name: &str) -> SpanData {
        let mut spans: Vec<SpanData> = self
            .finished_spans()
            .into_iter()
            .filter(|span| span.name == name)
            .collect();
        assert_eq!(spans.len(), 1, "expected one {name} span: {spans:#?}");
        spans.pop().expect("one span")
    }

    /// How many finished spans are named `name`.
    pub fn count(&self, name: &str) -> usize {
        self.finished_spans()
            .iter()
            .filter(|span| span.name == name)
            .count()
    }

    /// Forgets the spans finished so far.
    pub fn reset(&self) {
        self.exporter.reset();
    }
}
