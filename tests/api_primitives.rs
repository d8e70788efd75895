//! One shape for every primitive (`docs/guide/primitives.md`): every verb of every primitive,
//! called on PostgreSQL the way a service calls it, with two replicas (two managers on pools of
//! their own) where a verb's meaning is about the other holder. A row of the table that stops
//! working fails here; `primitives_table` (a unit test) holds the table to the API listing.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::jobs::{job_name, pg_job, private_table};
use common::{app_name, key, pool_named};
use pglock::leader::{self, LeaderElection};
use pglock::schedule::{RunOutcome, Skip};
use pglock::semaphore::{self, Semaphore};
use pglock::{
    Attempt, Error, LockHandle, LockMode, LossCause, PostgresLockManager, TransactionLock, lock_id,
};

/// Bounds every wait that must end.
const WAIT: Duration = Duration::from_secs(10);

/// Two replicas: managers on pools of their own, each a holder.
async fn replicas(label: &str) -> (PostgresLockManager, PostgresLockManager) {
    let a = PostgresLockManager::new(pool_named(4, &app_name(&format!("{label}-a"))).await);
    let b = PostgresLockManager::new(pool_named(4, &app_name(&format!("{label}-b"))).await);
    (a, b)
}

/// Whether `b` could take `key` exclusively right now (it lets go at once).
async fn free_for(b: &PostgresLockManager, key: &str) -> bool {
    match b.try_acquire(key).await.expect("try") {
        Attempt::Acquired(guard) => {
            guard.release().await.expect("release");
            true
        }
        _ => false,
    }
}

#[tokio::test]
async fn a_lock_has_every_verb() {
    lock_verbs(LockMode::Exclusive).await;
}

#[tokio::test]
async fn a_shared_lock_has_every_verb() {
    lock_verbs(LockMode::Shared).await;
}

async fn lock_verbs(mode: LockMode) {
    let (a, b) = replicas("verbs-lock").await;
    let k = key("verbs-lock");
    let shared = mode == LockMode::Shared;
    let acquire = |timeout| {
        let (a, k) = (&a, &k);
        async move {
            if shared {
                a.acquire_shared(k, timeout).await
            } else {
                a.acquire(k, timeout).await
            }
        }
    };

    // acquire with a deadline, and info.
    let guard = acquire(Some(WAIT)).await.expect("acquire");
    let info = guard.info();
    assert_eq!(
        (info.key.to_string(), info.lock_id),
        (k.clone(), lock_id(&k))
    );
    assert_eq!((info.mode, &*info.holder_id), (mode, a.holder_id()));
    let refused = b.acquire(&k, Some(Duration::ZERO)).await;
    assert!(
        refused.is_err_and(|err| err.is_timeout()),
        "b waits at most its deadline"
    );
    assert!(!free_for(&b, &k).await, "the other replica's try is busy");
    // run until lost, and the loss signal: the lock released through the manager.
    let cut = guard.run(async {
        a.release(&k).await.expect("release by key");
        std::future::pending::<()>().await
    });
    assert!(matches!(
        cut.await,
        Err(Error::LockLost {
            cause: LossCause::Released,
            ..
        })
    ));
    assert_eq!(guard.loss_signal().cause(), Some(LossCause::Released));
    assert!(guard.release().await.is_err_and(|err| err.is_lost()));

    // try, and release.
    let attempt = if shared {
        a.try_acquire_shared(&k).await
    } else {
        a.try_acquire(&k).await
    };
    let Attempt::Acquired(guard) = attempt.expect("try") else {
        panic!("a free key is taken at once")
    };
    let again = a.try_acquire(&k).await.expect("try");
    assert!(matches!(again, Attempt::Busy), "a manager holds a key once");
    guard.release().await.expect("release");
    assert!(free_for(&b, &k).await, "released");

    // leak: held by the manager until released by key.
    let leaked = acquire(None).await.expect("acquire").leak();
    assert_eq!(leaked.key, k.as_str());
    assert!(a.is_held(&k).await && !free_for(&b, &k).await);
    a.release(&k).await.expect("release the leaked lock");
    assert!(free_for(&b, &k).await);

    // scoped, and scoped try: busy while the other replica holds the key.
    let body = |info: pglock::LockInfo| async move { info.mode };
    let ran = if shared {
        a.with_lock_shared(&k, Some(WAIT), body).await
    } else {
        a.with_lock(&k, Some(WAIT), body).await
    };
    assert_eq!(ran.expect("with_lock"), mode);
    assert!(free_for(&b, &k).await, "released after the body");
    let other = b.acquire(&k, None).await.expect("b takes it");
    let touched = AtomicBool::new(false);
    let body = |_| async { touched.store(true, Ordering::SeqCst) };
    let skipped = if shared {
        a.try_with_lock_shared(&k, body).await
    } else {
        a.try_with_lock(&k, body).await
    };
    assert_eq!(skipped.expect("try_with_lock"), None);
    assert!(!touched.load(Ordering::SeqCst), "the body did not run");
    other.release().await.expect("release");
    let ran = a
        .try_with_lock(&k, |info| async move { info.lock_id })
        .await;
    assert_eq!(ran.expect("try_with_lock"), Some(lock_id(&k)));
    assert_eq!(a.held_lock_count(), 0);
}

#[tokio::test]
async fn a_lock_set_has_every_verb() {
    set_verbs(LockMode::Exclusive).await;
}

#[tokio::test]
async fn a_shared_lock_set_has_every_verb() {
    set_verbs(LockMode::Shared).await;
}

async fn set_verbs(mode: LockMode) {
    let (a, b) = replicas("verbs-set").await;
    let keys = [key("verbs-set-0"), key("verbs-set-1")];
    let shared = mode == LockMode::Shared;
    let acquire_all = |timeout| {
        let (a, keys) = (&a, &keys);
        async move {
            if shared {
                a.acquire_all_shared(keys, timeout).await
            } else {
                a.acquire_all(keys, timeout).await
            }
        }
    };
    let try_all = || {
        let (a, keys) = (&a, &keys);
        async move {
            if shared {
                a.try_acquire_all_shared(keys).await
            } else {
                a.try_acquire_all(keys).await
            }
        }
    };

    // acquire with a deadline, info, and run until lost.
    let set = acquire_all(Some(WAIT)).await.expect("acquire_all");
    let ids: Vec<i64> = set.info().iter().map(|info| info.lock_id).collect();
    let mut in_order = ids.clone();
    in_order.sort();
    assert_eq!(ids, in_order, "taken in lock-id order");
    assert!(set.info().iter().all(|info| info.mode == mode));
    for k in &keys {
        assert!(!free_for(&b, k).await);
    }
    let cut = set.run(async {
        a.release(&keys[1]).await.expect("release one key");
        std::future::pending::<()>().await
    });
    match cut.await {
        Err(Error::LockLost { key, cause }) => {
            assert_eq!(
                (key.to_string(), cause),
                (keys[1].clone(), LossCause::Released)
            );
        }
        other => panic!("the set's body is cut off, naming the key that went: {other:?}"),
    }
    assert!(set.loss_signal().is_lost());
    assert!(set.release().await.is_err_and(|err| err.is_lost()));
    assert!(free_for(&b, &keys[0]).await, "the rest of the set went too");

    // try: all, or busy and nothing kept.
    let blocker = b.acquire(&keys[1], None).await.expect("b takes one key");
    assert!(matches!(try_all().await.expect("try"), Attempt::Busy));
    assert_eq!(a.held_lock_count(), 0, "nothing kept of a busy set");
    let touched = AtomicBool::new(false);
    let body = |_| async { touched.store(true, Ordering::SeqCst) };
    let skipped = if shared {
        a.try_with_locks_shared(&keys, body).await
    } else {
        a.try_with_locks(&keys, body).await
    };
    assert_eq!(skipped.expect("try_with_locks"), None);
    assert!(!touched.load(Ordering::SeqCst));
    blocker.release().await.expect("release");
    let Attempt::Acquired(set) = try_all().await.expect("try") else {
        panic!("a free set is taken at once")
    };
    set.release().await.expect("release");

    // leak, and the loss signal.
    let leaked = acquire_all(None).await.expect("acquire_all").leak();
    assert_eq!(leaked.len(), 2);
    for info in &leaked {
        assert!(a.is_held(&info.key).await);
    }
    assert_eq!(a.release_all().await.expect("release_all"), 2);
    let set = acquire_all(None).await.expect("acquire_all");
    a.release_all().await.expect("release_all");
    assert_eq!(set.loss_signal().cause(), Some(LossCause::ReleasedAll));
    drop(set);

    // scoped, and scoped try.
    let body = |infos: Vec<pglock::LockInfo>| async move { infos.len() };
    let ran = if shared {
        a.with_locks_shared(&keys, Some(WAIT), body).await
    } else {
        a.with_locks(&keys, Some(WAIT), body).await
    };
    assert_eq!(ran.expect("with_locks"), 2);
    let ran = a
        .try_with_locks(&keys, |infos| async move { infos.len() })
        .await;
    assert_eq!(ran.expect("try_with_locks"), Some(2));
    assert_eq!(a.held_lock_count(), 0);
}

#[tokio::test]
async fn a_semaphore_permit_has_every_verb() {
    let (a, b) = replicas("verbs-permit").await;
    let name = key("verbs-permit");
    let ours = Semaphore::builder(Arc::new(a.clone()), &name, 1)
        .build()
        .expect("one permit");
    let theirs = Semaphore::builder(Arc::new(b), &name, 1)
        .build()
        .expect("one permit");

    // acquire with a deadline, info, run until lost.
    let permit = ours.acquire(Some(WAIT)).await.expect("acquire");
    assert_eq!(permit.info().key, Semaphore::slot_key(&name, 0).as_str());
    let refused = theirs.acquire(Some(Duration::ZERO)).await;
    assert!(refused.is_err_and(|err| err.is_timeout()));
    assert!(matches!(
        theirs.try_acquire().await.expect("try"),
        Attempt::Busy
    ));
    let cut = permit.run(async {
        a.release_all().await.expect("release_all");
        std::future::pending::<()>().await
    });
    assert!(matches!(
        cut.await,
        Err(Error::LockLost {
            cause: LossCause::ReleasedAll,
            ..
        })
    ));
    assert_eq!(permit.loss_signal().cause(), Some(LossCause::ReleasedAll));
    assert!(permit.release().await.is_err_and(|err| err.is_lost()));

    // try, release, leak.
    let Attempt::Acquired(permit) = ours.try_acquire().await.expect("try") else {
        panic!("the permit is free")
    };
    permit.release().await.expect("release");
    let leaked = ours.acquire(None).await.expect("acquire").leak();
    assert!(matches!(
        theirs.try_acquire().await.expect("try"),
        Attempt::Busy
    ));
    a.release(&leaked.key)
        .await
        .expect("release the leaked slot");

    // scoped, and scoped try.
    let slot = ours
        .with_permit(Some(WAIT), |info| async move { info.key })
        .await;
    assert_eq!(
        slot.expect("with_permit"),
        Semaphore::slot_key(&name, 0).as_str()
    );
    let held = theirs.acquire(None).await.expect("theirs");
    let skipped = ours.try_with_permit(|_| async { "ran" }).await;
    assert_eq!(skipped.expect("try_with_permit"), None, "no permit is free");
    held.release().await.expect("release");
    let ran = ours.try_with_permit(|_| async { 7 }).await;
    assert_eq!(ran.expect("try_with_permit"), Some(7));
    assert_eq!(a.held_lock_count(), 0);
}

#[tokio::test]
async fn a_transaction_lock_has_every_verb() {
    let pool = pool_named(2, &app_name("verbs-xact")).await;
    let lock = TransactionLock::exclusive(key("verbs-xact"));
    let mut first = pool.begin().await.expect("begin");
    lock.acquire(&mut first, Some(WAIT)).await.expect("acquire");
    let mut second = pool.begin().await.expect("begin");
    assert!(!lock.try_acquire(&mut second).await.expect("try"), "busy");
    let refused = lock.acquire(&mut second, Some(Duration::ZERO)).await;
    assert!(refused.is_err_and(|err| err.is_timeout()));
    // Released by the transaction's end, and only then.
    first.commit().await.expect("commit");
    assert!(
        lock.try_acquire(&mut second).await.expect("try"),
        "released at commit"
    );
    second.rollback().await.expect("rollback");
}

#[tokio::test]
async fn leadership_has_every_verb() {
    let (a, b) = replicas("verbs-leader").await;
    let name = key("verbs-leader");
    let elect = |locks: PostgresLockManager| {
        LeaderElection::builder(Arc::new(locks), &name)
            .retry_interval(Duration::from_millis(50))
            .build()
    };
    let ours = elect(a.clone()).expect("within a runtime");
    let term = ours.wait_for_leadership(Some(WAIT)).await.expect("leads");
    let theirs = elect(b).expect("within a runtime");
    let waited = theirs.wait_for_leadership(Some(Duration::ZERO)).await;
    assert!(
        waited.is_err_and(|err| err.is_timeout()),
        "one look, then a timeout"
    );
    assert_eq!(ours.leader_info(), Some(term.clone()));
    assert_eq!(theirs.leader_info(), None);
    let skipped = theirs.try_run_as_leader(|_| async { "ran" }).await;
    assert_eq!(
        skipped.expect("try_run_as_leader"),
        None,
        "a follower runs nothing"
    );
    let led = ours
        .try_run_as_leader(|info| async move { info.fencing_token })
        .await;
    assert_eq!(led.expect("try_run_as_leader"), Some(term.fencing_token));
    let led = ours
        .run_as_leader(Some(WAIT), |info| async move { info.key })
        .await;
    assert_eq!(led.expect("run_as_leader"), term.key);

    // The loss signal: the term ends when the lock goes, and its work is cut short.
    let mut watched = ours.subscribe();
    assert!(watched.borrow_and_update().is_leader());
    let cut = ours.run_as_leader(None, |info| async move {
        a.release(&info.key)
            .await
            .expect("release the election's lock");
        std::future::pending::<()>().await
    });
    assert!(cut.await.is_err_and(|err| err.is_lost()));
    assert!(
        watched.has_changed().expect("campaigning"),
        "the watch told the end of the term"
    );
    // Release: resign, after which the election leads no more, and the other replica leads.
    ours.resign().await.expect("resign");
    assert!(matches!(
        ours.wait_for_leadership(None).await,
        Err(leader::Error::Stopped { .. })
    ));
    let next = theirs.wait_for_leadership(Some(WAIT)).await;
    assert!(next.expect("the other replica leads").fencing_token >= term.fencing_token);
    assert!(
        theirs.resign().await.expect("resign"),
        "it released a lock it led under"
    );
}

#[test]
fn an_election_outside_a_runtime_is_a_typed_error() {
    let built = LeaderElection::builder(Arc::new(pglock::InMemoryLockManager::new()), "x").build();
    assert!(matches!(built, Err(leader::Error::NoRuntime { .. })));
    let none = Semaphore::builder(Arc::new(pglock::InMemoryLockManager::new()), "x", 0).build();
    assert!(matches!(none, Err(semaphore::Error::InvalidPermits { .. })));
}

#[tokio::test]
async fn a_scheduled_run_has_every_verb() {
    let (a, b) = replicas("verbs-job").await;
    let (_, table) = private_table();
    let name = job_name("verbs");
    let hour = Duration::from_secs(3600);
    let ours = pg_job(&a, &table, &name, hour).build().expect("valid");
    let theirs = pg_job(&b, &table, &name, hour).build().expect("valid");

    // try (one attempt, scoped): the body gets the run, and its value comes back.
    let ran = ours.run(|run| async move { run.run }).await.expect("run");
    let RunOutcome::Ran { run, value } = ran else {
        panic!("the first replica runs the window: {ran:?}")
    };
    assert_eq!(run.run, value);
    let skipped = theirs.run(|_| async { "ran twice" }).await.expect("run");
    assert!(
        matches!(skipped.skipped(), Some(Skip::AlreadyRan { .. })),
        "{skipped:?}"
    );

    // Run until lost: the body is cancelled when the job's lock goes.
    let lost = pg_job(&a, &table, job_name("verbs-lost"), hour)
        .build()
        .expect("valid");
    let key = lost.lock_key().clone();
    let cut = lost
        .run(|_| async {
            a.release(&key).await.expect("release the job's lock");
            std::future::pending::<()>().await
        })
        .await;
    assert!(cut.is_err_and(|err| err.is_lost()));
}

/// The handles are one shape: code generic over `LockHandle` runs on each.
#[tokio::test]
async fn every_handle_is_a_lock_handle() {
    async fn exits<H: LockHandle>(handle: H) -> usize {
        let ran = handle.run(async { 1 }).await.expect("run");
        assert!(!handle.loss_signal().is_lost());
        handle.release().await.expect("release");
        ran
    }
    let (a, _) = replicas("verbs-handles").await;
    let semaphore = Semaphore::builder(Arc::new(a.clone()), key("verbs-handles"), 1)
        .build()
        .expect("valid");
    let guard = a.acquire(key("verbs-handle"), None).await.expect("acquire");
    let set = a
        .acquire_all([key("verbs-h0"), key("verbs-h1")], None)
        .await
        .expect("set");
    let permit = semaphore.acquire(None).await.expect("permit");
    assert_eq!(
        exits(guard).await + exits(set).await + exits(permit).await,
        3
    );
    assert_eq!(a.held_lock_count(), 0);
}
