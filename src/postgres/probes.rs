//! The server's side of the probes that find lock-order cycles across managers (see
//! `core/cycles/`): the channel they travel on, the markers a manager's waits named in probes
//! hold, and the confirmation of a cycle against `pg_locks` before it ends a wait.
//!
//! All of it runs on the doorbell's listener connection (`doorbell.rs`), which also holds the
//! markers (shared, as it holds the waiters' flags), so they go with it whenever it closes.

use std::collections::HashSet;
use std::time::Duration;

use sqlx::AssertSqlSafe;
use sqlx::postgres::PgListener;
use tokio::time::timeout;

use crate::core::{Cycle, Waits};

/// The channel of the probes.
pub(crate) const PROBE_CHANNEL: &str = "pglock_probe";

/// Sends `probes` on the probe channel.
pub(crate) async fn send(
    conn: &mut PgListener,
    probes: &[String],
    bound: Duration,
) -> Result<(), sqlx::Error> {
    if probes.is_empty() {
        return Ok(());
    }
    let sql = format!(
        "SELECT pg_catalog.count(pg_catalog.pg_notify('{PROBE_CHANNEL}', m)) \
         FROM pg_catalog.unnest($1::pg_catalog.text[]) AS m"
    );
    let query = sqlx::query(AssertSqlSafe(sql)).bind(probes);
    bounded(bound, query.execute(conn)).await.map(drop)
}

/// How many of the hops numbered in `hops` have one of their `markers` (the same length)
/// held, in this database, by a session of the role this connection logged in as.
const CONFIRM: &str = "SELECT pg_catalog.count(DISTINCT e.hop)::bigint \
    FROM ROWS FROM (pg_catalog.unnest($1::integer[]), pg_catalog.unnest($2::bigint[])) \
        AS e(hop, marker) \
    WHERE EXISTS (SELECT FROM pg_catalog.pg_locks l \
        JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid \
        WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted \
        AND l.objsubid OPERATOR(pg_catalog.=) 2 \
        AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d \
            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
        AND ((l.classid::bigint OPERATOR(pg_catalog.<<) 32) \
            OPERATOR(pg_catalog.|) l.objid::bigint) OPERATOR(pg_catalog.=) e.marker \
        AND a.usesysid OPERATOR(pg_catalog.=) (SELECT s.usesysid \
            FROM pg_catalog.pg_stat_activity s \
            WHERE s.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()))";

/// Confirms each of `cycles` against the server and settles it with `waits`: real only if
/// every other manager's wait on it has its markers held by a session of this connection's
/// role. A cycle that cannot be looked at (the statement failed) is settled as not confirmed,
/// and the error returned.
pub(crate) async fn confirm(
    conn: &mut PgListener,
    waits: &Waits,
    cycles: Vec<Cycle>,
    bound: Duration,
) -> Result<(), sqlx::Error> {
    let mut failed = None;
    for cycle in cycles {
        let evidence = waits.evidence(&cycle);
        let (hops, markers): (Vec<i32>, Vec<i64>) = evidence.iter().copied().unzip();
        let needed = hops.iter().collect::<HashSet<_>>().len() as i64;
        let confirmed = if needed == 0 || failed.is_some() {
            needed == 0
        } else {
            let query = sqlx::query_scalar::<_, i64>(CONFIRM)
                .bind(&hops)
                .bind(&markers);
            match bounded(bound, query.fetch_one(&mut *conn)).await {
                Ok(found) => found == needed,
                Err(err) => {
                    failed = Some(err);
                    false
                }
            }
        };
        waits.settle(cycle, confirmed);
    }
    failed.map_or(Ok(()), Err)
}

async fn bounded<T>(
    bound: Duration,
    statement: impl Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    timeout(bound, statement)
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)?
}
