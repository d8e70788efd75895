//! The PostgreSQL lock manager.

mod backend;
mod fencing;
mod monitor;
mod session;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sqlx::PgPool;

pub use self::fencing::FencingTable;

use self::backend::{PgBackend, Statements};
use self::session::IdleSessions;
use crate::core::{Core, HandoffLimits, Hook, Options, delegate_lock_manager};

/// A [`LockManager`](crate::LockManager) on PostgreSQL session advisory locks.
///
/// Each held lock is a `pg_advisory_lock` on a connection checked out of your pool and pinned
/// to that lock until it is released. PostgreSQL frees the lock when that session ends, so a
/// crashed or killed process cannot strand it. Keys map to lock ids with [`lock_id`], the same
/// derivation as the Python original, so Rust and Python replicas exclude each other.
///
/// # Construction and pool sizing
///
/// Build it from the [`PgPool`] you already have; nothing touches the database until the first
/// acquisition. The manager is cheap to clone and every clone is the *same* holder. Build one
/// per process (two managers on one pool are two holders and exclude each other).
///
/// Every held lock pins one connection, and so does every key with local waiters (they queue
/// in-process behind a single session). Size the pool for the locks you hold at once plus the
/// rest of your traffic, or give locks a small pool of their own:
///
/// ```no_run
/// use std::time::Duration;
/// use sqlx::postgres::PgPoolOptions;
///
/// # async fn run() -> Result<(), sqlx::Error> {
/// let lock_pool = PgPoolOptions::new()
///     .max_connections(8)
///     .acquire_timeout(Duration::from_secs(5))
///     .connect("postgres://localhost/app")
///     .await?;
/// let locks = pglock::PostgresLockManager::builder(lock_pool)
///     .holder_id(format!("orders-worker-{}", std::process::id()))
///     .build();
/// # let _ = locks; Ok(()) }
/// ```
///
/// # How each operation behaves
///
/// * **`acquire(key, None)`** waits on the server, in PostgreSQL's FIFO lock queue, for as long
///   as it takes. Only a server-side `lock_timeout` or `statement_timeout` ends it early (as
///   [`AcquireFailure::Database`](crate::AcquireFailure::Database)).
/// * **`acquire(key, Some(t))`** is bounded by one deadline `t` from the call, covering the
///   wait for this manager's own turn on the key, the pool checkout and the wait on the server.
///   The server enforces the end of the wait (`lock_timeout`, set for that one statement only),
///   so the answer arrives within a round trip of the deadline and the session stays clean.
///   There is no client-side polling. `Some(Duration::ZERO)` is one `pg_try_advisory_lock`
///   (its checkout is bounded by the pool's `acquire_timeout`).
/// * **`try_acquire(key)`** is one `pg_try_advisory_lock`; `None` means held, by anyone,
///   including this manager. Database and pool failures are errors.
/// * **A key this manager already holds** is never requested twice from the server: `acquire`
///   waits in-process behind the local holder (bounded by its deadline), `try_acquire` returns
///   `None`. So in-process contenders for a key hold at most one session between them, and a
///   lock is never stacked (PostgreSQL's advisory locks are re-entrant per session).
/// * **Locks are held in autocommit.** A holding session is `idle`, never
///   `idle in transaction`: it does not hold back VACUUM and is not subject to
///   `idle_in_transaction_session_timeout`.
/// * **Release** runs `pg_advisory_unlock` on the pinned session and checks its result. Only a
///   confirmed unlock returns the connection to the pool; a connection whose unlock failed,
///   timed out or returned false is closed, which frees whatever it held. Nothing the manager
///   changes on a session outlives the statement that changed it.
///
/// # Lost locks
///
/// While it holds locks, the manager checks once per
/// [`probe_interval`](PostgresLockManagerBuilder::probe_interval) that the server still holds
/// each of them: one query on a dedicated connection, for all locks at once. A lock whose session
/// ended (terminated, timed out, server restarted) is declared lost within about one interval;
/// when the server cannot be asked, held locks are declared lost once the interval plus
/// [`probe_grace`](PostgresLockManagerBuilder::probe_grace) has passed since they were last
/// confirmed. A lost lock leaves the registry, its session is closed, and its guard's
/// [`lost`](crate::LockGuard::lost) signal fires. `docs/failure-model.md` has the measured
/// latencies and the limits.
///
/// # Cancel safety
///
/// Every async method is cancel safe at every await point. A dropped `acquire` or
/// `try_acquire` leaves no lock held: a connection that may hold one, or that has a statement
/// in flight, is closed rather than returned to the pool, and on PostgreSQL 14 and later the
/// server abandons an abandoned wait within 200 ms. A dropped `release` or `release_all`
/// finishes the release by closing the session.
///
/// [`lock_id`]: crate::lock_id
#[derive(Clone)]
pub struct PostgresLockManager {
    core: Arc<Core<PgBackend>>,
}

impl PostgresLockManager {
    /// A manager with default settings on `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self::builder(pool).build()
    }

    /// Configures a manager on `pool`.
    pub fn builder(pool: PgPool) -> PostgresLockManagerBuilder {
        PostgresLockManagerBuilder {
            pool,
            holder_id: None,
            tracing: true,
            release_timeout: Duration::from_secs(5),
            fencing: None,
            tag_prefix: Some("pglock:".to_owned()),
            probe_interval: Some(Duration::from_secs(2)),
            probe_grace: Duration::from_secs(2),
            handoff: Some(HandoffLimits::DEFAULT),
            idle_sessions: (usize::MAX, Duration::from_millis(250)),
            meter: Default::default(),
            hook: None,
        }
    }

    /// The pool this manager checks its sessions out of.
    pub fn pool(&self) -> &PgPool {
        &self.core.backend.pool
    }

    /// Creates the fencing table now, if fencing is on and it does not exist yet, instead of on
    /// the first acquisition. Does nothing when fencing is off.
    ///
    /// # Errors
    ///
    /// [`Error::Connection`](crate::Error::Connection) or
    /// [`Error::AcquisitionFailed`](crate::Error::AcquisitionFailed) (with the server's reason,
    /// such as a missing privilege) when the table cannot be created.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the creation is one transaction, and a connection dropped mid-way is closed.
    pub async fn ensure_fencing_table(&self) -> crate::Result<()> {
        self.core
            .backend
            .ensure_fencing("pglock:fencing-table-setup")
            .await
    }
}

impl fmt::Debug for PostgresLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManager")
            .field("holder_id", &self.core.holder_id())
            .field("held_lock_count", &self.core.held_lock_count())
            .finish_non_exhaustive()
    }
}

delegate_lock_manager!(PostgresLockManager);

/// Builds a [`PostgresLockManager`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct PostgresLockManagerBuilder {
    pool: PgPool,
    holder_id: Option<String>,
    tracing: bool,
    release_timeout: Duration,
    fencing: Option<FencingTable>,
    tag_prefix: Option<String>,
    probe_interval: Option<Duration>,
    probe_grace: Duration,
    handoff: Option<HandoffLimits>,
    idle_sessions: (usize, Duration),
    meter: crate::metrics::MeterChoice,
    hook: Option<Hook>,
}

impl PostgresLockManagerBuilder {
    /// A free-form id of this holder, stamped on every [`LockInfo`](crate::LockInfo) and span,
    /// and (see [`application_name_prefix`](Self::application_name_prefix)) on its sessions.
    ///
    /// Make it unique per process (a pod name, host plus pid): a constant shared by fifty
    /// replicas says nothing about who holds a lock. It is never interpolated into SQL.
    /// Default: `{host}:{pid}:{16 random hex digits}`, unique per process and per manager.
    pub fn holder_id(mut self, holder_id: impl Into<String>) -> Self {
        self.holder_id = Some(holder_id.into());
        self
    }

    /// Whether to emit the [`telemetry`](crate::telemetry) spans. Default: on.
    pub fn tracing(mut self, enabled: bool) -> Self {
        self.tracing = enabled;
        self
    }

    /// Mints a [fencing token](crate::LockInfo::fencing_token) for every acquisition, kept in
    /// `table`.
    ///
    /// Tokens strictly increase per key across acquisitions, releases, handoffs and restarts
    /// of the application or the server, and never repeat. Minting rides on the acquisition's
    /// own statement (or message), so it adds no round trip; an in-process handoff mints with
    /// one. The table is created on first use (see [`FencingTable`]). Default: off.
    pub fn fencing(mut self, table: FencingTable) -> Self {
        self.fencing = Some(table);
        self
    }

    /// Tags the sessions this manager uses with `application_name = {prefix}{holder id}`
    /// (printable ASCII, cut to PostgreSQL's 63 bytes), so `pg_stat_activity` and
    /// [`inspect`](crate::inspect) show who holds and who waits for each lock. The tag is set
    /// by the acquisition's own statement, and the original name is restored before the
    /// connection goes back to the pool. `None` leaves the pool's name alone. Default:
    /// `Some("pglock:")`.
    pub fn application_name_prefix(mut self, prefix: Option<&str>) -> Self {
        self.tag_prefix = prefix.map(str::to_owned);
        self
    }

    /// How long a release waits for the server to confirm the unlock before closing the
    /// session instead. Default: 5 seconds.
    pub fn release_timeout(mut self, timeout: Duration) -> Self {
        self.release_timeout = timeout;
        self
    }

    /// How often the manager checks, while it holds locks, that the server still holds them.
    ///
    /// Each check is one query on a dedicated connection (opened while locks are held, closed
    /// when none are) covering every held lock at once, so its cost does not grow with the
    /// number of locks. A lock whose session has ended is declared lost within about one
    /// interval. Default: 2 seconds.
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = Some(interval.max(Duration::from_millis(1)));
        self
    }

    /// How long past a missed check the manager waits before declaring locks it cannot verify
    /// lost. While the server cannot be asked (network partition, server down), held locks
    /// are "unknown"; they are declared lost ([`LossCause::Unverifiable`](crate::LossCause))
    /// once `probe_interval + probe_grace` has passed since they were last confirmed. A check
    /// that takes longer than the grace counts as failed. Default: 2 seconds.
    pub fn probe_grace(mut self, grace: Duration) -> Self {
        self.probe_grace = grace.max(Duration::from_millis(1));
        self
    }

    /// Turns lost-lock detection on (the default) or off. Without it, guards' loss signals
    /// never fire and no monitor connection is opened.
    pub fn detect_lost_locks(mut self, enabled: bool) -> Self {
        self.probe_interval = match (enabled, self.probe_interval) {
            (false, _) => None,
            (true, Some(interval)) => Some(interval),
            (true, None) => Some(Duration::from_secs(2)),
        };
        self
    }

    /// Bounds the in-process handoff of a lock between tasks of this manager.
    ///
    /// When a task releases a lock while another task of the same manager waits for the same
    /// key (in the same mode), the lock goes straight to the waiting task: its session never
    /// unlocks, so the handoff costs no round trip. This repeats at most `max_handoffs` times
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

    /// How many released sessions the manager keeps for its next acquisitions, and for how
    /// long, before they go back to the pool.
    ///
    /// A released session (unlocked, confirmed clean) is reused by the next acquisition
    /// directly. That skips the health-check round trip sqlx makes on every connection returned
    /// to its pool, and keeps a lock loop on the one connection it needs instead of making the
    /// pool open more while that check is in flight. Kept sessions still count against the
    /// pool's `max_connections`; after `ttl` unused they are returned. `max = 0` returns every
    /// session at once. Default: no count limit, 250 ms: a burst of locks keeps its sessions
    /// for a quarter of a second after it ends, then gives them all back.
    pub fn idle_sessions(mut self, max: usize, ttl: Duration) -> Self {
        self.idle_sessions = (max, ttl);
        self
    }

    /// Records the [metrics](crate::telemetry::metrics) through `meter`. Default:
    /// `opentelemetry::global::meter("pglock")`.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn meter(mut self, meter: opentelemetry::metrics::Meter) -> Self {
        self.meter.meter = Some(meter);
        self
    }

    /// Puts the holder id on every metric series as the `pglock.holder_id` attribute. Turn it
    /// on only when holder ids are few and stable: each distinct id is a new set of series
    /// (see [`telemetry::metrics`](crate::telemetry::metrics#cardinality)). Default: off.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn metrics_holder_id(mut self, enabled: bool) -> Self {
        self.meter.holder_id = enabled;
        self
    }

    /// Installs a hook awaited at every await point of lock operations (tests only).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn stage_hook(mut self, hook: crate::testing::StageHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Builds the manager. Nothing touches the database yet.
    pub fn build(self) -> PostgresLockManager {
        let holder_id = self
            .holder_id
            .unwrap_or_else(crate::identity::default_holder_id);
        let tag = self
            .tag_prefix
            .map(|prefix| crate::identity::application_name(&format!("{prefix}{holder_id}")));
        let backend = PgBackend {
            statements: Statements::new(self.fencing, tag),
            fencing_ready: tokio::sync::OnceCell::new(),
            monitor_name: monitor_name(&self.pool),
            pool: self.pool,
            release_timeout: self.release_timeout,
            answer_grace: Duration::from_millis(250),
            probe: self
                .probe_interval
                .map(|interval| (interval, self.probe_grace)),
            monitor_running: AtomicBool::new(false),
            idle: IdleSessions::new(self.idle_sessions.0, self.idle_sessions.1),
        };
        let options = Options {
            metrics: crate::metrics::Metrics::build(self.meter, &holder_id),
            holder_id: Some(holder_id),
            tracing: self.tracing,
            hook: self.hook,
            handoff: self.handoff,
        };
        PostgresLockManager {
            core: Arc::new(Core::new(backend, options)),
        }
    }
}

/// The monitor connection's `application_name`: the pool's, tagged, so `pg_stat_activity`
/// attributes it to its manager.
fn monitor_name(pool: &PgPool) -> String {
    const SUFFIX: &str = ":pglock-monitor";
    match pool.connect_options().get_application_name() {
        Some(app) if !app.is_empty() => {
            // PostgreSQL keeps 63 bytes; keep the suffix, cut the pool's name on a char boundary.
            let mut end = app.len().min(63 - SUFFIX.len());
            while !app.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}{SUFFIX}", &app[..end])
        }
        _ => "pglock-monitor".to_owned(),
    }
}

impl fmt::Debug for PostgresLockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLockManagerBuilder")
            .field("holder_id", &self.holder_id)
            .field("tracing", &self.tracing)
            .field("release_timeout", &self.release_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("probe_grace", &self.probe_grace)
            .field("handoff", &self.handoff)
            .field("idle_sessions", &self.idle_sessions)
            .finish_non_exhaustive()
    }
}
