//! Several keys at once (`acquire_all`, `with_locks`): all or nothing under one deadline, an
//! order that overlapping sets cannot deadlock on, one loss signal for the set, and nothing
//! left held by a cancelled acquisition.

use std::time::Duration;

use pglock::{Error, LockManagerExt, LossCause};

use super::*;

/// Three keys of one case.
fn three(case: &str) -> Vec<String> {
    (0..3).map(|i| key(&format!("{case}-{i}"))).collect()
}

/// Whether the manager holds any of `keys`.
async fn holds_any(manager: &Manager, keys: &[String]) -> bool {
    for key in keys {
        if manager.is_held(key).await {
            return true;
        }
    }
    false
}

/// A set one of whose keys is held by another task times out, naming that key, and leaves
/// none of the others held; once it is free the whole set is taken, and released together.
pub async fn several_keys_are_taken_all_or_nothing(manager: &Manager) {
    let keys = three("set-all");
    let blocker = acquire_elsewhere(manager, &keys[1], LockMode::Exclusive, None)
        .await
        .expect("another task takes one key");
    for timeout in [Duration::ZERO, Duration::from_millis(50)] {
        let err = manager
            .acquire_all(keys.iter().rev(), Some(timeout))
            .await
            .expect_err("one key is held");
        match &err {
            Error::Timeout { key, timeout: t } => {
                assert_eq!(key.to_string(), keys[1], "the held key is named");
                assert_eq!(*t, timeout, "with the caller's whole timeout");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert_eq!(manager.held_lock_count(), 1, "only the other task's lock");
    }
    blocker.release().await.expect("release");
    let set = manager
        .acquire_all(keys.iter().rev(), Some(EVENTUALLY))
        .await
        .expect("every key is free");
    assert_eq!(set.len(), 3);
    for key in &keys {
        assert!(manager.is_held(key).await, "{key} is held");
    }
    let mut taken: Vec<String> = set.info().iter().map(|i| i.key.to_string()).collect();
    taken.sort();
    let mut named = keys.clone();
    named.sort();
    assert_eq!(taken, named, "each key once");
    set.release().await.expect("release");
    assert!(!holds_any(manager, &keys).await);
    assert_eq!(manager.held_lock_count(), 0);
}

/// Two tasks take overlapping sets named in opposite orders, over and over, with no deadline:
/// every round completes (the keys are taken in one order, so no cycle forms).
pub async fn overlapping_sets_in_opposite_orders_do_not_deadlock(manager: &Manager) {
    let keys = three("set-overlap");
    let rounds = |names: Vec<String>| {
        let other = Arc::clone(manager);
        tokio::spawn(async move {
            for _ in 0..20 {
                let set = other.acquire_all(&names, None).await.expect("acquire_all");
                tokio::task::yield_now().await;
                set.release().await.expect("release");
            }
        })
    };
    let forward = rounds(keys.clone());
    let backward = rounds(keys.iter().rev().cloned().collect());
    tokio::time::timeout(EVENTUALLY, async {
        forward.await.expect("forward");
        backward.await.expect("backward");
    })
    .await
    .expect("overlapping sets in opposite orders all complete");
    assert_eq!(manager.held_lock_count(), 0);
}

/// An acquisition of a set dropped at any of its await points leaves nothing held.
pub async fn a_cancelled_set_acquisition_leaks_nothing(manager: &Manager) {
    let keys = three("set-cancel");
    let mut polls = 0;
    loop {
        let mut acquiring = Box::pin(manager.acquire_all(&keys, Some(EVENTUALLY)));
        let mut done = None;
        for _ in 0..polls {
            if let Some(set) = futures_poll_once(acquiring.as_mut()).await {
                done = Some(set.expect("acquire_all"));
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(acquiring);
        if let Some(set) = done {
            set.release().await.expect("release");
            break;
        }
        // Whatever it had taken went back: the whole set can be taken again.
        let again = manager
            .acquire_all(&keys, Some(EVENTUALLY))
            .await
            .expect("a cancelled acquisition kept nothing");
        assert_eq!(manager.held_lock_count(), 3);
        again.release().await.expect("release");
        polls += 1;
        assert!(polls < 10_000, "the acquisition never completes");
    }
    assert_eq!(manager.held_lock_count(), 0);
}

/// The set's loss signal fires when any one of its locks goes, and its critical section is
/// cut short.
pub async fn a_set_is_told_when_any_of_its_locks_goes(manager: &Manager) {
    let keys = three("set-loss");
    let set = manager
        .acquire_all(&keys, Some(EVENTUALLY))
        .await
        .expect("acquire_all");
    assert!(!set.loss_signal().is_lost());
    manager.release(&keys[2]).await.expect("release by key");
    let cause = tokio::time::timeout(EVENTUALLY, set.loss_signal().lost())
        .await
        .expect("the set's signal fires");
    assert_eq!(cause, LossCause::Released);
    let cut = set.run(std::future::pending::<()>()).await;
    assert!(
        matches!(cut, Err(Error::LockLost { .. })),
        "the section is cut short: {cut:?}"
    );
    drop(set);
    let again = manager
        .acquire_all(&keys, Some(EVENTUALLY))
        .await
        .expect("the dropped set let its other keys go");
    again.release().await.expect("release");
}

/// `with_locks` runs its body under every key (a nested acquisition of any of them fails at
/// once), then releases them all.
pub async fn with_locks_runs_under_every_key(manager: &Manager) {
    let keys = three("set-with");
    let inner = Arc::clone(manager);
    let nested_keys = keys.clone();
    let seen = manager
        .with_locks(&keys, Some(EVENTUALLY), |infos| async move {
            for key in &nested_keys {
                let nested = at_once(inner.acquire(key.as_str(), None)).await;
                assert!(
                    matches!(nested, Err(Error::Reentrant { .. })),
                    "nested {key}: {nested:?}"
                );
                assert!(inner.is_held(key.as_str()).await);
            }
            infos.len()
        })
        .await
        .expect("with_locks");
    assert_eq!(seen, 3);
    assert!(!holds_any(manager, &keys).await);
    assert_eq!(manager.held_lock_count(), 0);
}

/// A set's release reports a lock of the set that could not be released as its guard would
/// (here one released through the manager meanwhile: [`Error::LockLost`] naming it), and
/// still lets every other lock of the set go.
pub async fn a_set_release_reports_a_lock_it_could_not_release(manager: &Manager) {
    let keys = three("set-release");
    let set = manager
        .acquire_all(&keys, Some(EVENTUALLY))
        .await
        .expect("acquire_all");
    manager.release(&keys[1]).await.expect("release by key");
    let released = set.release().await;
    match &released {
        Err(Error::LockLost { key, cause }) => {
            assert_eq!(key.to_string(), keys[1], "the lock that went is named");
            assert_eq!(*cause, LossCause::Released);
        }
        other => panic!("the set's release must report the lock that went: {other:?}"),
    }
    assert!(!holds_any(manager, &keys).await, "the other locks went too");
    assert_eq!(manager.held_lock_count(), 0);
}
