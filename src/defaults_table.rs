//! `docs/defaults.md` checked against the code: every value in its tables' second column must
//! be what the code does, and every row must be checked here.

use std::collections::BTreeMap;

const TABLE: &str = include_str!("../docs/defaults.md");

/// A value from the code as the table writes it: a duration's `Debug` form (`20s`, `250ms`)
/// with a space before its unit (`20 s`, `250 ms`).
fn spaced(value: &str) -> String {
    let words = value.split(' ').map(|word| {
        let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == 'µ');
        let unit = &word[digits.len()..];
        let numeric = !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit() || c == '.');
        if numeric && ["s", "ms", "µs"].contains(&unit) {
            format!("{digits} {unit}")
        } else {
            word.to_owned()
        }
    });
    words.collect::<Vec<_>>().join(" ")
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
    .map(|(name, value)| (name.to_owned(), spaced(&value)))
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
