//! The registry of held locks: what a manager holds, through which session, since when, and
//! the rules for letting go (by key, by generation, all at once, or as a loss).

use std::collections::HashMap;

use super::FastHash;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;
use tracing::Instrument;

use super::turn::{Handoff, Turn, TurnPermit};
use super::{Backend, Core, Request, Slot, Slots, Stage};
use crate::telemetry::spans::{self, Outcome};
use crate::telemetry::{self, outcome, via};
use crate::{
    Error, HeldLock, LockInfo, LockKey, LockMode, LockTarget, LossCause, LossSignal, Result,
};

pub(super) struct State<S: Send + 'static> {
    pub(super) held: HashMap<LockKey, Held<S>, FastHash>,
    /// One FIFO turn per key (see `turn.rs`).
    pub(super) turns: Slots<LockKey, Turn<S>>,
}

pub(super) struct Held<S: Send + 'static> {
    pub(super) generation: u64,
    pub(super) target: LockTarget,
    pub(super) mode: LockMode,
    pub(super) signal: LossSignal,
    /// When this acquisition was registered, right after its `info` was stamped: the grant to
    /// its caller on the monotonic clock, from which `held_locks` counts (after a handoff too).
    pub(super) registered_at: Instant,
    /// The acquisition as its guard describes it, for `held_locks`.
    pub(super) info: LockInfo,
    /// When the server granted the lock this session holds (earlier than `registered_at` after
    /// a handoff) and how many handoffs it has been through.
    pub(super) since: Instant,
    pub(super) handoffs: u32,
    // Field order matters: the session (which may still hold the lock) goes before the turn,
    // so a local waiter never starts before the lock is at least being let go.
    pub(super) session: S,
    /// The lock's place in the manager's budget, given back once it is let go.
    pub(super) slot: Slot,
    pub(super) turn: TurnPermit<S>,
}

/// A granted session about to be registered, with its history.
pub(super) struct Granted<S: Send + 'static> {
    pub(super) session: S,
    pub(super) slot: Slot,
    pub(super) token: Option<i64>,
    pub(super) since: Instant,
    pub(super) handoffs: u32,
}

/// A held lock whose session has ended, as the loss detector sees it.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub(crate) key: LockKey,
    pub(crate) generation: u64,
    /// Why its session ended: the lock went with it.
    pub(crate) ended: LossCause,
}

impl<S: Send + 'static> State<S> {
    pub(super) fn new() -> Self {
        State {
            held: HashMap::default(),
            turns: Slots::new(Turn::default),
        }
    }

    pub(super) fn turn(&mut self, key: &LockKey) -> Arc<Turn<S>> {
        self.turns.get(key)
    }

    pub(super) fn take_generation(&mut self, key: &LockKey, generation: u64) -> Option<Held<S>> {
        // Removed first and put back if it is another acquisition's (rare: a guard outliving a
        // release of its key), so the usual case looks the key up once.
        let held = self.held.remove(key)?;
        if held.generation != generation {
            self.held.insert(key.clone(), held);
            return None;
        }
        // Whatever follows (a release, a handoff, a declared loss), the session's later
        // silence is not this acquisition's loss.
        held.signal.settle();
        Some(held)
    }
}

impl<B: Backend> Core<B> {
    pub(super) async fn register(
        self: &Arc<Self>,
        request: &Request<'_>,
        granted: Granted<B::Session>,
        turn: TurnPermit<B::Session>,
        info: LockInfo,
    ) -> (u64, LossSignal) {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let signal = LossSignal::new().expiring(B::liveness(&granted.session));
        let held = Held {
            generation,
            target: request.target,
            mode: request.mode,
            signal: signal.clone(),
            // A lock fresh from the server was granted a moment ago: one clock read serves both.
            registered_at: if granted.handoffs == 0 {
                granted.since
            } else {
                Instant::now()
            },
            info,
            since: granted.since,
            handoffs: granted.handoffs,
            session: granted.session,
            slot: granted.slot,
            turn,
        };
        let session_ended = {
            let mut state = self.state();
            // Holding the key's turn makes this the only live acquisition of the key here.
            // Checked under the registry lock, which the loss detector takes to look: a session
            // that ends from now on finds the lock in the registry; one that ended before is
            // reported here.
            let ended = B::ended(&held.session).is_some() && !super::planted!(LossRace);
            let previous = state.held.insert(request.key.clone(), held);
            debug_assert!(previous.is_none(), "two live acquisitions of one key");
            self.set_held(state.held.len());
            ended
        };
        B::watch(self, session_ended);
        (generation, signal)
    }

    /// The locks held right now whose sessions have ended, for the loss detector.
    pub(crate) async fn watched(&self) -> Vec<Watched> {
        let state = self.state();
        state
            .held
            .iter()
            .filter_map(|(key, held)| {
                Some(Watched {
                    key: key.clone(),
                    generation: held.generation,
                    ended: B::ended(&held.session)?,
                })
            })
            .collect()
    }

    /// The port's `held_locks`: every registered acquisition, the longest held first, each aged
    /// against one reading of the clock.
    pub(crate) async fn held_locks(&self) -> Vec<HeldLock> {
        let state = self.state();
        let now = Instant::now();
        let mut held: Vec<(Instant, u64, HeldLock)> = state
            .held
            .values()
            .map(|held| {
                let held_for = now.saturating_duration_since(held.registered_at);
                let listed = HeldLock::new(held.info.clone(), held_for);
                (held.registered_at, held.generation, listed)
            })
            .collect();
        drop(state);
        held.sort_unstable_by_key(|(at, generation, _)| (*at, *generation));
        held.into_iter().map(|(_, _, listed)| listed).collect()
    }

    /// Declares whatever acquisition of `key` is registered lost (see `declare_lost`).
    pub(crate) async fn declare_key_lost(&self, key: &LockKey, cause: LossCause) -> bool {
        let generation = self.state().held.get(key).map(|h| h.generation);
        match generation {
            Some(generation) => self.declare_lost(key, generation, cause).await,
            None => false,
        }
    }

    /// Declares the acquisition `generation` of `key` lost: the registry forgets it, its
    /// session is dropped (which frees the lock if it is still held), its signal fires and the
    /// next local waiter may start. Returns false when that acquisition is no longer registered.
    pub(crate) async fn declare_lost(
        &self,
        key: &LockKey,
        generation: u64,
        cause: LossCause,
    ) -> bool {
        let held = {
            let mut state = self.state();
            let held = state.take_generation(key, generation);
            self.set_held(state.held.len());
            // Fire the signal before the registry lock is released: whoever finds the entry
            // gone (a guard's release, an election's check) then also finds it lost.
            if let Some(held) = &held {
                held.signal.declare(cause.clone());
            }
            held
        };
        let Some(held) = held else {
            return false;
        };
        if self.tracing {
            spans::lost(
                key,
                held.target.packed(),
                held.mode,
                self.holder_id(),
                &cause,
            );
        }
        self.metrics.lost(&cause);
        drop(held);
        true
    }

    /// Removes `key` from the registry, whoever acquired it, and tells its guard.
    fn forget(&self, key: &LockKey) -> Option<Held<B::Session>> {
        let mut state = self.state();
        let held = state.held.remove(key);
        self.set_held(state.held.len());
        // Under the registry lock, as for a loss: a guard that finds its entry gone also
        // finds out why.
        if let Some(held) = &held {
            held.signal.declare(LossCause::Released);
        }
        held
    }

    /// Removes `key` from the registry only if it is still the acquisition `generation`.
    pub(super) fn forget_generation(
        &self,
        key: &LockKey,
        generation: u64,
    ) -> Option<Held<B::Session>> {
        let mut state = self.state();
        let held = state.take_generation(key, generation);
        self.set_held(state.held.len());
        held
    }

    pub(crate) async fn release(&self, key: &LockKey) -> Result<()> {
        let mut recorder = self.release_outcome(key, via::KEY);
        let Some(held) = self.forget(key) else {
            recorder.record(telemetry::LOCK_ID, key.target().packed());
            recorder.finish(outcome::NOT_HELD, false);
            return Err(Error::NotHeld { key: key.clone() });
        };
        self.unlock(key, held, recorder).await
    }

    pub(crate) async fn release_all(&self) -> Result<usize> {
        let drained: Vec<(LockKey, Held<B::Session>)> = {
            let mut state = self.state();
            let drained: Vec<(LockKey, Held<B::Session>)> = state.held.drain().collect();
            self.set_held(0);
            for (_, held) in &drained {
                if !super::planted!(ReleaseAllUntold) {
                    held.signal.declare(LossCause::ReleasedAll);
                }
            }
            drained
        };
        // If this future is dropped part-way, the remaining entries drop with it, and dropping
        // a session lets its lock go in the background.
        let mut released = 0;
        for (key, held) in drained {
            let recorder = self.release_outcome(&key, via::RELEASE_ALL);
            if self.unlock(&key, held, recorder).await.is_ok() {
                released += 1;
            }
        }
        Ok(released)
    }

    pub(super) async fn release_generation(
        &self,
        key: &LockKey,
        generation: u64,
        how: &'static str,
    ) -> Result<()> {
        let mut recorder = self.release_outcome(key, how);
        match self.forget_generation(key, generation) {
            Some(held) => self.unlock(key, held, recorder).await,
            None => {
                recorder.record(telemetry::LOCK_ID, key.target().packed());
                recorder.finish(outcome::ALREADY_RELEASED, false);
                Ok(())
            }
        }
    }

    pub(super) fn release_outcome(&self, key: &LockKey, how: &'static str) -> Outcome {
        spans::release(self.tracing, key, self.holder_id(), how)
    }

    /// Lets go of a lock the registry has already forgotten: hands it to the next local waiter
    /// when the handoff limits allow, otherwise unlocks it on the server and then lets the next
    /// local waiter in.
    pub(super) async fn unlock(
        &self,
        key: &LockKey,
        held: Held<B::Session>,
        mut recorder: Outcome,
    ) -> Result<()> {
        recorder.record(telemetry::LOCK_ID, held.target.packed());
        recorder.record(telemetry::MODE, held.mode.as_str());
        if self.metrics.is_on() {
            self.metrics
                .hold_time(held.mode, held.registered_at.elapsed());
        }
        if let Some(pause) = self.checkpoint(Stage::Unlock, key) {
            pause.await;
        }
        let Held {
            target,
            mode,
            session,
            slot,
            turn,
            since,
            handoffs,
            ..
        } = held;
        // The clock is read only when there is someone to hand over to.
        let within_limits = self.handoff.is_some_and(|limits| {
            let limit = limits.max_handoffs + u32::from(super::planted!(HandoffPastLimit));
            handoffs < limit && turn.is_awaited() && since.elapsed() < limits.max_hold
        });
        let (turn, session, slot) = if within_limits {
            let handoff = Handoff {
                session,
                slot,
                mode,
                since,
                handoffs: handoffs + 1,
                token: None,
            };
            match self.hand_over(key, target, turn, handoff, &recorder).await {
                Ok(None) => {
                    recorder.finish(outcome::HANDED_OVER, false);
                    return Ok(());
                }
                Ok(Some(back)) => back,
                Err(err) => return released(recorder, Err(err)),
            }
        } else {
            (turn, session, slot)
        };
        let unlock = self.backend.unlock(key, target, mode, session);
        let result = match recorder.span() {
            None => unlock.await,
            Some(span) => unlock.instrument(span.clone()).await,
        };
        // The place in the budget comes back once the server has let the lock go.
        if result.is_err() && super::planted!(SlotKeptOnFailedUnlock) {
            std::mem::forget(slot);
            drop(turn);
        } else {
            drop((slot, turn));
        }
        released(recorder, result)
    }

    /// Hands the lock to the next local waiter once its session has answered: it may have
    /// ended unseen since the grant, and a release that hands the lock over is confirmed only
    /// as an unlock is. `Ok(None)` when handed over; the turn, session and slot back when the
    /// waiter has gone meanwhile (the lock is then unlocked on the server); an error when the
    /// session did not answer (the lock went with it, and everything is dropped).
    async fn hand_over(
        &self,
        key: &LockKey,
        target: LockTarget,
        turn: TurnPermit<B::Session>,
        mut handoff: Handoff<B::Session>,
        recorder: &Outcome,
    ) -> Result<Option<(TurnPermit<B::Session>, B::Session, Slot)>> {
        let confirm = self.backend.confirm(key, target, &mut handoff.session);
        let confirmed = match recorder.span() {
            None => confirm.await,
            Some(span) => confirm.instrument(span.clone()).await,
        };
        handoff.token = match confirmed {
            Ok(token) => token,
            Err(_) if super::planted!(HandoffUnheard) => None,
            Err(err) => return Err(err),
        };
        match turn.hand_over(handoff) {
            Ok(()) => Ok(None),
            Err((turn, handoff)) => Ok(Some((turn, handoff.session, handoff.slot))),
        }
    }
}

/// Records how a release that reached the backend ended, and returns it.
fn released(mut recorder: Outcome, result: Result<()>) -> Result<()> {
    match &result {
        Ok(()) => recorder.finish(outcome::RELEASED, false),
        Err(err) => {
            spans::warn_failed(recorder.span(), err, "lock release unconfirmed");
            recorder.finish(outcome::ERROR, true);
        }
    }
    result
}
