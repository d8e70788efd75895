//! Lock-order cycles among one manager's own callers.
//!
//! A caller that asks for a key while inside critical sections of the same manager
//! (`with_lock`, `LockGuard::run`) registers what those sections hold and what it asks for,
//! for as long as it waits. A registration that closes a cycle (each caller on it waits for a
//! key a section of the next one holds) fails at once: the cycle can only end in deadlines,
//! or never. Only the caller that closes the cycle fails, so exactly one of its members does,
//! and the others proceed once its sections let go.
//!
//! A section records its key and mode, so a shared section blocks only exclusive askers; a
//! guard kept in a variable, outside any section, is not known to hold anything here.
//!
//! Cycles through other managers (in this process or another) are found by probes, as in
//! Chandy, Misra and Haas's edge chasing: a wait that has lasted the server's
//! `deadlock_timeout` sends a probe naming itself and the lock it wants; a manager one of whose
//! waiting sections holds that lock against it passes the probe on, naming that wait and the
//! lock it wants in turn. A probe that comes back to the wait that sent it has gone round a
//! cycle. Only the youngest wait of a cycle (the latest to start, so the one that closed it)
//! fails, once a second probe sent after the first came back has come back through the very
//! same waits: each of them was then waiting, and holding its sections, all along between the
//! two rounds, so the cycle was real. The backend carries the probes (see
//! `postgres/doorbell.rs`); this file only reads and answers them.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::FastHash;
use crate::{LockKey, LockMode};

/// The waits of the manager's callers that hold keys in sections.
pub(crate) struct Waits {
    /// Names this manager in probes.
    manager: u64,
    table: Mutex<Table>,
    /// Told when a wait registers, so the backend starts carrying probes.
    kick: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Default for Waits {
    fn default() -> Self {
        Waits {
            manager: uuid::Uuid::new_v4().as_u64_pair().0,
            table: Mutex::default(),
            kick: std::sync::OnceLock::new(),
        }
    }
}

#[derive(Default)]
struct Table {
    next: u64,
    waits: HashMap<u64, Wait, FastHash>,
}

struct Wait {
    wants: LockKey,
    mode: LockMode,
    held: Vec<(LockKey, LockMode)>,
    /// When the wait started, on the wall clock (which probes compare across processes).
    started_us: u64,
    since: Instant,
    last_probe: Option<Instant>,
    /// The waits a probe of this one went round last, to be confirmed by the next.
    went_round: Option<Vec<(u64, u64)>>,
    abort: Arc<Abort>,
}

/// How a wait is told it closed a cycle found by probes.
#[derive(Default)]
struct Abort {
    cycle: Mutex<Option<Vec<LockKey>>>,
    told: Notify,
}

/// Whether a holder in `held` mode keeps out an asker in `wanted` mode.
fn conflicts(wanted: LockMode, held: LockMode) -> bool {
    wanted == LockMode::Exclusive || held == LockMode::Exclusive
}

impl Waits {
    /// Registers a caller holding `held` (in sections) that waits for `wants` in `mode`, until
    /// the returned registration is dropped. Fails with the keys of the cycle, in wait order
    /// starting with `wants`, when this wait would close one.
    pub(crate) fn register(
        &self,
        wants: &LockKey,
        mode: LockMode,
        held: Vec<(LockKey, LockMode)>,
    ) -> Result<Registered<'_>, Vec<LockKey>> {
        let mut table = crate::sync::lock(&self.table);
        let id = table.next;
        let abort = Arc::new(Abort::default());
        let wait = Wait {
            wants: wants.clone(),
            mode,
            held,
            started_us: wall_us(),
            since: Instant::now(),
            last_probe: None,
            went_round: None,
            abort: Arc::clone(&abort),
        };
        if let Some(cycle) = table.cycle_through(id, &wait) {
            return Err(cycle);
        }
        table.next += 1;
        table.waits.insert(id, wait);
        drop(table);
        if let Some(kick) = self.kick.get() {
            kick();
        }
        Ok(Registered {
            waits: self,
            id,
            abort,
        })
    }

    /// Has `kick` called whenever a wait registers (once; later calls are ignored): how a
    /// backend that carries probes cheaply (the in-memory server) starts carrying them.
    pub(crate) fn on_register(&self, kick: impl Fn() + Send + Sync + 'static) {
        let _ = self.kick.set(Box::new(kick));
    }

    /// Whether any wait is registered.
    pub(crate) fn any(&self) -> bool {
        !crate::sync::lock(&self.table).waits.is_empty()
    }

    /// The probes to send now: one for each wait that has lasted `after` and has not sent one
    /// for as long.
    pub(crate) fn due_probes(&self, after: Duration) -> Vec<String> {
        let mut table = crate::sync::lock(&self.table);
        let now = Instant::now();
        let mut due = Vec::new();
        for (id, wait) in &mut table.waits {
            let last = wait.last_probe.unwrap_or(wait.since);
            if now.duration_since(last) >= after {
                wait.last_probe = Some(now);
                due.push(encode(&[wait.hop(self.manager, *id)]));
            }
        }
        due
    }

    /// Answers a probe heard from any manager: the probes to pass on. A probe that came back
    /// to one of this manager's waits is a cycle, which ends that wait if it is the cycle's
    /// youngest and the same waits were found the time before; otherwise it asks for another
    /// round at once.
    pub(crate) fn on_probe(&self, message: &str) -> Vec<String> {
        let Some(path) = decode(message) else {
            return Vec::new();
        };
        let Some(last) = path.last() else {
            return Vec::new();
        };
        let mut table = crate::sync::lock(&self.table);
        let mut out = Vec::new();
        let mut back_home = None;
        for (id, wait) in &table.waits {
            if !wait.blocks_id(last.wants, last.mode) {
                continue;
            }
            let origin = &path[0];
            if origin.manager == self.manager && origin.wait == *id {
                back_home = Some(*id);
            } else if !path
                .iter()
                .any(|h| h.manager == self.manager && h.wait == *id)
            {
                let mut next = path.clone();
                next.push(wait.hop(self.manager, *id));
                out.push(encode(&next));
            }
        }
        if let Some(id) = back_home
            && let Some(again) = table.came_back(self.manager, id, &path)
        {
            out.push(again);
        }
        out
    }
}

/// Microseconds since the epoch, on the wall clock.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// One wait of a probe's path: whose, since when, and what it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hop {
    manager: u64,
    wait: u64,
    started_us: u64,
    /// The lock id it wants (`LockTarget::packed`), and in which mode.
    wants: i64,
    mode: LockMode,
}

/// A probe's text: its hops, `manager.wait.started.wants.mode`, comma-separated.
fn encode(path: &[Hop]) -> String {
    let mut text = String::new();
    for (i, hop) in path.iter().enumerate() {
        let mode = if hop.mode == LockMode::Shared {
            's'
        } else {
            'x'
        };
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            text,
            "{sep}{:x}.{:x}.{:x}.{}.{mode}",
            hop.manager, hop.wait, hop.started_us, hop.wants
        );
    }
    text
}

/// The hops of a probe's text; `None` for anything else.
fn decode(text: &str) -> Option<Vec<Hop>> {
    text.split(',')
        .map(|hop| {
            let mut parts = hop.split('.');
            let hop = Hop {
                manager: u64::from_str_radix(parts.next()?, 16).ok()?,
                wait: u64::from_str_radix(parts.next()?, 16).ok()?,
                started_us: u64::from_str_radix(parts.next()?, 16).ok()?,
                wants: parts.next()?.parse().ok()?,
                mode: match parts.next()? {
                    "s" => LockMode::Shared,
                    "x" => LockMode::Exclusive,
                    _ => return None,
                },
            };
            parts.next().is_none().then_some(hop)
        })
        .collect()
}

impl Table {
    /// A probe of wait `id` came back round `path`. Ends the wait if it is the youngest of
    /// the cycle and the previous round went through the same waits; otherwise remembers the
    /// round and returns the probe of the next one (sent at once), if it is the youngest.
    fn came_back(&mut self, manager: u64, id: u64, path: &[Hop]) -> Option<String> {
        let youngest = path
            .iter()
            .max_by_key(|h| (h.started_us, h.manager, h.wait))
            .expect("a path has its origin");
        if youngest.manager != manager || youngest.wait != id {
            // Not ours to break: the youngest breaks it when its own probe comes back.
            return None;
        }
        let round: Vec<(u64, u64)> = path.iter().map(|h| (h.manager, h.wait)).collect();
        let wait = self.waits.get_mut(&id)?;
        if wait.went_round.as_ref() == Some(&round) {
            let cycle = path.iter().map(|h| wait.name_of(h.wants)).collect();
            *crate::sync::lock(&wait.abort.cycle) = Some(cycle);
            wait.abort.told.notify_one();
            return None;
        }
        wait.went_round = Some(round);
        Some(encode(&[wait.hop(manager, id)]))
    }

    /// The cycle `new` (not yet in the table, as `new_id`) would close, if any: a depth-first
    /// walk from the key it wants, through each waiting section that holds that key against
    /// it, to the key that section wants, until a walk comes back to `new`.
    fn cycle_through(&self, new_id: u64, new: &Wait) -> Option<Vec<LockKey>> {
        let mut stack = vec![(&new.wants, new.mode, vec![new.wants.clone()])];
        let mut seen = std::collections::HashSet::new();
        while let Some((key, mode, path)) = stack.pop() {
            if new.blocks(key, mode) {
                return Some(path);
            }
            for (id, wait) in &self.waits {
                if *id != new_id && wait.blocks(key, mode) && seen.insert(*id) {
                    let mut next = path.clone();
                    next.push(wait.wants.clone());
                    stack.push((&wait.wants, wait.mode, next));
                }
            }
        }
        None
    }
}

impl Wait {
    /// Whether this waiter's sections keep out an asker of `key` in `mode`.
    fn blocks(&self, key: &LockKey, mode: LockMode) -> bool {
        self.held
            .iter()
            .any(|(held, held_mode)| held == key && conflicts(mode, *held_mode))
    }

    /// The same, for an asker known by its lock id.
    fn blocks_id(&self, id: i64, mode: LockMode) -> bool {
        self.held
            .iter()
            .any(|(held, held_mode)| held.target().packed() == id && conflicts(mode, *held_mode))
    }

    fn hop(&self, manager: u64, wait: u64) -> Hop {
        Hop {
            manager,
            wait,
            started_us: self.started_us,
            wants: self.wants.target().packed(),
            mode: self.mode,
        }
    }

    /// The key of lock id `id` as this wait knows it (its own or one it holds), else the id.
    fn name_of(&self, id: i64) -> LockKey {
        std::iter::once(&self.wants)
            .chain(self.held.iter().map(|(k, _)| k))
            .find(|k| k.target().packed() == id)
            .cloned()
            .unwrap_or_else(|| LockKey::id(id))
    }
}

/// A registered wait; dropping it (the wait ended, however) unregisters it.
pub(crate) struct Registered<'a> {
    waits: &'a Waits,
    id: u64,
    abort: Arc<Abort>,
}

impl Registered<'_> {
    /// Resolves with the cycle's keys once probes found that this wait closed a cycle.
    pub(crate) async fn closed_a_cycle(&self) -> Vec<LockKey> {
        loop {
            let told = self.abort.told.notified();
            if let Some(cycle) = crate::sync::lock(&self.abort.cycle).take() {
                return cycle;
            }
            told.await;
        }
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        crate::sync::lock(&self.waits.table).waits.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(keys: &[&str]) -> Vec<(LockKey, LockMode)> {
        keys.iter()
            .map(|k| (LockKey::from(*k), LockMode::Exclusive))
            .collect()
    }

    #[test]
    fn the_wait_that_closes_a_cycle_fails_and_only_it() {
        let waits = Waits::default();
        let a = LockKey::from("a");
        let b = LockKey::from("b");
        let c = LockKey::from("c");
        let _first = waits
            .register(&b, LockMode::Exclusive, held(&["a"]))
            .expect("no cycle yet");
        let _second = waits
            .register(&c, LockMode::Exclusive, held(&["b"]))
            .expect("a chain, no cycle");
        let cycle = waits
            .register(&a, LockMode::Exclusive, held(&["c"]))
            .err()
            .expect("c waits for a, whose holder waits for b, whose holder waits for c");
        assert_eq!(cycle, vec![a.clone(), b.clone(), c.clone()]);
        drop(_second);
        waits
            .register(&a, LockMode::Exclusive, held(&["c"]))
            .expect("the chain is broken");
    }

    #[test]
    fn shared_sections_do_not_keep_out_shared_askers() {
        let waits = Waits::default();
        let a = LockKey::from("a");
        let b = LockKey::from("b");
        let shared = |k: &str| vec![(LockKey::from(k), LockMode::Shared)];
        let _first = waits
            .register(&b, LockMode::Shared, shared("a"))
            .expect("no cycle yet");
        waits
            .register(&a, LockMode::Shared, shared("b"))
            .expect("readers of each other's keys do not block");
        waits
            .register(&a, LockMode::Exclusive, shared("b"))
            .expect("the reader of a waiting for b is not kept out by a reader of b");
        waits
            .register(&a, LockMode::Exclusive, held(&["b"]))
            .err()
            .expect("a writer holding b, kept out of a by its reader, who waits for b");
    }
}
