//! Hostile `search_path`s: schemas that shadow what `pg_catalog` provides, to put ahead of it
//! in a connection's `search_path` and check that code (pglock's, or yours) names what it
//! means. A schema-per-tenant application lists schemas that other roles may write; an object
//! there with a `pg_catalog` name takes its place in every statement that does not name its
//! schema.
//!
//! ```no_run
//! # async fn check(admin: sqlx::PgPool, options: sqlx::postgres::PgConnectOptions) -> sqlx::Result<()> {
//! let schema = pglock_testing::search_path::shadowing(&admin).await?;
//! let hostile = pglock_testing::search_path::ahead_of_pg_catalog(options, &schema);
//! let pool = sqlx::PgPool::connect_with(hostile).await?;
//! // ... every statement on `pool` that names something unqualified fails: "hijacked: now" ...
//! pool.close().await;
//! pglock_testing::search_path::drop(&admin, &schema).await?;
//! # Ok(()) }
//! ```
//!
//! Creating a schema needs the `CREATE` privilege on the database (the test server's owner
//! has it).

use sqlx::postgres::PgConnectOptions;
use sqlx::{AssertSqlSafe, PgPool};

/// `options` with `schema` first in the `search_path`, ahead of `pg_catalog` and `public`.
pub fn ahead_of_pg_catalog(options: PgConnectOptions, schema: &str) -> PgConnectOptions {
    options.options([("search_path", format!("{schema}, pg_catalog, public"))])
}

/// Drops a schema this module made, with everything in it.
pub async fn drop(admin: &PgPool, schema: &str) -> sqlx::Result<()> {
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(admin)
        .await
        .map(|_| ())
}

/// A new schema (its name returned) whose advisory-lock functions lock nothing and answer as
/// if they had, as the stubs of engines that only look like PostgreSQL do. Ahead of
/// `pg_catalog`, two sessions that call them unqualified both "hold" one key.
pub async fn lock_stubs(admin: &PgPool) -> sqlx::Result<String> {
    let schema = format!("stubs_{}", uuid::Uuid::new_v4().simple());
    let mut sql = format!("CREATE SCHEMA {schema};");
    for (name, args, answer) in [
        ("pg_try_advisory_lock", "bigint", "boolean"),
        ("pg_try_advisory_lock_shared", "bigint", "boolean"),
        ("pg_try_advisory_lock", "integer, integer", "boolean"),
        ("pg_advisory_unlock", "bigint", "boolean"),
        ("pg_advisory_unlock_shared", "bigint", "boolean"),
        ("pg_try_advisory_xact_lock", "bigint", "boolean"),
        ("pg_advisory_lock", "bigint", "void"),
        ("pg_advisory_xact_lock", "bigint", "void"),
    ] {
        let body = if answer == "void" { "" } else { "SELECT true" };
        sql.push_str(&format!(
            "CREATE FUNCTION {schema}.{name}({args}) RETURNS {answer} LANGUAGE sql AS $s${body}$s$;"
        ));
    }
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(admin).await?;
    Ok(schema)
}

/// The function names a statement of pglock might use, each shadowed by [`shadowing`] for
/// every signature `pg_catalog` has it with.
pub const FUNCTIONS: &[&str] = &[
    "pg_advisory_lock",
    "pg_advisory_lock_shared",
    "pg_try_advisory_lock",
    "pg_try_advisory_lock_shared",
    "pg_advisory_unlock",
    "pg_advisory_unlock_shared",
    "pg_advisory_unlock_all",
    "pg_advisory_xact_lock",
    "pg_advisory_xact_lock_shared",
    "pg_try_advisory_xact_lock",
    "pg_try_advisory_xact_lock_shared",
    "pg_backend_pid",
    "pg_is_in_recovery",
    "pg_notify",
    "current_setting",
    "set_config",
    "unnest",
    "now",
    "clock_timestamp",
    "statement_timestamp",
    "transaction_timestamp",
    "substr",
    "pg_walfile_name",
    "pg_current_wal_lsn",
    "to_jsonb",
    "to_regclass",
    "has_table_privilege",
    "has_schema_privilege",
    "host",
    "current_database",
    "current_schema",
    "current_user",
    "version",
    "pg_terminate_backend",
    "pg_cancel_backend",
    "format",
    "quote_ident",
    "concat",
    "lower",
    "upper",
    "length",
    "greatest",
    "least",
    "abs",
    "extract",
    "date_part",
    "to_timestamp",
    "make_interval",
    "array_length",
    "cardinality",
    "jsonb_build_object",
    "row_to_json",
    "pg_sleep",
    "txid_current",
    "pg_current_xact_id",
    "gen_random_uuid",
    "random",
    "floor",
    "ceil",
    "round",
    "mod",
    "div",
    "power",
    "trunc",
    "date_trunc",
    "age",
    "timezone",
];

/// The operator names shadowed by [`shadowing`], for every pair of argument types
/// `pg_catalog` has them for.
pub const OPERATORS: &[&str] = &[
    "=", "<>", "<", ">", "<=", ">=", "<<", ">>", "|", "&", "#", "+", "-", "*", "/", "%", "||",
    "~~", "!~~", "->", "->>", "@>", "<@",
];

/// The type names shadowed by [`shadowing`] with composite types of the same name.
pub const TYPES: &[&str] = &[
    "int8",
    "int4",
    "int2",
    "bigint",
    "integer",
    "text",
    "bool",
    "boolean",
    "oid",
    "timestamptz",
    "interval",
    "bit",
    "jsonb",
    "regclass",
    "void",
    "float8",
    "numeric",
    "uuid",
];

/// A new schema (its name returned) in which every name of [`FUNCTIONS`], [`OPERATORS`] and
/// [`TYPES`] is shadowed by one that fails when used (`hijacked: {name}`), for every signature
/// `pg_catalog` has it with: ahead of `pg_catalog` in a `search_path`, a statement that names
/// any of them without `pg_catalog.` fails. (SQL-keyword types such as `bigint` and
/// `timestamp with time zone` are `pg_catalog`'s whatever the path.)
///
/// # Errors
///
/// When fewer than 300 names could be shadowed (the schema would prove little), or a
/// statement fails.
pub async fn shadowing(admin: &PgPool) -> sqlx::Result<String> {
    let schema = format!("hostile_{}", uuid::Uuid::new_v4().simple());
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("'{}'", n.replace('\'', "''")))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let types = TYPES
        .iter()
        .map(|t| format!("CREATE TYPE {schema}.{t} AS (hijacked integer);"))
        .collect::<String>();
    let sql = format!(
        "CREATE SCHEMA {schema};
         DO $h$
         DECLARE r record; n integer := 0;
         BEGIN
           FOR r IN SELECT p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid) AS args,
                           pg_catalog.pg_get_function_result(p.oid) AS result
                    FROM pg_catalog.pg_proc p
                    WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace
                      AND p.prokind = 'f' AND p.proname = ANY (ARRAY[{functions}])
           LOOP
             BEGIN
               EXECUTE pg_catalog.format(
                 'CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS $f$BEGIN RAISE EXCEPTION %L; END$f$',
                 '{schema}', r.proname, r.args, r.result, 'hijacked: ' || r.proname);
               n := n + 1;
             EXCEPTION WHEN OTHERS THEN NULL;
             END;
           END LOOP;
           FOR r IN SELECT o.oid, o.oprname, o.oprleft::pg_catalog.regtype AS l,
                           o.oprright::pg_catalog.regtype AS r, o.oprresult::pg_catalog.regtype AS res
                    FROM pg_catalog.pg_operator o
                    WHERE o.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace
                      AND o.oprname = ANY (ARRAY[{operators}]) AND o.oprleft <> 0
           LOOP
             BEGIN
               EXECUTE pg_catalog.format(
                 'CREATE FUNCTION %I.%I(%s, %s) RETURNS %s LANGUAGE plpgsql AS $f$BEGIN RAISE EXCEPTION %L; END$f$',
                 '{schema}', 'op_' || r.oid, r.l, r.r, r.res, 'hijacked: ' || r.oprname);
               EXECUTE pg_catalog.format(
                 'CREATE OPERATOR %I.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %I.%I)',
                 '{schema}', r.oprname, r.l, r.r, '{schema}', 'op_' || r.oid);
               n := n + 1;
             EXCEPTION WHEN OTHERS THEN NULL;
             END;
           END LOOP;
           IF n < 300 THEN RAISE EXCEPTION 'only % names shadowed', n; END IF;
         END $h$;
         {types}",
        functions = list(FUNCTIONS),
        operators = list(OPERATORS),
    );
    sqlx::raw_sql(AssertSqlSafe(sql)).execute(admin).await?;
    Ok(schema)
}
