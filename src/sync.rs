//! Small synchronisation helpers.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::{Mutex, MutexGuard};
use std::task::Poll;

/// Locks `mutex`, carrying on after a panic of another holder. Every mutex locked this way
/// guards a critical section that only moves values around, so a panic cannot leave its data
/// half-changed, and refusing to go on would turn one panic into a dead manager.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Which of two futures finished first.
pub(crate) enum First<A, B> {
    Left(A),
    Right(B),
}

/// Polls `left`, then `right`, until one of them finishes, and drops the other. Biased towards
/// `left`, so an end or a stop wins over work that completes at the same moment.
pub(crate) async fn first<A: Future, B: Future>(left: A, right: B) -> First<A::Output, B::Output> {
    let (mut left, mut right) = (pin!(left), pin!(right));
    poll_fn(|cx| {
        if let Poll::Ready(value) = left.as_mut().poll(cx) {
            return Poll::Ready(First::Left(value));
        }
        right.as_mut().poll(cx).map(First::Right)
    })
    .await
}
