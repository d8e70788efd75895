//! How a holder learns that its lock is gone.

mod liveness;

pub(crate) use self::liveness::Liveness;

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use tokio_util::sync::CancellationToken;

/// Why a held lock went from its holder.
///
/// A PostgreSQL advisory lock lives exactly as long as the session that took it. When that
/// session ends behind the holder's back, the server frees the lock and another process may take
/// it, while the holder still believes it holds it. The manager watches its held locks and
/// declares them lost when it sees this happen, or when it can no longer tell.
///
/// A holder is also told when the lock is taken from it through the manager
/// ([`Released`](LossCause::Released), [`ReleasedAll`](LossCause::ReleasedAll)): its work is
/// no longer protected either way. Only the guard's own release is silent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossCause {
    /// The server no longer shows the lock on its session: the session was terminated
    /// (`pg_terminate_backend`, `idle_session_timeout`, a server restart or failover, a network
    /// failure the server noticed) and the server freed the lock.
    NotOnServer,
    /// The server could not be asked for longer than the probe interval plus the grace period,
    /// so the lock may have been given to someone else in the meantime.
    Unverifiable,
    /// The manager closed the session that held the lock (a statement on it went unanswered
    /// or broke the connection), so it can neither release the lock nor confirm it. The
    /// server may still hold it until it notices the session is gone; no one else can have
    /// it before then, but the holder no longer controls it.
    SessionClosed,
    /// Released through the manager by key ([`release`](crate::LockManagerExt::release))
    /// rather than through the guard: the holder no longer has it, though nothing failed.
    Released,
    /// Released through the manager with every other lock it held
    /// ([`release_all`](crate::LockManager::release_all)), typically at shutdown.
    ReleasedAll,
    /// The session holding the lock went unheard for longer than the manager's
    /// [`silence_timeout`](crate::PostgresLockManagerBuilder::silence_timeout): the process was
    /// frozen (`SIGSTOP`, a stalled VM, a debugger), starved, or cut off from the server, and
    /// the server ends such a session and frees its locks. Reported as soon as the holder runs
    /// again, before its work is polled, whether or not the server has ended the session yet.
    Expired,
    /// Declared lost on purpose, for tests (see
    /// [`InMemoryLockManager::simulate_loss`](crate::InMemoryLockManager::simulate_loss)).
    Simulated,
}

impl LossCause {
    /// A stable, machine-readable name of the cause: `not_on_server`, `unverifiable`,
    /// `session_closed`, `expired`, `released`, `released_all` or `simulated`. It is the `pglock.cause` label of the lost-lock metric, fit for alert rules
    /// and dashboards, and never changes for a cause; `Display` gives the English sentence
    /// instead.
    ///
    /// ```
    /// use pglock::LossCause;
    ///
    /// assert_eq!(LossCause::NotOnServer.as_str(), "not_on_server");
    /// assert_eq!(
    ///     LossCause::NotOnServer.to_string(),
    ///     "the server no longer holds it for this session",
    /// );
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            LossCause::NotOnServer => "not_on_server",
            LossCause::Unverifiable => "unverifiable",
            LossCause::SessionClosed => "session_closed",
            LossCause::Expired => "expired",
            LossCause::Released => "released",
            LossCause::ReleasedAll => "released_all",
            LossCause::Simulated => "simulated",
        }
    }
}

impl LossCause {
    /// True for [`Released`](LossCause::Released) and [`ReleasedAll`](LossCause::ReleasedAll):
    /// the lock was let go on purpose through the manager, not lost to a failure.
    pub fn is_release(&self) -> bool {
        matches!(self, LossCause::Released | LossCause::ReleasedAll)
    }
}

impl fmt::Display for LossCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LossCause::NotOnServer => "the server no longer holds it for this session",
            LossCause::Unverifiable => {
                "the server could not be reached to confirm it within the grace period"
            }
            LossCause::SessionClosed => {
                "the manager closed the session holding it, so it can no longer release it"
            }
            LossCause::Expired => {
                "its session went unheard for longer than the silence timeout, after which the \
                 server ends it"
            }
            LossCause::Released => "it was released through the manager by key",
            LossCause::ReleasedAll => "the manager released all its locks",
            LossCause::Simulated => "loss simulated by the test double",
        })
    }
}

/// A one-shot signal that fires when a lock is declared lost.
///
/// Every [`LockGuard`](crate::LockGuard) carries one; see
/// [`LockGuard::loss_signal`](crate::LockGuard::loss_signal). It fires when the lock is declared
/// lost, and when it is released through the manager rather than through the guard.
/// Clones observe the same signal. Implementors of
/// [`LockManager`](crate::LockManager) fire it with [`declare`](LossSignal::declare); a signal
/// from a manager that cannot detect loss simply never fires.
#[derive(Clone, Default)]
pub struct LossSignal {
    state: Arc<State>,
    /// What makes the signal count as fired ([`LossCause::Expired`]) as soon as anyone looks
    /// at it, without waiting for the manager's own tasks, which a frozen process runs only
    /// after the code that looks.
    expiry: Expiry,
}

/// When a signal's lock may be gone without anyone having said so yet.
#[derive(Clone, Default)]
enum Expiry {
    /// Only when declared.
    #[default]
    Never,
    /// Once the session holding the lock has been silent for longer than the server allows.
    Session(Arc<Liveness>),
    /// Once any of these has: a set's signal looks at each of its locks' own.
    AnyOf(Arc<[LossSignal]>),
}

/// What every clone of a signal shares (one allocation).
#[derive(Default)]
struct State {
    cause: OnceLock<LossCause>,
    /// Made on first demand ([`LossSignal::lost`], [`LossSignal::token`]): most signals are
    /// never awaited, and a token is an allocation of its own. A mutex rather than a `OnceLock`
    /// so that a token made while the signal fires is cancelled either by `declare` or by its
    /// maker, never by neither.
    token: Mutex<Option<CancellationToken>>,
    /// Set once the acquisition ended without a loss (its guard released it, or handed it on):
    /// its session's later silence is no longer this signal's business.
    settled: AtomicBool,
    /// Signals that fire with this one, at the same moment (a set's, for each of its guards).
    followers: Mutex<Vec<LossSignal>>,
}

impl LossSignal {
    /// A signal that has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// Fires the signal. The first cause wins; later calls do nothing and return false.
    pub fn declare(&self, cause: LossCause) -> bool {
        let first = self.state.cause.set(cause.clone()).is_ok();
        if first && let Some(token) = &*crate::sync::lock(&self.state.token) {
            token.cancel();
        }
        if first {
            let followers = std::mem::take(&mut *crate::sync::lock(&self.state.followers));
            for follower in followers {
                follower.declare(cause.clone());
            }
        }
        first
    }

    /// Makes `follower` fire whenever this signal is declared, at that moment (at once if it
    /// already was).
    pub(crate) fn forward_to(&self, follower: &LossSignal) {
        let mut followers = crate::sync::lock(&self.state.followers);
        // Checked under the lock `declare` takes after setting the cause: a cause set from
        // now on finds the follower in the list.
        match self.state.cause.get() {
            Some(cause) => {
                drop(followers);
                follower.declare(cause.clone());
            }
            None => followers.push(follower.clone()),
        }
    }

    /// The signal of a lock held on a session that `liveness` describes (`None`: no expiry).
    pub(crate) fn expiring(mut self, liveness: Option<Arc<Liveness>>) -> Self {
        self.expiry = liveness.map_or(Expiry::Never, Expiry::Session);
        self
    }

    /// A signal that fires, at that moment, whenever any of `signals` fires, and that counts
    /// as fired as soon as any of theirs has run out when looked at: a set's, for its locks.
    pub(crate) fn any_of(signals: Vec<LossSignal>) -> Self {
        let any = LossSignal::new();
        for signal in &signals {
            signal.forward_to(&any);
        }
        LossSignal {
            expiry: Expiry::AnyOf(signals.into()),
            ..any
        }
    }

    /// The acquisition ended quietly (released by its guard, or handed on): the signal will not
    /// fire for its session's silence from now on.
    pub(crate) fn settle(&self) {
        self.state.settled.store(true, Ordering::Release);
    }

    /// Fires the signal as [`LossCause::Expired`] if its session's silence has run out.
    fn check_expiry(&self) {
        if self.state.settled.load(Ordering::Acquire) {
            return;
        }
        match &self.expiry {
            Expiry::Never => {}
            Expiry::Session(liveness) => {
                if liveness.expired() {
                    self.declare(LossCause::Expired);
                }
            }
            // Each fires this one as it fires (`forward_to`).
            Expiry::AnyOf(signals) => signals.iter().for_each(LossSignal::check_expiry),
        }
    }

    /// True once the lock has been declared lost (or its session has gone unheard for longer
    /// than the server allows).
    pub fn is_lost(&self) -> bool {
        self.check_expiry();
        self.state.cause.get().is_some()
    }

    /// Why the lock was lost, once it has been.
    pub fn cause(&self) -> Option<LossCause> {
        self.check_expiry();
        self.state.cause.get().cloned()
    }

    /// Completes when the lock is declared lost (never, if it is not).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> LossCause {
        self.token().cancelled_owned().await;
        self.state
            .cause
            .get()
            .cloned()
            .expect("the cause is set before the token is cancelled")
    }

    /// Runs `work` until it finishes or the signal fires, whichever comes first, and then
    /// drops it: the one way every recipe of this crate stops work when its lock goes.
    /// Biased to the signal: work that finishes at the moment the lock goes counts as cut
    /// short, since it cannot be assumed to have run alone.
    ///
    /// [`LockGuard::run`](crate::LockGuard::run) adds to this the refusal of nested
    /// acquisitions; use this one where the work runs apart from the guard, as a leader's work
    /// or the steps of a longer operation do.
    ///
    /// # Errors
    ///
    /// The cause, when the signal fired before `work` finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `work`.
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LossCause};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let guard = locks.acquire("projection:orders", None).await?;
    /// let signal = guard.loss_signal().clone();
    /// locks.release("projection:orders").await?;
    /// let cut = signal.run_until_lost(std::future::pending::<()>()).await;
    /// assert_eq!(cut, Err(LossCause::Released));
    /// # Ok(()) }
    /// ```
    pub async fn run_until_lost<F: std::future::Future>(
        &self,
        work: F,
    ) -> Result<F::Output, LossCause> {
        let mut work = std::pin::pin!(work);
        let lost = self.lost();
        let mut lost = std::pin::pin!(lost);
        std::future::poll_fn(|cx| {
            // Before every poll of the work: a process that was frozen past its session's
            // silence runs this before anything of the manager's, and must not go on.
            self.check_expiry();
            if let Poll::Ready(cause) = lost.as_mut().poll(cx) {
                return Poll::Ready(Err(cause));
            }
            work.as_mut().poll(cx).map(Ok)
        })
        .await
    }

    /// A token cancelled when the lock is declared lost, for `select!`, `run_until_cancelled`
    /// or handing to code that already speaks `CancellationToken`.
    pub fn token(&self) -> CancellationToken {
        let mut token = crate::sync::lock(&self.state.token);
        let token = token.get_or_insert_with(CancellationToken::new);
        // Fired before the token existed: `declare` found none to cancel.
        if self.state.cause.get().is_some() {
            token.cancel();
        }
        token.clone()
    }
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("cause", &self.state.cause.get())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The token is made on first demand; whichever comes first, the token or the loss, a token
    // of a lost signal is cancelled.
    #[test]
    fn a_token_asked_for_after_the_loss_is_cancelled_already() {
        let signal = LossSignal::new();
        assert!(signal.declare(LossCause::Simulated));
        assert!(signal.token().is_cancelled());
    }

    #[test]
    fn a_token_asked_for_before_the_loss_is_cancelled_by_it() {
        let signal = LossSignal::new();
        let token = signal.token();
        assert!(!token.is_cancelled());
        assert!(signal.declare(LossCause::Simulated));
        assert!(token.is_cancelled());
        assert!(
            !signal.declare(LossCause::Released),
            "the first cause stays"
        );
        assert_eq!(signal.cause(), Some(LossCause::Simulated));
    }
}
