//! The PostgreSQL lock manager.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`PostgresLockManager`] |
//! | `builder.rs` | [`PostgresLockManagerBuilder`] |
//! | `backend.rs` | the backend the shared engine drives: try on a lock session, else wait |
//! | `sessions.rs` | a manager's set of lock sessions: open, pick, retire |
//! | `lock_session/mod.rs` (+ `link.rs`, `task.rs`, `batch.rs`) | one lock session: its connection, lent to callers while idle, and the task that owns it |
//! | `wait.rs`, `wait_session.rs` | contended waits: in the server's queue on sessions of their own, or without one; reuse of those sessions |
//! | `doorbell.rs` | what wakes a wait without a connection, and carries the probes for lock-order cycles |
//! | `monitor.rs` | turning a session's end into the loss of exactly its locks |
//! | `server_check.rs` | what the server is, and the proof that its advisory locks exclude |
//! | `statements.rs`, `fencing.rs` | the lock statements, fencing tokens (what a failed statement means is in `crate::sql`) |

pub(crate) mod backend;
mod builder;
mod doorbell;
mod fencing;
mod lock_session;
mod monitor;
mod probes;
mod server_check;
mod sessions;
pub(crate) mod statements;
mod wait;
mod wait_session;

use std::fmt;
use std::sync::Arc;

use sqlx::PgPool;

pub use self::builder::PostgresLockManagerBuilder;
#[cfg(test)]
pub(crate) use self::builder::documented_defaults;
pub use self::fencing::FencingTable;
pub use self::server_check::ServerCheck;

use self::backend::PgBackend;
use crate::core::Core;

/// A [`LockManager`](crate::LockManager) on PostgreSQL session advisory locks.
///
/// Locks live on a few long-lived connections of your pool, the manager's **lock sessions**;
/// one lock session carries any number of locks. PostgreSQL frees a session's locks when the
/// session ends, so a crashed or killed process cannot strand them. Keys map to lock ids with
/// [`lock_id`], the same derivation as the Python original, so Rust and Python replicas
/// exclude each other.
///
/// # Construction
///
/// Build it from the [`PgPool`] you already have; nothing touches the database until the first
/// acquisition. The manager is cheap to clone and every clone is the *same* holder. Build one
/// per process and share it (as `Arc<dyn LockManager>` or by cloning): two managers on one
/// pool are two holders, which exclude each other and each open their own lock sessions.
///
/// ```no_run
/// # async fn run() -> Result<(), sqlx::Error> {
/// let pool = sqlx::PgPool::connect("postgres://localhost/app").await?;
/// let locks = pglock::PostgresLockManager::builder(pool)
///     .holder_id(format!("orders-worker-{}", std::process::id()))
///     .build();
/// # let _ = locks; Ok(()) }
/// ```
///
/// # Sessions, and sizing the pool
///
/// The manager holds at most [`max_connections`](PostgresLockManagerBuilder::max_connections)
/// connections at once (default 4, never more than the pool's size), whatever the number of
/// locks it holds or the number of tasks that wait; the rest of the pool stays the
/// application's.
///
/// | what | connections |
/// | --- | --- |
/// | any number of locks taken without waiting | at most [`lock_sessions`](PostgresLockManagerBuilder::lock_sessions) (default 2), opened on demand and returned after [`session_idle_timeout`](PostgresLockManagerBuilder::session_idle_timeout) without locks |
/// | a key waited for in the server's queue, then held | one *wait session* each, from what the cap leaves (default 1) |
/// | any number of other waits | none of their own: one listener connection (outside the pool, within the cap) while some wait |
///
/// A lock granted in the server's queue stays on its wait session until released: PostgreSQL
/// cannot move a lock to another session without a moment in which another process could take
/// it. Lost-lock detection needs no connection: it rides on the sessions themselves. The
/// listener holds one entry of the server's lock table per key waited for without a
/// connection (a shared lock in the two-integer advisory space that tells releases to notify),
/// outside the [`lock_budget`](PostgresLockManagerBuilder::lock_budget) of held locks.
///
/// # The server's lock table, and the budget
///
/// PostgreSQL keeps every session's locks in one shared table, sized from
/// `max_locks_per_transaction × (max_connections + max_prepared_transactions)` and able to
/// borrow spare shared memory (about 12,900 advisory locks on a stock server: 12,857 and
/// 12,880 in two measured runs). When it is full, no client of the database can take a lock,
/// nor even connect. So a manager holds at
/// most its [`lock_budget`](PostgresLockManagerBuilder::lock_budget) of locks: by default
/// `max_locks_per_transaction × the pool's max_connections` (640 on sqlx's default pool of 10
/// against a stock server), refused beyond it with
/// [`Error::BudgetExhausted`](crate::Error::BudgetExhausted) before the server is asked. A
/// full table met anyway (other clients' locks) is
/// [`Error::LockTableFull`](crate::Error::LockTableFull).
///
/// # How each operation behaves
///
/// * **`try_acquire(key)`** is one `pg_try_advisory_lock` on a lock session: one round trip,
///   no pool checkout once a lock session is open. `None` means held, by anyone, including
///   this manager. Under load, the tries (and the unlocks) queued on a lock session run as one
///   statement, one round trip for up to 256 of them, each caller getting its own answer;
///   fenced tries run one by one.
/// * **`acquire(key, timeout)`** first tries the same way. If the key is held elsewhere and
///   the cap has a wait session free, it waits in PostgreSQL's FIFO lock queue on that session:
///   one simple-query message sets `lock_timeout` for that statement only and calls
///   `pg_advisory_lock`, so the server ends the wait at the deadline, grants the lock the
///   moment it is free, and the session stays clean. Otherwise it waits without a connection:
///   it tries again on a lock session whenever a pglock release of that key notifies it
///   (`LISTEN`/`NOTIFY`, sent only when somebody waits) and at every
///   [`wait_poll_interval`](PostgresLockManagerBuilder::wait_poll_interval) (250 ms), which
///   bounds noticing a holder that does not notify (a killed process, the Python original,
///   `psql`); the tries of all such waits run together. It moves into the server's queue,
///   oldest wait first, as soon as a wait session is free. Such a wait gives way to waiters
///   already in the server's queue, and a try of another process can take the key in the
///   moment between a release and its own try: only a wait in the server's queue is never
///   overtaken.
/// * **Lock-order cycles.** A caller inside critical sections (`with_lock`, `LockGuard::run`)
///   that waits for a key a section of another waiting caller holds, round a cycle, fails with
///   [`Error::Deadlock`](crate::Error::Deadlock): at once when the cycle is among this
///   manager's own callers; within about the server's `deadlock_timeout` (or
///   [`deadlock_timeout`](PostgresLockManagerBuilder::deadlock_timeout)) plus one poll interval
///   when it goes through other managers, found by probes over the listener. Only the cycle's
///   youngest wait fails; the others proceed. Guards kept in variables are not seen, and a
///   manager with no listener (a cap under 3) finds only its own cycles.
/// * **Deadlines.** `Some(t)` is the only bound: one deadline, `t` from the call, covering the
///   wait for this manager's own turn on the key, getting a lock session or a connection to
///   wait on (a checkout the pool's own `acquire_timeout` cuts short is started again while
///   time remains), and the wait on the server. When it runs out, at whatever stage, the
///   call fails with [`Error::Timeout`](crate::Error::Timeout). `Some(Duration::ZERO)` is
///   exactly one try. `None` waits for the holder for as long as it takes, and so does a
///   deadline too far away for the clock (such as `Duration::MAX`); deadlines beyond
///   PostgreSQL's largest `lock_timeout` (about 24 days) are waited out in steps.
/// * **Without a deadline** (`None`, `try_acquire`, a zero timeout), getting a connection is
///   bounded by the pool's `acquire_timeout` (sqlx's default: 30 s) plus the new session's
///   set-up statement (bounded by [`release_timeout`](PostgresLockManagerBuilder::release_timeout)),
///   so a full pool or an unreachable server is a typed error
///   ([`Error::PoolExhausted`](crate::Error::PoolExhausted),
///   [`Error::TooManyConnections`](crate::Error::TooManyConnections),
///   [`Error::Connection`](crate::Error::Connection), ...), not an endless wait. This is the
///   only case where a connection is given up on before the caller's deadline; set the pool's
///   `acquire_timeout` to tune it.
/// * **A key this manager already holds** is never requested twice from the server: `acquire`
///   waits in-process behind the local holder (bounded by its deadline), whether it comes
///   from another task or from a sibling future of the holder's task; `try_acquire` returns
///   `None`. A lock is never stacked (PostgreSQL's advisory locks are re-entrant per session).
/// * **Locks are held in autocommit.** A holding session is `idle`, never
///   `idle in transaction`: it does not hold back VACUUM and is not subject to
///   `idle_in_transaction_session_timeout`.
/// * **Release** runs `pg_advisory_unlock` and checks its result. A wait session goes back to
///   the pool only after a confirmed unlock; otherwise it is closed, which frees whatever it
///   held. A lock session is closed when a statement on it goes unanswered for
///   [`release_timeout`](PostgresLockManagerBuilder::release_timeout), and its locks are then
///   reported lost. Nothing the manager changes on a session (its `application_name`) outlives
///   the manager's use of it.
///
/// # Lost locks, and silent holders
///
/// Every session holding locks is kept heard: when nothing on it has been answered for
/// [`probe_interval`](PostgresLockManagerBuilder::probe_interval), the manager pings it (a bare
/// protocol `Sync`). A session's locks live exactly as long as the session, so the answer
/// confirms every lock on it, at a cost that does not grow with their number. A ping that
/// fails (the session was terminated, the server restarted or failed over) declares that
/// session's locks lost within about one interval; a ping unanswered for
/// [`probe_grace`](PostgresLockManagerBuilder::probe_grace) does too, and a session the manager
/// closes loses its locks at once. Exactly the locks of that session are lost, the others are
/// untouched. A lost lock leaves the registry and its guard's
/// [`loss_signal`](crate::LockGuard::loss_signal) fires.
///
/// The server, for its part, ends a session it has not heard from for the
/// [`silence_timeout`](PostgresLockManagerBuilder::silence_timeout) (20 s by default; set on each
/// session as `idle_session_timeout`, with TCP timeouts to match): a process that is frozen or
/// cut off from the server loses its locks within that bound, and learns it
/// ([`LossCause::Expired`](crate::LossCause::Expired)) before its work under the guard is polled
/// again. The [failure model](https://github.com/pglock-rs/pglock/blob/main/docs/failure-model.md) has the measured latencies and
/// the limits.
///
/// # Cancel safety
///
/// Every async method is cancel safe at every await point. A statement on a lock session is
/// either run to completion by the task that owns the session, whether or not its caller still
/// waits, or (on an idle session, where the caller runs it itself) settled by that task before
/// anything else runs on the session: a dropped try leaves no lock behind (a grant nobody
/// received is released) and never disturbs the other locks on the session. A dropped wait in
/// the server's queue closes its own session, and on PostgreSQL 14 and later the server
/// abandons the wait within 200 ms; a dropped wait without a connection only stops being woken.
/// A dropped `release` or `release_all` still completes the release.
///
/// [`lock_id`]: crate::lock_id
#[derive(Clone)]
pub struct PostgresLockManager {
    pub(crate) core: Arc<Core<PgBackend>>,
}

impl PostgresLockManager {
    /// A manager with default settings on `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool).build()
    }

    /// Configures a manager on `pool`.
    pub fn builder(pool: PgPool) -> PostgresLockManagerBuilder {
        PostgresLockManagerBuilder::new(pool)
    }

    /// The pool this manager takes its sessions from.
    pub fn pool(&self) -> &PgPool {
        &self.core.backend.pool
    }

    /// The most locks this manager may hold at once (see
    /// [`lock_budget`](PostgresLockManagerBuilder::lock_budget)); `None` until it is known: a
    /// default is derived from the server's settings when the first session is set up.
    pub fn lock_budget(&self) -> Option<usize> {
        self.core.lock_budget()
    }

    /// How many lock sessions the manager has open right now.
    pub fn lock_session_count(&self) -> usize {
        self.core.backend.sessions.open_count()
    }

    /// Checks now, instead of at the first acquisition, that the server's advisory locks
    /// exclude: what the engine is (CockroachDB, YugabyteDB with its advisory locks silenced
    /// and Citus are refused by name), that it is not a standby (unless
    /// [`allow_standby`](PostgresLockManagerBuilder::allow_standby)), and the proof: a salted
    /// lock taken on a connection of the pool must be refused to a second connection of its
    /// own, then released and taken by the second. Also reports whether the server delivers
    /// notifications (`LISTEN`), which waits without a connection of their own and cycle
    /// detection across processes use. Call it at start-up, where a refusal should stop the
    /// service; the manager runs the same proof once by itself, when its first lock session
    /// is set up.
    ///
    /// It costs a checkout, a connection of its own for the moment of the proof, and six short
    /// statements; the [benchmarks](https://github.com/pglock-rs/pglock/blob/main/docs/benchmarks.md) have the measured time.
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedServer`](crate::Error::UnsupportedServer) naming what was found
    /// and what to do; [`Error::Standby`](crate::Error::Standby);
    /// [`Error::TransactionPooling`](crate::Error::TransactionPooling) when both connections
    /// reached one server session; the connection failures of an acquisition. Their key is
    /// `pglock:server-check`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the proof's connection closes when dropped, and a checked-out connection
    /// cut short mid-statement is closed, not pooled, so the salted lock never outlives it.
    pub async fn check_server(&self) -> crate::Result<ServerCheck> {
        let key = crate::LockKey::from("pglock:server-check");
        self.core.backend.check_server(&key).await
    }

    /// Checks the fencing table now (creating it where it is missing and the role may), if
    /// fencing is on, instead of at the first fenced acquisition; see [`FencingTable`] for what
    /// is checked and the grants a role that owns nothing needs. Does nothing when fencing is
    /// off.
    ///
    /// # Errors
    ///
    /// [`Error::PermissionDenied`](crate::Error::PermissionDenied) naming the object and the
    /// privilege the role lacks; [`Error::Connection`](crate::Error::Connection) when the
    /// server cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the creation is one transaction, and a connection dropped mid-way is closed.
    pub async fn ensure_fencing_table(&self) -> crate::Result<()> {
        self.core
            .backend
            .ensure_fencing(&crate::LockKey::from("pglock:fencing-table-setup"))
            .await
    }
}

impl fmt::Debug for PostgresLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManager")
            .field("holder_id", &self.core.holder_id())
            .field("held_lock_count", &self.core.held_lock_count())
            .field("lock_sessions", &self.lock_session_count())
            .finish_non_exhaustive()
    }
}
