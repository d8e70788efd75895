//! Both managers shipped by the crate pass the conformance suite, the PostgreSQL one against a
//! real server.

mod common;

mod in_memory {
    pglock_testing::conformance_tests!(|| async {
        pglock::InMemoryLockManager::builder()
            .holder_id("conformance-memory")
            .build()
    });
}

mod postgres {
    pglock_testing::conformance_tests!(|| async {
        pglock::PostgresLockManager::builder(crate::common::pool(4).await)
            .holder_id("conformance-postgres")
            .build()
    });
}

// With no span wanted and no metrics kept, the managers take their quiet path (no clock read
// but a deadline's, nothing recorded), which is what a build without the `metrics` feature runs.
mod in_memory_quiet {
    pglock_testing::conformance_tests!(|| async {
        pglock::InMemoryLockManager::builder()
            .tracing(false)
            .metrics(false)
            .build()
    });
}

mod postgres_quiet {
    pglock_testing::conformance_tests!(|| async {
        pglock::PostgresLockManager::builder(crate::common::pool(4).await)
            .tracing(false)
            .metrics(false)
            .build()
    });
}

#[tokio::test]
async fn run_all_runs_every_case_on_a_shared_server() {
    let server = pglock::InMemoryLockServer::new();
    pglock_testing::conformance::run_all(|| {
        let server = server.clone();
        async move {
            pglock::InMemoryLockManager::builder()
                .server(&server)
                .build()
        }
    })
    .await;
}

// The cases across managers: two managers of one backend, each a holder of its own, with a hook
// that takes a lock away from one of them behind its back.

/// Two in-memory managers on one server, configured by `configure` (given the peer's name); a
/// lock is taken away with `simulate_loss`.
fn memory_peers(
    configure: fn(pglock::InMemoryLockManagerBuilder, &str) -> pglock::InMemoryLockManagerBuilder,
) -> pglock_testing::conformance::Peers {
    let server = pglock::InMemoryLockServer::new();
    let managers = ["a", "b"].map(|peer| {
        configure(pglock::InMemoryLockManager::builder().server(&server), peer).build()
    });
    let handles = managers.clone();
    pglock_testing::conformance::Peers::new(managers).take_away_with(move |peer, key| {
        let manager = handles[peer].clone();
        async move {
            assert!(manager.simulate_loss(key).await, "the peer held the key");
        }
    })
}

/// Two PostgreSQL managers on separate pools of the test database, configured by `configure`
/// (given the peer's name); a lock is taken away by terminating the session that holds it.
async fn postgres_peers(
    configure: fn(pglock::PostgresLockManagerBuilder, &str) -> pglock::PostgresLockManagerBuilder,
) -> pglock_testing::conformance::Peers {
    let a = configure(
        pglock::PostgresLockManager::builder(common::pool(4).await),
        "a",
    )
    .build();
    let b = configure(
        pglock::PostgresLockManager::builder(common::pool(4).await),
        "b",
    )
    .build();
    let admin = common::pool(1).await;
    pglock_testing::conformance::Peers::new([a, b]).take_away_with(move |_, key| {
        let admin = admin.clone();
        async move {
            let ended = pglock_testing::conformance::terminate_holders(&admin, &key)
                .await
                .expect("terminate the holder's session");
            assert_eq!(ended, 1, "one session held {key}");
        }
    })
}

mod in_memory_peers {
    pglock_testing::conformance_peer_tests!(
        || async {
            crate::memory_peers(|builder, peer| {
                builder.holder_id(format!("conformance-memory-{peer}"))
            })
        },
        take_away
    );
}

mod in_memory_quiet_peers {
    pglock_testing::conformance_peer_tests!(
        || async { crate::memory_peers(|builder, _| builder.tracing(false).metrics(false)) },
        take_away
    );
}

mod postgres_peers {
    pglock_testing::conformance_peer_tests!(
        || crate::postgres_peers(|builder, peer| {
            builder.holder_id(format!("conformance-postgres-{peer}"))
        }),
        take_away
    );
}

mod postgres_quiet_peers {
    pglock_testing::conformance_peer_tests!(
        || crate::postgres_peers(|builder, _| builder.tracing(false).metrics(false)),
        take_away
    );
}

#[tokio::test]
async fn run_all_peers_runs_every_case_across_managers() {
    pglock_testing::conformance::run_all_peers(|| async {
        memory_peers(|builder, _| builder.tracing(false))
    })
    .await;
}
