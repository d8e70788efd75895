//! A database of a test's own and a role that owns nothing, as production connects: for
//! tests of what pglock needs from the application's role.

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// A fresh database, an admin pool on it, and a role that owns nothing.
pub struct Sandbox {
    pub admin: PgPool,
    admin_options: PgConnectOptions,
    role_options: PgConnectOptions,
    database: String,
    pub role: String,
}

impl Sandbox {
    pub async fn new(label: &str) -> Sandbox {
        let suffix = &uuid::Uuid::new_v4().simple().to_string()[..12];
        let (database, role) = (format!("roles_{label}_{suffix}"), format!("app_{suffix}"));
        let server = server_pool().await;
        exec(&server, format!("CREATE DATABASE {database}"))
            .await
            .expect("create the database (the test user needs CREATEDB)");
        exec(&server, format!("CREATE ROLE {role} LOGIN PASSWORD 'app'"))
            .await
            .expect("create the role (the test user needs CREATEROLE)");
        server.close().await;
        let options: PgConnectOptions = pglock_testing::database_url().parse().expect("url");
        let admin_options = options.clone().database(&database);
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect_with(admin_options.clone())
            .await
            .expect("connect as admin");
        // As PostgreSQL 15 has it by default; said out loud for older servers.
        exec(
            &admin,
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC".to_owned(),
        )
        .await
        .expect("revoke");
        let role_options = options.database(&database).username(&role).password("app");
        Sandbox {
            admin,
            admin_options,
            role_options,
            database,
            role,
        }
    }

    /// Drops the database and the role (a server given in `DATABASE_URL` keeps neither).
    pub async fn remove(self) {
        self.admin.close().await;
        let server = server_pool().await;
        drop_database_forcibly(&server, &self.database)
            .await
            .expect("clean up");
        exec(&server, format!("DROP ROLE {}", self.role))
            .await
            .expect("clean up");
        server.close().await;
    }

    /// A pool connecting as the role.
    pub async fn role_pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .connect_with(self.role_options.clone())
            .await
            .expect("connect as the role")
    }

    /// A pool of at most `max` connections on the database as the test's own user.
    pub async fn admin_pool(&self, max: u32) -> PgPool {
        PgPoolOptions::new()
            .max_connections(max)
            .connect_with(self.admin_options.clone())
            .await
            .expect("connect as admin")
    }

    pub async fn admin(&self, sql: &str) {
        exec(&self.admin, sql.to_owned())
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"));
    }
}

/// A pool of one connection on the test database, as the test's own (administrative) user.
async fn server_pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .connect(pglock_testing::database_url())
        .await
        .expect("connect to the test database")
}

/// Drops database `name` (an identifier the test made), ending the sessions still connected
/// to it: `WITH (FORCE)` from PostgreSQL 13 on; on 12, which lacks it, they are terminated
/// first (`DROP DATABASE` waits a few seconds for them to exit).
pub async fn drop_database_forcibly(pool: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    let (version,): (String,) = sqlx::query_as("SHOW server_version_num")
        .fetch_one(pool)
        .await?;
    let version: u32 = version.parse().expect("server_version_num is a number");
    if version >= 130_000 {
        return exec(pool, format!("DROP DATABASE {name} WITH (FORCE)")).await;
    }
    sqlx::query(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind(name)
    .execute(pool)
    .await?;
    exec(pool, format!("DROP DATABASE {name}")).await
}

/// Runs an SQL text made by the test.
pub async fn exec(pool: &PgPool, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .map(drop)
}
