//! The primitives table of `docs/guide/primitives.md` held against the public API listing
//! (`api/pglock.txt`, which `scripts/api-listing.sh` keeps equal to the code): every cell's
//! method exists and answers what the cell says, every absent cell has its reason, every builder
//! has the four telemetry setters, the concrete managers have the whole caller API inherently,
//! and every public enum may grow.

use std::collections::BTreeSet;

const PAGE: &str = include_str!("../docs/guide/primitives.md");
const LISTING: &str = include_str!("../api/pglock.txt");

/// The rows of the table under `## The table`: cells of each row after the first column.
fn table_rows() -> Vec<(String, Vec<String>)> {
    let start = PAGE.find("## The table").expect("the page has its table");
    PAGE[start..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its separator
        .map(|line| {
            let mut cells = line.trim_matches('|').split(" | ").map(str::trim);
            let name = cells.next().expect("a row name").to_owned();
            (name, cells.map(str::to_owned).collect())
        })
        .collect()
}

/// The `` `Path::method` → `Answer` `` claims of a cell.
fn claims(cell: &str) -> Vec<(String, String)> {
    let mut claims = Vec::new();
    let mut rest = cell;
    while let Some(arrow) = rest.find("` → `") {
        let path = rest[..arrow].rsplit('`').next().expect("a code span");
        let answer_start = arrow + "` → `".len();
        let answer_len = rest[answer_start..].find('`').expect("a closed code span");
        let answer = &rest[answer_start..answer_start + answer_len];
        claims.push((path.to_owned(), answer.to_owned()));
        rest = &rest[answer_start + answer_len..];
    }
    claims
}

/// The letters `(a)` a cell marks as absent on purpose.
fn absences(cell: &str) -> Vec<char> {
    let bytes: Vec<char> = cell.chars().collect();
    bytes
        .windows(3)
        .filter(|w| w[0] == '(' && w[2] == ')' && w[1].is_ascii_lowercase())
        .map(|w| w[1])
        .collect()
}

/// The functions of the listing: (path, what it answers, normalised).
fn functions() -> Vec<(String, String)> {
    LISTING
        .lines()
        .filter_map(|line| {
            let at = line.find("fn ")?;
            let (before, signature) = line.split_at(at + "fn ".len());
            if !before.trim_start().starts_with("pub") && !before.contains(" pub ") {
                return None;
            }
            let open = signature.find(['(', '<'])?;
            let path = signature[..open].to_owned();
            Some((path, normalise(&answer(signature))))
        })
        .collect()
}

/// The return type of a signature `name<..>(..) -> R where ..`, `()` when it has none.
fn answer(signature: &str) -> String {
    let mut depth = 0i32;
    let mut params_end = None;
    for (i, c) in signature.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth == 0 && c == ')' {
                    params_end = Some(i + 1);
                    break;
                }
            }
            '>' if !signature[..i].ends_with('-') => depth -= 1,
            _ => {}
        }
    }
    let rest = &signature[params_end.expect("a parameter list")..];
    let Some(ret) = rest.strip_prefix(" -> ") else {
        return "()".to_owned();
    };
    let ret = ret.strip_suffix(" { ... }").unwrap_or(ret);
    // A where clause follows the type at depth 0.
    let mut depth = 0i32;
    for (i, c) in ret.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            _ => {}
        }
        if depth == 0 && ret[i..].starts_with(" where ") {
            return ret[..i].to_owned();
        }
    }
    ret.to_owned()
}

/// A type as the table writes it: paths cut to their last segment, `<F as Future>::Output`
/// as `F::Output`, the future's output for an `impl Future`, the `Ok` type of a `Result`.
fn normalise(ty: &str) -> String {
    let mut ty = String::new() + ty;
    // Paths to their last segment: `pglock::semaphore::Permit` to `Permit`.
    let mut out = String::new();
    let mut word = String::new();
    for c in ty.chars().chain(std::iter::once(' ')) {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            out.push_str(word.rsplit("::").next().unwrap_or(""));
            // `<F as Future>::Output` kept its `::Output`: put the separator back.
            if word.starts_with("::") {
                out.truncate(out.len() - word.rsplit("::").next().unwrap_or("").len());
                out.push_str(&word);
            }
            word.clear();
            out.push(c);
        }
    }
    ty = out.trim_end().to_owned();
    ty = ty.replace("<F as Future>::Output", "F::Output");
    // An `#[async_trait]` method's desugared future.
    if let Some(inner) = ty.strip_prefix("Pin<Box<dyn Future<Output = ") {
        let inner = inner
            .strip_suffix("> + Send + 'async_trait>>")
            .unwrap_or(inner);
        ty = inner.to_owned();
    }
    if let Some(inner) = ty.strip_prefix("impl Future<Output = ") {
        let inner = inner.strip_suffix(" + Send").unwrap_or(inner);
        ty = inner.strip_suffix('>').unwrap_or(inner).to_owned();
    }
    if let Some(inner) = ty.strip_prefix("Result<") {
        let inner = inner.strip_suffix('>').expect("a closed Result");
        // `Result<T, E>`: the first argument at depth 0.
        let mut depth = 0;
        let mut end = inner.len();
        for (i, c) in inner.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    end = i;
                    break;
                }
                _ => {}
            }
        }
        ty = inner[..end].to_owned();
    }
    ty.replace("&'_ ", "&").replace("&'a ", "&")
}

/// The functions whose path ends with `::{path}`.
fn named<'a>(functions: &'a [(String, String)], path: &str) -> Vec<&'a (String, String)> {
    let suffix = format!("::{path}");
    functions
        .iter()
        .filter(|(p, _)| p.ends_with(&suffix))
        .collect()
}

#[test]
fn every_cell_of_the_primitives_table_is_the_api() {
    let functions = functions();
    let rows = table_rows();
    assert!(
        rows.len() >= 7,
        "the table has a row per primitive: {rows:?}"
    );
    let mut letters = BTreeSet::new();
    let mut checked = 0;
    for (row, cells) in &rows {
        assert_eq!(cells.len(), 9, "{row}: one cell per verb");
        for cell in cells {
            let cell_claims = claims(cell);
            let cell_absences = absences(cell);
            assert!(
                !cell_claims.is_empty() || !cell_absences.is_empty(),
                "{row}: the cell {cell:?} names a method or a reason"
            );
            letters.extend(cell_absences);
            for (path, said) in cell_claims {
                let found = named(&functions, &path);
                assert!(
                    !found.is_empty(),
                    "{row}: `{path}` is not in the API listing"
                );
                for (full, answers) in found {
                    assert_eq!(
                        answers, &said,
                        "{row}: the table says `{path}` answers `{said}`, `{full}` answers `{answers}`"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} methods were checked");
    for letter in letters {
        assert!(
            PAGE.contains(&format!("* ({letter}) ")),
            "the reason for ({letter}) is not given"
        );
    }
}

#[test]
fn the_concrete_managers_have_the_whole_caller_api() {
    let functions = functions();
    let caller: Vec<&(String, String)> = functions
        .iter()
        .filter(|(path, _)| path.starts_with("pglock::LockManagerExt::"))
        .collect();
    let port = ["release_all", "held_locks", "held_lock_count", "holder_id"];
    assert!(caller.len() >= 18, "{caller:?}");
    for manager in ["PostgresLockManager", "InMemoryLockManager"] {
        let methods = caller
            .iter()
            .map(|(path, answers)| (path.rsplit("::").next().unwrap_or_default(), answers))
            .chain(port.iter().map(|name| {
                let (_, answers) = named(&functions, &format!("LockManager::{name}"))[0];
                (*name, answers)
            }));
        for (method, answers) in methods {
            let path = format!("pglock::{manager}::{method}");
            let own = functions.iter().find(|(p, _)| *p == path);
            let own = own.unwrap_or_else(|| panic!("{path} is missing"));
            assert_eq!(&own.1, answers, "{path} answers as the trait's");
        }
    }
}

#[test]
fn every_builder_has_the_four_telemetry_setters() {
    let functions = functions();
    let builders: BTreeSet<&str> = LISTING
        .lines()
        .filter_map(|line| line.split("pub struct ").nth(1))
        .map(|rest| rest.split([' ', '<']).next().unwrap_or(rest))
        .filter(|name| name.ends_with("Builder"))
        .collect();
    assert!(builders.len() >= 5, "{builders:?}");
    for builder in builders {
        for setter in ["tracing", "meter", "metrics", "metrics_holder_id"] {
            let path = format!("{builder}::{setter}");
            assert!(
                functions.iter().any(|(p, _)| *p == path),
                "{builder} lacks `{setter}`"
            );
        }
    }
}

#[test]
fn every_public_enum_may_grow() {
    for line in LISTING.lines().filter(|line| line.contains("pub enum ")) {
        assert!(line.contains("#[non_exhaustive]"), "{line}");
    }
}

#[test]
fn types_are_read_as_the_table_writes_them() {
    let cases = [
        (
            "impl core::future::future::Future<Output = pglock::Result<pglock::Attempt<pglock::semaphore::Permit>>> + core::marker::Send",
            "Attempt<Permit>",
        ),
        (
            "pglock::Result<<F as core::future::future::Future>::Output>",
            "F::Output",
        ),
        ("&[pglock::LockInfo]", "&[LockInfo]"),
        (
            "core::pin::Pin<alloc::boxed::Box<dyn core::future::future::Future<Output = pglock::Result<usize>> + core::marker::Send + 'async_trait>>",
            "usize",
        ),
        ("core::result::Result<T, pglock::leader::Error>", "T"),
        (
            "tokio::sync::watch::Receiver<pglock::Leadership>",
            "Receiver<Leadership>",
        ),
    ];
    for (listed, table) in cases {
        assert_eq!(normalise(listed), table, "{listed}");
    }
    assert_eq!(
        answer("f(&self, x: (i32, i32)) -> bool where T: Send"),
        "bool"
    );
    assert_eq!(answer("f(self) { ... }"), "()");
}
