//! A guard's handle on its acquisition in the registry.

use std::sync::Arc;

use super::{Backend, Core};
use crate::telemetry::{self, outcome, via};
use crate::{Error, LockKey, LossSignal, Result};

/// The engine's side of a [`LockGuard`](crate::LockGuard): held unboxed inside the guard (see
/// `guard::Exit`), so releasing through it costs no allocation and no virtual call.
pub(crate) struct CoreGuard<B: Backend> {
    pub(super) core: Arc<Core<B>>,
    pub(super) key: LockKey,
    pub(super) lock_id: i64,
    pub(super) generation: u64,
    /// False once the acquisition was handed to `release` or `leak`.
    pub(super) armed: bool,
}

impl<B: Backend> std::fmt::Debug for CoreGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreGuard")
            .field("key", &self.key)
            .field("generation", &self.generation)
            .field("armed", &self.armed)
            .finish()
    }
}

impl<B: Backend> CoreGuard<B> {
    /// Releases the acquisition now; see [`LockGuard::release`](crate::LockGuard::release).
    /// `signal` is the acquisition's, which the `LockGuard` holding this one carries.
    pub(crate) async fn release(mut self, signal: &LossSignal) -> Result<()> {
        let mut recorder = self.core.release_outcome(&self.key, via::GUARD);
        let held = self.core.forget_generation(&self.key, self.generation);
        self.armed = false;
        let Some(held) = held else {
            recorder.record(telemetry::LOCK_ID, self.lock_id);
            // Whoever took the entry out fired the signal first, under the registry lock.
            let cause = signal.cause().unwrap_or(crate::LossCause::Released);
            let ended = if cause.is_release() {
                outcome::ALREADY_RELEASED
            } else {
                outcome::LOST
            };
            recorder.finish(ended, !cause.is_release());
            return Err(Error::LockLost {
                key: self.key.clone(),
                cause,
            });
        };
        self.core.unlock(&self.key, held, recorder).await
    }

    /// Leaves the acquisition in the registry; see [`LockGuard::leak`](crate::LockGuard::leak).
    pub(crate) fn leak(mut self) {
        self.armed = false;
    }
}

impl<B: Backend> Drop for CoreGuard<B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let core = Arc::clone(&self.core);
        let key = self.key.clone();
        let generation = self.generation;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to unlock on: drop the entry, whose session lets the lock go as it
            // drops (see `Backend::Session`).
            if let Ok(mut state) = core.state.try_lock() {
                drop(state.take_generation(&key, generation));
                core.set_held(state.held.len());
            }
            return;
        };
        // Forget the entry now when the registry is free, so `is_held` and
        // `held_lock_count` reflect the drop at once; the unlock itself runs on a task.
        let registry = if core.defer_drops {
            None
        } else {
            core.state.try_lock().ok()
        };
        let forgotten = registry.map(|mut state| {
            let held = state.take_generation(&key, generation);
            core.set_held(state.held.len());
            held
        });
        match forgotten {
            // Already released through the manager: nothing of ours is left.
            Some(None) => {}
            Some(Some(held)) => {
                runtime.spawn(async move {
                    let recorder = core.release_outcome(&key, via::DROP);
                    let _ = core.unlock(&key, held, recorder).await;
                });
            }
            None => {
                runtime.spawn(async move {
                    let _ = core.release_generation(&key, generation, via::DROP).await;
                });
            }
        }
    }
}
