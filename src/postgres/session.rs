//! A pooled connection pinned to one lock.

use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, Postgres};

/// A pooled connection that goes back to the pool only when it is known to be clean: no
/// advisory lock held, no statement in flight, no session setting changed. In every other
/// state dropping it closes the connection, which is what makes the server free whatever lock
/// it may hold.
pub(crate) struct PgSession {
    conn: Option<PoolConnection<Postgres>>,
    clean: bool,
    /// The backend process id, once a lock statement has reported it.
    pub(crate) pid: i32,
}

impl PgSession {
    pub(crate) fn new(conn: PoolConnection<Postgres>) -> Self {
        PgSession {
            conn: Some(conn),
            clean: true,
            pid: 0,
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

    /// Declares that the last statement completed and left no lock behind.
    pub(crate) fn mark_clean(&mut self) {
        self.clean = true;
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
            return drop(conn);
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
