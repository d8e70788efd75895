//! The cases of the Python original's conformance suite.

use std::time::Duration;

use pglock::{Error, LockManagerExt, LockMode, lock_id};

use super::*;

/// Case 1: the guard describes the key, its lock id and the manager's holder id.
pub async fn acquire_yields_info_for_the_requested_key(manager: &Manager) {
    let key = key("info");
    let before = chrono::Utc::now();
    let guard = manager
        .acquire(key.as_str(), None)
        .await
        .expect("acquire a free key");
    let info = guard.info();
    assert_eq!(info.key, key.as_str());
    assert_eq!(info.key.to_string(), key);
    assert_eq!(info.lock_id, lock_id(&key));
    assert_eq!(&*info.holder_id, manager.holder_id());
    assert_eq!(info.mode, LockMode::Exclusive);
    assert!(
        info.acquired_at >= before,
        "acquired_at is the time of the grant"
    );
    guard.release().await.expect("the release was confirmed");
}

/// Case 2: `is_held` and `held_lock_count` follow the guard's life.
pub async fn is_held_inside_and_outside_the_critical_section(manager: &Manager) {
    let key = key("is-held");
    assert!(!manager.is_held(&key).await);
    let guard = manager.acquire(&key, None).await.expect("acquire");
    assert!(manager.is_held(&key).await);
    assert_eq!(manager.held_lock_count(), 1);
    guard.release().await.expect("release");
    assert!(!manager.is_held(&key).await);
    assert_eq!(manager.held_lock_count(), 0);
}

/// Case 3: an error leaving the critical section early propagates unchanged, and the lock is
/// released on the way out.
pub async fn error_in_the_critical_section_propagates_and_releases(manager: &Manager) {
    #[derive(Debug, PartialEq)]
    struct Failure(u128);

    async fn critical_section(manager: &Manager, key: &str, marker: u128) -> Result<(), Failure> {
        let _guard = manager.acquire(key, None).await.expect("acquire");
        Err(Failure(marker))?;
        unreachable!("the critical section failed")
    }

    let key = key("error");
    let marker = uuid::Uuid::new_v4().as_u128();
    let err = critical_section(manager, &key, marker)
        .await
        .expect_err("the critical section fails");
    assert_eq!(
        err,
        Failure(marker),
        "the very error of the critical section"
    );
    // The dropped guard releases in the background; a new acquisition is served once it has.
    let again = manager
        .acquire(&key, Some(EVENTUALLY))
        .await
        .expect("the dropped guard let the key go");
    again.release().await.expect("release");
}

/// Case 4: `try_acquire` takes a free key and refuses a held one, also when this very manager
/// holds it.
pub async fn try_acquire_succeeds_on_a_free_key_and_fails_on_a_held_one(manager: &Manager) {
    let key = key("try");
    let guard = manager
        .try_acquire(&key)
        .await
        .expect("try_acquire")
        .into_handle()
        .expect("a free key is granted");
    assert_eq!(guard.info().key, key.as_str());
    assert_eq!(&*guard.info().holder_id, manager.holder_id());
    let again = manager.try_acquire(&key).await.expect("try_acquire");
    assert!(
        again.into_handle().is_none(),
        "a held key is refused, even to its holder"
    );
    assert_eq!(
        manager.held_lock_count(),
        1,
        "a refused try registers nothing"
    );
    guard.release().await.expect("release");
}

/// Case 5: a released key can be taken again.
pub async fn release_makes_the_key_acquirable_again(manager: &Manager) {
    let key = key("release");
    hold(manager, &key).await;
    manager.release(&key).await.expect("release");
    assert!(!manager.is_held(&key).await);
    hold(manager, &key).await;
    manager.release(&key).await.expect("release");
}

/// Case 6: releasing a key that was never held is [`Error::NotHeld`] naming the key.
pub async fn release_of_a_never_held_key_is_not_held(manager: &Manager) {
    let key = key("never-held");
    match manager.release(&key).await {
        Err(Error::NotHeld { key: named }) => assert_eq!(named, key.as_str()),
        other => panic!("expected Error::NotHeld, got {other:?}"),
    }
    let err = manager.release(&key).await.expect_err("still not held");
    assert_eq!(
        err.to_string(),
        format!("Lock '{key}' is not held by this session")
    );
}

/// Case 7: a bounded acquisition of a held key fails with a timeout that names the key and the
/// requested timeout.
pub async fn acquire_with_timeout_on_a_held_key_times_out(manager: &Manager) {
    let key = key("timeout");
    hold(manager, &key).await;
    let timeout = Duration::from_millis(50);
    let err = acquire_elsewhere(manager, &key, LockMode::Exclusive, Some(timeout))
        .await
        .expect_err("the key is held");
    match &err {
        Error::Timeout {
            key: named,
            timeout: reported,
        } => {
            assert_eq!(named, key.as_str());
            assert_eq!(*reported, timeout);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(err.is_timeout());
    assert_eq!(err.key(), key.as_str());
    assert_eq!(
        err.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.05s")
    );
    manager.release(&key).await.expect("release");
}

/// Case 8: holding one key does not affect another.
pub async fn different_keys_are_independent(manager: &Manager) {
    let alpha = key("alpha");
    let beta = key("beta");
    let outer = manager.acquire(&alpha, None).await.expect("alpha");
    let inner = manager
        .acquire(&beta, Some(EVENTUALLY))
        .await
        .expect("beta while alpha is held");
    assert_eq!(manager.held_lock_count(), 2);
    inner.release().await.expect("release beta");
    assert!(manager.is_held(&alpha).await, "alpha outlives beta");
    outer.release().await.expect("release alpha");
}

/// Case 9: `release_all` releases everything and says how much.
pub async fn release_all_returns_the_count_and_empties_the_registry(manager: &Manager) {
    assert_eq!(manager.release_all().await.expect("release_all"), 0);
    let (one, two) = (key("all-1"), key("all-2"));
    hold(manager, &one).await;
    hold(manager, &two).await;
    assert_eq!(manager.held_lock_count(), 2);
    assert_eq!(manager.release_all().await.expect("release_all"), 2);
    assert_eq!(manager.held_lock_count(), 0);
    assert!(!manager.is_held(&one).await && !manager.is_held(&two).await);
    hold(manager, &one).await;
    manager.release(&one).await.expect("release");
}
