//! How driver failures become this crate's errors.

use std::time::Duration;

use sqlx::PgPool;

use crate::{Error, LockKey};

/// SQLSTATE `lock_not_available`: `lock_timeout` expired while waiting, so nothing was granted.
pub(crate) const LOCK_NOT_AVAILABLE: &str = "55P03";
/// SQLSTATE `too_many_connections`.
const TOO_MANY_CONNECTIONS: &str = "53300";
/// SQLSTATE `out_of_memory`: for a lock statement, the shared lock table is full.
const OUT_OF_MEMORY: &str = "53200";
/// SQLSTATE `insufficient_privilege`.
pub(crate) const INSUFFICIENT_PRIVILEGE: &str = "42501";

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
    /// The server's advisory locks cannot be trusted to exclude: what was found, and what to
    /// do instead.
    UnsupportedServer {
        found: String,
        advice: String,
    },
    PermissionDenied {
        object: String,
        privilege: String,
    },
    /// `transient`: trying again later may succeed (the network, a restarting or busy server),
    /// as opposed to a refusal that will stand (authentication, a missing database).
    Connection {
        reason: String,
        transient: bool,
    },
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
            err if has_sqlstate(err, INSUFFICIENT_PRIVILEGE) => Failure::PermissionDenied {
                object: denied_object(err),
                privilege: "the privilege the statement needs (see the table's documentation)"
                    .to_owned(),
            },
            err => Failure::Connection {
                reason: err.to_string(),
                // The server answered with an error of its own that is not about the
                // connection (a password, a database name): asking again changes nothing.
                transient: !matches!(err, sqlx::Error::Database(_)) || breaks_connection(err),
            },
        }
    }

    /// True when waiting and trying again may succeed: no connection was free, or none could
    /// be opened for a reason that passes.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Failure::PoolExhausted { .. } | Failure::TooManyConnections(_) => true,
            Failure::Connection { transient, .. } => *transient,
            Failure::PoolClosed
            | Failure::Standby
            | Failure::TransactionPooling
            | Failure::UnsupportedServer { .. }
            | Failure::PermissionDenied { .. } => false,
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
                Failure::Connection {
                    reason: format!(
                        "no connection could be opened within {waited:?}, although the server \
                         accepts one now (it may have been restarting or overloaded)"
                    ),
                    transient: true,
                }
            }
            Err(_) => Failure::Connection {
                reason: format!(
                    "no connection could be opened within {waited:?}, and the server did not \
                     answer a new one within {DIAGNOSIS:?}"
                ),
                transient: true,
            },
        }
    }

    pub(crate) fn into_error(self, key: &LockKey) -> Error {
        let key = key.clone();
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
            Failure::UnsupportedServer { found, advice } => {
                Error::UnsupportedServer { key, found, advice }
            }
            Failure::PermissionDenied { object, privilege } => Error::PermissionDenied {
                key,
                object,
                privilege,
                source: None,
            },
            Failure::Connection { reason, .. } => Error::Connection {
                key,
                reason,
                source: None,
            },
        }
    }
}

/// Classifies a failed lock statement: `Connection` when the session broke, otherwise the
/// server's refusal (see [`refusal`]).
pub(crate) fn statement_error(key: &LockKey, err: sqlx::Error) -> Error {
    if breaks_connection(&err) {
        connection_error(key, err)
    } else {
        refusal(key, err)
    }
}

/// What a lock statement the server refused (the session goes on) means: a full lock table
/// and a missing privilege are errors of their own, anything else the server's message.
pub(crate) fn refusal(key: &LockKey, err: sqlx::Error) -> Error {
    let key = key.clone();
    if has_sqlstate(&err, OUT_OF_MEMORY) {
        return Error::LockTableFull { key, source: err };
    }
    if has_sqlstate(&err, INSUFFICIENT_PRIVILEGE) {
        return Error::PermissionDenied {
            key,
            object: denied_object(&err),
            privilege: "the privilege the statement needs (see the table's documentation)"
                .to_owned(),
            source: Some(err),
        };
    }
    Error::Database { key, source: err }
}

/// The object a permission error names: "permission denied for table t" gives "table t" (the
/// server names the object, not the privilege).
fn denied_object(err: &sqlx::Error) -> String {
    let message = err
        .as_database_error()
        .map(|db| db.message().to_owned())
        .unwrap_or_default();
    message
        .strip_prefix("permission denied for ")
        .unwrap_or(&message)
        .to_owned()
}

pub(crate) fn connection_error(key: &LockKey, err: sqlx::Error) -> Error {
    match Failure::from_sqlx(&err) {
        Failure::Connection { reason, .. } => Error::Connection {
            key: key.clone(),
            reason,
            source: Some(err),
        },
        failure => failure.into_error(key),
    }
}
