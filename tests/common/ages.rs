//! Holds whose age the inspector reports: managers on one lock session, fenced or not, and a
//! lock session kept busy the way a manager holding many locks keeps it.

use std::time::Duration;

use pglock::{FencingTable, LockManagerExt, PostgresLockManager};
use tokio::time::Instant;

use super::{app_name, hold, key, manager_for, pool_named};

/// The name of a fencing table no other test uses, as a user would type it.
pub fn unique_fencing_table_name() -> String {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
    format!("pglock_test_fence_{suffix}")
}

/// A fencing table no other test uses (created by the first fenced acquisition).
pub fn unique_fencing_table() -> FencingTable {
    FencingTable::new(&unique_fencing_table_name()).expect("a valid name")
}

/// A manager whose holder id is its pool's application name (see `manager_for`), taking every
/// lock it does not wait for on one lock session, fenced with `fencing` if given.
pub async fn one_session_manager(
    label: &str,
    fencing: Option<&FencingTable>,
) -> (PostgresLockManager, String) {
    let app = app_name(label);
    let mut builder = manager_for(pool_named(3, &app).await, &app).lock_sessions(1);
    if let Some(table) = fencing {
        builder = builder.fencing(table.clone());
    }
    (builder.build(), app)
}

/// Takes and releases keys of its own on `locks`' lock session until `at_least` has passed
/// since `since`: statements on the session that holds the test's locks, as a busy manager's
/// lock session runs them, so its `state_change` keeps moving.
pub async fn keep_busy(locks: &PostgresLockManager, since: Instant, at_least: Duration) {
    loop {
        let busy = key("busy");
        hold(locks, busy.as_str()).await;
        locks.release(busy.as_str()).await.expect("release");
        if since.elapsed() >= at_least {
            return;
        }
    }
}
