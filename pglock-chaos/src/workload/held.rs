//! A lock taken by one task, its acquisition and its release each reported as an operation
//! (`acquire` or `acquire_shared`, then `release`), so that the checker sees, for every
//! acquisition, when the task was told it had the lock and when it stopped believing so.
//!
//! A section runs the steps `with_lock` runs, one by one: acquire, run the body as the lock's
//! critical section (cancelled if the lock goes), release. Only the release's own answer tells
//! a confirmed release from an unconfirmed one, which `with_lock` folds together.

use std::future::Future;

use pglock::{LockGuard, LockManagerExt, LockMode};

use super::{ACQUIRE, Ctx};
use crate::history::{Op, Outcome, Record};

/// A granted acquisition of one task.
pub(super) struct Held {
    guard: LockGuard,
    task: u32,
}

/// How a release went.
pub(super) enum Released {
    /// pglock confirmed it: the lock was held until then.
    Confirmed,
    /// pglock said the lock had gone before (the error's text).
    Lost(String),
    /// The release could not be confirmed (the error's text).
    Unconfirmed(String),
}

/// Takes `key` in `mode` for `task`, reporting the acquisition: `ok` with its token when
/// granted, `info` on an error or a timeout (the server may have granted it all the same).
pub(super) async fn take(ctx: &Ctx, task: u32, key: &str, mode: LockMode) -> Result<Held, String> {
    let op = match mode {
        LockMode::Shared => Op::AcquireShared,
        _ => Op::Acquire,
    };
    let mut record = ctx.emit.invoke(task, op, key);
    let acquired = match mode {
        LockMode::Shared => ctx.locks.acquire_shared(key, Some(ACQUIRE)).await,
        _ => ctx.locks.acquire(key, Some(ACQUIRE)).await,
    };
    match acquired {
        Ok(guard) => {
            record.token = guard.info().fencing_token;
            ctx.emit.complete(record, Outcome::Ok);
            Ok(Held { guard, task })
        }
        Err(err) => {
            record.detail = Some(err.to_string());
            ctx.emit.complete(record, Outcome::Info);
            Err(err.to_string())
        }
    }
}

impl Held {
    /// The acquisition's fencing token.
    pub(super) fn token(&self) -> i64 {
        self.guard.info().fencing_token.expect("fencing is on")
    }

    /// Runs `body` as the lock's critical section: cancelled, with the loss as the error, if
    /// the lock goes first.
    pub(super) async fn run<F: Future>(&self, body: F) -> Result<F::Output, String> {
        self.guard.run(body).await.map_err(|err| err.to_string())
    }

    /// Releases the lock, reporting the release: `ok` when confirmed, `fail` when the lock had
    /// been lost, `info` when unconfirmed.
    pub(super) async fn release(self, ctx: &Ctx) -> Released {
        let key = self.guard.info().key.to_string();
        let mut record = ctx.emit.record(self.task, Op::Release, &key);
        record.token = self.guard.info().fencing_token;
        let record = ctx.emit.start(record);
        let (outcome, released) = match self.guard.release().await {
            Ok(()) => (Outcome::Ok, Released::Confirmed),
            Err(err) if err.is_lost() => (Outcome::Fail, Released::Lost(err.to_string())),
            Err(err) => (Outcome::Info, Released::Unconfirmed(err.to_string())),
        };
        let detail = match &released {
            Released::Confirmed => None,
            Released::Lost(err) | Released::Unconfirmed(err) => Some(err.clone()),
        };
        ctx.emit.complete(Record { detail, ..record }, outcome);
        released
    }
}
