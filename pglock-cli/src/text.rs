//! Reading and writing what people type and read: durations, holder patterns.

use std::time::Duration;

/// Parses `500ms`, `30s`, `1.5m`, `2h`, `1d`, or a bare number of seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => f64::NAN,
    };
    number
        .parse::<f64>()
        .ok()
        .map(|n| n * scale)
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .ok_or_else(|| {
            format!(
                "invalid duration {text:?}: use a number and a unit, such as 500ms, 30s, 5m, \
                 2h or 1d (a bare number is seconds)"
            )
        })
}

/// A duration as a person reads it: `850ms`, `12.3s`, `4m05s`, `3h04m`, `2d03h`.
pub(crate) fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        1..60 => format!("{secs}.{}s", duration.subsec_millis() / 100),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters (none
/// included) and `?` for exactly one; everything else matches itself.
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let (pattern, text): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), text.chars().collect());
    // Where the last `*` was, and how much of the text it had swallowed: backtrack there.
    let (mut p, mut t, mut star) = (0, 0, None);
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
            }
            Some(&c) if c == '?' || c == text[t] => {
                p += 1;
                t += 1;
            }
            _ => match star {
                Some((star_p, star_t)) => {
                    p = star_p + 1;
                    t = star_t + 1;
                    star = Some((star_p, star_t + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_units_or_as_seconds() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        for bad in ["", "s", "-1s", "5 weeks", "1e3", "abc", "5x"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn durations_print_for_people() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(12_345)), "12.3s");
        assert_eq!(human(Duration::from_secs(245)), "4m05s");
        assert_eq!(human(Duration::from_secs(3 * 3600 + 240)), "3h04m");
        assert_eq!(human(Duration::from_secs(2 * 86400 + 3 * 3600)), "2d03h");
    }

    #[test]
    fn patterns_match_with_star_and_question_mark() {
        assert!(glob_match("orders-*", "orders-worker-7"));
        assert!(glob_match("*worker*", "orders-worker-7"));
        assert!(glob_match("orders-worker-?", "orders-worker-7"));
        assert!(glob_match("*", ""));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
        assert!(!glob_match("orders-?", "orders-10"));
        assert!(!glob_match("*-7", "worker-8"));
        assert!(!glob_match("a*b", "a"));
    }
}
