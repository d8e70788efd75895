//! A table of shared values created on demand, one per name, that forgets unused names.

use std::borrow::Borrow;
use std::collections::HashMap;

use super::FastHash;
use std::hash::Hash;
use std::sync::Arc;

/// Entries a table may hold before it sweeps. Below it, an unused name costs its entry (a
/// key and a small value, about a hundred bytes) and no work; a name seen again after a
/// sweep costs an allocation and an insert.
const KEPT: usize = 2048;

/// A value lives while someone holds it or the table keeps it: the table keeps every value
/// until a sweep finds that nobody else holds it. Sweeps run once the table has [`KEPT`]
/// entries, or twice as many as after the last sweep if that is more, so the table stays
/// proportional to the names in use, and a name used again and again (a key locked in a
/// loop, or one of a few thousand keys a service goes round) finds its value without making
/// it anew.
///
/// A value nobody else holds must be as good as a new one: a turn with no owner and no
/// waiters, a semaphore with every permit back.
pub(crate) struct Slots<K, T> {
    slots: HashMap<K, Arc<T>, FastHash>,
    make: fn() -> T,
    sweep_at: usize,
}

impl<K: Hash + Eq, T> Slots<K, T> {
    pub(crate) fn new(make: fn() -> T) -> Self {
        Slots {
            slots: HashMap::default(),
            make,
            sweep_at: KEPT,
        }
    }

    /// The value of `name`, created if the table has none.
    pub(crate) fn get<Q>(&mut self, name: &Q) -> Arc<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(slot) = self.slots.get(name) {
            return Arc::clone(slot);
        }
        let slot = Arc::new((self.make)());
        self.slots.insert(name.to_owned(), Arc::clone(&slot));
        if self.slots.len() >= self.sweep_at {
            self.slots.retain(|_, slot| Arc::strong_count(slot) > 1);
            self.sweep_at = (self.slots.len() * 2).max(KEPT);
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_stays_proportional_to_the_names_in_use() {
        let mut slots: Slots<u32, ()> = Slots::new(|| ());
        let kept: Vec<Arc<()>> = (0..10).map(|n| slots.get(&n)).collect();
        for n in 10..100_000 {
            drop(slots.get(&n));
        }
        assert!(slots.slots.len() <= KEPT, "{} entries", slots.slots.len());
        // Names still in use keep their value.
        for (n, value) in kept.iter().enumerate() {
            assert!(Arc::ptr_eq(value, &slots.get(&(n as u32))));
        }
        // Many names in use: the table holds them all, and sweeps at twice as many.
        let held: Vec<Arc<()>> = (0..3 * KEPT as u32).map(|n| slots.get(&n)).collect();
        for n in 1_000_000..1_000_000 + 10 * KEPT as u32 {
            drop(slots.get(&n));
        }
        assert!(
            slots.slots.len() <= 2 * held.len(),
            "{} entries",
            slots.slots.len()
        );
    }

    #[test]
    fn names_gone_round_again_find_their_values() {
        // A service going round a thousand keys, one at a time: from the second round on,
        // every key finds the value it had. Values are numbered as they are made, so a value
        // made anew cannot pass for the old one (as a reused address could).
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut slots: Slots<u32, u64> =
            Slots::new(|| MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        let first: Vec<u64> = (0..1000).map(|n| *slots.get(&n)).collect();
        for _ in 0..3 {
            for (n, value) in first.iter().enumerate() {
                assert_eq!(*value, *slots.get(&(n as u32)), "key {n} was made anew");
            }
        }
    }

    #[test]
    fn a_name_used_again_finds_its_value_kept() {
        let mut slots: Slots<u32, u8> = Slots::new(|| 0);
        let first = slots.get(&1);
        let kept = Arc::as_ptr(&first);
        drop(first);
        assert!(std::ptr::eq(kept, Arc::as_ptr(&slots.get(&1))));
    }
}
