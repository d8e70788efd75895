//! A table of shared values created on demand, one per name, that forgets unused names.

use std::borrow::Borrow;
use std::collections::HashMap;

use super::FastHash;
use std::hash::Hash;
use std::sync::{Arc, Weak};

/// Entries are weak: a value lives as long as someone holds it, and dead entries are swept
/// whenever the table has doubled since the last sweep, so the table stays proportional to the
/// names in use.
pub(crate) struct Slots<K, T> {
    slots: HashMap<K, Weak<T>, FastHash>,
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

    /// The value of `name`, created if nobody holds one.
    pub(crate) fn get<Q>(&mut self, name: &Q) -> Arc<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(slot) = self.slots.get(name).and_then(Weak::upgrade) {
            return slot;
        }
        let slot = Arc::new((self.make)());
        self.slots.insert(name.to_owned(), Arc::downgrade(&slot));
        if self.slots.len() >= self.sweep_at {
            self.slots.retain(|_, slot| slot.strong_count() > 0);
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
}
