//! `PostgresLockManager`'s backend: uncontended locks on the manager's lock sessions, contended
//! ones waited for on a session of their own.

use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{OnceCell, Semaphore};
use tokio::time::Instant;

use super::doorbell::Doorbell;
use super::lock_session::{Lease, SessionError};
use super::monitor::Monitor;
use super::sessions::{LockSessions, Unavailable};
use super::statements::Statements;
use super::wait_session::{IdleSessions, PgSession};
use crate::core::{Backend, Budget, Core, Liveness, Request};
use crate::{Error, LockKey, LockMode, LockTarget, LossCause, ReleaseFailure, Result};

pub(crate) struct PgBackend {
    pub(crate) pool: PgPool,
    pub(crate) statements: Arc<Statements>,
    pub(crate) sessions: LockSessions,
    /// How long a release waits for the server to confirm a wait session's unlock.
    pub(crate) release_timeout: Duration,
    /// How long past the deadline the client waits for the server's own `lock_timeout` answer
    /// before it gives up on a wait session (a server that does not answer at all).
    pub(crate) answer_grace: Duration,
    pub(crate) allow_standby: bool,
    /// The server's silence timeout on the manager's sessions, if set.
    pub(crate) silence: Option<Duration>,
    pub(crate) monitor: Arc<Monitor>,
    /// Clean wait sessions kept for the next contended acquisitions.
    pub(crate) idle: Arc<IdleSessions>,
    /// Wakes the waiters that have no connection of their own.
    pub(crate) doorbell: Doorbell,
    /// The wait sessions the manager's connection cap leaves room for.
    pub(crate) wait_slots: Arc<Semaphore>,
    /// Set once the fencing table is known to exist.
    pub(crate) fencing_ready: Arc<OnceCell<()>>,
    /// The manager's budget of held locks, whose default the first session's set-up derives.
    pub(crate) budget: Arc<Budget>,
}

impl PgBackend {
    /// One try on a lock session. A session that turns out to have closed while idle (a server
    /// restart, a terminated backend) is replaced, as long as the deadline allows, so callers
    /// see the server's answer rather than a stale connection.
    ///
    /// The caller's deadline bounds getting the session; a request with none (a try, a zero
    /// timeout, or no timeout at all) waits for it as long as the pool's `acquire_timeout`.
    pub(crate) async fn try_on_lock_session(
        &self,
        req: &Request<'_>,
    ) -> Result<Option<(Lease, Option<i64>)>> {
        let mut retries = 2;
        loop {
            let deadline = req.deadline.filter(|_| !req.is_immediate());
            let session = match self.sessions.open_one() {
                Some(session) => session,
                // None open: boxed, as the rare path, so the usual one's future stays small.
                None => match Box::pin(self.sessions.get(deadline)).await {
                    Ok(session) => session,
                    Err(Unavailable::Deadline) => return Err(req.timed_out()),
                    Err(Unavailable::Failed(failure)) => return Err(failure.into_error(req.key)),
                },
            };
            match session.try_lock(req.target, req.mode, deadline).await {
                Ok(granted) => {
                    return Ok(granted);
                }
                Err(SessionError::Closed(_) | SessionError::Unanswered(_))
                    if retries > 0 && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    retries -= 1;
                    tracing::debug!(key = %req.key, "lock session closed; retrying on another");
                }
                Err(err) => return Err(acquire_error(req, err)),
            }
        }
    }

    /// Checks the fencing table (creating it where the role may) if fencing is on and that
    /// has not been done yet.
    pub(crate) async fn ensure_fencing(&self, key: &LockKey) -> Result<()> {
        let Some(table) = &self.statements.fencing else {
            return Ok(());
        };
        let conn = self
            .pool
            .acquire()
            .await
            .map_err(|err| crate::sql::errors::connection_error(key, err))?;
        let mut session = PgSession::new(conn, Arc::clone(&self.idle));
        self.fencing_ready
            .get_or_try_init(|| session.prepare_fencing_table(table))
            .await
            .map(|_| ())
            .map_err(|failure| failure.into_error(key))
    }
}

impl PgBackend {
    /// [`PostgresLockManager::check_server`](crate::PostgresLockManager::check_server).
    pub(crate) async fn check_server(&self, key: &LockKey) -> Result<super::ServerCheck> {
        let started = Instant::now();
        let conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(err) => {
                let failure =
                    crate::sql::errors::Failure::from_checkout(&self.pool, err, started.elapsed());
                return Err(failure.await.into_error(key));
            }
        };
        let mut session = PgSession::new(conn, Arc::clone(&self.idle));
        let options = self.pool.connect_options();
        super::server_check::check(
            &mut session,
            &options,
            self.allow_standby,
            self.release_timeout,
        )
        .await
        .map_err(|failure| failure.into_error(key))
    }
}

/// What a failed command on a lock session means for an acquisition.
fn acquire_error(req: &Request<'_>, err: SessionError) -> Error {
    match err {
        SessionError::Deadline => req.timed_out(),
        SessionError::Database(err) => crate::sql::errors::refusal(req.key, err),
        SessionError::Closed(Some(err)) => crate::sql::errors::connection_error(req.key, err),
        SessionError::Closed(None) => Error::Connection {
            key: req.name(),
            reason: "the lock session closed".to_owned(),
            source: None,
        },
        SessionError::Unanswered(after) => Error::Connection {
            key: req.name(),
            reason: format!("the server did not answer within {after:?}; the session was closed"),
            source: None,
        },
        SessionError::Pooled => Error::TransactionPooling { key: req.name() },
    }
}

/// What a failed unlock on a lock session means for a release.
fn release_error(key: &LockKey, err: SessionError) -> Error {
    let (reason, source) = match err {
        SessionError::Database(err) => (ReleaseFailure::Database(err.to_string()), Some(err)),
        SessionError::Unanswered(after) => (ReleaseFailure::Timeout(after), None),
        SessionError::Closed(_) | SessionError::Deadline => (ReleaseFailure::SessionClosed, None),
        SessionError::Pooled => (ReleaseFailure::TransactionPooling, None),
    };
    Error::ReleaseFailed {
        key: key.clone(),
        reason,
        source,
    }
}

impl Backend for PgBackend {
    type Session = Lease;

    async fn lock(&self, req: &Request<'_>) -> Result<(Lease, Option<i64>)> {
        if let Some(granted) = self.try_on_lock_session(req).await? {
            return Ok(granted);
        }
        if req.is_immediate() {
            return Err(req.timed_out());
        }
        // Held elsewhere (see `wait.rs`). Boxed, so the uncontended path's future stays small.
        Box::pin(self.contend(req)).await
    }

    async fn try_lock(&self, req: &Request<'_>) -> Result<Option<(Lease, Option<i64>)>> {
        self.try_on_lock_session(req).await
    }

    async fn confirm(
        &self,
        key: &LockKey,
        _target: LockTarget,
        lease: &mut Lease,
    ) -> Result<Option<i64>> {
        lease.confirm().await.map_err(|err| release_error(key, err))
    }

    async fn unlock(
        &self,
        key: &LockKey,
        _target: LockTarget,
        _mode: LockMode,
        lease: Lease,
    ) -> Result<()> {
        match lease.unlock().await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Error::ReleaseFailed {
                key: key.clone(),
                reason: ReleaseFailure::NotHeldOnServer,
                source: None,
            }),
            Err(err) => Err(release_error(key, err)),
        }
    }

    fn liveness(lease: &Lease) -> Option<Arc<Liveness>> {
        lease.liveness()
    }

    fn ended(lease: &Lease) -> Option<LossCause> {
        lease.ended()
    }

    fn watch(core: &Arc<Core<Self>>, session_ended: bool) {
        core.backend.monitor.ensure_running(Arc::downgrade(core));
        if session_ended {
            core.backend.monitor.session_ended();
        }
    }
}
