//! Lost-lock detection: one probe per interval, for all held locks at once.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::time::{Instant, sleep, timeout};

use super::backend::PgBackend;
use crate::LockMode;
use crate::LossCause;
use crate::core::{Core, Watched};

// Which of the given (pid, lock id, mode) triples does the server NOT show as granted? One
// round trip whatever the number of locks; the answer is the 1-based positions of the missing.
const PROBE: &str = "SELECT h.i FROM unnest($1::int4[], $2::int8[], $3::bool[]) \
     WITH ORDINALITY AS h(pid, id, shared, i) \
     WHERE NOT EXISTS (SELECT 1 FROM pg_locks l \
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid \
        AND l.classid = (h.id >> 32)::oid AND l.objid = (h.id & 4294967295)::oid \
        AND l.objsubid = 1 \
        AND l.mode = CASE WHEN h.shared THEN 'ShareLock' ELSE 'ExclusiveLock' END)";

/// Starts the monitor of `core` unless it runs already (or detection is off).
pub(crate) fn ensure_running(core: &Arc<Core<PgBackend>>) {
    let backend = &core.backend;
    let Some(_) = backend.probe else { return };
    if backend.monitor_running.swap(true, Ordering::SeqCst) {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn(run(Arc::downgrade(core)))),
        Err(_) => backend.monitor_running.store(false, Ordering::SeqCst),
    }
}

async fn run(weak: Weak<Core<PgBackend>>) {
    let mut conn: Option<PgConnection> = None;
    // The last moment at which every lock probed was confirmed held.
    let mut confirmed_at: Option<Instant> = None;
    while let Some((interval, grace)) = weak.upgrade().and_then(|core| core.backend.probe) {
        sleep(interval).await;
        let Some(core) = weak.upgrade() else { break };
        let watched = core.watched().await;
        if watched.is_empty() {
            // Stop while nothing is held; a registration racing with this restarts us (it
            // either sees the flag still set, or finds it cleared and spawns a new monitor).
            core.backend.monitor_running.store(false, Ordering::SeqCst);
            if core.held_lock_count() > 0
                && !core.backend.monitor_running.swap(true, Ordering::SeqCst)
            {
                continue;
            }
            break;
        }
        let started = Instant::now();
        match timeout(grace, probe(&mut conn, &core.backend, &watched)).await {
            Ok(Ok(missing)) => {
                confirmed_at = Some(started);
                for watched in missing {
                    core.declare_lost(&watched.key, watched.generation, LossCause::NotOnServer)
                        .await;
                }
            }
            failed => {
                if let Ok(Err(err)) = &failed {
                    tracing::debug!(error = %err, "lost-lock probe failed");
                }
                // The connection's state is unknown (or it is broken): start over next time.
                conn = None;
                let now = Instant::now();
                for watched in &watched {
                    let known = confirmed_at
                        .map_or(watched.registered_at, |at| at.max(watched.registered_at));
                    if now.duration_since(known) >= interval + grace {
                        core.declare_lost(
                            &watched.key,
                            watched.generation,
                            LossCause::Unverifiable,
                        )
                        .await;
                    }
                }
            }
        }
    }
    if let Some(conn) = conn {
        let _ = timeout(Duration::from_secs(1), conn.close()).await;
    }
}

/// Asks the server which of `watched` it no longer holds.
async fn probe(
    conn: &mut Option<PgConnection>,
    backend: &PgBackend,
    watched: &[Watched],
) -> Result<Vec<Watched>, sqlx::Error> {
    if conn.is_none() {
        let options = backend.pool.connect_options().as_ref().clone();
        *conn = Some(
            PgConnection::connect_with(&options.application_name(&backend.monitor_name)).await?,
        );
    }
    let conn = conn.as_mut().expect("connected above");
    let pids: Vec<i32> = watched.iter().map(|w| w.pid.unwrap_or(0)).collect();
    let ids: Vec<i64> = watched.iter().map(|w| w.lock_id).collect();
    let shared: Vec<bool> = watched.iter().map(|w| w.mode == LockMode::Shared).collect();
    let missing: Vec<i64> = sqlx::query_scalar(PROBE)
        .bind(pids)
        .bind(ids)
        .bind(shared)
        .fetch_all(conn)
        .await?;
    Ok(missing
        .into_iter()
        .filter_map(|position| watched.get(usize::try_from(position - 1).ok()?).cloned())
        .collect())
}
