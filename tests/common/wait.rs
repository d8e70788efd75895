//! Waiting for a state the server reaches on its own time, bounded.

use std::future::Future;
use std::time::Duration;

/// Waits until `condition` holds, checking every 10 ms for up to 15 s.
///
/// Only for states that the server reaches on its own time with no signal to wait on (a
/// backend noticing that its client went away, a waiter showing up in `pg_locks`); it panics
/// with `what` if the state never comes.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long [`within`] waits for a signal before the test fails.
pub const SIGNAL_BOUND: Duration = Duration::from_secs(30);

/// Awaits `signal` (a channel, a task, a loss), panicking with `what` if it has not come
/// within [`SIGNAL_BOUND`], so a regression fails the test instead of hanging it.
pub async fn within<T>(what: &str, signal: impl Future<Output = T>) -> T {
    tokio::time::timeout(SIGNAL_BOUND, signal)
        .await
        .unwrap_or_else(|_| panic!("waited {SIGNAL_BOUND:?} for {what}"))
}
