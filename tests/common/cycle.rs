//! A lock-order cycle through two managers, as two replicas make one: each, inside a section
//! on its own key, asks for the other's.

use std::sync::Arc;
use std::time::Duration;

use pglock::{Error, PostgresLockManager};
use tokio::sync::Barrier;

/// `a` holds a key and asks for `b`'s, `b` holds its key and asks for `a`'s, each inner wait
/// bounded by `deadline`: the two outcomes, `a`'s first.
pub async fn between(
    a: &PostgresLockManager,
    b: &PostgresLockManager,
    deadline: Option<Duration>,
) -> [pglock::Result<()>; 2] {
    let (x, y) = (super::key("cycle-x"), super::key("cycle-y"));
    let both_hold = Arc::new(Barrier::new(2));
    let transfer = |locks: PostgresLockManager, first: String, second: String| {
        let both_hold = Arc::clone(&both_hold);
        tokio::spawn(async move {
            let inner = locks.clone();
            locks
                .with_lock(first.as_str(), None, |_| async move {
                    both_hold.wait().await;
                    inner
                        .with_lock(second.as_str(), deadline, |_| async {})
                        .await
                })
                .await?
        })
    };
    let one = transfer(a.clone(), x.clone(), y.clone());
    let other = transfer(b.clone(), y, x);
    [one.await.expect("task"), other.await.expect("task")]
}

/// How many of `outcomes` are `Deadlock`.
pub fn deadlocks(outcomes: &[pglock::Result<()>]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, Err(Error::Deadlock { .. })))
        .count()
}
