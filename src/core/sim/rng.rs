//! The world's one source of randomness: SplitMix64 behind an atomic counter, so every draw
//! depends only on the seed and on how many draws came before it.

use std::sync::atomic::{AtomicU64, Ordering};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug)]
pub(crate) struct Rng {
    state: AtomicU64,
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng {
            state: AtomicU64::new(seed),
        }
    }

    pub(crate) fn next_u64(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GOLDEN, Ordering::Relaxed)
            .wrapping_add(GOLDEN);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True `per_mille` times in a thousand.
    pub(crate) fn chance(&self, per_mille: u64) -> bool {
        per_mille > 0 && self.below(1000) < per_mille
    }

    /// One of `items`.
    pub(crate) fn pick<T: Copy>(&self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}
