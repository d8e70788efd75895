//! The harness's own connections: probes, the leak query, the connection sampler, and the
//! CPU clocks of a timed window (the client's, and the server's on the lib's sessions).

use std::collections::HashMap;
use std::time::Duration;

use sqlx::{Connection, PgConnection};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::libs::{Res, connect_options, err};
use crate::stats::{CpuClock, CpuUsed};

pub const COUNTER_TABLE_DDL: &str =
    "CREATE TABLE IF NOT EXISTS lockbench_counter (id bigint PRIMARY KEY, v bigint NOT NULL)";

const BACKENDS_SQL: &str = "SELECT pid FROM pg_stat_activity WHERE application_name = $1";

/// The probe's own backend, and how that backend's process title names its client: `(port)`
/// over TCP, `[local]` over a Unix socket.
const PROBE_BACKEND_SQL: &str =
    "SELECT pg_backend_pid(), coalesce('(' || inet_client_port() || ')', '[local]')";

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

/// The CPU time of a timed window: the client's (this process) and, where the server's
/// processes are visible from here, the server's on the lib's sessions.
pub struct Clocks {
    client: CpuClock,
    server: Option<HashMap<i32, u64>>,
    app: String,
}

/// What [`Clocks::stop`] measured.
pub struct CpuWindow {
    client: CpuUsed,
    server: Option<CpuUsed>,
}

impl Clocks {
    /// Reads the backends of the sessions named `app` first, then starts the client's clock,
    /// so the probe's own queries are not in the window.
    pub async fn start(probe: &mut PgConnection, app: &str) -> Res<Clocks> {
        let server = if server_is_visible(probe).await? {
            Some(backends_cpu(probe, app).await?)
        } else {
            None
        };
        Ok(Clocks {
            client: CpuClock::start(),
            server,
            app: app.to_owned(),
        })
    }

    /// Stops the client's clock, then reads the backends again. A backend that appeared in the
    /// window counts from zero (its connection set-up included); one that ended in it is lost.
    pub async fn stop(self, probe: &mut PgConnection) -> Res<CpuWindow> {
        let client = self.client.stop();
        let server = match self.server {
            Some(start) => {
                let end = backends_cpu(probe, &self.app).await?;
                let ns = end
                    .iter()
                    .map(|(pid, t)| t.saturating_sub(start.get(pid).copied().unwrap_or(0)))
                    .sum();
                Some(CpuUsed::from_ns(ns))
            }
            None => None,
        };
        Ok(CpuWindow { client, server })
    }
}

impl CpuWindow {
    /// Writes `client_cpu_us` and `server_cpu_us` per op into a result line's `detail`
    /// (`server_cpu_us` is `null` where the server's processes are not visible from here, or
    /// without ops).
    pub fn record(&self, detail: &mut serde_json::Value, ops: u64) {
        let server = self
            .server
            .as_ref()
            .map_or(serde_json::Value::Null, |s| s.per_op_us(ops));
        detail["client_cpu_us"] = self.client.per_op_us(ops);
        detail["server_cpu_us"] = server;
    }
}

/// True when the server's backends are processes of this machine, in this pid namespace: the
/// probe's own backend is a `postgres` process here whose title names the probe's client port.
/// (A loopback address alone would not say so: a server in a container can share a network
/// namespace without sharing pids.)
async fn server_is_visible(probe: &mut PgConnection) -> Res<bool> {
    let (pid, client): (i32, String) = sqlx::query_as(PROBE_BACKEND_SQL)
        .fetch_one(probe)
        .await
        .map_err(err)?;
    let title = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| String::from_utf8_lossy(&raw).into_owned())
        .unwrap_or_default();
    Ok(title.starts_with("postgres") && title.contains(&client))
}

/// Each of `app`'s backends' CPU time so far (`/proc/<pid>/schedstat`: nanoseconds on a CPU).
/// A backend that ended between the query and the read is left out.
async fn backends_cpu(probe: &mut PgConnection, app: &str) -> Res<HashMap<i32, u64>> {
    let pids: Vec<i32> = sqlx::query_scalar(BACKENDS_SQL)
        .bind(app)
        .fetch_all(probe)
        .await
        .map_err(err)?;
    Ok(pids
        .into_iter()
        .filter_map(|pid| Some((pid, backend_cpu_ns(pid)?)))
        .collect())
}

fn backend_cpu_ns(pid: i32) -> Option<u64> {
    let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    schedstat.split_whitespace().next()?.parse().ok()
}
