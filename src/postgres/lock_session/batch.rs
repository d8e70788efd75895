//! Tries and unlocks queued on one lock session, run as one statement.
//!
//! Under load, many tasks want a lock on the same session at once, and each statement is a
//! round trip and a server transaction of its own: the server's statement rate becomes the
//! ceiling. When several tries (or several unlocks) are already queued, one statement runs them
//! all, each caller still getting its own answer. Only commands already queued are gathered,
//! so a lone command runs alone, as before, with no added wait. Everything still runs on the
//! session's task, so a caller that goes away leaves nothing half-done: a grant nobody is left
//! to receive is unlocked before the next command.

use std::collections::HashSet;
use std::sync::LazyLock;
use std::sync::atomic::Ordering;

use super::task::{Broken, Task};
use super::{Command, SessionError};
use crate::postgres::statements::notify_column;
use crate::{LockMode, LockTarget};

/// The most commands one statement runs.
const MAX_BATCH: usize = 256;

/// Tries, in order: NULL for every row on another server session than the one set up (a
/// transaction pooler), as for a single try.
const TRY_BATCH: &str = "SELECT CASE WHEN pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) $1 \
     THEN CASE WHEN t.s THEN pg_catalog.pg_try_advisory_lock_shared(t.id) \
     ELSE pg_catalog.pg_try_advisory_lock(t.id) END END \
     FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::boolean[])) WITH ORDINALITY AS t(id, s, i) \
     ORDER BY t.i";

/// Unlocks, in order, as [`TRY_BATCH`], each notifying its lock's waiters as a single unlock
/// does (see `statements::notify_column`).
static UNLOCK_BATCH: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH u AS MATERIALIZED (SELECT t.i, t.id, CASE WHEN \
         pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) $1 THEN CASE WHEN t.s \
         THEN pg_catalog.pg_advisory_unlock_shared(t.id) ELSE pg_catalog.pg_advisory_unlock(t.id) \
         END END AS ok \
         FROM ROWS FROM (pg_catalog.unnest($2::bigint[]), pg_catalog.unnest($3::boolean[])) WITH ORDINALITY AS t(id, s, i)) \
         SELECT u.ok, {} FROM u ORDER BY u.i",
        notify_column("u.ok", "u.id")
    )
});

/// What a batch is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Try,
    Unlock,
}

/// A command's kind and lock id, when it can run in a batch: tries without a fencing token to
/// mint, and unlocks, of single-number targets.
fn batchable(command: &Command, fenced: bool) -> Option<(Kind, i64)> {
    match command {
        Command::Try {
            target: LockTarget::BigInt(id),
            ..
        } if !fenced => Some((Kind::Try, *id)),
        Command::Unlock {
            target: LockTarget::BigInt(id),
            ..
        } => Some((Kind::Unlock, *id)),
        _ => None,
    }
}

impl Task {
    /// Runs `command`, with the commands of its kind queued behind it when there are some.
    /// Returns the outcome and how many commands ran.
    pub(super) async fn execute_queued(&mut self, command: Command) -> (Result<(), Broken>, usize) {
        let fenced = self.shared.context.statements.fencing.is_some();
        let Some((kind, id)) = batchable(&command, fenced) else {
            return (self.execute(command).await, 1);
        };
        if self.inbox.is_empty() {
            return (self.execute(command).await, 1);
        }
        let batch = self.gather(command, kind, id, fenced);
        let ran = batch.len();
        if ran == 1 {
            let command = batch.into_iter().next().expect("one command");
            return (self.execute(command).await, 1);
        }
        let outcome = match kind {
            Kind::Try => self.try_batch(batch).await,
            Kind::Unlock => self.unlock_batch(batch).await,
        };
        (outcome, ran)
    }

    /// `first` and the commands of its kind queued behind it, each key at most once; the
    /// first command that does not belong is kept for the next turn.
    fn gather(&mut self, first: Command, kind: Kind, id: i64, fenced: bool) -> Vec<Command> {
        let mut ids = HashSet::from([id]);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            let Ok(command) = self.inbox.try_recv() else {
                break;
            };
            match batchable(&command, fenced) {
                Some((k, id)) if k == kind && ids.insert(id) => batch.push(command),
                _ => {
                    self.pending = Some(command);
                    break;
                }
            }
        }
        batch
    }

    /// Runs `statement` over the batch's targets; the answers in order.
    async fn run_batch(
        &mut self,
        statement: &'static str,
        targets: &[(i64, LockMode)],
    ) -> Result<Vec<Option<bool>>, SessionError> {
        let ids: Vec<i64> = targets.iter().map(|(id, _)| *id).collect();
        let shared: Vec<bool> = targets
            .iter()
            .map(|(_, m)| *m == LockMode::Shared)
            .collect();
        let link = self.link.as_mut().expect("claimed for the batch");
        let rows = link.run_batch(&self.shared, statement, ids, shared).await?;
        if rows.len() != targets.len() {
            return Err(SessionError::Closed(Some(sqlx::Error::Protocol(
                "a batched lock statement returned the wrong number of rows".into(),
            ))));
        }
        Ok(rows)
    }

    async fn try_batch(&mut self, batch: Vec<Command>) -> Result<(), Broken> {
        let mut tries = Vec::with_capacity(batch.len());
        for command in batch {
            if let Command::Try {
                target: LockTarget::BigInt(id),
                mode,
                reply,
            } = command
            {
                tries.push((id, mode, reply));
            }
        }
        let targets: Vec<(i64, LockMode)> = tries.iter().map(|(id, m, _)| (*id, *m)).collect();
        let answers = match self.run_batch(TRY_BATCH, &targets).await {
            Ok(answers) => answers,
            Err(SessionError::Database(_)) => {
                // Locks granted before the statement failed survive it: make sure none is held,
                // then try each alone, so each caller gets its own answer or error.
                for &(id, mode) in &targets {
                    self.reconcile(LockTarget::BigInt(id), mode).await?;
                }
                for (id, mode, reply) in tries {
                    self.try_lock(LockTarget::BigInt(id), mode, reply).await?;
                }
                return Ok(());
            }
            Err(err) => return fail_all(tries.into_iter().map(|(_, _, r)| r), err),
        };
        if answers.iter().any(Option::is_none) {
            let replies = tries.into_iter().map(|(_, _, reply)| reply);
            return fail_all(replies, SessionError::Pooled);
        }
        let mut undo = Vec::new();
        for ((id, mode, reply), granted) in tries.into_iter().zip(answers) {
            let target = LockTarget::BigInt(id);
            if granted != Some(true) {
                let _ = reply.send(Ok(None));
            } else if !self.deliver(target, mode, None, reply) {
                undo.push((target, mode));
            }
        }
        // Grants whose callers have gone are taken back before anything else runs here.
        for (target, mode) in undo {
            self.undo(target, mode).await?;
        }
        Ok(())
    }

    async fn unlock_batch(&mut self, batch: Vec<Command>) -> Result<(), Broken> {
        let mut unlocks = Vec::with_capacity(batch.len());
        for command in batch {
            if let Command::Unlock {
                target: LockTarget::BigInt(id),
                mode,
                reply,
            } = command
            {
                unlocks.push((id, mode, reply));
            }
        }
        let targets: Vec<(i64, LockMode)> = unlocks.iter().map(|(id, m, _)| (*id, *m)).collect();
        let answers = self.run_batch(&UNLOCK_BATCH, &targets).await;
        // Whatever the server says, this session no longer holds these locks for us: unlocked,
        // not held, or the session is about to close (as for a single unlock).
        self.shared.held.fetch_sub(targets.len(), Ordering::SeqCst);
        match answers {
            Ok(answers) if answers.iter().all(Option::is_some) => {
                for ((_, _, reply), unlocked) in unlocks.into_iter().zip(answers) {
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(unlocked.unwrap_or(false)));
                    }
                }
                Ok(())
            }
            Ok(_) => fail_all(
                unlocks.into_iter().filter_map(|u| u.2),
                SessionError::Pooled,
            ),
            Err(SessionError::Database(err)) => {
                // Refused: released for sure, one by one, or the session is closed, which
                // frees them; each caller hears of the refusal, as for a single unlock.
                for &(id, mode) in &targets {
                    self.reconcile(LockTarget::BigInt(id), mode).await?;
                }
                let replies = unlocks.into_iter().filter_map(|(_, _, reply)| reply);
                for reply in replies {
                    let refused = sqlx::Error::Protocol(err.to_string());
                    let _ = reply.send(Err(SessionError::Database(refused)));
                }
                Ok(())
            }
            Err(err) => fail_all(unlocks.into_iter().filter_map(|u| u.2), err),
        }
    }
}

/// Tells every caller of a batch that the session has failed (the first gets the error
/// itself), and ends the session.
fn fail_all<T>(
    replies: impl Iterator<Item = tokio::sync::oneshot::Sender<Result<T, SessionError>>>,
    err: SessionError,
) -> Result<(), Broken> {
    let pooled = matches!(err, SessionError::Pooled);
    let mut first = Some(err);
    for reply in replies {
        let err = match first.take() {
            Some(err) => err,
            None if pooled => SessionError::Pooled,
            None => SessionError::Closed(None),
        };
        let _ = reply.send(Err(err));
    }
    Err(Broken)
}
