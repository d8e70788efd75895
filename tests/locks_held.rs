//! `held_locks` on tokio's paused clock: the in-memory manager's ages are exactly the time the
//! test let pass, a key handed to the next caller counts from the handover, and nothing
//! released, waiting or lost is listed. (The conformance suite checks the same listing on both
//! managers against a running clock.)

use std::time::Duration;

use pglock::{HeldLock, InMemoryLockManager, LockMode};
use tokio::time::advance;

/// The listing as (key, mode, held for).
async fn listed(locks: &InMemoryLockManager) -> Vec<(String, LockMode, Duration)> {
    locks
        .held_locks()
        .await
        .into_iter()
        .map(|HeldLock { info, held_for, .. }| (info.key.to_string(), info.mode, held_for))
        .collect()
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[tokio::test(start_paused = true)]
async fn ages_are_the_time_that_passed_oldest_first() {
    use LockMode::{Exclusive, Shared};
    let locks = InMemoryLockManager::new();
    let first = locks.acquire("first", None).await.expect("acquire");
    advance(secs(5)).await;
    locks
        .try_acquire_shared("second")
        .await
        .expect("try")
        .leak()
        .expect("free");
    advance(secs(2)).await;
    assert_eq!(
        listed(&locks).await,
        [
            ("first".to_owned(), Exclusive, secs(7)),
            ("second".to_owned(), Shared, secs(2)),
        ]
    );
    advance(secs(3)).await;
    assert_eq!(
        listed(&locks).await,
        [
            ("first".to_owned(), Exclusive, secs(10)),
            ("second".to_owned(), Shared, secs(5)),
        ]
    );
    first.release().await.expect("release");
    assert_eq!(
        listed(&locks).await,
        [("second".to_owned(), Shared, secs(5))]
    );
}

#[tokio::test(start_paused = true)]
async fn a_handed_over_key_counts_from_the_handover() {
    let locks = InMemoryLockManager::new();
    let first = locks.acquire("job", None).await.expect("acquire");
    let first_token = first.info().fencing_token;
    let mut waiting = Box::pin(locks.acquire("job", None));
    let polled = futures_poll_once(waiting.as_mut()).await;
    assert!(polled.is_none(), "the second caller queues");
    // Within the manager's handoff limits (a few milliseconds), the lock is handed over
    // without going back to the server.
    let before = Duration::from_millis(5);
    advance(before).await;
    assert_eq!(
        listed(&locks).await,
        [("job".to_owned(), LockMode::Exclusive, before)]
    );
    first.release().await.expect("release");
    let second = waiting.await.expect("handed over");
    advance(secs(1)).await;
    let held = locks.held_locks().await;
    assert_eq!(held.len(), 1);
    assert_eq!(&held[0].info, second.info(), "the new acquisition");
    assert_eq!(held[0].held_for, secs(1), "counted from the handover");
    assert!(second.info().fencing_token > first_token);
}

#[tokio::test(start_paused = true)]
async fn lost_and_released_locks_are_not_listed() {
    let locks = InMemoryLockManager::new();
    let lost = locks.acquire("lost", None).await.expect("acquire");
    locks
        .try_acquire("released")
        .await
        .expect("try")
        .leak()
        .expect("free");
    advance(secs(1)).await;
    assert!(locks.simulate_loss("lost").await);
    assert_eq!(
        listed(&locks).await,
        [("released".to_owned(), LockMode::Exclusive, secs(1))]
    );
    locks.release("released").await.expect("release");
    assert!(locks.held_locks().await.is_empty());
    drop(lost);
}

/// Polls a future once, so it reaches its first await point.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
