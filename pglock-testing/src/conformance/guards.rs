//! Guards: each releases only its own acquisition, on every exit, and is told when its lock
//! goes; cancelled operations and deadlines leave nothing behind.

use std::time::Duration;

use pglock::{Error, LockManagerExt, LockMode, LossCause};
use tokio::time::Instant;

use super::*;

/// Dropping a guard releases its lock (in the background): a later acquisition is served.
pub async fn dropping_the_guard_releases(manager: &Manager) {
    let key = key("drop");
    let guard = manager.acquire(&key, None).await.expect("acquire");
    drop(guard);
    let again = manager
        .acquire(&key, Some(EVENTUALLY))
        .await
        .expect("the dropped guard let the key go");
    assert_eq!(manager.held_lock_count(), 1);
    again.release().await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}

/// After `release_all`, a guard is stale: its release reports the lock gone, and neither its
/// release nor its drop touches a newer acquisition of the same key.
pub async fn release_all_invalidates_guards(manager: &Manager) {
    let key = key("release-all-guard");
    let stale = manager.acquire(&key, None).await.expect("acquire");
    assert_eq!(manager.release_all().await.expect("release_all"), 1);
    hold(manager, &key).await;
    match stale.release().await {
        Err(Error::LockLost {
            cause: LossCause::ReleasedAll,
            ..
        }) => {}
        other => panic!("a stale guard reports its lock gone, got {other:?}"),
    }
    assert!(
        manager.is_held(&key).await,
        "the newer acquisition survives"
    );

    manager.release(&key).await.expect("release");
    let stale = manager.acquire(&key, None).await.expect("acquire");
    assert_eq!(manager.release_all().await.expect("release_all"), 1);
    hold(manager, &key).await;
    drop(stale);
    let blocked = acquire_elsewhere(
        manager,
        &key,
        LockMode::Exclusive,
        Some(Duration::from_millis(100)),
    )
    .await;
    assert!(
        blocked
            .expect_err("the newer acquisition still holds the key")
            .is_timeout(),
        "a stale guard's drop released the newer acquisition"
    );
    assert_eq!(manager.held_lock_count(), 1);
    manager
        .release(&key)
        .await
        .expect("the newer acquisition is still registered");
}

/// After `release(key)`, the guard is stale (the Python original's "stale pop" bug, reversed).
pub async fn release_by_key_invalidates_the_guard(manager: &Manager) {
    let key = key("release-key-guard");
    let guard = manager.acquire(&key, None).await.expect("acquire");
    manager
        .release(&key)
        .await
        .expect("release through the registry");
    hold(manager, &key).await;
    let err = guard.release().await.expect_err("a stale release");
    assert!(
        matches!(&err, Error::LockLost { cause: LossCause::Released, key: named } if named == key.as_str()),
        "{err:?}"
    );
    assert!(
        manager.is_held(&key).await,
        "the newer acquisition survives"
    );
    assert_eq!(manager.held_lock_count(), 1);
    manager.release(&key).await.expect("release");
}

/// A lock taken away through the manager (by key, or with `release_all`) fires its guard's
/// loss signal with a cause that says so, and cancels a `with_lock` body; the guard's own
/// release stays silent.
pub async fn a_holder_is_told_when_its_lock_is_taken_away(manager: &Manager) {
    let key = key("told");
    // By key.
    let guard = manager.acquire(&key, None).await.expect("acquire");
    let signal = guard.loss_signal().clone();
    assert!(!signal.is_lost());
    manager.release(&key).await.expect("release by key");
    assert_eq!(signal.cause(), Some(LossCause::Released));
    drop(guard);
    // With release_all, while a with_lock body runs on another task.
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let body = {
        let (other, key) = (Arc::clone(manager), key.clone());
        tokio::spawn(async move {
            other
                .with_lock(key, Some(EVENTUALLY), |_| async move {
                    let _ = entered_tx.send(());
                    std::future::pending::<()>().await;
                })
                .await
        })
    };
    tokio::time::timeout(EVENTUALLY, entered)
        .await
        .expect("the body starts")
        .expect("the body starts");
    assert_eq!(manager.release_all().await.expect("release_all"), 1);
    let ended = tokio::time::timeout(EVENTUALLY, body)
        .await
        .expect("the body is cancelled, not left running")
        .expect("join");
    match ended {
        Err(Error::LockLost {
            cause: LossCause::ReleasedAll,
            key: named,
        }) => assert_eq!(named, key.as_str()),
        other => panic!("expected LockLost(ReleasedAll), got {other:?}"),
    }
    // The guard's own release does not fire its signal.
    let guard = manager.acquire(&key, None).await.expect("acquire");
    let signal = guard.loss_signal().clone();
    guard.release().await.expect("release");
    assert!(!signal.is_lost(), "a guard's own release is silent");
    assert_eq!(manager.held_lock_count(), 0);
}

/// Operations dropped mid-way leave no claim behind.
pub async fn cancelled_operations_leak_nothing(manager: &Manager) {
    let key = key("cancel");
    hold(manager, &key).await;

    // Cancel a waiting acquisition of another task, bounded and unbounded.
    for timeout in [None, Some(EVENTUALLY)] {
        let (other, key) = (Arc::clone(manager), key.clone());
        let mut waiting = tokio::spawn(async move { other.acquire(key, timeout).await });
        let outcome = tokio::time::timeout(Duration::from_millis(20), &mut waiting).await;
        assert!(
            outcome.is_err(),
            "the key is held, so the acquisition waits"
        );
        waiting.abort();
        assert!(waiting.await.expect_err("aborted").is_cancelled());
    }
    // Cancel operations before their first poll, too.
    drop(manager.acquire(&key, None));
    drop(manager.try_acquire(&key));
    drop(manager.release(&key));
    assert_eq!(manager.held_lock_count(), 1);
    assert!(manager.is_held(&key).await);

    manager.release(&key).await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
    let guard = manager
        .acquire(&key, Some(EVENTUALLY))
        .await
        .expect("no cancelled waiter kept a claim on the key");
    guard.release().await.expect("release");

    // A release cancelled after its first poll still releases.
    let guard = manager.acquire(&key, None).await.expect("acquire");
    let mut release = Box::pin(guard.release());
    let _ = futures_poll_once(release.as_mut()).await;
    drop(release);
    let guard = manager
        .acquire(&key, Some(EVENTUALLY))
        .await
        .expect("a cancelled release still let the key go");
    guard.release().await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}

/// Timeouts are deadlines: never early, never unbounded, and zero is one immediate try.
pub async fn deadline_is_honoured(manager: &Manager) {
    let key = key("deadline");
    let guard = manager
        .acquire(&key, Some(Duration::ZERO))
        .await
        .expect("a zero timeout on a free key is one successful try");
    for timeout in [
        Duration::ZERO,
        Duration::from_millis(10),
        Duration::from_millis(150),
    ] {
        let started = Instant::now();
        let err = acquire_elsewhere(manager, &key, LockMode::Exclusive, Some(timeout))
            .await
            .expect_err("the key is held");
        let elapsed = started.elapsed();
        assert!(err.is_timeout(), "expected a timeout, got {err:?}");
        assert!(
            elapsed >= timeout,
            "gave up after {elapsed:?}, before its {timeout:?}"
        );
        assert!(
            elapsed < timeout + EVENTUALLY,
            "a {timeout:?} timeout took {elapsed:?}"
        );
    }
    guard.release().await.expect("release");
}
