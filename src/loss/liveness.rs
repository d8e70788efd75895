//! How long a held lock can still be trusted without hearing from its session.
//!
//! A lock session set up with a silence timeout is ended by the server once it has received
//! nothing for that long. The server's clock for this starts when it finishes a statement, which
//! is after the client sent it; so a session whose last *answered* statement was sent at `t` is
//! alive on the server at least until `t + silence`, and may be gone from then on, whatever the
//! process believes. A frozen process (`SIGSTOP`, a stalled VM) that runs again past that moment
//! must not act on its locks: [`Liveness::expired`] is what it checks first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// The last moment a session was heard from, and how long the server lets it stay silent.
#[derive(Debug)]
pub(crate) struct Liveness {
    /// The origin of `sent_us`.
    epoch: Instant,
    /// When the latest answered statement was sent, in microseconds after `epoch`.
    sent_us: AtomicU64,
    silence: Duration,
}

impl Liveness {
    /// A session just heard from (its set-up statement answered), silent for at most `silence`.
    pub(crate) fn new(sent: Instant, silence: Duration) -> Self {
        Liveness {
            epoch: sent,
            sent_us: AtomicU64::new(0),
            silence,
        }
    }

    /// A statement sent at `sent` was answered: the server heard from the session then.
    ///
    /// Returns `sent` as this clock's reading (see [`reading`](Self::reading)), for a caller
    /// that keeps another time on the same clock.
    pub(crate) fn heard(&self, sent: Instant) -> u64 {
        let us = micros(sent.saturating_duration_since(self.epoch));
        self.sent_us.fetch_max(us, Ordering::AcqRel);
        us
    }

    /// When the latest answered statement was sent.
    pub(crate) fn last_heard(&self) -> Instant {
        self.reading(self.sent_us.load(Ordering::Acquire))
    }

    /// The moment a reading of this clock (microseconds since its epoch) stands for.
    pub(crate) fn reading(&self, us: u64) -> Instant {
        self.epoch + Duration::from_micros(us)
    }

    /// From when the server may have ended the session; `None`: never (no silence timeout).
    pub(crate) fn expires_at(&self) -> Option<Instant> {
        self.last_heard().checked_add(self.silence)
    }

    /// True once the server may have ended the session for its silence.
    pub(crate) fn expired(&self) -> bool {
        self.expires_at().is_some_and(|at| Instant::now() >= at)
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
