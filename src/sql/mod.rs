//! How this crate speaks SQL, in one place for the managers and the recipes: identifiers,
//! what a failed statement means, timeouts in milliseconds, and the tables it owns.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `identifier.rs` | user-given table names, checked and quoted |
//! | `errors.rs` | SQLSTATEs, and how driver failures become this crate's errors |
//! | `table.rs` | a table of the crate's own (fencing tokens, job records): is it ready, may the role use it |

pub(crate) mod errors;
mod identifier;
pub(crate) mod table;

pub(crate) use self::identifier::quote_identifier;

/// PostgreSQL's largest `lock_timeout`, in milliseconds; longer waits are split.
pub(crate) const MAX_LOCK_TIMEOUT_MS: u128 = i32::MAX as u128;

/// A duration in whole milliseconds, rounded up: a server-side timeout made of it never ends
/// before the duration has.
pub(crate) fn whole_ms(duration: std::time::Duration) -> u128 {
    duration.as_nanos().div_ceil(1_000_000)
}
