//! Cutovers from separate operating-system processes (this test binary, run again as a child)
//! on one PostgreSQL: two at once, exactly one succeeds; and one killed mid-cutover leaves
//! nothing that the next cutover does not repair.

mod common;

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use common::child::ChildOutput;
use common::{Harness, SOURCE, TARGET, TestLag, TestStores};
use common::{eventually, lock_rows, observer, pool_named};
use pglock::{LockManagerExt, PostgresLockManager};
use pglock_migration::{
    AuditEvent, BoxError, CutoverFailure, CutoverManager, MigrationConfig, MigrationPhase,
    PostgresMigrationStore, RoutingState, SyncLag, WriteGate,
};
use uuid::Uuid;

/// The child's role, passed on its command line (libtest takes it for a filter that matches no
/// test): an argument, unlike an environment variable, cannot leak into the test run that
/// spawns the child and turn that run into a child.
const ROLE: &str = "pglock-test-cutover-child=";

/// The child spec (`schema,migration`), when this process is a child spawned by a test.
fn child_role() -> Option<String> {
    std::env::args().find_map(|arg| arg.strip_prefix(ROLE).map(str::to_owned))
}

/// A lag source for the child: on its first call it says `IN_CUTOVER` (the child then holds
/// the cutover lock and the gate, in `cutover`) and waits for a line on stdin.
#[derive(Debug, Default)]
struct ParkedOnStdin {
    called: AtomicBool,
}

#[async_trait]
impl SyncLag for ParkedOnStdin {
    async fn lag(&self, _: Uuid, _: &str, _: &str) -> Result<Option<u64>, BoxError> {
        if self.called.swap(true, Ordering::SeqCst) {
            return Ok(Some(0));
        }
        println!("IN_CUTOVER");
        std::io::stdout().flush()?;
        tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| ())
        })
        .await??;
        Ok(Some(0))
    }
}

/// The child's side: cut the migration over, parked in the lag check until told to go on (or
/// killed), then report the result and exit.
async fn act_as_child(spec: &str) -> ! {
    let mut parts = spec.split(',');
    let (schema, migration) = (parts.next().unwrap(), parts.next().unwrap());
    let migration: Uuid = migration.parse().unwrap();
    let app = common::app_name("child");
    let store = PostgresMigrationStore::with_schema(pool_named(4, &app).await, schema).unwrap();
    let locks = PostgresLockManager::new(pool_named(4, &app).await);
    let cutover = CutoverManager::new(Arc::new(locks), Arc::new(store), TestStores::new());
    let result = cutover
        .execute_cutover(migration, &ParkedOnStdin::default())
        .await;
    println!("RESULT success={}", result.is_ok());
    std::io::stdout().flush().unwrap();
    std::process::exit(0);
}

/// Runs this test binary again as a child that cuts `migration` over, and returns it once it
/// is inside the cutover.
fn spawn_child(test_name: &str, schema: &str, migration: Uuid) -> (Child, ChildOutput) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .arg(format!("{ROLE}{schema},{migration}"))
        .env("DATABASE_URL", common::url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the child process");
    let lines = ChildOutput::read(child.stdout.take().expect("stdout"));
    lines.until("IN_CUTOVER");
    (child, lines)
}

#[tokio::test]
async fn two_processes_cut_over_at_once_and_exactly_one_succeeds() {
    if let Some(spec) = child_role() {
        act_as_child(&spec).await;
    }
    let h = Harness::postgres().await;
    let schema = h.schema().unwrap().to_owned();
    let tenant = Uuid::new_v4();
    // The child stays parked in its locked section while this process sets up: a budget that
    // outlasts the test's own waits, however loaded the machine.
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let (mut child, child_out) = spawn_child(
        "two_processes_cut_over_at_once_and_exactly_one_succeeds",
        &schema,
        m.id,
    );

    // This process cuts over too, and waits on the server for the child's lock.
    let p = h.process("parent").await;
    let cutover = CutoverManager::builder(p.locks.clone(), p.store.clone(), TestStores::new())
        .lock_timeout(Duration::from_secs(30))
        .build();
    let lag = TestLag::fixed(Some(0));
    let mine = tokio::spawn({
        let lag = lag.clone();
        async move { cutover.execute_cutover(m.id, &*lag).await }
    });
    let observer = observer().await;
    let lock_id = pglock::lock_id(&CutoverManager::lock_key(tenant));
    eventually(
        "this process waits for the child's cutover lock",
        || async {
            lock_rows(&observer, lock_id)
                .await
                .iter()
                .any(|row| !row.granted)
        },
    )
    .await;

    writeln!(child.stdin.take().unwrap(), "go").unwrap();
    let report = child_out.until("RESULT success=");
    assert!(report.trim_end().ends_with("success=true"), "{report:?}");
    assert!(child.wait().unwrap().success());
    let mine = common::within("this process's cutover", mine)
        .await
        .unwrap();

    let mine = mine.expect_err("the child cut over first");
    assert_eq!(mine.failure, CutoverFailure::AlreadyMigrated);
    assert!(!mine.rolled_back);
    assert_eq!(lag.calls(), 0);
    assert_eq!(
        h.audit(m.id).await,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged,
            AuditEvent::CutoverInitiated,
            AuditEvent::CutoverCompleted
        ]
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::Migrated, TARGET)
    );
}

#[tokio::test]
async fn a_process_killed_mid_cutover_is_repaired_by_the_next_cutover() {
    if let Some(spec) = child_role() {
        act_as_child(&spec).await;
    }
    let h = Harness::postgres().await;
    let schema = h.schema().unwrap().to_owned();
    let tenant = Uuid::new_v4();
    // The child stays parked in its locked section while this process sets up: a budget that
    // outlasts the test's own waits, however loaded the machine.
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let (mut child, _out) = spawn_child(
        "a_process_killed_mid_cutover_is_repaired_by_the_next_cutover",
        &schema,
        m.id,
    );
    child.kill().expect("SIGKILL the child mid-cutover");
    child.wait().unwrap();

    // The server freed its locks; its state is left behind.
    let p = h.process("next").await;
    for key in [CutoverManager::lock_key(tenant), WriteGate::key(tenant)] {
        let guard = p
            .locks
            .acquire(&key, Some(Duration::from_secs(15)))
            .await
            .expect("the killed process's locks are freed by the server");
        guard.release().await.unwrap();
    }
    let stuck = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stuck.phase, MigrationPhase::Cutover);
    let crashed = stuck.cutover_attempt.expect("the child's attempt");
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::CutoverPaused, SOURCE)
    );
    assert_eq!(
        routing.write_stores(),
        [SOURCE, TARGET],
        "writers keep dual-writing"
    );

    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());
    let result = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(0)))
        .await;

    assert!(result.is_ok(), "{result:?}");
    let log = h.store.audit_log(m.id).await.unwrap();
    let events: Vec<AuditEvent> = log.iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged,
            AuditEvent::CutoverInitiated,
            AuditEvent::CutoverRolledBack,
            AuditEvent::CutoverInitiated,
            AuditEvent::CutoverCompleted
        ]
    );
    assert_eq!(log[3].cutover_attempt, Some(crashed));
    assert_eq!(log[4].cutover_attempt, Some(crashed));
    assert!(
        log[4]
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with(&format!("Cutover attempt {crashed} was interrupted"))),
        "{:?}",
        log[4].message
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::Migrated, TARGET)
    );
    assert_eq!(p.locks.held_lock_count(), 0);
}
