//! The libraries under test, behind one small holder interface.
//!
//! * `pglock`: [`PostgresLockManager`] through its public API (`acquire` + `LockGuard::release`,
//!   `try_acquire` + `release`), on a pool built the way a performance-aware user would.
//! * `pglock_defaultpool`: the same on a pool with sqlx's default options, all of them (10
//!   connections at most), whatever the number of keys.
//! * `sqlx_raw`: the bare statements on one connection per holder, prepared (the floor).
//! * `sqlx_raw_x`: the same floor with the `--raw-spin` and `--raw-try-sql` knobs applied, to run
//!   next to the plain one in the same process (calibration and statement-shape experiments).
//! * `sqlx_advisory`: sqlx's own [`PgAdvisoryLock`], one connection per holder.
//! * `noop`: a lock that excludes nothing, the negative control.
//!
//! W5 (many tasks in one process) builds the two sqlx floors with [`Lib::start_pooled`]
//! instead: one pool with sqlx's default options, from which each lock takes a connection
//! (checkout, lock, unlock, return), as a service without a lock library would write it.

use std::time::Duration;

use pglock::{LockGuard, PostgresLockManager};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{
    PgAdvisoryLock, PgAdvisoryLockKey, PgConnectOptions, PgConnection, PgPoolOptions,
};
use sqlx::{Connection, Either, PgPool, Postgres};

use crate::cli::Args;

pub type Res<T> = Result<T, String>;

pub fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibKind {
    Pglock,
    PglockDefaultPool,
    SqlxRaw,
    SqlxRawX,
    SqlxAdvisory,
    Noop,
}

impl LibKind {
    pub fn parse(name: &str) -> Option<LibKind> {
        Some(match name {
            "pglock" => LibKind::Pglock,
            "pglock_defaultpool" => LibKind::PglockDefaultPool,
            "sqlx_raw" => LibKind::SqlxRaw,
            "sqlx_raw_x" => LibKind::SqlxRawX,
            "sqlx_advisory" => LibKind::SqlxAdvisory,
            "noop" => LibKind::Noop,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            LibKind::Pglock => "pglock",
            LibKind::PglockDefaultPool => "pglock_defaultpool",
            LibKind::SqlxRaw => "sqlx_raw",
            LibKind::SqlxRawX => "sqlx_raw_x",
            LibKind::SqlxAdvisory => "sqlx_advisory",
            LibKind::Noop => "noop",
        }
    }

    fn is_pglock(self) -> bool {
        matches!(self, LibKind::Pglock | LibKind::PglockDefaultPool)
    }

    /// One of the two floors that send the bare statements, `sqlx_raw` and `sqlx_raw_x`.
    fn is_raw(self) -> bool {
        matches!(self, LibKind::SqlxRaw | LibKind::SqlxRawX)
    }

    /// One of the sqlx floors (the raw ones and `sqlx_advisory`), which W5 runs on a shared
    /// default pool, a connection per lock.
    pub fn is_sqlx_floor(self) -> bool {
        self.is_raw() || self == LibKind::SqlxAdvisory
    }

    /// The `lib` field: the name plus a suffix for any non-default knob.
    pub fn label(self, args: &Args) -> String {
        let mut label = self.name().to_owned();
        if self == LibKind::SqlxRawX {
            if args.raw_spin > 0 {
                label.push_str(&format!("_spin{}", args.raw_spin));
            }
            if args.raw_try_sql.is_some() {
                label.push_str("_trysql");
            }
        }
        if self.is_pglock() {
            if let Some(max) = args.pool_max {
                label.push_str(&format!("_pool{max}"));
            }
            if !args.pglock_tracing {
                label.push_str("_notrace");
            }
            if let Some(t) = args.acquire_timeout {
                label.push_str(&format!("_timeout{t}s"));
            }
        }
        label
    }
}

/// A key as every library sees it: the string pglock hashes and the id the others use.
///
/// `id == pglock::lock_id(&name)`, the same id a Python service using the original's scheme gets for the same
/// `lockbench:<run>:<scope>:<i>` string, so probes work the same for every library.
#[derive(Debug, Clone)]
pub struct Key {
    pub name: String,
    pub id: i64,
    /// sqlx_advisory's lock object, built once per key as its docs suggest.
    adv: Option<PgAdvisoryLock>,
}

/// Connect options for one role of connection (lock, peer, harness) of a run.
pub fn connect_options(dsn: &str, app: &str, settings: &[(&str, &str)]) -> Res<PgConnectOptions> {
    let opts: PgConnectOptions = dsn.parse().map_err(err)?;
    let opts = opts.application_name(app);
    Ok(if settings.is_empty() {
        opts
    } else {
        opts.options(settings.iter().copied())
    })
}

/// One library instance (a manager and its pool, or nothing) shared by a process's holders.
pub struct Lib {
    pub kind: LibKind,
    opts: PgConnectOptions,
    manager: Option<PostgresLockManager>,
    /// The sqlx floors' shared pool in W5 ([`Lib::start_pooled`]); `None` elsewhere.
    pool: Option<PgPool>,
    acquire_timeout: Option<Duration>,
    raw: RawKnobs,
}

impl Lib {
    /// Builds the library; its lock connections carry `application_name = app`.
    pub fn start(kind: LibKind, dsn: &str, app: &str, args: &Args) -> Res<Lib> {
        let settings: &[(&str, &str)] = if args.log_statements {
            &[("log_statement", "all")]
        } else {
            &[]
        };
        let opts = connect_options(dsn, app, settings)?;
        let manager = match kind {
            LibKind::Pglock => Some(pglock_manager(tuned_pool(&opts, args), args)),
            LibKind::PglockDefaultPool => Some(pglock_manager(default_pool(&opts, args), args)),
            _ => None,
        };
        Ok(Lib {
            kind,
            opts,
            manager,
            pool: None,
            acquire_timeout: args.acquire_timeout.map(Duration::from_secs_f64),
            raw: if kind == LibKind::SqlxRawX {
                RawKnobs::from_args(args)
            } else {
                RawKnobs::PLAIN
            },
        })
    }

    /// W5's libraries: the pglock ones as in [`Lib::start`]; `sqlx_raw` and `sqlx_advisory`
    /// on one pool with sqlx's default options (`--pool-max` sets its `max_connections`), a
    /// pooled connection taken per lock. `noop` as ever.
    pub fn start_pooled(kind: LibKind, dsn: &str, app: &str, args: &Args) -> Res<Lib> {
        let mut lib = Lib::start(kind, dsn, app, args)?;
        if kind.is_sqlx_floor() {
            lib.pool = Some(default_pool(&lib.opts, args));
        }
        Ok(lib)
    }

    pub fn key(&self, run_id: &str, scope: &str, i: usize) -> Key {
        let name = format!("lockbench:{run_id}:{scope}:{i}");
        let id = pglock::lock_id(&name);
        let adv = (self.kind == LibKind::SqlxAdvisory)
            .then(|| PgAdvisoryLock::with_key(PgAdvisoryLockKey::BigInt(id)));
        Key { name, id, adv }
    }

    pub async fn new_holder(&self) -> Res<Holder> {
        Ok(match self.kind {
            LibKind::Pglock | LibKind::PglockDefaultPool => {
                let manager = self.manager.clone().expect("pglock libs have a manager");
                Holder::Pglock(manager, self.acquire_timeout)
            }
            kind if kind.is_sqlx_floor() && self.pool.is_some() => {
                let pool = self.pool.clone().expect("checked just above");
                if self.kind.is_raw() {
                    Holder::PooledRaw(pool, self.raw)
                } else {
                    Holder::PooledAdvisory(pool)
                }
            }
            LibKind::SqlxRaw | LibKind::SqlxRawX => Holder::Raw(
                PgConnection::connect_with(&self.opts).await.map_err(err)?,
                self.raw,
            ),
            LibKind::SqlxAdvisory => {
                Holder::Advisory(PgConnection::connect_with(&self.opts).await.map_err(err)?)
            }
            LibKind::Noop => Holder::Noop,
        })
    }

    pub async fn close(self) {
        if let Some(manager) = self.manager {
            let _ = manager.release_all().await;
            manager.pool().close().await;
        }
        if let Some(pool) = self.pool {
            pool.close().await;
        }
    }
}

/// The pool a performance-aware user builds for a lock manager: sqlx's defaults but
/// `test_before_acquire(false)` (sqlx otherwise pings every idle connection on checkout; the
/// manager checks out a connection only to open a lock session or to wait for a contended
/// key, so this matters little now). `--pool-max` sets `max_connections`.
fn tuned_pool(opts: &PgConnectOptions, args: &Args) -> PgPool {
    let options = PgPoolOptions::new().test_before_acquire(false);
    sized(options, args).connect_lazy_with(opts.clone())
}

/// sqlx's defaults (`PgPool::connect`): at most 10 connections, whatever the number of keys;
/// `--pool-max` sets `max_connections`.
fn default_pool(opts: &PgConnectOptions, args: &Args) -> PgPool {
    sized(PgPoolOptions::new(), args).connect_lazy_with(opts.clone())
}

fn sized(options: PgPoolOptions, args: &Args) -> PgPoolOptions {
    match args.pool_max {
        Some(max) => options.max_connections(max),
        None => options,
    }
}

/// The lock budget a stock server grants a manager on sqlx's default pool:
/// `max_locks_per_transaction` (64) × the pool's 10 connections.
const STOCK_BUDGET: usize = 640;

fn pglock_manager(pool: PgPool, args: &Args) -> PostgresLockManager {
    // The harness counts a library's connections by their `application_name`
    // (`lockbench-lib-<run>`): keep it, rather than pglock's `pglock:{holder}` session tag.
    let builder = PostgresLockManager::builder(pool)
        .tracing(args.pglock_tracing)
        .application_name_prefix(None);
    // W4 with more keys than the default budget raises it on purpose, as users are told to
    // (the server's lock table holds about 12,900 advisory locks on a stock server).
    let builder = if args.keys > STOCK_BUDGET {
        builder.lock_budget(args.keys)
    } else {
        builder
    };
    builder.build()
}

/// What a task locks with.
pub enum Holder {
    /// A clone of the process's manager: every holder of a process is the same pglock holder,
    /// as the manager's docs prescribe (one manager per process). The timeout is what
    /// `acquire` is given (`None` unless `--acquire-timeout`).
    Pglock(PostgresLockManager, Option<Duration>),
    Raw(PgConnection, RawKnobs),
    Advisory(PgConnection),
    /// W5's `sqlx_raw`: a connection from the shared default pool per lock, the bare
    /// statements on it.
    PooledRaw(PgPool, RawKnobs),
    /// W5's `sqlx_advisory`: a connection from the shared default pool per lock,
    /// `PgAdvisoryLock` on it.
    PooledAdvisory(PgPool),
    Noop,
}

/// Proof of one acquisition, handed back to `release`.
pub enum Held {
    Guard(LockGuard),
    Id(i64),
    Advisory(PgAdvisoryLock),
    /// A pooled lock: the connection stays checked out until the release has run on it.
    PooledId(PoolConnection<Postgres>, i64),
    PooledAdvisory(PoolConnection<Postgres>, PgAdvisoryLock),
    Nothing,
}

const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1)";
const LOCK: &str = "SELECT pg_advisory_lock($1)";
const UNLOCK: &str = "SELECT pg_advisory_unlock($1)";

/// A connection from the pool, as `PgPool::acquire` hands it out (with sqlx's default
/// options: a ping on the idle connection first, `test_before_acquire`).
async fn checkout(pool: &PgPool) -> Res<PoolConnection<Postgres>> {
    pool.acquire().await.map_err(err)
}

/// The raw floors' experiment knobs, `--raw-spin` and `--raw-try-sql`: applied to `sqlx_raw_x`
/// only, so that it runs next to a plain `sqlx_raw` in the same process.
#[derive(Debug, Clone, Copy)]
pub struct RawKnobs {
    spin: u64,
    try_sql: &'static str,
}

impl RawKnobs {
    const PLAIN: RawKnobs = RawKnobs {
        spin: 0,
        try_sql: TRY_LOCK,
    };

    fn from_args(args: &Args) -> RawKnobs {
        RawKnobs {
            spin: args.raw_spin,
            // Leaked once per library: sqlx takes the statement as `&'static str`, as it
            // takes the constants.
            try_sql: args
                .raw_try_sql
                .as_ref()
                .map_or(TRY_LOCK, |sql| Box::leak(sql.clone().into_boxed_str())),
        }
    }

    /// `--raw-spin`'s client-only cost: a chain of dependent multiply-adds that touches
    /// nothing but its own stack slot (`black_box`), so it adds CPU time and next to nothing
    /// the server could feel through a shared cache.
    fn spin(self) {
        let mut x = 0u64;
        for i in 0..self.spin {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        std::hint::black_box(x);
    }

    /// `pg_try_advisory_lock` (or `--raw-try-sql`): whether the key was granted.
    async fn try_lock(self, conn: &mut PgConnection, id: i64) -> Res<bool> {
        self.bool_statement(conn, self.try_sql, id).await
    }

    /// `pg_advisory_unlock`: whether the key was held.
    async fn unlock(self, conn: &mut PgConnection, id: i64) -> Res<bool> {
        self.bool_statement(conn, UNLOCK, id).await
    }

    /// `pg_advisory_lock`, waiting on the server for as long as it takes.
    async fn lock(self, conn: &mut PgConnection, id: i64) -> Res<()> {
        self.spin();
        sqlx::query(LOCK)
            .bind(id)
            .execute(conn)
            .await
            .map(drop)
            .map_err(err)
    }

    async fn bool_statement(
        self,
        conn: &mut PgConnection,
        sql: &'static str,
        id: i64,
    ) -> Res<bool> {
        self.spin();
        // Persistent (the default): prepared once per connection, then Bind/Execute/Sync.
        sqlx::query_scalar::<_, bool>(sql)
            .bind(id)
            .fetch_one(conn)
            .await
            .map_err(err)
    }
}

impl Holder {
    /// W1's acquisition of a free key. sqlx_raw uses `pg_try_advisory_lock`, which must say
    /// true (as the asyncpg and pgbench floors do); the libraries use their blocking acquire.
    pub async fn acquire_uncontended(&mut self, key: &Key) -> Res<Held> {
        let refused = || {
            format!(
                "pg_try_advisory_lock({}) returned false on a free key",
                key.id
            )
        };
        match self {
            Holder::Raw(conn, raw) => {
                if raw.try_lock(conn, key.id).await? {
                    Ok(Held::Id(key.id))
                } else {
                    Err(refused())
                }
            }
            Holder::PooledRaw(pool, raw) => {
                let mut conn = checkout(pool).await?;
                if raw.try_lock(&mut conn, key.id).await? {
                    Ok(Held::PooledId(conn, key.id))
                } else {
                    Err(refused())
                }
            }
            _ => self.acquire(key).await,
        }
    }

    /// A blocking acquisition, waiting on the server for as long as it takes.
    pub async fn acquire(&mut self, key: &Key) -> Res<Held> {
        match self {
            Holder::Pglock(manager, timeout) => manager
                .acquire(&key.name, *timeout)
                .await
                .map(Held::Guard)
                .map_err(err),
            Holder::Raw(conn, raw) => {
                raw.lock(conn, key.id).await?;
                Ok(Held::Id(key.id))
            }
            Holder::Advisory(conn) => {
                let lock = key
                    .adv
                    .as_ref()
                    .expect("sqlx_advisory keys carry their lock");
                // The guard borrows the connection, and W4 holds K locks on it at once, so the
                // guard is leaked and the lock released with `force_release`, the crate's
                // documented manual path; `release_now` sends the same statement.
                let guard = lock.acquire(&mut *conn).await.map_err(err)?;
                guard.leak();
                Ok(Held::Advisory(lock.clone()))
            }
            Holder::PooledRaw(pool, raw) => {
                let mut conn = checkout(pool).await?;
                raw.lock(&mut conn, key.id).await?;
                Ok(Held::PooledId(conn, key.id))
            }
            Holder::PooledAdvisory(pool) => {
                let lock = key
                    .adv
                    .as_ref()
                    .expect("sqlx_advisory keys carry their lock");
                let mut conn = checkout(pool).await?;
                // As above: the guard would borrow the pooled connection, which the caller
                // keeps until the release.
                lock.acquire(&mut *conn).await.map_err(err)?.leak();
                Ok(Held::PooledAdvisory(conn, lock.clone()))
            }
            Holder::Noop => {
                tokio::task::yield_now().await;
                Ok(Held::Nothing)
            }
        }
    }

    /// Releases one acquisition; a release the server does not confirm is an error.
    pub async fn release(&mut self, held: Held) -> Res<()> {
        match (self, held) {
            (Holder::Pglock(..), Held::Guard(guard)) => match guard.release().await {
                Ok(()) => Ok(()),
                Err(pglock::Error::LockLost { cause, .. }) if cause.is_release() => {
                    Err("LockGuard::release: the lock was already released".into())
                }
                Err(e) => Err(err(e)),
            },
            (Holder::Raw(conn, raw), Held::Id(id)) => {
                if raw.unlock(conn, id).await? {
                    Ok(())
                } else {
                    Err(format!("pg_advisory_unlock({id}) returned false: not held"))
                }
            }
            (Holder::Advisory(conn), Held::Advisory(lock)) => {
                let (_, released) = lock.force_release(&mut *conn).await.map_err(err)?;
                if released {
                    Ok(())
                } else {
                    Err("PgAdvisoryLock::force_release returned false: not held".into())
                }
            }
            // The pooled connection goes back to the pool when dropped, after the unlock.
            (Holder::PooledRaw(_, raw), Held::PooledId(mut conn, id)) => {
                if raw.unlock(&mut conn, id).await? {
                    Ok(())
                } else {
                    Err(format!("pg_advisory_unlock({id}) returned false: not held"))
                }
            }
            (Holder::PooledAdvisory(_), Held::PooledAdvisory(mut conn, lock)) => {
                let (_, released) = lock.force_release(&mut *conn).await.map_err(err)?;
                if released {
                    Ok(())
                } else {
                    Err("PgAdvisoryLock::force_release returned false: not held".into())
                }
            }
            (Holder::Noop, _) => {
                tokio::task::yield_now().await;
                Ok(())
            }
            _ => Err("BUG: release with another library's acquisition".into()),
        }
    }

    /// One attempt that must not wait; true when the lock was granted.
    pub async fn try_acquire(&mut self, key: &Key) -> Res<bool> {
        match self {
            // The guard is leaked into the manager's registry: the lock stays held until
            // `release_tried` releases it by key, as the other libraries' tries do.
            Holder::Pglock(manager, _) => manager
                .try_acquire(&key.name)
                .await
                .map(|attempt| attempt.leak().is_some())
                .map_err(err),
            Holder::Raw(conn, raw) => raw.try_lock(conn, key.id).await,
            Holder::Advisory(conn) => {
                let lock = key
                    .adv
                    .as_ref()
                    .expect("sqlx_advisory keys carry their lock");
                match lock.try_acquire(&mut *conn).await.map_err(err)? {
                    Either::Left(guard) => {
                        guard.leak();
                        Ok(true)
                    }
                    Either::Right(_) => Ok(false),
                }
            }
            // Only W5 builds pooled holders, and W5 takes no tries: a granted try would leave
            // the lock on a connection back in the pool, out of `release_tried`'s reach.
            Holder::PooledRaw(..) | Holder::PooledAdvisory(_) => {
                Err("the pooled floors (W5) take no tries".into())
            }
            Holder::Noop => {
                tokio::task::yield_now().await;
                Ok(true)
            }
        }
    }

    /// Gives back a lock that `try_acquire` wrongly granted, so the run can go on.
    pub async fn release_tried(&mut self, key: &Key) -> Res<()> {
        match self {
            Holder::Pglock(manager, _) => manager.release(&key.name).await.map_err(err),
            Holder::Raw(..) => self.release(Held::Id(key.id)).await,
            Holder::Advisory(_) => {
                let lock = key
                    .adv
                    .clone()
                    .expect("sqlx_advisory keys carry their lock");
                self.release(Held::Advisory(lock)).await
            }
            Holder::PooledRaw(..) | Holder::PooledAdvisory(_) => {
                Err("the pooled floors (W5) take no tries".into())
            }
            Holder::Noop => Ok(()),
        }
    }

    pub async fn close(self) {
        match self {
            Holder::Raw(conn, _) | Holder::Advisory(conn) => {
                let _ = conn.close().await;
            }
            // A pool closes with its `Lib`.
            Holder::Pglock(..)
            | Holder::PooledRaw(..)
            | Holder::PooledAdvisory(_)
            | Holder::Noop => {}
        }
    }
}
