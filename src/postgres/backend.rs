//! The statements behind `PostgresLockManager`.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::PgPool;
use tokio::time::{Instant, timeout, timeout_at};

use super::session::PgSession;
use crate::core::{Backend, Request};
use crate::{Error, ReleaseFailure, Result};

// Every statement is one round trip in autocommit, prepared once per connection. Settings are
// changed with `set_config(.., true)`, which lasts only for the statement's own implicit
// transaction, so nothing outlives the statement. The WHERE clause of a FROM-less SELECT is
// evaluated before its target list, so the settings are in force when the lock call waits.
//
// `client_connection_check_interval` (PostgreSQL 14+) makes a server-side waiter notice that
// its client went away (a cancelled acquire closes the session) instead of waiting on until it
// is granted the lock it no longer wants.
const LOCK_WAIT: &str = "SELECT pg_backend_pid(), pg_advisory_lock($1)::text \
     WHERE set_config('client_connection_check_interval', $2, true) IS NOT NULL";
const LOCK_WAIT_UNTIL: &str = "SELECT pg_backend_pid(), pg_advisory_lock($1)::text \
     WHERE set_config('client_connection_check_interval', $2, true) IS NOT NULL \
     AND set_config('lock_timeout', $3, true) IS NOT NULL";
const LOCK_WAIT_UNTIL_PG13: &str = "SELECT pg_backend_pid(), pg_advisory_lock($1)::text \
     WHERE $2::text IS NOT NULL AND set_config('lock_timeout', $3, true) IS NOT NULL";
const LOCK_WAIT_PG13: &str =
    "SELECT pg_backend_pid(), pg_advisory_lock($1)::text WHERE $2::text IS NOT NULL";
const TRY_LOCK: &str = "SELECT pg_backend_pid(), pg_try_advisory_lock($1)";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// How often a waiting backend checks that its client is still there, in milliseconds.
const CLIENT_CHECK_MS: &str = "200";

/// SQLSTATE `lock_not_available`: `lock_timeout` expired while waiting, so nothing was granted.
const LOCK_NOT_AVAILABLE: &str = "55P03";

pub(crate) struct PgBackend {
    pub(crate) pool: PgPool,
    pub(crate) release_timeout: Duration,
    /// How long past the deadline the client waits for the server's own `lock_timeout` answer
    /// before it gives up on the session (a server that does not answer at all).
    pub(crate) answer_grace: Duration,
}

impl PgBackend {
    /// Checks a connection out of the pool, within the request's deadline when it has a
    /// positive one, otherwise within the pool's own `acquire_timeout`.
    async fn checkout(&self, req: &Request<'_>) -> Result<PgSession> {
        let started = Instant::now();
        let deadline = req.deadline.filter(|_| req.timeout != Some(Duration::ZERO));
        let checked_out = match deadline {
            Some(deadline) => timeout_at(deadline, self.pool.acquire())
                .await
                .unwrap_or(Err(sqlx::Error::PoolTimedOut)),
            None => self.pool.acquire().await,
        };
        checked_out
            .map(PgSession::new)
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

#[async_trait]
impl Backend for PgBackend {
    type Session = PgSession;

    async fn lock(&self, req: &Request<'_>) -> Result<PgSession> {
        if let Some(timeout) = req.timeout.filter(|t| t.is_zero()) {
            return self
                .try_lock(req)
                .await?
                .ok_or_else(|| Error::timeout(req.key, timeout));
        }
        let mut session = self.checkout(req).await?;
        let modern = session.server_version() >= 140_000;
        let (Some(timeout), Some(deadline)) = (req.timeout, req.deadline) else {
            let statement = if modern { LOCK_WAIT } else { LOCK_WAIT_PG13 };
            let (pid, _): (i32, String) = sqlx::query_as(statement)
                .bind(req.lock_id)
                .bind(CLIENT_CHECK_MS)
                .fetch_one(session.conn())
                .await
                .map_err(|err| statement_error(req.key, None, err, &mut session))?;
            session.pid = pid;
            return Ok(session);
        };
        // Round up, so the server never gives up before the deadline.
        let remaining = deadline.saturating_duration_since(Instant::now());
        let remaining_ms = remaining.as_nanos().div_ceil(1_000_000);
        if remaining_ms == 0 {
            return try_lock_on(session, req)
                .await?
                .ok_or_else(|| Error::timeout(req.key, timeout));
        }
        let statement = if modern {
            LOCK_WAIT_UNTIL
        } else {
            LOCK_WAIT_UNTIL_PG13
        };
        let granted = sqlx::query_as::<_, (i32, String)>(statement)
            .bind(req.lock_id)
            .bind(CLIENT_CHECK_MS)
            .bind(remaining_ms.to_string())
            .fetch_one(session.conn());
        match timeout_at(deadline + self.answer_grace, granted).await {
            Ok(Ok((pid, _))) => {
                session.pid = pid;
                Ok(session)
            }
            Ok(Err(err)) if has_sqlstate(&err, LOCK_NOT_AVAILABLE) => {
                // lock_timeout fired while waiting: nothing granted, the session is clean.
                session.mark_clean();
                Err(Error::timeout(req.key, timeout))
            }
            Ok(Err(err)) => Err(statement_error(req.key, Some(timeout), err, &mut session)),
            // The server did not answer: the session (dropped dirty) is closed.
            Err(_) => Err(Error::timeout(req.key, timeout)),
        }
    }

    async fn try_lock(&self, req: &Request<'_>) -> Result<Option<PgSession>> {
        let session = self.checkout(req).await?;
        try_lock_on(session, req).await
    }

    async fn unlock(&self, key: &str, lock_id: i64, mut session: PgSession) -> Result<()> {
        let unlocked = sqlx::query_scalar::<_, bool>(UNLOCK)
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
}

async fn try_lock_on(mut session: PgSession, req: &Request<'_>) -> Result<Option<PgSession>> {
    let (pid, granted): (i32, bool) = sqlx::query_as(TRY_LOCK)
        .bind(req.lock_id)
        .fetch_one(session.conn())
        .await
        .map_err(|err| statement_error(req.key, req.timeout, err, &mut session))?;
    if granted {
        session.pid = pid;
        Ok(Some(session))
    } else {
        session.mark_clean();
        Ok(None)
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
