//! The SQL a manager sends, built once from its configuration.
//!
//! Statements with values from outside the crate (the holder tag) bind them as parameters.
//! The only statement built per call, the wait message, interpolates integers the crate
//! computed and the fencing table's quoted identifier, never user text.

use std::sync::Arc;

use super::fencing::FencingTable;
use crate::LockMode;

/// How often a waiting backend checks that its client is still there, in milliseconds.
const CLIENT_CHECK_MS: u32 = 200;

/// PostgreSQL's largest `lock_timeout`, in milliseconds; longer waits are split.
pub(crate) const MAX_LOCK_TIMEOUT_MS: u128 = i32::MAX as u128;

pub(crate) const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";
pub(crate) const UNLOCK_SHARED: &str = "SELECT pg_advisory_unlock_shared($1)";

/// Sets up a session the manager is about to use: reports its process id, the name to restore
/// later and whether the server is a standby, and (when `$1` is not null) tags it.
pub(crate) const SETUP: &str = "SELECT pg_backend_pid(), current_setting('application_name'), \
     pg_is_in_recovery(), \
     CASE WHEN $1::text IS NULL THEN NULL ELSE set_config('application_name', $1, false) END";

/// Restores the `application_name` a session had before the manager tagged it.
pub(crate) const RESTORE_NAME: &str = "SELECT set_config('application_name', $1, false)";

pub(crate) struct Statements {
    // Shared, so binding a statement to a query does not copy its text.
    try_exclusive: Arc<str>,
    try_shared: Arc<str>,
    /// Mints the next token of lock id `$1`, after a handoff.
    mint: Option<Arc<str>>,
    pub(crate) fencing: Option<FencingTable>,
    /// The `application_name` of the manager's sessions while it uses them.
    pub(crate) tag: Option<String>,
}

impl Statements {
    pub(crate) fn new(fencing: Option<FencingTable>, tag: Option<String>) -> Self {
        // Columns: granted, token.
        let try_statement = |function: &str| match &fencing {
            None => format!("SELECT {function}($1), NULL::int8"),
            Some(table) => format!(
                "WITH l AS MATERIALIZED (SELECT {function}($1) AS granted), m AS ({}) \
                 SELECT l.granted, (SELECT token FROM m) FROM l",
                table.mint_if_granted("l")
            ),
        };
        Statements {
            try_exclusive: try_statement("pg_try_advisory_lock").into(),
            try_shared: try_statement("pg_try_advisory_lock_shared").into(),
            mint: fencing.as_ref().map(|table| table.mint("$1").into()),
            fencing,
            tag,
        }
    }

    pub(crate) fn try_lock(&self, mode: LockMode) -> Arc<str> {
        Arc::clone(match mode {
            LockMode::Exclusive => &self.try_exclusive,
            LockMode::Shared => &self.try_shared,
        })
    }

    pub(crate) fn mint(&self) -> Option<Arc<str>> {
        self.mint.clone()
    }

    pub(crate) fn unlock(mode: LockMode) -> &'static str {
        match mode {
            LockMode::Exclusive => UNLOCK,
            LockMode::Shared => UNLOCK_SHARED,
        }
    }

    /// One simple-query message that waits for the lock in the server's queue: `SET LOCAL`s,
    /// then the lock function, then the mint, all in the message's implicit transaction so no
    /// setting outlives it.
    ///
    /// * `lock_timeout` makes the server end the wait at the caller's deadline (SQLSTATE
    ///   55P03), leaving the session clean; no client-side polling.
    /// * `client_connection_check_interval` (PostgreSQL 14+) makes a waiting backend notice
    ///   that its client has gone and leave the queue. The server arms that check when a
    ///   statement starts, so it must be set by an earlier statement of the same message.
    pub(crate) fn wait(
        &self,
        lock_id: i64,
        mode: LockMode,
        timeout_ms: Option<u128>,
        server_version: u32,
    ) -> String {
        let mut sql = String::with_capacity(256);
        if server_version >= 140_000 {
            sql.push_str(&format!(
                "SET LOCAL client_connection_check_interval = {CLIENT_CHECK_MS}; "
            ));
        }
        if let Some(ms) = timeout_ms {
            sql.push_str(&format!("SET LOCAL lock_timeout = {ms}; "));
        }
        if self.fencing.is_some() {
            // The token minted below must survive a crash (see `FencingTable`).
            sql.push_str("SET LOCAL synchronous_commit = on; ");
        }
        let function = match mode {
            LockMode::Exclusive => "pg_advisory_lock",
            LockMode::Shared => "pg_advisory_lock_shared",
        };
        sql.push_str(&format!(
            "SELECT pg_backend_pid(), {function}({lock_id})::text"
        ));
        if let Some(table) = &self.fencing {
            sql.push_str("; ");
            sql.push_str(&table.mint(&lock_id.to_string()));
        }
        sql
    }
}
