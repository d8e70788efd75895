//! Where scheduled jobs record their windows, and the statements that read and write it.

use std::fmt;
use std::sync::LazyLock;

use crate::InvalidIdentifier;
use crate::sql::table::OwnTable;

/// The table in which [`ScheduledJob`](super::ScheduledJob)s record their runs: one row per job,
/// describing its latest claim.
///
/// | column | meaning |
/// | --- | --- |
/// | `job` | the job's name (primary key) |
/// | `window_start` | the start of the window the latest claim was for |
/// | `runs` | how many claims the job has had; the latest claim's [run number](super::JobRun::run) |
/// | `claimed_by` | the holder id of the latest claim's manager |
/// | `claimed_at` | when the latest claim was made, by the database's clock |
/// | `finished_at` | when its run finished, or `NULL` while it runs (or if it never finished) |
/// | `hold_until` | no new claim before this moment |
/// | `extensions` | how many times the latest claim's run extended its hold |
/// | `extended_at` | when it last did, or `NULL` |
///
/// Everything in it is the database's time (`now()`), never a client's. The name is quoted as
/// an identifier, exactly as for [`FencingTable`](crate::FencingTable): case-sensitive, any
/// character, `schema.table` for a table in a schema. Jobs with different names share one
/// table.
///
/// Before its first run, a job checks that the table exists and that its role may use it; if
/// the table is missing and the role may create tables in the schema, it creates it
/// (concurrent creators are serialised), and otherwise the run fails with
/// [`Error::PermissionDenied`](super::Error::PermissionDenied) naming the schema and `CREATE`.
/// For an application role that owns nothing, create the table in your migrations with
/// [`ddl`](JobTable::ddl) and grant it:
///
/// ```sql
/// GRANT SELECT, INSERT, UPDATE ON pglock_scheduled_jobs TO app;
/// ```
///
/// A table made by pglock 0.1 lacks the last two columns. A job adds them before its first run
/// when its role owns the table; for any other role the run fails with
/// [`Error::PermissionDenied`](super::Error::PermissionDenied) naming them, and
/// [`upgrade_ddl`](JobTable::upgrade_ddl), run by the owner, adds them.
///
/// [`ScheduledJob::prepare`](super::ScheduledJob::prepare) runs the check up front.
///
/// ```
/// use pglock::schedule::JobTable;
///
/// let table = JobTable::new("ops.job_windows")?;
/// assert_eq!(table.to_string(), r#""ops"."job_windows""#);
/// assert!(JobTable::new("a.b.c").is_err());
/// # Ok::<(), pglock::InvalidIdentifier>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobTable {
    table: OwnTable,
}

impl JobTable {
    /// The default table name.
    pub const DEFAULT_NAME: &str = "pglock_scheduled_jobs";

    /// A table called `name` (`table` or `schema.table`).
    ///
    /// # Errors
    ///
    /// [`InvalidIdentifier`] when a part is empty, longer than PostgreSQL's 63 bytes, or
    /// contains a NUL byte, or when the name has more than two parts.
    pub fn new(name: &str) -> Result<Self, InvalidIdentifier> {
        Ok(JobTable {
            table: OwnTable::new(name)?,
        })
    }

    /// The table, for making it ready.
    pub(super) fn table(&self) -> &OwnTable {
        &self.table
    }

    /// The statement that creates the table if it does not exist.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (job pg_catalog.text PRIMARY KEY, \
             window_start {TIME} NOT NULL, runs bigint NOT NULL, claimed_by pg_catalog.text, \
             claimed_at {TIME} NOT NULL, finished_at {TIME}, \
             hold_until {TIME} NOT NULL, extensions integer NOT NULL DEFAULT 0, \
             extended_at {TIME})",
            self.table.quoted()
        )
    }

    /// The statement that adds the columns a table made by pglock 0.1 lacks (`extensions`,
    /// `extended_at`, for [`JobRun::extend`](super::JobRun::extend)); it changes nothing on a
    /// table that has them. A job adds them itself when its role owns the table; otherwise run
    /// it in your migrations, as the table's owner.
    ///
    /// ```
    /// use pglock::schedule::JobTable;
    /// assert!(JobTable::default().upgrade_ddl().starts_with("ALTER TABLE \"pglock_scheduled_jobs\""));
    /// ```
    pub fn upgrade_ddl(&self) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS extensions integer NOT NULL DEFAULT 0, \
             ADD COLUMN IF NOT EXISTS extended_at {TIME}",
            self.table.quoted()
        )
    }

    /// The columns of [`upgrade_ddl`](Self::upgrade_ddl) that the table `$1` (quoted) lacks.
    pub(super) fn missing_columns() -> &'static str {
        "SELECT coalesce(pg_catalog.array_agg(c ORDER BY c), '{}') \
         FROM pg_catalog.unnest(ARRAY['extended_at', 'extensions']::pg_catalog.text[]) AS c \
         WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_attribute \
           WHERE attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass($1::pg_catalog.text) \
           AND attname OPERATOR(pg_catalog.=) c AND NOT attisdropped)"
    }

    /// The job's row next to the database's clock and current window. Parameters: `$1` job,
    /// `$2` period, `$3` offset, `$4` skew tolerance (microseconds).
    pub(super) fn state(&self) -> String {
        format!(
            "WITH {clock} SELECT {CURRENT}, {RECORD} FROM clock \
             LEFT JOIN {t} j ON j.job OPERATOR(pg_catalog.=) $1",
            clock = *CLOCK,
            t = self.table.quoted()
        )
    }

    /// Claims the current window if the job's record allows it, in one statement: the row
    /// lock of `ON CONFLICT DO UPDATE` serialises concurrent claimers, and each re-checks the
    /// condition on the latest row. Returns one row either way, `claimed` saying which.
    /// Parameters as for [`state`](Self::state), plus `$5` max hold (microseconds) and `$6`
    /// the holder id.
    pub(super) fn claim(&self) -> String {
        format!(
            "WITH {clock}, claimed AS ( \
               INSERT INTO {t} AS j (job, window_start, runs, claimed_by, claimed_at, \
                                     finished_at, hold_until, extensions, extended_at) \
               SELECT $1, clock.window_start, 1, $6, clock.now, NULL, \
                      clock.now OPERATOR(pg_catalog.+) {us5}, 0, NULL FROM clock \
               ON CONFLICT (job) DO UPDATE SET window_start = EXCLUDED.window_start, \
                 runs = j.runs OPERATOR(pg_catalog.+) 1, claimed_by = EXCLUDED.claimed_by, \
                 claimed_at = EXCLUDED.claimed_at, finished_at = NULL, \
                 hold_until = EXCLUDED.hold_until, extensions = 0, extended_at = NULL \
               WHERE {CLAIMABLE} \
               RETURNING {RECORD}) \
             SELECT true AS claimed, {CURRENT}, j.* FROM claimed j, clock \
             UNION ALL \
             SELECT false, {CURRENT}, {RECORD} \
             FROM {t} j, clock WHERE j.job OPERATOR(pg_catalog.=) $1 \
               AND NOT EXISTS (SELECT FROM claimed)",
            clock = *CLOCK,
            t = self.table.quoted(),
            us5 = micros("$5"),
        )
    }

    /// Records that run `$2` of job `$1` finished: the claim holds on until `$3` (min hold,
    /// microseconds) past its start, or ends now if that has passed.
    pub(super) fn finish(&self) -> String {
        format!(
            "UPDATE {} SET finished_at = pg_catalog.now(), \
             hold_until = GREATEST(claimed_at OPERATOR(pg_catalog.+) {}, pg_catalog.now()) \
             WHERE {UNFINISHED_RUN}",
            self.table.quoted(),
            micros("$3"),
        )
    }

    /// Gives up run `$2` of job `$1` without finishing it: its window may be claimed again
    /// once the min hold `$3` has passed since the claim, instead of at the max hold.
    pub(super) fn abandon(&self) -> String {
        format!(
            "UPDATE {} SET hold_until = LEAST(hold_until, \
               GREATEST(claimed_at OPERATOR(pg_catalog.+) {}, pg_catalog.now())) \
             WHERE {UNFINISHED_RUN}",
            self.table.quoted(),
            micros("$3"),
        )
    }

    /// Extends the hold of run `$2` of job `$1` by `$3` from now, never past its claim plus
    /// `$4` (the max total hold), never shortening it (microseconds): the rule of
    /// [`JobRecord::extend`](super::JobRecord::extend). No row when the record is no longer
    /// that unfinished run.
    pub(super) fn extend(&self) -> String {
        format!(
            "UPDATE {t} SET hold_until = GREATEST(hold_until, \
               LEAST(pg_catalog.now() OPERATOR(pg_catalog.+) {us3}, \
                     claimed_at OPERATOR(pg_catalog.+) {us4})), \
               extensions = extensions OPERATOR(pg_catalog.+) 1, extended_at = pg_catalog.now() \
             WHERE {UNFINISHED_RUN} \
             RETURNING hold_until, (pg_catalog.now() OPERATOR(pg_catalog.+) {us3}) \
               OPERATOR(pg_catalog.>) (claimed_at OPERATOR(pg_catalog.+) {us4}) AS capped",
            t = self.table.quoted(),
            us3 = micros("$3"),
            us4 = micros("$4"),
        )
    }

    /// The time from the database's `now()` to the start of the next window, in microseconds.
    /// Parameters: `$1` period, `$2` offset (microseconds).
    pub(super) fn until_next_window() -> &'static str {
        static UNTIL: LazyLock<String> = LazyLock::new(|| {
            let now_us = "(extract(epoch FROM pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)";
            let windows = format!(
                "pg_catalog.floor(({now_us} OPERATOR(pg_catalog.-) $2) OPERATOR(pg_catalog./) $1)"
            );
            let next_us = format!(
                "((({windows} OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.*) $1) \
                 OPERATOR(pg_catalog.+) $2)"
            );
            format!("SELECT ({next_us} OPERATOR(pg_catalog.-) {now_us})::bigint")
        });
        UNTIL.as_str()
    }
}

/// The database's clock, and the start of the window a claim made now is for: windows are
/// aligned to whole periods since the Unix epoch, shifted by the offset, and a claim up to the
/// skew tolerance before a window's start counts for that window. All integer microseconds.
static CLOCK: LazyLock<String> = LazyLock::new(|| {
    let epoch_us = "(extract(epoch FROM pg_catalog.now()) OPERATOR(pg_catalog.*) 1000000)";
    let shifted = format!("(({epoch_us} OPERATOR(pg_catalog.-) $3) OPERATOR(pg_catalog.+) $4)");
    let windows = format!("pg_catalog.floor({shifted} OPERATOR(pg_catalog./) $2)");
    let start_us = format!("(({windows} OPERATOR(pg_catalog.*) $2) OPERATOR(pg_catalog.+) $3)");
    format!(
        "clock AS (SELECT pg_catalog.now() AS now, ('epoch'::timestamp with time zone \
         OPERATOR(pg_catalog.+) ({start_us}::double precision \
         OPERATOR(pg_catalog.*) interval '1 microsecond')) AS window_start)"
    )
});

/// The column type of every time in the table.
const TIME: &str = "timestamp with time zone";

/// The unfinished run `$2` of job `$1`.
const UNFINISHED_RUN: &str = "job OPERATOR(pg_catalog.=) $1 AND runs OPERATOR(pg_catalog.=) $2 \
    AND finished_at IS NULL";

/// The interval of `param` microseconds (a `bigint` parameter).
fn micros(param: &str) -> String {
    format!("({param}::bigint OPERATOR(pg_catalog.*) interval '1 microsecond')")
}

/// A record's columns, as every statement returns them.
const RECORD: &str = "j.window_start, j.runs, j.claimed_by, j.claimed_at, j.finished_at, \
    j.hold_until, j.extensions, j.extended_at";

/// The current clock's columns, as every statement returns them.
const CURRENT: &str = "clock.now AS now, clock.window_start AS current_window";

/// A claim may replace the record when the previous claim is over (finished and past its min
/// hold, or past its max hold) and either was for an earlier window or never finished.
const CLAIMABLE: &str = "j.hold_until OPERATOR(pg_catalog.<=) EXCLUDED.claimed_at \
    AND (j.window_start OPERATOR(pg_catalog.<) EXCLUDED.window_start OR j.finished_at IS NULL)";

impl Default for JobTable {
    fn default() -> Self {
        JobTable::new(Self::DEFAULT_NAME).expect("the default name is valid")
    }
}

impl fmt::Display for JobTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.table.quoted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated_and_quoted_like_the_fencing_table() {
        assert_eq!(JobTable::default().to_string(), "\"pglock_scheduled_jobs\"");
        assert_eq!(
            JobTable::new(r#"x"; DROP TABLE y"#).unwrap().to_string(),
            r#""x""; DROP TABLE y""#
        );
        for bad in ["", "a.", "a.b.c", "nul\0"] {
            assert!(JobTable::new(bad).is_err(), "{bad:?}");
        }
    }
}
