//! The lock keys of tenant migration, all built with pglock's `migration_lock_key`, so they
//! match the Python original's bit for bit.

use pglock::migration_lock_key;
use uuid::Uuid;

/// The operation name [`migration_key`] uses, the Python original's default: `"migration"`.
pub const MIGRATION_OPERATION: &str = "migration";

/// The operation name of a tenant's cutover lock: `"cutover"`. The cutover key is
/// `migration_lock_key(tenant, CUTOVER_OPERATION)`; use the same call (never a hand-written
/// format string) for any lock that must exclude a cutover.
pub const CUTOVER_OPERATION: &str = "cutover";

/// The operation name of a tenant's write gate key: `"write-gate"`.
pub const WRITE_GATE_OPERATION: &str = "write-gate";

/// A tenant's default migration key: `"migration:{tenant_id}"`, as the Python original's
/// `migration_lock_key(tenant_id)` gives it.
///
/// ```
/// use uuid::Uuid;
/// let tenant = Uuid::parse_str("123e4567-e89b-12d3-a456-426614174000").unwrap();
/// assert_eq!(
///     pglock_migration::migration_key(tenant),
///     "migration:123e4567-e89b-12d3-a456-426614174000",
/// );
/// assert_eq!(
///     pglock::migration_lock_key(tenant, pglock_migration::CUTOVER_OPERATION),
///     "cutover:123e4567-e89b-12d3-a456-426614174000",
/// );
/// ```
pub fn migration_key(tenant_id: Uuid) -> String {
    migration_lock_key(tenant_id, MIGRATION_OPERATION)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_operations_give_distinct_locks() {
        let tenant = Uuid::from_u128(0x123e4567_e89b_12d3_a456_426614174000);
        // printf %s migration:123e4567-e89b-12d3-a456-426614174000 | sha256sum -> 677c0c8883e96e51
        assert_eq!(pglock::lock_id(&migration_key(tenant)), 7456848863486897745);
        let cutover = migration_lock_key(tenant, CUTOVER_OPERATION);
        let gate = migration_lock_key(tenant, WRITE_GATE_OPERATION);
        assert_ne!(
            pglock::lock_id(&migration_key(tenant)),
            pglock::lock_id(&cutover)
        );
        assert_ne!(pglock::lock_id(&cutover), pglock::lock_id(&gate));
    }
}
