//! Semaphores over the port: a permit is a slot lock, at most N are out, a permit given back is
//! handed out again, the next waiter stands at the turnstile, and deadlines, cancellation and
//! a manager taking locks away leave nothing behind.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use pglock::semaphore::{self, Permit, Semaphore};
use pglock::{Attempt, Error, LockKey, LockManagerExt, LossCause};
use tokio::time::Instant;

use super::*;

/// A semaphore of `permits` on `manager`, with a name no other run uses.
fn semaphore(manager: &Manager, case: &str, permits: usize) -> Semaphore {
    Semaphore::builder(Arc::clone(manager), key(case), permits)
        .build()
        .expect("a valid semaphore")
}

/// The semaphore's turnstile, as a key.
fn turnstile(semaphore: &Semaphore) -> LockKey {
    LockKey::name(Semaphore::turnstile_key(semaphore.name()))
}

/// Waits until `condition` holds, failing the case after [`EVENTUALLY`]. For states another
/// task reaches (a waiter in line, a dropped guard's background release done) that no signal
/// announces.
async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + EVENTUALLY;
    while !condition().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until the manager holds exactly `count` locks.
async fn settled(manager: &Manager, count: usize) {
    until(&format!("the manager holds {count} locks"), || async {
        manager.held_lock_count() == count
    })
    .await;
}

/// Polls `future` until it is ready or has been polled `polls` times (each poll after a wake,
/// so each one resumes it at its next await point); `None` when it was stopped unfinished.
async fn poll_at_most<F: Future + Unpin>(future: &mut F, polls: usize) -> Option<F::Output> {
    let mut seen = 0;
    std::future::poll_fn(|cx| {
        if seen == polls {
            return Poll::Ready(None);
        }
        seen += 1;
        Pin::new(&mut *future).poll(cx).map(Some)
    })
    .await
}

/// Every permit of `semaphore`, each taken once it is free: dropped permits and guards are
/// given back in the background.
async fn take_all(semaphore: &Semaphore) -> Vec<Permit> {
    let mut permits = Vec::new();
    for _ in 0..semaphore.permits() {
        let permit = semaphore.acquire(Some(EVENTUALLY)).await;
        permits.push(permit.expect("a free permit (or one given back in the background)"));
    }
    permits
}

/// A semaphore of N hands out N permits on N distinct slots, each the lock of its slot's key,
/// and no more; a permit given back is handed out again.
pub async fn a_semaphore_hands_out_at_most_its_permits(manager: &Manager) {
    let semaphore = semaphore(manager, "semaphore-permits", 3);
    let mut permits = Vec::new();
    for _ in 0..3 {
        let permit = semaphore.try_acquire().await.expect("try_acquire");
        permits.push(permit.into_handle().expect("a free permit, at once"));
    }
    let mut slots: Vec<usize> = permits.iter().map(Permit::slot).collect();
    slots.sort_unstable();
    assert_eq!(slots, [0, 1, 2]);
    for permit in &permits {
        let slot_key = Semaphore::slot_key(semaphore.name(), permit.slot());
        assert_eq!(permit.info().key, LockKey::name(slot_key.as_str()));
        assert!(manager.is_held(slot_key).await, "a permit holds its slot");
    }
    assert!(
        matches!(semaphore.try_acquire().await.expect("try"), Attempt::Busy),
        "a fourth permit of three"
    );
    assert_eq!(manager.held_lock_count(), 3, "the turnstile was let go");

    let given_back = permits.pop().expect("three permits");
    let slot = given_back.slot();
    given_back.release().await.expect("release");
    let again = semaphore.try_acquire().await.expect("try").into_handle();
    assert_eq!(again.as_ref().map(Permit::slot), Some(slot));
    assert_eq!(manager.release_all().await.expect("release_all"), 3);
    drop(again);
    assert!(matches!(
        Semaphore::builder(Arc::clone(manager), "none", 0).build(),
        Err(semaphore::Error::InvalidPermits { permits: 0, .. })
    ));
    let many = Semaphore::builder(Arc::clone(manager), "many", Semaphore::MAX_PERMITS + 1);
    assert!(many.build().is_err());
}

/// A caller that waits stands at the turnstile and takes the next permit given back, whether
/// its holder released it or dropped it.
pub async fn a_semaphore_waiter_takes_the_next_permit_given_back(manager: &Manager) {
    let semaphore = semaphore(manager, "semaphore-waiter", 1);
    let line = turnstile(&semaphore);
    for dropped in [false, true] {
        let permit = semaphore
            .try_acquire()
            .await
            .expect("try")
            .into_handle()
            .expect("free");
        let waiter = {
            let semaphore = semaphore.clone();
            tokio::spawn(async move { semaphore.acquire(Some(EVENTUALLY)).await })
        };
        until("the waiter stands at the turnstile", || {
            manager.is_held(&line)
        })
        .await;
        assert!(!waiter.is_finished(), "no permit is free yet");
        if dropped {
            drop(permit);
        } else {
            permit.release().await.expect("release");
        }
        let next = waiter
            .await
            .expect("the waiter")
            .expect("the permit given back");
        assert_eq!(next.slot(), 0);
        assert!(
            !manager.is_held(&line).await,
            "the waiter left the turnstile"
        );
        next.release().await.expect("release");
    }
    assert_eq!(manager.held_lock_count(), 0);
}

/// With every permit out, `acquire` gives up at its deadline, never before, with a timeout
/// naming the turnstile, and lets the turnstile go; a zero deadline is one look, which takes
/// a free permit.
pub async fn a_semaphore_acquire_gives_up_at_its_deadline(manager: &Manager) {
    let semaphore = semaphore(manager, "semaphore-deadline", 2);
    let first = semaphore.acquire(Some(Duration::ZERO)).await;
    let first = first.expect("a zero deadline takes a free permit");
    let second = semaphore.acquire(Some(Duration::ZERO)).await;
    let permits = [first, second.expect("and the last free one")];
    for timeout in [Duration::ZERO, Duration::from_millis(150)] {
        let started = Instant::now();
        let err = semaphore
            .acquire(Some(timeout))
            .await
            .expect_err("every permit is out");
        let elapsed = started.elapsed();
        match err {
            Error::Timeout { key, timeout: told } => {
                assert_eq!((key, told), (turnstile(&semaphore), timeout));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(
            elapsed >= timeout,
            "gave up after {elapsed:?} of {timeout:?}"
        );
        assert!(
            elapsed < timeout + EVENTUALLY,
            "{timeout:?} took {elapsed:?}"
        );
        // Past the deadline the turnstile is let go in the background.
        settled(manager, 2).await;
        assert!(!manager.is_held(&turnstile(&semaphore)).await);
    }
    drop(permits);
    settled(manager, 0).await;
}

/// An `acquire` dropped at any await point, with permits free or all out, takes no permit and
/// keeps no place in line.
pub async fn a_cancelled_semaphore_acquire_leaks_nothing(manager: &Manager) {
    let semaphore = semaphore(manager, "semaphore-cancel", 2);
    let mut finished = false;
    for polls in 0..200 {
        let mut acquire = Box::pin(semaphore.acquire(Some(EVENTUALLY)));
        if let Some(permit) = poll_at_most(&mut acquire, polls).await {
            permit
                .expect("a free permit")
                .release()
                .await
                .expect("release");
            finished = true;
            break;
        }
        drop(acquire);
        settled(manager, 0).await;
    }
    assert!(finished, "an uncancelled acquire finishes");

    // Every permit out: cancel the waiter at the turnstile, and one behind it, mid-wait.
    let permits = take_all(&semaphore).await;
    let line = turnstile(&semaphore);
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let semaphore = semaphore.clone();
            tokio::spawn(async move { semaphore.acquire(None).await })
        })
        .collect();
    until("a waiter stands at the turnstile", || {
        manager.is_held(&line)
    })
    .await;
    for waiter in waiters {
        waiter.abort();
        assert!(waiter.await.expect_err("aborted").is_cancelled());
    }
    settled(manager, 2).await;
    drop(permits);
    settled(manager, 0).await;
    let all = take_all(&semaphore).await;
    assert_eq!(all.len(), 2, "no permit leaked");
}

/// A permit is told when its slot goes (here, `release_all`), and work it runs is cancelled.
pub async fn a_permit_is_told_when_its_slot_is_taken_away(manager: &Manager) {
    let semaphore = semaphore(manager, "semaphore-loss", 1);
    let permit = semaphore
        .try_acquire()
        .await
        .expect("try")
        .into_handle()
        .expect("free");
    assert!(!permit.loss_signal().is_lost());
    let work = permit.run(async {
        assert_eq!(manager.release_all().await.expect("release_all"), 1);
        std::future::pending::<()>().await
    });
    match tokio::time::timeout(EVENTUALLY, work).await {
        Ok(Err(Error::LockLost { cause, .. })) => assert_eq!(cause, LossCause::ReleasedAll),
        other => panic!("the permit's work is cancelled when its slot goes, got {other:?}"),
    }
    assert_eq!(permit.loss_signal().cause(), Some(LossCause::ReleasedAll));
    let again = semaphore.try_acquire().await.expect("try");
    assert!(
        matches!(again, Attempt::Acquired(_)),
        "the slot is free again"
    );
}
