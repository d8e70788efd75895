//! Waiting for a contended lock without a connection of its own.
//!
//! A waiter registers its lock id here ([`Doorbell::ring`]) and then tries the lock on the
//! manager's lock sessions each time it is woken, until a try is granted. It is woken:
//!
//! * **when a pglock manager releases the lock**, in any process: while some of this manager's
//!   tasks wait for a lock, its listener connection holds that lock's *waiters' flag* shared
//!   and `LISTEN`s on [`UNLOCKED_CHANNEL`]; every pglock release tries the flag and notifies
//!   the channel only when it finds it taken (see `statements::notify_column`), so a release
//!   nobody waits for sends no notification;
//! * **on every poll tick** ([`poll_interval`](crate::PostgresLockManagerBuilder::wait_poll_interval)),
//!   for holders that do not notify: a process that was killed, the Python original, `psql`;
//! * once more right after its flag is raised, and whenever the listener connects again, so a
//!   release between the waiter's first try and its flag is never missed.
//!
//! The tries of many waiters woken together run as one statement on a lock session (see
//! `lock_session/batch.rs`). The listener has a connection of its own, outside the pool but
//! within the manager's [`max_connections`](crate::PostgresLockManagerBuilder::max_connections),
//! opened by the first such wait and closed once nobody has waited for the session idle
//! timeout; closing it frees every flag with it, so nothing it held can outlive it.
//!
//! The listener also carries the probes that find lock-order cycles through other managers
//! (see `core/cycles/` and `probes.rs`), from the moment a caller of the manager that waits
//! inside a critical section has to wait for a lock held elsewhere, for as long as any such
//! caller waits: a wait that has lasted the server's `deadlock_timeout` sends one, every probe
//! heard is answered, and a cycle is confirmed against the server before it ends a wait.
//!
//! Anybody who may connect can notify either channel: a notification is a reason to look,
//! never a fact. A forged `pglock_unlocked` costs a try; a forged probe, a notification
//! passed on and at most one confirmation per wait and `deadlock_timeout`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior, interval, sleep_until, timeout};

use super::probes::{self, PROBE_CHANNEL};
use super::statements::{UNLOCKED_CHANNEL, flag_args, pair_args};
use crate::core::{Cycle, FastHash, Waits};

/// The server's `deadlock_timeout` until the listener has read it.
const DEFAULT_DEADLOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the listener waits before connecting again after a failure.
const RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// The waiters of one manager, and the task that wakes them.
pub(crate) struct Doorbell {
    inner: Arc<Inner>,
}

/// How the doorbell is set up.
pub(crate) struct DoorbellConfig {
    /// Every waiter tries again this often, whatever it hears.
    pub(crate) poll_interval: Duration,
    /// Whether the manager may open a listener connection (its connection cap allows one).
    pub(crate) listen: bool,
    /// The listener's `application_name`, if the manager tags its sessions.
    pub(crate) tag: Option<String>,
    /// How long a statement on the listener may go unanswered before it is closed.
    pub(crate) statement_timeout: Duration,
    /// How long the listener stays open with nobody waiting.
    pub(crate) linger: Duration,
    /// The manager's waits inside critical sections, whose probes the listener carries.
    pub(crate) waits: Arc<Waits>,
    /// How long such a wait lasts before it probes; `None`: the server's `deadlock_timeout`.
    pub(crate) deadlock_timeout: Option<Duration>,
}

struct Inner {
    pool: PgPool,
    config: DoorbellConfig,
    state: Mutex<State>,
    /// Every waiter tries again when this is notified: each poll tick, each (re)connection.
    tick: Notify,
    /// The task looks at the set of waited-for locks again.
    changed: Notify,
    /// The server's `deadlock_timeout`, in milliseconds: how long a wait lasts before it
    /// probes for a cycle.
    deadlock_timeout_ms: std::sync::atomic::AtomicU64,
}

#[derive(Default)]
struct State {
    /// The locks somebody waits for, each with its number of waiters and its bell.
    waiting: HashMap<i64, Waiting, FastHash>,
    /// Whether the task runs.
    running: bool,
    /// Whether the listener is connected and listening (for tests and introspection).
    listening: bool,
}

struct Waiting {
    waiters: usize,
    bell: Arc<Notify>,
}

impl Doorbell {
    pub(crate) fn new(pool: PgPool, config: DoorbellConfig) -> Self {
        let inner = Arc::new(Inner {
            pool,
            state: Mutex::new(State::default()),
            tick: Notify::new(),
            changed: Notify::new(),
            deadlock_timeout_ms: (config
                .deadlock_timeout
                .unwrap_or(DEFAULT_DEADLOCK_TIMEOUT)
                .as_millis() as u64)
                .into(),
            config,
        });
        Doorbell { inner }
    }

    /// Starts the task, which carries the probes of waits inside critical sections, if there
    /// are such waits: called as a wait for a lock held elsewhere begins, so a manager whose
    /// sections only ever nest uncontended locks opens no listener for them.
    pub(crate) fn carry_probes(&self) {
        if self.inner.config.waits.any() {
            self.inner.ensure_running();
            self.inner.changed.notify_one();
        }
    }

    /// Registers a waiter for `lock_id` until the returned ring is dropped, starting the task
    /// that wakes waiters if it is not running.
    pub(crate) fn ring(&self, lock_id: i64) -> Ring {
        let bell = {
            let mut state = self.inner.state();
            let waiting = state.waiting.entry(lock_id).or_insert_with(|| Waiting {
                waiters: 0,
                bell: Arc::new(Notify::new()),
            });
            waiting.waiters += 1;
            Arc::clone(&waiting.bell)
        };
        self.inner.ensure_running();
        self.inner.changed.notify_one();
        Ring {
            inner: Arc::clone(&self.inner),
            lock_id,
            bell,
        }
    }
}

/// One waiter's registration. Dropping it unregisters the waiter (the task lowers the flag
/// once nobody waits for the lock).
pub(crate) struct Ring {
    inner: Arc<Inner>,
    lock_id: i64,
    bell: Arc<Notify>,
}

impl Ring {
    /// Resolves at the next wake-up of this waiter: a release of its lock, a poll tick, or
    /// the listener connecting. Call it *before* the try it follows, so a wake-up that comes
    /// while the try is in flight is not missed.
    pub(crate) fn woken(&self) -> impl Future<Output = ()> + Send + '_ {
        let mut bell = Box::pin(self.bell.notified());
        let mut tick = Box::pin(self.inner.tick.notified());
        bell.as_mut().enable();
        tick.as_mut().enable();
        async move {
            tokio::select! {
                () = bell => {}
                () = tick => {}
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let mut state = self.inner.state();
        if let Some(waiting) = state.waiting.get_mut(&self.lock_id) {
            waiting.waiters -= 1;
            if waiting.waiters == 0 {
                state.waiting.remove(&self.lock_id);
                drop(state);
                self.inner.changed.notify_one();
            }
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// Starts the task unless it runs.
    fn ensure_running(self: &Arc<Self>) {
        let mut state = self.state();
        if !state.running {
            state.running = true;
            drop(tokio::spawn(Arc::clone(self).run()));
        }
    }

    fn deadlock_timeout(&self) -> Duration {
        Duration::from_millis(
            self.deadlock_timeout_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The locks waited for right now.
    fn wanted(&self) -> HashSet<i64> {
        self.state().waiting.keys().copied().collect()
    }

    /// Rings the bells of `ids`.
    fn wake(&self, ids: impl IntoIterator<Item = i64>) {
        let state = self.state();
        for id in ids {
            if let Some(waiting) = state.waiting.get(&id) {
                waiting.bell.notify_waiters();
            }
        }
    }

    /// The task: ticks, listens, keeps the flags in step with the waiters, and ends once
    /// nobody has waited for the linger time.
    async fn run(self: Arc<Self>) {
        let mut ticker = interval(self.config.poll_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut link = Link::Down {
            retry_at: Instant::now(),
        };
        let mut idle_since: Option<Instant> = None;
        loop {
            let event = tokio::select! {
                _ = ticker.tick() => Event::Tick,
                () = self.changed.notified() => Event::Changed,
                heard = link.next(&self) => heard,
            };
            let mut probes = Vec::new();
            let mut cycles = Vec::new();
            match event {
                Event::Tick => {
                    self.tick.notify_waiters();
                    probes = self.config.waits.due_probes(self.deadlock_timeout());
                }
                Event::Changed => {}
                Event::Probe(message) => {
                    let heard = self
                        .config
                        .waits
                        .on_probe(&message, self.deadlock_timeout());
                    (probes, cycles) = (heard.pass_on, heard.to_confirm);
                }
                Event::Connected => {
                    // Whatever was released while nobody listened is found by a try.
                    self.state().listening = true;
                    self.tick.notify_waiters();
                }
                Event::Notified(id) => self.wake([id]),
                Event::Lost => {
                    self.state().listening = false;
                    self.tick.notify_waiters();
                }
            }
            if let Link::Up(up) = &mut link {
                if let Err(err) = up.sync(&self, &probes, cycles).await {
                    tracing::debug!(%err, "the waiters' listener failed; waiters poll meanwhile");
                    link.close(&self).await;
                }
            } else {
                for cycle in cycles {
                    self.config.waits.settle(cycle, false);
                }
            }
            // Nobody waits: stop after the linger time.
            let stop = {
                let mut state = self.state();
                if state.waiting.is_empty() && !self.config.waits.any() {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    let stop = since.elapsed() >= self.config.linger;
                    if stop {
                        state.running = false;
                    }
                    stop
                } else {
                    idle_since = None;
                    false
                }
            };
            if stop {
                link.close(&self).await;
                return;
            }
        }
    }
}

/// What woke the task.
enum Event {
    Tick,
    Changed,
    Connected,
    Notified(i64),
    Probe(String),
    Lost,
}

/// The listener connection, when there is one.
enum Link {
    Down {
        retry_at: Instant,
    },
    /// Connecting on a task of its own, so the task's other events never cut it short.
    Connecting(tokio::task::JoinHandle<Result<(Listening, u64), sqlx::Error>>),
    Up(Box<Listening>),
}

struct Listening {
    /// A pool of one connection of the manager's own, so closing it closes the connection,
    /// and whatever flags it holds go with it.
    pool: PgPool,
    listener: PgListener,
    /// The flags this connection holds.
    raised: HashSet<i64>,
    /// The markers of the manager's waits named in probes it holds (see `probes.rs`).
    markers: HashSet<i64>,
}

impl Link {
    /// The next thing the listener hears; connects first when it is down and may.
    ///
    /// Cancel safe: a connection under way goes on on its own task, and a notification is
    /// read whole or not at all.
    async fn next(&mut self, inner: &Arc<Inner>) -> Event {
        loop {
            match self {
                Link::Down { retry_at } => {
                    if !inner.config.listen {
                        return std::future::pending().await;
                    }
                    sleep_until(*retry_at).await;
                    *self = Link::Connecting(tokio::spawn(Listening::connect(Arc::clone(inner))));
                }
                Link::Connecting(opening) => {
                    let opened = match opening.await {
                        Ok(Ok((up, deadlock_timeout))) => {
                            if inner.config.deadlock_timeout.is_none() {
                                let ms = &inner.deadlock_timeout_ms;
                                ms.store(deadlock_timeout, std::sync::atomic::Ordering::Relaxed);
                            }
                            Ok(up)
                        }
                        Ok(Err(err)) => Err(err),
                        Err(join) => Err(sqlx::Error::Protocol(join.to_string())),
                    };
                    return match opened {
                        Ok(up) => {
                            *self = Link::Up(Box::new(up));
                            Event::Connected
                        }
                        Err(err) => {
                            tracing::debug!(%err, "cannot open the waiters' listener; polling");
                            *self = Link::Down {
                                retry_at: Instant::now() + RECONNECT_AFTER,
                            };
                            Event::Lost
                        }
                    };
                }
                Link::Up(up) => {
                    return match up.listener.try_recv().await {
                        Ok(Some(note)) if note.channel() == PROBE_CHANNEL => {
                            Event::Probe(note.payload().to_owned())
                        }
                        Ok(Some(note)) => match note.payload().parse() {
                            Ok(id) => Event::Notified(id),
                            Err(_) => Event::Changed,
                        },
                        // The connection broke (without eager reconnection, sqlx says so
                        // before connecting again) or failed: its flags went with it.
                        Ok(None) | Err(_) => {
                            self.close(inner).await;
                            Event::Lost
                        }
                    };
                }
            }
        }
    }

    /// Closes the listener, if it is open (its flags go with its connection), or gives up
    /// the opening under way.
    async fn close(&mut self, inner: &Inner) {
        let was = std::mem::replace(
            self,
            Link::Down {
                retry_at: Instant::now() + RECONNECT_AFTER,
            },
        );
        inner.state().listening = false;
        match was {
            Link::Up(up) => {
                let Listening { pool, listener, .. } = *up;
                drop(listener);
                pool.close().await;
            }
            Link::Connecting(opening) => {
                opening.abort();
                if let Ok(Ok((up, _))) = opening.await {
                    up.pool.close().await;
                }
            }
            Link::Down { .. } => {}
        }
    }
}

impl Listening {
    /// A listener connected and listening, and the server's `deadlock_timeout` in
    /// milliseconds.
    async fn connect(inner: Arc<Inner>) -> Result<(Listening, u64), sqlx::Error> {
        let mut options = (*inner.pool.connect_options()).clone();
        if let Some(tag) = &inner.config.tag {
            options = options.application_name(tag);
        }
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(inner.config.statement_timeout)
            .connect_lazy_with(options);
        let opened = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            // A broken connection is reported (`try_recv` answers `None`), not replaced behind
            // our back without the flags.
            listener.eager_reconnect(false);
            listener
                .listen_all([UNLOCKED_CHANNEL, PROBE_CHANNEL])
                .await?;
            let deadlock_timeout: i64 = sqlx::query_scalar(
                "SELECT (pg_catalog.date_part('epoch', \
                 pg_catalog.current_setting('deadlock_timeout')::interval) \
                 OPERATOR(pg_catalog.*) 1000)::bigint",
            )
            .fetch_one(&mut listener)
            .await?;
            Ok::<_, sqlx::Error>((listener, deadlock_timeout.max(1) as u64))
        };
        match timeout(inner.config.statement_timeout, opened).await {
            Ok(Ok((listener, deadlock_timeout))) => Ok((
                Listening {
                    pool,
                    listener,
                    raised: HashSet::new(),
                    markers: HashSet::new(),
                },
                deadlock_timeout,
            )),
            Ok(Err(err)) => {
                pool.close().await;
                Err(err)
            }
            Err(_) => {
                pool.close().await;
                Err(sqlx::Error::PoolTimedOut)
            }
        }
    }

    /// Holds the markers of the waits named in probes (before `probes`, which name them, are
    /// sent); raises the flags of the locks now waited for and lowers the others, ringing the
    /// bells of those just raised, so their waiters try once more with the flag up; confirms
    /// `cycles` against the server.
    async fn sync(
        &mut self,
        inner: &Inner,
        probes: &[String],
        cycles: Vec<Cycle>,
    ) -> Result<(), sqlx::Error> {
        let bound = inner.config.statement_timeout;
        let waits = &inner.config.waits;
        let conn = &mut self.listener;
        let markers = waits.markers();
        let settled = async {
            // Before the probes that name them: a marker somebody holds exclusively leaves the
            // cycles through that wait unconfirmed (they end at their deadlines).
            hold_shared(&mut *conn, &mut self.markers, &markers, pair_args, bound).await?;
            probes::send(&mut *conn, probes, bound).await
        }
        .await;
        if let Err(err) = settled {
            for cycle in cycles {
                waits.settle(cycle, false);
            }
            return Err(err);
        }
        self.sync_flags(inner).await?;
        probes::confirm(&mut self.listener, waits, cycles, bound).await
    }

    /// Raises the flags of the locks now waited for and lowers the others; rings the bells of
    /// those just raised, so their waiters try once more with the flag up.
    async fn sync_flags(&mut self, inner: &Inner) -> Result<(), sqlx::Error> {
        let bound = inner.config.statement_timeout;
        let wanted = inner.wanted();
        // A try, not a wait: the flag is taken exclusively only for the instant of a release,
        // which a try that fails here has just passed (the waiter's next try finds the lock
        // free). It is raised at the next look.
        let tried = hold_shared(
            &mut self.listener,
            &mut self.raised,
            &wanted,
            flag_args,
            bound,
        );
        inner.wake(tried.await?);
        Ok(())
    }
}

/// Takes shared, on `conn`, the two-integer locks whose arguments `args` makes of each id in
/// `wanted` that `held` lacks, and lets go of those in `held` no longer wanted; answers the ids
/// it tried to take. A lock somebody holds exclusively is not taken: it is tried again at the
/// next call.
async fn hold_shared(
    conn: &mut PgListener,
    held: &mut HashSet<i64>,
    wanted: &HashSet<i64>,
    args: fn(&str) -> String,
    bound: Duration,
) -> Result<Vec<i64>, sqlx::Error> {
    let lower: Vec<i64> = held.difference(wanted).copied().collect();
    let raise: Vec<i64> = wanted.difference(held).copied().collect();
    if !lower.is_empty() {
        let sql = format!(
            "SELECT pg_catalog.count(pg_catalog.pg_advisory_unlock_shared({})) \
             FROM pg_catalog.unnest($1::bigint[]) AS t(id)",
            args("t.id")
        );
        let query = sqlx::query(AssertSqlSafe(sql)).bind(&lower);
        timeout(bound, query.execute(&mut *conn))
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)??;
        for id in &lower {
            held.remove(id);
        }
    }
    if !raise.is_empty() {
        let sql = format!(
            "SELECT t.id FROM pg_catalog.unnest($1::bigint[]) AS t(id) \
             WHERE pg_catalog.pg_try_advisory_lock_shared({})",
            args("t.id")
        );
        let query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql)).bind(&raise);
        let taken = timeout(bound, query.fetch_all(conn))
            .await
            .map_err(|_| sqlx::Error::PoolTimedOut)??;
        held.extend(taken);
    }
    Ok(raise)
}
