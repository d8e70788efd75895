//! Callers of one manager take turns: a key is asked of the server once, siblings queue, a
//! nested section is refused at once, a plain guard makes its second acquisition wait.

use std::time::Duration;

use pglock::{Error, LockManagerExt, LockMode};

use std::future::Future;
use std::pin::Pin;

use super::*;

/// A key this manager holds is never requested twice: another task waits for the holder,
/// within its deadline, and is served once the holder releases; nothing is stacked.
pub async fn reacquiring_an_own_key_waits_for_the_local_holder(manager: &Manager) {
    let key = key("reacquire");
    let guard = manager.acquire(&key, None).await.expect("acquire");
    assert!(
        manager
            .try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    let err = acquire_elsewhere(
        manager,
        &key,
        LockMode::Exclusive,
        Some(Duration::from_millis(50)),
    )
    .await
    .expect_err("another task waits for the local holder until its deadline");
    assert!(err.is_timeout(), "{err:?}");
    let second = {
        let (other, key) = (Arc::clone(manager), key.clone());
        tokio::spawn(async move { other.acquire(key, Some(EVENTUALLY)).await })
    };
    guard.release().await.expect("release");
    let second = second
        .await
        .expect("join")
        .expect("served once the local holder released");
    assert_eq!(
        manager.held_lock_count(),
        1,
        "one acquisition, not a stacked pair"
    );
    second.release().await.expect("release");
    assert!(!manager.is_held(&key).await);
}

/// Sibling futures of one task that want the same key take turns, like separate tasks: every
/// one runs, none fails, and no two are inside at once.
pub async fn sibling_futures_of_one_task_take_turns(manager: &Manager) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const SIBLINGS: usize = 48;
    let keys = [key("siblings-a"), key("siblings-b"), key("siblings-c")];
    let inside: [AtomicUsize; 3] = Default::default();
    let most = AtomicUsize::new(0);
    let ran = AtomicUsize::new(0);
    let siblings = (0..SIBLINGS).map(|i| {
        let (key, inside, most, ran) = (&keys[i % 3], &inside[i % 3], &most, &ran);
        async move {
            manager
                .with_lock(key.as_str(), Some(EVENTUALLY), |_| async move {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    ran.fetch_add(1, Ordering::SeqCst);
                })
                .await
        }
    });
    for outcome in join_all(siblings.collect()).await {
        outcome.expect("a sibling queues for the key instead of failing");
    }
    assert_eq!(ran.load(Ordering::SeqCst), SIBLINGS, "every sibling ran");
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "siblings on a key never overlap"
    );
    // The same with guards held across an await, picked by `select!`.
    let key = key("siblings-select");
    let guard = manager.acquire(&key, None).await.expect("acquire");
    let waiting = manager.acquire(&key, Some(EVENTUALLY));
    let release = async {
        tokio::task::yield_now().await;
        guard.release().await
    };
    let (second, released) = tokio::join!(waiting, release);
    released.expect("release");
    let second = second.expect("the sibling got the key once the first let go");
    tokio::select! {
        biased;
        _ = manager.acquire(&key, None) => panic!("the key is still held"),
        () = tokio::time::sleep(Duration::from_millis(20)) => {}
    }
    second.release().await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}

/// Asking for a key inside the critical section of the same key fails at once with
/// [`Error::Reentrant`], through every entry point and mode; other keys, and the key outside
/// the section, are served as usual.
pub async fn a_nested_acquisition_fails_at_once(manager: &Manager) {
    let other = key("nested-other");
    let key = key("nested");
    let outcome = manager
        .with_lock(key.as_str(), Some(EVENTUALLY), |_| async {
            for (what, nested) in every_entry_point(manager, &key) {
                expect_reentrant(at_once(nested).await, &key, what);
            }
            // A join! inside the section is inside it too.
            let (nested, unrelated) = tokio::join!(
                at_once(manager.acquire(key.as_str(), None)),
                manager.acquire(other.as_str(), Some(EVENTUALLY)),
            );
            expect_reentrant(nested.map(drop), &key, "acquire in a join! of the body");
            unrelated
                .expect("another key is served inside the section")
                .release()
                .await
                .expect("release");
        })
        .await;
    outcome.expect("the section itself ran");
    // Once the section is over, the key is served again.
    manager
        .with_lock(key.as_str(), Some(EVENTUALLY), |_| async {})
        .await
        .expect("the key after the section");
    assert_eq!(manager.held_lock_count(), 0);
}

/// An acquisition of `key` through every entry point of the extension, each named.
fn every_entry_point<'a>(
    manager: &'a Manager,
    key: &'a str,
) -> Vec<(&'static str, CaseResult<'a>)> {
    vec![
        (
            "acquire",
            Box::pin(async move { manager.acquire(key, None).await.map(drop) }),
        ),
        (
            "acquire_shared",
            Box::pin(async move { manager.acquire_shared(key, None).await.map(drop) }),
        ),
        (
            "try_acquire",
            Box::pin(async move { manager.try_acquire(key).await.map(drop) }),
        ),
        (
            "try_acquire_shared",
            Box::pin(async move { manager.try_acquire_shared(key).await.map(drop) }),
        ),
        (
            "with_lock",
            Box::pin(manager.with_lock(key, None, |_| async {})),
        ),
        (
            "with_lock_shared",
            Box::pin(manager.with_lock_shared(key, None, |_| async {})),
        ),
        (
            "try_with_lock",
            Box::pin(async move { manager.try_with_lock(key, |_| async {}).await.map(drop) }),
        ),
        (
            "try_with_lock_shared",
            Box::pin(async move {
                manager
                    .try_with_lock_shared(key, |_| async {})
                    .await
                    .map(drop)
            }),
        ),
    ]
}

/// A boxed acquisition whose guard, if any, is already dropped.
type CaseResult<'a> = Pin<Box<dyn Future<Output = pglock::Result<()>> + Send + 'a>>;

fn expect_reentrant(result: pglock::Result<()>, key: &str, what: &str) {
    match result {
        Err(Error::Reentrant { key: named }) => assert_eq!(named, key, "{what}"),
        other => panic!("{what}: expected Reentrant, got {other:?}"),
    }
}

/// A guard held in a plain variable is not a critical section: a second acquisition of its key
/// from the same code queues behind it, as a second `lock()` of a `tokio::sync::Mutex` does,
/// and is served once the guard lets go.
pub async fn a_bare_guard_queues_its_own_second_acquisition(manager: &Manager) {
    let key = key("bare-guard");
    let guard = manager.acquire(&key, None).await.expect("acquire");
    let err = manager
        .acquire(&key, Some(Duration::from_millis(50)))
        .await
        .expect_err("queued behind the guard until the deadline");
    assert!(err.is_timeout(), "{err:?}");
    let (second, released) = tokio::join!(manager.acquire(&key, Some(EVENTUALLY)), async {
        tokio::task::yield_now().await;
        guard.release().await
    });
    released.expect("release");
    second
        .expect("served once the guard let go")
        .release()
        .await
        .expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}
