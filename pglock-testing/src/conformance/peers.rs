//! The peers the cases across managers run against ([`Peers`]), the lists of those cases, the
//! macro that makes tests of them, and a take-away hook for managers on PostgreSQL advisory
//! locks ([`terminate_holders`]).

use std::fmt;

use pglock::LockKey;

use super::*;

/// Takes a lock away from one of the peers; see [`Peers::take_away_with`].
type TakeAway = Arc<dyn Fn(usize, LockKey) -> CaseFuture<'static> + Send + Sync>;

/// Managers of one backend, each a holder of its own, that the cases across managers run
/// against: two [`InMemoryLockManager`](pglock::InMemoryLockManager)s built on one
/// [`InMemoryLockServer`](pglock::InMemoryLockServer), two
/// [`PostgresLockManager`](pglock::PostgresLockManager)s on separate pools of one database, or
/// two instances of your manager that a second process would run.
///
/// The cases use the first two managers (the first as peer 0, the second as peer 1), and all of
/// them where a case takes a lock in every one.
pub struct Peers {
    managers: Vec<Manager>,
    take_away: Option<TakeAway>,
}

impl Peers {
    /// The managers, in order.
    ///
    /// # Panics
    ///
    /// With fewer than two managers, or when two of them share a holder id: each manager must
    /// be a holder of its own (a shared holder id makes one manager's critical section refuse
    /// the other's acquisitions as nested).
    pub fn new<M, I>(managers: I) -> Self
    where
        I: IntoIterator<Item = M>,
        M: LockManager + 'static,
    {
        Self::from_shared(managers.into_iter().map(|m| Arc::new(m) as Manager))
    }

    /// As [`new`](Self::new), for managers already behind an `Arc`.
    ///
    /// # Panics
    ///
    /// As [`new`](Self::new).
    pub fn from_shared(managers: impl IntoIterator<Item = Manager>) -> Self {
        let managers: Vec<Manager> = managers.into_iter().collect();
        assert!(
            managers.len() >= 2,
            "the cases across managers need at least two managers, got {}",
            managers.len()
        );
        for (i, manager) in managers.iter().enumerate() {
            for earlier in &managers[..i] {
                assert_ne!(
                    manager.holder_id(),
                    earlier.holder_id(),
                    "each peer must have a holder id of its own"
                );
            }
        }
        Peers {
            managers,
            take_away: None,
        }
    }

    /// Gives the peers a way to take a lock away from one of them the way the backend loses
    /// locks (a terminated session, an expired lease): `hook(peer, key)` must make the lock of
    /// `managers()[peer]` on `key` go, on the backend, without that manager's help, and return
    /// once the backend has been told (not necessarily once the manager has noticed). Only that
    /// manager holds `key` when the hook is called.
    ///
    /// The cases that need it ([`take_away_cases`]) run only with a hook; for
    /// [`InMemoryLockManager`](pglock::InMemoryLockManager)s it is
    /// [`simulate_loss`](pglock::InMemoryLockManager::simulate_loss), for
    /// [`PostgresLockManager`](pglock::PostgresLockManager)s [`terminate_holders`].
    pub fn take_away_with<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(usize, LockKey) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.take_away = Some(Arc::new(move |peer, key| Box::pin(hook(peer, key))));
        self
    }

    /// The managers, in order.
    pub fn managers(&self) -> &[Manager] {
        &self.managers
    }

    /// The manager `peer` (0 for the first).
    ///
    /// # Panics
    ///
    /// When there is no such peer.
    pub fn get(&self, peer: usize) -> &Manager {
        &self.managers[peer]
    }

    /// True when a take-away hook was given.
    pub fn can_take_away(&self) -> bool {
        self.take_away.is_some()
    }

    /// Takes the lock on `key` away from `peer`, with the hook given to
    /// [`take_away_with`](Self::take_away_with).
    ///
    /// # Panics
    ///
    /// When no hook was given.
    pub async fn take_away(&self, peer: usize, key: impl Into<LockKey>) {
        let hook = self.take_away.as_ref().expect(
            "this case takes a lock away from a manager: give the peers a hook with \
             `Peers::take_away_with`",
        );
        hook(peer, key.into()).await;
    }

    /// The first two managers.
    pub(crate) fn pair(&self) -> (&Manager, &Manager) {
        (&self.managers[0], &self.managers[1])
    }
}

impl fmt::Debug for Peers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Peers")
            .field("managers", &self.managers)
            .field("take_away", &self.take_away.is_some())
            .finish()
    }
}

/// One case across managers: its name, whether it needs a take-away hook, and its body.
#[derive(Clone, Copy)]
pub struct PeerCase {
    /// The case's function name in this module.
    pub name: &'static str,
    /// True for the cases that take a lock away from a manager (see
    /// [`Peers::take_away_with`]).
    pub takes_away: bool,
    /// Runs the case against fresh peers.
    pub run: for<'a> fn(&'a Peers) -> CaseFuture<'a>,
}

impl fmt::Debug for PeerCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerCase")
            .field("name", &self.name)
            .field("takes_away", &self.takes_away)
            .finish()
    }
}

/// Makes a function listing the cases of one name list.
macro_rules! case_list {
    ($(#[$doc:meta])* $vis:vis fn $fn_name:ident, $takes_away:literal; $($name:ident),* $(,)?) => {
        $(#[$doc])*
        $vis fn $fn_name() -> Vec<PeerCase> {
            vec![$(PeerCase {
                name: stringify!($name),
                takes_away: $takes_away,
                run: |peers| Box::pin($name(peers)),
            }),*]
        }
    };
}

crate::__conformance_peer_case_names!([case_list]
    /// The cases across managers that need no take-away hook, in order.
    fn exclusion_cases, false;
);
crate::__conformance_take_away_case_names!([case_list]
    /// The cases across managers that take a lock away from one of them, and so need
    /// [`Peers::take_away_with`], in order.
    pub fn take_away_cases, true;
);

/// Every case across managers, in order: those that need no hook, then those that take a lock
/// away ([`take_away_cases`]).
pub fn peer_cases() -> Vec<PeerCase> {
    let mut cases = exclusion_cases();
    cases.extend(take_away_cases());
    cases
}

/// The cases across managers that need no take-away hook, by name, in order: the list that
/// [`peer_cases`] and [`conformance_peer_tests!`](crate::conformance_peer_tests) are made from.
/// Expands to `callback!(args... name, name, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_peer_case_names {
    ([$($callback:tt)*] $($args:tt)*) => {
        $($callback)*!(
            $($args)*
            an_exclusive_lock_excludes_the_other_manager,
            shared_and_exclusive_exclude_each_other_across_managers,
            sharers_of_different_managers_hold_a_key_together,
            a_release_hands_the_key_to_a_waiter_of_the_other_manager,
            a_dropped_guard_hands_the_key_to_a_waiter_of_the_other_manager,
            release_all_lets_the_other_manager_in,
            a_set_excludes_the_other_manager_from_every_key,
        );
    };
}

/// The cases across managers that take a lock away, by name, in order.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_take_away_case_names {
    ([$($callback:tt)*] $($args:tt)*) => {
        $($callback)*!(
            $($args)*
            a_lock_taken_away_goes_to_the_waiter_of_the_other_manager,
        );
    };
}

/// Generates one `#[tokio::test]` per case across managers, each against fresh
/// [`Peers`](crate::conformance::Peers) from `$factory`.
///
/// `$factory` is an expression callable with no arguments that returns a future of `Peers`,
/// called once per case. Add `, take_away` when its peers carry a
/// [take-away hook](crate::conformance::Peers::take_away_with), to get the cases that need one
/// too. The calling crate needs `tokio` with the `macros` and `rt` features; put the
/// invocation in a module of its own:
///
/// ```
/// # #![allow(unused_imports)] // the generated tests build only under `cfg(test)`
/// mod in_memory_peers {
///     use pglock::{InMemoryLockManager, InMemoryLockServer};
///     use pglock_testing::conformance::Peers;
///
///     pglock_testing::conformance_peer_tests!(
///         || async {
///             let server = InMemoryLockServer::new();
///             let managers = ["a", "b"]
///                 .map(|id| InMemoryLockManager::builder().server(&server).holder_id(id).build());
///             let handles = managers.clone();
///             Peers::new(managers).take_away_with(move |peer, key| {
///                 let manager = handles[peer].clone();
///                 async move { assert!(manager.simulate_loss(key).await) }
///             })
///         },
///         take_away
///     );
/// }
/// ```
#[macro_export]
macro_rules! conformance_peer_tests {
    ($factory:expr) => {
        $crate::__conformance_peer_case_names!([$crate::__conformance_peer_tests] $factory;);
    };
    ($factory:expr, take_away) => {
        $crate::__conformance_peer_case_names!([$crate::__conformance_peer_tests] $factory;);
        $crate::__conformance_take_away_case_names!([$crate::__conformance_peer_tests] $factory;);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_peer_tests {
    ($factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $name() {
                let peers: $crate::conformance::Peers = ($factory)().await;
                $crate::conformance::$name(&peers).await;
            }
        )*
    };
}

/// Runs every case across managers, each against fresh peers from `factory`, and panics on
/// the first failure with the case's name. The cases that take a lock away run when the peers
/// carry a hook, and are reported as skipped otherwise.
pub async fn run_all_peers<F, Fut>(factory: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Peers>,
{
    for case in peer_cases() {
        let peers = factory().await;
        if case.takes_away && !peers.can_take_away() {
            eprintln!(
                "conformance: {} skipped: the peers have no take-away hook",
                case.name
            );
            continue;
        }
        eprintln!("conformance: {}", case.name);
        (case.run)(&peers).await;
    }
}

/// Terminates the server sessions that hold `key`'s advisory lock (other than the one running
/// this query) and returns how many were terminated: a take-away hook for managers on
/// PostgreSQL advisory locks, given a pool on the same database whose role may signal them
/// (a superuser, a member of `pg_signal_backend`, or the role that owns them).
///
/// ```no_run
/// # async fn peers(a: pglock::PostgresLockManager, b: pglock::PostgresLockManager, admin: sqlx::PgPool) {
/// use pglock_testing::conformance::{Peers, terminate_holders};
///
/// let peers = Peers::new([a, b]).take_away_with(move |_, key| {
///     let admin = admin.clone();
///     async move {
///         let ended = terminate_holders(&admin, &key).await.expect("terminate");
///         assert_eq!(ended, 1, "one session held {key}");
///     }
/// });
/// # drop(peers);
/// # }
/// ```
///
/// # Errors
///
/// When the query fails.
pub async fn terminate_holders(pool: &sqlx::PgPool, key: &LockKey) -> sqlx::Result<i64> {
    let target = key.target();
    let (classid, objid) = pglock::split_lock_id(target.packed());
    sqlx::query_scalar(
        "SELECT pg_catalog.count(*) FROM (
             SELECT pg_catalog.pg_terminate_backend(pid) AS ended
             FROM pg_catalog.pg_locks
             WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted
               AND database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database
                 WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
               AND classid::bigint OPERATOR(pg_catalog.=) $1
               AND objid::bigint OPERATOR(pg_catalog.=) $2
               AND objsubid OPERATOR(pg_catalog.=) $3
               AND pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
         ) AS holders
         WHERE ended",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(target.objsubid())
    .fetch_one(pool)
    .await
}
