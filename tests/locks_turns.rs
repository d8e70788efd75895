//! Callers of one manager take turns; only true nesting fails.
//!
//! A job processor or a request handler fans out inside one task with `join!`, `select!`,
//! `for_each_concurrent`, `buffer_unordered` or `FuturesUnordered`. Sibling futures that want
//! the same key queue for it in the manager's FIFO, exactly like separate tasks: every item
//! runs, none fails, and no two are inside one key at once. An acquisition made inside the
//! critical section of the same key fails at once with `Error::Reentrant`; a guard held in a
//! plain variable is not a critical section, and a second acquisition of its key waits for it,
//! as with `tokio::sync::Mutex`.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::stream::{self, FuturesUnordered, StreamExt};
use pglock::{Error, PostgresLockManager};

const BOUND: Duration = Duration::from_secs(10);

/// Counts, per key, how many bodies are inside at once, and the most ever seen.
#[derive(Default)]
struct Overlap {
    inside: Mutex<HashMap<String, usize>>,
    most: AtomicUsize,
    ran: AtomicUsize,
}

impl Overlap {
    /// A body's work under `key`: enter, give the other siblings a chance to run, leave.
    async fn work(&self, key: &str) {
        let now = {
            let mut inside = self.inside.lock().unwrap();
            let count = inside.entry(key.to_owned()).or_default();
            *count += 1;
            *count
        };
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await; // the work itself
        *self.inside.lock().unwrap().get_mut(key).unwrap() -= 1;
        self.ran.fetch_add(1, Ordering::SeqCst);
    }

    fn assert_all_ran_alone(&self, items: usize) {
        assert_eq!(self.ran.load(Ordering::SeqCst), items, "every item ran");
        assert_eq!(
            self.most.load(Ordering::SeqCst),
            1,
            "no two items inside one key at once"
        );
    }
}

/// `future`'s output, which must come at once: a nested call that waits for its own section
/// fails the test instead of hanging it.
async fn at_once<F: std::future::Future>(future: F) -> F::Output {
    tokio::time::timeout(BOUND, future)
        .await
        .expect("answered at once, not left waiting for its own section")
}

async fn manager(label: &str) -> PostgresLockManager {
    let app = common::app_name(label);
    common::manager_for(common::pool_named(10, &app).await, &app).build()
}

#[tokio::test]
async fn for_each_concurrent_over_shared_tenants_runs_every_item() {
    let locks = manager("for-each").await;
    let prefix = common::key("tenant");
    let overlap = Overlap::default();
    let errors = Mutex::new(Vec::new());
    stream::iter(0..200)
        .for_each_concurrent(32, |i| {
            let key = format!("{prefix}:{}", i % 20);
            let (overlap, errors, locks) = (&overlap, &errors, &locks);
            async move {
                let outcome = locks
                    .with_lock(key.as_str(), Some(BOUND), |_| overlap.work(&key))
                    .await;
                if let Err(err) = outcome {
                    errors.lock().unwrap().push(err.to_string());
                }
            }
        })
        .await;
    let errors = errors.into_inner().unwrap();
    assert!(
        errors.is_empty(),
        "{} items failed; the first: {:?}",
        errors.len(),
        errors.first()
    );
    overlap.assert_all_ran_alone(200);
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn buffer_unordered_with_guards_runs_every_item() {
    let locks = manager("buffer-unordered").await;
    let prefix = common::key("entity");
    let overlap = Overlap::default();
    let outcomes: Vec<pglock::Result<()>> = stream::iter(0..300)
        .map(|i| {
            let key = format!("{prefix}:{}", i % 7);
            let (overlap, locks) = (&overlap, &locks);
            async move {
                let guard = locks.acquire(key.as_str(), Some(BOUND)).await?;
                overlap.work(&key).await;
                guard.release().await
            }
        })
        .buffer_unordered(48)
        .collect()
        .await;
    for outcome in outcomes {
        outcome.expect("a sibling queues instead of failing");
    }
    overlap.assert_all_ran_alone(300);
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn futures_unordered_of_shared_and_exclusive_sections_runs_every_item() {
    let locks = manager("futures-unordered").await;
    let key = common::key("report");
    let writers = AtomicUsize::new(0);
    let readers = AtomicUsize::new(0);
    let mut pending = FuturesUnordered::new();
    for i in 0..200 {
        let (key, locks, writers, readers) = (&key, &locks, &writers, &readers);
        pending.push(async move {
            if i % 5 == 0 {
                locks
                    .with_lock(key.as_str(), Some(BOUND), |_| async {
                        assert_eq!(writers.fetch_add(1, Ordering::SeqCst), 0, "one writer");
                        assert_eq!(readers.load(Ordering::SeqCst), 0, "no reader with a writer");
                        tokio::task::yield_now().await;
                        writers.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            } else {
                locks
                    .with_lock_shared(key.as_str(), Some(BOUND), |_| async {
                        assert_eq!(writers.load(Ordering::SeqCst), 0, "no writer with a reader");
                        readers.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        readers.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            }
        });
    }
    let mut ran = 0;
    while let Some(outcome) = pending.next().await {
        outcome.expect("every item runs");
        ran += 1;
    }
    assert_eq!(ran, 200);
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn join_and_select_siblings_take_turns() {
    let locks = manager("join-select").await;
    let key = common::key("join");
    let overlap = Overlap::default();
    let section = || locks.with_lock(key.as_str(), Some(BOUND), |_| overlap.work(&key));
    let (a, b, c, d) = tokio::join!(section(), section(), section(), section());
    for outcome in [a, b, c, d] {
        outcome.expect("join! siblings queue");
    }
    overlap.assert_all_ran_alone(4);

    // select!: a sibling waits for the key a guard of the same task holds, and gets it once
    // the guard is released, not a Reentrant error.
    let guard = locks.acquire(key.as_str(), None).await.expect("acquire");
    let waiting = locks.acquire(key.as_str(), Some(BOUND));
    tokio::pin!(waiting);
    tokio::select! {
        got = &mut waiting => panic!("the key is held by the guard: {got:?}"),
        () = tokio::time::sleep(Duration::from_millis(50)) => {}
    }
    guard.release().await.expect("release");
    let second = tokio::select! {
        got = &mut waiting => got.expect("the sibling gets the key"),
        () = tokio::time::sleep(BOUND) => panic!("the sibling was not served"),
    };
    second.release().await.expect("release");
}

#[tokio::test]
async fn nested_sections_fail_at_once_in_every_form() {
    let locks = manager("nested").await;
    let key = common::key("nested");
    let outcome = locks
        .with_lock(key.as_str(), Some(BOUND), |_| async {
            let nested = [
                at_once(locks.with_lock(key.as_str(), None, |_| async {}))
                    .await
                    .err(),
                at_once(locks.try_with_lock(key.as_str(), |_| async {}))
                    .await
                    .err(),
                at_once(locks.with_lock_shared(key.as_str(), None, |_| async {}))
                    .await
                    .err(),
                at_once(locks.acquire(key.as_str(), None)).await.err(),
                at_once(locks.try_acquire_shared(key.as_str())).await.err(),
            ];
            for err in nested {
                assert!(matches!(err, Some(Error::Reentrant { .. })), "{err:?}");
            }
        })
        .await;
    outcome.expect("the outer section ran");
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn a_bare_guard_and_a_second_acquisition_in_one_function_queue_like_a_mutex() {
    let locks = manager("bare").await;
    let key = common::key("bare");
    let guard = locks.acquire(key.as_str(), None).await.expect("acquire");
    let err = locks
        .acquire(key.as_str(), Some(Duration::from_millis(200)))
        .await
        .expect_err("it waits for the guard, here until its deadline");
    assert!(err.is_timeout(), "{err:?}");
    // Wrapped in the guard's critical section, the same mistake is refused at once instead.
    let refused = at_once(guard.run(locks.acquire(key.as_str(), None)))
        .await
        .expect("the lock is still held");
    assert!(
        matches!(refused, Err(Error::Reentrant { .. })),
        "{refused:?}"
    );
    guard.release().await.expect("release");
}
