//! Cases across managers: two or more managers on one backend, each a holder of its own, play
//! the replicas of a service on one database. They check what the single-manager cases cannot:
//! that a lock one manager holds keeps the others out (in either mode, taken singly or as a
//! set), that sharers of different managers coexist, that a waiter of one manager is served
//! once another lets go (by a release, a dropped guard, `release_all`, or a lock taken away),
//! and that a manager which lost a lock does not go on excluding the new holder.
//!
//! See the [module documentation](super#across-managers) for how to run them, and `peers.rs`
//! for the [`Peers`] they take.

use std::time::Duration;

use pglock::{Attempt, Error, LockGuard, LockInfo, LockManagerExt, LockMode};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;

use LockMode::{Exclusive, Shared};

/// How long a waiter of the other manager runs before a case checks that it still waits: long
/// enough for an acquisition that would not wait to have finished.
const SETTLE: Duration = Duration::from_millis(200);

/// The bound of an acquisition that must time out (after one with no wait at all).
const SHORT: Duration = Duration::from_millis(100);

/// How soon after a holder lets go a waiter of another manager must be granted: a waiter that
/// is told, or polls a few times a second, is served well within it on a busy machine.
const PROMPTLY: Duration = Duration::from_secs(2);

/// `acquire` or `acquire_shared`.
async fn acquire(
    manager: &Manager,
    key: &str,
    mode: LockMode,
    timeout: Option<Duration>,
) -> pglock::Result<LockGuard> {
    match mode {
        Shared => manager.acquire_shared(key, timeout).await,
        _ => manager.acquire(key, timeout).await,
    }
}

/// `try_acquire` or `try_acquire_shared`.
async fn attempt(manager: &Manager, key: &str, mode: LockMode) -> Attempt {
    match mode {
        Shared => manager.try_acquire_shared(key).await,
        _ => manager.try_acquire(key).await,
    }
    .expect("try")
}

/// Fails the case unless `manager`'s try of `key` in `mode` is busy.
async fn assert_busy(manager: &Manager, key: &str, mode: LockMode, because: &str) {
    if let Attempt::Acquired(guard) = attempt(manager, key, mode).await {
        let _ = guard.release().await;
        panic!(
            "{} was granted {key} ({mode}) although {because}",
            manager.holder_id()
        );
    }
}

/// The guard of `manager`'s try of `key` in `mode`, which must be granted.
async fn assert_granted(manager: &Manager, key: &str, mode: LockMode, because: &str) -> LockGuard {
    match attempt(manager, key, mode).await {
        Attempt::Acquired(guard) => guard,
        _ => panic!(
            "{} found {key} ({mode}) busy although {because}",
            manager.holder_id()
        ),
    }
}

/// Fails the case unless `manager`'s bounded acquisitions of `key` in `mode` (no wait, then a
/// short one) time out.
async fn assert_times_out(manager: &Manager, key: &str, mode: LockMode, because: &str) {
    for timeout in [Duration::ZERO, SHORT] {
        match acquire(manager, key, mode, Some(timeout)).await {
            Err(err) => assert!(
                err.is_timeout(),
                "a {timeout:?} acquisition of {key} ({mode}) by {}: expected a timeout, got {err:?}",
                manager.holder_id()
            ),
            Ok(guard) => {
                let _ = guard.release().await;
                panic!(
                    "{} was granted {key} ({mode}) within {timeout:?} although {because}",
                    manager.holder_id()
                );
            }
        }
    }
}

/// An acquisition running on a task of its own, which reports when it was granted.
struct Waiter<T: Send + 'static> {
    task: JoinHandle<(pglock::Result<T>, Instant)>,
}

impl<T: Send + 'static> Waiter<T> {
    fn spawn(acquisition: impl Future<Output = pglock::Result<T>> + Send + 'static) -> Self {
        Waiter {
            task: tokio::spawn(async move {
                let outcome = acquisition.await;
                (outcome, Instant::now())
            }),
        }
    }

    /// Fails the case if the acquisition ends within [`SETTLE`].
    async fn still_waiting(&mut self, because: &str) {
        if let Ok(joined) = tokio::time::timeout(SETTLE, &mut self.task).await {
            let granted = matches!(joined, Ok((Ok(_), _)));
            panic!(
                "an acquisition of the other manager ended ({}) although {because}",
                if granted { "granted" } else { "failed" }
            );
        }
    }

    /// What the acquisition got, and when; fails the case unless it was granted.
    async fn granted(&mut self) -> (T, Instant) {
        let (outcome, at) = tokio::time::timeout(EVENTUALLY + EVENTUALLY, &mut self.task)
            .await
            .expect("the waiter ends within its deadline")
            .expect("the waiter's task panicked");
        match outcome {
            Ok(value) => (value, at),
            Err(err) => panic!("the waiter was not granted: {err:?}"),
        }
    }
}

impl<T: Send + 'static> Drop for Waiter<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `manager` waiting for `key` in `mode`, at most [`EVENTUALLY`].
fn waiter(manager: &Manager, key: &str, mode: LockMode) -> Waiter<LockGuard> {
    let (manager, key) = (Arc::clone(manager), key.to_owned());
    Waiter::spawn(async move { acquire(&manager, &key, mode, Some(EVENTUALLY)).await })
}

/// Checks a grant made when a holder let go: not before `letting_go` (when the holder started
/// to), within [`PROMPTLY`] of `let_go` (when it was done), and with a newer fencing token when
/// both acquisitions carry one.
fn assert_handed_over(
    before: &LockInfo,
    after: &LockInfo,
    granted_at: Instant,
    letting_go: Instant,
    let_go: Instant,
) {
    assert!(
        granted_at >= letting_go,
        "{} was granted {} before {} let go",
        after.holder_id,
        after.key,
        before.holder_id
    );
    let late = granted_at.saturating_duration_since(let_go);
    assert!(
        late <= PROMPTLY,
        "{} was granted {} {late:?} after {} let go",
        after.holder_id,
        after.key,
        before.holder_id
    );
    if let (Some(old), Some(new)) = (before.fencing_token, after.fencing_token) {
        assert!(new > old, "fencing token {new} after {old}");
    }
}

/// An exclusive lock of one manager keeps the other out: its try is busy, its bounded
/// acquisitions time out, and it holds nothing; once the holder lets go the other gets the
/// key, and then keeps the first out in turn.
pub async fn an_exclusive_lock_excludes_the_other_manager(peers: &Peers) {
    for (holder, other) in [peers.pair(), (peers.get(1), peers.get(0))] {
        let key = key("across-exclusive");
        let guard = acquire(holder, &key, Exclusive, None)
            .await
            .expect("acquire");
        assert_busy(other, &key, Exclusive, "the other manager holds it").await;
        assert_times_out(other, &key, Exclusive, "the other manager holds it").await;
        assert!(!other.is_held(&key).await);
        assert_eq!(other.held_lock_count(), 0);
        guard.release().await.expect("release");
        let taken = assert_granted(other, &key, Exclusive, "its holder let go").await;
        assert_busy(holder, &key, Exclusive, "the other manager took it").await;
        taken.release().await.expect("release");
    }
}

/// A shared lock of one manager keeps out an exclusive acquisition of the other, and an
/// exclusive lock keeps out a shared one, both ways round.
pub async fn shared_and_exclusive_exclude_each_other_across_managers(peers: &Peers) {
    let (a, b) = peers.pair();
    for (held, wanted) in [(Shared, Exclusive), (Exclusive, Shared)] {
        let key = key("across-modes");
        let because = format!("the other manager holds it {held}");
        let guard = acquire(a, &key, held, None).await.expect("acquire");
        assert_busy(b, &key, wanted, &because).await;
        assert_times_out(b, &key, wanted, &because).await;
        guard.release().await.expect("release");

        let taken = assert_granted(b, &key, wanted, "its holder let go").await;
        let because = format!("the other manager holds it {wanted}");
        assert_busy(a, &key, held, &because).await;
        assert_times_out(a, &key, held, &because).await;
        taken.release().await.expect("release");
    }
}

/// Every manager can share a key at once (by a try and by a bounded acquisition); an
/// exclusive acquisition waits for the last sharer of any manager.
pub async fn sharers_of_different_managers_hold_a_key_together(peers: &Peers) {
    let (a, b) = peers.pair();
    let key = key("across-sharers");
    let first = acquire(a, &key, Shared, None)
        .await
        .expect("acquire_shared");
    let tried = assert_granted(b, &key, Shared, "the other manager only shares it").await;
    tried.release().await.expect("release");
    let mut sharers = Vec::new();
    for other in &peers.managers()[1..] {
        sharers.push(
            acquire(other, &key, Shared, Some(EVENTUALLY))
                .await
                .expect("sharers of other managers are granted at once"),
        );
    }
    for sharer in sharers {
        assert!(sharer.loss_signal().cause().is_none());
        sharer.release().await.expect("release");
    }
    assert_busy(b, &key, Exclusive, "the other manager still shares it").await;
    assert_times_out(b, &key, Exclusive, "the other manager still shares it").await;
    first.release().await.expect("release");
    let exclusive = assert_granted(b, &key, Exclusive, "the last sharer let go").await;
    exclusive.release().await.expect("release");
}

/// A waiter of one manager is granted once the other manager's holder releases (for each pair
/// of modes that conflict), not before, and promptly.
pub async fn a_release_hands_the_key_to_a_waiter_of_the_other_manager(peers: &Peers) {
    let (a, b) = peers.pair();
    for (held, wanted) in [
        (Exclusive, Exclusive),
        (Exclusive, Shared),
        (Shared, Exclusive),
    ] {
        let key = key("across-release");
        let guard = acquire(a, &key, held, None).await.expect("acquire");
        let first = guard.info().clone();
        let mut waiting = waiter(b, &key, wanted);
        waiting
            .still_waiting(&format!(
                "the key is held {held} and {wanted} was asked for"
            ))
            .await;
        let letting_go = Instant::now();
        guard.release().await.expect("release");
        let let_go = Instant::now();
        let (next, granted_at) = waiting.granted().await;
        assert_handed_over(&first, next.info(), granted_at, letting_go, let_go);
        assert_busy(a, &key, Exclusive, "the other manager holds it now").await;
        next.release().await.expect("release");
    }
}

/// Dropping a guard serves a waiter of the other manager, as a release does.
pub async fn a_dropped_guard_hands_the_key_to_a_waiter_of_the_other_manager(peers: &Peers) {
    let (a, b) = peers.pair();
    for held in [Exclusive, Shared] {
        let key = key("across-drop");
        let guard = acquire(a, &key, held, None).await.expect("acquire");
        let first = guard.info().clone();
        let mut waiting = waiter(b, &key, Exclusive);
        waiting
            .still_waiting(&format!("the other manager holds the key {held}"))
            .await;
        let dropped = Instant::now();
        drop(guard);
        let (next, granted_at) = waiting.granted().await;
        assert_handed_over(&first, next.info(), granted_at, dropped, dropped);
        next.release().await.expect("release");
    }
}

/// `release_all` of one manager lets the other in on every key it held: a waiter is granted,
/// a try succeeds; the first manager's guard is stale and does not disturb the new holder.
pub async fn release_all_lets_the_other_manager_in(peers: &Peers) {
    let (a, b) = peers.pair();
    let waited = key("across-release-all-waited");
    let tried = key("across-release-all-tried");
    let guard = acquire(a, &waited, Exclusive, None).await.expect("acquire");
    let first = guard.info().clone();
    a.try_acquire_shared(tried.as_str())
        .await
        .expect("try")
        .leak()
        .expect("a free key is granted");
    let mut waiting = waiter(b, &waited, Exclusive);
    waiting
        .still_waiting("the other manager holds the key")
        .await;
    assert_busy(b, &tried, Exclusive, "the other manager shares it").await;

    let letting_go = Instant::now();
    assert_eq!(a.release_all().await.expect("release_all"), 2);
    let let_go = Instant::now();
    let (next, granted_at) = waiting.granted().await;
    assert_handed_over(&first, next.info(), granted_at, letting_go, let_go);
    let other = assert_granted(b, &tried, Exclusive, "its sharer released everything").await;

    assert!(
        matches!(guard.release().await, Err(Error::LockLost { .. })),
        "a guard released by release_all reports its lock gone"
    );
    assert_busy(a, &waited, Exclusive, "the other manager holds it now").await;
    next.release().await.expect("release");
    other.release().await.expect("release");
    assert_eq!(a.held_lock_count(), 0);
}

/// Keys held as a set, by `acquire_all` or for a `with_locks` body, each keep the other
/// manager out: its tries are busy, its acquisition of the set times out holding nothing, and
/// its waiting acquisition of the set is granted once the body is over.
pub async fn a_set_excludes_the_other_manager_from_every_key(peers: &Peers) {
    let (a, b) = peers.pair();
    let keys: Vec<String> = (0..3).map(|i| key(&format!("across-set-{i}"))).collect();

    let set = a
        .acquire_all(&keys, Some(EVENTUALLY))
        .await
        .expect("acquire_all");
    for key in &keys {
        assert_busy(b, key, Exclusive, "the other manager holds it in a set").await;
        assert_busy(b, key, Shared, "the other manager holds it in a set").await;
    }
    let err = b
        .acquire_all(keys.iter().rev(), Some(SHORT))
        .await
        .expect_err("every key is held by the other manager");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(b.held_lock_count(), 0, "a failed set keeps nothing");
    set.release().await.expect("release");

    let (other, in_body) = (Arc::clone(b), keys.clone());
    let waiting = a
        .with_locks(&keys, Some(EVENTUALLY), |_| async move {
            for key in &in_body {
                assert_busy(&other, key, Exclusive, "the other manager's body runs").await;
                assert_times_out(&other, key, Shared, "the other manager's body runs").await;
            }
            let mut waiting = {
                let (other, keys) = (Arc::clone(&other), in_body.clone());
                Waiter::spawn(async move { other.acquire_all(&keys, Some(EVENTUALLY)).await })
            };
            waiting.still_waiting("the other manager's body runs").await;
            (waiting, Instant::now())
        })
        .await;
    let let_go = Instant::now();
    let (mut waiting, body_ended) = waiting.expect("with_locks");
    let (set, granted_at) = waiting.granted().await;
    assert!(granted_at >= body_ended, "granted while the body ran");
    let late = granted_at.saturating_duration_since(let_go);
    assert!(late <= PROMPTLY, "granted {late:?} after with_locks ended");
    assert_eq!(set.len(), 3);
    for key in &keys {
        assert!(b.is_held(key).await, "{key} is held");
        assert_busy(a, key, Shared, "the other manager holds the set").await;
    }
    set.release().await.expect("release");
}

/// A lock taken away from one manager on the backend (see [`Peers::take_away_with`]) goes to
/// the other manager's waiter; the first is told, forgets it, and is kept out by the new
/// holder (its stale guard releases nothing) until that one lets go.
pub async fn a_lock_taken_away_goes_to_the_waiter_of_the_other_manager(peers: &Peers) {
    let (a, b) = peers.pair();
    let key = key("across-taken");
    let guard = acquire(a, &key, Exclusive, None).await.expect("acquire");
    let mut waiting = waiter(b, &key, Exclusive);
    waiting
        .still_waiting("the other manager holds the key")
        .await;
    peers.take_away(0, key.as_str()).await;
    let cause = tokio::time::timeout(EVENTUALLY, guard.loss_signal().lost())
        .await
        .expect("the holder is told its lock went");
    let (next, _) = waiting.granted().await;
    assert!(
        !a.is_held(&key).await,
        "the manager forgot the lock it lost"
    );
    match guard.release().await {
        Err(Error::LockLost {
            cause: reported, ..
        }) => assert_eq!(reported, cause),
        other => panic!("a lost lock's release reports it lost, got {other:?}"),
    }
    assert_busy(a, &key, Exclusive, "the other manager holds it now").await;
    assert_busy(a, &key, Shared, "the other manager holds it now").await;
    assert!(
        next.loss_signal().cause().is_none(),
        "the new holder keeps it"
    );
    next.release().await.expect("release");
    let again = assert_granted(a, &key, Exclusive, "the new holder let go").await;
    again.release().await.expect("release");
}
