//! Configuration of a `PostgresLockManager`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{OnceCell, Semaphore};

use super::PostgresLockManager;
use super::backend::PgBackend;
use super::doorbell::{Doorbell, DoorbellConfig};
use super::fencing::FencingTable;
use super::lock_session::{Heartbeat, SessionContext};
use super::monitor::Monitor;
use super::sessions::{LockSessions, SessionsConfig};
use super::statements::{SessionSettings, Statements};
use super::wait_session::IdleSessions;
use crate::core::{Budget, CommonOptions, Core, HandoffLimits, Waits};

/// The default [`silence_timeout`](PostgresLockManagerBuilder::silence_timeout).
const DEFAULT_SILENCE_TIMEOUT: Duration = Duration::from_secs(20);

/// The shortest silence timeout: below it, a busy runtime would lose healthy locks.
const MIN_SILENCE_TIMEOUT: Duration = Duration::from_secs(1);

/// Builds a [`PostgresLockManager`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct PostgresLockManagerBuilder {
    pool: PgPool,
    common: CommonOptions,
    release_timeout: Duration,
    fencing: Option<FencingTable>,
    tag_prefix: Option<String>,
    probe_interval: Duration,
    probe_grace: Duration,
    detect_lost_locks: bool,
    silence_timeout: Option<Duration>,
    handoff: Option<HandoffLimits>,
    idle_sessions: (usize, Duration),
    lock_sessions: usize,
    max_connections: Option<usize>,
    wait_poll_interval: Duration,
    deadlock_timeout: Option<Duration>,
    session_idle_timeout: Duration,
    allow_standby: bool,
}

/// The default [`max_connections`](PostgresLockManagerBuilder::max_connections).
const DEFAULT_MAX_CONNECTIONS: usize = 4;

impl PostgresLockManagerBuilder {
    pub(super) fn new(pool: PgPool) -> Self {
        PostgresLockManagerBuilder {
            pool,
            common: CommonOptions::default(),
            release_timeout: Duration::from_secs(5),
            fencing: None,
            tag_prefix: Some("pglock:".to_owned()),
            probe_interval: Duration::from_secs(2),
            probe_grace: Duration::from_secs(2),
            detect_lost_locks: true,
            silence_timeout: Some(DEFAULT_SILENCE_TIMEOUT),
            handoff: Some(HandoffLimits::DEFAULT),
            idle_sessions: (usize::MAX, Duration::from_millis(250)),
            lock_sessions: 2,
            max_connections: None,
            wait_poll_interval: Duration::from_millis(250),
            deadlock_timeout: None,
            session_idle_timeout: Duration::from_secs(10),
            allow_standby: false,
        }
    }

    /// A free-form id of this holder, stamped on every [`LockInfo`](crate::LockInfo) and span,
    /// and (see [`application_name_prefix`](Self::application_name_prefix)) on its sessions.
    ///
    /// Make it unique per process (a pod name, host plus pid): a constant shared by fifty
    /// replicas says nothing about who holds a lock. It is never interpolated into SQL.
    /// Default: `{host}:{pid}:{16 random hex digits}`, unique per process and per manager.
    pub fn holder_id(mut self, holder_id: impl Into<String>) -> Self {
        self.common.holder_id = Some(holder_id.into());
        self
    }

    /// Mints a [fencing token](crate::LockInfo::fencing_token) for every acquisition, kept in
    /// `table`.
    ///
    /// Tokens strictly increase per key across acquisitions, releases, handoffs, restarts of
    /// the application or the server, server crashes and failovers to a promoted standby, and
    /// never repeat (see [`FencingTable`] for how, and for the limits). Minting rides on the acquisition's
    /// own statement (or message), so it adds no round trip; an in-process handoff mints in the
    /// one statement it runs anyway. The table is created on first use (see [`FencingTable`]). Default: off.
    pub fn fencing(mut self, table: FencingTable) -> Self {
        self.fencing = Some(table);
        self
    }

    /// Tags the sessions this manager uses with `application_name = {prefix}{holder id}`
    /// (printable ASCII, cut to PostgreSQL's 63 bytes), so `pg_stat_activity` and
    /// [`inspect`](crate::inspect) show who holds and who waits for each lock. The tag is set
    /// when the manager starts using a session, and the original name is restored before the
    /// connection goes back to the pool. `None` leaves the pool's name alone. Default:
    /// `Some("pglock:")`.
    pub fn application_name_prefix(mut self, prefix: Option<&str>) -> Self {
        self.tag_prefix = prefix.map(str::to_owned);
        self
    }

    /// How long a statement that lets a lock go (or any statement on a lock session) may go
    /// unanswered before the manager gives up on its session and closes it, which frees the
    /// session's locks on the server. Default: 5 seconds.
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How many lock sessions (connections of the pool, each carrying any number of locks) the
    /// manager may open at once, within [`max_connections`](Self::max_connections).
    /// Acquisitions go to the least busy one; a new one opens, up to this cap, when all are
    /// busy or the least busy carries 256 locks. Default: 2. At least 1.
    pub fn lock_sessions(mut self, max: usize) -> Self {
        self.lock_sessions = max.max(1);
        self
    }

    /// The most connections the manager has open at once, whatever the number of locks it
    /// holds or waits for: its lock sessions, its wait sessions (a contended lock waited for
    /// in the server's queue, then held there) and its listener (one connection of its own,
    /// outside the pool, open while some task waits without a wait session). The rest of the
    /// pool stays the application's.
    ///
    /// The cap goes to one lock session, one wait session, the listener, the other
    /// [`lock_sessions`](Self::lock_sessions), and what is left to wait sessions. A wait
    /// beyond them needs no connection: it is tried again on the lock sessions whenever a
    /// pglock release of its key notifies it, and at every
    /// [`wait_poll_interval`](Self::wait_poll_interval); it moves into the server's queue as
    /// soon as a wait session is free. Default: 4 (of sqlx's default pool of 10: 2 lock
    /// sessions, the listener, 1 wait session), and never more than the pool's
    /// `max_connections`. At least 1.
    pub fn max_connections(mut self, max: usize) -> Self {
        self.max_connections = Some(max.max(1));
        self
    }

    /// How long a caller inside a critical section waits for another key before the manager
    /// probes whether it is part of a lock-order cycle through other managers (in this
    /// process or another); the youngest wait of a cycle then fails with
    /// [`Error::Deadlock`](crate::Error::Deadlock), within about twice this. A cycle among the
    /// manager's own callers fails at once, whatever this is. Default: the server's
    /// `deadlock_timeout` (1 s unless changed). At least 1 ms.
    pub fn deadlock_timeout(mut self, timeout: Duration) -> Self {
        self.deadlock_timeout = Some(timeout.max(Duration::from_millis(1)));
        self
    }

    /// How often a wait without a connection of its own tries again when nothing tells it the
    /// lock was released: the bound on noticing a holder that does not notify (a killed
    /// process, the Python original, `psql`). The tries of all such waits run together, as
    /// one statement per lock session. Default: 250 ms. At least 10 ms.
    pub fn wait_poll_interval(mut self, interval: Duration) -> Self {
        self.wait_poll_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// How long a lock session that holds no lock stays open for the next acquisition before
    /// its connection goes back to the pool. Default: 10 seconds.
    pub fn session_idle_timeout(mut self, timeout: Duration) -> Self {
        self.session_idle_timeout = timeout;
        self
    }

    /// Lets the manager take locks on a standby (a server in recovery). Default: refused, with
    /// [`Error::Standby`](crate::Error::Standby).
    ///
    /// Advisory locks are not replicated: a lock on a standby excludes only the standby's other
    /// sessions, never the primary's. Turn this on only if every contender uses the same
    /// standby on purpose. Fencing does not work there: a standby cannot store a token, so
    /// fenced acquisitions fail. The loss probe does not count a lock as lost merely because
    /// its server is in recovery.
    pub fn allow_standby(mut self, allow: bool) -> Self {
        self.allow_standby = allow;
        self
    }

    /// How many locks the manager may hold at once. An acquisition beyond it fails with
    /// [`Error::BudgetExhausted`](crate::Error::BudgetExhausted) before the server is asked.
    ///
    /// PostgreSQL keeps advisory locks in the one shared lock table that every other lock of
    /// the database needs too, sized `max_locks_per_transaction × (max_connections +
    /// max_prepared_transactions)` slots (6,400 on a stock server, which fits roughly twice as
    /// many advisory locks by borrowing spare shared memory). A manager that fills it stops
    /// other clients from taking any lock, and even from connecting.
    ///
    /// Default: `max_locks_per_transaction × the pool's max_connections`, read from the server
    /// when the first session is set up (640 for sqlx's default pool of 10 on a stock server):
    /// the share of the table the pool's connections are entitled to. Since every pool counts
    /// against the server's `max_connections`, the defaults of a whole fleet of managers stay
    /// within the table's nominal size. Raise it on purpose, knowing the table's size and who
    /// else uses it; [`PostgresLockManager::lock_budget`](crate::PostgresLockManager::lock_budget)
    /// says what is in force.
    pub fn lock_budget(mut self, max_locks: usize) -> Self {
        self.common.lock_budget = Some(max_locks);
        self
    }

    /// How often a session that holds locks, or is kept open for new ones, and has not been
    /// heard from since, is pinged.
    ///
    /// Every such session is kept heard (an open lock session too, since a caller may take a
    /// lock on it at any moment without waiting for anything): when no statement on it has
    /// been answered for this long, the manager sends it the cheapest exchange the protocol
    /// has (a `Sync`).
    /// The answer confirms the session and so every lock on it, since a session's locks live
    /// exactly as long as the session; a session busy with statements is never pinged. A
    /// session whose ping fails has ended (terminated, server restarted, failed over): its
    /// locks are declared lost ([`LossCause::NotOnServer`](crate::LossCause)) within about one
    /// interval of the end. The cost is one tiny round trip per interval per open lock session
    /// (by default at most two, each returned to the pool after
    /// [`session_idle_timeout`](Self::session_idle_timeout) without locks; pings are not use)
    /// and per contended lock held, whatever the number of locks, and no connection of its own. At most a quarter of the
    /// [`silence_timeout`](Self::silence_timeout) is used. Default: 2 seconds.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How long a ping may go unanswered before the session's locks are declared lost.
    ///
    /// While the server cannot be reached (network partition, server down), a ping goes
    /// unanswered; once it has for this long, the session is given up (closed) and its locks
    /// are declared lost ([`LossCause::Unverifiable`](crate::LossCause)): at most
    /// `probe_interval + probe_grace` after the session was last heard. At most half the
    /// [`silence_timeout`](Self::silence_timeout) is used, so a holder is told before the
    /// server may end a session it cannot hear. Default: 2 seconds.
    pub fn probe_grace(mut self, grace: Duration) -> Self {
        self.probe_grace = grace.max(Duration::from_millis(1));
        self
    }

    /// Turns lost-lock detection on (the default) or off. Without it, guards' loss signals
    /// never fire for a failure (a release through the manager still fires them); sessions
    /// are still kept heard while a [`silence_timeout`](Self::silence_timeout) is set.
    pub fn detect_lost_locks(mut self, enabled: bool) -> Self {
        self.detect_lost_locks = enabled;
        self
    }

    /// How long a holder may go unheard before the server ends its sessions and frees its
    /// locks; `Duration::ZERO` turns the bound off (values under 1 s are raised to 1 s).
    ///
    /// A process that is frozen (`SIGSTOP`, a garbage-collection pause of a host VM, a
    /// debugger, a container freeze) or cut off from the server by a silent network keeps its
    /// TCP connections, so without a bound the server keeps its locks for as long as that
    /// lasts (hours, for a dead network, with the kernel's default keepalives). With it, each
    /// session the manager uses gets, for as long as the manager uses it:
    ///
    /// * `idle_session_timeout` (PostgreSQL 14 and later): the server ends a session that
    ///   receives nothing for this long, which frees its locks for the next waiter;
    /// * `tcp_user_timeout` and `tcp_keepalives_*`, which bound how long the server's kernel
    ///   keeps a connection whose peer has gone from the network while a statement runs.
    ///
    /// These are settings any role may set on its own session: no server configuration or
    /// superuser right is needed, and the values the session had are restored before it goes
    /// back to the pool. The manager keeps its healthy sessions heard with a ping every
    /// [`probe_interval`](Self::probe_interval) (at most a quarter of this bound), so only a
    /// process that cannot run, or cannot reach the server, for this long loses its locks.
    ///
    /// A holder that runs again after such a silence learns it at once: from the moment the
    /// bound has passed since its session was last heard, its guards' loss signals report
    /// [`LossCause::Expired`](crate::LossCause) as soon as they are looked at (`is_lost`,
    /// `cause`), and work running under the guard is stopped before it is polled again,
    /// whether or not the server has ended the session yet. On PostgreSQL 13 and older the
    /// server has no `idle_session_timeout`: a frozen holder keeps its locks until it runs
    /// again (only the network bounds apply), though it still learns that it may not count
    /// on them. Default: 20 seconds.
    pub fn silence_timeout(mut self, timeout: Duration) -> Self {
        self.silence_timeout = (!timeout.is_zero()).then(|| timeout.max(MIN_SILENCE_TIMEOUT));
        self
    }

    /// Bounds the in-process handoff of a lock between tasks of this manager.
    ///
    /// When a task releases a lock while another task of the same manager waits for the same
    /// key (in the same mode), the lock goes straight to the waiting task: it never unlocks on
    /// the server. The handoff costs one round trip, in which the session proves it still held
    /// the lock (a session the server ended makes the release fail, as an unlock on it would).
    /// This repeats at most `max_handoffs` times
    /// in a row, and only while less than `max_hold` has passed since the server granted the
    /// lock; then the lock is unlocked on the server, where processes queued for it get their
    /// turn before this manager's next task. The bound is what keeps other processes from
    /// starving. `max_handoffs = 0` turns handoffs off. Default: 16 handoffs, 10 ms.
    pub fn handoff_limits(mut self, max_handoffs: u32, max_hold: Duration) -> Self {
        self.handoff = (max_handoffs > 0).then_some(HandoffLimits {
            max_handoffs,
            max_hold,
        });
        self
    }

    /// How many released wait sessions (the sessions contended acquisitions wait on) the
    /// manager keeps for its next contended acquisitions, and for how long, before they go back
    /// to the pool.
    ///
    /// Reusing one skips the health check sqlx runs on every connection returned to its pool,
    /// and its set-up. Kept sessions count against the pool's `max_connections`; after `ttl`
    /// unused they are returned. `max = 0` returns every one at once. Default: no count limit,
    /// 250 ms.
    pub fn idle_sessions(mut self, max: usize, ttl: Duration) -> Self {
        self.idle_sessions = (max, ttl);
        self
    }

    crate::telemetry::telemetry_setters!(common.telemetry);

    /// The heartbeat of the sessions: needed to report losses, and to keep sessions heard
    /// when the server ends silent ones. At least four pings fit in the silence timeout.
    fn heartbeat(&self) -> Option<Heartbeat> {
        if !self.detect_lost_locks && self.silence_timeout.is_none() {
            return None;
        }
        // With a silence bound, a ping goes out within a quarter of it and is given up on
        // within half of it: a holder whose session the server may end is told before.
        let (every, answer_within) = match self.silence_timeout {
            Some(silence) => (
                self.probe_interval.min(silence / 4),
                self.probe_grace.min(silence / 2),
            ),
            None => (self.probe_interval, self.probe_grace),
        };
        Some(Heartbeat {
            every,
            answer_within,
        })
    }

    /// Builds the manager. Nothing touches the database yet.
    pub fn build(self) -> PostgresLockManager {
        let heartbeat = self.heartbeat();
        let options = self.common.into_options(self.handoff);
        let tag = (self.tag_prefix.as_ref()).map(|prefix| {
            crate::identity::application_name(&format!("{prefix}{}", options.holder_id))
        });
        let tag_for_listener = tag.clone();
        let pool_size = self.pool.options().get_max_connections() as usize;
        let backend = Backend {
            statements: Arc::new(Statements::new(
                self.fencing,
                SessionSettings::new(tag.as_deref(), self.silence_timeout),
            )),
            pool: self.pool,
            heartbeat,
            detect_lost_locks: self.detect_lost_locks,
            silence: self.silence_timeout,
            release_timeout: self.release_timeout,
            session_idle_timeout: self.session_idle_timeout,
            split: ConnectionSplit::new(self.max_connections, self.lock_sessions, pool_size),
            tag: tag_for_listener,
            wait_poll_interval: self.wait_poll_interval,
            deadlock_timeout: self.deadlock_timeout,
            allow_standby: self.allow_standby,
            idle_sessions: self.idle_sessions,
        }
        .assemble(Arc::clone(&options.budget), Arc::clone(&options.waits));
        PostgresLockManager {
            core: Arc::new(Core::new(backend, options)),
        }
    }
}

/// The backend's settings, as the builder gathered them.
struct Backend {
    statements: Arc<Statements>,
    pool: PgPool,
    heartbeat: Option<Heartbeat>,
    detect_lost_locks: bool,
    silence: Option<Duration>,
    release_timeout: Duration,
    session_idle_timeout: Duration,
    split: ConnectionSplit,
    tag: Option<String>,
    wait_poll_interval: Duration,
    deadlock_timeout: Option<Duration>,
    allow_standby: bool,
    idle_sessions: (usize, Duration),
}

/// How the manager's connection cap is shared out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ConnectionSplit {
    lock_sessions: usize,
    listener: bool,
    wait_sessions: usize,
}

impl ConnectionSplit {
    /// The cap (`max`, or the default, within the pool's size) shared out in this order: one
    /// lock session, one wait session (so the manager always has a place in the server's FIFO
    /// queue), the listener, the other lock sessions, and the rest to wait sessions.
    fn new(max: Option<usize>, lock_sessions: usize, pool_size: usize) -> Self {
        let cap = max
            .unwrap_or(DEFAULT_MAX_CONNECTIONS)
            .min(pool_size.max(1))
            .max(1);
        let mut left = cap - 1;
        let first_wait = left.min(1);
        left -= first_wait;
        let listener = left >= 1;
        left -= usize::from(listener);
        let more_sessions = lock_sessions.saturating_sub(1).min(left);
        left -= more_sessions;
        ConnectionSplit {
            lock_sessions: 1 + more_sessions,
            listener,
            wait_sessions: first_wait + left,
        }
    }
}

impl Backend {
    /// The backend: its lost-lock monitor, its lock sessions and its kept wait sessions.
    fn assemble(self, budget: Arc<Budget>, waits: Arc<Waits>) -> PgBackend {
        let monitor = Monitor::new(self.detect_lost_locks);
        let fencing_ready = Arc::new(OnceCell::new());
        let context = Arc::new(SessionContext {
            statements: Arc::clone(&self.statements),
            statement_timeout: self.release_timeout,
            idle_timeout: self.session_idle_timeout,
            heartbeat: self.heartbeat,
            silence: self.silence,
            report_loss: self.detect_lost_locks,
        });
        let config = SessionsConfig {
            max: self.split.lock_sessions,
            statement_timeout: self.release_timeout,
            allow_standby: self.allow_standby,
        };
        let sessions = LockSessions::new(
            self.pool.clone(),
            config,
            context,
            Arc::clone(&fencing_ready),
            Arc::clone(&monitor),
            Arc::clone(&budget),
        );
        let doorbell = Doorbell::new(
            self.pool.clone(),
            DoorbellConfig {
                poll_interval: self.wait_poll_interval,
                listen: self.split.listener,
                tag: self.tag,
                statement_timeout: self.release_timeout,
                linger: self.session_idle_timeout,
                waits,
                deadlock_timeout: self.deadlock_timeout,
            },
        );
        PgBackend {
            doorbell,
            wait_slots: Arc::new(Semaphore::new(self.split.wait_sessions)),
            statements: self.statements,
            sessions,
            fencing_ready,
            monitor,
            pool: self.pool,
            release_timeout: self.release_timeout,
            answer_grace: Duration::from_millis(250),
            allow_standby: self.allow_standby,
            silence: self.silence,
            // A kept session is not pinged: it goes back to the pool well before the server
            // could end it for its silence.
            idle: IdleSessions::new(
                self.idle_sessions.0,
                self.silence.map_or(self.idle_sessions.1, |silence| {
                    self.idle_sessions.1.min(silence / 2)
                }),
            ),
            budget,
        }
    }
}

impl fmt::Debug for PostgresLockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManagerBuilder")
            .field("common", &self.common)
            .field("release_timeout", &self.release_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("probe_grace", &self.probe_grace)
            .field("detect_lost_locks", &self.detect_lost_locks)
            .field("silence_timeout", &self.silence_timeout)
            .field("handoff", &self.handoff)
            .field("lock_sessions", &self.lock_sessions)
            .field("max_connections", &self.max_connections)
            .field("wait_poll_interval", &self.wait_poll_interval)
            .field("deadlock_timeout", &self.deadlock_timeout)
            .field("session_idle_timeout", &self.session_idle_timeout)
            .field("allow_standby", &self.allow_standby)
            .field("idle_sessions", &self.idle_sessions)
            .finish_non_exhaustive()
    }
}

/// The defaults `docs/defaults.md` documents, as the code has them (see `defaults_table`).
#[cfg(test)]
pub(crate) fn documented_defaults() -> Vec<(&'static str, String)> {
    // Durations in their `Debug` form, switches as `on`/`off`: `defaults_table` reads them.
    let duration = |value: Duration| format!("{value:?}");
    let on_off = |value: bool| if value { "on" } else { "off" };
    let pool = |size| {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .connect_lazy("postgres://localhost/unused")
            .expect("a lazy pool")
    };
    let b = PostgresLockManagerBuilder::new(pool(10));
    let handoff = b.handoff.expect("handoffs are on by default");
    let budget = |max_locks, size| {
        let set_up = super::wait_session::SetUp {
            standby: false,
            max_locks_per_transaction: max_locks,
            identity: Default::default(),
        };
        super::sessions::default_budget(&pool(size), &set_up)
    };
    let formula = budget(64, 10) == 640 && budget(128, 3) == 384;
    vec![
        (
            "max_connections",
            b.max_connections
                .unwrap_or(DEFAULT_MAX_CONNECTIONS)
                .to_string(),
        ),
        ("lock_sessions", b.lock_sessions.to_string()),
        (
            "lock_budget",
            match (b.common.lock_budget, formula) {
                (None, true) => "max_locks_per_transaction × pool size".to_owned(),
                other => format!("{other:?}"),
            },
        ),
        (
            "silence_timeout",
            b.silence_timeout.map_or("off".to_owned(), duration),
        ),
        ("probe_interval", duration(b.probe_interval)),
        ("probe_grace", duration(b.probe_grace)),
        ("detect_lost_locks", on_off(b.detect_lost_locks).to_owned()),
        (
            "handoff_limits",
            format!(
                "{} handoffs, {}",
                handoff.max_handoffs,
                duration(handoff.max_hold)
            ),
        ),
        ("release_timeout", duration(b.release_timeout)),
        ("wait_poll_interval", duration(b.wait_poll_interval)),
        ("session_idle_timeout", duration(b.session_idle_timeout)),
        (
            "deadlock_timeout",
            b.deadlock_timeout
                .map_or("the server's deadlock_timeout".to_owned(), duration),
        ),
        (
            "application_name_prefix",
            format!("{:?}", b.tag_prefix.as_deref().unwrap_or("none")),
        ),
        ("allow_standby", on_off(b.allow_standby).to_owned()),
        (
            "idle_sessions",
            match b.idle_sessions {
                (usize::MAX, ttl) => format!("no count limit, {}", duration(ttl)),
                (max, ttl) => format!("{max}, {}", duration(ttl)),
            },
        ),
        ("fencing", on_off(b.fencing.is_some()).to_owned()),
        ("holder_id", {
            // `host:pid:random`, if that is what a generated id looks like.
            let id = crate::identity::default_holder_id();
            let parts: Vec<&str> = id.rsplitn(3, ':').collect();
            let pid = std::process::id().to_string();
            let shaped = parts.len() == 3 && parts[1] == pid && parts[0].len() == 16;
            if shaped {
                "host:pid:random".to_owned()
            } else {
                id
            }
        }),
        (
            "lock session spread",
            format!("{} locks", super::sessions::SPREAD_AT),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::ConnectionSplit;

    #[test]
    fn the_cap_goes_to_the_listener_then_lock_sessions_then_waits() {
        let split = |max, sessions, pool| {
            let s = ConnectionSplit::new(max, sessions, pool);
            (s.listener, s.lock_sessions, s.wait_sessions)
        };
        // sqlx's default pool of 10, the default cap of 4.
        assert_eq!(split(None, 2, 10), (true, 2, 1));
        assert_eq!(split(Some(8), 2, 10), (true, 2, 5));
        // Never more than the pool; a place in the server's queue before the listener.
        assert_eq!(split(Some(8), 2, 3), (true, 1, 1));
        assert_eq!(split(None, 2, 2), (false, 1, 1));
        assert_eq!(split(Some(1), 2, 10), (false, 1, 0));
        assert_eq!(split(Some(5), 4, 10), (true, 3, 1));
    }
}
