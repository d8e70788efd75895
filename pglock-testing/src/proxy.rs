//! A TCP proxy between the code under test and PostgreSQL that a test controls: it can stop
//! forwarding while keeping every socket open (a partition, as both ends see one), close every
//! connection (a reset), delay what it forwards, send new connections elsewhere (the moving
//! endpoint of a failover), and refuse `LISTEN` (as transaction-mode poolers and some hosted
//! endpoints do).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::lock;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy on a free port of 127.0.0.1, forwarding to a server's host and port.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// let proxy = pglock_testing::Proxy::start("127.0.0.1", 5432).await?;
/// // Point the code under test at 127.0.0.1:proxy.port(), then:
/// proxy.blackhole(); // a partition: nothing gets through, nothing is closed
/// proxy.restore();
/// proxy.reset(); // every open connection closed at once
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    host: String,
    target: AtomicU16,
    /// Reads forwarded from clients to the server.
    client_writes: AtomicU64,
    delay_ms: AtomicU64,
    /// `LISTEN` statements are turned into a syntax error on their way to the server.
    refuse_listen: std::sync::atomic::AtomicBool,
    blackholed: watch::Sender<bool>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

impl Proxy {
    /// Starts forwarding to `host`:`target_port`.
    ///
    /// # Errors
    ///
    /// When no local port can be bound.
    pub async fn start(host: &str, target_port: u16) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            host: host.to_owned(),
            target: AtomicU16::new(target_port),
            client_writes: AtomicU64::new(0),
            delay_ms: AtomicU64::new(0),
            refuse_listen: std::sync::atomic::AtomicBool::new(false),
            blackholed: watch::channel(false).0,
            pumps: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Proxy {
            addr,
            shared,
            accept,
        })
    }

    /// The port clients connect to, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// How many reads the proxy has forwarded from clients to the server so far. A client
    /// sends each round trip's messages in one write, so on a quiet loopback this counts round
    /// trips (a large message could be split: compare counts, not bytes).
    pub fn client_writes(&self) -> u64 {
        self.shared.client_writes.load(Ordering::SeqCst)
    }

    /// Stops forwarding in both directions; sockets stay open, and data waits in the proxy
    /// (and new connections are accepted, but get no answer).
    pub fn blackhole(&self) {
        self.shared.blackholed.send_replace(true);
    }

    /// Resumes forwarding.
    pub fn restore(&self) {
        self.shared.blackholed.send_replace(false);
    }

    /// Closes every connection now open, as a network that gives up does; new ones are taken.
    pub fn reset(&self) {
        let pumps: Vec<_> = lock(&self.shared.pumps).drain(..).collect();
        for pump in pumps {
            pump.abort();
        }
    }

    /// Delays every chunk forwarded, in either direction, by `delay` (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Makes the server refuse every `LISTEN` (and `UNLISTEN`) the clients send from now on, as
    /// PgBouncer in transaction mode and hosted transaction-mode endpoints do: the statement's
    /// keyword is changed on its way, so the server answers a syntax error. Everything else
    /// passes unchanged.
    pub fn refuse_listen(&self, refuse: bool) {
        self.shared.refuse_listen.store(refuse, Ordering::SeqCst);
    }

    /// Sends new connections to `port`; open ones stay where they are until reset.
    pub fn retarget(&self, port: u16) {
        self.shared.target.store(port, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.reset();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((client, _)) = listener.accept().await {
        let _ = client.set_nodelay(true);
        let target = shared.target.load(Ordering::SeqCst);
        // A partitioned network does not answer connection attempts either: the connect waits
        // with the client until the partition heals (or the client gives up).
        let shared2 = shared.clone();
        let connect = tokio::spawn(async move {
            let mut blackholed = shared2.blackholed.subscribe();
            if blackholed.wait_for(|on| !*on).await.is_err() {
                return;
            }
            let Ok(server) = TcpStream::connect((shared2.host.as_str(), target)).await else {
                return; // dropping the client closes it: the connection is refused
            };
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let up = tokio::spawn(pump(client_read, server_write, shared2.clone(), true));
            let down = tokio::spawn(pump(server_read, client_write, shared2.clone(), false));
            lock(&shared2.pumps).extend([up, down]);
        });
        let mut pumps = lock(&shared.pumps);
        pumps.retain(|pump| !pump.is_finished());
        pumps.push(connect);
    }
}

/// Turns every `LISTEN ` in `bytes` into `LISTEX `, a statement the server refuses, keeping
/// the message's length (a keyword split across two reads passes: the tests' are not).
fn spoil_listen(bytes: &mut [u8]) {
    const KEYWORD: &[u8] = b"LISTEN ";
    let mut at = 0;
    while at + KEYWORD.len() <= bytes.len() {
        if bytes[at..].starts_with(KEYWORD) {
            bytes[at + 5] = b'X';
            at += KEYWORD.len();
        } else {
            at += 1;
        }
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: Arc<Shared>, up: bool) {
    let mut blackholed = shared.blackholed.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if blackholed.wait_for(|on| !*on).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        let delay = shared.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        // Bytes read just before a blackhole are held back, not delivered.
        if blackholed.wait_for(|on| !*on).await.is_err() {
            return;
        }
        if up && shared.refuse_listen.load(Ordering::SeqCst) {
            spoil_listen(&mut buf[..n]);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if up {
            shared.client_writes.fetch_add(1, Ordering::SeqCst);
        }
    }
}
