//! Lock keys and the frozen key-to-lock-id derivation.

use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The operation name [`migration_key`] uses: `"migration"`.
pub const MIGRATION_OPERATION: &str = "migration";

/// The operation name of the cutover lock taken by the migration consumers: `"cutover"`.
pub const CUTOVER_OPERATION: &str = "cutover";

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
/// original's `migration_lock_key`. The migration consumers use
/// `migration_lock_key(tenant, CUTOVER_OPERATION)` for the cutover lock; use the same helper
/// (never a hand-written format string) for any lock that must exclude it.
///
/// ```
/// use uuid::Uuid;
/// let tenant = Uuid::parse_str("123E4567-E89B-12D3-A456-426614174000").unwrap();
/// assert_eq!(
///     pglock::migration_lock_key(tenant, pglock::CUTOVER_OPERATION),
///     "cutover:123e4567-e89b-12d3-a456-426614174000",
/// );
/// ```
pub fn migration_lock_key(tenant_id: Uuid, operation: &str) -> String {
    format!("{operation}:{}", tenant_id.as_hyphenated())
}

/// Builds the default migration key of a tenant: `"migration:{tenant_id}"`.
///
/// Shorthand for `migration_lock_key(tenant_id, MIGRATION_OPERATION)`, the Python original's
/// default operation.
///
/// ```
/// use uuid::Uuid;
/// let tenant = Uuid::parse_str("123e4567-e89b-12d3-a456-426614174000").unwrap();
/// assert_eq!(pglock::migration_key(tenant), "migration:123e4567-e89b-12d3-a456-426614174000");
/// ```
pub fn migration_key(tenant_id: Uuid) -> String {
    migration_lock_key(tenant_id, MIGRATION_OPERATION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_non_negative_for_keys_of_any_shape() {
        let big = "x".repeat(1 << 20);
        for key in ["", "\0", "a\0b", "ключ", "🔒", "\u{FEFF}", big.as_str()] {
            assert!(lock_id(key) >= 0, "{key:?}");
        }
    }

    #[test]
    fn distinct_operations_give_distinct_locks() {
        let tenant = Uuid::from_u128(0x123e4567_e89b_12d3_a456_426614174000);
        assert_eq!(
            lock_id(&migration_key(tenant)),
            7456848863486897745,
            "printf %s migration:123e4567-e89b-12d3-a456-426614174000 | sha256sum -> 677c0c8883e96e51"
        );
        assert_ne!(
            lock_id(&migration_key(tenant)),
            lock_id(&migration_lock_key(tenant, CUTOVER_OPERATION))
        );
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
