//! The SQL a manager sends, built once from its configuration.
//!
//! Statements with values from outside the crate (the holder tag) bind them as parameters.
//! The only statement built per call, the wait message, interpolates integers the crate
//! computed and the fencing table's quoted identifier, never user text.

use crate::sql::whole_ms;
use std::sync::Arc;

use super::fencing::FencingTable;
use sqlx::postgres::PgArguments;

use crate::{LockMode, LockTarget};

/// How often a waiting backend checks that its client is still there, in milliseconds.
const CLIENT_CHECK_MS: u32 = 200;

/// Sets up a session the manager is about to use: reports its process id, whether the server
/// is a standby and its `max_locks_per_transaction` (for the default budget of held locks), the
/// values the settings named in `$1` had (NULL where the server has no such setting), and what
/// the engine is (`version()`, YugabyteDB's setting that silences its advisory locks, whether
/// the citus extension is installed: see `server_check.rs`), and then gives the settings the
/// values in `$2`, skipping those the server does not know (an older server lacks
/// `idle_session_timeout`). The materialized CTE reads the old values before the outer query
/// changes them.
pub(crate) const SETUP: &str = "WITH before AS MATERIALIZED (\
       SELECT pg_catalog.pg_backend_pid() AS pid, pg_catalog.pg_is_in_recovery() AS standby, \
         pg_catalog.current_setting('max_locks_per_transaction')::bigint AS max_locks, \
         ARRAY(SELECT pg_catalog.current_setting(n, true) \
           FROM pg_catalog.unnest($1::pg_catalog.text[]) WITH ORDINALITY AS s(n, i) \
           ORDER BY i) AS settings) \
     SELECT pid, standby, max_locks, settings, \
       (SELECT pg_catalog.count(pg_catalog.set_config(n, v, false)) \
          FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
            pg_catalog.unnest($2::pg_catalog.text[])) AS s(n, v) \
          WHERE pg_catalog.current_setting(n, true) IS NOT NULL), \
       pg_catalog.version(), \
       pg_catalog.current_setting('yb_silence_advisory_locks_not_supported_error', true), \
       EXISTS (SELECT FROM pg_catalog.pg_extension \
         WHERE extname OPERATOR(pg_catalog.=) 'citus') \
     FROM before";

/// Gives the settings named in `$1` the values in `$2` again: what they were before the
/// manager set the session up.
pub(crate) const RESTORE: &str = "SELECT pg_catalog.count(pg_catalog.set_config(n, v, false)) \
     FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.text[])) AS s(n, v)";

/// What the manager sets on every session it uses, and restores before the session goes back
/// to the pool.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionSettings {
    pub(crate) names: Vec<String>,
    pub(crate) values: Vec<String>,
}

impl SessionSettings {
    /// `application_name` tagged with `tag`, and, with a `silence` timeout, the server's
    /// bounds on a silent client: `idle_session_timeout` (PostgreSQL 14 and later) for a
    /// session that receives nothing, which is what frees a frozen holder's locks, and the TCP
    /// keepalives and user timeout for a peer that has gone from the network while a
    /// statement runs. Every one of them is a setting any role may change on its own session.
    pub(crate) fn new(tag: Option<&str>, silence: Option<std::time::Duration>) -> Self {
        let mut settings = SessionSettings::default();
        if let Some(tag) = tag {
            settings.set("application_name", tag.to_owned());
        }
        if let Some(silence) = silence {
            let ms = whole_ms(silence).max(1);
            let secs = ms.div_ceil(1000).max(3);
            // Keepalives: the first probe after a third of the bound, then four probes over the
            // rest, so the kernel gives up on a silent peer within about the bound.
            let idle = (secs / 3).max(1);
            let interval = ((secs - idle) / 4).max(1);
            settings.set("idle_session_timeout", format!("{ms}ms"));
            settings.set("tcp_user_timeout", format!("{ms}ms"));
            settings.set("tcp_keepalives_idle", idle.to_string());
            settings.set("tcp_keepalives_interval", interval.to_string());
            settings.set("tcp_keepalives_count", "4".to_owned());
        }
        settings
    }

    fn set(&mut self, name: &str, value: String) {
        self.names.push(name.to_owned());
        self.values.push(value);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

pub(crate) struct Statements {
    // Shared, so binding a statement to a query does not copy its text. Indexed by
    // `slot(mode, target)`: exclusive/shared times bigint/pair.
    tries: [Arc<str>; 4],
    /// Mints the next token of fencing row `$1`, after a handoff.
    mint: Option<Arc<str>>,
    pub(crate) fencing: Option<FencingTable>,
    /// What the manager sets on its sessions while it uses them.
    pub(crate) settings: SessionSettings,
}

fn slot(mode: LockMode, target: LockTarget) -> usize {
    let pair = usize::from(matches!(target, LockTarget::IntPair(..)));
    let shared = usize::from(mode == LockMode::Shared);
    shared * 2 + pair
}

/// The arguments of a lock function for a target bound as `$1` (and `$2` for a pair), the
/// fencing row it mints in, and where the session's backend pid goes.
///
/// Every statement on a session the manager set up runs its lock function only on the backend
/// it expects (`CASE WHEN pg_backend_pid() = <pid>`): behind a transaction-pooling proxy a
/// statement may land on another server session, where a session lock would be stranded. It
/// answers NULL there, and nothing is taken.
///
/// Every function, operator and type a statement names is `pg_catalog`'s, named so, whatever
/// the session's `search_path` (see `crate::sql::pg`); types with an SQL keyword (`bigint`,
/// `integer`) are `pg_catalog`'s by the grammar.
fn bound_args(pair: bool) -> (&'static str, &'static str, &'static str) {
    if pair {
        (
            "$1, $2",
            "((($1::bigint) OPERATOR(pg_catalog.<<) 32) \
             OPERATOR(pg_catalog.|) (($2::bigint) OPERATOR(pg_catalog.&) 4294967295))",
            PID,
        )
    } else {
        ("$1", "$1", PID)
    }
}

/// `pg_backend_pid() = {pid}`, named so a `search_path` cannot redirect it.
const ON_OWN_BACKEND: &str = "pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) {backend_pid}";

/// Where a session's backend pid goes in a statement's text; [`Statements::for_session`]
/// writes the pid in, so statements bind only the lock's own arguments.
const PID: &str = "{backend_pid}";

/// The channel every release by a pglock manager notifies when somebody waits for the lock
/// without a connection of its own; the payload is the lock id (`LockTarget::packed`).
pub(crate) const UNLOCKED_CHANNEL: &str = "pglock_unlocked";

/// Mixed into a lock id to make its waiters' flag, so the flag is no lock anybody takes.
const FLAG_SALT: i64 = 0x2f3c_5a96_61d7_e4b9;

/// The arguments of the waiters' flag of lock id `id` (an `int8` SQL expression): a lock in
/// the two-integer namespace, which pglock's own keys never use for names and ids. A waiter
/// without a connection of its own holds it shared (see `doorbell.rs`); a release takes it
/// with `pg_try_advisory_xact_lock`, and notifies only if that fails, so a release nobody waits
/// for costs no notification.
pub(crate) fn flag_args(id: &str) -> String {
    pair_args(&format!(
        "({id}) OPERATOR(pg_catalog.#) ({FLAG_SALT}::bigint)"
    ))
}

/// The two `integer` arguments of the two-integer advisory lock whose halves, high and low,
/// make the `int8` SQL expression `id` (as `pg_locks` shows them in `classid` and `objid`).
pub(crate) fn pair_args(id: &str) -> String {
    format!(
        "(({id}) OPERATOR(pg_catalog.>>) 32)::integer, \
         ((({id}) OPERATOR(pg_catalog.<<) 32) OPERATOR(pg_catalog.>>) 32)::integer"
    )
}

/// `ok` (a boolean column: the unlock's result) followed by the notification of `id`'s
/// waiters, if it unlocked and somebody flagged that they wait.
pub(crate) fn notify_column(ok: &str, id: &str) -> String {
    format!(
        "CASE WHEN {ok} AND NOT pg_catalog.pg_try_advisory_xact_lock({}) \
         THEN pg_catalog.pg_notify('{UNLOCKED_CHANNEL}', ({id})::pg_catalog.text)::pg_catalog.text \
         END",
        flag_args(id)
    )
}

/// An unlock of the target bound as `$1` (`$1, $2` for a pair), on the expected backend only
/// (NULL elsewhere), that notifies the lock's waiters (see [`notify_column`]). The unlock runs
/// first, in a materialized CTE, so a waiter woken by the notification finds the lock free.
fn unlock_statement(mode: LockMode, pair: bool) -> String {
    let function = match mode {
        LockMode::Exclusive => "pg_catalog.pg_advisory_unlock",
        LockMode::Shared => "pg_catalog.pg_advisory_unlock_shared",
    };
    let (args, id, _) = bound_args(pair);
    format!(
        "WITH u AS MATERIALIZED (SELECT CASE WHEN {ON_OWN_BACKEND} \
         THEN {function}({args}) END AS ok) SELECT u.ok, {} FROM u",
        notify_column("u.ok", id)
    )
}

/// The try and unlock statements of one lock session, with its backend pid written in.
pub(crate) struct SessionStatements {
    tries: [Arc<str>; 4],
    unlocks: [Arc<str>; 4],
}

impl SessionStatements {
    pub(crate) fn try_lock(&self, mode: LockMode, target: LockTarget) -> Arc<str> {
        Arc::clone(&self.tries[slot(mode, target)])
    }

    pub(crate) fn unlock(&self, mode: LockMode, target: LockTarget) -> Arc<str> {
        Arc::clone(&self.unlocks[slot(mode, target)])
    }
}

impl Statements {
    pub(crate) fn new(fencing: Option<FencingTable>, settings: SessionSettings) -> Self {
        // Columns: granted, token.
        let try_statement = |mode: LockMode, pair: bool| {
            let function = match mode {
                LockMode::Exclusive => "pg_catalog.pg_try_advisory_lock",
                LockMode::Shared => "pg_catalog.pg_try_advisory_lock_shared",
            };
            let (args, fence, _) = bound_args(pair);
            let call = format!("CASE WHEN {ON_OWN_BACKEND} THEN {function}({args}) END");
            match &fencing {
                None => format!("SELECT {call}, NULL::bigint"),
                Some(table) => format!(
                    "WITH l AS MATERIALIZED (SELECT {call} AS granted), m AS ({}) \
                     SELECT l.granted, (SELECT token FROM m) FROM l",
                    table.mint_if_granted("l", fence)
                ),
            }
            .into()
        };
        Statements {
            tries: [
                try_statement(LockMode::Exclusive, false),
                try_statement(LockMode::Exclusive, true),
                try_statement(LockMode::Shared, false),
                try_statement(LockMode::Shared, true),
            ],
            mint: fencing.as_ref().map(|table| table.mint("$1").into()),
            fencing,
            settings,
        }
    }

    /// The try and unlock statements of the session whose backend is `pid`.
    pub(crate) fn for_session(&self, pid: i32) -> SessionStatements {
        let pid = pid.to_string();
        SessionStatements {
            tries: self.tries.each_ref().map(|t| t.replace(PID, &pid).into()),
            unlocks: [
                unlock_statement(LockMode::Exclusive, false),
                unlock_statement(LockMode::Exclusive, true),
                unlock_statement(LockMode::Shared, false),
                unlock_statement(LockMode::Shared, true),
            ]
            .map(|u| u.replace(PID, &pid).into()),
        }
    }

    pub(crate) fn mint(&self) -> Option<Arc<str>> {
        self.mint.clone()
    }

    /// Unlocks `target` in `mode` only if this session holds it (integers only, no user text).
    pub(crate) fn unlock_if_held(target: LockTarget, mode: LockMode) -> String {
        let (classid, objid) = crate::split_lock_id(target.packed());
        let (function, lock_mode) = match mode {
            LockMode::Exclusive => ("pg_catalog.pg_advisory_unlock", "ExclusiveLock"),
            LockMode::Shared => ("pg_catalog.pg_advisory_unlock_shared", "ShareLock"),
        };
        let eq = "OPERATOR(pg_catalog.=)";
        format!(
            "SELECT {function}({}) FROM pg_catalog.pg_locks \
             WHERE locktype {eq} 'advisory' AND pid {eq} pg_catalog.pg_backend_pid() \
             AND classid {eq} {classid}::bigint::pg_catalog.oid \
             AND objid {eq} {objid}::bigint::pg_catalog.oid \
             AND objsubid {eq} {}::smallint AND mode {eq} '{lock_mode}' AND granted",
            literal_args(target),
            target.objsubid()
        )
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
        target: LockTarget,
        mode: LockMode,
        timeout_ms: Option<u128>,
        session: (i32, u32),
    ) -> String {
        let (pid, server_version) = session;
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
            // The token minted below must survive a crash, without waiting for standbys (see
            // `DURABLE` in fencing.rs).
            sql.push_str("SET LOCAL synchronous_commit = local; ");
        }
        let function = match mode {
            LockMode::Exclusive => "pg_catalog.pg_advisory_lock",
            LockMode::Shared => "pg_catalog.pg_advisory_lock_shared",
        };
        sql.push_str(&format!(
            "SELECT pg_catalog.pg_backend_pid(), \
             CASE WHEN {} THEN {function}({})::pg_catalog.text END",
            ON_OWN_BACKEND.replace(PID, &pid.to_string()),
            literal_args(target)
        ));
        if let Some(table) = &self.fencing {
            sql.push_str("; ");
            sql.push_str(&table.mint(&target.packed().to_string()));
        }
        sql
    }
}

/// The parameters of a try or an unlock: the target (`$1`, or `$1, $2` for a pair).
pub(crate) fn target_args(target: LockTarget) -> PgArguments {
    use sqlx::Arguments as _;
    let mut args = PgArguments::default();
    // Sized up front: growing the buffers costs more than the encoding.
    args.reserve(2, 16);
    let bound = match target {
        LockTarget::BigInt(id) => args.add(id),
        LockTarget::IntPair(a, b) => args.add(a).and_then(|()| args.add(b)),
    };
    bound.expect("integers always encode");
    args
}

/// A target's arguments written out as typed literals (quoted, so `i64::MIN` parses).
fn literal_args(target: LockTarget) -> String {
    match target {
        LockTarget::BigInt(id) => format!("'{id}'::bigint"),
        LockTarget::IntPair(a, b) => format!("'{a}'::integer, '{b}'::integer"),
    }
}
