//! Exclusive holders' grant times, read from the fencing table (see the module documentation's
//! "Grant times from the fencing table").

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgPool};

use super::{Age, LockReport, Session, age};
use crate::{FencingTable, LockMode};

/// Replaces the lower bound of every holder in `reports` whose grant time the fencing table
/// tells with that time, aged against `observed_at` (the report's own statement time).
///
/// A refusal by the server (the table dropped since the report's check, a privilege revoked,
/// a table without the expected columns) leaves the lower bounds; only a failure to reach the
/// server is an error.
pub(super) async fn read(
    pool: &PgPool,
    table: &FencingTable,
    reports: &mut [LockReport],
    observed_at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    let ids: Vec<i64> = reports
        .iter()
        .filter(|report| report.holders.iter().any(candidate))
        .map(|report| report.lock_id)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    // The name is a quoted identifier (see `FencingTable`), never raw user text.
    let sql = format!(
        "SELECT lock_id, updated_at FROM {table} WHERE lock_id OPERATOR(pg_catalog.=) ANY($1)"
    );
    let rows: Vec<(i64, DateTime<Utc>)> = match sqlx::query_as(AssertSqlSafe(sql))
        .bind(&ids)
        .fetch_all(pool)
        .await
    {
        Ok(rows) => rows,
        // The server or the connection failed: the inspection fails as any query would.
        Err(
            err @ (sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Protocol(_)),
        ) => return Err(err),
        // The table answered, but not as expected (refused, or columns of other types):
        // the ages stay lower bounds.
        Err(err) => {
            tracing::debug!(table = %table, error = %err, "fencing table unreadable; ages stay lower bounds");
            return Ok(());
        }
    };
    let minted: HashMap<i64, DateTime<Utc>> = rows.into_iter().collect();
    for report in reports {
        let Some(&granted) = minted.get(&report.lock_id) else {
            continue;
        };
        for holder in report.holders.iter_mut() {
            if candidate(holder) && consistent(holder, granted) {
                holder.since = Some(granted);
                holder.held_or_waited_for = Some(age(observed_at, granted));
                holder.age = Some(Age::Exact);
            }
        }
        // Holders stay ordered by `since`, earliest first, unknown last.
        report
            .holders
            .sort_by_key(|holder| (holder.since.is_none(), holder.since));
    }
    Ok(())
}

/// A holder whose grant the table may tell: exclusive (the row holds only the latest of
/// several sharers' grants), and idle, so its latest statement has committed and a token it
/// minted is visible.
fn candidate(holder: &Session) -> bool {
    holder.mode == LockMode::Exclusive && holder.state.as_deref() == Some("idle")
}

/// Whether `granted` can be the grant of `holder`'s lock: within the life of its session, and
/// not after its latest statement ended (`since` of an idle holder).
fn consistent(holder: &Session, granted: DateTime<Utc>) -> bool {
    let connected = holder.backend_start.is_some_and(|start| start <= granted);
    let by_then = holder.since.is_some_and(|idle_since| granted <= idle_since);
    connected && by_then
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeDelta;

    fn holder(mode: LockMode, state: &str, start: DateTime<Utc>, idle: DateTime<Utc>) -> Session {
        Session {
            pid: Some(1),
            mode,
            application_name: None,
            holder_id: None,
            client_addr: None,
            client_port: None,
            backend_start: Some(start),
            state: Some(state.to_owned()),
            since: Some(idle),
            held_or_waited_for: None,
            age: Some(Age::AtLeast),
        }
    }

    #[test]
    fn a_grant_time_must_fall_within_the_session_before_its_latest_statement_ended() {
        let start = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::days(20_000);
        let idle = start + TimeDelta::seconds(60);
        let exclusive = holder(LockMode::Exclusive, "idle", start, idle);
        for (offset, ok) in [(-1, false), (0, true), (30, true), (60, true), (61, false)] {
            let granted = start + TimeDelta::seconds(offset);
            assert_eq!(consistent(&exclusive, granted), ok, "{offset}");
        }
        assert!(candidate(&exclusive));
        assert!(!candidate(&holder(LockMode::Shared, "idle", start, idle)));
        let running = holder(LockMode::Exclusive, "active", start, idle);
        assert!(!candidate(&running), "an active holder may be minting now");
        let in_transaction = holder(LockMode::Exclusive, "idle in transaction", start, idle);
        assert!(!candidate(&in_transaction), "its mint may be uncommitted");
    }
}
