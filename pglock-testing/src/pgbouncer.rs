//! A throwaway PgBouncer in front of a test server.

use std::env;
use std::fs;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;

use super::server::running_as_root;

/// How to get PgBouncer when it cannot be found.
pub const HOW_TO_GET_PGBOUNCER: &str = "These tests start their own PgBouncer and need its \
    binary: install it (`apt-get install pgbouncer` on Debian and Ubuntu, which puts it in \
    /usr/sbin), or point PGLOCK_PGBOUNCER at it.";

/// How long a new PgBouncer may take to accept connections.
const READY_WITHIN: Duration = Duration::from_secs(15);

/// PgBouncer's pooling modes: when a server connection goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// When the client disconnects: a client keeps one server connection throughout.
    Session,
    /// When a transaction ends: statements in autocommit may each run on another server
    /// connection.
    Transaction,
    /// After every statement; transaction blocks are refused.
    Statement,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
            PoolMode::Statement => "statement",
        }
    }
}

/// A private PgBouncer on a free port of 127.0.0.1, in front of a PostgreSQL server, for tests
/// of code that runs behind one.
///
/// It is started from the installed `pgbouncer` binary (found through `PGLOCK_PGBOUNCER`,
/// `PATH`, `/usr/sbin` or `/usr/local/bin`), with its configuration in a temporary directory,
/// and is killed and its directory deleted when dropped, or when the process exits however it
/// exits: a watchdog process does it once the test process is gone. When the process runs as
/// root, PgBouncer (which refuses to run as root) switches to the `postgres` user, or
/// `PGLOCK_PG_USER`.
///
/// Clients may log in as any user without a password: PgBouncer logs into the server as the
/// upstream URL's user, with its password. Its single database has the upstream's name.
///
/// The configuration is what sqlx needs: `ignore_startup_parameters = extra_float_digits`
/// (sqlx sends it; PgBouncer refuses unknown startup parameters). PgBouncer 1.18 does not
/// support protocol-level prepared statements in transaction mode, and sqlx prepares every
/// statement that has bind parameters, in a round trip of its own: through this pooler in
/// transaction mode, run such statements inside a transaction with
/// `sqlx::query(..).persistent(false)`, or send them unprepared (`sqlx::raw_sql`).
///
/// ```no_run
/// use pglock_testing::{PoolMode, TempPgBouncer, database_url};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let bouncer = TempPgBouncer::start(database_url(), PoolMode::Transaction, 4)?;
/// let pool = sqlx::PgPool::connect(&bouncer.url()).await?;
/// let mut tx = pool.begin().await?;
/// pglock::TransactionLock::exclusive("k").acquire(&mut tx, None).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct TempPgBouncer {
    root: PathBuf,
    port: u16,
    database: String,
    process: Mutex<Option<Child>>,
    watchdog: Mutex<Option<Child>>,
}

impl TempPgBouncer {
    /// Starts a PgBouncer in `mode` in front of the server at `upstream` (a `postgres://`
    /// URL), with at most `pool_size` server connections, and waits until it accepts
    /// connections.
    ///
    /// # Errors
    ///
    /// When the binary cannot be found (the message says how to get it, see
    /// [`HOW_TO_GET_PGBOUNCER`]), the URL cannot be parsed, or PgBouncer exits or does not
    /// listen within 15 seconds; the error carries its log.
    pub fn start(upstream: &str, mode: PoolMode, pool_size: u32) -> io::Result<TempPgBouncer> {
        let binary = find_pgbouncer().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no pgbouncer binary found. {HOW_TO_GET_PGBOUNCER}"),
            )
        })?;
        let target = Upstream::parse(upstream)?;
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let root = env::temp_dir().join(format!(
            "pglock-pgbouncer-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root)?;
        let mut bouncer = TempPgBouncer {
            root,
            port: 0,
            database: target.database.clone(),
            process: Mutex::new(None),
            watchdog: Mutex::new(None),
        };
        let mut last_error = None;
        for _ in 0..5 {
            bouncer.port = free_port()?;
            match bouncer.launch(&binary, &target, mode, pool_size) {
                Ok(()) => return Ok(bouncer),
                // Someone may have taken the port between our probe and PgBouncer's bind.
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.expect("at least one attempt was made"))
    }

    /// A URL for the pooled database (as the user `postgres`; any user name is accepted).
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{}",
            self.port, self.database
        )
    }

    /// Connect options for [`url`](Self::url).
    pub fn options(&self) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.port)
            .username("postgres")
            .database(&self.database)
    }

    /// The TCP port PgBouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.root.join("pgbouncer.log")).unwrap_or_default()
    }

    fn launch(
        &self,
        binary: &Path,
        target: &Upstream,
        mode: PoolMode,
        pool_size: u32,
    ) -> io::Result<()> {
        let config = self.root.join("pgbouncer.ini");
        fs::write(&config, target.config(self.port, mode, pool_size))?;
        let log = fs::File::create(self.root.join("pgbouncer.log"))?;
        let mut command = Command::new(binary);
        if running_as_root() {
            let user = env::var("PGLOCK_PG_USER").unwrap_or_else(|_| "postgres".to_owned());
            command.args(["-u", &user]);
        }
        let child = command
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let pid = child.id();
        self.replace_process(Some(child));
        self.spawn_watchdog(pid)?;
        self.wait_until_listening().inspect_err(|_| self.kill())
    }

    /// Polls for a TCP connection until PgBouncer accepts one, or exits.
    fn wait_until_listening(&self) -> io::Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            let exited = match crate::lock(&self.process).as_mut() {
                Some(child) => child.try_wait()?,
                None => None,
            };
            if let Some(status) = exited {
                return Err(io::Error::other(format!(
                    "pgbouncer exited ({status}); its log:\n{}",
                    self.log()
                )));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::other(format!(
                    "pgbouncer did not listen on port {} within {READY_WITHIN:?}; its log:\n{}",
                    self.port,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a process that waits for our end of a pipe to close (which happens when this
    /// process exits, even on a crash) and then kills PgBouncer and deletes its directory.
    fn spawn_watchdog(&self, pid: u32) -> io::Result<()> {
        use std::os::unix::process::CommandExt;
        let script = r#"cat >/dev/null; kill -9 "$0" 2>/dev/null; rm -rf "$1""#;
        let child = Command::new("sh")
            // A group of its own, so a Ctrl-C to the tests' group does not stop the clean-up.
            .process_group(0)
            .arg("-c")
            .arg(script)
            .arg(pid.to_string())
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let previous = crate::lock(&self.watchdog).replace(child);
        if let Some(mut previous) = previous {
            // The watchdog of a failed attempt: its PgBouncer is already gone.
            let _ = previous.kill();
            let _ = previous.wait();
        }
        Ok(())
    }

    fn replace_process(&self, child: Option<Child>) -> Option<Child> {
        let mut process = crate::lock(&self.process);
        std::mem::replace(&mut *process, child)
    }

    fn kill(&self) {
        if let Some(mut child) = self.replace_process(None) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for TempPgBouncer {
    fn drop(&mut self) {
        self.kill();
        let watchdog = crate::lock(&self.watchdog).take();
        if let Some(mut watchdog) = watchdog {
            // Its PgBouncer is gone; closing its stdin lets it delete the directory.
            drop(watchdog.stdin.take());
            let _ = watchdog.wait();
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// Where PgBouncer logs into.
struct Upstream {
    host: String,
    port: u16,
    user: String,
    password: Option<String>,
    database: String,
}

impl Upstream {
    fn parse(url: &str) -> io::Result<Upstream> {
        let invalid = |err: sqlx::Error| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{url:?}: {err}"))
        };
        let options = PgConnectOptions::from_str(url).map_err(invalid)?;
        let host = match options.get_socket() {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => options.get_host().to_owned(),
        };
        Ok(Upstream {
            host,
            port: options.get_port(),
            user: options.get_username().to_owned(),
            password: url_password(url),
            database: options.get_database().unwrap_or("postgres").to_owned(),
        })
        .and_then(|upstream| {
            // The database's name is also PgBouncer's name for it, a key of its ini file.
            let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
            if upstream.database.chars().all(plain) {
                Ok(upstream)
            } else {
                Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "database name {:?} is not plain enough for PgBouncer's ini",
                        upstream.database
                    ),
                ))
            }
        })
    }

    fn config(&self, port: u16, mode: PoolMode, pool_size: u32) -> String {
        let quote = |value: &str| format!("'{}'", value.replace('\'', "''"));
        let password = self
            .password
            .as_deref()
            .map(|password| format!(" password={}", quote(password)))
            .unwrap_or_default();
        format!(
            "[databases]\n\
             {database} = host={host} port={upstream_port} dbname={database} user={user}{password}\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             ; clients log in without a password; PgBouncer logs into the server as `user`\n\
             auth_type = any\n\
             pool_mode = {mode}\n\
             default_pool_size = {pool_size}\n\
             max_client_conn = 500\n\
             ; sqlx sends it at startup, and PgBouncer refuses parameters it does not know\n\
             ignore_startup_parameters = extra_float_digits\n",
            database = self.database,
            host = quote(&self.host),
            upstream_port = self.port,
            user = quote(&self.user),
            mode = mode.as_str(),
        )
    }
}

/// The percent-decoded password of a `postgres://user:password@host/...` URL, if it has one.
fn url_password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    let encoded = userinfo.split_once(':')?.1;
    let mut bytes = Vec::with_capacity(encoded.len());
    let mut chars = encoded.bytes();
    while let Some(byte) = chars.next() {
        let decoded = match byte {
            b'%' => {
                let hex = [chars.next()?, chars.next()?];
                u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?
            }
            byte => byte,
        };
        bytes.push(decoded);
    }
    String::from_utf8(bytes).ok()
}

fn find_pgbouncer() -> Option<PathBuf> {
    if let Some(path) = env::var_os("PGLOCK_PGBOUNCER") {
        return Some(PathBuf::from(path)).filter(|path| path.is_file());
    }
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain([
            "/usr/sbin".into(),
            "/usr/local/bin".into(),
            "/usr/bin".into(),
        ])
        .map(|dir: PathBuf| dir.join("pgbouncer"))
        .find(|path| path.is_file())
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_come_out_of_urls_decoded() {
        assert_eq!(
            url_password("postgres://u:p%40ss@h:5432/db").as_deref(),
            Some("p@ss")
        );
        assert_eq!(url_password("postgres://u@h/db"), None);
        assert_eq!(url_password("postgres://h/db"), None);
        assert_eq!(
            url_password("postgres://u:a:b@h/db?x=@").as_deref(),
            Some("a:b")
        );
    }
}
