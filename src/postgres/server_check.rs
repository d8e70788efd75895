//! Knowing the server: what a session's set-up reads of it, the engines refused by name, and
//! the proof, made once per manager, that its advisory locks exclude.
//!
//! Everything pglock promises rests on one assumption: a lock one session holds keeps every
//! other session out. Engines that speak PostgreSQL's protocol without its lock table break it
//! silently (CockroachDB's advisory-lock functions are stubs that answer `true`; YugabyteDB
//! with `yb_silence_advisory_locks_not_supported_error` locks nothing), and so do paths that
//! spread one pool over several lock tables (a load balancer over replicas or nodes). The set-up
//! statement names the engine; the proof takes a salted lock on the first lock session and
//! asks a second session of the same server for it, which must be refused.

use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, PgConnection, Row};
use tokio::time::{Instant, timeout};

use crate::sql::errors::{Failure, has_sqlstate};

/// What a session's set-up read about the engine behind it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    /// `version()`.
    pub(crate) version: String,
    /// YugabyteDB's `yb_silence_advisory_locks_not_supported_error`, where the server has it.
    pub(crate) yb_silence: Option<String>,
    /// Whether the `citus` extension is installed.
    pub(crate) citus: bool,
    /// With Citus, the node's group (`pg_dist_local_group`; 0 is the coordinator), where it
    /// could be read.
    pub(crate) citus_group: Option<i32>,
}

impl Identity {
    /// The refusal of an engine known not to keep one lock table for every session, whatever a
    /// proof on two sessions would say; `None` for any other.
    pub(crate) fn refusal(&self) -> Option<Failure> {
        let found = |what: &str| format!("{what} ({})", first_line(&self.version));
        if self.version.contains("CockroachDB") {
            return Some(Failure::UnsupportedServer {
                found: found("CockroachDB, whose session advisory locks exclude nothing"),
                advice: "take locks on a PostgreSQL server, or use TransactionLock only where \
                         the engine implements transaction-scoped advisory locks"
                    .to_owned(),
            });
        }
        if self
            .yb_silence
            .as_deref()
            .is_some_and(|value| matches!(value, "on" | "true" | "1"))
        {
            return Some(Failure::UnsupportedServer {
                found: found(
                    "YugabyteDB with yb_silence_advisory_locks_not_supported_error on: its \
                     advisory-lock functions lock nothing",
                ),
                advice: "turn the setting off and enable YugabyteDB's advisory locks, or take \
                         locks on a PostgreSQL server"
                    .to_owned(),
            });
        }
        if self.citus && self.citus_group != Some(0) {
            return Some(Failure::UnsupportedServer {
                found: found(&format!(
                    "a Citus node other than the coordinator (group {}): advisory locks are \
                     kept per node, so processes connected to different nodes do not exclude \
                     each other",
                    self.citus_group
                        .map_or_else(|| "unknown".to_owned(), |g| g.to_string())
                )),
                advice: "point every lock pool at the Citus coordinator".to_owned(),
            });
        }
        None
    }

    /// Reads what the set-up statement could not: with Citus, the node's group. Unbounded:
    /// the caller bounds the set-up it is part of.
    pub(crate) async fn complete(&mut self, conn: &mut PgConnection) {
        if self.citus {
            let group =
                sqlx::query_scalar::<_, i32>("SELECT groupid FROM pg_catalog.pg_dist_local_group");
            self.citus_group = group.fetch_one(conn).await.ok();
        }
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// What [`check_server`](crate::PostgresLockManager::check_server) found: a server whose
/// advisory locks exclude.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerCheck {
    /// The server's `version()`.
    pub version: String,
    /// Whether the server delivers notifications (`LISTEN`): without them the waits that have
    /// no connection of their own poll, and lock-order cycles through other managers are not
    /// found (see the guide's engines table).
    pub notifications: bool,
    /// How long the proof took: two sessions, a salted lock taken on one and refused to the
    /// other, released, then taken and released by the other.
    pub took: Duration,
}

/// What a session of the server is, read by [`check`]: its pid, whether it is a standby, and
/// the engine.
const IDENTITY: &str = "SELECT pg_catalog.pg_backend_pid(), pg_catalog.pg_is_in_recovery(), \
    pg_catalog.version(), \
    pg_catalog.current_setting('yb_silence_advisory_locks_not_supported_error', true), \
    EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus')";

/// The whole check, on `session` (a connection of `pool`, closed unless it ends clean) and a
/// second connection of its own: the engine, a standby (refused unless `allow_standby`), and
/// the proof.
pub(crate) async fn check(
    session: &mut super::wait_session::PgSession,
    options: &PgConnectOptions,
    allow_standby: bool,
    bound: Duration,
) -> Result<ServerCheck, Failure> {
    let unanswered = || Failure::Connection {
        reason: format!("the server check went unanswered for {bound:?}"),
        transient: true,
    };
    // Closed unless the check ends clean: cut short, it may hold the salted lock.
    session.mark_dirty();
    let read = sqlx::query_as::<_, (i32, bool, String, Option<String>, bool)>(IDENTITY);
    let (pid, standby, version, yb_silence, citus) = timeout(bound, read.fetch_one(session.conn()))
        .await
        .map_err(|_| unanswered())?
        .map_err(|err| Failure::from_sqlx(&err))?;
    if standby && !allow_standby {
        return Err(Failure::Standby);
    }
    let mut identity = Identity {
        version: version.clone(),
        yb_silence,
        citus,
        citus_group: None,
    };
    timeout(bound, identity.complete(session.conn()))
        .await
        .map_err(|_| unanswered())?;
    if let Some(refused) = identity.refusal() {
        return Err(refused);
    }
    let check = prove(session.conn(), pid, options, bound).await?;
    session.mark_clean();
    Ok(ServerCheck { version, ..check })
}

/// A random lock id for one proof, so no other holder can be using it.
fn salted_id() -> i64 {
    let (high, _) = uuid::Uuid::new_v4().as_u64_pair();
    (high >> 1) as i64
}

/// Proves that `first` (a set-up session whose backend is `first_pid`) and a second session of
/// the same server exclude each other, and reads whether the server delivers notifications.
/// The second session is a connection of its own, opened with `options` and closed at the end,
/// so a pool with no connection to spare cannot hold the proof up; every statement is bounded
/// by `bound`. Nothing is left held on either session.
pub(crate) async fn prove(
    first: &mut PgConnection,
    first_pid: i32,
    options: &PgConnectOptions,
    bound: Duration,
) -> Result<ServerCheck, Failure> {
    let started = Instant::now();
    let id = salted_id();
    let unanswered = |step: &str| Failure::Connection {
        reason: format!("the server check's {step} went unanswered for {bound:?}"),
        transient: true,
    };
    let mut second = timeout(bound, options.connect())
        .await
        .map_err(|_| unanswered("second connection"))?
        .map_err(|err| Failure::from_sqlx(&err))?;
    let proved = exclusion(first, first_pid, &mut second, id, bound, &unanswered).await;
    let outcome = match proved {
        Ok(()) => {
            let notifications = listens(&mut second, bound).await;
            Ok(ServerCheck {
                version: String::new(),
                notifications,
                took: started.elapsed(),
            })
        }
        Err(failure) => Err(failure),
    };
    // Whatever the second session took goes with it; the first session let go of it above, or
    // is to be closed by its caller on a failure.
    let _ = timeout(bound, second.close()).await;
    outcome
}

/// The proof's steps on `first` (whose backend is `first_pid`) and `second`: the salted lock
/// `id` taken on the first, refused to the second in both modes, released by the first, then
/// taken by the second.
async fn exclusion(
    first: &mut PgConnection,
    first_pid: i32,
    second: &mut PgConnection,
    id: i64,
    bound: Duration,
    unanswered: &impl Fn(&str) -> Failure,
) -> Result<(), Failure> {
    let taken = on_backend(
        first,
        first_pid,
        "pg_try_advisory_lock",
        id,
        bound,
        unanswered,
    )
    .await?;
    if !taken {
        return Err(not_exclusive(
            "a free, salted advisory lock was refused to the first session",
        ));
    }
    let others = sqlx::query(
        "SELECT pg_catalog.pg_backend_pid(), pg_catalog.pg_try_advisory_lock($1), \
         pg_catalog.pg_try_advisory_lock_shared($1)",
    )
    .bind(id);
    let row = timeout(bound, others.fetch_one(&mut *second))
        .await
        .map_err(|_| unanswered("second session's try"))?
        .map_err(|err| refusal_of(&err))?;
    let (pid, exclusive, shared): (i32, bool, bool) = (
        row.try_get(0).unwrap_or(0),
        row.try_get(1).unwrap_or(true),
        row.try_get(2).unwrap_or(true),
    );
    if pid == first_pid {
        return Err(Failure::TransactionPooling);
    }
    if exclusive || shared {
        return Err(not_exclusive(
            "a second session took the salted advisory lock the first one held",
        ));
    }
    let released = on_backend(
        first,
        first_pid,
        "pg_advisory_unlock",
        id,
        bound,
        unanswered,
    );
    if !released.await? {
        return Err(not_exclusive(
            "the first session could not release the salted lock",
        ));
    }
    if !on_backend(second, pid, "pg_try_advisory_lock", id, bound, unanswered).await? {
        return Err(not_exclusive(
            "the salted lock stayed held after the first session released it",
        ));
    }
    Ok(())
}

/// One try of the salted lock `id` on `conn`.
/// `function` (a lock function of one `bigint`) of the salted lock `id` on `conn`, run only
/// if the statement lands on backend `pid`: behind a transaction-pooling proxy it may land on
/// another, which is `TransactionPooling`.
async fn on_backend(
    conn: &mut PgConnection,
    pid: i32,
    function: &str,
    id: i64,
    bound: Duration,
    unanswered: &impl Fn(&str) -> Failure,
) -> Result<bool, Failure> {
    let sql = format!(
        "SELECT CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) $2 \
         THEN pg_catalog.{function}($1) END"
    );
    let query = sqlx::query_scalar::<_, Option<bool>>(AssertSqlSafe(sql))
        .bind(id)
        .bind(pid);
    timeout(bound, query.fetch_one(conn))
        .await
        .map_err(|_| unanswered(function))?
        .map_err(|err| refusal_of(&err))?
        .ok_or(Failure::TransactionPooling)
}

/// Whether `conn` may `LISTEN`: transaction-mode poolers and some hosted endpoints refuse it.
async fn listens(conn: &mut PgConnection, bound: Duration) -> bool {
    let listen = sqlx::raw_sql("LISTEN pglock_server_check; UNLISTEN pglock_server_check");
    matches!(timeout(bound, listen.execute(conn)).await, Ok(Ok(_)))
}

fn not_exclusive(what: &str) -> Failure {
    Failure::UnsupportedServer {
        found: format!("{what}: this server's advisory locks do not exclude"),
        advice: "take locks on one PostgreSQL server (a primary), reached directly or through \
                 a session-mode pooler, not a load balancer over several servers or an engine \
                 whose advisory locks are stand-ins"
            .to_owned(),
    }
}

/// What a lock statement of the proof that the server refused means: an engine without
/// advisory locks (no such function, 42883; not supported, 0A000) is refused by name.
fn refusal_of(err: &sqlx::Error) -> Failure {
    if has_sqlstate(err, "42883") || has_sqlstate(err, "0A000") {
        return Failure::UnsupportedServer {
            found: format!("the server has no session advisory locks ({err})"),
            advice: "take locks on a PostgreSQL server".to_owned(),
        };
    }
    Failure::from_sqlx(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(version: &str, yb_silence: Option<&str>, citus: bool) -> Identity {
        Identity {
            version: version.to_owned(),
            yb_silence: yb_silence.map(str::to_owned),
            citus,
            citus_group: None,
        }
    }

    fn found(identity: &Identity) -> Option<String> {
        match identity.refusal()? {
            Failure::UnsupportedServer { found, .. } => Some(found),
            other => panic!("not a refusal of the server: {other:?}"),
        }
    }

    #[test]
    fn engines_that_keep_no_single_lock_table_are_refused_by_name() {
        let postgres = "PostgreSQL 16.4 on x86_64-pc-linux-gnu, compiled by gcc";
        assert_eq!(found(&identity(postgres, None, false)), None);
        let cockroach = identity("CockroachDB CCL v24.1.0 (x86_64-pc-linux-gnu)", None, false);
        assert!(found(&cockroach).is_some_and(|f| f.contains("CockroachDB CCL v24.1.0")));
        let yugabyte = "PostgreSQL 15.2-YB-2025.1.0.0-b0 on x86_64-pc-linux-gnu";
        for silenced in ["on", "true", "1"] {
            let found = found(&identity(yugabyte, Some(silenced), false));
            assert!(
                found.is_some_and(|f| f.contains("yb_silence")),
                "{silenced}"
            );
        }
        // YugabyteDB with its advisory locks on is left to the proof.
        assert_eq!(found(&identity(yugabyte, Some("off"), false)), None);
        // Citus: the coordinator keeps one lock table for everyone connected to it; a worker,
        // or a node whose group could not be read, is refused.
        let coordinator = Identity {
            citus_group: Some(0),
            ..identity(postgres, None, true)
        };
        assert_eq!(found(&coordinator), None);
        let worker = Identity {
            citus_group: Some(2),
            ..identity(postgres, None, true)
        };
        assert!(
            found(&worker).is_some_and(|f| f.contains("group 2") && f.contains("PostgreSQL 16.4"))
        );
        let unknown = found(&identity(postgres, None, true));
        assert!(unknown.is_some_and(|f| f.contains("group unknown")));
    }
}
