//! A pooled connection the manager uses for a while (a lock session's, or one waiting for a
//! contended lock and then holding it), and the few clean ones a manager keeps for reuse.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::statements::SessionSettings;

/// Clean sessions released by the manager, kept for a short while instead of going straight
/// back to the pool. sqlx checks every connection returned to its pool with a round trip on a
/// spawned task; a lock loop that reuses the connection it just released skips that, and does
/// not make the pool open new connections while the check is still in flight.
pub(crate) struct IdleSessions {
    idle: Mutex<Vec<Idle>>,
    /// Notified whenever a session is kept: a waiter without one may take it.
    pub(crate) kept: tokio::sync::Notify,
    max: usize,
    ttl: Duration,
    reaper_running: AtomicBool,
}

/// A kept session, with the settings to restore before it goes back to the pool.
struct Idle {
    conn: PoolConnection<Postgres>,
    /// Its place under the manager's connection cap, given back with the connection.
    permit: OwnedSemaphorePermit,
    since: Instant,
    restore: Option<SessionSettings>,
    pid: i32,
    heard: Instant,
}

impl IdleSessions {
    pub(crate) fn new(max: usize, ttl: Duration) -> Arc<Self> {
        Arc::new(IdleSessions {
            idle: Mutex::new(Vec::new()),
            kept: tokio::sync::Notify::new(),
            max,
            ttl,
            reaper_running: AtomicBool::new(false),
        })
    }

    fn idle(&self) -> MutexGuard<'_, Vec<Idle>> {
        crate::sync::lock(&self.idle)
    }

    /// The most recently released session, if one is kept.
    pub(crate) fn take(self: &Arc<Self>) -> Option<PgSession> {
        self.idle().pop().map(|idle| PgSession {
            conn: Some(idle.conn),
            permit: Some(idle.permit),
            idle: Arc::clone(self),
            clean: true,
            pid: idle.pid,
            restore: idle.restore,
            heard: idle.heard,
        })
    }

    fn put(
        self: &Arc<Self>,
        conn: PoolConnection<Postgres>,
        permit: Option<OwnedSemaphorePermit>,
        restore: Option<SessionSettings>,
        pid: i32,
        heard: Instant,
    ) {
        // Only wait sessions are kept: they have a place under the cap to keep it in.
        let Some(permit) = permit.filter(|_| self.max > 0) else {
            return return_to_pool(conn, restore, None);
        };
        let idle = Idle {
            conn,
            permit,
            since: Instant::now(),
            restore,
            pid,
            heard,
        };
        {
            let mut kept = self.idle();
            if kept.len() >= self.max {
                // Full: the oldest goes back to the pool.
                kept.remove(0).return_to_pool();
            }
            kept.push(idle);
        }
        self.kept.notify_waiters();
        if !self.reaper_running.swap(true, Ordering::SeqCst) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(reap(Arc::downgrade(self)))),
                Err(_) => {
                    self.reaper_running.store(false, Ordering::SeqCst);
                    let kept: Vec<Idle> = self.idle().drain(..).collect();
                    kept.into_iter().for_each(Idle::return_to_pool);
                }
            }
        }
    }
}

impl Idle {
    fn return_to_pool(self) {
        return_to_pool(self.conn, self.restore, Some(self.permit));
    }
}

/// Gives a clean session back to the pool, first restoring the settings the manager changed
/// (its `application_name`, its silence timeouts). That takes a round trip, so it happens on a
/// task of its own; without a runtime (or if the restore fails) the connection is closed
/// instead, never pooled with our settings on it. The session's place under the manager's
/// connection cap (`permit`) is given back once the connection is back.
fn return_to_pool(
    mut conn: PoolConnection<Postgres>,
    restore: Option<SessionSettings>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let Some(restore) = restore.filter(|restore| !restore.is_empty()) else {
        return drop(conn);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(async move {
            let _permit = permit;
            let restored = sqlx::query(super::statements::RESTORE)
                .bind(restore.names)
                .bind(restore.values)
                .execute(&mut *conn)
                .await;
            if restored.is_err() {
                conn.close_on_drop();
            }
        })),
        Err(_) => drop(conn.leak()),
    }
}

impl Drop for IdleSessions {
    fn drop(&mut self) {
        let kept: Vec<Idle> = self.idle().drain(..).collect();
        kept.into_iter().for_each(Idle::return_to_pool);
    }
}

/// Returns kept sessions to the pool once they have been idle for the time-to-live, and stops
/// when none are left (a later `put` starts it again).
async fn reap(idle: std::sync::Weak<IdleSessions>) {
    loop {
        let Some(ttl) = idle.upgrade().map(|idle| idle.ttl) else {
            return;
        };
        tokio::time::sleep(ttl).await;
        let Some(idle) = idle.upgrade() else { return };
        let now = Instant::now();
        let expired: Vec<Idle> = {
            let mut kept = idle.idle();
            let (expired, fresh) = kept
                .drain(..)
                .partition(|kept| now.duration_since(kept.since) >= idle.ttl);
            *kept = fresh;
            expired
        };
        expired.into_iter().for_each(Idle::return_to_pool);
        if idle.idle().is_empty() {
            idle.reaper_running.store(false, Ordering::SeqCst);
            // A `put` racing with this either saw the flag still set (its session is swept on
            // the next round, which it now starts) or starts a reaper of its own.
            if idle.idle().is_empty() || idle.reaper_running.swap(true, Ordering::SeqCst) {
                return;
            }
        }
    }
}

/// What a session's set-up learned about its server.
#[derive(Debug, Clone)]
pub(crate) struct SetUp {
    /// The server is in recovery.
    pub(crate) standby: bool,
    /// The server's `max_locks_per_transaction`.
    pub(crate) max_locks_per_transaction: usize,
    /// What the engine is.
    pub(crate) identity: super::server_check::Identity,
}

/// A pooled connection that goes back to the pool only when it is known to be clean: no
/// advisory lock held, no statement in flight, and the `application_name` the manager set is
/// restored first. In every other state dropping it closes the connection, which is what makes
/// the server free whatever lock it may hold.
pub(crate) struct PgSession {
    conn: Option<PoolConnection<Postgres>>,
    /// A wait session's place under the manager's connection cap, held for as long as the
    /// connection is out of the pool (`None` for a lock session, capped on its own).
    permit: Option<OwnedSemaphorePermit>,
    idle: Arc<IdleSessions>,
    clean: bool,
    /// The backend process id, once a lock statement has reported it.
    pub(crate) pid: i32,
    /// The settings the manager changed, with the values they had before.
    restore: Option<SessionSettings>,
    /// When the latest statement the server answered was sent: from then on the server counts
    /// the session's silence (see `loss/liveness.rs`).
    pub(crate) heard: Instant,
}

impl PgSession {
    pub(crate) fn new(conn: PoolConnection<Postgres>, idle: Arc<IdleSessions>) -> Self {
        PgSession {
            conn: Some(conn),
            permit: None,
            idle,
            clean: true,
            pid: 0,
            restore: None,
            heard: Instant::now(),
        }
    }

    /// The same session, holding `permit`: a wait session's place under the cap.
    pub(crate) fn with_permit(mut self, permit: OwnedSemaphorePermit) -> Self {
        self.permit = Some(permit);
        self
    }

    /// Takes the session's place under the cap back (to wait on another connection).
    pub(crate) fn take_permit(&mut self) -> Option<OwnedSemaphorePermit> {
        self.permit.take()
    }

    /// Whether [`set_up`](Self::set_up) has run on this connection.
    pub(crate) fn is_set_up(&self) -> bool {
        self.pid != 0
    }

    /// Learns the backend's process id and what the server is, and gives the session the
    /// manager's `settings` (restored before the connection goes back to the pool).
    pub(crate) async fn set_up(
        &mut self,
        settings: &SessionSettings,
    ) -> Result<SetUp, sqlx::Error> {
        let sent = Instant::now();
        type Row = (
            i32,
            bool,
            i64,
            Vec<Option<String>>,
            i64,
            String,
            Option<String>,
            bool,
        );
        let answer = sqlx::query_as::<_, Row>(super::statements::SETUP)
            .bind(&settings.names)
            .bind(&settings.values)
            .fetch_one(self.conn())
            .await;
        let (pid, standby, max_locks_per_transaction, before, _, version, yb_silence, citus) =
            match answer {
                Ok(row) => row,
                Err(error) => return Err(self.unsupported_server().await.unwrap_or(error)),
            };
        self.mark_clean();
        self.pid = pid;
        self.heard = sent;
        if self.restore.is_none() {
            // What the server knows of the settings, as it was: those it lacks were not set.
            let mut restore = SessionSettings::default();
            for (name, value) in settings.names.iter().zip(before) {
                if let Some(value) = value {
                    restore.names.push(name.clone());
                    restore.values.push(value);
                }
            }
            self.restore = Some(restore);
        }
        let mut identity = super::server_check::Identity {
            version,
            yb_silence,
            citus,
            citus_group: None,
        };
        identity.complete(self.conn()).await;
        Ok(SetUp {
            standby,
            max_locks_per_transaction: usize::try_from(max_locks_per_transaction).unwrap_or(0),
            identity,
        })
    }

    /// After a failed set-up: the error to report instead when the server is older than
    /// PostgreSQL 12, whose syntax the set-up needs (it would read as a syntax error).
    async fn unsupported_server(&mut self) -> Option<sqlx::Error> {
        let version: String =
            sqlx::query_scalar("SELECT pg_catalog.current_setting('server_version')")
                .fetch_one(self.conn())
                .await
                .ok()?;
        let major: u32 = version.split(['.', ' ']).next()?.parse().ok()?;
        (major < 12).then(|| {
            sqlx::Error::Protocol(format!(
                "PostgreSQL {version} is not supported: pglock needs PostgreSQL 12 or later"
            ))
        })
    }

    /// Sends the server a bare `Sync` and waits for its answer: the cheapest exchange the
    /// protocol has. The session's silence starts again from now, and a session the server has
    /// ended shows as an error. Cut short, it leaves the connection dirty (closed as it drops).
    pub(crate) async fn ping(&mut self) -> Result<(), sqlx::Error> {
        let sent = Instant::now();
        sqlx::Connection::ping(self.conn()).await?;
        self.mark_clean();
        self.heard = sent;
        Ok(())
    }

    /// Makes sure the role can mint tokens in the fencing table, creating it where it is
    /// missing and the role may (see `OwnTable::prepare`).
    pub(crate) async fn prepare_fencing_table(
        &mut self,
        table: &super::fencing::FencingTable,
    ) -> Result<(), crate::sql::errors::Failure> {
        use crate::sql::errors::Failure;
        use crate::sql::table::Unready;
        let prepared = table
            .table()
            .prepare(self.conn(), &table.ddl(), "pglock:fencing-table-setup")
            .await;
        match prepared {
            Ok(()) => {
                self.mark_clean();
                Ok(())
            }
            Err(Unready::Denied { object, privilege }) => {
                self.mark_clean();
                Err(Failure::PermissionDenied { object, privilege })
            }
            // Left dirty, so the connection is closed: a failure inside the creating
            // transaction would leave it aborted.
            Err(Unready::Failed(err)) => Err(Failure::from_sqlx(&err)),
        }
    }

    /// The connection, for one statement. The session counts as dirty from here until
    /// [`mark_clean`](Self::mark_clean): a statement dropped half-way leaves it unusable.
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.clean = false;
        self.conn
            .as_mut()
            .expect("the connection is only taken out on drop")
    }

    /// Declares that the last statement completed: nothing is in flight on the connection.
    pub(crate) fn mark_clean(&mut self) {
        self.clean = true;
    }

    /// Declares the connection unfit for the pool (it may hold a lock): it is closed on drop.
    pub(crate) fn mark_dirty(&mut self) {
        self.clean = false;
    }

    pub(crate) fn server_version(&self) -> u32 {
        self.conn
            .as_ref()
            .and_then(|conn| conn.server_version_num())
            .unwrap_or(0)
    }
}

impl Drop for PgSession {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        if self.clean {
            let permit = self.permit.take();
            return self
                .idle
                .put(conn, permit, self.restore.take(), self.pid, self.heard);
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            // Sends Terminate and closes on a task; sqlx keeps the pool's count right.
            conn.close_on_drop();
            drop(conn);
        } else {
            // No runtime to close gracefully on: drop the socket itself.
            drop(conn.leak());
        }
    }
}

impl std::fmt::Debug for PgSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSession")
            .field("clean", &self.clean)
            .field("pid", &self.pid)
            .finish()
    }
}
