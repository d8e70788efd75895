//! Lock keys and the frozen key-to-lock-id derivation.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// Derives the PostgreSQL advisory lock id of `key`.
///
/// The id is the SHA-256 digest of the key's UTF-8 bytes, of which the first eight bytes are
/// read as a big-endian unsigned integer, with the top bit cleared. The result is always in
/// `0..=i64::MAX`, and is passed to the single-`bigint` forms of PostgreSQL's advisory-lock
/// functions (`pg_advisory_lock(bigint)` and friends).
///
/// Any string is a valid key: the empty string, a megabyte of text, NUL bytes, any Unicode.
/// Keys are never normalised, prefixed or truncated, and are never sent to the database: only
/// the id is.
///
/// # Stability
///
/// This derivation is a wire contract, not an implementation detail. It is identical, bit for
/// bit, to the Python library pglock mirrors (eventsource-py's `PostgreSQLLockManager`), so Rust
/// and Python replicas that use the same key contend on the same PostgreSQL lock. Changing it
/// would silently split a fleet during a rolling deploy: old and new replicas would both believe
/// they hold the lock. It will not change within a major version, and any change will be
/// opt-in.
///
/// # Examples
///
/// The expected values were computed outside Rust, with
/// `printf %s "$key" | sha256sum`, keeping the first 16 hex digits and clearing the top bit:
///
/// ```
/// // printf %s 'cutover:123e4567-e89b-12d3-a456-426614174000' | sha256sum  ->  f6328dd8255fa0b6...
/// assert_eq!(
///     pglock::lock_id("cutover:123e4567-e89b-12d3-a456-426614174000"),
///     0x76328dd8255fa0b6, // 8517025804790505654: 0xf6... with the top bit cleared
/// );
/// // printf %s '' | sha256sum  ->  e3b0c44298fc1c14...
/// assert_eq!(pglock::lock_id(""), 7183457195969485844);
/// // printf %s 'alpha' | sha256sum  ->  8ed3f6ad685b959e...
/// assert_eq!(pglock::lock_id("alpha"), 1068468761257547166);
/// ```
pub fn lock_id(key: &str) -> i64 {
    // DO NOT CHANGE. This must stay bit-identical to the Python original
    // (int.from_bytes(sha256(key.encode("utf-8")).digest()[:8], "big") & 0x7FFF_FFFF_FFFF_FFFF),
    // or Rust and Python replicas stop excluding each other.
    let digest = Sha256::digest(key.as_bytes());
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&digest[..8]);
    let masked = u64::from_be_bytes(prefix) & 0x7FFF_FFFF_FFFF_FFFF;
    i64::try_from(masked).expect("the top bit is cleared, so the value fits in an i64")
}

/// Splits a lock id into the `(classid, objid)` pair that `pg_locks` shows for it.
///
/// PostgreSQL stores a single-`bigint` advisory lock as two 32-bit halves: `classid` is the
/// high half and `objid` the low half, with `objsubid = 1`. Use this to find a lock in
/// `pg_locks` by hand.
///
/// ```
/// let (classid, objid) = pglock::split_lock_id(pglock::lock_id("alpha"));
/// assert_eq!((classid, objid), (248772269, 1750832542));
/// ```
pub fn split_lock_id(lock_id: i64) -> (u32, u32) {
    let bits = lock_id as u64;
    ((bits >> 32) as u32, bits as u32)
}

/// Builds the key of a tenant-scoped lock: `"{operation}:{tenant_id}"`.
///
/// The tenant id is formatted lowercase and hyphenated (`123e4567-e89b-12d3-a456-426614174000`),
/// exactly as Python's `str(UUID)` does, so the key and its [`lock_id`] match the Python
/// original's `migration_lock_key`. The tenant migration crate, `pglock-migration`, builds its
/// keys (`"migration"`, `"cutover"`, `"write-gate"`) with it; use the same helper (never a
/// hand-written format string) for any lock that must exclude them.
///
/// ```
/// use uuid::Uuid;
/// let tenant = Uuid::parse_str("123E4567-E89B-12D3-A456-426614174000").unwrap();
/// assert_eq!(
///     pglock::migration_lock_key(tenant, "cutover"),
///     "cutover:123e4567-e89b-12d3-a456-426614174000",
/// );
/// ```
pub fn migration_lock_key(tenant_id: Uuid, operation: &str) -> String {
    format!("{operation}:{}", tenant_id.as_hyphenated())
}

/// A lock's key: what the lock is called, and which PostgreSQL advisory lock it is.
///
/// Most locks are named by a string, and a string converts into a key with the frozen
/// [`lock_id`] derivation (the default, shared with the Python original). The other
/// constructors reach locks that existing systems already use:
///
/// | constructor | the PostgreSQL lock | for |
/// | --- | --- | --- |
/// | [`LockKey::name`], `From<&str>`, `From<String>` | `pg_advisory_lock(lock_id(name))` | new code, Python services of the original |
/// | [`LockKey::id`], `From<i64>` | `pg_advisory_lock(id)` | integer ids locked by hand-written SQL, Rails and others |
/// | [`LockKey::pair`], `From<(i32, i32)>` | `pg_advisory_lock(a, b)` | the two-integer space, which never overlaps the 64-bit one |
/// | [`LockKey::sqlx`] | `pg_advisory_lock(id)`, `id` derived as sqlx's `PgAdvisoryLock::new(name)` does | services moving from sqlx's advisory locks |
///
/// Two keys are the same lock when they are equal; a name and an id that happen to give the
/// same 64-bit number are the same lock on the server, and two managers using them exclude
/// each other, but a manager treats them as two keys.
///
/// ```
/// use pglock::{LockKey, LockTarget};
///
/// assert_eq!(LockKey::from("alpha").target(), LockTarget::BigInt(1068468761257547166));
/// assert_eq!(LockKey::id(-7).target(), LockTarget::BigInt(-7));
/// assert_eq!(LockKey::pair(1, 2).target(), LockTarget::IntPair(1, 2));
/// assert_eq!(LockKey::from("alpha").to_string(), "alpha");
/// assert_eq!(LockKey::pair(1, 2).to_string(), "pair:1,2");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockKey {
    repr: Repr,
}

// Names are shared, not copied: a key is cloned into the registry, the guard and the lock info
// of every acquisition. A name's id is derived once, when the key is made. One thin pointer
// keeps the key (and every error that carries one) small.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Repr {
    Name(Arc<Named>),
    Id(i64),
    Pair(i32, i32),
    Sqlx(Arc<Named>),
}

/// A name and the lock id derived from it.
#[derive(Debug, PartialEq, Eq)]
struct Named {
    // First, so unequal keys usually differ at the first comparison.
    id: i64,
    name: Box<str>,
}

/// Hashes the key's kind and its lock id only: equal keys have equal ids, and an id is already
/// a well-mixed hash of a name, so the name's bytes need not be hashed again.
impl std::hash::Hash for LockKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let kind: u8 = match self.repr {
            Repr::Name(..) => 0,
            Repr::Id(_) => 1,
            Repr::Pair(..) => 2,
            Repr::Sqlx(..) => 3,
        };
        state.write_u8(kind);
        state.write_i64(self.target().packed());
    }
}

/// The PostgreSQL advisory lock a [`LockKey`] stands for: one of the two key spaces of
/// PostgreSQL's advisory-lock functions, which never overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockTarget {
    /// `pg_advisory_lock(bigint)`: `pg_locks` shows the high half as `classid`, the low half as
    /// `objid`, and `objsubid = 1`.
    BigInt(i64),
    /// `pg_advisory_lock(int, int)`: `pg_locks` shows them as `classid` and `objid`, with
    /// `objsubid = 2`.
    IntPair(i32, i32),
}

impl LockTarget {
    /// One 64-bit number for the target: the id itself, or the pair packed high and low
    /// (which is how `pg_locks` splits both into `classid` and `objid`).
    pub fn packed(self) -> i64 {
        match self {
            LockTarget::BigInt(id) => id,
            LockTarget::IntPair(a, b) => ((a as i64) << 32) | i64::from(b as u32),
        }
    }

    /// `pg_locks.objsubid` of this target: 1 for a bigint, 2 for a pair.
    pub fn objsubid(self) -> i16 {
        match self {
            LockTarget::BigInt(_) => 1,
            LockTarget::IntPair(..) => 2,
        }
    }
}

impl LockKey {
    /// A key named `name`, locked as `pg_advisory_lock(lock_id(name))`: the default.
    pub fn name(name: impl Into<String>) -> Self {
        let name: String = name.into();
        LockKey {
            repr: Repr::Name(names::intern(&name, || name.clone().into_boxed_str())),
        }
    }

    /// The 64-bit advisory lock `id` itself.
    pub fn id(id: i64) -> Self {
        LockKey { repr: Repr::Id(id) }
    }

    /// The two-integer advisory lock `(a, b)`.
    pub fn pair(a: i32, b: i32) -> Self {
        LockKey {
            repr: Repr::Pair(a, b),
        }
    }

    /// The lock sqlx's `PgAdvisoryLock::new(name)` takes, so a service moving from sqlx's
    /// advisory locks contends with its replicas that still use them.
    ///
    /// sqlx derives a 64-bit id from the name with HKDF-SHA256 (no salt, the info string
    /// `SQLx (Rust) Postgres advisory lock`, 8 bytes read little-endian), a different id than
    /// [`lock_id`] gives. The value below is the one sqlx documents for its example:
    ///
    /// ```
    /// use pglock::{LockKey, LockTarget};
    ///
    /// assert_eq!(
    ///     LockKey::sqlx("my first Postgres advisory lock!").target(),
    ///     LockTarget::BigInt(-5560419505042474287),
    /// );
    /// ```
    pub fn sqlx(name: impl Into<String>) -> Self {
        let name = name.into().into_boxed_str();
        LockKey {
            repr: Repr::Sqlx(Arc::new(Named {
                id: sqlx_lock_id(&name),
                name,
            })),
        }
    }

    /// The advisory lock this key stands for.
    pub fn target(&self) -> LockTarget {
        match &self.repr {
            Repr::Name(named) | Repr::Sqlx(named) => LockTarget::BigInt(named.id),
            Repr::Id(id) => LockTarget::BigInt(*id),
            Repr::Pair(a, b) => LockTarget::IntPair(*a, *b),
        }
    }

    /// The name of a key made from a string with the default derivation.
    pub fn as_name(&self) -> Option<&str> {
        match &self.repr {
            Repr::Name(named) => Some(&named.name),
            _ => None,
        }
    }
}

/// Names made into keys lately, with their lock ids, so that a key made again and again (a
/// service locks the same keys all day, often from a `&str` each time) costs neither the
/// SHA-256 nor an allocation. Four-way set-associative: a cheap hash of a name's bytes picks a
/// set of four slots, a hit moves the name to the front of its set, and a miss takes over the
/// slot of the name used longest ago. The process's cache holds at most 4,096 names.
mod names {
    use std::sync::{Arc, Mutex};

    use super::Named;

    /// Sets of the process's cache. With four ways, a working set of a thousand names stays
    /// cached but for about 2 % of them, those in a set where five hash alike (a direct-mapped
    /// cache of the same size evicts wherever two do: about a third of them).
    pub(super) const SETS: usize = 1024;
    pub(super) const WAYS: usize = 4;

    type Set = Mutex<[Option<Arc<Named>>; WAYS]>;

    pub(super) struct Cache<const N: usize> {
        sets: [Set; N],
    }

    static CACHE: Cache<SETS> = Cache::new();

    /// `name` with its id, shared with the keys made of it lately; `copy` makes the name's
    /// own copy when it is not cached.
    pub(super) fn intern(name: &str, copy: impl FnOnce() -> Box<str>) -> Arc<Named> {
        CACHE.intern(name, copy)
    }

    impl<const N: usize> Cache<N> {
        pub(super) const fn new() -> Self {
            Cache {
                sets: [const { Mutex::new([const { None }; WAYS]) }; N],
            }
        }

        pub(super) fn intern(&self, name: &str, copy: impl FnOnce() -> Box<str>) -> Arc<Named> {
            let set = &self.sets[set_of(name.as_bytes(), N)];
            if let Some(cached) = take_hit(&mut crate::sync::lock(set), name) {
                return cached;
            }
            // Derived outside the lock: SHA-256 of a long name is the slow part.
            let named = Arc::new(Named {
                id: super::lock_id(name),
                name: copy(),
            });
            let mut ways = crate::sync::lock(set);
            // Another thread may have made the same name meanwhile: share its copy rather than
            // keep the name twice in one set.
            if let Some(theirs) = take_hit(&mut ways, name) {
                return theirs;
            }
            ways.rotate_right(1);
            let evicted = ways[0].replace(Arc::clone(&named));
            // The evicted name is freed after the lock is let go.
            drop(ways);
            drop(evicted);
            named
        }
    }

    /// `name` from `ways` if it is there, moved to the front (the most recently used).
    fn take_hit(ways: &mut [Option<Arc<Named>>; WAYS], name: &str) -> Option<Arc<Named>> {
        let hit = ways
            .iter()
            .position(|way| way.as_ref().is_some_and(|cached| *cached.name == *name))?;
        ways[..=hit].rotate_right(1);
        ways[0].clone()
    }

    /// FxHash of the bytes, folded to one of `sets` sets.
    pub(super) fn set_of(bytes: &[u8], sets: usize) -> usize {
        const K: u64 = 0xf135_7aea_2e62_a9c5;
        let mut hash = bytes.len() as u64;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
            hash = (hash ^ word).wrapping_mul(K).rotate_left(26);
        }
        for &byte in chunks.remainder() {
            hash = (hash ^ u64::from(byte)).wrapping_mul(K).rotate_left(26);
        }
        // Scaled rather than taken modulo: the product's high bits are the well-mixed ones.
        ((u128::from(hash.wrapping_mul(K)) * sets as u128) >> 64) as usize
    }
}

/// sqlx's derivation of a lock id from a name (`PgAdvisoryLock::new`).
fn sqlx_lock_id(name: &str) -> i64 {
    // DO NOT CHANGE: it must give what sqlx gives, or pglock and sqlx stop excluding each other.
    let hkdf = hkdf::Hkdf::<Sha256>::new(None, name.as_bytes());
    let mut okm = [0u8; 8];
    hkdf.expand(b"SQLx (Rust) Postgres advisory lock", &mut okm)
        .expect("8 bytes is a valid HKDF-SHA256 output length");
    i64::from_le_bytes(okm)
}

/// Names print as themselves (so messages match the Python original's); the other keys as
/// `id:{id}`, `pair:{a},{b}` and `sqlx:{name}`.
impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.repr {
            Repr::Name(named) => f.write_str(&named.name),
            Repr::Id(id) => write!(f, "id:{id}"),
            Repr::Pair(a, b) => write!(f, "pair:{a},{b}"),
            Repr::Sqlx(named) => write!(f, "sqlx:{}", named.name),
        }
    }
}

/// A key equals a string when it is that name: `LockKey::from("a") == "a"`. Keys of the other
/// kinds equal no string, whatever their display form.
impl PartialEq<str> for LockKey {
    fn eq(&self, other: &str) -> bool {
        self.as_name() == Some(other)
    }
}

impl PartialEq<&str> for LockKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_name() == Some(*other)
    }
}

impl PartialEq<String> for LockKey {
    fn eq(&self, other: &String) -> bool {
        self.as_name() == Some(other.as_str())
    }
}

impl PartialEq<LockKey> for &str {
    fn eq(&self, other: &LockKey) -> bool {
        other == self
    }
}

impl From<&str> for LockKey {
    fn from(name: &str) -> Self {
        LockKey {
            repr: Repr::Name(names::intern(name, || name.into())),
        }
    }
}

impl From<String> for LockKey {
    fn from(name: String) -> Self {
        LockKey::name(name)
    }
}

impl From<&String> for LockKey {
    fn from(name: &String) -> Self {
        LockKey::from(name.as_str())
    }
}

impl From<&&str> for LockKey {
    fn from(name: &&str) -> Self {
        LockKey::from(*name)
    }
}

impl From<&LockKey> for LockKey {
    fn from(key: &LockKey) -> Self {
        key.clone()
    }
}

impl From<i64> for LockKey {
    fn from(id: i64) -> Self {
        LockKey::id(id)
    }
}

impl From<(i32, i32)> for LockKey {
    fn from((a, b): (i32, i32)) -> Self {
        LockKey::pair(a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sharing_a_cache_set_keep_their_own_ids() {
        // More names than a set of the process's cache has ways, all landing in one set, made
        // in turn, again and again, so every make evicts another: each key always carries its
        // own name's id, and equal names give equal keys.
        let first = "slot-probe-0".to_owned();
        let set = names::set_of(first.as_bytes(), names::SETS);
        let mut names: Vec<String> = (1..1_000_000)
            .map(|n| format!("slot-probe-{n}"))
            .filter(|name| names::set_of(name.as_bytes(), names::SETS) == set)
            .take(names::WAYS)
            .collect();
        names.insert(0, first);
        assert_eq!(
            names.len(),
            names::WAYS + 1,
            "names sharing a set: {names:?}"
        );
        for _ in 0..3 {
            for name in &names {
                let key = LockKey::from(name.as_str());
                assert_eq!(key.target(), LockTarget::BigInt(lock_id(name)), "{name}");
                assert_eq!(key.as_name(), Some(name.as_str()));
                assert_eq!(key, LockKey::name(name.clone()));
            }
        }
        assert_ne!(
            LockKey::from(names[0].as_str()),
            LockKey::from(names[1].as_str())
        );
    }

    #[test]
    fn a_set_keeps_its_most_recently_used_names() {
        // A cache of one set: every name shares it.
        let cache = names::Cache::<1>::new();
        let make = |name: &str| cache.intern(name, || name.into());
        let names: Vec<String> = (0..names::WAYS).map(|n| format!("name-{n}")).collect();
        let made: Vec<Arc<Named>> = names.iter().map(|name| make(name)).collect();
        for (name, first) in names.iter().zip(&made) {
            assert!(Arc::ptr_eq(first, &make(name)), "every way is kept: {name}");
        }
        // Used again, the first name is the most recent; the second is now the one used
        // longest ago, and a new name takes its way.
        assert!(Arc::ptr_eq(&made[0], &make(&names[0])));
        let new = make("new");
        assert!(
            Arc::ptr_eq(&made[0], &make(&names[0])),
            "the name used lately stays"
        );
        assert!(Arc::ptr_eq(&new, &make("new")));
        let again = make(&names[1]);
        assert!(
            !Arc::ptr_eq(&made[1], &again),
            "{} was evicted and made anew",
            names[1]
        );
        assert_eq!(
            (again.id, &*again.name),
            (lock_id(&names[1]), names[1].as_str())
        );
    }

    #[test]
    fn a_name_made_twice_at_once_is_kept_once() {
        // The name is made again while the first make derives its id (here from `copy`, which
        // runs between the two looks at the set, as another thread could): both get the same
        // copy.
        let cache = names::Cache::<1>::new();
        let theirs = std::cell::RefCell::new(None);
        let ours = cache.intern("same", || {
            *theirs.borrow_mut() = Some(cache.intern("same", || "same".into()));
            "same".into()
        });
        let theirs = theirs.into_inner().expect("made inside");
        assert!(Arc::ptr_eq(&ours, &theirs));
    }

    #[test]
    fn ids_are_non_negative_for_keys_of_any_shape() {
        let big = "x".repeat(1 << 20);
        for key in ["", "\0", "a\0b", "ключ", "🔒", "\u{FEFF}", big.as_str()] {
            assert!(lock_id(key) >= 0, "{key:?}");
        }
    }

    #[test]
    fn packed_targets_split_like_pg_locks() {
        assert_eq!(LockTarget::IntPair(1, 2).packed(), (1 << 32) | 2);
        assert_eq!(
            split_lock_id(LockTarget::IntPair(-1, -2).packed()),
            (u32::MAX, u32::MAX - 1)
        );
        assert_eq!(LockTarget::BigInt(-7).packed(), -7);
        assert_eq!(
            LockKey::from("alpha").target().packed(),
            lock_id("alpha"),
            "a name keeps its frozen id"
        );
        assert_ne!(LockKey::from("42"), LockKey::id(42));
        assert_eq!(LockKey::from((1, 2)), LockKey::pair(1, 2));
        assert_eq!(LockKey::sqlx("x").to_string(), "sqlx:x");
        assert_eq!(LockKey::id(-7).to_string(), "id:-7");
        let (key, name) = (LockKey::name("a"), String::from("a"));
        assert_eq!(key, "a");
        assert_eq!(key, name);
        assert_eq!("a", key);
        assert!(LockKey::id(-7) != "id:-7", "only a name equals a string");
    }

    #[test]
    fn split_matches_pg_locks_layout() {
        assert_eq!(
            split_lock_id(lock_id("leader:orders-subscription")),
            (1549200847, 2698798129)
        );
        assert_eq!(split_lock_id(i64::MAX), (0x7FFF_FFFF, u32::MAX));
        assert_eq!(split_lock_id(0), (0, 0));
    }
}
