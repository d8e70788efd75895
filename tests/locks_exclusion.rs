//! Exclusion between holders, seen from the server's own views. A manager and its clones are one
//! holder and separate managers are two, whatever their holder ids say; two holders exclude each
//! other; a held lock is one exclusive advisory lock on an idle session; and dropping a manager
//! frees its locks. (Across operating-system processes: `tests/locks_processes.rs`.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{
    app_name, assert_pool_clean, key, lock_rows, manager_named, observer, pool_named, sessions_of,
};
use pglock::{PostgresLockManager, lock_id, split_lock_id};

#[tokio::test]
async fn two_managers_exclude_each_other() {
    let (a, b) = (
        manager_named(&app_name("a"), 2).await,
        manager_named(&app_name("b"), 2).await,
    );
    let key = key("exclusion");
    let guard = a.acquire(&key, None).await.expect("a takes the free key");
    assert!(
        b.try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    let err = b
        .acquire(&key, Some(Duration::from_millis(100)))
        .await
        .expect_err("a holds it");
    assert!(err.is_timeout(), "{err:?}");
    guard.release().await.expect("release");
    let guard = b
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("b takes it once a let go");
    assert_eq!(&*guard.info().holder_id, b.holder_id());
    guard.release().await.expect("release");
}

#[tokio::test]
async fn clones_are_one_holder_and_separate_managers_are_two() {
    let pool = pool_named(4, &app_name("clones")).await;
    let one = Arc::new(PostgresLockManager::new(pool.clone()));
    let same = one.clone();
    let other = PostgresLockManager::new(pool);
    let key = key("clones");
    assert!(one.try_acquire(&key).await.expect("try").leak().is_some());
    assert!(same.is_held(&key).await, "a clone sees the same registry");
    assert!(
        !other.is_held(&key).await,
        "another manager is another holder"
    );
    assert!(
        other
            .try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    same.release(&key).await.expect("a clone may release it");
    assert_eq!(one.held_lock_count(), 0);
}

#[tokio::test]
async fn a_holder_id_of_any_content_is_kept_verbatim() {
    let holder_id = "worker'); DROP TABLE pg_class; --\n\u{1F512}";
    let locks = PostgresLockManager::builder(pool_named(2, &app_name("holder-id")).await)
        .holder_id(holder_id)
        .build();
    let key = key("holder-id");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    assert_eq!(&*guard.info().holder_id, holder_id);
    guard.release().await.expect("release");
}

#[tokio::test]
async fn pg_locks_shows_one_exclusive_advisory_lock_on_an_idle_session() {
    let observer = observer().await;
    let app = app_name("pg-locks");
    let locks = manager_named(&app, 2).await;
    let key = key("pg-locks");
    let guard = locks.acquire(&key, None).await.expect("acquire");

    let rows = lock_rows(&observer, guard.info().lock_id).await;
    let (classid, objid) = split_lock_id(lock_id(&key));
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (row.classid, row.objid),
        (i64::from(classid), i64::from(objid))
    );
    assert_eq!(
        row.objsubid, 1,
        "single-bigint advisory locks have objsubid 1"
    );
    assert_eq!(row.mode, "ExclusiveLock");
    assert!(row.granted);

    // The holding session belongs to the manager's pool and sits idle in autocommit: not
    // `idle in transaction`, no snapshot holding back VACUUM.
    let sessions = sessions_of(&observer, &app).await;
    let holder = sessions
        .iter()
        .find(|s| s.pid == row.pid)
        .expect("the holder is a session of the manager's pool");
    assert_eq!(holder.state.as_deref(), Some("idle"), "{holder:?}");
    assert!(!holder.has_xmin, "a held lock must not pin backend_xmin");

    guard.release().await.expect("release");
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

#[tokio::test]
async fn dropping_the_manager_frees_its_locks() {
    let observer = observer().await;
    let app = app_name("dropped-manager");
    // The application keeps its pool: a connection that went back to it holding the lock would
    // keep the lock for as long as the pool lives.
    let pool = pool_named(2, &app).await;
    let locks = common::manager_for(pool.clone(), &app).build();
    let key = key("dropped-manager");
    common::hold(&locks, &key).await;
    drop(locks);
    assert_pool_clean(&observer, &app).await;
    let next = manager_named(&app_name("next"), 2).await;
    let guard = next
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("the dropped manager's lock was freed");
    guard.release().await.expect("release");
}
