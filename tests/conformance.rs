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
