//! The Grafana dashboard (`dashboards/pglock.json`) against the metrics the crate records
//! (`telemetry::metrics::ALL`), through the names the OpenTelemetry → Prometheus convention
//! gives them: every metric a query reads is one of ours with a suffix its kind has, every label
//! is one of that metric's attributes (or one Prometheus adds), and every metric is on a panel.
//! No database: the dashboard's queries are read, not run.

use std::collections::BTreeSet;

use pglock::telemetry::metrics::{ALL, Instrument, Kind};
use serde_json::Value;

const DASHBOARD: &str = include_str!("../dashboards/pglock.json");

/// Labels Prometheus puts on every series itself (the scrape target's).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

/// PromQL words that are neither metrics nor labels.
const KEYWORDS: [&str; 11] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
];

/// The words after which a parenthesised list of labels follows.
const GROUPING: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The Prometheus names of `instrument`: dots become underscores, a unit of seconds adds
/// `_seconds`, a counter gets `_total`, a histogram is `_bucket`, `_sum` and `_count`; an
/// up-down counter or a gauge keeps its name.
fn prometheus_names(instrument: &Instrument) -> Vec<String> {
    let mut base = instrument.name.replace('.', "_");
    if instrument.unit == Some("s") {
        base.push_str("_seconds");
    }
    match instrument.kind {
        Kind::Counter => vec![format!("{base}_total")],
        Kind::Histogram => ["_bucket", "_sum", "_count"]
            .map(|suffix| format!("{base}{suffix}"))
            .to_vec(),
        _ => vec![base],
    }
}

/// The instrument a Prometheus metric name comes from.
fn instrument_of(metric: &str) -> Option<&'static Instrument> {
    ALL.iter()
        .find(|i| prometheus_names(i).iter().any(|name| name == metric))
}

/// The labels a query may use on `metric`: its attributes with dots as underscores, the
/// target's labels, and `le` on a histogram's buckets.
fn allowed_labels(metric: &str) -> BTreeSet<String> {
    let instrument = instrument_of(metric).expect("checked before");
    let mut allowed: BTreeSet<String> = (instrument.attributes.iter())
        .map(|a| a.replace('.', "_"))
        .collect();
    allowed.extend(TARGET_LABELS.map(str::to_owned));
    if metric.ends_with("_bucket") {
        allowed.insert("le".to_owned());
    }
    allowed
}

/// What one query reads: each metric with the labels of its matchers, and the labels it
/// groups by (which every metric of the query must have).
#[derive(Debug, Default)]
struct Query {
    metrics: Vec<(String, Vec<String>)>,
    grouping: Vec<String>,
}

/// Reads a PromQL expression: string literals, range selectors (`[5m]`), numbers and
/// `$variables` are skipped; a word followed by `(` (or by `by (` or `without (`) is a function
/// or an aggregation; a word inside `{}` is a
/// label of the metric before it; a word inside the parentheses after `by`, `without`, `on`,
/// `ignoring`, `group_left` or `group_right` is a grouping label; any other word is a metric.
fn parse(expr: &str) -> Query {
    let chars: Vec<char> = expr.chars().collect();
    let mut query = Query::default();
    let (mut i, mut in_braces, mut in_grouping) = (0, false, false);
    let mut last_word = String::new();
    while i < chars.len() {
        match chars[i] {
            quote @ ('"' | '\'' | '`') => {
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            '[' => i = skip(&chars, i, |c| c != ']'),
            '$' => {
                i = skip(&chars, i + 1, |c| c.is_alphanumeric() || "_{}".contains(c));
                continue;
            }
            '{' => {
                assert!(
                    !query.metrics.is_empty(),
                    "a matcher without a metric: {expr}"
                );
                in_braces = true;
            }
            '}' => in_braces = false,
            '(' if GROUPING.contains(&last_word.as_str()) => in_grouping = true,
            ')' => in_grouping = false,
            c if c.is_ascii_digit() || c == '.' => {
                i = skip(&chars, i, |c| c.is_ascii_alphanumeric() || c == '.');
                continue;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let end = skip(&chars, i, |c| c.is_ascii_alphanumeric() || "_:".contains(c));
                let word: String = chars[i..end].iter().collect();
                if in_braces {
                    let (_, labels) = query.metrics.last_mut().expect("a metric");
                    labels.push(word.clone());
                } else if in_grouping {
                    query.grouping.push(word.clone());
                } else if !applied(&chars[end..]) && !KEYWORDS.contains(&word.as_str()) {
                    query.metrics.push((word.clone(), Vec::new()));
                }
                (i, last_word) = (end, word);
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    query
}

/// The index of the first character from `i` on that `keep` refuses.
fn skip(chars: &[char], mut i: usize, keep: impl Fn(char) -> bool) -> usize {
    while i < chars.len() && keep(chars[i]) {
        i += 1;
    }
    i
}

/// Whether the word before `rest` applies to what follows: a function, or an aggregation with
/// its grouping first (`sum by (...) (...)`).
fn applied(rest: &[char]) -> bool {
    let rest: String = rest.iter().collect();
    let rest = rest.trim_start();
    rest.starts_with('(')
        || ["by", "without"].iter().any(|grouping| {
            (rest.strip_prefix(grouping)).is_some_and(|after| after.trim_start().starts_with('('))
        })
}

/// The labels a legend shows: each `{{label}}`.
fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|part| part.split_once("}}"))
        .map(|(label, _)| label.trim().to_owned())
        .collect()
}

/// Every panel of the dashboard, rows' own panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut found = Vec::new();
    let mut queue: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = queue.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            queue.extend(inner);
        }
        found.push(panel);
    }
    found
}

/// Each panel's title with one of its queries: the expression, and its legend.
fn queries(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut found = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target's expr");
            let legend = target["legendFormat"].as_str().unwrap_or_default();
            found.push((title.to_owned(), expr.to_owned(), legend.to_owned()));
        }
    }
    found
}

/// The metric and label of every `label_values(metric, label)` template variable.
fn variables(dashboard: &Value) -> Vec<(String, String)> {
    let list = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    list.iter()
        .filter(|var| var["type"] == "query")
        .map(|var| {
            let query = var["query"]["query"].as_str().expect("a variable's query");
            let args = (query.strip_prefix("label_values("))
                .and_then(|rest| rest.strip_suffix(')'))
                .unwrap_or_else(|| panic!("not label_values(metric, label): {query}"));
            let (metric, label) = args.split_once(',').expect("two arguments");
            (metric.trim().to_owned(), label.trim().to_owned())
        })
        .collect()
}

/// Checks that `metric` is one of ours and `labels` are among its labels; `Err` says why not.
fn check(metric: &str, labels: &[String]) -> Result<(), String> {
    if instrument_of(metric).is_none() {
        return Err(format!(
            "{metric} is no Prometheus name of a metric of telemetry::metrics::ALL"
        ));
    }
    let allowed = allowed_labels(metric);
    match labels.iter().find(|label| !allowed.contains(*label)) {
        Some(label) => Err(format!(
            "{metric} has no label {label} (it has {allowed:?})"
        )),
        None => Ok(()),
    }
}

/// The metrics the dashboard's queries read, and what is wrong with its queries.
fn checked(dashboard: &Value) -> (BTreeSet<String>, Vec<String>) {
    let (mut read, mut errors) = (BTreeSet::new(), Vec::new());
    for (title, expr, legend) in queries(dashboard) {
        let query = parse(&expr);
        if query.metrics.is_empty() {
            errors.push(format!("{title}: no metric in {expr}"));
        }
        let shared: Vec<String> = query
            .grouping
            .into_iter()
            .chain(legend_labels(&legend))
            .collect();
        for (metric, mut labels) in query.metrics {
            labels.extend(shared.iter().cloned());
            if let Err(why) = check(&metric, &labels) {
                errors.push(format!("{title}: {why}, in {expr}"));
            }
            read.insert(metric);
        }
    }
    for (metric, label) in variables(dashboard) {
        if let Err(why) = check(&metric, &[label]) {
            errors.push(format!("template variable: {why}"));
        }
    }
    (read, errors)
}

/// The instruments of ALL that no panel reads.
fn unread(read: &BTreeSet<String>) -> Vec<&'static str> {
    ALL.iter()
        .filter(|i| !prometheus_names(i).iter().any(|name| read.contains(name)))
        .map(|i| i.name)
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(DASHBOARD).expect("dashboards/pglock.json is JSON")
}

#[test]
fn every_query_reads_our_metrics_by_their_prometheus_names_and_labels() {
    let (_, errors) = checked(&dashboard());
    assert!(
        errors.is_empty(),
        "the dashboard does not match the metrics:\n{}",
        errors.join("\n")
    );
}

#[test]
fn every_metric_is_on_a_panel() {
    let (read, _) = checked(&dashboard());
    assert_eq!(unread(&read), Vec::<&str>::new(), "metrics on no panel");
}

#[test]
fn the_dashboard_imports_into_grafana_with_a_prometheus_data_source() {
    let dashboard = dashboard();
    assert!(
        dashboard["schemaVersion"]
            .as_u64()
            .expect("a schema version")
            >= 36
    );
    assert_eq!(dashboard["uid"], "pglock");
    let list = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(
        list.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a ${{datasource}} variable of Prometheus data sources"
    );
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        assert!(
            ids.insert(panel["id"].as_u64().expect("an id")),
            "ids are unique"
        );
        assert!(panel["gridPos"]["w"].as_u64().is_some(), "{panel}");
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{}",
                panel["title"]
            );
            let targets = panel["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{}", panel["title"]);
        }
    }
}

#[test]
fn the_naming_rules_and_the_reader_catch_what_they_should() {
    // The names the exporters give: a seconds histogram, a counter, an up-down counter.
    let names: Vec<String> = ALL.iter().flat_map(prometheus_names).collect();
    for name in [
        "pglock_acquire_wait_seconds_bucket",
        "pglock_locks_lost_total",
        "pglock_leader_terms_ended_total",
        "pglock_leader_is_leader",
        "pglock_leader_vacancy_seconds_count",
    ] {
        assert!(names.iter().any(|n| n == name), "{name}");
    }
    // A counter read without `_total`, a histogram's bucket label on a counter, a label the
    // metric does not have: each refused.
    assert!(check("pglock_acquisitions", &[]).is_err());
    assert!(check("pglock_acquisitions_total", &["le".to_owned()]).is_err());
    assert!(check("pglock_locks_lost_total", &["pglock_outcome".to_owned()]).is_err());
    let query = parse(
        r#"histogram_quantile(0.99, sum by (le, pglock_mode) (rate(pglock_hold_duration_seconds_bucket{instance=~"$instance", pglock_mode="x{y}"}[$__rate_interval])))"#,
    );
    assert_eq!(query.grouping, ["le", "pglock_mode"]);
    let labels = ["instance", "pglock_mode"].map(str::to_owned).to_vec();
    let bucket = "pglock_hold_duration_seconds_bucket".to_owned();
    assert_eq!(query.metrics, [(bucket, labels)]);
}
