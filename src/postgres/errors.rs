//! How driver failures become this crate's errors.

use std::time::Duration;

use sqlx::PgPool;

use crate::Error;

/// SQLSTATE `lock_not_available`: `lock_timeout` expired while waiting, so nothing was granted.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE `too_many_connections`.
const TOO_MANY_CONNECTIONS: &str = "53300";

pub(crate) fn has_sqlstate(err: &sqlx::Error, code: &str) -> bool {
    err.as_database_error()
        .and_then(|db| db.code())
        .is_some_and(|actual| actual == code)
}

/// True when the error leaves the connection unusable: it broke, the server ended the session
/// (SQLSTATE classes 57P and 08), or the driver lost track of the protocol. A plain database
/// error (the server answered, the session goes on) is not.
pub(crate) fn breaks_connection(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("57P") || code.starts_with("08")),
        _ => true,
    }
}

/// A failure to get a connection, without the key it happened for, so one failure can be
/// reported to every caller that waited for the same connection.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    PoolExhausted {
        max_connections: u32,
        waited: Duration,
    },
    PoolClosed,
    TooManyConnections(String),
    Standby,
    TransactionPooling,
    Connection(String),
}

/// How long a failed checkout may spend asking the server why, on top of the time its caller
/// already waited: enough for a refusal from a server on the same network, short enough that a
/// deadline stays a deadline when the server does not answer at all.
const DIAGNOSIS: Duration = Duration::from_millis(100);

impl Failure {
    /// Classifies a driver error met while connecting or checking out.
    pub(crate) fn from_sqlx(err: &sqlx::Error) -> Self {
        match err {
            sqlx::Error::PoolClosed => Failure::PoolClosed,
            // Prepared statements missing, or another client's present: the connection's
            // statements run on a transaction pooler's server sessions.
            err if has_sqlstate(err, "26000") || has_sqlstate(err, "42P05") => {
                Failure::TransactionPooling
            }
            err if has_sqlstate(err, TOO_MANY_CONNECTIONS) => {
                Failure::TooManyConnections(err.to_string())
            }
            err => Failure::Connection(err.to_string()),
        }
    }

    /// Explains a checkout that failed after `waited`. sqlx reports every checkout that runs
    /// out of time as `PoolTimedOut`, including the ones it spent retrying connections the
    /// server refused (too many clients, still starting), so when the pool had room this asks
    /// the server directly, once, what it says to a new connection.
    pub(crate) async fn from_checkout(pool: &PgPool, err: sqlx::Error, waited: Duration) -> Self {
        if !matches!(err, sqlx::Error::PoolTimedOut) {
            return Failure::from_sqlx(&err);
        }
        let max_connections = pool.options().get_max_connections();
        if pool.size() >= max_connections && pool.num_idle() == 0 {
            return Failure::PoolExhausted {
                max_connections,
                waited,
            };
        }
        let options = pool.connect_options();
        let probe = tokio::time::timeout(DIAGNOSIS, async {
            use sqlx::ConnectOptions;
            options.connect().await
        });
        match probe.await {
            Ok(Err(err)) => Failure::from_sqlx(&err),
            Ok(Ok(conn)) => {
                drop(sqlx::Connection::close(conn));
                Failure::Connection(format!(
                    "no connection could be opened within {waited:?}, although the server \
                     accepts one now (it may have been restarting or overloaded)"
                ))
            }
            Err(_) => Failure::Connection(format!(
                "no connection could be opened within {waited:?}, and the server did not answer \
                 a new one within {DIAGNOSIS:?}"
            )),
        }
    }

    pub(crate) fn into_error(self, key: &str) -> Error {
        let key = key.to_owned();
        match self {
            Failure::PoolExhausted {
                max_connections,
                waited,
            } => Error::PoolExhausted {
                key,
                max_connections,
                waited,
            },
            Failure::PoolClosed => Error::PoolClosed { key },
            Failure::TooManyConnections(reason) => Error::TooManyConnections { key, reason },
            Failure::Standby => Error::Standby { key },
            Failure::TransactionPooling => Error::TransactionPooling { key },
            Failure::Connection(reason) => Error::Connection {
                key,
                reason,
                source: None,
            },
        }
    }
}

/// Classifies a failed lock statement; `Connection` when the session broke, otherwise the
/// server's refusal.
pub(crate) fn statement_error(key: &str, timeout: Option<Duration>, err: sqlx::Error) -> Error {
    if breaks_connection(&err) {
        connection_error(key, err)
    } else {
        Error::database(key, timeout, err)
    }
}

pub(crate) fn connection_error(key: &str, err: sqlx::Error) -> Error {
    match Failure::from_sqlx(&err) {
        Failure::Connection(reason) => Error::Connection {
            key: key.to_owned(),
            reason,
            source: Some(err),
        },
        failure => failure.into_error(key),
    }
}
