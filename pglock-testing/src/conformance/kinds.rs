//! Modes, kinds of keys, and the conveniences built on the port.

use std::time::Duration;

use pglock::{Attempt, Error, LockKey, LockManagerExt, LockMode, lock_id};

use super::*;

/// Shared acquisitions report their mode and release like exclusive ones, through the guard,
/// by key and by `release_all`.
pub async fn shared_acquisition_is_reported_and_released(manager: &Manager) {
    let key = key("shared");
    let guard = manager
        .acquire_shared(&key, None)
        .await
        .expect("acquire_shared");
    assert_eq!(guard.info().mode, LockMode::Shared);
    assert_eq!(guard.info().lock_id, lock_id(&key));
    assert!(manager.is_held(&key).await);
    assert_eq!(manager.held_lock_count(), 1);
    guard.release().await.expect("release");
    assert!(!manager.is_held(&key).await);

    let info = manager
        .try_acquire_shared(&key)
        .await
        .expect("try_acquire_shared")
        .leak()
        .expect("a free key is granted");
    assert_eq!(info.mode, LockMode::Shared);
    manager.release(&key).await.expect("release by key");

    let exclusive = manager.acquire(&key, None).await.expect("acquire");
    assert_eq!(exclusive.info().mode, LockMode::Exclusive);
    exclusive.release().await.expect("release");

    manager
        .try_acquire_shared(&key)
        .await
        .expect("try")
        .leak()
        .expect("free");
    assert_eq!(manager.release_all().await.expect("release_all"), 1);
    assert_eq!(manager.held_lock_count(), 0);
}

/// Within one manager a key is held at most once, whatever the modes: a second acquisition
/// queues behind the first instead of stacking.
pub async fn a_manager_holds_a_key_once_in_either_mode(manager: &Manager) {
    let key = key("once");
    let short = Some(Duration::from_millis(30));
    let shared = manager
        .acquire_shared(&key, None)
        .await
        .expect("acquire_shared");
    assert!(
        manager
            .try_acquire_shared(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    assert!(
        manager
            .try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    for mode in [LockMode::Shared, LockMode::Exclusive] {
        let err = acquire_elsewhere(manager, &key, mode, short)
            .await
            .expect_err("queued behind the local holder");
        assert!(err.is_timeout(), "{mode}: {err:?}");
    }
    assert_eq!(manager.held_lock_count(), 1);
    shared.release().await.expect("release");

    let exclusive = manager.acquire(&key, None).await.expect("acquire");
    assert!(
        manager
            .try_acquire_shared(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    let err = acquire_elsewhere(manager, &key, LockMode::Shared, short)
        .await
        .expect_err("queued behind the local holder");
    assert!(err.is_timeout(), "{err:?}");
    exclusive.release().await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}

/// `try_acquire` hands out a guard on a free key and `None` on a held one, even to its holder;
/// the guard releases like any other, also when dropped.
pub async fn try_acquire_hands_out_a_guard(manager: &Manager) {
    let key = key("try-guard");
    let guard = manager
        .try_acquire(key.as_str())
        .await
        .expect("try_acquire")
        .into_handle()
        .expect("a free key is granted");
    assert_eq!(guard.info().key, key.as_str());
    assert_eq!(guard.info().mode, LockMode::Exclusive);
    assert!(manager.is_held(&key).await);
    assert!(
        manager
            .try_acquire(key.as_str())
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    assert!(
        manager
            .try_acquire_shared(key.as_str())
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    drop(guard);
    let shared = acquire_elsewhere(manager, &key, LockMode::Shared, Some(EVENTUALLY))
        .await
        .expect("the dropped guard let the key go");
    assert_eq!(shared.info().mode, LockMode::Shared);
    shared.release().await.expect("release");
    let shared = manager
        .try_acquire_shared(key.as_str())
        .await
        .expect("try")
        .into_handle()
        .expect("free again");
    shared.release().await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}

/// The Python original's "try, work, then `release(key)`", ported with [`Attempt::leak`] (the
/// form without it does not compile): the lock stays held through the work, until the key is
/// released, and no longer.
pub async fn a_ported_try_keeps_its_lock_until_its_key_is_released(manager: &Manager) {
    let key = key("ported-try");
    let mut worked = false;
    if let Some(info) = manager.try_acquire(key.as_str()).await.expect("try").leak() {
        assert_eq!(info.key, key.as_str());
        // The work runs under the lock: held here, refused to every other try.
        assert!(manager.is_held(&key).await, "held while the work runs");
        let again = manager.try_acquire(key.as_str()).await.expect("try");
        assert!(matches!(again, Attempt::Busy), "{again:?}");
        let elsewhere = acquire_elsewhere(
            manager,
            &key,
            LockMode::Exclusive,
            Some(Duration::from_millis(30)),
        )
        .await;
        assert!(
            elsewhere.as_ref().is_err_and(Error::is_timeout),
            "another holder waits for the ported try's lock: {elsewhere:?}"
        );
        worked = true;
        manager
            .release(key.as_str())
            .await
            .expect("release(key) ends it");
    }
    assert!(worked, "a free key is granted");
    assert!(!manager.is_held(&key).await);
    hold(manager, &key).await;
    manager.release(key.as_str()).await.expect("release");
}

/// Names, raw ids, id pairs and sqlx-derived names are keys of their own: a name that reads
/// like a number is not that number, and each kind acquires, reports and releases.
pub async fn keys_of_every_kind_are_locks_of_their_own(manager: &Manager) {
    let n = i64::from(rand_u32());
    let pair = (rand_u32() as i32, rand_u32() as i32);
    let keys = [
        LockKey::name(n.to_string()),
        LockKey::id(n),
        LockKey::pair(pair.0, pair.1),
        LockKey::sqlx(key("sqlx")),
    ];
    let mut guards = Vec::new();
    for key in &keys {
        let guard = manager
            .acquire(key.clone(), Some(EVENTUALLY))
            .await
            .unwrap_or_else(|err| panic!("{key}: {err}"));
        assert_eq!(&guard.info().key, key);
        assert_eq!(guard.info().lock_id, key.target().packed());
        assert!(manager.is_held(key.clone()).await);
        guards.push(guard);
    }
    assert_eq!(manager.held_lock_count(), keys.len());
    assert!(
        manager
            .try_acquire(keys[1].clone())
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    manager
        .release(keys[1].clone())
        .await
        .expect("release by key");
    assert!(!manager.is_held(keys[1].clone()).await);
    assert!(
        manager.is_held(keys[0].clone()).await,
        "the name is untouched"
    );
    for (i, guard) in guards.into_iter().enumerate() {
        let released = guard.release().await;
        if i == 1 {
            assert!(
                matches!(released, Err(Error::LockLost { .. })),
                "{released:?}"
            );
        } else {
            released.expect("release");
        }
    }
    assert_eq!(manager.held_lock_count(), 0);
}

/// `with_lock_shared` and `try_with_lock` hold the lock for their body and release it after;
/// `try_with_lock` skips its body when the key is held.
pub async fn conveniences_release_on_every_path(manager: &Manager) {
    let key = key("conveniences");
    let mode = manager
        .with_lock_shared(
            key.as_str(),
            Some(EVENTUALLY),
            |info| async move { info.mode },
        )
        .await
        .expect("with_lock_shared");
    assert_eq!(mode, LockMode::Shared);
    assert!(!manager.is_held(&key).await);
    let ran = manager
        .try_with_lock(key.as_str(), |info| async move { info.key })
        .await
        .expect("try_with_lock");
    assert_eq!(ran, Some(LockKey::from(key.as_str())));
    assert!(!manager.is_held(&key).await);
    let held = manager.acquire(&key, None).await.expect("acquire");
    let skipped = manager
        .try_with_lock(key.as_str(), |_| async { panic!("the body must not run") })
        .await
        .expect("try_with_lock");
    assert!(skipped.is_none());
    held.release().await.expect("release");
    assert_eq!(manager.held_lock_count(), 0);
}
