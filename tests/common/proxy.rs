//! A TCP proxy between the code under test and PostgreSQL that can stop forwarding without
//! closing anything: a network blackhole, as a partition looks to both ends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Proxy {
    addr: SocketAddr,
    /// Writes forwarded from clients to the server: one per round trip a client starts.
    sent: Arc<AtomicU64>,
    blackholed: watch::Sender<bool>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Forwards a local port to the test database's server.
    pub async fn start() -> Proxy {
        let target = super::options("proxy-target");
        let target = format!("{}:{}", target.get_host(), target.get_port());
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (blackholed, _) = watch::channel(false);
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let sent = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn({
            let (blackholed, tasks, sent) = (blackholed.clone(), tasks.clone(), sent.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(&target).await else {
                        continue;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let mut tasks = tasks.lock().expect("tasks");
                    tasks.push(tokio::spawn(pump(
                        client_read,
                        server_write,
                        blackholed.subscribe(),
                        Some(sent.clone()),
                    )));
                    tasks.push(tokio::spawn(pump(
                        server_read,
                        client_write,
                        blackholed.subscribe(),
                        None,
                    )));
                }
            }
        });
        Proxy {
            addr,
            sent,
            blackholed,
            tasks,
            accept,
        }
    }

    /// Connect options that go through the proxy, tagged with `application_name` `app`.
    pub fn options(&self, app: &str) -> PgConnectOptions {
        super::options(app)
            .host(&self.addr.ip().to_string())
            .port(self.addr.port())
    }

    /// How many reads the proxy has forwarded from clients to the server so far. A client
    /// sends each round trip's messages in one write, so on a quiet loopback this counts round
    /// trips (a large message could be split, so compare counts, not bytes).
    pub fn client_writes(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// Stops forwarding in both directions; sockets stay open and data waits in the proxy.
    pub fn blackhole(&self) {
        self.blackholed.send_replace(true);
    }

    /// Resumes forwarding.
    pub fn restore(&self) {
        self.blackholed.send_replace(false);
    }

    /// Closes every proxied connection at once, as a network that finally gives up does.
    pub fn sever(&self) {
        for task in self.tasks.lock().expect("tasks").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut blackholed: watch::Receiver<bool>,
    counter: Option<Arc<AtomicU64>>,
) {
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
        // Bytes read just before a blackhole are held back, not delivered.
        if blackholed.wait_for(|on| !*on).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some(counter) = &counter {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    }
}
