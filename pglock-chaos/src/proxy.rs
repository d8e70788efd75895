//! A TCP proxy between the workers and PostgreSQL that the nemesis controls: it can stop
//! forwarding while keeping every socket open (a partition, as both ends see one), close every
//! connection (a reset), delay what it forwards, and send new connections elsewhere (the
//! moving endpoint of a failover).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy on a free port of 127.0.0.1, forwarding to a port of 127.0.0.1.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    target: AtomicU16,
    delay_ms: AtomicU64,
    blackholed: watch::Sender<bool>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

impl Proxy {
    /// Starts forwarding to `target_port`.
    ///
    /// # Errors
    ///
    /// When no local port can be bound.
    pub async fn start(target_port: u16) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: AtomicU16::new(target_port),
            delay_ms: AtomicU64::new(0),
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

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
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

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
            let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                return; // dropping the client closes it: the connection is refused
            };
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let up = tokio::spawn(pump(client_read, server_write, shared2.clone()));
            let down = tokio::spawn(pump(server_read, client_write, shared2.clone()));
            lock(&shared2.pumps).extend([up, down]);
        });
        let mut pumps = lock(&shared.pumps);
        pumps.retain(|pump| !pump.is_finished());
        pumps.push(connect);
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, shared: Arc<Shared>) {
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
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
