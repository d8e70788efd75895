//! The statements behind `PostgresLockManager`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::time::{Instant, timeout, timeout_at};

use super::fencing::FencingTable;
use super::session::{IdleSessions, PgSession};
use crate::core::{Backend, Core, Request};
use crate::{Error, LockMode, ReleaseFailure, Result};

// Each statement is one round trip in autocommit. An acquisition first tries
// (`pg_try_advisory_lock`, prepared once per connection), so an uncontended lock costs one round
// trip. Only when the key is held elsewhere does it wait on the server, with one simple-query
// message: `SET LOCAL`s followed by `pg_advisory_lock`, all in the message's implicit
// transaction, so no setting outlives the wait whether it is granted or times out.
//
// * `lock_timeout` makes the server end the wait at the caller's deadline (SQLSTATE 55P03),
//   leaving the session clean; no client-side polling.
// * `client_connection_check_interval` (PostgreSQL 14+) makes a waiting backend notice that its
//   client has gone (a cancelled acquisition closes its session) and leave the lock queue,
//   instead of waiting on until it is granted a lock nobody wants. The server arms that check
//   when a statement starts, which is why it must be set by an earlier statement of the same
//   message rather than inside the waiting statement itself.
// * With fencing on, the token is minted by the same statement (a data-modifying CTE after the
//   try) or the same message (an INSERT after the wait): no extra round trip.
// * With session tagging on, the try also sets `application_name` (session-level, so waiters
//   and holders show who they are in `pg_stat_activity`); the original value is restored before
//   the connection goes back to the pool.
//
// The waiting message is built from integers the crate computed and the fencing table's quoted
// identifier, never from user text; the holder id only ever travels as a bound parameter.

/// How often a waiting backend checks that its client is still there, in milliseconds.
const CLIENT_CHECK_MS: u32 = 200;

/// SQLSTATE `lock_not_available`: `lock_timeout` expired while waiting, so nothing was granted.
const LOCK_NOT_AVAILABLE: &str = "55P03";

const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
const UNLOCK_SHARED: &str = "SELECT pg_advisory_unlock_shared($1)";

/// The statements of one manager, built once from its configuration.
pub(crate) struct Statements {
    // Shared, so binding a statement to a query does not copy its text.
    try_exclusive: Arc<str>,
    try_shared: Arc<str>,
    /// Mints the next token of lock id `$1`, after a handoff.
    mint: Option<Arc<str>>,
    fencing: Option<FencingTable>,
    /// The `application_name` of the manager's sessions while it uses them.
    pub(crate) tag: Option<String>,
}

impl Statements {
    pub(crate) fn new(fencing: Option<FencingTable>, tag: Option<String>) -> Self {
        let try_statement = |function: &str| {
            let set_tag = if tag.is_some() {
                ", set_config('application_name', $2, false) AS tagged"
            } else {
                ""
            };
            // Columns: pid, the application_name before this statement, granted, token.
            let probe = format!(
                "SELECT pg_backend_pid() AS pid, current_setting('application_name') AS app, \
                 {function}($1) AS granted{set_tag}"
            );
            match &fencing {
                None => format!(
                    "SELECT pg_backend_pid(), current_setting('application_name'), \
                     {function}($1), NULL::int8{set_tag}"
                ),
                Some(table) => format!(
                    "WITH l AS MATERIALIZED ({probe}), m AS ({}) \
                     SELECT l.pid, l.app, l.granted, (SELECT token FROM m) FROM l",
                    table.mint_if_granted("l")
                ),
            }
        };
        Statements {
            try_exclusive: try_statement("pg_try_advisory_lock").into(),
            try_shared: try_statement("pg_try_advisory_lock_shared").into(),
            mint: fencing.as_ref().map(|table| table.mint("$1").into()),
            fencing,
            tag,
        }
    }

    fn try_lock(&self, mode: LockMode) -> Arc<str> {
        Arc::clone(match mode {
            LockMode::Exclusive => &self.try_exclusive,
            LockMode::Shared => &self.try_shared,
        })
    }

    fn wait(
        &self,
        lock_id: i64,
        mode: LockMode,
        timeout_ms: Option<u128>,
        server_version: u32,
    ) -> String {
        let mut sql = String::with_capacity(256);
        if server_version >= 140_000 {
            sql.push_str(&format!(
                "SET LOCAL client_connection_check_interval = {CLIENT_CHECK_MS}; "
            ));
        }
        if let Some(ms) = timeout_ms {
            sql.push_str(&format!("SET LOCAL lock_timeout = {ms}; "));
        }
        let function = match mode {
            LockMode::Exclusive => "pg_advisory_lock",
            LockMode::Shared => "pg_advisory_lock_shared",
        };
        sql.push_str(&format!(
            "SELECT pg_backend_pid(), {function}({lock_id})::text"
        ));
        if let Some(table) = &self.fencing {
            sql.push_str("; ");
            sql.push_str(&table.mint(&lock_id.to_string()));
        }
        sql
    }
}

pub(crate) struct PgBackend {
    pub(crate) pool: PgPool,
    pub(crate) release_timeout: Duration,
    /// How long past the deadline the client waits for the server's own `lock_timeout` answer
    /// before it gives up on the session (a server that does not answer at all).
    pub(crate) answer_grace: Duration,
    /// Lost-lock detection: probe interval and grace, or `None` when it is off.
    pub(crate) probe: Option<(Duration, Duration)>,
    pub(crate) monitor_running: AtomicBool,
    pub(crate) monitor_name: String,
    pub(crate) idle: Arc<IdleSessions>,
    pub(crate) statements: Statements,
    /// Set once the fencing table is known to exist.
    pub(crate) fencing_ready: tokio::sync::OnceCell<()>,
}

impl PgBackend {
    /// Checks a connection out of the pool, within the request's deadline when it has a
    /// positive one, otherwise within the pool's own `acquire_timeout`.
    async fn checkout(&self, req: &Request<'_>) -> Result<PgSession> {
        if let Some(session) = self.idle.take() {
            return Ok(session);
        }
        let started = Instant::now();
        let deadline = req.deadline.filter(|_| req.timeout != Some(Duration::ZERO));
        // sqlx's checkout future is several kilobytes: boxed, it does not bloat (and get copied
        // with) every future that awaits a lock, and the common path (a kept session) never
        // pays for it.
        let checkout = Box::pin(self.pool.acquire());
        let checked_out = match deadline {
            Some(deadline) => timeout_at(deadline, checkout)
                .await
                .unwrap_or(Err(sqlx::Error::PoolTimedOut)),
            None => checkout.await,
        };
        checked_out
            .map(|conn| PgSession::new(conn, Arc::clone(&self.idle)))
            .map_err(|err| self.checkout_error(req.key, err, started.elapsed()))
    }

    fn checkout_error(&self, key: &str, err: sqlx::Error, waited: Duration) -> Error {
        let max_connections = self.pool.options().get_max_connections();
        match err {
            sqlx::Error::PoolTimedOut
                if self.pool.size() >= max_connections && self.pool.num_idle() == 0 =>
            {
                Error::PoolExhausted {
                    key: key.to_owned(),
                    max_connections,
                    waited,
                }
            }
            // The pool had room, so it was trying to open a connection all along: it retries
            // refused connections silently until the deadline.
            sqlx::Error::PoolTimedOut => Error::Connection {
                key: key.to_owned(),
                reason: format!(
                    "no connection could be opened within {waited:?}; is the server reachable?"
                ),
                source: Some(err),
            },
            other => connection_error(key, other),
        }
    }
}

impl PgBackend {
    /// Creates the fencing table if fencing is on and it has not been done yet.
    pub(crate) async fn ensure_fencing(&self, key: &str) -> Result<()> {
        if self.statements.fencing.is_none() || self.fencing_ready.initialized() {
            return Ok(());
        }
        let request = Request {
            key,
            lock_id: crate::lock_id(key),
            mode: LockMode::Exclusive,
            timeout: None,
            deadline: None,
        };
        let mut session = self.checkout(&request).await?;
        self.create_fencing_table(&mut session, &request).await
    }

    async fn create_fencing_table(&self, session: &mut PgSession, req: &Request<'_>) -> Result<()> {
        let Some(table) = &self.statements.fencing else {
            return Ok(());
        };
        self.fencing_ready
            .get_or_try_init(|| async {
                let created = sqlx::raw_sql(AssertSqlSafe(table.setup()))
                    .execute(session.conn())
                    .await;
                created
                    .map(|_| session.mark_clean())
                    .map_err(|err| statement_error(req.key, req.timeout, err, session))
            })
            .await
            .map(|_| ())
    }

    /// One try on `session`: `Some(token)` when granted (the token is `None` without fencing),
    /// `None` when held elsewhere, in which case the session is clean again.
    async fn try_on(
        &self,
        session: &mut PgSession,
        req: &Request<'_>,
    ) -> Result<Option<Option<i64>>> {
        if !self.fencing_ready.initialized() {
            self.create_fencing_table(session, req).await?;
        }
        let statement = self.statements.try_lock(req.mode);
        let mut query =
            sqlx::query_as::<_, (i32, String, bool, Option<i64>)>(AssertSqlSafe(statement))
                .bind(req.lock_id);
        if let Some(tag) = &self.statements.tag {
            query = query.bind(tag);
        }
        let (pid, before, granted, token) = query
            .fetch_one(session.conn())
            .await
            .map_err(|err| statement_error(req.key, req.timeout, err, session))?;
        if self.statements.tag.is_some() {
            session.remember_application_name(before);
        }
        if granted {
            session.pid = pid;
            Ok(Some(token))
        } else {
            session.mark_clean();
            Ok(None)
        }
    }

    /// Checks out a session and makes one attempt on it. A pooled connection may have died
    /// while idle (a server restart, a terminated backend): an attempt that fails on the
    /// connection itself is retried on another, as long as the deadline allows, so callers
    /// see the server's answer rather than a stale socket.
    async fn checkout_and_try(
        &self,
        req: &Request<'_>,
    ) -> Result<(PgSession, Option<Option<i64>>)> {
        let mut retries = self.pool.options().get_max_connections();
        loop {
            let mut session = self.checkout(req).await?;
            match self.try_on(&mut session, req).await {
                Ok(granted) => return Ok((session, granted)),
                Err(Error::Connection { .. })
                    if retries > 0 && req.deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    retries -= 1;
                    tracing::debug!(key = req.key, "retrying on another connection");
                }
                Err(err) => return Err(err),
            }
        }
    }
}

impl Backend for PgBackend {
    type Session = PgSession;

    async fn lock(&self, req: &Request<'_>) -> Result<(PgSession, Option<i64>)> {
        let (mut session, granted) = self.checkout_and_try(req).await?;
        if let Some(token) = granted {
            return Ok((session, token));
        }
        // Held elsewhere. `session` is clean again: it goes back to the pool if we stop here.
        let timeout_ms = match (req.timeout, req.deadline) {
            (None, _) => None,
            (Some(timeout), Some(deadline)) if !timeout.is_zero() => {
                // Round up, so the server never gives up before the deadline.
                let remaining = deadline.saturating_duration_since(Instant::now());
                match remaining.as_nanos().div_ceil(1_000_000) {
                    0 => return Err(Error::timeout(req.key, timeout)),
                    ms => Some(ms),
                }
            }
            (Some(timeout), _) => return Err(Error::timeout(req.key, timeout)),
        };
        let sql = self
            .statements
            .wait(req.lock_id, req.mode, timeout_ms, session.server_version());
        let waiting = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(session.conn());
        let answer = match req.deadline {
            Some(deadline) => match timeout_at(deadline + self.answer_grace, waiting).await {
                Ok(answer) => answer,
                // The server did not answer: the session (dropped dirty) is closed.
                Err(_) => return Err(Error::timeout(req.key, req.timeout.unwrap_or_default())),
            },
            None => waiting.await,
        };
        let fenced = self.statements.fencing.is_some();
        let parsed = answer.and_then(|rows| {
            let pid = rows
                .first()
                .map(|row| row.try_get::<i32, _>(0))
                .transpose()?;
            let token = match (fenced, rows.get(1)) {
                (true, Some(row)) => Some(row.try_get::<i64, _>(0)?),
                _ => None,
            };
            Ok((pid, token))
        });
        match parsed {
            Ok((Some(pid), token)) if token.is_some() || !fenced => {
                session.pid = pid;
                Ok((session, token))
            }
            Ok(_) => Err(connection_error(
                req.key,
                sqlx::Error::Protocol("the lock statement returned no row".into()),
            )),
            Err(err) if has_sqlstate(&err, LOCK_NOT_AVAILABLE) && req.timeout.is_some() => {
                // Our lock_timeout fired while waiting: nothing was granted.
                session.mark_clean();
                Err(Error::timeout(req.key, req.timeout.unwrap_or_default()))
            }
            Err(err) => Err(statement_error(req.key, req.timeout, err, &mut session)),
        }
    }

    async fn try_lock(&self, req: &Request<'_>) -> Result<Option<(PgSession, Option<i64>)>> {
        let (session, granted) = self.checkout_and_try(req).await?;
        Ok(granted.map(|token| (session, token)))
    }

    async fn refence(&self, req: &Request<'_>, session: &mut PgSession) -> Result<Option<i64>> {
        let Some(mint) = &self.statements.mint else {
            return Ok(None);
        };
        let token = sqlx::query_scalar::<_, i64>(AssertSqlSafe(Arc::clone(mint)))
            .bind(req.lock_id)
            .fetch_one(session.conn())
            .await
            .map_err(|err| statement_error(req.key, req.timeout, err, session))?;
        // The session still holds the lock: it stays dirty until unlocked.
        Ok(Some(token))
    }

    async fn unlock(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        mut session: PgSession,
    ) -> Result<()> {
        let statement = match mode {
            LockMode::Exclusive => UNLOCK,
            LockMode::Shared => UNLOCK_SHARED,
        };
        let unlocked = sqlx::query_scalar::<_, bool>(statement)
            .bind(lock_id)
            .fetch_one(session.conn());
        let (reason, source) = match timeout(self.release_timeout, unlocked).await {
            Ok(Ok(true)) => {
                session.mark_clean();
                return Ok(());
            }
            Ok(Ok(false)) => (ReleaseFailure::NotHeldOnServer, None),
            Ok(Err(err)) => (ReleaseFailure::Database(err.to_string()), Some(err)),
            Err(_) => (ReleaseFailure::Timeout(self.release_timeout), None),
        };
        // `session` is dirty here and is closed as it drops.
        Err(Error::ReleaseFailed {
            key: key.to_owned(),
            reason,
            source,
        })
    }

    fn session_pid(session: &PgSession) -> Option<i32> {
        Some(session.pid)
    }

    fn watch(core: &Arc<Core<Self>>) {
        super::monitor::ensure_running(core);
    }
}

fn has_sqlstate(err: &sqlx::Error, code: &str) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|actual| actual == code)
}

/// Classifies a failed lock statement. A database error (the server answered) keeps the
/// session only when it proves no lock was granted; anything else closes it.
fn statement_error(
    key: &str,
    timeout: Option<Duration>,
    err: sqlx::Error,
    session: &mut PgSession,
) -> Error {
    match err {
        // The session was ended by the server (shutdown, termination) or its connection broke:
        // a connection problem, which a fresh connection may not have.
        sqlx::Error::Database(ref db)
            if db
                .code()
                .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")) =>
        {
            connection_error(key, err)
        }
        sqlx::Error::Database(_) => {
            if has_sqlstate(&err, LOCK_NOT_AVAILABLE) {
                session.mark_clean();
            }
            Error::database(key, timeout, err)
        }
        other => connection_error(key, other),
    }
}

fn connection_error(key: &str, err: sqlx::Error) -> Error {
    Error::Connection {
        key: key.to_owned(),
        reason: err.to_string(),
        source: Some(err),
    }
}
