//! Highly available PostgreSQL: a primary and a streaming hot standby, started by the test from
//! the installed server binaries (`pglock_testing::TempPostgres::start_standby`).
//!
//! One pair serves the whole file, in one test that plays the phases in order, since the last
//! one destroys the primary:
//!
//! 1. **The standby is refused.** Locks asked of the standby fail with `Error::Standby`; with
//!    `allow_standby(true)` the standby grants a key that a holder on the primary holds too
//!    (advisory locks are not replicated), and the manager does not call that lock lost. A
//!    pool behind an endpoint that moves to the standby and back gets no lock there, and keeps
//!    no connection to it.
//! 2. **A failover.** Replication is cut, tokens are minted on the primary that the standby
//!    never receives (plain acquisitions, and two more leadership terms), the primary is
//!    killed (immediate stop) and the standby promoted. Holders on the dead primary are told
//!    within `probe_interval + probe_grace`; managers behind the endpoint, now pointing at the
//!    promoted server, take the same keys again; every token handed out after the promotion
//!    exceeds every token handed out before it, the unreplicated ones included; and the fenced
//!    log written by the elected leaders never goes back, nor has a token with two owners.
//!
//! A second test crashes a server of its own that commits asynchronously, and checks that no
//! token is handed out twice.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::key;
use pglock::leader::Error as LeaderError;
use pglock::{
    Error, FencingTable, LeaderElection, LockGuard, LockInfo, LossCause, PostgresLockManager,
    lock_id,
};
use pglock_testing::TempPostgres;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

/// How often the managers check their locks, and how long they tolerate an unreachable server.
const PROBE: Duration = Duration::from_millis(100);
const GRACE: Duration = Duration::from_millis(300);
/// Leader election: how often a follower tries, and the jitter on top.
const RETRY: Duration = Duration::from_millis(200);
const JITTER: f64 = 0.1;
/// How often a leader writes to the fenced log.
const WRITE_PAUSE: Duration = Duration::from_millis(5);
/// The bound on every wait for something the servers or the managers do on their own time.
const BOUND: Duration = Duration::from_secs(20);

fn private_server() -> TempPostgres {
    TempPostgres::start().unwrap_or_else(|err| {
        panic!(
            "the HA tests start their own primary, standby and crashing server from the \
             PostgreSQL server binaries (initdb, pg_ctl, postgres, pg_basebackup; e.g. \
             `apt-get install postgresql`, or point PGLOCK_PG_BIN at them): {err}"
        )
    })
}

/// A pool straight to `server`, for looking at it from outside the code under test.
async fn admin(server: &TempPostgres) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&server.url())
        .await
        .expect("connect to the server")
}

fn fenced(pool: PgPool, holder: &str) -> PostgresLockManager {
    PostgresLockManager::builder(pool)
        .holder_id(holder)
        .fencing(FencingTable::default())
        .probe_interval(PROBE)
        .probe_grace(GRACE)
        .build()
}

/// Waits until `probe` yields a value, polling every 10 ms for up to `BOUND`. For states that a
/// server or a manager reaches on its own time, which the test can observe but not be told of.
async fn poll<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + BOUND;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn scalar<T>(db: &PgPool, sql: &'static str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    sqlx::query_scalar(sql)
        .fetch_one(db)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
}

/// The last token minted for `key` as `db` sees it (a standby sees what it has replayed).
async fn stored_token(db: &PgPool, key: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT token FROM pglock_fencing_tokens WHERE lock_id = $1")
        .bind(lock_id(key))
        .fetch_optional(db)
        .await
        .expect("read the fencing table")
}

/// Whether `db` shows a granted advisory lock on `key`.
async fn granted_on(db: &PgPool, key: &str) -> bool {
    let (classid, objid) = pglock::split_lock_id(lock_id(key));
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid)",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .fetch_one(db)
    .await
    .expect("read pg_locks")
}

// ---------------------------------------------------------------------------------------------
// An endpoint that can move: what a virtual IP, a DNS name or a proxy in front of "the primary"
// is to the applications.
// ---------------------------------------------------------------------------------------------

/// Forwards each new TCP connection to whichever local port it points at when the connection
/// arrives. Moving it leaves established connections where they are; a connection whose
/// server is down is closed at once.
struct Endpoint {
    addr: SocketAddr,
    target: Arc<AtomicU16>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Endpoint {
    async fn to(port: u16) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the endpoint");
        let addr = listener.local_addr().expect("endpoint address");
        let target = Arc::new(AtomicU16::new(port));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (target, links) = (Arc::clone(&target), Arc::clone(&links));
            async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let port = target.load(Ordering::SeqCst);
                    let link = tokio::spawn(async move {
                        let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)).await else {
                            return; // dropping the client closes it
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    });
                    let mut links = links.lock().expect("links");
                    links.retain(|link| !link.is_finished());
                    links.push(link);
                }
            }
        });
        Endpoint {
            addr,
            target,
            links,
            accept,
        }
    }

    /// New connections go to `port` from now on.
    fn point_to(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    fn options(&self, app: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .host("127.0.0.1")
            .port(self.addr.port())
            .username("postgres")
            .database("postgres")
            .application_name(app)
    }

    /// A pool through the endpoint that opens its connections only when asked for them.
    fn pool(&self, app: &str) -> PgPool {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_lazy_with(self.options(app))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.accept.abort();
        for link in self.links.lock().expect("links").drain(..) {
            link.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A fenced log outside the lock server, as the resource a leader writes to would be (an object
// store, another database): it survives the failover, and accepts a write only if its token is
// not below the highest it has accepted.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Entry {
    token: i64,
    candidate: String,
    accepted: bool,
    at: Instant,
}

#[derive(Default)]
struct FencedLog {
    state: Mutex<(i64, Vec<Entry>)>,
}

impl FencedLog {
    fn write(&self, token: i64, candidate: &str) -> bool {
        let mut state = self.state.lock().expect("log");
        let accepted = token >= state.0;
        if accepted {
            state.0 = token;
        }
        state.1.push(Entry {
            token,
            candidate: candidate.to_owned(),
            accepted,
            at: Instant::now(),
        });
        accepted
    }

    fn entries(&self) -> Vec<Entry> {
        self.state.lock().expect("log").1.clone()
    }

    /// The first accepted write under a token above `above`, once its term has written five
    /// times (a leader that has settled in).
    fn settled_leader_above(&self, above: i64) -> Option<Entry> {
        let entries = self.entries();
        let mut counts: HashMap<i64, usize> = HashMap::new();
        for entry in entries.iter().filter(|e| e.accepted && e.token > above) {
            *counts.entry(entry.token).or_default() += 1;
        }
        let (&token, _) = counts.iter().filter(|(_, n)| **n >= 5).max()?;
        entries.into_iter().find(|e| e.accepted && e.token == token)
    }
}

async fn write_while_leading(log: Arc<FencedLog>, info: LockInfo) -> Infallible {
    let token = info.fencing_token.expect("fencing is on");
    let candidate = info.holder_id;
    loop {
        log.write(token, &candidate);
        tokio::time::sleep(WRITE_PAUSE).await;
    }
}

/// A term that ended with a loss: its token, why and when.
type Loss = (i64, LossCause, Instant);

/// One candidate's life: lead whenever elected, report every term lost.
async fn candidate_loop(
    election: Arc<LeaderElection>,
    log: Arc<FencedLog>,
    losses: mpsc::UnboundedSender<Loss>,
) {
    let me = election.holder_id().to_owned();
    loop {
        let mut term = None;
        let work = |info: LockInfo| {
            term = info.fencing_token;
            write_while_leading(Arc::clone(&log), info)
        };
        match election.run_as_leader(None, work).await {
            Ok(never) => match never {},
            Err(LeaderError::Lock(Error::LockLost { cause, .. })) => {
                let token = term.expect("a term that was lost had started");
                let _ = losses.send((token, cause, Instant::now()));
            }
            Err(LeaderError::Stopped { .. }) => return,
            Err(other) => panic!("unexpected end of a term of {me}: {other}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The pair's story.
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused_and_a_failover_keeps_tokens_growing() {
    let primary = private_server();
    let started = Instant::now();
    let standby = primary.start_standby().unwrap_or_else(|err| {
        panic!("could not start a streaming standby of the test's primary: {err}")
    });
    println!("ha: standby started in {:?}", started.elapsed());
    let (on_primary, on_standby) = (admin(&primary).await, admin(&standby).await);
    assert!(!scalar::<bool>(&on_primary, "SELECT pg_is_in_recovery()").await);
    assert!(scalar::<bool>(&on_standby, "SELECT pg_is_in_recovery()").await);
    poll("the standby streams from the primary", || async {
        (scalar::<i64>(&on_primary, "SELECT count(*) FROM pg_stat_replication").await == 1)
            .then_some(())
    })
    .await;

    locks_on_the_standby_are_refused(&standby).await;
    a_standby_allowed_on_purpose_grants_what_the_primary_holds(&primary, &standby).await;
    an_endpoint_that_moves_to_the_standby_gets_no_lock_there(&primary, &standby).await;
    failover(primary, standby, on_primary, on_standby).await;
}

/// A manager pointed at the standby (a reader endpoint, or a former primary that came back as
/// a standby) is refused with a typed error that says what to do, for every kind of
/// acquisition.
async fn locks_on_the_standby_are_refused(standby: &TempPostgres) {
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&standby.url())
        .await
        .expect("connect to the standby");
    let plain = PostgresLockManager::builder(pool.clone()).build();
    let with_fencing = fenced(pool, "on-the-standby");
    let key = key("standby-refused");
    for locks in [&plain, &with_fencing] {
        let outcomes = [
            locks
                .acquire(&key, Some(Duration::from_secs(2)))
                .await
                .err(),
            timeout(BOUND, locks.acquire(&key, None))
                .await
                .expect("an answer")
                .err(),
            locks
                .acquire_shared(&key, Some(Duration::from_secs(2)))
                .await
                .err(),
            locks.try_acquire(&key).await.err(),
            locks.try_acquire_shared(&key).await.err(),
        ];
        for outcome in outcomes {
            match outcome {
                Some(err @ Error::Standby { .. }) => {
                    assert_eq!(err.key(), key.as_str());
                    let message = err.to_string();
                    assert!(
                        message.contains("standby") && message.contains("primary"),
                        "{message}"
                    );
                }
                other => panic!("a lock on the standby must be refused, got {other:?}"),
            }
        }
        assert_eq!(locks.held_lock_count(), 0);
    }
    println!(
        "ha: refused on the standby: {}",
        plain
            .acquire(&key, Some(Duration::from_secs(2)))
            .await
            .expect_err("refused")
    );
}

/// With `allow_standby(true)` the standby grants a key that a holder on the primary holds:
/// two holders, neither told. That is why the default refuses. The manager does not call its
/// own lock lost merely because it sits on a standby it was allowed to use.
async fn a_standby_allowed_on_purpose_grants_what_the_primary_holds(
    primary: &TempPostgres,
    standby: &TempPostgres,
) {
    let (on_primary, on_standby) = (admin(primary).await, admin(standby).await);
    let key = key("standby-allowed");
    let on_the_primary = PostgresLockManager::builder(admin(primary).await).build();
    let held = on_the_primary
        .acquire(&key, Some(Duration::from_secs(5)))
        .await
        .expect("the primary grants the key");

    let app = common::app_name("allowed");
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect_with(
            standby
                .url()
                .parse::<PgConnectOptions>()
                .expect("url")
                .application_name(&app),
        )
        .await
        .expect("connect to the standby");
    let allowed = PostgresLockManager::builder(pool)
        .allow_standby(true)
        .probe_interval(PROBE)
        .probe_grace(GRACE)
        .build();
    let also_held = allowed
        .acquire(&key, Some(Duration::from_secs(5)))
        .await
        .expect("allowed, the standby grants the key too");
    assert!(granted_on(&on_primary, &key).await, "held on the primary");
    assert!(granted_on(&on_standby, &key).await, "and on the standby");

    // The standby's manager keeps its session heard, and so its lock: four heartbeats pass
    // (the time passing is what is tested) and the standby still holds it.
    tokio::time::sleep(PROBE * 4).await;
    assert!(
        granted_on(&on_standby, &key).await,
        "still held on the standby"
    );
    assert!(
        !also_held.loss_signal().is_lost(),
        "a lock on a standby the manager may use is not lost: {:?}",
        also_held.loss_signal().cause()
    );
    assert!(!held.loss_signal().is_lost());
    // Fencing needs the primary: a standby cannot store a token.
    let allowed_fenced = PostgresLockManager::builder(admin(standby).await)
        .allow_standby(true)
        .fencing(FencingTable::default())
        .build();
    let refused = allowed_fenced
        .acquire(&common::key("standby-fenced"), Some(Duration::from_secs(2)))
        .await
        .expect_err("no token on a standby");
    assert!(refused.to_string().contains("read-only"), "{refused}");
    also_held.release().await.expect("release on the standby");
    held.release().await.expect("release on the primary");
}

/// Behind an endpoint that moves to the standby and back (a DNS name or a proxy caught in the
/// middle of a failover), a manager gets no lock on the standby, on any path, and keeps no
/// connection to it: once the endpoint points at the primary again, the next acquisition works.
async fn an_endpoint_that_moves_to_the_standby_gets_no_lock_there(
    primary: &TempPostgres,
    standby: &TempPostgres,
) {
    let endpoint = Endpoint::to(primary.port()).await;
    let (held, elsewhere) = (key("moving-held"), key("moving-other"));
    // Someone on the primary holds `held`.
    let holder = PostgresLockManager::builder(admin(primary).await).build();
    let holder_guard = holder
        .acquire(&held, Some(Duration::from_secs(5)))
        .await
        .expect("acquire on the primary");
    // A manager with a lock session on the primary, which the move leaves there, and wait
    // sessions kept for a long while.
    let moving = PostgresLockManager::builder(endpoint.pool("moving"))
        .idle_sessions(usize::MAX, Duration::from_secs(60))
        .probe_interval(PROBE)
        .probe_grace(GRACE)
        .build();
    let on_primary = moving
        .acquire(&elsewhere, Some(Duration::from_secs(5)))
        .await
        .expect("acquire through the endpoint, on the primary");

    let old_primary = admin(primary).await;

    endpoint.point_to(standby.port());
    // A contended key: the try on the primary's session fails, the wait opens a session
    // through the endpoint, on the standby. Refused, twice: the refused session is not kept
    // for the next wait.
    for attempt in 1..=2 {
        match moving.acquire(&held, Some(Duration::from_secs(2))).await {
            Err(Error::Standby { .. }) => {}
            Ok(guard) => panic!(
                "attempt {attempt}: granted on the standby while the primary's holder has it \
                 (token {:?})",
                guard.info().fencing_token
            ),
            Err(other) => panic!("attempt {attempt}: expected Error::Standby, got {other}"),
        }
    }
    // The lock session on the primary stays there, kept heard by its pings: the lock it holds
    // is still held, on a server that is still the primary, and nothing reports it lost while
    // four heartbeats pass (the time passing is what is tested).
    tokio::time::sleep(PROBE * 4).await;
    assert_eq!(on_primary.loss_signal().cause(), None);
    assert!(granted_on(&old_primary, &elsewhere).await);
    // A manager whose first lock session lands on the standby is refused, and the pool keeps
    // no connection to the standby.
    let newcomer_pool = endpoint.pool("newcomer");
    let newcomer = PostgresLockManager::builder(newcomer_pool.clone()).build();
    let fresh = key("moving-fresh");
    assert!(matches!(
        newcomer.acquire(&fresh, Some(Duration::from_secs(2))).await,
        Err(Error::Standby { .. })
    ));
    poll("the refused connection has been dealt with", || async {
        (newcomer_pool.num_idle() == newcomer_pool.size() as usize).then_some(())
    })
    .await;

    endpoint.point_to(primary.port());
    let guard = newcomer
        .acquire(&fresh, Some(Duration::from_secs(2)))
        .await
        .expect("back on the primary, the first acquisition works");
    guard.release().await.expect("release");
    holder_guard.release().await.expect("release");
    let guard = moving
        .acquire(&held, Some(Duration::from_secs(2)))
        .await
        .expect("back on the primary, the contended key is granted");
    guard.release().await.expect("release");
    on_primary
        .release()
        .await
        .expect("still held on the primary, so released");
}

/// Replication cut, tokens minted that the standby never receives, the primary killed, the
/// standby promoted.
async fn failover(
    primary: TempPostgres,
    standby: TempPostgres,
    on_primary: PgPool,
    on_standby: PgPool,
) {
    let endpoint = Endpoint::to(primary.port()).await;
    let minter = fenced(endpoint.pool("minter"), "minter");
    let (holder_a, holder_b) = (
        fenced(endpoint.pool("holder-a"), "holder-a"),
        fenced(endpoint.pool("holder-b"), "holder-b"),
    );
    let (token_key, a1, a2, b1) = (key("ha-tokens"), key("ha-a1"), key("ha-a2"), key("ha-b1"));
    // Every token handed out before the failover, by key.
    let mut before: HashMap<String, Vec<i64>> = HashMap::new();
    let note = |before: &mut HashMap<String, Vec<i64>>, key: &str, guard: &LockGuard| {
        let token = guard.info().fencing_token.expect("fencing is on");
        before.entry(key.to_owned()).or_default().push(token);
    };

    // Holders: two locks on a lock session (one shared), one on a wait session.
    let wait = Some(Duration::from_secs(10));
    let guard_a1 = holder_a.acquire(&a1, wait).await.expect("acquire");
    let guard_a2 = holder_a.acquire_shared(&a2, wait).await.expect("acquire");
    let first_holder = holder_a.acquire(&b1, wait).await.expect("acquire");
    note(&mut before, &a1, &guard_a1);
    note(&mut before, &a2, &guard_a2);
    note(&mut before, &b1, &first_holder);
    let waiter = tokio::spawn({
        let (holder_b, b1) = (holder_b.clone(), b1.clone());
        async move { holder_b.acquire(&b1, Some(Duration::from_secs(10))).await }
    });
    poll("holder B waits on the primary", || async {
        common::lock_rows(&on_primary, lock_id(&b1))
            .await
            .iter()
            .any(|row| !row.granted)
            .then_some(())
    })
    .await;
    first_holder.release().await.expect("release");
    let guard_b1 = timeout(BOUND, waiter)
        .await
        .expect("B's wait ends")
        .expect("join")
        .expect("B gets the lock after A");
    note(&mut before, &b1, &guard_b1);

    // Three candidates for leadership, each with a manager of its own behind the endpoint.
    let log = Arc::new(FencedLog::default());
    let (losses_tx, mut losses) = mpsc::unbounded_channel();
    let name = format!("ha-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let election_key = format!("leader:{name}");
    let mut candidates = Vec::new();
    for n in 1..=3 {
        let holder = format!("candidate-{n}");
        let locks = fenced(endpoint.pool(&holder), &holder);
        let election = Arc::new(
            LeaderElection::builder(Arc::new(locks), &name)
                .retry_interval(RETRY)
                .jitter(JITTER)
                .build()
                .expect("within the runtime"),
        );
        let task = tokio::spawn(candidate_loop(
            Arc::clone(&election),
            Arc::clone(&log),
            losses_tx.clone(),
        ));
        candidates.push((election, task));
    }
    drop(losses_tx);
    let first_leader = poll("a first leader writes", || async {
        log.settled_leader_above(0)
    })
    .await;

    // Tokens the standby receives.
    for _ in 0..5 {
        let guard = minter.acquire(&token_key, wait).await.expect("acquire");
        note(&mut before, &token_key, &guard);
        guard.release().await.expect("release");
    }
    let lsn: String = scalar(&on_primary, "SELECT pg_current_wal_lsn()::text").await;
    poll("the standby has replayed everything so far", || async {
        sqlx::query_scalar::<_, bool>("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn")
            .bind(&lsn)
            .fetch_one(&on_standby)
            .await
            .expect("replay position")
            .then_some(())
    })
    .await;
    let replicated = *before[&token_key].last().expect("tokens");
    assert_eq!(
        stored_token(&on_standby, &token_key).await,
        Some(replicated)
    );

    // Replication cut.
    standby
        .configure("primary_conninfo", "")
        .expect("cut replication");
    poll("the standby stops receiving WAL", || async {
        (scalar::<i64>(&on_standby, "SELECT count(*) FROM pg_stat_wal_receiver").await == 0)
            .then_some(())
    })
    .await;

    // Tokens the standby never receives: five acquisitions, and two more leadership terms
    // (the leader's session terminated each time).
    for _ in 0..5 {
        let guard = minter.acquire(&token_key, wait).await.expect("acquire");
        note(&mut before, &token_key, &guard);
        guard.release().await.expect("release");
    }
    let mut leader = first_leader;
    for _ in 0..2 {
        let pid: i32 = poll("the leader's lock shows on the primary", || async {
            common::lock_rows(&on_primary, lock_id(&election_key))
                .await
                .into_iter()
                .find(|row| row.granted)
                .map(|row| row.pid)
        })
        .await;
        let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .fetch_one(&on_primary)
            .await
            .expect("terminate the leader's session");
        assert!(terminated);
        let next = poll("the next leader writes", || async {
            log.settled_leader_above(leader.token)
        })
        .await;
        leader = next;
    }
    let unreplicated = *before[&token_key].last().expect("tokens");
    assert_eq!(
        stored_token(&on_standby, &token_key).await,
        Some(replicated),
        "the standby never received the tokens up to {unreplicated}"
    );
    let standby_election = stored_token(&on_standby, &election_key)
        .await
        .expect("the first term's token was replicated");
    assert!(
        standby_election < leader.token,
        "the standby lacks the last terms: {standby_election} < {}",
        leader.token
    );
    let election_tokens: Vec<i64> = {
        let mut tokens: Vec<i64> = log.entries().iter().map(|e| e.token).collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens
    };
    before
        .entry(election_key.clone())
        .or_default()
        .extend(&election_tokens);
    let highest_before = before.values().flatten().copied().max().expect("tokens");
    println!(
        "ha: before the failover: tokens of {token_key} {:?} ({} replicated), election terms \
         {election_tokens:?} (the standby has {standby_election})",
        before[&token_key], replicated
    );

    // The primary dies (at some point during the call, which returns once it is down).
    let killed = Instant::now();
    primary.stop_immediately().expect("kill the primary");
    println!(
        "ha: the immediate stop returned after {:?}",
        killed.elapsed()
    );
    drop(on_primary);

    // Its holders are told, within interval + grace.
    let told = |guard: &LockGuard| {
        let signal = guard.loss_signal().clone();
        async move {
            let cause = timeout(BOUND, signal.lost())
                .await
                .expect("a holder is told");
            (cause, Instant::now())
        }
    };
    let leader_told = async {
        loop {
            // Earlier terms' losses (the sessions terminated above) come first.
            let (token, cause, at) = timeout(BOUND, losses.recv())
                .await
                .expect("the leader is told")
                .expect("a loss");
            if token == leader.token {
                break (cause, at);
            }
        }
    };
    let (a1_told, a2_told, b1_told, leader_told) = tokio::join!(
        told(&guard_a1),
        told(&guard_a2),
        told(&guard_b1),
        leader_told
    );
    let bound = PROBE + GRACE;
    let told = [a1_told, a2_told, b1_told, leader_told];
    let detections: Vec<Duration> = told.iter().map(|(_, at)| *at - killed).collect();
    println!(
        "ha: primary killed: A's two locks, B's lock and the leader's term reported lost after \
         {detections:?} ({:?}); probe interval + grace = {bound:?}",
        told.iter().map(|(cause, _)| cause).collect::<Vec<_>>()
    );
    for ((cause, _), detection) in told.iter().zip(&detections) {
        assert!(
            matches!(cause, LossCause::Unverifiable | LossCause::NotOnServer),
            "{cause:?}"
        );
        // Declared at the first probe at least interval + grace after the last successful one,
        // which came before the kill; the grace is a whole number of intervals, so that is at
        // most interval + grace after the kill. Allow 100 ms for a loaded 2-core machine.
        assert!(
            *detection <= bound + Duration::from_millis(100),
            "told after {detection:?}, beyond interval + grace ({bound:?}) and 100 ms"
        );
    }

    // The standby takes over; the endpoint follows it.
    let promoting = Instant::now();
    standby.promote().expect("promote the standby");
    let promotion = promoting.elapsed();
    endpoint.point_to(standby.port());
    assert!(!scalar::<bool>(&on_standby, "SELECT pg_is_in_recovery()").await);
    println!(
        "ha: promotion took {promotion:?}; the endpoint points at the new primary {:?} after \
         the kill",
        killed.elapsed()
    );

    // Every token now exceeds every token handed out before, unreplicated ones included.
    let guard = minter
        .acquire(&token_key, wait)
        .await
        .expect("acquire on the promoted server");
    let token = guard.info().fencing_token.expect("fencing is on");
    println!(
        "ha: first token of {token_key} after the failover: {token} (before: up to \
         {unreplicated}); first acquisition {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        token > highest_before,
        "token {token} after the failover, not above the {unreplicated} handed out before"
    );
    guard.release().await.expect("release");
    // The holders take their keys again on the new primary.
    let again = [
        (&a1, holder_a.acquire(&a1, wait).await),
        (&a2, holder_a.acquire_shared(&a2, wait).await),
        (&b1, holder_b.acquire(&b1, wait).await),
    ];
    for (key, acquired) in again {
        let guard = acquired.unwrap_or_else(|err| panic!("{key} on the new primary: {err}"));
        let token = guard.info().fencing_token.expect("fencing is on");
        assert!(
            before[key.as_str()].iter().all(|old| token > *old),
            "{key}: token {token} after {:?}",
            before[key.as_str()]
        );
        guard.release().await.expect("release");
    }

    // A new leader writes: its token is above the last term's, which the promoted server
    // never saw, so the fenced log accepts it.
    let successor = poll("a leader writes after the failover", || async {
        log.settled_leader_above(leader.token)
    })
    .await;
    assert!(successor.token > highest_before, "{}", successor.token);
    println!(
        "ha: new leader {} (token {}) wrote first {:?} after the kill",
        successor.candidate,
        successor.token,
        successor.at - killed
    );
    for (election, _) in &candidates {
        timeout(BOUND, election.resign())
            .await
            .expect("the campaign stops")
            .expect("resign");
    }
    for (_, task) in candidates {
        timeout(BOUND, task)
            .await
            .expect("the candidate stops")
            .expect("join");
    }

    // The fenced log never went back, and no token had two owners.
    let entries = log.entries();
    let mut owners: HashMap<i64, &str> = HashMap::new();
    let mut highest = 0;
    for (seq, entry) in entries.iter().enumerate() {
        let owner = owners.entry(entry.token).or_insert(&entry.candidate);
        assert_eq!(
            *owner, entry.candidate,
            "token {} has two owners (entry {seq})",
            entry.token
        );
        if entry.accepted {
            assert!(entry.token >= highest, "entry {seq} went back");
            highest = entry.token;
        } else {
            assert!(entry.token < highest, "entry {seq} refused without cause");
        }
    }
    // The deposed leader may write on until it is told (its resource does not know of the
    // failover either); once the successor has written, only newer terms are accepted.
    let blind = entries
        .iter()
        .filter(|e| e.accepted && e.at > killed && e.token == leader.token)
        .count();
    assert!(
        entries
            .iter()
            .filter(|e| e.accepted && e.at >= successor.at)
            .all(|e| e.token > highest_before),
        "after the successor's first write, only terms above every earlier token wrote"
    );
    let terms: Vec<(i64, &str)> = {
        let mut terms: Vec<(i64, &str)> = owners.into_iter().collect();
        terms.sort();
        terms
    };
    println!(
        "ha: fenced log: {} writes, {} refused, {blind} by the deposed leader after the kill \
         (before it was told); terms {terms:?}",
        entries.len(),
        entries.iter().filter(|e| !e.accepted).count()
    );
}

// ---------------------------------------------------------------------------------------------
// A crash with asynchronous commits.
// ---------------------------------------------------------------------------------------------

/// Tokens minted right before a crash survive it, even on a server and in sessions that commit
/// asynchronously (`synchronous_commit = off`), where the crash demonstrably loses commits: no
/// token is handed out twice.
#[tokio::test]
async fn a_crash_with_asynchronous_commits_hands_out_no_token_twice() {
    let server = private_server();
    // Commits are acknowledged before their WAL is written, and the WAL writer writes it out
    // only every 10 s.
    server
        .configure("synchronous_commit", "off")
        .expect("configure");
    server
        .configure("wal_writer_delay", "10s")
        .expect("configure");
    let db = admin(&server).await;
    // The sessions of the lock managers commit asynchronously too.
    let asynchronous = server
        .url()
        .parse::<PgConnectOptions>()
        .expect("url")
        .options([("synchronous_commit", "off")]);
    let connect = || {
        PgPoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(asynchronous.clone())
    };
    let setup = fenced(connect().await.expect("connect"), "setup");
    setup.ensure_fencing_table().await.expect("fencing table");
    sqlx::query("CREATE TABLE crash_witness (cycle int PRIMARY KEY)")
        .execute(&db)
        .await
        .expect("create");
    // What exists so far is on disk; what follows is at the mercy of the crash.
    sqlx::query("CHECKPOINT")
        .execute(&db)
        .await
        .expect("checkpoint");

    let key = key("crash");
    let wait = Some(Duration::from_secs(10));
    let mut handed_out: Vec<i64> = Vec::new();
    let mut witnesses_lost = 0;
    // A crash loses the asynchronous commits of the last WAL writer round (up to 10 s). One
    // cycle normally shows it; a crash that fell just after the writer's round shows nothing,
    // so the cycle is repeated, at most three times.
    for cycle in 0..3 {
        let pool = connect().await.expect("connect");
        let setting: String = scalar(&pool, "SHOW synchronous_commit").await;
        assert_eq!(setting, "off", "the lock sessions commit asynchronously");
        let locks = fenced(pool.clone(), "crash-a");
        let other = fenced(connect().await.expect("connect"), "crash-b");
        // Tokens minted on a lock session...
        for _ in 0..20 {
            let guard = locks.acquire(&key, wait).await.expect("acquire");
            handed_out.push(guard.info().fencing_token.expect("fencing is on"));
            guard.release().await.expect("release");
        }
        // ... and by a wait in the server's queue.
        let held = other.acquire(&key, wait).await.expect("acquire");
        handed_out.push(held.info().fencing_token.expect("fencing is on"));
        let waiting = tokio::spawn({
            let (locks, key) = (locks.clone(), key.clone());
            async move { locks.acquire(&key, Some(Duration::from_secs(10))).await }
        });
        poll("the waiter is queued", || async {
            common::lock_rows(&db, lock_id(&key))
                .await
                .iter()
                .any(|row| !row.granted)
                .then_some(())
        })
        .await;
        held.release().await.expect("release");
        let waited = timeout(BOUND, waiting)
            .await
            .expect("the wait ends")
            .expect("join")
            .expect("granted");
        handed_out.push(waited.info().fencing_token.expect("fencing is on"));
        // The witness: an asynchronous commit after the last token.
        sqlx::query("INSERT INTO crash_witness VALUES ($1)")
            .bind(cycle)
            .execute(&db)
            .await
            .expect("insert");

        server.stop_immediately().expect("crash the server");
        drop((waited, locks, other, pool));
        server.start_again().expect("restart after the crash");

        let witnessed: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM crash_witness WHERE cycle = $1)")
                .bind(cycle)
                .fetch_one(&db)
                .await
                .expect("read the witness");
        let after = fenced(connect().await.expect("connect"), "crash-c");
        let guard = after
            .acquire(&key, wait)
            .await
            .expect("acquire after the restart");
        let token = guard.info().fencing_token.expect("fencing is on");
        let highest = handed_out.iter().copied().max().expect("tokens");
        println!(
            "ha: crash {}: {} tokens handed out, the highest {highest}; after the restart \
             {token}; the asynchronous commit before the crash {}",
            cycle + 1,
            handed_out.len(),
            if witnessed { "survived" } else { "was lost" }
        );
        assert!(
            token > highest,
            "token {token} after the crash, but {highest} had been handed out"
        );
        handed_out.push(token);
        guard.release().await.expect("release");
        if !witnessed {
            witnesses_lost += 1;
            break;
        }
    }
    let mut distinct = handed_out.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        handed_out.len(),
        "a token was handed out twice"
    );
    assert!(
        witnesses_lost > 0,
        "no crash lost an asynchronous commit, so this test showed nothing"
    );
}
