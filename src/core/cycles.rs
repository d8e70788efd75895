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

use std::collections::HashMap;
use std::sync::Mutex;

use super::FastHash;
use crate::{LockKey, LockMode};

/// The waits of the manager's callers that hold keys in sections.
#[derive(Default)]
pub(crate) struct Waits {
    table: Mutex<Table>,
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
        let wait = Wait {
            wants: wants.clone(),
            mode,
            held,
        };
        if let Some(cycle) = table.cycle_through(id, &wait) {
            return Err(cycle);
        }
        table.next += 1;
        table.waits.insert(id, wait);
        Ok(Registered { waits: self, id })
    }
}

impl Table {
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
}

/// A registered wait; dropping it (the wait ended, however) unregisters it.
pub(crate) struct Registered<'a> {
    waits: &'a Waits,
    id: u64,
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
