//! The statements behind `PostgresLockManager`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool, Row};
use tokio::time::{Instant, timeout, timeout_at};

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
//
// The waiting statement is built from integers the crate computed (never from user text).
const TRY_LOCK: &str = "SELECT pg_backend_pid(), pg_try_advisory_lock($1)";
const TRY_LOCK_SHARED: &str = "SELECT pg_backend_pid(), pg_try_advisory_lock_shared($1)";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
const UNLOCK_SHARED: &str = "SELECT pg_advisory_unlock_shared($1)";

/// How often a waiting backend checks that its client is still there, in milliseconds.
const CLIENT_CHECK_MS: u32 = 200;

/// SQLSTATE `lock_not_available`: `lock_timeout` expired while waiting, so nothing was granted.
const LOCK_NOT_AVAILABLE: &str = "55P03";

fn wait_statement(
    lock_id: i64,
    mode: LockMode,
    timeout_ms: Option<u128>,
    server_version: u32,
) -> String {
    let mut sql = String::with_capacity(160);
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
    sql
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
}

impl PgBackend {
    /// Checks a connection out of the pool, within the request's deadline when it has a
    /// positive one, otherwise within the pool's own `acquire_timeout`.
    async fn checkout(&self, req: &Request<'_>) -> Result<PgSession> {
        if let Some(conn) = self.idle.take() {
            return Ok(PgSession::new(conn, Arc::clone(&self.idle)));
        }
        let started = Instant::now();
        let deadline = req.deadline.filter(|_| req.timeout != Some(Duration::ZERO));
        let checked_out = match deadline {
            Some(deadline) => timeout_at(deadline, self.pool.acquire())
                .await
                .unwrap_or(Err(sqlx::Error::PoolTimedOut)),
            None => self.pool.acquire().await,
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
    /// Checks out a session and makes one attempt on it. A pooled connection may have died
    /// while idle (a server restart, a terminated backend): an attempt that fails on the
    /// connection itself is retried on another, as long as the deadline allows, so callers
    /// see the server's answer rather than a stale socket.
    async fn checkout_and_try(&self, req: &Request<'_>) -> Result<(PgSession, bool)> {
        let mut retries = self.pool.options().get_max_connections();
        loop {
            let mut session = self.checkout(req).await?;
            match try_on(&mut session, req).await {
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

    async fn lock(&self, req: &Request<'_>) -> Result<PgSession> {
        let (mut session, granted) = self.checkout_and_try(req).await?;
        if granted {
            return Ok(session);
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
        let sql = wait_statement(req.lock_id, req.mode, timeout_ms, session.server_version());
        let waiting = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_one(session.conn());
        let answer = match req.deadline {
            Some(deadline) => match timeout_at(deadline + self.answer_grace, waiting).await {
                Ok(answer) => answer,
                // The server did not answer: the session (dropped dirty) is closed.
                Err(_) => return Err(Error::timeout(req.key, req.timeout.unwrap_or_default())),
            },
            None => waiting.await,
        };
        match answer.and_then(|row| row.try_get::<i32, _>(0)) {
            Ok(pid) => {
                session.pid = pid;
                Ok(session)
            }
            Err(err) if has_sqlstate(&err, LOCK_NOT_AVAILABLE) && req.timeout.is_some() => {
                // Our lock_timeout fired while waiting: nothing was granted.
                session.mark_clean();
                Err(Error::timeout(req.key, req.timeout.unwrap_or_default()))
            }
            Err(err) => Err(statement_error(req.key, req.timeout, err, &mut session)),
        }
    }

    async fn try_lock(&self, req: &Request<'_>) -> Result<Option<PgSession>> {
        let (session, granted) = self.checkout_and_try(req).await?;
        Ok(granted.then_some(session))
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

/// One `pg_try_advisory_lock` on `session`. When it is refused, the session is clean again.
async fn try_on(session: &mut PgSession, req: &Request<'_>) -> Result<bool> {
    let statement = match req.mode {
        LockMode::Exclusive => TRY_LOCK,
        LockMode::Shared => TRY_LOCK_SHARED,
    };
    let (pid, granted): (i32, bool) = sqlx::query_as(statement)
        .bind(req.lock_id)
        .fetch_one(session.conn())
        .await
        .map_err(|err| statement_error(req.key, req.timeout, err, session))?;
    if granted {
        session.pid = pid;
    } else {
        session.mark_clean();
    }
    Ok(granted)
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
