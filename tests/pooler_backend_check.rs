//! Behind a transaction-pooling proxy (PgBouncer in transaction mode), a statement can run on
//! another server session than the one the manager set up, where a session lock would be
//! stranded. Every statement a manager sends on a session locks only on the backend it set up:
//! elsewhere it takes nothing, and the caller gets `Error::TransactionPooling`.
//!
//! `tests/pooler_session_locks.rs` shows what a real PgBouncer does. The one CI installs
//! (Debian's) keeps no prepared statements across server connections in transaction mode, so
//! there a statement that moves fails on its prepared statement before its lock function runs,
//! and those tests pass even without the backend check. A pooler that carries prepared
//! statements over (PgBouncer 1.21 and later) runs the statement; this test plays that case,
//! and fails without the check.
//!
//! Its proxy plays the pooler's worst case for one connection at a time: each client
//! connection is backed by two server sessions, and `Pooler::swap` sends everything the
//! connections open at that moment say from then on to their other session, as a pooler that
//! hands the next transaction another server connection does. A statement first prepared
//! after the swap is prepared there too, as such a pooler would.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{app_name, key, lock_rows};
use pglock::{Error, lock_id};
use pglock_testing::TempPostgres;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What a client's first packet asks for instead of a session: TLS or GSS encryption.
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;

struct Pooler {
    addr: SocketAddr,
    /// Bumped by `swap`; a connection talks to its second server session once this has grown
    /// past its value when the connection was accepted.
    swaps: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Pooler {
    /// Listens on a free local port, in front of the server listening on `server_port`
    /// (trusting local connections: the proxy opens the second session with the client's own
    /// startup packet, and cannot answer a password request).
    async fn start(server_port: u16) -> Pooler {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let swaps = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn({
            let swaps = Arc::clone(&swaps);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let accepted_at = swaps.load(Ordering::SeqCst);
                    tokio::spawn(serve(client, server_port, Arc::clone(&swaps), accepted_at));
                }
            }
        });
        Pooler {
            addr,
            swaps,
            accept,
        }
    }

    fn options(&self, app: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.addr.port())
            .username("postgres")
            .database("postgres")
            .application_name(app)
    }

    /// From now on, every connection open now runs its statements on its other server session.
    fn swap(&self) {
        self.swaps.fetch_add(1, Ordering::SeqCst);
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// One packet of the startup phase: a length (counting itself), then the body.
async fn read_packet(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = stream.read_u32().await?;
    let mut packet = len.to_be_bytes().to_vec();
    packet.resize(len as usize, 0);
    stream.read_exact(&mut packet[4..]).await?;
    Ok(packet)
}

/// Reads a fresh session's answer to its startup packet, up to ReadyForQuery.
async fn drain_startup(server: &mut OwnedReadHalf) -> std::io::Result<()> {
    loop {
        let kind = server.read_u8().await?;
        let len = server.read_u32().await?;
        let mut body = vec![0; len as usize - 4];
        server.read_exact(&mut body).await?;
        match kind {
            b'R' => assert_eq!(
                &body[..4],
                &[0, 0, 0, 0],
                "the proxy's second session needs a server that trusts local connections"
            ),
            b'E' => panic!("the second session was refused: {body:?}"),
            b'Z' => return Ok(()),
            _ => {}
        }
    }
}

async fn serve(client: TcpStream, server_port: u16, swaps: Arc<AtomicU64>, accepted_at: u64) {
    let _ = serve_inner(client, server_port, swaps, accepted_at).await;
}

async fn serve_inner(
    mut client: TcpStream,
    server_port: u16,
    swaps: Arc<AtomicU64>,
    accepted_at: u64,
) -> std::io::Result<()> {
    let startup = loop {
        let packet = read_packet(&mut client).await?;
        let code = u32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
        if packet.len() == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
            client.write_all(b"N").await?;
            continue;
        }
        break packet;
    };
    let target = ("127.0.0.1", server_port);
    let (first_read, mut first_write) = TcpStream::connect(target).await?.into_split();
    let (mut second_read, mut second_write) = TcpStream::connect(target).await?.into_split();
    first_write.write_all(&startup).await?;
    second_write.write_all(&startup).await?;
    drain_startup(&mut second_read).await?;
    let (client_read, client_write) = client.into_split();
    let client_write = Arc::new(tokio::sync::Mutex::new(client_write));
    let answers = [
        tokio::spawn(forward_answers(first_read, Arc::clone(&client_write))),
        tokio::spawn(forward_answers(second_read, Arc::clone(&client_write))),
    ];
    forward_requests(client_read, [first_write, second_write], swaps, accepted_at).await;
    for answer in answers {
        let _ = answer.await;
    }
    Ok(())
}

/// Sends what the client says to its first server session, or to its second once a swap came
/// after the connection was accepted. Closing the client closes both.
async fn forward_requests(
    mut client: OwnedReadHalf,
    mut servers: [OwnedWriteHalf; 2],
    swaps: Arc<AtomicU64>,
    accepted_at: u64,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match client.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let to = usize::from(swaps.load(Ordering::SeqCst) > accepted_at);
        if servers[to].write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    for server in &mut servers {
        let _ = server.shutdown().await;
    }
}

async fn forward_answers(
    mut server: OwnedReadHalf,
    client: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match server.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if client.lock().await.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// How many advisory locks the server holds or awaits for `key`, on any session.
async fn on_the_server(observer: &PgPool, key: &str) -> usize {
    lock_rows(observer, lock_id(key)).await.len()
}

#[tokio::test]
async fn statements_that_land_on_another_server_session_take_nothing() {
    let server = TempPostgres::start().unwrap_or_else(|err| {
        panic!(
            "this test needs a private server that trusts local connections, started from the \
             PostgreSQL server binaries (install them, or point PGLOCK_PG_BIN at them): {err}"
        )
    });
    let observer = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .expect("connect");
    let pooler = Pooler::start(server.port()).await;
    let app = app_name("pooled");
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(pooler.options(&app))
        .await
        .expect("connect through the proxy");
    let locks = common::manager_for(pool, &app)
        .lock_sessions(1)
        .idle_sessions(1, Duration::from_secs(60))
        .detect_lost_locks(false)
        .build();

    // Before the swap, every connection talks to the session it set up: locks work.
    let (tried, waited) = (key("pooled-try"), key("pooled-wait"));
    let guard = locks
        .acquire(&key("pooled-warm"), None)
        .await
        .expect("acquire");
    guard.release().await.expect("release");
    // A wait that times out leaves its (set-up) wait session with the manager, for the next.
    let mut elsewhere = observer.acquire().await.expect("checkout");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(lock_id(&waited))
        .execute(&mut *elsewhere)
        .await
        .expect("lock elsewhere");
    let err = locks
        .acquire(&waited, Some(Duration::from_millis(100)))
        .await
        .expect_err("held elsewhere");
    assert!(err.is_timeout(), "{err:?}");

    pooler.swap();

    // A try on the lock session runs on another server session: nothing is taken there.
    let err = locks
        .try_acquire_shared(tried.as_str())
        .await
        .expect_err("the statement ran on another server session");
    assert!(
        matches!(&err, Error::TransactionPooling { key } if key == &tried),
        "{err:?}"
    );
    assert_eq!(
        on_the_server(&observer, &tried).await,
        0,
        "a lock was taken"
    );
    assert_eq!(locks.held_lock_count(), 0);

    // A wait on the kept wait session does too: nothing waits, nothing is taken.
    let err = locks
        .acquire(&waited, Some(Duration::from_secs(2)))
        .await
        .expect_err("the wait ran on another server session");
    assert!(
        matches!(&err, Error::TransactionPooling { key } if key == &waited),
        "{err:?}"
    );
    assert_eq!(
        on_the_server(&observer, &waited).await,
        1,
        "only the other holder's lock"
    );
    assert_eq!(locks.held_lock_count(), 0);
    drop(elsewhere);
}
