//! A table pglock keeps rows in (fencing tokens, scheduled jobs' windows): its name, and how
//! it is made ready for a role that may own nothing.

use sqlx::PgConnection;

use crate::error::InvalidIdentifier;
use crate::sql::quote_identifier;

/// A table named by the user, quoted as an identifier; `schema.table` names a schema, a bare
/// name is found (and created) through the role's `search_path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnTable {
    quoted: String,
    /// The schema as given, unquoted.
    schema: Option<String>,
}

/// Why a table is not ready for the role.
#[derive(Debug)]
pub(crate) enum Unready {
    /// The role lacks `privilege` on `object`.
    Denied { object: String, privilege: String },
    /// A statement failed.
    Failed(sqlx::Error),
}

/// Does the table exist, which privileges has the role on it, may the role create it. One
/// round trip; `$1` is the quoted name, `$2` the schema or NULL. `has_table_privilege` with
/// several privileges is true if *any* is held, so each is asked for alone.
/// A schema that does not exist counts as one the role may not create in (the table's schema
/// is the user's to make).
const ACCESS: &str = "SELECT t IS NOT NULL, \
     coalesce(pg_catalog.has_table_privilege(t, 'SELECT'), false), \
     coalesce(pg_catalog.has_table_privilege(t, 'INSERT'), false), \
     coalesce(pg_catalog.has_table_privilege(t, 'UPDATE'), false), \
     coalesce((SELECT pg_catalog.has_schema_privilege(s, 'CREATE') FROM pg_catalog.pg_namespace \
       WHERE nspname OPERATOR(pg_catalog.=) s), false), \
     coalesce(s, '') \
     FROM (SELECT pg_catalog.to_regclass($1::pg_catalog.text) AS t, \
       coalesce($2::pg_catalog.text, pg_catalog.current_schema()::pg_catalog.text) AS s) AS target";

impl OwnTable {
    pub(crate) fn new(name: &str) -> Result<Self, InvalidIdentifier> {
        let quoted = quote_identifier(name, true)?;
        let schema = name.split_once('.').map(|(schema, _)| schema.to_owned());
        Ok(OwnTable { quoted, schema })
    }

    pub(crate) fn quoted(&self) -> &str {
        &self.quoted
    }

    /// The schema as given, unquoted, if the name has one.
    pub(crate) fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// Makes sure the role can use the table: checks that it exists and that the role may
    /// read (`RETURNING` included), insert and update its rows, and creates it with `ddl` when it is missing and the role may
    /// create tables in its schema (one transaction, serialised with other creators by the
    /// advisory lock `setup_lock`). Never asks the server for what the role may not do, so a
    /// role that owns nothing works with a table made and granted by the user's migrations.
    pub(crate) async fn prepare(
        &self,
        conn: &mut PgConnection,
        ddl: &str,
        setup_lock: &str,
    ) -> Result<(), Unready> {
        let (exists, select, insert, update, create, schema) =
            sqlx::query_as::<_, (bool, bool, bool, bool, bool, String)>(ACCESS)
                .bind(&self.quoted)
                .bind(self.schema.as_deref())
                .fetch_one(&mut *conn)
                .await
                .map_err(Unready::Failed)?;
        if exists {
            let missing: Vec<&str> = [(select, "SELECT"), (insert, "INSERT"), (update, "UPDATE")]
                .into_iter()
                .filter_map(|(granted, privilege)| (!granted).then_some(privilege))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            return Err(Unready::Denied {
                object: format!("table {}", self.quoted),
                privilege: missing.join(", "),
            });
        }
        if !create {
            let schema = if schema.is_empty() {
                "the search_path (none of its schemas exists)".to_owned()
            } else {
                format!("schema \"{}\"", schema.replace('"', "\"\""))
            };
            return Err(Unready::Denied {
                object: format!("{schema}, to create the missing table {}", self.quoted),
                privilege: "CREATE".to_owned(),
            });
        }
        let setup = format!(
            "BEGIN; SELECT pg_catalog.pg_advisory_xact_lock('{}'::bigint); {ddl}; COMMIT",
            crate::lock_id(setup_lock)
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
            .execute(&mut *conn)
            .await
            .map_err(Unready::Failed)?;
        Ok(())
    }
}

impl std::fmt::Display for OwnTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.quoted)
    }
}
