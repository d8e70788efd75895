//! Default holder identities and their form in `application_name`.

/// A holder id unique per process and per call: `{host}:{pid}:{16 hex digits}`.
///
/// The random part (64 bits, fresh per call) keeps two managers of one process apart, and
/// processes forked from one parent apart too, since it is drawn when the manager is built,
/// not when the program starts. Host and pid make it readable in `pg_stat_activity`.
pub(crate) fn default_holder_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_owned())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "host".to_owned());
    let random = uuid::Uuid::new_v4().as_u64_pair().0;
    format!("{host}:{}:{random:016x}", std::process::id())
}

/// Makes `name` acceptable as an `application_name`: printable ASCII only (PostgreSQL would
/// replace anything else with `?` anyway) and at most 63 bytes, the server's limit.
pub(crate) fn application_name(name: &str) -> String {
    name.chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '?' })
        .take(63)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_ids_differ_per_call() {
        let (a, b) = (default_holder_id(), default_holder_id());
        assert_ne!(a, b);
        assert!(a.contains(&format!(":{}:", std::process::id())), "{a}");
    }

    #[test]
    fn application_names_are_printable_and_short() {
        assert_eq!(application_name("pglock:w\u{e9}\n1"), "pglock:w??1");
        assert_eq!(application_name(&"x".repeat(100)).len(), 63);
        assert_eq!(application_name("ключ"), "????");
    }
}
