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
//!
//! Anybody may write a probe, so a cycle found by probes ends a wait only once its backend
//! has confirmed it ([`Waits::settle`]): on PostgreSQL, every other manager's wait on the
//! cycle has left its markers on the server (see `probe.rs`), held by a session of the
//! confirming manager's own role.

mod probe;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use self::probe::{Hop, decode, encode};
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
    /// Whether a probe passed on by this manager names this wait: its markers are on the
    /// server for as long as it waits.
    named: bool,
    /// Where the backend's confirmation of a cycle through this wait stands.
    check: Check,
    abort: Arc<Abort>,
}

/// Where the backend's confirmation of a cycle through a wait stands.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// None asked for.
    Idle,
    /// Asked for, not yet settled.
    Pending,
    /// The last one failed at this instant: the next waits as long as a probe would.
    Refuted(Instant),
}

/// What a manager heard in a probe: the probes to pass on, and the cycles through its waits
/// that its backend has to confirm before they end a wait ([`Waits::settle`]).
#[derive(Default)]
pub(crate) struct Heard {
    pub(crate) pass_on: Vec<String>,
    pub(crate) to_confirm: Vec<Cycle>,
}

/// A cycle a probe went round twice, through the same waits, back to the youngest of them,
/// a wait of this manager.
pub(crate) struct Cycle {
    wait: u64,
    path: Vec<Hop>,
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
            named: false,
            check: Check::Idle,
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

    /// Answers a probe heard from any manager: the probes to pass on, and the cycle to
    /// confirm if the probe came back to one of this manager's waits, the youngest of the
    /// cycle, through the same waits as the time before (otherwise it asks for another round
    /// at once). A wait whose last confirmation failed is confirmed again no sooner than
    /// `after`.
    pub(crate) fn on_probe(&self, message: &str, after: Duration) -> Heard {
        let mut heard = Heard::default();
        let Some(path) = decode(message) else {
            return heard;
        };
        let Some(last) = path.last() else {
            return heard;
        };
        let mut table = crate::sync::lock(&self.table);
        let mut back_home = None;
        for (id, wait) in &mut table.waits {
            if !wait.blocks_id(last.wants, last.mode) {
                continue;
            }
            let origin = &path[0];
            if origin.manager == self.manager && origin.wait == *id {
                back_home = Some(*id);
            } else if path.len() < probe::MAX_HOPS
                && !path
                    .iter()
                    .any(|h| h.manager == self.manager && h.wait == *id)
            {
                wait.named = true;
                let mut next = path.clone();
                next.push(wait.hop(self.manager, *id));
                heard.pass_on.push(encode(&next));
            }
        }
        if let Some(id) = back_home {
            match table.came_back(self.manager, id, path, after) {
                Back::Again(probe) => heard.pass_on.push(probe),
                Back::Confirm(cycle) => heard.to_confirm.push(cycle),
                Back::Nothing => {}
            }
        }
        heard
    }

    /// The markers this manager's waits named in probes must hold on the server right now.
    pub(crate) fn markers(&self) -> HashSet<i64> {
        let table = crate::sync::lock(&self.table);
        let mut markers = HashSet::new();
        for (id, wait) in table.waits.iter().filter(|(_, w)| w.named) {
            let hop = wait.hop(self.manager, *id);
            for (key, mode) in &wait.held {
                markers.insert(hop.marker(key.target().packed(), *mode));
            }
        }
        markers
    }

    /// What the server must show for `cycle` to be real: for each hop of another manager,
    /// by its index on the path, the markers of which one must be held by a session of this
    /// manager's role. Empty when every wait on the cycle is this manager's own.
    pub(crate) fn evidence(&self, cycle: &Cycle) -> Vec<(i32, i64)> {
        let mut evidence = Vec::new();
        for (at, pair) in cycle.path.windows(2).enumerate() {
            let (previous, hop) = (&pair[0], &pair[1]);
            if hop.manager != self.manager {
                let at = i32::try_from(at + 1).unwrap_or(i32::MAX);
                evidence.extend(hop.markers_against(previous).into_iter().map(|m| (at, m)));
            }
        }
        evidence
    }

    /// Settles `cycle` once its backend has looked: ends its youngest wait if the backend
    /// `confirmed` it and this manager's own waits on it are still as the probe says; else
    /// the wait goes on, and another two rounds are needed.
    pub(crate) fn settle(&self, cycle: Cycle, confirmed: bool) {
        let mut table = crate::sync::lock(&self.table);
        let ours_hold = table.still_waiting(self.manager, &cycle.path);
        let Some(wait) = table.waits.get_mut(&cycle.wait) else {
            return;
        };
        if wait.check != Check::Pending {
            return;
        }
        if confirmed && ours_hold {
            wait.check = Check::Idle;
            let names = cycle.path.iter().map(|h| wait.name_of(h.wants)).collect();
            *crate::sync::lock(&wait.abort.cycle) = Some(names);
            wait.abort.told.notify_one();
        } else {
            tracing::debug!(
                path = %encode(&cycle.path),
                "a probe's cycle was not confirmed by the server: the wait goes on"
            );
            wait.check = Check::Refuted(Instant::now());
            wait.went_round = None;
        }
    }
}

/// What a probe that came back to its wait asks for.
enum Back {
    /// Another round, by this probe, sent at once.
    Again(String),
    /// The backend's confirmation of this cycle.
    Confirm(Cycle),
    Nothing,
}

/// Microseconds since the epoch, on the wall clock.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Table {
    /// A probe of wait `id` came back round `path`. If the wait is the youngest of the
    /// cycle and the previous round went through the same waits, the cycle is to be confirmed
    /// (unless a confirmation is under way, or failed less than `after` ago); otherwise the
    /// round is remembered and the next one asked for, if the wait is the youngest.
    fn came_back(&mut self, manager: u64, id: u64, path: Vec<Hop>, after: Duration) -> Back {
        let youngest = path
            .iter()
            .max_by_key(|h| (h.started_us, h.manager, h.wait))
            .expect("a path has its origin");
        if youngest.manager != manager || youngest.wait != id {
            // Not ours to break: the youngest breaks it when its own probe comes back.
            return Back::Nothing;
        }
        let round: Vec<(u64, u64)> = path.iter().map(|h| (h.manager, h.wait)).collect();
        let Some(wait) = self.waits.get_mut(&id) else {
            return Back::Nothing;
        };
        match wait.check {
            Check::Pending => return Back::Nothing,
            Check::Refuted(at) if at.elapsed() < after => return Back::Nothing,
            Check::Idle | Check::Refuted(_) => {}
        }
        if wait.went_round.as_ref() == Some(&round) {
            wait.check = Check::Pending;
            return Back::Confirm(Cycle { wait: id, path });
        }
        wait.went_round = Some(round);
        Back::Again(encode(&[wait.hop(manager, id)]))
    }

    /// Whether every wait of `manager` on `path` still waits as the path says: registered,
    /// wanting what its hop says, and holding what the hop before it wants against it (the
    /// first hop, the cycle's origin, against the last).
    fn still_waiting(&self, manager: u64, path: &[Hop]) -> bool {
        let before = std::iter::once(path.last()).chain(path.iter().map(Some));
        path.iter().zip(before).all(|(hop, previous)| {
            if hop.manager != manager {
                return true;
            }
            let Some(wait) = self.waits.get(&hop.wait) else {
                return false;
            };
            let previous = previous.expect("a path has its origin");
            wait.hop(manager, hop.wait) == *hop && wait.blocks_id(previous.wants, previous.mode)
        })
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

    /// Two managers' waits inside sections, crossed: `first`'s holds `a` and wants `b`,
    /// `second`'s (the younger) holds `b` and wants `a`. The probes are carried by hand.
    fn crossed<'w>(first: &'w Waits, second: &'w Waits) -> (Registered<'w>, Registered<'w>) {
        let (a, b) = (LockKey::from("a"), LockKey::from("b"));
        let one = first
            .register(&b, LockMode::Exclusive, held(&["a"]))
            .expect("no cycle within one manager");
        let two = second
            .register(&a, LockMode::Exclusive, held(&["b"]))
            .expect("no cycle within one manager");
        started_at(first, one.id, 1_000);
        started_at(second, two.id, 2_000);
        (one, two)
    }

    /// Makes the wait `id` of `waits` start at `us` on the wall clock, so which wait is the
    /// youngest does not hang on the clock's resolution.
    fn started_at(waits: &Waits, id: u64, us: u64) {
        crate::sync::lock(&waits.table)
            .waits
            .get_mut(&id)
            .expect("registered")
            .started_us = us;
    }

    /// Carries `probe` from `from`'s side to `to` and back until nothing is passed on; answers
    /// the cycles `to` or `from` were asked to confirm, and the probes the origin asked for
    /// again (a new round).
    fn round(probe: String, first: &Waits, second: &Waits) -> (Vec<Cycle>, Vec<String>) {
        let after = Duration::from_secs(1);
        let (mut confirm, mut again) = (Vec::new(), Vec::new());
        let mut in_flight = vec![probe];
        while let Some(message) = in_flight.pop() {
            for waits in [first, second] {
                let heard = waits.on_probe(&message, after);
                confirm.extend(heard.to_confirm);
                for next in heard.pass_on {
                    // A probe of one hop is a new round from its origin.
                    if decode(&next).is_some_and(|p| p.len() == 1) {
                        again.push(next);
                    } else {
                        in_flight.push(next);
                    }
                }
            }
        }
        (confirm, again)
    }

    #[test]
    fn a_cycle_across_managers_is_confirmed_by_a_second_round_through_the_same_waits() {
        let (first, second) = (Waits::default(), Waits::default());
        let (one, two) = crossed(&first, &second);

        // The older wait's probe goes round, but it is not the older wait's to break.
        let older = first
            .due_probes(Duration::ZERO)
            .pop()
            .expect("a probe is due");
        let (confirm, again) = round(older, &first, &second);
        assert!(
            confirm.is_empty() && again.is_empty(),
            "only the youngest breaks a cycle"
        );

        // The younger wait's first round asks for a second; only that one confirms.
        let younger = second
            .due_probes(Duration::ZERO)
            .pop()
            .expect("a probe is due");
        let (confirm, again) = round(younger, &first, &second);
        assert!(confirm.is_empty(), "a cycle seen once is not yet a cycle");
        let [again] = <[String; 1]>::try_from(again).expect("one more round asked for");
        let (confirm, _) = round(again, &first, &second);
        let [cycle] = <[Cycle; 1]>::try_from(confirm)
            .ok()
            .expect("confirmed round");
        assert_eq!(cycle.wait, two.id, "the youngest wait is the one to fail");
        assert_eq!(first.evidence(&cycle).len(), 0, "not first's to confirm");
        assert!(
            !second.evidence(&cycle).is_empty(),
            "first's hop needs its markers"
        );

        second.settle(cycle, true);
        let told = crate::sync::lock(&two.abort.cycle).take();
        let (a, b) = (LockKey::from("a"), LockKey::from("b"));
        assert_eq!(told, Some(vec![a, b]));
        assert!(
            crate::sync::lock(&one.abort.cycle).is_none(),
            "the older wait goes on"
        );
    }

    #[test]
    fn a_near_cycle_that_dissolves_between_the_two_rounds_is_not_a_cycle() {
        let (first, second) = (Waits::default(), Waits::default());
        let (one, two) = crossed(&first, &second);
        let probe = second.due_probes(Duration::ZERO).pop().expect("due");
        let (confirm, again) = round(probe, &first, &second);
        assert!(confirm.is_empty());

        // Between the rounds, first's wait ends (granted) and another one like it begins:
        // the second round goes through a different wait, so it is a first round again.
        drop(one);
        let other = first
            .register(&LockKey::from("b"), LockMode::Exclusive, held(&["a"]))
            .expect("no cycle");
        started_at(&first, other.id, 1_500);
        let again = again.into_iter().next().expect("a second round asked for");
        let (confirm, again) = round(again, &first, &second);
        assert!(
            confirm.is_empty(),
            "rounds through different waits confirm nothing"
        );
        let again = again.into_iter().next().expect("a third round asked for");
        let (confirm, _) = round(again, &first, &second);
        assert_eq!(confirm.len(), 1, "two rounds through the same waits do");

        // A cycle refuted by the server is not asked for again before `after`.
        let cycle = confirm.into_iter().next().expect("one");
        second.settle(cycle, false);
        let probe = second.due_probes(Duration::ZERO).pop().expect("due");
        let (confirm, again) = round(probe, &first, &second);
        assert!(
            confirm.is_empty() && again.is_empty(),
            "refuted a moment ago"
        );
        assert!(crate::sync::lock(&two.abort.cycle).is_none());
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
