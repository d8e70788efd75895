//! Leader election: one leader at a time, leader work cancelled when its lock is lost, graceful
//! resignation, one lock held per term however long it lasts, failover across processes with
//! fenced writes, and cancellation safety of the election's own API.

mod common;

use common::hooked::BuildHooked;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::clock::now_us;
use common::{app_name, lock_rows, observer, pool_named};
use pglock::leader::Error as LeaderError;
use pglock::{
    AcquireOptions, Attempt, Error, FencingTable, InMemoryLockManager, InMemoryLockServer,
    LeaderElection, Leadership, LockInfo, LockKey, LockManager, LossCause, PostgresLockManager,
    lock_id,
};
use pglock_testing::{Stage, pause_at};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

// ---------------------------------------------------------------------------------------------
// In-memory candidates, on a paused clock: every duration below is exact virtual time.
// ---------------------------------------------------------------------------------------------

const RETRY: Duration = Duration::from_secs(1);
const JITTER: f64 = 0.1;

/// How long a test waits for a signal (leadership, a term's end, a change of state) before it
/// fails instead of hanging; on a paused clock, in virtual time.
const BOUND: Duration = Duration::from_secs(60);

/// Awaits `signal`, failing the test if it has not come within `BOUND`.
async fn within<T>(what: &str, signal: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, signal)
        .await
        .unwrap_or_else(|_| panic!("waited {BOUND:?} for {what}"))
}

/// The longest a follower waits between two attempts.
fn longest_wait() -> Duration {
    RETRY.mul_f64(1.0 + JITTER)
}

struct Candidate {
    locks: InMemoryLockManager,
    election: Arc<LeaderElection>,
}

fn candidate(server: &InMemoryLockServer, id: &str, name: &str) -> Candidate {
    let locks = InMemoryLockManager::builder()
        .server(server)
        .holder_id(id)
        .build();
    let election = LeaderElection::builder(Arc::new(locks.clone()), name)
        .retry_interval(RETRY)
        .jitter(JITTER)
        .build()
        .expect("within the runtime");
    Candidate {
        locks,
        election: Arc::new(election),
    }
}

/// Waits until one of `candidates` leads and returns its index and term.
async fn first_leader(candidates: &[Candidate]) -> (usize, LockInfo) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let waits: Vec<_> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (election, tx) = (Arc::clone(&c.election), tx.clone());
            tokio::spawn(async move {
                if let Ok(info) = election.wait_for_leadership(None).await {
                    let _ = tx.send((i, info));
                }
            })
        })
        .collect();
    let first = within("a leader", rx.recv()).await.expect("someone leads");
    for wait in waits {
        wait.abort();
    }
    first
}

fn leaders(candidates: &[Candidate]) -> Vec<usize> {
    (0..candidates.len())
        .filter(|&i| candidates[i].election.is_leader())
        .collect()
}

/// Leader work that reports its start and then runs until it is cancelled, recording whether
/// its candidate still held the lock at the moment it was dropped.
fn endless_work(
    locks: InMemoryLockManager,
    started: oneshot::Sender<LockInfo>,
    dropped_holding: Arc<Mutex<Option<usize>>>,
) -> impl FnOnce(LockInfo) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    struct OnDrop(InMemoryLockManager, Arc<Mutex<Option<usize>>>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            *self.1.lock().unwrap() = Some(self.0.held_lock_count());
        }
    }
    move |info| {
        Box::pin(async move {
            let _on_drop = OnDrop(locks, dropped_holding);
            started.send(info).expect("the test waits for the start");
            std::future::pending::<()>().await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn exactly_one_candidate_leads_and_keeps_leading() {
    let server = InMemoryLockServer::new();
    let candidates = [
        candidate(&server, "a", "jobs"),
        candidate(&server, "b", "jobs"),
        candidate(&server, "c", "jobs"),
    ];
    let (leader, info) = first_leader(&candidates).await;
    let id = ["a", "b", "c"][leader];
    assert_eq!(info.key, "leader:jobs");
    assert_eq!(info.lock_id, lock_id("leader:jobs"));
    assert_eq!(&*info.holder_id, id);
    assert_eq!(candidates[leader].election.holder_id(), id);
    assert_eq!(info.fencing_token, Some(1));
    assert_eq!(
        *candidates[leader].election.subscribe().borrow(),
        Leadership::Leader(info.clone())
    );
    // Twenty retry intervals: the followers try twenty times each, and nothing changes.
    for _ in 0..20 {
        tokio::time::sleep(RETRY).await;
        assert_eq!(leaders(&candidates), [leader]);
        assert_eq!(
            candidates[leader].election.leader_info(),
            Some(info.clone())
        );
        for (i, c) in candidates.iter().enumerate() {
            let expected = usize::from(i == leader);
            assert_eq!(c.locks.held_lock_count(), expected, "candidate {i}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_leader_steps_down_at_once_and_its_work_is_cancelled() {
    let server = InMemoryLockServer::new();
    let candidates = [
        candidate(&server, "a", "loss"),
        candidate(&server, "b", "loss"),
    ];
    let (leader, info) = first_leader(&candidates).await;
    let follower = 1 - leader;

    let (started_tx, started_rx) = oneshot::channel();
    let dropped_holding = Arc::new(Mutex::new(None));
    let work = tokio::spawn({
        let election = Arc::clone(&candidates[leader].election);
        let work = endless_work(
            candidates[leader].locks.clone(),
            started_tx,
            Arc::clone(&dropped_holding),
        );
        async move { election.run_as_leader(None, work).await }
    });
    assert_eq!(
        within("the work starts", started_rx)
            .await
            .expect("the work started"),
        info
    );
    let mut state = candidates[leader].election.subscribe();

    // Lose the lock half-way between the follower's attempts: its next one (at most
    // `longest_wait` after its last) then comes before the deposed leader's first retry (a full
    // interval after the loss), so the follower is the one to take over.
    tokio::time::sleep(RETRY / 2).await;
    let lost_at = Instant::now();
    assert!(candidates[leader].locks.simulate_loss("leader:loss").await);
    match within("the work ends", work).await.expect("join") {
        Err(LeaderError::Lock(Error::LockLost { key, cause })) => {
            assert_eq!(key, "leader:loss");
            assert_eq!(cause, LossCause::Simulated);
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
    // The work was dropped after the loss (the registry had already forgotten the lock).
    assert_eq!(*dropped_holding.lock().unwrap(), Some(0));
    within("the step down", state.wait_for(|l| !l.is_leader()))
        .await
        .expect("still campaigning");
    assert_eq!(
        lost_at.elapsed(),
        Duration::ZERO,
        "the leader stepped down at once"
    );

    let next = within(
        "leadership",
        candidates[follower].election.wait_for_leadership(None),
    )
    .await
    .expect("the follower takes over");
    let failover = lost_at.elapsed();
    assert!(
        failover <= longest_wait(),
        "took over after {failover:?}, more than one retry interval with jitter"
    );
    assert_eq!(&*next.holder_id, ["a", "b"][follower]);
    assert_eq!(next.fencing_token, Some(2));
    assert!(!candidates[leader].election.is_leader());
    // The deposed candidate campaigns again, and loses while the other leads.
    tokio::time::sleep(RETRY * 5).await;
    assert_eq!(leaders(&candidates), [follower]);
}

#[tokio::test(start_paused = true)]
async fn resign_cancels_the_work_then_releases_and_hands_over() {
    let server = InMemoryLockServer::new();
    let candidates = [
        candidate(&server, "a", "resign"),
        candidate(&server, "b", "resign"),
    ];
    let (leader, _) = first_leader(&candidates).await;
    let follower = 1 - leader;
    let (started_tx, started_rx) = oneshot::channel();
    let dropped_holding = Arc::new(Mutex::new(None));
    let work = tokio::spawn({
        let election = Arc::clone(&candidates[leader].election);
        let work = endless_work(
            candidates[leader].locks.clone(),
            started_tx,
            Arc::clone(&dropped_holding),
        );
        async move { election.run_as_leader(None, work).await }
    });
    within("the work starts", started_rx)
        .await
        .expect("the work started");
    let mut state = candidates[leader].election.subscribe();

    let resigned_at = Instant::now();
    assert!(
        within("the resignation", candidates[leader].election.resign())
            .await
            .expect("resign")
    );
    // Returned once the lock was released, and the work was dropped while it was still held.
    assert_eq!(candidates[leader].locks.held_lock_count(), 0);
    assert_eq!(*dropped_holding.lock().unwrap(), Some(1));
    assert!(matches!(
        within("the work ends", work).await.expect("join"),
        Err(LeaderError::Stopped { key }) if key == "leader:resign"
    ));
    assert_eq!(*state.borrow_and_update(), Leadership::Follower);
    assert!(
        within("a change of leadership", state.changed())
            .await
            .is_err(),
        "the campaign has ended"
    );

    let next = within(
        "leadership",
        candidates[follower].election.wait_for_leadership(None),
    )
    .await
    .expect("the follower takes over");
    assert!(resigned_at.elapsed() <= longest_wait());
    assert_eq!(next.fencing_token, Some(2));

    // A resigned candidate stays out.
    let resigned = &candidates[leader].election;
    assert!(
        !within("the resignation", resigned.resign())
            .await
            .expect("again"),
        "nothing left"
    );
    assert!(matches!(
        within("leadership", resigned.wait_for_leadership(None)).await,
        Err(LeaderError::Stopped { .. })
    ));
    assert!(matches!(
        resigned.run_as_leader(None, |_| async {}).await,
        Err(LeaderError::Stopped { .. })
    ));
    tokio::time::sleep(RETRY * 3).await;
    assert_eq!(leaders(&candidates), [follower]);
    assert_eq!(candidates[leader].locks.held_lock_count(), 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_handle_stops_the_campaign_and_releases() {
    let server = InMemoryLockServer::new();
    let a = InMemoryLockManager::builder()
        .server(&server)
        .holder_id("a")
        .build();
    let leader = LeaderElection::builder(Arc::new(a.clone()), "drop")
        .retry_interval(RETRY)
        .build()
        .expect("within the runtime");
    within("leadership", leader.wait_for_leadership(None))
        .await
        .expect("alone, it leads");
    let b = candidate(&server, "b", "drop");
    let mut state = leader.subscribe();
    tokio::time::sleep(RETRY * 3).await;
    assert!(!b.election.is_leader());

    let dropped_at = Instant::now();
    drop(leader);
    // The campaign ends (its channel closes) having released the lock.
    while within("a change of leadership", state.changed())
        .await
        .is_ok()
    {}
    assert_eq!(*state.borrow(), Leadership::Follower);
    assert_eq!(a.held_lock_count(), 0);
    let next = within("leadership", b.election.wait_for_leadership(None))
        .await
        .expect("takes over");
    assert!(dropped_at.elapsed() <= longest_wait());
    assert_eq!(&*next.holder_id, "b");
}

#[tokio::test(start_paused = true)]
async fn a_lock_released_through_the_manager_ends_the_term() {
    let server = InMemoryLockServer::new();
    let candidates = [
        candidate(&server, "a", "released"),
        candidate(&server, "b", "released"),
    ];

    // Released with every lock of the manager, then by key: each ends the term at once, with
    // the cause the release fired on the guard's loss signal.
    for (term, cause) in [(1, LossCause::ReleasedAll), (2, LossCause::Released)] {
        let (leader, info) = first_leader(&candidates).await;
        assert_eq!(info.fencing_token, Some(term));
        let (started_tx, started_rx) = oneshot::channel();
        let work = tokio::spawn({
            let election = Arc::clone(&candidates[leader].election);
            let work = endless_work(candidates[leader].locks.clone(), started_tx, Arc::default());
            async move { election.run_as_leader(None, work).await }
        });
        within("the work starts", started_rx)
            .await
            .expect("started");
        let mut state = candidates[leader].election.subscribe();
        let released_at = Instant::now();
        // Someone takes the lock away behind the election's back.
        let locks = &candidates[leader].locks;
        if cause == LossCause::ReleasedAll {
            assert_eq!(locks.release_all().await.expect("all"), 1);
        } else {
            locks.release("leader:released").await.expect("by key");
        }
        let err = within("the work ends", work)
            .await
            .expect("join")
            .expect_err("the term ended under the work");
        assert!(err.is_lost(), "{err:?}");
        match err {
            LeaderError::Lock(Error::LockLost { key, cause: why }) => {
                assert_eq!(key, "leader:released");
                assert_eq!(why, cause);
            }
            other => panic!("expected LockLost({cause:?}), got {other:?}"),
        }
        within("the step down", state.wait_for(|l| !l.is_leader()))
            .await
            .expect("still campaigning");
        // Told by the guard's loss signal: no polling, no time passes.
        assert_eq!(
            released_at.elapsed(),
            Duration::ZERO,
            "the term ended at once"
        );
    }
    let (_, next) = first_leader(&candidates).await;
    assert_eq!(next.fencing_token, Some(3));
    assert_eq!(leaders(&candidates).len(), 1);
}

/// A lock manager that fails its first `failures` acquisitions as if the database were down,
/// and counts every acquisition (`lock`) and every registry check (`holds`).
#[derive(Debug)]
struct Scripted {
    inner: Arc<dyn LockManager>,
    failures: AtomicUsize,
    acquires: watch::Sender<usize>,
    checks: watch::Sender<usize>,
}

impl Scripted {
    fn new(inner: Arc<dyn LockManager>, failures: usize) -> Arc<Scripted> {
        Arc::new(Scripted {
            inner,
            failures: AtomicUsize::new(failures),
            acquires: watch::channel(0).0,
            checks: watch::channel(0).0,
        })
    }

    fn acquires(&self) -> usize {
        *self.acquires.borrow()
    }
}

#[async_trait]
impl LockManager for Scripted {
    async fn acquire_key(&self, key: &LockKey, options: AcquireOptions) -> pglock::Result<Attempt> {
        self.acquires.send_modify(|n| *n += 1);
        let failing = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            return Err(Error::Connection {
                key: key.clone(),
                reason: "the database is down (scripted)".to_owned(),
                source: None,
            });
        }
        self.inner.acquire_key(key, options).await
    }

    async fn release_key(&self, key: &LockKey) -> pglock::Result<()> {
        self.inner.release_key(key).await
    }

    async fn release_all(&self) -> pglock::Result<usize> {
        self.inner.release_all().await
    }

    async fn is_held_key(&self, key: &LockKey) -> bool {
        self.checks.send_modify(|n| *n += 1);
        self.inner.is_held_key(key).await
    }

    async fn held_locks(&self) -> Vec<pglock::HeldLock> {
        self.inner.held_locks().await
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held_lock_count()
    }

    fn holder_id(&self) -> &str {
        self.inner.holder_id()
    }
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_are_retried_every_interval() {
    let locks = Scripted::new(Arc::new(InMemoryLockManager::new()), 3);
    let started = Instant::now();
    let election = LeaderElection::builder(locks.clone(), "flaky")
        .retry_interval(RETRY)
        .jitter(0.0)
        .build()
        .expect("within the runtime");
    let info = within("leadership", election.wait_for_leadership(None))
        .await
        .expect("leads");
    assert_eq!(started.elapsed(), RETRY * 3, "three failures, three waits");
    assert_eq!(locks.acquires(), 4);
    assert_eq!(&*info.holder_id, locks.holder_id());
    assert!(
        within("the resignation", election.resign())
            .await
            .expect("resign")
    );
}

#[tokio::test(start_paused = true)]
async fn jitter_spreads_attempts_within_its_bound() {
    let server = InMemoryLockServer::new();
    let holder = InMemoryLockManager::builder().server(&server).build();
    let _held = holder.acquire("leader:jitter", None).await.expect("held");
    let locks = Scripted::new(
        Arc::new(InMemoryLockManager::builder().server(&server).build()),
        0,
    );
    let _election = LeaderElection::builder(locks.clone(), "jitter")
        .retry_interval(RETRY)
        .jitter(0.5)
        .build()
        .expect("within the runtime");
    let mut attempts = locks.acquires.subscribe();
    let mut last = Instant::now();
    let mut waits = Vec::new();
    for n in 2..=40 {
        within("an attempt", attempts.wait_for(|&a| a >= n))
            .await
            .expect("campaigning");
        waits.push(last.elapsed());
        last = Instant::now();
    }
    let (min, max) = (waits.iter().min().unwrap(), waits.iter().max().unwrap());
    assert!(*min >= RETRY, "{waits:?}");
    assert!(*max <= RETRY.mul_f64(1.5), "{waits:?}");
    assert!(
        waits.iter().collect::<HashSet<_>>().len() > 30,
        "the waits vary: {waits:?}"
    );
}

/// Each term is one span, carrying the candidate's identity, the term's token and how it
/// ended; the release at the end of a graceful term nests in it.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn terms_are_traced_with_identity_token_and_outcome() {
    use opentelemetry::Value;
    use opentelemetry::trace::{Status, TracerProvider as _};
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
    use pglock::telemetry::{self, leader};
    use tracing_subscriber::layer::SubscriberExt;

    // Thread-local, on a current-thread runtime: the campaign's task runs on this thread.
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("pglock-tests"));
    // While a single dispatcher exists, `tracing` decides whether a callsite is wanted by
    // asking the default dispatcher of the thread that reaches it first, and caches the answer
    // for every thread. The other tests of this binary run on threads without a subscriber and
    // reach the same callsites, which would then be cached as unwanted. A second dispatcher
    // makes it ask every dispatcher instead.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    tracing::callsite::rebuild_interest_cache();

    let server = InMemoryLockServer::new();
    let a = candidate(&server, "traced-a", "traced");
    let first_term = within("leadership", a.election.wait_for_leadership(None))
        .await
        .expect("leads");
    let mut state = a.election.subscribe();
    assert!(a.locks.simulate_loss("leader:traced").await);
    within("the step down", state.wait_for(|l| !l.is_leader()))
        .await
        .expect("steps down");
    let second_term = within("leadership", a.election.wait_for_leadership(None))
        .await
        .expect("leads again");
    assert_eq!(
        (first_term.fencing_token, second_term.fencing_token),
        (Some(1), Some(2))
    );
    assert!(
        within("the resignation", a.election.resign())
            .await
            .expect("resign")
    );
    // A third term, ended by dropping the handle.
    let b = candidate(&server, "traced-b", "traced");
    within("leadership", b.election.wait_for_leadership(None))
        .await
        .expect("leads");
    let mut state = b.election.subscribe();
    drop(b.election);
    while within("a change of leadership", state.changed())
        .await
        .is_ok()
    {}
    let before = exporter.get_finished_spans().expect("spans").len();
    // With tracing off, in the election and in its manager, nothing is emitted.
    let quiet = InMemoryLockManager::builder()
        .server(&server)
        .tracing(false)
        .build();
    let quiet = LeaderElection::builder(Arc::new(quiet), "traced")
        .tracing(false)
        .build()
        .expect("within the runtime");
    within("leadership", quiet.wait_for_leadership(None))
        .await
        .expect("leads");
    assert!(
        within("the resignation", quiet.resign())
            .await
            .expect("resign")
    );
    assert_eq!(exporter.get_finished_spans().expect("spans").len(), before);

    let spans = exporter.get_finished_spans().expect("spans");
    let attr = |span: &SpanData, key: &str| -> Option<Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.clone())
    };
    let text = |s: &str| Some(Value::String(s.to_owned().into()));
    let mut terms: Vec<&SpanData> = spans
        .iter()
        .filter(|span| span.name == leader::TERM_SPAN)
        .collect();
    terms.sort_by_key(|span| span.start_time);
    assert_eq!(terms.len(), 3, "{terms:#?}");
    for (term, token) in terms.iter().zip([1, 2, 3]) {
        assert_eq!(attr(term, telemetry::KEY), text("leader:traced"));
        assert_eq!(
            attr(term, telemetry::LOCK_ID),
            Some(Value::I64(lock_id("leader:traced")))
        );
        let holder = if token < 3 { "traced-a" } else { "traced-b" };
        assert_eq!(attr(term, telemetry::HOLDER_ID), text(holder));
        assert_eq!(attr(term, leader::FENCING_TOKEN), Some(Value::I64(token)));
        assert!(matches!(attr(term, leader::TERM_MS), Some(Value::F64(ms)) if ms >= 0.0));
        let events: Vec<&str> = term.events.iter().map(|e| e.name.as_ref()).collect();
        assert_eq!(events.first(), Some(&"became leader"), "{events:?}");
    }
    let (lost, resigned, dropped) = (terms[0], terms[1], terms[2]);
    assert_eq!(
        attr(dropped, leader::OUTCOME),
        text(leader::outcome::DROPPED)
    );
    assert_eq!(dropped.status, Status::Unset);
    assert_eq!(attr(lost, leader::OUTCOME), text(leader::outcome::LOST));
    assert_eq!(
        attr(lost, telemetry::CAUSE),
        text(&LossCause::Simulated.to_string())
    );
    assert!(matches!(lost.status, Status::Error { .. }), "{lost:#?}");
    assert_eq!(
        attr(resigned, leader::OUTCOME),
        text(leader::outcome::RESIGNED)
    );
    assert_eq!(attr(resigned, telemetry::CAUSE), None);
    assert_eq!(resigned.status, Status::Unset);
    let events: Vec<&str> = resigned.events.iter().map(|e| e.name.as_ref()).collect();
    assert_eq!(events, ["became leader", "resigned"]);
    let events: Vec<&str> = lost.events.iter().map(|e| e.name.as_ref()).collect();
    assert_eq!(events, ["became leader", "leadership lost"]);
    // The final release is the manager's span, inside the term's.
    let release = spans
        .iter()
        .find(|span| span.parent_span_id == resigned.span_context.span_id())
        .expect("a span inside the resigned term");
    assert_eq!(release.name, telemetry::RELEASE_SPAN);
    assert_eq!(release.parent_span_id, resigned.span_context.span_id());
    assert_eq!(
        attr(release, telemetry::OUTCOME),
        text(telemetry::outcome::RELEASED)
    );
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL.
// ---------------------------------------------------------------------------------------------

const PROBE: Duration = Duration::from_millis(100);

fn pg_manager(pool: PgPool, holder: &str) -> PostgresLockManager {
    PostgresLockManager::builder(pool)
        .holder_id(holder)
        .probe_interval(PROBE)
        .probe_grace(Duration::from_secs(1))
        .build()
}

async fn is_alive(observer: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(pid)
        .fetch_one(observer)
        .await
        .expect("query pg_stat_activity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_holds_exactly_one_lock_across_many_ticks_and_one_release_frees_it() {
    const TICK: Duration = Duration::from_millis(50);
    const TICKS: usize = 25;
    let observer = observer().await;
    let name = format!("ticks-{}", uuid::Uuid::new_v4().simple());
    let key = format!("leader:{name}");
    let mut counted = Vec::new();
    let mut elections = Vec::new();
    for i in 0..3 {
        let app = app_name(&format!("ticks-{i}"));
        let locks = Scripted::new(Arc::new(pg_manager(pool_named(3, &app).await, &app)), 0);
        let election = LeaderElection::builder(locks.clone(), &name)
            .retry_interval(TICK)
            .build()
            .expect("within the runtime");
        if i == 0 {
            // The first candidate starts alone, so it is the leader.
            within("leadership", election.wait_for_leadership(None))
                .await
                .expect("leads");
        }
        counted.push(locks);
        elections.push(election);
    }
    let info = elections[0].leader_info().expect("leads");
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let pid = rows[0].pid;
    let followers_before = counted[1].acquires() + counted[2].acquires();
    let (first_follower_before, mut attempts) =
        (counted[1].acquires(), counted[1].acquires.subscribe());
    for tick in 1..=TICKS {
        // One tick at a time: an attempt of a follower. The leader, meanwhile, neither asks
        // for the lock again nor polls its registry: its guard's loss signal would tell it
        // when the term ends.
        within(
            "an attempt",
            attempts.wait_for(|&n| n >= first_follower_before + tick),
        )
        .await
        .expect("campaigning");
        let rows = lock_rows(&observer, lock_id(&key)).await;
        assert_eq!(rows.len(), 1, "tick {tick}: {rows:?}");
        assert!(rows[0].granted && rows[0].pid == pid && rows[0].mode == "ExclusiveLock");
        assert_eq!(
            counted[0].acquires(),
            1,
            "tick {tick}: the leader asked again"
        );
        assert_eq!(
            *counted[0].checks.borrow(),
            0,
            "tick {tick}: the leader polled its registry"
        );
        assert_eq!(counted[0].held_lock_count(), 1);
        assert_eq!(elections[0].leader_info().as_ref(), Some(&info));
        assert!(!elections[1].is_leader() && !elections[2].is_leader());
        assert_eq!(
            counted[1].held_lock_count() + counted[2].held_lock_count(),
            0
        );
    }
    let follower_attempts = counted[1].acquires() + counted[2].acquires() - followers_before;
    println!(
        "{TICKS} ticks: 1 acquisition and no registry check by the leader, {follower_attempts} \
         attempts by the followers, 1 granted row in pg_locks throughout"
    );
    assert!(
        follower_attempts >= TICKS,
        "the followers kept trying: {follower_attempts}"
    );

    // One release frees the lock: the leader's session survives (back in its pool), holding
    // nothing. A stacked lock would still be held by it.
    assert!(
        within("the resignation", elections[0].resign())
            .await
            .expect("resign")
    );
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert!(rows.iter().all(|r| r.pid != pid), "{rows:?}");
    assert!(
        is_alive(&observer, pid).await,
        "freed by the unlock, not by a closed session"
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let elections: Vec<Arc<LeaderElection>> = elections.into_iter().map(Arc::new).collect();
    for (i, election) in elections.iter().enumerate().skip(1) {
        let (election, tx) = (Arc::clone(election), tx.clone());
        tokio::spawn(async move {
            if let Ok(info) = election.wait_for_leadership(None).await {
                let _ = tx.send((i, info));
            }
        });
    }
    let (next, next_info) = within("a leader", rx.recv())
        .await
        .expect("a follower takes over");
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_ne!(rows[0].pid, pid);
    assert_eq!(&*next_info.holder_id, counted[next].holder_id());
    for election in &elections[1..] {
        within("the resignation", election.resign())
            .await
            .expect("resign");
    }
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_election_calls_leave_nothing_held() {
    let observer = observer().await;
    let name = format!("cancel-{}", uuid::Uuid::new_v4().simple());
    let key = format!("leader:{name}");
    let (leader_app, follower_app) = (app_name("cancel-leader"), app_name("cancel-follower"));
    let (hook, pause) = pause_at(Stage::Unlock);
    let leader_locks = PostgresLockManager::builder(pool_named(3, &leader_app).await)
        .holder_id(&leader_app)
        .probe_interval(PROBE)
        .build_with_stage_hook(hook);
    let leader = LeaderElection::builder(Arc::new(leader_locks.clone()), &name)
        .retry_interval(Duration::from_millis(50))
        .build()
        .expect("within the runtime");
    within("leadership", leader.wait_for_leadership(None))
        .await
        .expect("leads");
    let follower_locks = pg_manager(pool_named(3, &follower_app).await, &follower_app);
    let follower = LeaderElection::builder(Arc::new(follower_locks.clone()), &name)
        .retry_interval(Duration::from_millis(50))
        .build()
        .expect("within the runtime");

    // Waiting for leadership, dropped: the follower keeps campaigning and holds nothing.
    let waiting = tokio::time::timeout(
        Duration::from_millis(200),
        follower.wait_for_leadership(None),
    );
    assert!(waiting.await.is_err(), "the leader leads");
    let waiting = tokio::time::timeout(
        Duration::from_millis(200),
        follower.run_as_leader(None, |_| async { panic!("a follower's work must not run") }),
    );
    assert!(waiting.await.is_err(), "the leader leads");
    assert!(
        common::advisory_locks_of(&observer, &follower_app)
            .await
            .is_empty()
    );
    assert_eq!(follower_locks.held_lock_count(), 0);

    // Leader work, dropped while it runs: the leadership stays, with its one lock, and a
    // graceful end no longer waits for the dropped work.
    let (started_tx, started_rx) = oneshot::channel();
    let working = leader.run_as_leader(None, |_| async move {
        started_tx.send(()).expect("report");
        std::future::pending::<()>().await
    });
    tokio::select! {
        _ = working => unreachable!("the work never ends"),
        _ = within("the leader's work to start", started_rx) => {} // it runs: drop it here
    }
    assert!(leader.is_leader());
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        common::advisory_locks_of(&observer, &leader_app)
            .await
            .len(),
        1
    );

    // Resign, dropped while the campaign releases (parked just before the unlock): the
    // release goes on without it, and a second resign waits for it and reports it.
    tokio::select! {
        _ = leader.resign() => unreachable!("parked before the unlock"),
        _ = pause.reached() => {} // drop the resign here
    }
    assert!(!leader.is_leader(), "stepped down before releasing");
    assert_eq!(
        lock_rows(&observer, lock_id(&key)).await.len(),
        1,
        "not yet released"
    );
    pause.resume();
    assert!(
        within("the resignation", leader.resign())
            .await
            .expect("resign"),
        "the release happened"
    );
    assert!(
        common::advisory_locks_of(&observer, &leader_app)
            .await
            .is_empty()
    );
    assert_eq!(leader_locks.held_lock_count(), 0);
    common::assert_pool_clean(&observer, &leader_app).await;

    // The follower takes over; dropping its handle mid-term releases too.
    within("leadership", follower.wait_for_leadership(None))
        .await
        .expect("takes over");
    let mut state = follower.subscribe();
    drop(follower);
    while within("a change of leadership", state.changed())
        .await
        .is_ok()
    {}
    assert_eq!(follower_locks.held_lock_count(), 0);
    common::assert_pool_clean(&observer, &follower_app).await;
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Several processes, each with several candidates, writing to a fenced log while they lead;
// the parent kills the leader's lock session again and again.
// ---------------------------------------------------------------------------------------------

const PROCESSES: usize = 3;
const CANDIDATES_PER_PROCESS: usize = 2;
const FAILOVER_RETRY: Duration = Duration::from_millis(200);
const FAILOVER_JITTER: f64 = 0.1;
const WRITE_PAUSE: Duration = Duration::from_millis(5);
/// Kills at least this many leaders, and more (up to `MAX_KILLS`) until a deposed leader's
/// write has been seen rejected. A kill shows one about once in 6 to 11 on a quiet machine and
/// rarer under load: a CI run once went 20 kills without one, so the cap leaves room.
const MIN_KILLS: usize = 6;
const MAX_KILLS: usize = 60;
/// Room on top of a bound timed in a candidate process (against the kill, or against its own
/// previous attempt): the killed backend's exit, then a timer running out in the candidate and
/// its runtime getting a core back, on a machine whose two cores run three candidate
/// processes, the server and this test, and other work besides. Half a retry interval: a
/// follower that waited twice the interval would be outside it.
const WAKE_ROOM: Duration = Duration::from_millis(100);
/// A candidate process's role, passed on its command line (libtest takes it for a filter that
/// matches no test): an argument, unlike an environment variable, cannot leak into the test
/// run that spawns the candidates and turn it into one.
const ROLE: &str = "pglock-test-leader-candidates=";

/// The candidates' spec, when this process is a candidate process spawned by the test.
fn candidates_role() -> Option<String> {
    std::env::args().find_map(|arg| arg.strip_prefix(ROLE).map(str::to_owned))
}

/// A statement naming this run's tables (generated names, never input).
macro_rules! sql {
    ($($format:tt)*) => {
        AssertSqlSafe(format!($($format)*))
    };
}

/// The tables of one run: the log the leaders append to, the fence row that guards it, and
/// the fencing tokens' own table.
#[derive(Debug, Clone)]
struct Tables {
    log: String,
    fence: String,
    tokens: String,
}

impl Tables {
    fn new(suffix: &str) -> Tables {
        Tables {
            log: format!("pglock_test_leader_log_{suffix}"),
            fence: format!("pglock_test_leader_fence_{suffix}"),
            tokens: format!("pglock_test_leader_tokens_{suffix}"),
        }
    }

    async fn create(&self, db: &PgPool) {
        for ddl in [
            format!(
                "CREATE TABLE {} (seq bigint PRIMARY KEY, token bigint NOT NULL, \
                 candidate text NOT NULL, accepted boolean NOT NULL, \
                 at timestamptz NOT NULL DEFAULT clock_timestamp())",
                self.log
            ),
            format!(
                "CREATE TABLE {} (id int PRIMARY KEY, token bigint NOT NULL, writes bigint NOT NULL)",
                self.fence
            ),
            format!("INSERT INTO {} VALUES (1, 0, 0)", self.fence),
        ] {
            sqlx::query(AssertSqlSafe(ddl))
                .execute(db)
                .await
                .expect("create");
        }
    }

    async fn drop_all(&self, db: &PgPool) {
        let ddl = format!(
            "DROP TABLE IF EXISTS {}, {}, {}",
            self.log, self.fence, self.tokens
        );
        sqlx::query(AssertSqlSafe(ddl))
            .execute(db)
            .await
            .expect("drop");
    }

    /// One fenced write, in one statement: the fence row moves up to `token` unless it is above
    /// it already, and the attempt is logged with its verdict (accepted: the fence did not stand
    /// above `token`). Every attempt, accepted or not, takes the fence row's lock and numbers
    /// itself there, so `seq` order is the order in which the fence judged them. (A `bigserial`
    /// would not do: its number is drawn before the statement waits for the row lock, so a
    /// rejected attempt could be numbered before the write that caused its rejection.)
    async fn fenced_write(&self, db: &PgPool, token: i64, candidate: &str) -> bool {
        let statement = format!(
            "WITH fence AS (UPDATE {fence} SET token = GREATEST(token, $1), writes = writes + 1 \
             WHERE id = 1 RETURNING writes, token = $1 AS accepted) \
             INSERT INTO {log} (seq, token, candidate, accepted) \
             SELECT writes, $1, $2, accepted FROM fence RETURNING accepted",
            fence = self.fence,
            log = self.log
        );
        sqlx::query_scalar(AssertSqlSafe(statement))
            .bind(token)
            .bind(candidate)
            .fetch_one(db)
            .await
            .expect("fenced write")
    }
}

/// Writes under the term's token for as long as the term lasts (it is cancelled when it ends).
async fn write_while_leading(db: PgPool, tables: Tables, info: LockInfo) -> Infallible {
    let token = info.fencing_token.expect("fencing is on");
    let candidate = info.holder_id;
    loop {
        tables.fenced_write(&db, token, &candidate).await;
        tokio::time::sleep(WRITE_PAUSE).await;
    }
}

/// One acquisition a candidate's campaign made: when it began and ended (`clock::now_us`), when
/// it began by the wall clock (microseconds since the epoch, the clock the server's
/// `clock_timestamp()` reads), and whether it was granted.
#[derive(Debug, Clone, Copy)]
struct Asked {
    began_us: u64,
    ended_us: u64,
    began_wall_us: i64,
    granted: bool,
}

/// A candidate's lock manager, recording every acquisition its campaign makes: when the
/// campaign acts is what the failover bound is about, and this sees it without a round trip.
#[derive(Debug)]
struct Recorded {
    inner: PostgresLockManager,
    asked: Mutex<Vec<Asked>>,
}

impl Recorded {
    /// When the acquisition that won the current term began, by the wall clock: the campaign
    /// makes none while it leads, so it is the last one.
    fn winning_attempt_wall_us(&self) -> i64 {
        let asked = self.asked.lock().unwrap();
        let last = asked.last().expect("a term follows an acquisition");
        assert!(last.granted, "{last:?}");
        last.began_wall_us
    }

    /// The waits between a failed attempt and the next one, in microseconds.
    fn retry_gaps_us(&self) -> Vec<u64> {
        let asked = self.asked.lock().unwrap();
        asked
            .windows(2)
            .filter(|pair| !pair[0].granted)
            .map(|pair| pair[1].began_us - pair[0].ended_us)
            .collect()
    }
}

#[async_trait]
impl LockManager for Recorded {
    async fn acquire_key(&self, key: &LockKey, options: AcquireOptions) -> pglock::Result<Attempt> {
        let (began_us, began_wall_us) = (now_us(), wall_us());
        let result = self.inner.acquire_key(key, options).await;
        self.asked.lock().unwrap().push(Asked {
            began_us,
            ended_us: now_us(),
            began_wall_us,
            granted: matches!(result, Ok(Attempt::Acquired(_))),
        });
        result
    }

    async fn release_key(&self, key: &LockKey) -> pglock::Result<()> {
        self.inner.release_key(key).await
    }

    async fn release_all(&self) -> pglock::Result<usize> {
        self.inner.release_all().await
    }

    async fn is_held_key(&self, key: &LockKey) -> bool {
        self.inner.is_held_key(key).await
    }

    async fn held_locks(&self) -> Vec<pglock::HeldLock> {
        self.inner.held_locks().await
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held_lock_count()
    }

    fn holder_id(&self) -> &str {
        self.inner.holder_id()
    }
}

/// Microseconds since the epoch by the machine's wall clock, which the server's
/// `clock_timestamp()` reads too.
fn wall_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// One candidate's life: lead whenever elected; count the terms lost. Prints `WON {id}
/// {token} {us}` as a term starts (when its winning attempt began) and `LOST {id} {us}` as a
/// term ends in a loss (when the loss reached the candidate), `us` read from `wall_us`.
async fn candidate_loop(
    election: Arc<LeaderElection>,
    locks: Arc<Recorded>,
    db: PgPool,
    tables: Tables,
) -> usize {
    let mut lost = 0;
    loop {
        let work = |info: LockInfo| {
            println!(
                "WON {} {} {}",
                info.holder_id,
                info.fencing_token.expect("fencing is on"),
                locks.winning_attempt_wall_us()
            );
            write_while_leading(db.clone(), tables.clone(), info)
        };
        match election.run_as_leader(None, work).await {
            Ok(never) => match never {},
            Err(LeaderError::Lock(Error::LockLost {
                cause: LossCause::NotOnServer,
                ..
            })) => {
                let noticed_us = wall_us();
                lost += 1;
                println!("LOST {} {noticed_us}", election.holder_id());
            }
            Err(LeaderError::Stopped { .. }) => return lost,
            Err(other) => panic!("unexpected end of a term: {other}"),
        }
    }
}

/// A child process: its candidates campaign until the parent closes our stdin, then resign.
async fn act_as_candidates(spec: &str) -> ! {
    let (name, suffix) = spec.split_once('|').expect("name|suffix");
    let tables = Tables::new(suffix);
    let db = pool_named(CANDIDATES_PER_PROCESS as u32 + 1, "pglock-leader-writes").await;
    let mut elections = Vec::new();
    let mut loops = Vec::new();
    let mut managers = Vec::new();
    for _ in 0..CANDIDATES_PER_PROCESS {
        let locks = Arc::new(Recorded {
            inner: PostgresLockManager::builder(pool_named(2, &app_name("leader")).await)
                .fencing(FencingTable::new(&tables.tokens).expect("valid name"))
                .probe_interval(PROBE)
                .probe_grace(Duration::from_secs(1))
                .build(),
            asked: Mutex::new(Vec::new()),
        });
        // No holder id given: each candidate campaigns with the manager's default identity.
        let election = Arc::new(
            LeaderElection::builder(locks.clone(), name)
                .retry_interval(FAILOVER_RETRY)
                .jitter(FAILOVER_JITTER)
                .build()
                .expect("within the runtime"),
        );
        println!("CANDIDATE {}", election.holder_id());
        loops.push(tokio::spawn(candidate_loop(
            Arc::clone(&election),
            Arc::clone(&locks),
            db.clone(),
            tables.clone(),
        )));
        elections.push(election);
        managers.push(locks);
    }
    let mut rest = Vec::new();
    tokio::io::stdin()
        .read_to_end(&mut rest)
        .await
        .expect("read stdin");
    for election in &elections {
        within("the resignation", election.resign())
            .await
            .expect("resign");
    }
    let mut lost = 0;
    for candidate in loops {
        lost += candidate.await.expect("candidate loop");
    }
    let gaps: Vec<u64> = managers.iter().flat_map(|m| m.retry_gaps_us()).collect();
    println!(
        "DONE lost={lost} gaps={} min_gap_us={} max_gap_us={}",
        gaps.len(),
        gaps.iter().min().copied().unwrap_or(u64::MAX),
        gaps.iter().max().copied().unwrap_or(0)
    );
    std::process::exit(0);
}

/// Polls `probe` every 5 ms until it yields a value (up to 15 s). For states that other
/// processes reach on their own time, which the log shows and nothing signals.
async fn poll<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One attempt in the log.
#[derive(Debug)]
struct Entry {
    seq: i64,
    token: i64,
    candidate: String,
    accepted: bool,
}

/// The next line a candidate process printed, with its pid and when it arrived.
async fn next_line(
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<(u32, String, Instant)>,
) -> (u32, String, Instant) {
    tokio::time::timeout(Duration::from_secs(60), lines.recv())
        .await
        .expect("a candidate process went silent")
        .expect("every candidate process exited")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_fails_over_across_processes_and_the_fence_holds() {
    if let Some(spec) = candidates_role() {
        act_as_candidates(&spec).await;
    }
    let db = observer().await;
    let suffix = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let tables = Tables::new(&suffix);
    tables.create(&db).await;
    let name = format!("failover-{suffix}");
    let key = format!("leader:{name}");

    let (lines_tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let mut children = Vec::new();
    for _ in 0..PROCESSES {
        let mut child = tokio::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "leadership_fails_over_across_processes_and_the_fence_holds",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .arg(format!("{ROLE}{name}|{suffix}"))
            .env("DATABASE_URL", common::url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn a candidate process");
        let pid = child.id().expect("running");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let tx = lines_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                let _ = tx.send((pid, line, Instant::now()));
            }
        });
        children.push(child);
    }
    drop(lines_tx);

    // Every candidate announces its identity: the manager's default, `{host}:{pid}:{16 hex}`.
    let mut identities: HashMap<String, u32> = HashMap::new();
    while identities.len() < PROCESSES * CANDIDATES_PER_PROCESS {
        let (pid, line, _) = next_line(&mut lines).await;
        // The first line may follow libtest's `test ... ` on the same line.
        if let Some((_, id)) = line.split_once("CANDIDATE ") {
            let parts: Vec<&str> = id.rsplitn(3, ':').collect();
            assert_eq!(parts.len(), 3, "{id}");
            assert_eq!(parts[1], pid.to_string(), "the pid of its process: {id}");
            assert!(
                parts[0].len() == 16 && parts[0].chars().all(|c| c.is_ascii_hexdigit()),
                "{id}"
            );
            assert!(
                identities.insert(id.to_owned(), pid).is_none(),
                "duplicate {id}"
            );
        }
    }

    // Terms started so far, by token: the winner, and when its winning attempt began.
    let mut won: HashMap<i64, (String, i64)> = HashMap::new();
    let (mut failovers, mut elections, mut detections) = (Vec::new(), Vec::new(), Vec::new());
    let (mut kills, mut killed_tokens) = (0, Vec::new());
    let log = &tables.log;
    loop {
        // A leader that has settled in: five accepted writes under the newest token.
        let (token, candidate): (i64, String) = poll("a leader writes", || async {
            sqlx::query_as(sql!(
                "SELECT token, min(candidate) FROM {log} WHERE accepted \
                 GROUP BY token HAVING count(*) >= 5 ORDER BY token DESC LIMIT 1"
            ))
            .fetch_optional(&db)
            .await
            .expect("read the log")
            .filter(|(token, _): &(i64, String)| !killed_tokens.contains(token))
        })
        .await;
        // The session holding the election's lock is that leader's.
        let rows = lock_rows(&db, lock_id(&key)).await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert!(rows[0].granted);
        let app: String =
            sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
                .bind(rows[0].pid)
                .fetch_one(&db)
                .await
                .expect("the holder's session");
        let tag: String = format!("pglock:{candidate}").chars().take(63).collect();
        assert_eq!(app, tag, "the lock holder is the leader the log shows");

        // The clock starts as the server signals the leader's backend, by its clock: the lock
        // cannot be freed earlier, and a test held up before it cannot count against the
        // candidates.
        let (terminated, killed_at): (bool, chrono::DateTime<chrono::Utc>) =
            sqlx::query_as("SELECT pg_terminate_backend($1), clock_timestamp()")
                .bind(rows[0].pid)
                .fetch_one(&db)
                .await
                .expect("terminate");
        assert!(terminated);
        kills += 1;
        killed_tokens.push(token);

        // The next leader's first accepted write.
        let (next, first_at): (i64, chrono::DateTime<chrono::Utc>) =
            poll("the next leader writes", || async {
                sqlx::query_as(sql!(
                    "SELECT token, at FROM {log} WHERE accepted AND token > $1 \
                     ORDER BY seq LIMIT 1"
                ))
                .bind(token)
                .fetch_optional(&db)
                .await
                .expect("read the log")
            })
            .await;
        let failover = (first_at - killed_at).to_std().unwrap_or_default();
        // The deposed leader hears of it, and it alone: its term ends as a loss. The next
        // leader says when its winning attempt began. Both are timed where they happen, by the
        // wall clock that the server's `clock_timestamp()` reads too.
        let mut loss = None;
        while loss.is_none() || !won.contains_key(&next) {
            let (_, line, _) = next_line(&mut lines).await;
            if let Some((_, rest)) = line.split_once("LOST ") {
                let (who, at) = rest.rsplit_once(' ').expect("LOST {id} {us}");
                assert!(loss.is_none(), "one loss a kill: {line}");
                loss = Some((who.to_owned(), at.parse::<i64>().expect("us")));
            } else if let Some((_, rest)) = line.split_once("WON ") {
                let mut fields = rest.split(' ');
                let (who, term, at) = (fields.next(), fields.next(), fields.next());
                let term: i64 = term.expect("WON {id} {token} {us}").parse().expect("token");
                let at: i64 = at.expect("WON {id} {token} {us}").parse().expect("us");
                won.insert(term, (who.expect("an id").to_owned(), at));
            }
        }
        let (loser, noticed_us) = loss.expect("a loss");
        assert_eq!(loser, candidate, "the killed leader lost its term");
        let kill_us = killed_at.timestamp_micros();
        let since_kill = |us: i64| Duration::from_micros(u64::try_from(us - kill_us).unwrap_or(0));
        let noticed = since_kill(noticed_us);
        // An attempt that began just before the kill, and reached the server after it, wins
        // at "zero".
        let elected = since_kill(won[&next].1);
        println!(
            "kill {kills}: token {token} -> {next}, the winning attempt began after {elected:?}, \
             first write after {failover:?}; the deposed leader noticed after {noticed:?}"
        );
        failovers.push(failover);
        elections.push(elected);
        detections.push(noticed);

        let rejected: i64 =
            sqlx::query_scalar(sql!("SELECT count(*) FROM {log} WHERE NOT accepted"))
                .fetch_one(&db)
                .await
                .expect("count");
        if (kills >= MIN_KILLS && rejected > 0) || kills == MAX_KILLS {
            break;
        }
    }

    // The test is over: the candidates resign and report how many terms they lost.
    let mut lost = 0;
    for child in &mut children {
        drop(child.stdin.take());
    }
    let mut done = 0;
    let (mut gaps, mut min_gap, mut max_gap) = (0, u64::MAX, 0);
    while done < PROCESSES {
        let (_, line, _) = next_line(&mut lines).await;
        if let Some((_, report)) = line.split_once("DONE ") {
            let field = |name: &str| -> u64 {
                report
                    .split(' ')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("{name} in {report}"))
                    .parse()
                    .expect("a number")
            };
            lost += usize::try_from(field("lost")).expect("a count");
            gaps += field("gaps");
            min_gap = min_gap.min(field("min_gap_us"));
            max_gap = max_gap.max(field("max_gap_us"));
            done += 1;
        }
    }
    for child in &mut children {
        assert!(child.wait().await.expect("wait").success());
    }
    assert!(
        lock_rows(&db, lock_id(&key)).await.is_empty(),
        "all resigned"
    );
    assert_eq!(lost, kills, "every kill ended exactly one term, as a loss");

    let entries: Vec<Entry> = sqlx::query_as(sql!(
        "SELECT seq, token, candidate, accepted FROM {log} ORDER BY seq"
    ))
    .fetch_all(&db)
    .await
    .expect("read the log")
    .into_iter()
    .map(|(seq, token, candidate, accepted)| Entry {
        seq,
        token,
        candidate,
        accepted,
    })
    .collect();

    // Accepted writes, in commit order, never go back to a lower token.
    let mut highest = 0;
    let mut tokens: BTreeMap<i64, String> = BTreeMap::new();
    let mut rejected_by_token: BTreeMap<i64, usize> = BTreeMap::new();
    for entry in &entries {
        assert!(
            identities.contains_key(&entry.candidate),
            "{} is a candidate",
            entry.candidate
        );
        // Each token is one candidate's.
        let owner = tokens
            .entry(entry.token)
            .or_insert_with(|| entry.candidate.clone());
        assert_eq!(
            *owner, entry.candidate,
            "token {} has two owners",
            entry.token
        );
        if entry.accepted {
            assert!(
                entry.token >= highest,
                "entry {} went back from token {highest} to {}",
                entry.seq,
                entry.token
            );
            highest = entry.token;
        } else {
            // Rejected only because a successor had written first.
            assert!(
                entry.token < highest,
                "entry {} was rejected without a newer write before it",
                entry.seq
            );
            *rejected_by_token.entry(entry.token).or_default() += 1;
        }
    }
    let accepted_tokens: HashSet<i64> = entries
        .iter()
        .filter(|e| e.accepted)
        .map(|e| e.token)
        .collect();
    let fence: i64 = sqlx::query_scalar(sql!("SELECT token FROM {} WHERE id = 1", tables.fence))
        .fetch_one(&db)
        .await
        .expect("fence");
    assert_eq!(fence, highest);
    assert!(
        accepted_tokens.len() > kills,
        "a new leader wrote after every kill"
    );
    let rejected: usize = rejected_by_token.values().sum();
    println!(
        "{} entries, {} terms wrote, {kills} kills; rejected writes of deposed leaders by token: \
         {rejected_by_token:?}",
        entries.len(),
        accepted_tokens.len()
    );
    assert!(
        rejected > 0,
        "deposed leaders attempted writes after their successors' (and were rejected)"
    );

    // A new leader within the retry interval (with jitter) of the lock's freeing: every
    // follower tries again at most that long after its last attempt, and the first attempt to
    // find the lock free wins. Both are timed in the candidates, as the campaign acts.
    let longest_wait = FAILOVER_RETRY.mul_f64(1.0 + FAILOVER_JITTER);
    let (min_gap, max_gap) = (
        Duration::from_micros(min_gap),
        Duration::from_micros(max_gap),
    );
    println!(
        "followers' waits between attempts over {gaps} retries: min={min_gap:?} \
         max={max_gap:?}; expected {FAILOVER_RETRY:?} to {longest_wait:?} + {WAKE_ROOM:?}"
    );
    assert!(gaps > 0, "followers retried");
    assert!(
        min_gap >= FAILOVER_RETRY,
        "a follower tried again {min_gap:?} after its last attempt, before the retry interval"
    );
    assert!(
        max_gap <= longest_wait + WAKE_ROOM,
        "a follower waited {max_gap:?} between attempts, more than {longest_wait:?} + \
         {WAKE_ROOM:?}"
    );
    elections.sort();
    let slowest = *elections.last().expect("kills");
    println!(
        "winning attempt after the kill over {kills} kills: min={:?} p50={:?} max={slowest:?}; \
         expected at most {longest_wait:?} (retry {FAILOVER_RETRY:?} + {:.0}% jitter) + \
         {WAKE_ROOM:?}",
        elections[0],
        elections[elections.len() / 2],
        FAILOVER_JITTER * 100.0
    );
    assert!(
        slowest <= longest_wait + WAKE_ROOM,
        "the next leader's winning attempt began {slowest:?} after the kill, more than \
         {longest_wait:?} + {WAKE_ROOM:?}"
    );
    // The whole failover, from the kill to the next leader's first accepted write (by the
    // server's clock): the winning attempt, then its round trip, the start of the term and
    // the write's round trip, each of which a busy two-core machine can hold up (the whole was
    // seen at 493 ms with this file's other tests running). Room for those, well short of
    // anything waiting for the deposed leader (its probe grace is 1 s).
    failovers.sort();
    let max = *failovers.last().expect("kills");
    let whole = longest_wait + Duration::from_millis(400);
    println!(
        "failover (kill to the next leader's first accepted write) over {kills} kills: \
         min={:?} p50={:?} max={max:?}; expected at most {whole:?}",
        failovers[0],
        failovers[failovers.len() / 2],
    );
    assert!(max <= whole, "slowest failover {max:?} exceeds {whole:?}");
    detections.sort();
    let p50 = detections[detections.len() / 2];
    let slowest = *detections.last().expect("kills");
    println!(
        "loss noticed by the deposed leader (in its process): min={:?} p50={p50:?} \
         max={slowest:?} (probe {PROBE:?})",
        detections[0],
    );
    // The leader's session is pinged an interval after it was last heard (at its grant, for a
    // young term), and the kill comes some way into that interval, after the leader's fifth
    // write: the loss is noticed within an interval and a round trip of the kill, and on the
    // median well inside the interval (seen at 50 to 70 ms). Every kill within that, with
    // `WAKE_ROOM` and a half more for a busy machine; the median within the interval, which a
    // loss noticed a probe late (an interval more, in every kill) would exceed.
    let bound = PROBE + WAKE_ROOM + WAKE_ROOM / 2;
    assert!(
        slowest <= bound,
        "slowest detection {slowest:?} exceeds {bound:?}"
    );
    assert!(p50 <= PROBE, "median detection {p50:?} exceeds {PROBE:?}");
    tables.drop_all(&db).await;
}
