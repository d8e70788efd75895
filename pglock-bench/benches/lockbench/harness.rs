//! The harness's own connections: probes, the leak query, the connection sampler.

use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::libs::{Res, connect_options, err};

pub const COUNTER_TABLE_DDL: &str =
    "CREATE TABLE IF NOT EXISTS lockbench_counter (id bigint PRIMARY KEY, v bigint NOT NULL)";

const COUNT_SQL: &str = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";

const ADVISORY_HELD_SQL: &str = "SELECT count(*) FROM pg_locks \
    WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
      AND ((classid::bigint << 32) | objid::bigint) = ANY($1::bigint[])";

/// The application names of one run: only `lib` connections are counted.
#[derive(Debug, Clone)]
pub struct Apps {
    pub run_id: String,
    pub lib: String,
    pub peer: String,
    pub harness: String,
}

impl Apps {
    pub fn new(run_id: &str) -> Apps {
        Apps {
            run_id: run_id.to_owned(),
            lib: format!("lockbench-lib-{run_id}"),
            peer: format!("lockbench-peer-{run_id}"),
            harness: format!("lockbench-harness-{run_id}"),
        }
    }
}

pub async fn connect(dsn: &str, app: &str, settings: &[(&str, &str)]) -> Res<PgConnection> {
    let opts = connect_options(dsn, app, settings)?;
    PgConnection::connect_with(&opts).await.map_err(err)
}

/// True when some *other* session holds advisory lock `id` (probed from `probe`).
pub async fn held_elsewhere(probe: &mut PgConnection, id: i64) -> Res<bool> {
    let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(id)
        .fetch_one(&mut *probe)
        .await
        .map_err(err)?;
    if got {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(id)
            .execute(&mut *probe)
            .await
            .map_err(err)?;
    }
    Ok(!got)
}

/// How many of `ids` are held by anyone right now, in one query.
pub async fn count_held(probe: &mut PgConnection, ids: &[i64]) -> Res<i64> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    sqlx::query_scalar(ADVISORY_HELD_SQL)
        .bind(ids)
        .fetch_one(probe)
        .await
        .map_err(err)
}

/// The number of sessions named `app` in `pg_stat_activity`.
pub async fn count_sessions(probe: &mut PgConnection, app: &str) -> Res<i64> {
    sqlx::query_scalar(COUNT_SQL)
        .bind(app)
        .fetch_one(probe)
        .await
        .map_err(err)
}

/// Samples the lib's session count every `interval` on its own harness connection, on a task
/// of the current runtime, and keeps the peak.
pub struct Sampler {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Res<(PgConnection, i64)>>,
}

impl Sampler {
    pub fn start(mut conn: PgConnection, app: String, interval: Duration) -> Sampler {
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut peak = 0;
            loop {
                peak = peak.max(count_sessions(&mut conn, &app).await?);
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = &mut stopped => break,
                }
            }
            peak = peak.max(count_sessions(&mut conn, &app).await?);
            Ok((conn, peak))
        });
        Sampler { stop, task }
    }

    /// Stops sampling (after one last sample) and returns the peak.
    pub async fn stop(self) -> Res<i64> {
        let _ = self.stop.send(());
        let (conn, peak) = self.task.await.map_err(err)??;
        let _ = conn.close().await;
        Ok(peak)
    }
}
