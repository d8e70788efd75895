//! Leader election metrics (feature `metrics`), read back from in-memory exporters, one per
//! candidate as if each were a process of its own: leadership 1 while leading and 0 after,
//! terms won and ended by outcome, and the vacancy measured once per win by the winner. On
//! in-memory candidates with a paused clock (every duration exact) and on PostgreSQL.
#![cfg(feature = "metrics")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::meters::{Pipeline, points, series};
use common::within;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use pglock::telemetry::{HOLDER_ID, leader, metrics};
use pglock::{
    InMemoryLockManager, InMemoryLockServer, LeaderElection, Leadership, LockInfo, LockManager,
    PostgresLockManager,
};
use tokio::sync::watch;
use tokio::time::Instant;

const RETRY: Duration = Duration::from_secs(1);
const JITTER: f64 = 0.1;

/// The longest a follower waits between two attempts.
fn longest_wait() -> Duration {
    RETRY.mul_f64(1.0 + JITTER)
}

/// A candidate for `election` on `locks`, recording into a pipeline of its own.
fn candidate(locks: Arc<dyn LockManager>, election: &str) -> (LeaderElection, Pipeline) {
    let pipeline = Pipeline::new();
    let candidate = LeaderElection::builder(locks, election)
        .retry_interval(RETRY)
        .jitter(JITTER)
        .meter(pipeline.meter())
        .build()
        .expect("within the runtime");
    (candidate, pipeline)
}

/// Waits until `election` leads; the term's lock info.
async fn leads(election: &LeaderElection) -> LockInfo {
    within("leadership", election.wait_for_leadership(None))
        .await
        .expect("the candidate leads")
}

/// Waits until `election` no longer leads.
async fn steps_down(state: &mut watch::Receiver<Leadership>) {
    within("the step down", state.wait_for(|l| !l.is_leader()))
        .await
        .expect("still campaigning");
}

fn in_memory(server: &InMemoryLockServer, id: &str) -> Arc<dyn LockManager> {
    Arc::new(
        InMemoryLockManager::builder()
            .server(server)
            .holder_id(id)
            .build(),
    )
}

/// The values of leader metric `name` of `election` with `outcome` (if any): a counter's
/// value, or a histogram's count and sum.
fn of(export: &ResourceMetrics, name: &str, election: &str, outcome: Option<&str>) -> Vec<f64> {
    let mut wanted = vec![(leader::ELECTION, election)];
    wanted.extend(outcome.map(|outcome| (leader::OUTCOME, outcome)));
    points(export, name, &wanted)
}

fn is_leader(export: &ResourceMetrics, election: &str) -> Vec<f64> {
    of(export, metrics::LEADER_IS_LEADER, election, None)
}

fn terms(export: &ResourceMetrics, election: &str) -> Vec<f64> {
    of(export, metrics::LEADER_TERMS, election, None)
}

fn ended(export: &ResourceMetrics, election: &str, outcome: &str) -> Vec<f64> {
    of(export, metrics::LEADER_TERMS_ENDED, election, Some(outcome))
}

fn vacancy(export: &ResourceMetrics, election: &str) -> Vec<f64> {
    of(export, metrics::LEADER_VACANCY, election, None)
}

#[tokio::test(start_paused = true)]
async fn leadership_goes_to_one_and_back_to_zero_and_the_winner_measures_the_vacancy() {
    let server = InMemoryLockServer::new();
    let (a, a_metrics) = candidate(in_memory(&server, "a"), "billing");
    leads(&a).await;
    let (b, b_metrics) = candidate(in_memory(&server, "b"), "billing");
    // b campaigns for a few intervals, each attempt finding the lock taken.
    tokio::time::sleep(RETRY * 3).await;

    let export = a_metrics.collect();
    assert_eq!(is_leader(&export, "billing"), [1.0]);
    assert_eq!(terms(&export, "billing"), [1.0]);
    assert_eq!(
        vacancy(&export, "billing"),
        [1.0, 0.0],
        "won at its first attempt: one vacancy of 0 s"
    );
    assert!(series(&export, metrics::LEADER_TERMS_ENDED).is_empty());
    let export = b_metrics.collect();
    assert_eq!(is_leader(&export, "billing"), [0.0], "a follower shows 0");
    assert!(terms(&export, "billing").is_empty());
    assert!(vacancy(&export, "billing").is_empty());

    let resigned_at = Instant::now();
    assert!(within("the resignation", a.resign()).await.expect("resign"));
    let export = a_metrics.collect();
    assert_eq!(is_leader(&export, "billing"), [0.0]);
    assert_eq!(ended(&export, "billing", leader::outcome::RESIGNED), [1.0]);
    assert_eq!(series(&export, metrics::LEADER_TERMS_ENDED).len(), 1);

    leads(&b).await;
    let export = b_metrics.collect();
    assert_eq!(is_leader(&export, "billing"), [1.0]);
    assert_eq!(terms(&export, "billing"), [1.0]);
    let measured = vacancy(&export, "billing");
    assert_eq!(measured[0], 1.0, "one win, one vacancy: {measured:?}");
    // From b's last attempt that found the lock taken to its win: one wait, jitter included,
    // and at least the true vacancy, from the resignation to the win.
    let truly_vacant = resigned_at.elapsed().as_secs_f64();
    assert!(
        measured[1] >= RETRY.as_secs_f64() && measured[1] <= longest_wait().as_secs_f64(),
        "{measured:?}"
    );
    assert!(measured[1] >= truly_vacant, "{measured:?} < {truly_vacant}");

    // Leading on, b records no other vacancy and no other term.
    tokio::time::sleep(RETRY * 5).await;
    let export = b_metrics.collect();
    assert_eq!(vacancy(&export, "billing")[0], 1.0);
    assert_eq!(terms(&export, "billing"), [1.0]);

    let export = dropped(b, &b_metrics, "billing").await;
    assert_eq!(ended(&export, "billing", leader::outcome::DROPPED), [1.0]);
    // The election's name is the one attribute: no key, token or holder id.
    for name in [metrics::LEADER_IS_LEADER, metrics::LEADER_TERMS] {
        let only = [(leader::ELECTION.to_owned(), "billing".to_owned())];
        assert_eq!(series(&export, name), [only.to_vec()].into(), "{name}");
    }
}

/// Drops the handle of `candidate` for `election`, waits until its campaign has ended, and
/// checks that its leadership series is back at 0; its export.
async fn dropped(candidate: LeaderElection, metrics: &Pipeline, election: &str) -> ResourceMetrics {
    let mut state = candidate.subscribe();
    drop(candidate);
    // The campaign ends (its channel closes) having stepped down.
    while within("the campaign's end", state.changed()).await.is_ok() {}
    let export = metrics.collect();
    let zero = is_leader(&export, election);
    assert_eq!(zero, [0.0], "a dropped candidate ends at 0");
    export
}

#[tokio::test(start_paused = true)]
async fn a_term_taken_away_through_the_manager_or_lost_ends_with_that_outcome() {
    let server = InMemoryLockServer::new();
    let locks = InMemoryLockManager::builder()
        .server(&server)
        .holder_id("replica-0")
        .build();
    let pipeline = Pipeline::new();
    let election = LeaderElection::builder(Arc::new(locks.clone()), "ledger")
        .retry_interval(RETRY)
        .jitter(JITTER)
        .meter(pipeline.meter())
        .metrics_holder_id(true)
        .build()
        .expect("within the runtime");
    let mut state = election.subscribe();
    leads(&election).await;
    // A term of a few intervals: the next vacancy is counted from its end, not from here.
    tokio::time::sleep(RETRY * 3).await;

    assert_eq!(locks.release_all().await.expect("release all"), 1);
    steps_down(&mut state).await;
    let export = pipeline.collect();
    assert_eq!(is_leader(&export, "ledger"), [0.0]);
    let elsewhere = leader::outcome::RELEASED_ELSEWHERE;
    assert_eq!(ended(&export, "ledger", elsewhere), [1.0]);

    // It campaigns again: the office was vacant from its step-down to its next attempt.
    let stepped_down = Instant::now();
    leads(&election).await;
    let export = pipeline.collect();
    assert_eq!(terms(&export, "ledger"), [2.0]);
    let measured = vacancy(&export, "ledger");
    assert_eq!(measured[0], 2.0, "{measured:?}");
    assert!(
        measured[1] >= stepped_down.elapsed().as_secs_f64()
            && measured[1] <= longest_wait().as_secs_f64(),
        "the first win measured 0, the second one wait: {measured:?}"
    );

    assert!(locks.simulate_loss("leader:ledger").await);
    steps_down(&mut state).await;
    let export = pipeline.collect();
    assert_eq!(is_leader(&export, "ledger"), [0.0]);
    assert_eq!(ended(&export, "ledger", leader::outcome::LOST), [1.0]);
    assert_eq!(ended(&export, "ledger", elsewhere), [1.0]);
    // Opted in: every series names the candidate.
    for name in [
        metrics::LEADER_IS_LEADER,
        metrics::LEADER_TERMS,
        metrics::LEADER_TERMS_ENDED,
        metrics::LEADER_VACANCY,
    ] {
        for series in series(&export, name) {
            let holder = (HOLDER_ID.to_owned(), "replica-0".to_owned());
            assert!(series.contains(&holder), "{name}: {series:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_leader_counts_its_terms_released_elsewhere_and_lost() {
    let locks = PostgresLockManager::builder(common::pool(3).await)
        .probe_interval(Duration::from_millis(100))
        .build();
    let name = common::key("metrics-election");
    let pipeline = Pipeline::new();
    let election = LeaderElection::builder(Arc::new(locks.clone()), &name)
        .retry_interval(Duration::from_millis(100))
        .meter(pipeline.meter())
        .build()
        .expect("within the runtime");
    let mut state = election.subscribe();
    let key = election.key().clone();

    // Each way a term can be taken from the leader, and the outcome it is counted with.
    let observer = common::observer().await;
    for (term, outcome) in [
        (1.0, leader::outcome::RELEASED_ELSEWHERE),
        (2.0, leader::outcome::LOST),
    ] {
        let info = leads(&election).await;
        // Recorded before the term was published, and steady until its lock goes.
        let export = pipeline.collect();
        assert_eq!(terms(&export, &name), [term]);
        assert_eq!(is_leader(&export, &name), [1.0]);
        assert_eq!(vacancy(&export, &name)[0], term, "one vacancy per win");
        let ended_total: f64 = points(&export, metrics::LEADER_TERMS_ENDED, &[])
            .iter()
            .sum();
        assert_eq!(ended_total, term - 1.0);

        if outcome == leader::outcome::LOST {
            let pid = common::lock_rows(&observer, info.lock_id).await[0].pid;
            sqlx::query("SELECT pg_terminate_backend($1)")
                .bind(pid)
                .execute(&observer)
                .await
                .expect("terminate");
        } else {
            locks
                .release(&key)
                .await
                .expect("released through the manager");
        }
        // Stepped down from this term (and perhaps already leading the next one).
        within("the step down", state.wait_for(|l| l.info() != Some(&info)))
            .await
            .expect("campaigning");
        let export = pipeline.collect();
        assert_eq!(ended(&export, &name, outcome), [1.0], "{outcome}");
    }
    assert!(within("the resignation", election.resign()).await.is_ok());
    let export = pipeline.collect();
    assert_eq!(is_leader(&export, &name), [0.0]);
    let ended_total: f64 = points(&export, metrics::LEADER_TERMS_ENDED, &[])
        .iter()
        .sum();
    assert_eq!(
        terms(&export, &name),
        [ended_total],
        "every term won has ended"
    );
}
