//! The fenced resource: tables in a database the nemesis leaves alone, written by the
//! workers with their fencing tokens, and read back after the run as the resource's own view.
//!
//! Every table name starts with the run's prefix, so runs can share a database.
//!
//! * `{p}_fences (key, fence)`: the highest token each key's resource has accepted.
//! * `{p}_events (seq, key, token, kind, at_us, accepted, holder)`: every section start and
//!   end (`kind` `start`/`end`) and log append (`append`) asked of the resource, accepted or
//!   refused, in the order the resource took them (`seq`), with the server's time and the
//!   holder that asked.
//! * `{p}_counters (key, value, fence)`: the read-modify-write counters, fenced by
//!   [`RowFence`].

use pglock::RowFence;
use pglock::fence::Error as FenceError;
use sqlx::{AssertSqlSafe, PgPool};

use crate::history::{Op, Outcome, Record};

/// What became of a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// The resource took it.
    Accepted,
    /// The resource refused it: a higher token had been there.
    Refused,
    /// The statement failed: whether it took effect is unknown.
    Unknown,
}

/// The resource of one run.
#[derive(Debug, Clone)]
pub struct Resource {
    pool: PgPool,
    prefix: String,
}

impl Resource {
    /// The resource of the run whose tables start with `prefix`, in `pool`'s database.
    pub fn new(pool: PgPool, prefix: &str) -> Resource {
        Resource {
            pool,
            prefix: prefix.to_owned(),
        }
    }

    fn table(&self, name: &str) -> String {
        format!("{}_{name}", self.prefix)
    }

    /// Creates the tables, and one counter row (value 0) for each of `counters`.
    ///
    /// # Errors
    ///
    /// When a statement fails.
    pub async fn create(&self, counters: &[String]) -> sqlx::Result<()> {
        let (fences, events, counts) = (
            self.table("fences"),
            self.table("events"),
            self.table("counters"),
        );
        for ddl in [
            format!("CREATE TABLE IF NOT EXISTS \"{fences}\" (key text PRIMARY KEY, fence bigint)"),
            format!(
                "CREATE TABLE IF NOT EXISTS \"{events}\" (seq bigserial PRIMARY KEY, key text NOT NULL, \
                 token bigint NOT NULL, kind text NOT NULL, at_us bigint NOT NULL, \
                 accepted boolean NOT NULL, holder text NOT NULL)"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS \"{counts}\" (key text PRIMARY KEY, value bigint NOT NULL, \
                 fence bigint)"
            ),
        ] {
            sqlx::query(AssertSqlSafe(ddl)).execute(&self.pool).await?;
        }
        for key in counters {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO \"{counts}\" (key, value) VALUES ($1, 0) ON CONFLICT DO NOTHING"
            )))
            .bind(key)
            .execute(&self.pool)
            .await?;
        }
        Ok(())
    }

    /// Records an event of `key` under `token` by `holder`, accepted if no higher token has
    /// been accepted for `key` (which raises the key's fence to `token`) and refused otherwise;
    /// either way the attempt is recorded. One statement: the row lock on the key's fence,
    /// taken whether or not the fence moves and held to the commit, orders the key's events as
    /// the resource took them. The event's `seq` and time are computed from the aggregate over
    /// the fence's upsert, so only once that lock is held.
    pub async fn fenced_event(&self, key: &str, token: i64, kind: &str, holder: &str) -> Write {
        let (fences, events) = (self.table("fences"), self.table("events"));
        let sql = format!(
            "WITH f AS (INSERT INTO \"{fences}\" AS t (key, fence) VALUES ($1, $2) \
               ON CONFLICT (key) DO UPDATE SET fence = $2 WHERE t.fence IS NULL OR t.fence <= $2 \
               RETURNING key) \
             INSERT INTO \"{events}\" (key, token, kind, at_us, accepted, holder) \
             SELECT $1, $2, $3, {NOW_US}, a.accepted, $4 \
               FROM (SELECT count(*) > 0 AS accepted FROM f) a \
             RETURNING accepted"
        );
        let result: sqlx::Result<bool> = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(key)
            .bind(token)
            .bind(kind)
            .bind(holder)
            .fetch_one(&self.pool)
            .await;
        match result {
            Ok(true) => Write::Accepted,
            Ok(false) => Write::Refused,
            Err(_) => Write::Unknown,
        }
    }

    /// Records an event without looking at the fence: the negative control's unfenced writes.
    pub async fn unfenced_event(&self, key: &str, token: i64, kind: &str, holder: &str) -> Write {
        let events = self.table("events");
        let sql = format!(
            "INSERT INTO \"{events}\" (key, token, kind, at_us, accepted, holder) \
             VALUES ($1, $2, $3, {NOW_US}, true, $4)"
        );
        let result = sqlx::query(AssertSqlSafe(sql))
            .bind(key)
            .bind(token)
            .bind(kind)
            .bind(holder)
            .execute(&self.pool)
            .await;
        match result {
            Ok(_) => Write::Accepted,
            Err(_) => Write::Unknown,
        }
    }

    /// One fenced read-modify-write of a counter, as the guide teaches: raise the row's fence
    /// to `token` (which reads the row), then write only while the fence holds that token.
    /// Returns the outcome and the value written.
    pub async fn fenced_increment(&self, key: &str, token: i64) -> (Write, Option<i64>) {
        let fence = RowFence::new(&self.table("counters"), "key", "fence")
            .and_then(|fence| fence.returning(&["value"]))
            .expect("valid names");
        let (value,): (i64,) = match fence.raise(&self.pool, key, token).await {
            Ok(read) => read,
            Err(FenceError::StaleToken { .. }) => return (Write::Refused, None),
            // Nothing was written when the raise did not answer; the raise alone writes no value.
            Err(_) => return (Write::Refused, None),
        };
        compute().await;
        match fence
            .write(&self.pool, key, token, "value", value + 1)
            .await
        {
            Ok(()) => (Write::Accepted, Some(value + 1)),
            Err(FenceError::StaleToken { .. }) => (Write::Refused, None),
            Err(_) => (Write::Unknown, Some(value + 1)),
        }
    }

    /// The negative control's increment: a plain read, then a write checked on the write side
    /// alone (`fence <= token`).
    pub async fn write_checked_increment(&self, key: &str, token: i64) -> (Write, Option<i64>) {
        let counts = self.table("counters");
        let read: sqlx::Result<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT value FROM \"{counts}\" WHERE key = $1"
        )))
        .bind(key)
        .fetch_one(&self.pool)
        .await;
        let Ok(value) = read else {
            return (Write::Refused, None);
        };
        compute().await;
        let written = sqlx::query(AssertSqlSafe(format!(
            "UPDATE \"{counts}\" SET value = $3, fence = $2 \
             WHERE key = $1 AND (fence IS NULL OR fence <= $2)"
        )))
        .bind(key)
        .bind(token)
        .bind(value + 1)
        .execute(&self.pool)
        .await;
        match written {
            Ok(done) if done.rows_affected() == 1 => (Write::Accepted, Some(value + 1)),
            Ok(_) => (Write::Refused, None),
            Err(_) => (Write::Unknown, Some(value + 1)),
        }
    }

    /// The resource's own view, as records of the process `"resource"`: every event asked of
    /// it (`ok` if accepted, `fail` if refused) with its `seq` and `holder`, and every
    /// counter's final value.
    ///
    /// An event's time is the server's clock mapped onto the monotonic one by the offset
    /// between the two at the read-back: good enough to draw, never used to order events (the
    /// checker orders them by `seq`).
    ///
    /// # Errors
    ///
    /// When a statement fails.
    pub async fn view(&self) -> sqlx::Result<Vec<Record>> {
        let offset = realtime_minus_monotonic_us();
        type Row = (i64, String, i64, String, i64, bool, String);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT seq, key, token, kind, at_us, accepted, holder FROM \"{}\" ORDER BY seq",
            self.table("events")
        )))
        .fetch_all(&self.pool)
        .await?;
        let mut records: Vec<Record> = rows
            .into_iter()
            .map(|(seq, key, token, kind, at_us, accepted, holder)| {
                let op = match kind.as_str() {
                    "start" => Op::ResourceStart,
                    "end" => Op::ResourceEnd,
                    _ => Op::ResourceAppend,
                };
                let at = u64::try_from(at_us - offset).unwrap_or(0);
                Record {
                    outcome: if accepted { Outcome::Ok } else { Outcome::Fail },
                    holder: Some(holder),
                    seq: u64::try_from(seq).ok(),
                    ..resource_record(op, key, at, Some(token), None)
                }
            })
            .collect();
        let counters: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT key, value FROM \"{}\" ORDER BY key",
            self.table("counters")
        )))
        .fetch_all(&self.pool)
        .await?;
        let now = crate::history::now_us();
        records.extend(
            counters
                .into_iter()
                .map(|(key, value)| resource_record(Op::CounterFinal, key, now, None, Some(value))),
        );
        Ok(records)
    }
}

/// The database's clock in microseconds since the epoch: the server runs on this machine, so
/// its wall clock is ours, and [`realtime_minus_monotonic_us`] maps it onto the monotonic one.
const NOW_US: &str = "(extract(epoch from clock_timestamp()) * 1000000)::bigint";

/// The wall clock minus the monotonic clock, in microseconds.
fn realtime_minus_monotonic_us() -> i64 {
    let mono = crate::history::now_us();
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    real - mono as i64
}

fn resource_record(op: Op, key: String, at: u64, token: Option<i64>, value: Option<i64>) -> Record {
    Record {
        process: "resource".to_owned(),
        task: 0,
        op,
        key,
        start_us: at,
        end_us: at,
        outcome: Outcome::Ok,
        token,
        value,
        detail: None,
        holder: None,
        seq: None,
    }
}

/// The "modify" of a read-modify-write: time real work would take between the read and the
/// write (not synchronisation). It widens the window a stale holder races its successor in.
async fn compute() {
    tokio::time::sleep(std::time::Duration::from_millis(COMPUTE_MS)).await;
}

/// See [`compute`].
const COMPUTE_MS: u64 = 5;
