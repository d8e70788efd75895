//! The invariants of a simulated world, checked between its steps (see `mod.rs`).

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::server::token_key;
use super::world::{BUDGET, Belief, HANDOFF, World};
use crate::{LockMode, LossCause};

/// What the server holds, the only truth about who holds a lock.
struct ServerView {
    sessions: Vec<Seen>,
    /// The session each fencing token was minted for.
    tokens: BTreeMap<i64, usize>,
}

/// One session, as the server sees it.
struct Seen {
    holding: bool,
    mode: LockMode,
    ended: Option<(LossCause, Instant)>,
    manager: usize,
}

type Checked = std::result::Result<(), String>;

impl World {
    /// Checks the invariants now; the first broken one is the world's violation.
    pub(super) fn check(&self) {
        if let Err(what) = self.invariants() {
            self.violate(what);
        }
    }

    fn invariants(&self) -> Checked {
        let view = self.server_view()?;
        self.beliefs_are_backed(&view)?;
        self.registries_match(&view)
    }

    /// No target is held exclusively and shared at once.
    fn server_view(&self) -> std::result::Result<ServerView, String> {
        let state = self.server.state();
        for (target, holders) in &state.locks {
            if holders.exclusive.is_some() && !holders.shared.is_empty() {
                return Err(format!("server: {target} exclusive and shared at once"));
            }
        }
        let sessions = state
            .sessions
            .iter()
            .map(|s| Seen {
                holding: s.holding,
                mode: s.mode,
                ended: s.ended.clone(),
                manager: s.manager,
            })
            .collect();
        Ok(ServerView {
            sessions,
            tokens: state.token_session.clone(),
        })
    }

    /// Every live belief is backed by its session on the server, a lock that went is
    /// signalled, and no two callers hold a key when one holds it exclusively.
    fn beliefs_are_backed(&self, view: &ServerView) -> Checked {
        let now = Instant::now();
        let mut holding: BTreeMap<String, Vec<(String, LockMode)>> = BTreeMap::new();
        for belief in crate::sync::lock(&self.beliefs).iter() {
            if backed(belief, view, now)? {
                holding
                    .entry(belief.key.to_string())
                    .or_default()
                    .push((belief.who.clone(), belief.mode));
            }
        }
        for (key, holders) in &holding {
            let exclusive = holders.iter().any(|(_, m)| *m == LockMode::Exclusive);
            if exclusive && holders.len() > 1 {
                return Err(format!("{key} held by {holders:?} at once"));
            }
        }
        Ok(())
    }

    /// Each registry matches the server, keeps its handoff limit and its budget.
    fn registries_match(&self, view: &ServerView) -> Checked {
        for (m, manager) in self.managers.iter().enumerate() {
            let used = manager.core.budget.used();
            if used > BUDGET {
                return Err(format!("m{m} uses {used} budget places of {BUDGET}"));
            }
            let state = manager.core.state();
            for (key, held) in &state.held {
                let seen = &view.sessions[held.session.id];
                if seen.manager != m {
                    let owner = seen.manager;
                    return Err(format!("m{m} registers {key} on m{owner}'s session"));
                }
                if seen.ended.is_none() && !seen.holding {
                    return Err(format!(
                        "m{m} registers {key} on a session the server let go"
                    ));
                }
                if held.handoffs > HANDOFF.max_handoffs {
                    return Err(format!(
                        "m{m} {key} handed over {} times, past its limit of {}",
                        held.handoffs, HANDOFF.max_handoffs
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Whether `belief` is live and backed by the server (`Ok(false)`: no longer live, or its
/// session ended and the detector has not had its turn yet).
fn backed(belief: &Belief, view: &ServerView, now: Instant) -> std::result::Result<bool, String> {
    let Some(&session) = view
        .tokens
        .get(&token_key(belief.key.target().packed(), belief.token))
    else {
        // Granted without a token: a violation of its own.
        return Ok(false);
    };
    let Seen {
        holding: on_server,
        mode,
        ended,
        ..
    } = &view.sessions[session];
    let cause = belief.signal.cause();
    if cause == Some(LossCause::SessionClosed) && ended.is_none() && !belief.of_a_set {
        return Err(format!(
            "{} told its lock on {} was lost, but its session never ended",
            belief.who, belief.key
        ));
    }
    if !belief.active || cause.is_some() {
        return Ok(false);
    }
    if let Some((cause, at)) = ended {
        // The detector runs before the clock moves on; so once it has moved, a lock that
        // went must have been signalled.
        if now > (*at).max(belief.since) {
            return Err(format!(
                "{} still believes it holds {} (token {}, session {session}) although its session ended ({cause:?}) {:?} ago, untold",
                belief.who,
                belief.key,
                belief.token,
                now - *at
            ));
        }
        return Ok(false);
    }
    if !on_server || *mode != belief.mode {
        return Err(format!(
            "{} believes it holds {} ({:?}, token {}) but the server does not (session {session}: holding {on_server}, {mode:?})",
            belief.who, belief.key, belief.mode, belief.token
        ));
    }
    Ok(true)
}
