//! A manager's turn on one key: a FIFO queue of its own tasks, through which a holder can hand
//! its still-locked session straight to the next task.
//!
//! Whoever owns the turn is the manager's only acquirer or holder of the key, so in-process
//! contenders never open a second session (which would queue behind, or deadlock on, the first)
//! and never stack PostgreSQL's re-entrant locks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};

use crate::LockMode;

/// A session that still holds the server lock, handed from one local holder to the next.
pub(crate) struct Handoff<S> {
    pub(crate) session: S,
    /// The lock's place in the manager's budget, which goes with it.
    pub(crate) slot: super::Slot,
    pub(crate) mode: LockMode,
    /// When the server granted the lock this session still holds.
    pub(crate) since: Instant,
    /// How many times it has been handed over without going back to the server.
    pub(crate) handoffs: u32,
    /// The next holder's fencing token, minted as the session was heard from.
    pub(crate) token: Option<i64>,
}

struct Waiter<S> {
    id: u64,
    mode: LockMode,
    grant: oneshot::Sender<Option<Handoff<S>>>,
}

struct State<S> {
    owned: bool,
    waiters: VecDeque<Waiter<S>>,
    next_id: u64,
}

pub(crate) struct Turn<S> {
    state: Mutex<State<S>>,
}

impl<S> Default for Turn<S> {
    fn default() -> Self {
        Turn {
            state: Mutex::new(State {
                owned: false,
                waiters: VecDeque::new(),
                next_id: 0,
            }),
        }
    }
}

impl<S: Send + 'static> Turn<S> {
    fn state(&self) -> MutexGuard<'_, State<S>> {
        crate::sync::lock(&self.state)
    }

    /// Takes the turn if nobody owns it.
    pub(crate) fn try_take(self: &Arc<Self>) -> Option<TurnPermit<S>> {
        let mut state = self.state();
        if state.owned {
            return None;
        }
        state.owned = true;
        Some(TurnPermit {
            turn: Arc::clone(self),
        })
    }

    /// Waits for the turn (FIFO) until `deadline`. Comes with the previous owner's session when
    /// it handed the lock over.
    ///
    /// Cancel safe: a dropped waiter leaves the queue, and a turn granted to it at that very
    /// moment is passed on.
    pub(crate) async fn take(
        self: &Arc<Self>,
        mode: LockMode,
        deadline: Option<Instant>,
    ) -> Option<(TurnPermit<S>, Option<Handoff<S>>)> {
        let (id, receiver) = {
            let mut state = self.state();
            if !state.owned {
                state.owned = true;
                let permit = TurnPermit {
                    turn: Arc::clone(self),
                };
                return Some((permit, None));
            }
            let (grant, receiver) = oneshot::channel();
            let id = state.next_id;
            state.next_id += 1;
            state.waiters.push_back(Waiter { id, mode, grant });
            (id, receiver)
        };
        let mut waiting = Waiting {
            turn: Arc::clone(self),
            id,
            receiver: Some(receiver),
        };
        let receiver = waiting.receiver.as_mut().expect("set above");
        let granted = match deadline {
            Some(deadline) => timeout_at(deadline, receiver).await.ok()?,
            None => receiver.await,
        };
        waiting.receiver = None;
        let handoff = granted.expect("a queued waiter's sender is only dropped after sending");
        let permit = TurnPermit {
            turn: Arc::clone(self),
        };
        Some((permit, handoff))
    }

    /// Gives the turn to the next waiter, with `handoff` if any; returns the handoff back when
    /// nobody is waiting (the caller must then release it).
    fn pass(&self, mut handoff: Option<Handoff<S>>) -> Option<Handoff<S>> {
        let mut state = self.state();
        while let Some(waiter) = state.waiters.pop_front() {
            if handoff.as_ref().is_some_and(|h| h.mode != waiter.mode) {
                // The queue changed under a cancellation and the next waiter wants the other
                // mode: close the session (which frees its lock) and let the waiter ask the
                // server.
                drop(handoff.take());
            }
            match waiter.grant.send(handoff) {
                Ok(()) => return None,
                // Only reachable if a receiver vanished without its guard: try the next one.
                Err(returned) => handoff = returned,
            }
        }
        state.owned = false;
        handoff
    }
}

/// Ownership of a key's turn. Dropping it passes the turn on without a session.
pub(crate) struct TurnPermit<S: Send + 'static> {
    turn: Arc<Turn<S>>,
}

impl<S: Send + 'static> TurnPermit<S> {
    /// Whether a local waiter is queued for the turn (a handoff is worth weighing).
    pub(crate) fn is_awaited(&self) -> bool {
        !self.turn.state().waiters.is_empty()
    }

    /// Hands `handoff` (a session still holding the lock) and the turn to the next local waiter,
    /// if one is queued and wants the same mode; otherwise gives both back, the turn still
    /// owned.
    pub(crate) fn hand_over(self, handoff: Handoff<S>) -> Result<(), (Self, Handoff<S>)> {
        let mut handoff = handoff;
        {
            let mut state = self.turn.state();
            while state
                .waiters
                .front()
                .is_some_and(|w| w.mode == handoff.mode)
            {
                let waiter = state.waiters.pop_front().expect("checked above");
                match waiter.grant.send(Some(handoff)) {
                    Ok(()) => {
                        drop(state);
                        // The turn went with the session: do not pass it again on drop.
                        let turn = Arc::clone(&self.turn);
                        std::mem::forget(self);
                        drop(turn);
                        return Ok(());
                    }
                    Err(returned) => {
                        handoff = returned.expect("we sent a handoff");
                    }
                }
            }
        }
        Err((self, handoff))
    }
}

impl<S: Send + 'static> Drop for TurnPermit<S> {
    fn drop(&mut self) {
        // Dropping a session closes it, which frees its lock: nothing handed back is lost.
        drop(self.turn.pass(None));
    }
}

/// A queued waiter; if dropped before it is served, it leaves the queue, or passes on a turn
/// granted to it in the meantime.
struct Waiting<S: Send + 'static> {
    turn: Arc<Turn<S>>,
    id: u64,
    receiver: Option<oneshot::Receiver<Option<Handoff<S>>>>,
}

impl<S: Send + 'static> Drop for Waiting<S> {
    fn drop(&mut self) {
        let Some(mut receiver) = self.receiver.take() else {
            return;
        };
        let mut state = self.turn.state();
        if let Some(at) = state.waiters.iter().position(|w| w.id == self.id) {
            state.waiters.remove(at);
            return;
        }
        // Not queued any more, so the grant was sent (under this same mutex): it is ours to
        // pass on.
        drop(state);
        if let Ok(handoff) = receiver.try_recv() {
            if super::planted!(CancelledGrantKept) {
                return;
            }
            drop(self.turn.pass(handoff));
        }
    }
}
