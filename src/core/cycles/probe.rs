//! The probes' wire format, and the evidence a hop of a probe leaves on the server.
//!
//! A probe is text on a channel every role that may connect can read and write, so nothing in
//! it is believed on its word. [`decode`] turns any text into hops or `None`, never panics, and
//! refuses paths longer than [`MAX_HOPS`]. A manager that names one of its waits in a probe
//! first takes that wait's *markers* (see [`Hop::marker`]) shared on its listener connection,
//! and holds them for as long as the wait lasts; before a cycle ends a wait, the wait's
//! manager looks for every other manager's markers in `pg_locks`, held by a session of its own
//! role. A bystander can write any probe, but it cannot make another role's session hold a
//! lock, so a cycle it made up is not confirmed.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::LockMode;

/// The most hops a probe carries: a longer path is dropped, never passed on, so a probe
/// stays well within `NOTIFY`'s 8000-byte payload (a hop is at most 66 bytes).
pub(crate) const MAX_HOPS: usize = 64;

/// One wait of a probe's path: whose, since when, and what it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hop {
    pub(crate) manager: u64,
    pub(crate) wait: u64,
    pub(crate) started_us: u64,
    /// The lock id it wants (`LockTarget::packed`), and in which mode.
    pub(crate) wants: i64,
    pub(crate) mode: LockMode,
}

impl Hop {
    /// The marker that says this wait holds `held` in `held_mode` in one of its sections: a
    /// 63-bit id, the same in every process, taken in the two-integer key space.
    pub(crate) fn marker(&self, held: i64, held_mode: LockMode) -> i64 {
        let text = format!(
            "pglock wait marker v1\0{}\0{}{}{}",
            encode(std::slice::from_ref(self)),
            held,
            '.',
            mode_letter(held_mode)
        );
        let digest = Sha256::digest(text.as_bytes());
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(prefix) & 0x7FFF_FFFF_FFFF_FFFF) as i64
    }

    /// The markers of which one must be held for this hop to hold `previous`'s lock against
    /// it: one per mode of holding that keeps `previous` out.
    pub(crate) fn markers_against(&self, previous: &Hop) -> Vec<i64> {
        let mut markers = vec![self.marker(previous.wants, LockMode::Exclusive)];
        if previous.mode == LockMode::Exclusive {
            markers.push(self.marker(previous.wants, LockMode::Shared));
        }
        markers
    }
}

fn mode_letter(mode: LockMode) -> char {
    if mode == LockMode::Shared { 's' } else { 'x' }
}

/// A probe's text: its hops, `manager.wait.started.wants.mode`, comma-separated (the first
/// three in hexadecimal).
pub(crate) fn encode(path: &[Hop]) -> String {
    let mut text = String::new();
    for (i, hop) in path.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        let _ = write!(
            text,
            "{sep}{:x}.{:x}.{:x}.{}.{}",
            hop.manager,
            hop.wait,
            hop.started_us,
            hop.wants,
            mode_letter(hop.mode)
        );
    }
    text
}

/// The hops of a probe's text; `None` for anything else, and for a path of more than
/// [`MAX_HOPS`] hops.
pub(crate) fn decode(text: &str) -> Option<Vec<Hop>> {
    let hops = text.split(',');
    if hops.clone().count() > MAX_HOPS {
        return None;
    }
    hops.map(|hop| {
        let mut parts = hop.split('.');
        let hop = Hop {
            manager: hex(parts.next()?)?,
            wait: hex(parts.next()?)?,
            started_us: hex(parts.next()?)?,
            wants: decimal(parts.next()?)?,
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

/// A hexadecimal `u64` as [`encode`] writes it: digits only (no sign, no prefix).
fn hex(text: &str) -> Option<u64> {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit());
    digits.then(|| u64::from_str_radix(text, 16).ok())?
}

/// A decimal `i64` as [`encode`] writes it: an optional `-`, then digits.
fn decimal(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let plain = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| text.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hop() -> impl Strategy<Value = Hop> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<i64>(),
            any::<bool>(),
        )
            .prop_map(|(manager, wait, started_us, wants, shared)| Hop {
                manager,
                wait,
                started_us,
                wants,
                mode: if shared {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                },
            })
    }

    proptest! {
        /// Every path pglock writes reads back as itself, and fits a notification.
        #[test]
        fn a_written_path_reads_back_whole(path in prop::collection::vec(hop(), 1..=MAX_HOPS)) {
            let text = encode(&path);
            prop_assert!(text.len() < 8000, "{} bytes", text.len());
            prop_assert_eq!(decode(&text), Some(path));
        }

        /// Any text decodes without a panic; what decodes is a path pglock could have written
        /// (it writes back to the same hops), within the length bound.
        #[test]
        fn any_text_is_a_path_or_nothing(text in ".{0,300}") {
            if let Some(path) = decode(&text) {
                prop_assert!(!path.is_empty() && path.len() <= MAX_HOPS);
                prop_assert_eq!(decode(&encode(&path)), Some(path));
            }
        }

        /// Text made of the format's own characters (digits, dots, commas, modes, signs) goes
        /// the same way: the near misses a garbled or truncated probe would be.
        #[test]
        fn near_misses_are_a_path_or_nothing(text in "[0-9a-fsx.,+-]{0,400}") {
            if let Some(path) = decode(&text) {
                prop_assert!(!path.is_empty() && path.len() <= MAX_HOPS);
                prop_assert_eq!(decode(&encode(&path)), Some(path));
            }
        }

        /// A real path with any single byte changed, cut short or extended is a path or
        /// nothing.
        #[test]
        fn a_garbled_probe_is_a_path_or_nothing(
            path in prop::collection::vec(hop(), 1..8),
            at in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            cut in any::<bool>(),
        ) {
            let mut bytes = encode(&path).into_bytes();
            let at = at.index(bytes.len());
            if cut { bytes.truncate(at) } else { bytes[at] = byte }
            if let Ok(text) = String::from_utf8(bytes)
                && let Some(path) = decode(&text)
            {
                prop_assert_eq!(decode(&encode(&path)), Some(path));
            }
        }
    }

    #[test]
    fn paths_beyond_the_bound_are_dropped() {
        let one = Hop {
            manager: 1,
            wait: 2,
            started_us: 3,
            wants: -4,
            mode: LockMode::Shared,
        };
        assert!(decode(&encode(&vec![one.clone(); MAX_HOPS])).is_some());
        assert_eq!(decode(&encode(&vec![one; MAX_HOPS + 1])), None);
        for garbage in [
            "",
            ",",
            "1.2.3.4",
            "1.2.3.4.y",
            "+1.2.3.4.x",
            "1.2.3.+4.x",
            "1.2.3.4.x.",
        ] {
            assert_eq!(decode(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn markers_name_the_wait_and_what_it_holds() {
        let hop = Hop {
            manager: 0xabc,
            wait: 7,
            started_us: 99,
            wants: 42,
            mode: LockMode::Exclusive,
        };
        let marker = hop.marker(5, LockMode::Exclusive);
        assert!(marker >= 0);
        assert_eq!(marker, hop.clone().marker(5, LockMode::Exclusive));
        assert_ne!(marker, hop.marker(5, LockMode::Shared));
        assert_ne!(marker, hop.marker(6, LockMode::Exclusive));
        let other = Hop {
            wait: 8,
            ..hop.clone()
        };
        assert_ne!(marker, other.marker(5, LockMode::Exclusive));
        // Every process, of every version speaking this format, computes the same marker:
        // SHA-256 of "pglock wait marker v1\0abc.7.63.42.x\05.x", as the key derivation.
        assert_eq!(marker, 3_040_988_198_918_829_454);
    }
}
