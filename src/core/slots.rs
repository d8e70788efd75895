//! A table of shared values created on demand, one per name, that forgets unused names.

use std::borrow::Borrow;
use std::collections::HashMap;

use super::FastHash;
use std::hash::Hash;
use std::sync::Arc;

/// A value lives while someone holds it or the table keeps it: the table keeps every value
/// until a sweep finds that nobody else holds it. Sweeps run whenever the table has doubled
/// since the last one, so the table stays proportional to the names in use, and a name used
/// again and again (a key locked in a loop) finds its value without making it anew.
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
            sweep_at: 64,
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
            self.sweep_at = (self.slots.len() * 2).max(64);
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
        for n in 10..10_000 {
            drop(slots.get(&n));
        }
        assert!(slots.slots.len() < 200, "{} entries", slots.slots.len());
        // Names still in use keep their value.
        for (n, value) in kept.iter().enumerate() {
            assert!(Arc::ptr_eq(value, &slots.get(&(n as u32))));
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
