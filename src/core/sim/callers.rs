//! The callers of a simulated world: random programs of the operations users write, each
//! possibly cancelled at a random moment.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::{Instant, timeout};

use super::world::{Believing, Op, World};
use crate::{Attempt, Error, LockGuard, LockKey, LockManager, LockManagerExt, LockMode};

/// One caller: `OPS` operations on its manager `m`.
pub(crate) async fn caller(world: Arc<World>, m: usize, n: usize) {
    let who = format!("m{m}c{n}");
    for _ in 0..super::world::OPS {
        let op = one_op(&world, m, &who);
        if world.rng.chance(250) {
            let after = Duration::from_millis(world.rng.below(8));
            if timeout(after, op).await.is_err() {
                world.note(format_args!("{who} cancelled after {after:?}"));
            }
        } else {
            op.await;
        }
        if world.violation().is_some() {
            return;
        }
    }
}

async fn one_op(world: &Arc<World>, m: usize, who: &str) {
    match world.rng.below(10) {
        0..=2 => acquire(world, m, who).await,
        3..=4 => try_acquire(world, m, who).await,
        5..=6 => section(world, m, who).await,
        7..=8 => several(world, m, who).await,
        _ => release_all(world, m, who).await,
    }
}

async fn acquire(world: &Arc<World>, m: usize, who: &str) {
    let key = world.key();
    let mode = world.mode();
    let timeout = world.timeout();
    let Some(guard) = wait_for(world, m, who, &key, mode, timeout, false).await else {
        return;
    };
    let believing = world.believe(who, guard.info(), guard.loss_signal(), false);
    world.work().await;
    let_go(world, m, who, guard, believing).await;
}

/// `acquire` or `acquire_shared`, its deadline checked and its outcome traced.
async fn wait_for(
    world: &Arc<World>,
    m: usize,
    who: &str,
    key: &LockKey,
    mode: LockMode,
    timeout: Option<Duration>,
    nested: bool,
) -> Option<LockGuard> {
    let manager = world.manager(m);
    let started = Instant::now();
    let result = match mode {
        LockMode::Exclusive => manager.acquire(key.clone(), timeout).await,
        LockMode::Shared => manager.acquire_shared(key.clone(), timeout).await,
    };
    let what = format!("{who} acquire {key} {mode:?} {timeout:?}");
    world.check_deadline(&what, timeout, started, &result, world.slack());
    world.note(format_args!("{what} -> {}", outcome(&result)));
    match result {
        Ok(guard) => Some(guard),
        Err(err) => {
            let deadline = timeout.is_some();
            world.expect_error(&what, &err, Op::Acquire { deadline, nested });
            if matches!(err, Error::Deadlock { .. }) {
                world.check_deadlock(&what, who);
            }
            None
        }
    }
}

async fn try_acquire(world: &Arc<World>, m: usize, who: &str) {
    let key = world.key();
    let mode = world.mode();
    let manager = world.manager(m);
    let result = match mode {
        LockMode::Exclusive => manager.try_acquire(key.clone()).await,
        LockMode::Shared => manager.try_acquire_shared(key.clone()).await,
    };
    let what = format!("{who} try {key} {mode:?}");
    match result {
        Ok(Attempt::Acquired(guard)) => {
            world.note(format_args!("{what} -> acquired"));
            let believing = world.believe(who, guard.info(), guard.loss_signal(), false);
            world.work().await;
            let_go(world, m, who, guard, believing).await;
        }
        Ok(_busy) => world.note(format_args!("{what} -> busy")),
        Err(err) => {
            world.note(format_args!("{what} -> {err}"));
            world.expect_error(&what, &err, Op::Try);
        }
    }
}

/// A critical section (`LockGuard::run`) that asks for its own key again, which must fail at
/// once, or for another key, held for a while inside it.
async fn section(world: &Arc<World>, m: usize, who: &str) {
    let key = world.key();
    let mode = world.mode();
    let Some(guard) = wait_for(world, m, who, &key, mode, world.timeout(), false).await else {
        return;
    };
    let believing = world.believe(who, guard.info(), guard.loss_signal(), false);
    let body = async {
        if world.rng.chance(300) {
            let started = Instant::now();
            let again = world.manager(m).acquire(key.clone(), None).await;
            if !matches!(again, Err(Error::Reentrant { .. })) || started.elapsed() > Duration::ZERO
            {
                world.violate(format!(
                    "{who} nested {key}: {again:?}, not refused at once"
                ));
            }
            return;
        }
        let inner = world.key();
        let timeout = Some(Duration::from_millis(world.rng.below(10) + 1));
        if inner == key {
            return;
        }
        let inner_mode = world.mode();
        let waiting =
            world.waiting_in_section(who, m, (key.clone(), mode), (inner.clone(), inner_mode));
        let nested = wait_for(world, m, who, &inner, inner_mode, timeout, true).await;
        drop(waiting);
        if let Some(nested) = nested {
            let believing = world.believe(who, nested.info(), nested.loss_signal(), false);
            world.work().await;
            let_go(world, m, who, nested, believing).await;
        }
    };
    let ran = guard.run(body).await;
    world.note(format_args!("{who} section {key} -> {}", outcome(&ran)));
    if let Err(err) = &ran {
        world.expect_error(&format!("{who} section {key}"), err, Op::Section);
    }
    let_go(world, m, who, guard, believing).await;
}

/// Two keys at once, all or nothing.
async fn several(world: &Arc<World>, m: usize, who: &str) {
    let keys = world.two_keys();
    let timeout = world.timeout();
    let manager = world.manager(m);
    let started = Instant::now();
    let result = if world.rng.chance(300) {
        manager.acquire_all_shared(keys.clone(), timeout).await
    } else {
        manager.acquire_all(keys.clone(), timeout).await
    };
    let what = format!("{who} acquire_all {}+{} {timeout:?}", keys[0], keys[1]);
    world.check_deadline(&what, timeout, started, &result, 2 * world.slack());
    world.note(format_args!("{what} -> {}", outcome(&result)));
    let set = match result {
        Ok(set) => set,
        Err(err) => {
            let deadline = timeout.is_some();
            return world.expect_error(&what, &err, Op::AcquireAll { deadline });
        }
    };
    let believing: Vec<Believing> = set
        .info()
        .iter()
        .map(|info| world.believe(who, info, set.loss_signal(), true))
        .collect();
    world.work().await;
    drop(believing);
    if world.rng.chance(500) {
        drop(set);
    } else if let Err(err) = set.release().await {
        world.expect_error(&format!("{who} release set"), &err, Op::Release);
    }
}

async fn release_all(world: &Arc<World>, m: usize, who: &str) {
    let released = world.manager(m).release_all().await;
    world.note(format_args!("{who} release_all -> {}", outcome(&released)));
    if let Err(err) = released {
        world.expect_error(&format!("{who} release_all"), &err, Op::ReleaseAll);
    }
}

/// One of a guard's three exits: release, drop, or leak and then `release(key)`.
async fn let_go(world: &Arc<World>, m: usize, who: &str, guard: LockGuard, believing: Believing) {
    let key = guard.info().key.clone();
    match world.rng.below(3) {
        0 => {
            drop(believing);
            let ended = world.session_ended(guard.info());
            let released = guard.release().await;
            world.note(format_args!(
                "{who} release {key} -> {}",
                outcome(&released)
            ));
            match released {
                Ok(()) => world.check_confirmed(who, &key, ended),
                Err(err) => world.expect_error(&format!("{who} release {key}"), &err, Op::Release),
            }
        }
        1 => {
            drop(believing);
            drop(guard);
            world.note(format_args!("{who} drop {key}"));
        }
        _ => {
            world.leaked(m, &key, true);
            let _info = guard.leak();
            world.work().await;
            drop(believing);
            let ended = world.registered_session_ended(m, &key);
            let released = world.manager(m).release(key.clone()).await;
            world.leaked(m, &key, false);
            world.note(format_args!(
                "{who} release({key}) -> {}",
                outcome(&released)
            ));
            match released {
                Ok(()) => world.check_confirmed(who, &key, ended),
                Err(err) => {
                    world.expect_error(&format!("{who} release({key})"), &err, Op::ReleaseKey)
                }
            }
        }
    }
}

fn outcome<T>(result: &crate::Result<T>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(err) => format!("{err}"),
    }
}
