//! Who holds and who waits for advisory locks, read from the server's own views.
//!
//! An [`Inspector`] answers "who holds this lock, since when, and who is queued behind it?"
//! for one key or for every advisory lock of the database, with one query joining `pg_locks`
//! and `pg_stat_activity` (and, given the managers' fencing table, a second one for exact
//! ages). It needs no lock manager: any pool on the database will do, so an
//! operator tool or an admin endpoint can run it next to (or far from) the services that hold
//! the locks. The `pglock holders` command (crate `pglock-cli`) prints the same reports.
//!
//! ```no_run
//! use pglock::FencingTable;
//! use pglock::inspect::{Age, Inspector};
//!
//! # async fn run(pool: sqlx::PgPool) -> pglock::inspect::Result<()> {
//! let inspector = Inspector::new(pool)
//!     .known_keys(["leader:orders", "rebuild:orders"])
//!     .fencing_table(FencingTable::default());
//! for lock in inspector.all().await? {
//!     let name = lock.key_name().unwrap_or("(unknown key)");
//!     for holder in &lock.holders {
//!         let at_least = if holder.age == Some(Age::AtLeast) { "at least " } else { "" };
//!         println!("{name} held by pid {:?} ({:?}) for {at_least}{:?}",
//!             holder.pid, holder.holder_id, holder.held_or_waited_for);
//!     }
//!     for (place, waiter) in lock.waiters.iter().enumerate() {
//!         println!("  #{} in the queue: pid {:?}", place + 1, waiter.pid);
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! # What is listed
//!
//! * **Advisory locks of the current database only.** The advisory lock space is per database;
//!   locks other databases of the same server hold (or wait for) never conflict with these and
//!   are left out.
//! * **Both key spaces**: the single-`bigint` locks (`pg_advisory_lock(bigint)` and its
//!   shared, `try` and transaction-scoped forms, `objsubid = 1` in `pg_locks`: the locks of
//!   names, ids and sqlx-derived keys) and the two-`int4` ones (`pg_advisory_lock(int4,
//!   int4)`, `objsubid = 2`: [`LockKey::pair`](crate::LockKey::pair) keys). Each report's
//!   [`target`](LockReport::target) says which; the two spaces never conflict, even where a
//!   pair and an id pack to the same number.
//! * **Sessions, not tasks.** Waiters are server sessions, in the server's queue order; tasks
//!   queued inside a manager behind their own process's holder or waiter are not listed.
//! * Advisory locks of other software are listed (they share pglock's lock spaces, so a
//!   colliding id does contend); their [`key`](LockReport::key) is `None` unless you name it.
//!
//! # Keys
//!
//! The server only ever sees lock ids, never keys (see [`lock_id`]). A report carries a key
//! when the caller knows it: the key asked for with [`Inspector::key`], or one of the
//! [`known_keys`](Inspector::known_keys) with the same lock target.
//!
//! # Holder ids
//!
//! [`PostgresLockManager`](crate::PostgresLockManager) tags the sessions it holds and waits on
//! with `application_name = {prefix}{holder id}` (see
//! [`application_name_prefix`](crate::PostgresLockManagerBuilder::application_name_prefix)).
//! The inspector parses the holder id back out of names that start with its
//! [`application_name_prefix`](Inspector::application_name_prefix) (default `"pglock:"`). The
//! tag is printable ASCII cut to 63 bytes, so a holder id with other characters shows them as
//! `?`, and a long one shows cut.
//!
//! # Held for, waited for
//!
//! Each [`Session`] carries [`since`](Session::since) and
//! [`held_or_waited_for`](Session::held_or_waited_for) (the time from `since` to the start of
//! the inspection's statement, both read from the server's clock, so client clock skew plays
//! no part), and its [`age`](Session::age) says how to read them: [`Age::Exact`], or
//! [`Age::AtLeast`], a lower bound on the hold.
//!
//! * **A waiter** counts from `pg_locks.waitstart`, when its backend began to wait for the
//!   lock: exact. Waiters are listed in that order, which is the order of the server's queue
//!   (PostgreSQL grants advisory locks first come, first served). `waitstart` exists from
//!   PostgreSQL 14 on, and is briefly `NULL` right after a wait begins; without it `since` is
//!   `None`, and such waiters are ordered by the start of their statement after the others.
//! * **An exclusive holder fenced with the inspector's
//!   [`fencing_table`](Inspector::fencing_table)** counts from its grant: the table's
//!   `updated_at` for the lock, which the statement that granted the lock wrote by the
//!   server's clock as it minted the token (so exact to within that statement, for a
//!   waited-for lock too; after an in-process handoff, from the handoff, which is a new
//!   acquisition). See [below](#grant-times-from-the-fencing-table) for when it is used.
//! * **Any other holder** has no grant time: `pg_locks` does not record one. The inspector
//!   uses `pg_stat_activity.state_change` of a holder that is `idle` (or `idle in
//!   transaction`): the moment its last statement finished. The lock was granted by that
//!   statement or an earlier one, so this is a **lower bound** ([`Age::AtLeast`]). For a lock
//!   that pglock waited for (held on a session of its own) it is the grant itself, to within
//!   the lock statement's completion. A pglock lock session carries many locks and runs a
//!   statement for each acquisition and release, so for its locks the bound is the end of the
//!   session's latest statement, which may be much later than the grant. A holder that is
//!   running a statement (`active`) may have been granted the lock by that very statement, so
//!   no bound is known: `since` and `age` are `None`.
//!
//! # Grant times from the fencing table
//!
//! A [`PostgresLockManager`](crate::PostgresLockManager) built with a
//! [`FencingTable`] mints each acquisition's token in the very statement that takes the lock
//! (or, after an in-process handoff, the statement that hands it over) and stamps the row's
//! `updated_at` with the time of the grant. With
//! [`fencing_table`](Inspector::fencing_table), the inspector reads those times, in a second
//! query, and takes one as a holder's grant when all of these hold:
//!
//! * the holder holds the lock **exclusively**. Sharers keep their lower bound: the row holds
//!   only the latest of their grants, and nothing tells whose it is;
//! * the holder is **`idle`**, so its latest statement has committed and a token it minted is
//!   visible (a holder running a statement may be minting right now, while the row still
//!   shows the previous holder's time);
//! * the time is **consistent with the holder's session**: not before its `backend_start`,
//!   and not after its latest statement ended (`state_change`). A grant this session made
//!   always is; a later mint (a newer acquisition by a handoff) is not, and then the lower
//!   bound stays.
//!
//! If the table is missing, or the inspecting role may not read it, every holder keeps its
//! lower bound; nothing fails.
//!
//! **The corner left.** The row says when the latest *fenced* acquisition of the lock id was
//! granted, not by whom. A holder that does not mint in this table (a manager without
//! fencing or with another table, the Python original, `psql`, a [`LockKey::pair`] whose
//! packed id is the same number) holding a lock whose row an earlier, fenced holder wrote
//! passes the check when its session was already connected at that earlier grant (a
//! long-lived lock session, typically), and its age is then reported as exact but counts from
//! the earlier grant: too long, by at most the time between the two grants, and never longer
//! than its session has existed. The check rules out every session that connected after the
//! earlier grant. Fence every manager that takes a key with the same table, and the corner
//! is closed: a fenced acquisition always rewrites the row (a rollout that mixes fenced and
//! unfenced managers on one key reopens it).
//!
//! # Privileges
//!
//! `pg_locks` is readable by every role. `pg_stat_activity` shows the details of other roles'
//! sessions (client address, backend start, state) only to superusers and members of
//! `pg_read_all_stats`; for others those fields are `None`, and so is a holder's duration.
//! Process ids and application names are always shown.
//!
//! [`lock_id`]: crate::lock_id

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

#[cfg(doc)]
use crate::lock_id;
use crate::{FencingTable, LockKey, LockMode, LockTarget, split_lock_id};

mod granted;

/// A `Result` whose error is the inspection [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an inspection failed. Inspections only read, so a failure leaves nothing behind; try
/// again later.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No connection could be had from the pool, or it broke: the server is unreachable,
    /// restarting, or the pool is exhausted or closed.
    #[error("Lock inspection failed{}: no connection: {source}", for_key(.key))]
    Connection {
        /// The key that was inspected, when one was.
        key: Option<LockKey>,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },
    /// The server refused the inspection's query, or answered it in a way the inspector could
    /// not read.
    #[error("Lock inspection failed{}: {source}", for_key(.key))]
    Query {
        /// The key that was inspected, when one was.
        key: Option<LockKey>,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },
}

impl Error {
    /// `source` as one of the kinds: the connection, or the query.
    fn new(key: Option<LockKey>, source: sqlx::Error) -> Self {
        let connection = match &source {
            // The session ended, or the server is going away (SQLSTATE classes 08 and 57P).
            sqlx::Error::Database(_) => crate::sql::errors::breaks_connection(&source),
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            _ => false,
        };
        if connection {
            Error::Connection { key, source }
        } else {
            Error::Query { key, source }
        }
    }

    /// The key that was inspected, when one was.
    pub fn key(&self) -> Option<&LockKey> {
        match self {
            Error::Connection { key, .. } | Error::Query { key, .. } => key.as_ref(),
        }
    }
}

/// ` for '{key}'`, or nothing.
fn for_key(key: &Option<LockKey>) -> String {
    key.as_ref()
        .map(|key| format!(" for '{key}'"))
        .unwrap_or_default()
}

/// The `application_name` prefix that [`Inspector`] parses holder ids out of by default, the
/// default of [`PostgresLockManagerBuilder::application_name_prefix`](crate::PostgresLockManagerBuilder::application_name_prefix).
pub const DEFAULT_APPLICATION_NAME_PREFIX: &str = "pglock:";

// One row per `pg_locks` entry: the advisory locks of this database (both key spaces), each
// with its session. `$1`/`$2`/`$5` narrow it to one lock's (classid, objid, objsubid), or are
// NULL for all.
// `waitstart` is read through to_jsonb so the one statement also runs on PostgreSQL 13 and
// older, where the column does not exist (there it reads NULL). `$3` is the fencing table, or
// NULL, and `$4` its schema as given: whether it exists and may be read is asked here, so a
// missing table costs no failed statement (nor a line in the server's log) per inspection.
// `to_regclass` fails on a schema the role may not use, hence the USAGE check before it.
const REPORT: &str = "\
SELECT l.classid::bigint AS classid, l.objid::bigint AS objid, l.objsubid::smallint AS objsubid, \
       l.granted, \
       l.mode OPERATOR(pg_catalog.=) 'ShareLock' AS shared, l.pid, a.application_name, \
       pg_catalog.host(a.client_addr) AS client_addr, a.client_port, a.backend_start, a.state, \
       CASE WHEN NOT l.granted \
              THEN (pg_catalog.to_jsonb(l) OPERATOR(pg_catalog.->>) 'waitstart')::timestamp with time zone \
            WHEN a.state OPERATOR(pg_catalog.~~) 'idle%' THEN a.state_change END AS since, \
       pg_catalog.statement_timestamp() AS observed_at, \
       CASE WHEN $4::pg_catalog.text IS NOT NULL AND NOT coalesce((SELECT \
              pg_catalog.has_schema_privilege(n.oid, 'USAGE') FROM pg_catalog.pg_namespace n \
              WHERE n.nspname OPERATOR(pg_catalog.=) $4::pg_catalog.text), false) THEN false \
            ELSE coalesce(pg_catalog.has_table_privilege( \
              pg_catalog.to_regclass($3::pg_catalog.text), 'SELECT'), false) \
       END AS grants_readable \
FROM pg_catalog.pg_locks l \
  LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid \
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' \
  AND (l.objsubid OPERATOR(pg_catalog.=) 1 OR l.objsubid OPERATOR(pg_catalog.=) 2) \
  AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
    WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) \
  AND ($1::bigint IS NULL OR (l.classid OPERATOR(pg_catalog.=) $1::bigint::pg_catalog.oid \
       AND l.objid OPERATOR(pg_catalog.=) $2::bigint::pg_catalog.oid \
       AND l.objsubid OPERATOR(pg_catalog.=) $5::smallint)) \
ORDER BY l.objsubid, l.classid, l.objid, l.granted DESC, since NULLS LAST, \
         a.query_start NULLS LAST, l.pid";

/// Reads who holds and who waits for advisory locks. See the [module documentation](self).
///
/// Clone it freely: it holds a handle to the pool and the known keys.
#[derive(Debug, Clone)]
pub struct Inspector {
    pool: PgPool,
    prefix: Option<String>,
    known: HashMap<LockTarget, LockKey>,
    fencing: Option<FencingTable>,
}

impl Inspector {
    /// An inspector on `pool`'s database, with no known keys and the default prefix
    /// [`DEFAULT_APPLICATION_NAME_PREFIX`].
    ///
    /// Each inspection checks one connection out of the pool for one query.
    pub fn new(pool: PgPool) -> Self {
        Inspector {
            pool,
            prefix: Some(DEFAULT_APPLICATION_NAME_PREFIX.to_owned()),
            known: HashMap::new(),
            fencing: None,
        }
    }

    /// Adds keys (of any kind) whose locks reports should map back to them. May be called
    /// again to add more; if two known keys are the same lock, the first one added is kept.
    ///
    /// ```
    /// use pglock::{LockKey, LockTarget};
    /// use pglock::inspect::Inspector;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let pool = sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap();
    /// let inspector = Inspector::new(pool)
    ///     .known_keys(["leader:orders", "leader:billing"])
    ///     .known_keys([LockKey::pair(7, 42)]);
    /// assert_eq!(inspector.known_key(pglock::lock_id("leader:orders")), Some("leader:orders"));
    /// assert_eq!(inspector.known_key(42), None);
    /// let pair = inspector.known_target(LockTarget::IntPair(7, 42));
    /// assert_eq!(pair, Some(&LockKey::pair(7, 42)));
    /// # }
    /// ```
    pub fn known_keys<I>(mut self, keys: I) -> Self
    where
        I: IntoIterator,
        I::Item: Into<LockKey>,
    {
        for key in keys {
            let key = key.into();
            self.known.entry(key.target()).or_insert(key);
        }
        self
    }

    /// The `application_name` prefix that marks a pglock session; the rest of the name is its
    /// holder id. Use the prefix the managers were built with. `None` parses no holder ids.
    /// Default: `Some("pglock:")`.
    pub fn application_name_prefix(mut self, prefix: Option<&str>) -> Self {
        self.prefix = prefix.map(str::to_owned);
        self
    }

    /// Reads exclusive holders' grant times from `table`, the [`FencingTable`] of the managers
    /// that hold the locks, so their ages are exact ([`Age::Exact`]) instead of lower bounds;
    /// see [Grant times from the fencing table](self#grant-times-from-the-fencing-table) for
    /// when a time is used, and the corner it leaves. An unqualified name is looked up by the
    /// inspecting role's `search_path`.
    ///
    /// If the table is missing or the role may not read it (it needs `USAGE` on the schema
    /// and `SELECT` on the table), the inspection works as without it: lower bounds. Costs a second query when a listed lock
    /// has an idle exclusive holder. Default: none.
    ///
    /// ```
    /// use pglock::FencingTable;
    /// use pglock::inspect::Inspector;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let pool = sqlx::PgPool::connect_lazy("postgres://localhost/app").unwrap();
    /// let inspector = Inspector::new(pool).fencing_table(FencingTable::default());
    /// # let _ = inspector; }
    /// ```
    pub fn fencing_table(mut self, table: FencingTable) -> Self {
        self.fencing = Some(table);
        self
    }

    /// The name of the known key whose single-`bigint` lock id is `lock_id`, if any (a key
    /// known by name or id; pair keys: [`known_target`](Self::known_target)).
    pub fn known_key(&self, lock_id: i64) -> Option<&str> {
        self.known
            .get(&LockTarget::BigInt(lock_id))
            .and_then(LockKey::as_name)
    }

    /// The known key of the lock `target`, in either key space, if any.
    pub fn known_target(&self, target: LockTarget) -> Option<&LockKey> {
        self.known.get(&target)
    }

    /// Every advisory lock of the database that is held or awaited, in both key spaces (the
    /// single-`bigint` ones first), ordered by `(classid, objid)`: one report per lock, its
    /// holders by [`since`](Session::since)
    /// (earliest first), its waiters in the server's queue order. Tasks queued inside a
    /// manager (behind their own process's holder or waiter) are not sessions and do not
    /// appear: a process counts once, whatever the number of its tasks waiting for the key.
    ///
    /// # Errors
    ///
    /// [`Error`] (with no key) when the query cannot be run: no connection, or the server
    /// refused it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the query only reads, so dropping the future leaves nothing behind.
    pub async fn all(&self) -> Result<Vec<LockReport>> {
        self.query(None)
            .await
            .map_err(|source| Error::new(None, source))
    }

    /// The holders and waiters of `key`'s lock, a key of any kind (a name, an id, a pair). The
    /// report's [`key`](LockReport::key) is `key`; both lists are empty when the lock is
    /// free.
    ///
    /// # Errors
    ///
    /// [`Error`] carrying `key` when the query cannot be run.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the query only reads, so dropping the future leaves nothing behind.
    pub async fn key(&self, key: impl Into<LockKey>) -> Result<LockReport> {
        let key = key.into();
        let mut report = self.one(key.target(), Some(&key)).await?;
        report.key = Some(key);
        Ok(report)
    }

    /// The holders and waiters of the lock with id `lock_id`, for a lock whose key is not at
    /// hand (an id from `pg_locks` or a log line). The report's key is the known key of that
    /// id, if any.
    ///
    /// # Errors
    ///
    /// [`Error`] (carrying the known key, if any) when the query cannot be run.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the query only reads, so dropping the future leaves nothing behind.
    pub async fn by_lock_id(&self, lock_id: i64) -> Result<LockReport> {
        let target = LockTarget::BigInt(lock_id);
        self.one(target, self.known_target(target)).await
    }

    async fn one(&self, target: LockTarget, key: Option<&LockKey>) -> Result<LockReport> {
        let found = self
            .query(Some(target))
            .await
            .map_err(|source| Error::new(key.cloned(), source))?;
        Ok(found
            .into_iter()
            .next()
            .unwrap_or_else(|| self.report(target)))
    }

    async fn query(
        &self,
        target: Option<LockTarget>,
    ) -> std::result::Result<Vec<LockReport>, sqlx::Error> {
        let halves = target.map(|target| split_lock_id(target.packed()));
        let rows = sqlx::query(REPORT)
            .bind(halves.map(|(classid, _)| i64::from(classid)))
            .bind(halves.map(|(_, objid)| i64::from(objid)))
            .bind(self.fencing.as_ref().map(FencingTable::to_string))
            .bind(self.fencing.as_ref().and_then(|t| t.table().schema()))
            .bind(target.map(LockTarget::objsubid))
            .fetch_all(&self.pool)
            .await?;
        let mut reports: Vec<LockReport> = Vec::new();
        let mut grants_readable = false;
        let mut observed_at = None;
        for row in &rows {
            grants_readable |= row.try_get::<bool, _>("grants_readable")?;
            observed_at = Some(row.try_get::<DateTime<Utc>, _>("observed_at")?);
            let target = target_of(
                oid(row, "classid")?,
                oid(row, "objid")?,
                row.try_get("objsubid")?,
            );
            if reports.last().is_none_or(|last| last.target != target) {
                reports.push(self.report(target));
            }
            let session = self.session(row)?;
            let report = reports.last_mut().expect("pushed above");
            if row.try_get("granted")? {
                report.holders.push(session);
            } else {
                report.waiters.push(session);
            }
        }
        if let (Some(table), Some(observed_at), true) =
            (&self.fencing, observed_at, grants_readable)
        {
            granted::read(&self.pool, table, &mut reports, observed_at).await?;
        }
        Ok(reports)
    }

    fn report(&self, target: LockTarget) -> LockReport {
        let lock_id = target.packed();
        let (classid, objid) = split_lock_id(lock_id);
        LockReport {
            lock_id,
            classid,
            objid,
            target,
            key: self.known_target(target).cloned(),
            holders: Vec::new(),
            waiters: Vec::new(),
        }
    }

    fn session(&self, row: &PgRow) -> std::result::Result<Session, sqlx::Error> {
        let application_name: Option<String> = row.try_get("application_name")?;
        let since: Option<DateTime<Utc>> = row.try_get("since")?;
        let observed_at: DateTime<Utc> = row.try_get("observed_at")?;
        let client_addr: Option<String> = row.try_get("client_addr")?;
        let client_port: Option<i32> = row.try_get("client_port")?;
        let granted: bool = row.try_get("granted")?;
        Ok(Session {
            pid: row.try_get("pid")?,
            mode: if row.try_get("shared")? {
                LockMode::Shared
            } else {
                LockMode::Exclusive
            },
            holder_id: holder_id(self.prefix.as_deref(), application_name.as_deref()),
            application_name,
            client_addr: client_addr.and_then(|addr| addr.parse().ok()),
            // -1 for a Unix-domain socket.
            client_port: client_port.and_then(|port| u16::try_from(port).ok()),
            backend_start: row.try_get("backend_start")?,
            state: row.try_get("state")?,
            since,
            held_or_waited_for: since.map(|since| age(observed_at, since)),
            // A waiter's wait start is exact; a holder's end of statement, a bound.
            age: since.map(|_| if granted { Age::AtLeast } else { Age::Exact }),
        })
    }
}

/// The time from `since` to `observed_at`; a session that changed state after the statement
/// started reads as zero.
fn age(observed_at: DateTime<Utc>, since: DateTime<Utc>) -> Duration {
    (observed_at - since).to_std().unwrap_or(Duration::ZERO)
}

/// The holder id in `application_name`: what follows `prefix`, if anything does.
fn holder_id(prefix: Option<&str>, application_name: Option<&str>) -> Option<String> {
    application_name?
        .strip_prefix(prefix?)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// An `oid` column, read as `int8` (sqlx has no unsigned integers).
fn oid(row: &PgRow, column: &str) -> std::result::Result<u32, sqlx::Error> {
    let value: i64 = row.try_get(column)?;
    u32::try_from(value).map_err(|err| sqlx::Error::Decode(Box::new(err)))
}

/// The lock id whose `pg_locks` halves are `classid` and `objid`: the inverse of
/// [`split_lock_id`].
fn join_lock_id(classid: u32, objid: u32) -> i64 {
    ((u64::from(classid) << 32) | u64::from(objid)) as i64
}

/// The lock a `pg_locks` row of an advisory lock is about: a pair for `objsubid = 2`, a
/// single `bigint` otherwise (the query reads only 1 and 2).
fn target_of(classid: u32, objid: u32, objsubid: i16) -> LockTarget {
    match objsubid {
        2 => LockTarget::IntPair(classid as i32, objid as i32),
        _ => LockTarget::BigInt(join_lock_id(classid, objid)),
    }
}

/// One advisory lock: who holds it and who waits for it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockReport {
    /// The lock: a single `bigint` or a pair of `int4`s, in their own key spaces.
    pub target: LockTarget,
    /// The lock id, as [`lock_id`] derives it from a key; for a pair, the pair packed
    /// ([`LockTarget::packed`]), as [`LockInfo::lock_id`](crate::LockInfo::lock_id) has it.
    pub lock_id: i64,
    /// The high 32 bits of the lock id (the first of a pair): `pg_locks.classid`.
    pub classid: u32,
    /// The low 32 bits of the lock id (the second of a pair): `pg_locks.objid`.
    pub objid: u32,
    /// The key, when the caller named it or knew it (see [`Inspector::known_keys`]). Compare
    /// it with a name directly: `report.key == Some("leader:orders".into())`, or
    /// [`key_name`](Self::key_name).
    pub key: Option<LockKey>,
    /// The sessions that hold the lock: one, or any number of sharers. One session holding the
    /// lock in both modes is listed once per mode.
    pub holders: Vec<Session>,
    /// The sessions waiting for the lock, first in the queue first.
    pub waiters: Vec<Session>,
}

impl LockReport {
    /// The name of the report's key, when it is a named key.
    pub fn key_name(&self) -> Option<&str> {
        self.key.as_ref().and_then(LockKey::as_name)
    }

    /// True when nobody holds or waits for the lock.
    pub fn is_free(&self) -> bool {
        self.holders.is_empty() && self.waiters.is_empty()
    }
}

/// A session holding or waiting for a lock, as `pg_locks` and `pg_stat_activity` show it.
///
/// The `pg_stat_activity` fields are `None` when the session has no row there (it has just
/// ended) or the inspecting role may not see them (see the [module documentation](self)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Session {
    /// The server process id (`pg_backend_pid()` of the session); `None` for a lock held by a
    /// prepared transaction, which has no process.
    pub pid: Option<i32>,
    /// The mode held, or waited for.
    pub mode: LockMode,
    /// The session's `application_name`.
    pub application_name: Option<String>,
    /// The holder id parsed out of the application name, when it starts with the inspector's
    /// prefix: set for sessions of [`PostgresLockManager`](crate::PostgresLockManager) (with
    /// tagging on), `None` for others.
    pub holder_id: Option<String>,
    /// The client's IP address; `None` for a Unix-domain socket connection.
    pub client_addr: Option<IpAddr>,
    /// The client's TCP port; `None` for a Unix-domain socket connection.
    pub client_port: Option<u16>,
    /// When the session (its server process) started.
    pub backend_start: Option<DateTime<Utc>>,
    /// `pg_stat_activity.state`: `idle`, `active`, `idle in transaction`, ...
    pub state: Option<String>,
    /// For a waiter, when it began to wait; for a holder, the grant, or a moment after it, as
    /// [`age`](Self::age) says (see the [module documentation](self#held-for-waited-for)).
    pub since: Option<DateTime<Utc>>,
    /// How long the session has waited, or held the lock, up to the inspection: exact, or a
    /// lower bound, as [`age`](Self::age) says.
    pub held_or_waited_for: Option<Duration>,
    /// Whether `since` and `held_or_waited_for` are exact or a lower bound on the hold; `None`
    /// when they are unknown.
    pub age: Option<Age>,
}

/// How to read a [`Session`]'s [`since`](Session::since) and
/// [`held_or_waited_for`](Session::held_or_waited_for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Age {
    /// Exact: a waiter's wait start, or an exclusive holder's grant read from the
    /// [fencing table](Inspector::fencing_table).
    Exact,
    /// A lower bound on the hold: `since` is the end of the holder's latest statement, at or
    /// after the grant, so the lock has been held for at least `held_or_waited_for`.
    AtLeast,
}

impl Age {
    /// `"exact"` or `"at_least"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Age::Exact => "exact",
            Age::AtLeast => "at_least",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock_id;

    #[test]
    fn holder_ids_are_what_follows_the_prefix() {
        let parse = |app: &str| holder_id(Some("pglock:"), Some(app));
        assert_eq!(parse("pglock:worker-1").as_deref(), Some("worker-1"));
        assert_eq!(parse("pglock:a:b").as_deref(), Some("a:b"));
        assert_eq!(parse("pglock:"), None, "an empty id is no id");
        assert_eq!(parse("psql"), None);
        assert_eq!(parse("app:pglock-monitor"), None);
        assert_eq!(holder_id(Some("lk/"), Some("lk/w")).as_deref(), Some("w"));
        assert_eq!(holder_id(None, Some("pglock:w")), None);
        assert_eq!(holder_id(Some("pglock:"), None), None);
    }

    #[test]
    fn pg_locks_rows_name_the_key_space_they_are_in() {
        assert_eq!(target_of(0, 7, 1), LockTarget::BigInt(7));
        assert_eq!(target_of(0, 7, 2), LockTarget::IntPair(0, 7));
        let (classid, objid) = split_lock_id(LockTarget::IntPair(-1, -2).packed());
        assert_eq!(target_of(classid, objid, 2), LockTarget::IntPair(-1, -2));
    }

    #[test]
    fn lock_ids_survive_the_round_trip_through_pg_locks_halves() {
        for id in [0, 1, i64::MAX, i64::MIN, -1, lock_id("alpha"), 1 << 32] {
            let (classid, objid) = split_lock_id(id);
            assert_eq!(join_lock_id(classid, objid), id, "{id}");
        }
    }
}
