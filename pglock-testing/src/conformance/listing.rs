//! What a manager says it holds: `held_locks`, its entries and their ages.

use std::collections::HashMap;

use pglock::{HeldLock, LockInfo, LockManagerExt, LockMode};
use tokio::time::Instant;

use super::*;

/// The listing, checked against what the port promises of every listing: as many entries as
/// `held_lock_count`, one per key, the longest held first.
async fn listing(manager: &Manager) -> Vec<HeldLock> {
    let listed = manager.held_locks().await;
    assert_eq!(
        listed.len(),
        manager.held_lock_count(),
        "the listing and the count agree: {listed:?}"
    );
    assert!(
        listed.windows(2).all(|w| w[0].held_for >= w[1].held_for),
        "the longest held first: {listed:?}"
    );
    listed
}

/// The listing as key (as its name) to the listed acquisition's info.
async fn infos(manager: &Manager) -> HashMap<String, LockInfo> {
    let listed = listing(manager).await;
    let infos: HashMap<String, LockInfo> = listed
        .into_iter()
        .map(|held| (held.info.key.to_string(), held.info))
        .collect();
    assert_eq!(infos.len(), manager.held_lock_count(), "one entry per key");
    infos
}

/// `expected`, keyed by name, for comparing with [`infos`].
fn by_key<'a>(expected: impl IntoIterator<Item = &'a LockInfo>) -> HashMap<String, LockInfo> {
    expected
        .into_iter()
        .map(|info| (info.key.to_string(), info.clone()))
        .collect()
}

/// After taking keys, exclusive and shared, through guards and leaked into the registry, the
/// listing has exactly those acquisitions, each with its guard's info (mode included), in the
/// order they were taken; a caller still waiting for a held key adds nothing.
pub async fn the_listing_has_exactly_the_held_keys(manager: &Manager) {
    assert!(
        listing(manager).await.is_empty(),
        "a fresh manager holds nothing"
    );
    let keys: Vec<String> = (1..=4).map(|i| key(&format!("listed-{i}"))).collect();
    let exclusive = manager.acquire(&keys[0], None).await.expect("acquire");
    let shared = manager
        .acquire_shared(&keys[1], None)
        .await
        .expect("acquire_shared");
    let leaked = manager
        .try_acquire(&keys[2])
        .await
        .expect("try_acquire")
        .leak()
        .expect("free");
    let leaked_shared = manager
        .try_acquire_shared(&keys[3])
        .await
        .expect("try_acquire_shared")
        .leak()
        .expect("free");
    let taken = [
        exclusive.info().clone(),
        shared.info().clone(),
        leaked,
        leaked_shared,
    ];
    let modes: Vec<LockMode> = taken.iter().map(|info| info.mode).collect();
    use LockMode::{Exclusive, Shared};
    assert_eq!(modes, [Exclusive, Shared, Exclusive, Shared]);

    // Another caller waiting for a held key is not a holder.
    let mut waiting = Box::pin(manager.acquire_shared(&keys[0], None));
    assert!(
        futures_poll_once(waiting.as_mut()).await.is_none(),
        "it waits"
    );
    let listed = listing(manager).await;
    let infos: Vec<&LockInfo> = listed.iter().map(|held| &held.info).collect();
    assert_eq!(
        infos,
        taken.iter().collect::<Vec<_>>(),
        "exactly the acquisitions made, oldest first"
    );
    drop(waiting);

    assert_eq!(manager.release_all().await.expect("release_all"), 4);
    drop((exclusive, shared));
}

/// Ages are measured, not stamped: each lies between the times the caller saw around the
/// acquisition and the listing, and between two listings an age grows by at least the time
/// that passed between them.
pub async fn held_for_grows_with_the_hold(manager: &Manager) {
    let (old, young) = (key("age-old"), key("age-young"));
    let taking = Instant::now();
    let guard = manager.acquire(&old, None).await.expect("acquire");
    let taken = Instant::now();
    let aged = |listed: &[HeldLock], before: Instant, after: Instant| -> std::time::Duration {
        let held = listed
            .iter()
            .find(|held| held.info.key == old.as_str())
            .unwrap_or_else(|| panic!("{old} is listed: {listed:?}"));
        assert!(
            held.held_for >= before - taken && held.held_for <= after - taking,
            "held for {:?}, outside [{:?}, {:?}]",
            held.held_for,
            before - taken,
            after - taking
        );
        held.held_for
    };
    let before = Instant::now();
    let first = listing(manager).await;
    let after_first = Instant::now();
    let first = aged(&first, before, after_first);

    // Work on the manager (a real round trip for a remote one) lets time pass.
    hold(manager, &young).await;
    let before = Instant::now();
    let second = listing(manager).await;
    let after = Instant::now();
    assert_eq!(second.len(), 2);
    assert_eq!(
        second[1].info.key,
        young.as_str(),
        "the younger comes second"
    );
    let second = aged(&second, before, after);
    assert!(
        second >= first + (before - after_first),
        "the age grew from {first:?} to {second:?}, less than the {:?} between the listings",
        before - after_first
    );
    manager.release(&young).await.expect("release");
    guard.release().await.expect("release");
}

/// Keys released through their guard, by key and with `release_all` leave the listing at once;
/// the others stay, unchanged.
pub async fn released_keys_leave_the_listing(manager: &Manager) {
    let keys: Vec<String> = (1..=4).map(|i| key(&format!("unlisted-{i}"))).collect();
    let guard = manager.acquire(&keys[0], None).await.expect("acquire");
    let mut held = vec![guard.info().clone()];
    for key in &keys[1..] {
        let info = manager
            .try_acquire_shared(key)
            .await
            .expect("try_acquire_shared")
            .leak()
            .expect("free");
        held.push(info);
    }
    assert_eq!(infos(manager).await, by_key(&held));

    guard.release().await.expect("release");
    assert_eq!(
        infos(manager).await,
        by_key(&held[1..]),
        "the guard's release"
    );
    manager.release(&keys[1]).await.expect("release by key");
    assert_eq!(infos(manager).await, by_key(&held[2..]), "release by key");
    assert_eq!(manager.release_all().await.expect("release_all"), 2);
    assert!(listing(manager).await.is_empty(), "release_all");
}

/// A dropped guard's acquisition leaves the listing once the manager has processed the drop
/// (seen as the key being served again); a key handed to the next caller of the manager is a
/// new acquisition, listed with its own info and aged from the handover.
pub async fn a_dropped_or_handed_over_key_is_a_new_acquisition(manager: &Manager) {
    let (kept_key, dropped) = (key("kept"), key("dropped"));
    let kept = manager.acquire(&kept_key, None).await.expect("acquire");
    let guard = manager.acquire(&dropped, None).await.expect("acquire");
    drop(guard);
    let again = manager
        .acquire(&dropped, Some(EVENTUALLY))
        .await
        .expect("the dropped guard let the key go");
    assert_eq!(
        infos(manager).await,
        by_key([kept.info(), again.info()]),
        "the dropped acquisition is gone, the new one listed"
    );

    // Handed over: another caller queues while the key is held, and is served on release.
    let mut waiting = Box::pin(manager.acquire(again.info().key.clone(), Some(EVENTUALLY)));
    assert!(
        futures_poll_once(waiting.as_mut()).await.is_none(),
        "it waits"
    );
    let released = Instant::now();
    again.release().await.expect("release");
    let next = waiting.await.expect("served on release");
    let listed = listing(manager).await;
    let elapsed = released.elapsed();
    let entry = listed
        .iter()
        .find(|held| held.info.key == next.info().key)
        .expect("the new holder is listed");
    assert_eq!(&entry.info, next.info(), "the new acquisition's own info");
    assert!(
        entry.held_for <= elapsed,
        "aged {:?} from before the handover, more than the {elapsed:?} since",
        entry.held_for
    );
    next.release().await.expect("release");
    kept.release().await.expect("release");
    assert!(listing(manager).await.is_empty());
}
