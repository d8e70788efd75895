//! The operations that take a lock through [`held`](super::held): critical sections, readers'
//! sections and fenced increments.

use std::time::Duration;

use pglock::LockMode;

use super::held::{Released, take};
use super::{Ctx, Shared, finish, note};
use crate::history::{Op, Outcome};
use crate::resource::Write;
use crate::rng::Rng;
use crate::spec::{Mode, names};

/// A critical section: its start and end written through the fenced resource.
pub(super) async fn section(ctx: &Ctx, task: u32, rng: &mut Rng) {
    let key = names::SECTIONS[rng.index(names::SECTIONS.len())];
    let record = ctx.emit.invoke(task, Op::Section, key);
    let hold = Duration::from_millis(rng.between(10, 80));
    let progress = Shared::default();
    let result = match ctx.mode {
        Mode::Unsafe => unsafe_section(ctx, task, key, hold, &progress).await,
        Mode::Safe | Mode::BrokenLock => safe_section(ctx, task, key, hold, &progress).await,
    };
    let p = *progress.lock().expect("progress");
    let outcome = match result {
        Ok(()) if p.accepted == 2 => Outcome::Ok,
        _ if p.touched == 0 => Outcome::Fail,
        _ => Outcome::Info,
    };
    finish(ctx, record, outcome, p.token, None, result.err());
}

/// As `with_lock` runs it: the body is the lock's critical section, cancelled if the lock
/// goes; a loss before the release is the section's error, an unconfirmed release is not.
async fn safe_section(
    ctx: &Ctx,
    task: u32,
    key: &str,
    hold: Duration,
    progress: &Shared,
) -> Result<(), String> {
    let held = take(ctx, task, key, LockMode::Exclusive).await?;
    let token = held.token();
    progress.lock().expect("progress").token = Some(token);
    let holder = ctx.emit.holder(task);
    let body = async {
        let start = ctx
            .resource
            .fenced_event(key, token, "start", &holder)
            .await;
        note(progress, start);
        if start != Write::Accepted {
            return;
        }
        tokio::time::sleep(hold).await;
        let end = ctx.resource.fenced_event(key, token, "end", &holder).await;
        note(progress, end);
    };
    let ran = held.run(body).await;
    match (ran, held.release(ctx).await) {
        (Err(lost), _) | (Ok(()), Released::Lost(lost)) => Err(lost),
        (Ok(()), Released::Confirmed | Released::Unconfirmed(_)) => Ok(()),
    }
}

/// The negative control's section: it goes on when the lock is lost, and writes its end
/// without the fence.
async fn unsafe_section(
    ctx: &Ctx,
    task: u32,
    key: &str,
    hold: Duration,
    progress: &Shared,
) -> Result<(), String> {
    let held = take(ctx, task, key, LockMode::Exclusive).await?;
    let token = held.token();
    progress.lock().expect("progress").token = Some(token);
    let holder = ctx.emit.holder(task);
    let start = ctx
        .resource
        .fenced_event(key, token, "start", &holder)
        .await;
    note(progress, start);
    if start == Write::Accepted {
        tokio::time::sleep(hold).await;
        let end = ctx
            .resource
            .unfenced_event(key, token, "end", &holder)
            .await;
        note(progress, end);
    }
    let _ = held.release(ctx).await;
    Ok(())
}

/// A reader's section: a section key held in shared mode for a while, writing nothing.
/// `ok` when its release was confirmed, `fail` when it never got the lock, else `info`.
pub(super) async fn read(ctx: &Ctx, task: u32, rng: &mut Rng) {
    let key = names::SECTIONS[rng.index(names::SECTIONS.len())];
    let record = ctx.emit.invoke(task, Op::Read, key);
    let hold = Duration::from_millis(rng.between(5, 30));
    let held = match take(ctx, task, key, LockMode::Shared).await {
        Ok(held) => held,
        Err(err) => return finish(ctx, record, Outcome::Fail, None, None, Some(err)),
    };
    let token = held.token();
    let ran = held.run(tokio::time::sleep(hold)).await;
    let (outcome, detail) = match (ran, held.release(ctx).await) {
        (Ok(()), Released::Confirmed) => (Outcome::Ok, None),
        (Err(err), _) | (Ok(()), Released::Lost(err) | Released::Unconfirmed(err)) => {
            (Outcome::Info, Some(err))
        }
    };
    finish(ctx, record, outcome, Some(token), None, detail);
}

/// A read-modify-write increment of a counter under its lock.
pub(super) async fn increment(ctx: &Ctx, task: u32, rng: &mut Rng) {
    let key = names::COUNTERS[rng.index(names::COUNTERS.len())];
    let record = ctx.emit.invoke(task, Op::Increment, key);
    let held = match take(ctx, task, key, LockMode::Exclusive).await {
        Ok(held) => held,
        Err(err) => return finish(ctx, record, Outcome::Fail, None, None, Some(err)),
    };
    let token = held.token();
    let (write, value) = if ctx.mode.is_fenced() {
        ctx.resource.fenced_increment(key, token).await
    } else {
        ctx.resource.write_checked_increment(key, token).await
    };
    // A lost lock's release fails; the write's outcome is what counts.
    let _ = held.release(ctx).await;
    let outcome = match write {
        Write::Accepted => Outcome::Ok,
        Write::Refused => Outcome::Fail,
        Write::Unknown => Outcome::Info,
    };
    finish(ctx, record, outcome, Some(token), value, None);
}
