//! `docs/defaults.md` checked against the code: every value in its tables' second column must
//! be what the code does, and every row must be checked here.

use std::collections::BTreeMap;
use std::time::Duration;

const TABLE: &str = include_str!("../docs/defaults.md");

/// A duration as the table writes it: `20 s`, `250 ms`.
pub(crate) fn duration(value: Duration) -> String {
    if value.subsec_nanos() == 0 {
        format!("{} s", value.as_secs())
    } else {
        format!("{} ms", value.as_millis())
    }
}

pub(crate) fn on_off(value: bool) -> &'static str {
    if value { "on" } else { "off" }
}

/// The first two cells of every table row but the headers, without their backticks.
fn documented() -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in TABLE.lines().filter(|line| line.starts_with('|')) {
        let cells: Vec<String> = line
            .split('|')
            .map(|cell| cell.trim().replace('`', ""))
            .collect();
        let (name, value) = (&cells[1], &cells[2]);
        let header = ["setting", "limit"].contains(&name.as_str()) || name.starts_with("---");
        if !header {
            let again = rows.insert(name.clone(), value.clone());
            assert!(again.is_none(), "docs/defaults.md has two rows for {name}");
        }
    }
    rows
}

fn in_the_code() -> BTreeMap<String, String> {
    let mut values: BTreeMap<String, String> = [
        crate::postgres::documented_defaults(),
        crate::memory::documented_defaults(),
        crate::schedule::documented_defaults(),
        crate::leader::documented_defaults(),
    ]
    .into_iter()
    .flatten()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    let names = [
        ("FencingTable::default", crate::FencingTable::DEFAULT_NAME),
        ("JobTable::default", crate::schedule::JobTable::DEFAULT_NAME),
    ];
    values.extend(names.map(|(row, name)| (row.to_owned(), name.to_owned())));
    let permits = format!("at most {}", crate::Semaphore::MAX_PERMITS);
    values.insert("Semaphore permits".to_owned(), permits);
    values
}

#[tokio::test]
async fn the_defaults_table_matches_the_code() {
    let (documented, code) = (documented(), in_the_code());
    for (name, value) in &code {
        let row = documented.get(name).map(String::as_str);
        assert_eq!(
            row,
            Some(value.as_str()),
            "docs/defaults.md, row `{name}`: the code's default is `{value}`"
        );
    }
    for name in documented.keys() {
        assert!(
            code.contains_key(name),
            "docs/defaults.md documents `{name}`, which nothing checks: add it to the module's \
             `documented_defaults`"
        );
    }
}
