//! SQL identifiers given by users (table names), checked and quoted.

use crate::error::InvalidIdentifier;

/// Quotes `name` as an SQL identifier; with `qualified`, `schema.table` is two identifiers.
pub(crate) fn quote_identifier(
    name: &str,
    qualified: bool,
) -> std::result::Result<String, InvalidIdentifier> {
    let invalid = |reason: &'static str| InvalidIdentifier {
        name: name.to_owned(),
        reason,
    };
    let parts: Vec<&str> = if qualified {
        name.split('.').collect()
    } else {
        vec![name]
    };
    if parts.len() > 2 {
        return Err(invalid("expected `table` or `schema.table`"));
    }
    let mut quoted = Vec::with_capacity(parts.len());
    for part in parts {
        if part.is_empty() {
            return Err(invalid("an empty name part"));
        }
        if part.len() > 63 {
            return Err(invalid("a name part longer than 63 bytes"));
        }
        if part.contains('\0') {
            return Err(invalid("a NUL byte"));
        }
        quoted.push(format!("\"{}\"", part.replace('"', "\"\"")));
    }
    Ok(quoted.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_validated_and_quoted() {
        assert_eq!(
            quote_identifier(r#"we"ird; DROP TABLE x"#, true).unwrap(),
            r#""we""ird; DROP TABLE x""#
        );
        assert_eq!(quote_identifier("s.t", true).unwrap(), r#""s"."t""#);
        assert_eq!(quote_identifier("s.t", false).unwrap(), r#""s.t""#);
        for bad in ["", "a.", ".b", "a.b.c", "nul\0", &"x".repeat(64)] {
            assert!(quote_identifier(bad, true).is_err(), "{bad:?}");
        }
        assert!(quote_identifier(&"x".repeat(63), true).is_ok());
    }
}
