//! Testing your own code without PostgreSQL, and testing a lock manager of your own.
//!
//! Your service takes an `Arc<dyn LockManager>`; production passes a `PostgresLockManager`,
//! unit tests pass an `InMemoryLockManager`. Managers sharing an `InMemoryLockServer` contend
//! like replicas sharing a database, and `simulate_loss` plays a lost lock. The same file shows
//! the conformance suite, which proves that a `LockManager` keeps the contract.
//!
//! In a real crate the body of `main` would be `#[tokio::test]`s; here it runs as a program:
//!
//! ```text
//! cargo run --example testing_with_memory
//! ```
//!
//! In your own `tests/` you would write, for a manager of your own:
//!
//! ```text
//! pglock_testing::conformance_tests!(|| async { my_crate::MyLockManager::new() });
//! ```

use std::sync::Arc;

use pglock::{InMemoryLockManager, InMemoryLockServer, LockManager, LockManagerExt, LossCause};

/// The code under test: rebuilds a projection, at most once at a time across the fleet.
struct ProjectionRebuilder {
    locks: Arc<dyn LockManager>,
}

impl ProjectionRebuilder {
    /// Rebuilds `projection` if no one else is; returns whether this replica did it.
    async fn rebuild_if_free(&self, projection: &str) -> pglock::Result<bool> {
        let key = format!("rebuild:{projection}");
        // The guard releases the lock when dropped; releasing it explicitly confirms it.
        let pglock::Attempt::Acquired(guard) = self.locks.try_acquire(&key).await? else {
            return Ok(false);
        };
        println!("  rebuilding {projection} as {}", guard.info().holder_id);
        guard.release().await?;
        Ok(true)
    }

    /// Rebuilds `projection`, giving up if the lock is lost half-way.
    async fn rebuild(
        &self,
        projection: &str,
        work: tokio::sync::oneshot::Receiver<()>,
    ) -> pglock::Result<()> {
        self.locks
            .with_lock(&format!("rebuild:{projection}"), None, |_| async move {
                // Stand-in for a long rebuild: it ends when the test says so.
                let _ = work.await;
            })
            .await
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> pglock::Result<()> {
    println!("1. two replicas, one projection: only one rebuilds at a time");
    let server = InMemoryLockServer::new();
    let replica = |name: &str| ProjectionRebuilder {
        locks: Arc::new(
            InMemoryLockManager::builder()
                .server(&server)
                .holder_id(name)
                .build(),
        ),
    };
    let (a, b) = (replica("replica-a"), replica("replica-b"));
    let held = a.locks.acquire("rebuild:orders", None).await?; // a is busy rebuilding
    assert!(
        !b.rebuild_if_free("orders").await?,
        "b must back off while a holds the lock"
    );
    held.release().await?;
    assert!(
        b.rebuild_if_free("orders").await?,
        "b rebuilds once a is done"
    );

    println!("2. a lost lock stops the rebuild");
    let locks = Arc::new(InMemoryLockManager::new());
    let rebuilder = ProjectionRebuilder {
        locks: locks.clone(),
    };
    let (_finish, work) = tokio::sync::oneshot::channel();
    let rebuild = tokio::spawn(async move { rebuilder.rebuild("orders", work).await });
    // Wait until the rebuild holds its lock, then take it away.
    while !locks.is_held("rebuild:orders").await {
        tokio::task::yield_now().await;
    }
    assert!(locks.simulate_loss("rebuild:orders").await);
    match rebuild.await.expect("join") {
        Err(pglock::Error::LockLost { cause, .. }) => {
            assert_eq!(cause, LossCause::Simulated);
            println!("  the rebuild was stopped: {cause}");
        }
        other => panic!("expected LockLost, got {other:?}"),
    }

    println!("3. the conformance suite, on the in-memory manager");
    pglock_testing::conformance::run_all(|| async { InMemoryLockManager::new() }).await;
    println!(
        "  all {} cases passed",
        pglock_testing::conformance::cases().len()
    );
    Ok(())
}
