//! What the server's own views (`pg_locks`, `pg_stat_activity`) show about the code under test.

use sqlx::PgPool;

use super::eventually;

/// One advisory lock as `pg_locks` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRow {
    pub pid: i32,
    pub classid: i64,
    pub objid: i64,
    pub objsubid: i16,
    pub mode: String,
    pub granted: bool,
}

/// The `pg_locks` rows (granted or waiting) of the advisory lock `lock_id`.
pub async fn lock_rows(observer: &PgPool, lock_id: i64) -> Vec<LockRow> {
    let (classid, objid) = pglock::split_lock_id(lock_id);
    sqlx::query_as(
        "SELECT pid, classid::bigint AS classid, objid::bigint AS objid, objsubid, mode, granted \
         FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid \
         AND objid = $2::bigint::oid ORDER BY granted DESC, pid",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .fetch_all(observer)
    .await
    .expect("query pg_locks")
    .into_iter()
    .map(LockRow::from_tuple)
    .collect()
}

type LockTuple = (i32, i64, i64, i16, String, bool);

impl LockRow {
    fn from_tuple((pid, classid, objid, objsubid, mode, granted): LockTuple) -> Self {
        LockRow {
            pid,
            classid,
            objid,
            objsubid,
            mode,
            granted,
        }
    }
}

/// The advisory locks held or awaited by sessions of the pool tagged `app`: its idle
/// connections carry `app`, and those a manager with holder id `app` is using carry
/// `pglock:{app}` (see `manager_for`).
pub async fn advisory_locks_of(observer: &PgPool, app: &str) -> Vec<LockRow> {
    sqlx::query_as(
        "SELECT l.pid, l.classid::bigint AS classid, l.objid::bigint AS objid, l.objsubid, \
         l.mode, l.granted FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' \
         AND a.application_name IN ($1, left('pglock:' || $1, 63))",
    )
    .bind(app)
    .fetch_all(observer)
    .await
    .expect("query pg_locks")
    .into_iter()
    .map(LockRow::from_tuple)
    .collect()
}

/// One session as `pg_stat_activity` shows it.
#[derive(Debug, Clone)]
pub struct SessionRow {
    pub pid: i32,
    pub state: Option<String>,
    pub wait_event_type: Option<String>,
    pub wait_event: Option<String>,
    pub query: Option<String>,
    pub query_start: Option<chrono::DateTime<chrono::Utc>>,
    pub has_xmin: bool,
}

/// The sessions of the pool tagged `app` (see `advisory_locks_of`).
pub async fn sessions_of(observer: &PgPool, app: &str) -> Vec<SessionRow> {
    sqlx::query_as(
        "SELECT pid, state, wait_event_type, wait_event, query, query_start, \
         backend_xmin IS NOT NULL AS has_xmin \
         FROM pg_stat_activity WHERE application_name IN ($1, left('pglock:' || $1, 63)) \
         ORDER BY pid",
    )
    .bind(app)
    .fetch_all(observer)
    .await
    .expect("query pg_stat_activity")
    .into_iter()
    .map(SessionRow::from_tuple)
    .collect()
}

type SessionTuple = (
    i32,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<chrono::DateTime<chrono::Utc>>,
    bool,
);

impl SessionRow {
    fn from_tuple(row: SessionTuple) -> Self {
        let (pid, state, wait_event_type, wait_event, query, query_start, has_xmin) = row;
        SessionRow {
            pid,
            state,
            wait_event_type,
            wait_event,
            query,
            query_start,
            has_xmin,
        }
    }
}

/// Asserts that no session of `app` holds or awaits an advisory lock and that every one of its
/// sessions is idle with no transaction open: what a pool must look like after any operation,
/// however it ended. Sessions closed by the code under test may take a moment to leave the
/// server's views, so this waits for that.
pub async fn assert_pool_clean(observer: &PgPool, app: &str) {
    eventually(
        &format!("the sessions of {app} hold no advisory lock"),
        || async { advisory_locks_of(observer, app).await.is_empty() },
    )
    .await;
    eventually(&format!("every session of {app} is idle"), || async {
        sessions_of(observer, app)
            .await
            .iter()
            .all(|s| s.state.as_deref() == Some("idle") && !s.has_xmin)
    })
    .await;
}

/// Waits (bounded, as [`eventually`](super::eventually)) until a session waits on the server
/// for `key`'s lock; `what` names the wait in the failure.
pub async fn eventually_waiting(what: &str, observer: &PgPool, key: &str) {
    super::eventually(what, || async {
        lock_rows(observer, pglock::lock_id(key))
            .await
            .iter()
            .any(|row| !row.granted)
    })
    .await;
}
