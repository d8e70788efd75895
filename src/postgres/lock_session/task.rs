//! The task that owns a lock session: runs the commands sent to it, settles what a caller on
//! the idle path left unfinished, keeps the session heard, and retires or closes it.

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::link::{Link, Watchdog};
use super::{Command, Lease, LockSession, SessionError, SessionEvents, Shared, TryAnswer};
use crate::{LockMode, LockTarget, LossCause};

pub(super) struct Task {
    pub(super) id: u64,
    /// The connection while the task runs something on it; between commands it is parked in
    /// the shared spot, where callers on the idle path may borrow it.
    pub(super) link: Option<Box<Link>>,
    /// Wakes the task to ping or retire its session.
    pub(super) timer: Watchdog,
    /// When the task last ran a command (callers' statements count through `last_used`).
    pub(super) last_active: Instant,
    pub(super) inbox: mpsc::UnboundedReceiver<Command>,
    pub(super) me: Weak<LockSession>,
    pub(super) shared: Arc<Shared>,
    pub(super) events: Weak<dyn SessionEvents>,
    /// A command taken from the inbox while gathering a batch it did not belong to: the next
    /// to run.
    pub(super) pending: Option<Command>,
}

/// The connection can no longer be used; the task ends and closes it.
pub(super) struct Broken;

const CLAIMED: &str = "the task holds the connection while it runs a command";

impl Drop for Task {
    fn drop(&mut self) {
        // However the task ends (its last handle gone, or its runtime shutting down), the
        // connection leaves with it: back to the pool when clean and holding nothing; closed,
        // never pooled, when it may still hold a lock, and the holders of those locks are told
        // (a task that ended through `close` has told them already).
        self.shared.unavailable.store(true, Ordering::SeqCst);
        // Ended before the parked connection is taken: a caller that still has it (on another
        // runtime, say) then closes it when it puts it back (see `Shared::park`).
        let first = self.shared.ended.set(LossCause::SessionClosed).is_ok();
        let mut parked = self.shared.take_parked();
        if self.shared.held.load(Ordering::SeqCst) != 0 {
            for link in [self.link.as_mut(), parked.as_mut()].into_iter().flatten() {
                link.conn.mark_dirty();
            }
            if first && let Some(events) = self.events.upgrade() {
                events.closed(self.id);
            }
        }
    }
}

impl Task {
    pub(super) async fn run(mut self) {
        loop {
            let command = match self.next().await {
                Ok(Some(command)) => command,
                // Every handle is gone, so every lease was unlocked: the connection goes back
                // to the pool as the task ends (see `Drop`).
                Ok(None) => return,
                Err(cause) => return self.close(cause),
            };
            // The command in hand is dropped if the connection does not come back: its caller
            // hears that the session closed, and tries another.
            if let Err(cause) = self.claim().await {
                return self.close(cause);
            }
            let (outcome, ran) = self.execute_queued(command).await;
            self.last_active = Instant::now();
            self.shared.queued.fetch_sub(ran, Ordering::SeqCst);
            if outcome.is_err() {
                // A statement left unanswered past the session's silence bound: the server may
                // have ended the session for it.
                let cause = if self.shared.liveness.expired() {
                    LossCause::Expired
                } else {
                    LossCause::SessionClosed
                };
                return self.close(cause);
            }
        }
    }

    /// Takes the connection back from the spot, waiting for a caller that borrowed it to put
    /// it back. A caller polled to the end of its statement does so within two statement
    /// bounds (the statement, and the settling of a refused one); one that stops being polled
    /// half-way holds the connection for as long as it is not polled. Past those bounds the
    /// session is given up, as when the server leaves a statement unanswered: its locks (the
    /// borrower's own at most, see `LockSession::borrow`) can no longer be vouched for.
    async fn claim(&mut self) -> Result<(), LossCause> {
        let due = Instant::now() + 2 * self.shared.context.statement_timeout;
        while self.link.is_none() {
            let returned = self.shared.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            match self.shared.take_parked() {
                Some(link) => self.link = Some(link),
                None => {
                    tokio::select! {
                        () = returned => {}
                        () = self.timer.until(due) => return Err(LossCause::Unverifiable),
                    }
                }
            }
        }
        Ok(())
    }

    /// The next command. Meanwhile, leaves the connection to callers, pings the session
    /// whenever it has gone unheard for the heartbeat interval, and retires it once it has held
    /// nothing for the idle timeout. Fails with the cause of the loss of its locks once the
    /// session is gone, or may be.
    async fn next(&mut self) -> Result<Option<Command>, LossCause> {
        loop {
            if self.shared.liveness.expired() {
                // Unheard for longer than the server allows (the process was frozen, or
                // starved): the session may be gone, and its locks with it.
                return Err(LossCause::Expired);
            }
            if let Some(command) = self.pending.take() {
                return Ok(Some(command));
            }
            // Commands first: one may settle what a caller left on the connection, which must
            // come before anything else runs on it, a heartbeat included.
            if let Ok(command) = self.inbox.try_recv() {
                return Ok(Some(command));
            }
            if let Some(link) = self.link.take() {
                self.shared.park(link);
            }
            let (idle_until, ping_at) = self.deadlines();
            if ping_at.is_some_and(|at| Instant::now() >= at) {
                self.ping().await?;
                continue;
            }
            let Some(wake_at) = [idle_until, ping_at].into_iter().flatten().min() else {
                return Ok(self.inbox.recv().await);
            };
            tokio::select! {
                command = self.inbox.recv() => return Ok(command),
                () = self.timer.until(wake_at) => {}
            }
            // Retired only once the timer has run out, never on the way in: a session just
            // opened is idle, and the caller it was opened for is about to use it.
            if (self.deadlines().0).is_some_and(|at| Instant::now() >= at) {
                self.retire().await?;
            }
        }
    }

    /// When the session retires if it stays idle, and when it is next pinged.
    fn deadlines(&self) -> (Option<Instant>, Option<Instant>) {
        let context = &self.shared.context;
        let held = self.shared.held.load(Ordering::SeqCst);
        let unavailable = self.shared.unavailable.load(Ordering::SeqCst);
        let last_used = self
            .shared
            .liveness
            .reading(self.shared.last_used.load(Ordering::Acquire));
        let idle_until = (held == 0 && !unavailable)
            .then(|| self.last_active.max(last_used) + context.idle_timeout);
        // A session is kept heard while it holds locks, and while it is offered for new ones:
        // a caller on the idle path may take one on it at any moment, unseen.
        let ping_at = (context.heartbeat)
            .filter(|_| held > 0 || !unavailable)
            .map(|heartbeat| self.shared.liveness.last_heard() + heartbeat.every);
        (idle_until, ping_at)
    }

    /// Stops handing the session out, unless it is in use after all: something is queued, or
    /// a caller is running a statement on it (then this first waits for the connection to
    /// come back, as for any command).
    async fn retire(&mut self) -> Result<(), LossCause> {
        self.claim().await?;
        // The task holds the connection, so no caller can borrow it for a new lock while this
        // decides.
        if self.shared.held.load(Ordering::SeqCst) == 0 && self.inbox.is_empty() {
            self.shared.unavailable.store(true, Ordering::SeqCst);
            if let Some(events) = self.events.upgrade() {
                // Handles taken before this still work; the task ends with the last.
                events.retired(self.id);
            }
        }
        Ok(())
    }

    /// One heartbeat: the server's answer confirms the session and every lock on it.
    async fn ping(&mut self) -> Result<(), LossCause> {
        let Some(heartbeat) = self.shared.context.heartbeat else {
            return Ok(());
        };
        self.claim().await?;
        if !self.inbox.is_empty() {
            // A caller that had the connection left a command to settle its statement (sent
            // before the connection came back), or a command came meanwhile: it runs first.
            return Ok(());
        }
        if self.shared.liveness.expired() {
            // Woken after a freeze: the silence is what ended the session, whatever a ping
            // would find now.
            return Err(LossCause::Expired);
        }
        if self.shared.liveness.last_heard() + heartbeat.every > Instant::now() {
            // A caller's statement was answered meanwhile.
            return Ok(());
        }
        let link = self.link.as_mut().expect(CLAIMED);
        match link.ping(heartbeat.answer_within).await {
            Some(Ok(())) => {
                self.shared.liveness.heard(link.conn.heard);
                Ok(())
            }
            // The server ended the session (terminated, restarted, timed out) or the network
            // did: its locks are free on the server.
            Some(Err(err)) => {
                tracing::debug!(pid = link.conn.pid, error = %err, "lock session heartbeat failed");
                Err(LossCause::NotOnServer)
            }
            // No answer: the locks may be given to someone else meanwhile.
            None => Err(LossCause::Unverifiable),
        }
    }

    fn close(mut self, cause: LossCause) {
        self.shared.unavailable.store(true, Ordering::SeqCst);
        // Recorded before anyone is told, so the locks registered from now on see it, and
        // before the connection is looked for, so a caller that has borrowed it closes it.
        let _ = self.shared.ended.set(cause);
        if let Some(link) = self.link.as_mut() {
            link.conn.mark_dirty();
        }
        if let Some(mut link) = self.shared.take_parked() {
            link.conn.mark_dirty();
        }
        // Commands still queued are answered "closed" as their senders see the channel drop.
        self.inbox.close();
        if let Some(events) = self.events.upgrade() {
            events.closed(self.id);
        }
    }

    pub(super) async fn execute(&mut self, command: Command) -> Result<(), Broken> {
        match command {
            Command::Try {
                target,
                mode,
                reply,
            } => self.try_lock(target, mode, reply).await,
            Command::Unlock {
                target,
                mode,
                reply,
            } => {
                let link = self.link.as_mut().expect(CLAIMED);
                let result = link.unlock(&self.shared, target, mode).await;
                // Whatever the server says, this session no longer holds the lock for us:
                // either it unlocked, or it did not hold it, or the session is about to close.
                self.shared.held.fetch_sub(1, Ordering::SeqCst);
                let broken = match &result {
                    Err(
                        SessionError::Closed(_)
                        | SessionError::Unanswered(_)
                        | SessionError::Pooled,
                    ) => true,
                    // The server refused the unlock (a cancelled statement, a statement
                    // timeout): the lock may still be held. Released for sure, or the session
                    // is closed, which frees it.
                    Err(SessionError::Database(_)) => self.reconcile(target, mode).await.is_err(),
                    _ => false,
                };
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
                if broken { Err(Broken) } else { Ok(()) }
            }
            Command::Confirm { target, reply } => {
                let link = self.link.as_mut().expect(CLAIMED);
                let result = link.confirm(&self.shared, target).await;
                let broken = matches!(
                    result,
                    Err(SessionError::Closed(_)
                        | SessionError::Unanswered(_)
                        | SessionError::Pooled)
                );
                let _ = reply.send(result);
                if broken { Err(Broken) } else { Ok(()) }
            }
            // A caller on the idle path went away, or was refused, before its statement's
            // outcome was settled: whatever that statement did to `target`, it is not held now.
            Command::Settle { target, mode } => self.reconcile(target, mode).await,
            Command::Close => Err(Broken),
        }
    }

    pub(super) async fn try_lock(
        &mut self,
        target: LockTarget,
        mode: LockMode,
        reply: oneshot::Sender<TryAnswer>,
    ) -> Result<(), Broken> {
        let link = self.link.as_mut().expect(CLAIMED);
        let (granted, token) = match link.try_lock(&self.shared, target, mode).await {
            Ok(row) => row,
            Err(SessionError::Database(err)) => {
                // A fenced try can fail after its lock was granted (the mint failed), and a
                // session lock survives the failed statement: make sure it is not held.
                self.reconcile(target, mode).await?;
                let _ = reply.send(Err(SessionError::Database(err)));
                return Ok(());
            }
            Err(err) => {
                let _ = reply.send(Err(err));
                return Err(Broken);
            }
        };
        let Some(granted) = granted else {
            let _ = reply.send(Err(SessionError::Pooled));
            return Err(Broken);
        };
        if !granted {
            let _ = reply.send(Ok(None));
            return Ok(());
        }
        if self.deliver(target, mode, token, reply) {
            Ok(())
        } else {
            self.undo(target, mode).await
        }
    }

    /// Hands a granted lock to its caller; false when nobody is left to receive it, and the
    /// lock must be taken back before anything else runs here.
    pub(super) fn deliver(
        &mut self,
        target: LockTarget,
        mode: LockMode,
        token: Option<i64>,
        reply: oneshot::Sender<TryAnswer>,
    ) -> bool {
        self.shared.held.fetch_add(1, Ordering::SeqCst);
        let Some(session) = self.me.upgrade() else {
            // No handle left, so no caller is waiting.
            return false;
        };
        let lease = Lease::new(session, target, mode);
        match reply.send(Ok(Some((lease, token)))) {
            Ok(()) => true,
            Err(unsent) => {
                if let Ok(Some((lease, _))) = unsent {
                    lease.disarm();
                }
                false
            }
        }
    }

    pub(super) async fn undo(&mut self, target: LockTarget, mode: LockMode) -> Result<(), Broken> {
        let link = self.link.as_mut().expect(CLAIMED);
        let result = link.unlock(&self.shared, target, mode).await;
        self.shared.held.fetch_sub(1, Ordering::SeqCst);
        match result {
            Ok(_) => Ok(()),
            // Refused: make sure it is not held, or close the session, which frees it.
            Err(SessionError::Database(_)) => self.reconcile(target, mode).await,
            Err(_) => Err(Broken),
        }
    }

    /// Releases `target` in `mode` if, and only if, this session holds it.
    pub(super) async fn reconcile(
        &mut self,
        target: LockTarget,
        mode: LockMode,
    ) -> Result<(), Broken> {
        let link = self.link.as_mut().expect(CLAIMED);
        link.reconcile(&self.shared, target, mode)
            .await
            .map_err(|_| Broken)
    }
}
