//! `pglock terminate`: ends the holders of a lock, only after a yes at a terminal or `--yes`,
//! refuses without either, never touches waiters or other locks, and says so in its exit
//! status.

mod common;

use std::fs::File;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::cli::{output, pglock_on_db, stderr, stdout};
use common::{app_name, eventually, key, lock_rows, observer};
use pglock::{LockGuard, LossCause, PostgresLockManager, lock_id};
use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};

/// A pseudo-terminal: the command reads the slave as its stdin, the test types into the master.
struct Terminal {
    master: File,
    slave: File,
}

impl Terminal {
    fn open() -> Terminal {
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("open a pty");
        grantpt(&master).expect("grantpt");
        unlockpt(&master).expect("unlockpt");
        let name = ptsname(&master, Vec::new()).expect("ptsname");
        let slave = File::options()
            .read(true)
            .write(true)
            .open(name.to_str().expect("a path"))
            .expect("open the slave");
        Terminal {
            master: File::from(master),
            slave,
        }
    }

    /// Runs `command` with the terminal as its stdin, answering `answer` to its question.
    async fn answer(mut self, mut command: Command, answer: &str) -> Output {
        command.stdin(Stdio::from(self.slave.try_clone().expect("dup")));
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let child = command.spawn().expect("run pglock");
        // The terminal keeps the line until the command reads it.
        writeln!(self.master, "{answer}").expect("type the answer");
        tokio::task::spawn_blocking(move || {
            let output = child.wait_with_output().expect("wait");
            drop(self);
            output
        })
        .await
        .expect("join")
    }
}

async fn holder(label: &str, key: &str) -> (PostgresLockManager, LockGuard, String) {
    let app = app_name(label);
    let locks = common::manager_for(common::pool_named(2, &app).await, &app)
        .probe_interval(Duration::from_millis(100))
        .build();
    let guard = locks.acquire(key, None).await.expect("acquire");
    (locks, guard, app)
}

#[tokio::test]
async fn it_refuses_without_a_terminal_or_yes_and_asks_at_a_terminal() {
    let observer = observer().await;
    let key = key("cli-terminate-ask");
    let (_locks, guard, app) = holder("cli-term-ask", &key).await;

    // No terminal, no --yes: refused before anything is done.
    let mut command = pglock_on_db(&["terminate", &key]);
    command.stdin(Stdio::null());
    let out = output(command).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stdin is not a terminal; pass --yes"),
        "{}",
        stderr(&out)
    );

    // At a terminal, "no" (or anything but yes) declines.
    for answer in ["n", "", "sure"] {
        let out = Terminal::open()
            .answer(pglock_on_db(&["terminate", &key]), answer)
            .await;
        assert_eq!(out.status.code(), Some(4), "{answer:?}: {}", stderr(&out));
        let said = stderr(&out);
        assert!(said.contains(&app), "the holder was shown: {said}");
        assert!(said.contains("Terminate 1 session(s) above"), "{said}");
        assert!(out.stdout.is_empty());
    }
    assert!(!guard.loss_signal().is_lost());
    assert_eq!(
        lock_rows(&observer, lock_id(&key)).await.len(),
        1,
        "still held"
    );

    // "y" ends the holder: its lock is freed, and its manager hears of it.
    let out = Terminal::open()
        .answer(pglock_on_db(&["terminate", &key]), "y")
        .await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let pid = stdout(&out)
        .strip_prefix("terminated pid ")
        .and_then(|rest| rest.trim().parse::<i32>().ok())
        .expect("the terminated pid");
    assert!(pid > 0);
    let cause = tokio::time::timeout(Duration::from_secs(10), guard.loss_signal().lost())
        .await
        .expect("the holder learns of it");
    assert_eq!(cause, LossCause::NotOnServer);
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

#[tokio::test]
async fn yes_ends_only_matching_holders_of_that_lock() {
    let observer = observer().await;
    let key = key("cli-terminate-yes");
    let (_locks, guard, _) = holder("cli-term-yes", &key).await;
    // A waiter for the same lock, and a holder of another lock: never touched.
    let waiter_app = app_name("cli-term-waiter");
    let waiter = common::manager_for(common::pool_named(2, &waiter_app).await, &waiter_app).build();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.acquire(&key, Some(Duration::from_secs(60))).await }
    });
    eventually("the waiter is queued", || async {
        lock_rows(&observer, lock_id(&key)).await.len() == 2
    })
    .await;
    let other_key = key.replace("yes", "other");
    let (_other_locks, other, _) = holder("cli-term-other", &other_key).await;

    // Filters that match no holder: nothing to do, exit 3.
    for filters in [
        &["--holder", "nobody-*"][..],
        &["--pid", "1"][..],
        &["--older-than", "1h"][..],
    ] {
        let mut args = vec!["terminate", key.as_str(), "--yes"];
        args.extend_from_slice(filters);
        let out = output(pglock_on_db(&args)).await;
        assert_eq!(out.status.code(), Some(3), "{filters:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("nothing to terminate"));
    }
    assert!(!guard.loss_signal().is_lost());

    // Unfiltered: every holder of the lock, and only holders.
    let out = output(pglock_on_db(&["terminate", &key, "--yes"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    tokio::time::timeout(Duration::from_secs(10), guard.loss_signal().lost())
        .await
        .expect("the holder was ended");
    // The waiter got the lock; the other lock's holder never noticed anything.
    let next = waiting.await.expect("join").expect("the waiter takes over");
    assert!(!next.loss_signal().is_lost() && !other.loss_signal().is_lost());
    next.release().await.expect("release");
    other.release().await.expect("release");

    // A free lock: nothing to terminate.
    let out = output(pglock_on_db(&["terminate", &key, "--yes"])).await;
    assert_eq!(out.status.code(), Some(3));
}

#[tokio::test]
async fn it_says_how_many_other_locks_end_with_the_session_before_it_asks() {
    let key = key("cli-terminate-shared");
    let (locks, guard, _) = holder("cli-term-shared", &key).await;
    // Two more locks on the same lock session: terminating it for one lock ends all three.
    let others = [
        locks
            .acquire(key.replace("shared", "shared-2"), None)
            .await
            .expect("acquire"),
        locks
            .acquire(key.replace("shared", "shared-3"), None)
            .await
            .expect("acquire"),
    ];
    let out = Terminal::open()
        .answer(pglock_on_db(&["terminate", &key]), "n")
        .await;
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("these sessions also hold 2 other advisory lock(s), which end with them"),
        "{said}"
    );
    assert!(
        said.contains("2 other advisory lock(s) included? [y/N]"),
        "{said}"
    );

    let out = output(pglock_on_db(&["terminate", &key, "--yes"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("also hold 2 other"),
        "{}",
        stderr(&out)
    );
    for signal in [guard.loss_signal()]
        .into_iter()
        .chain(others.iter().map(LockGuard::loss_signal))
    {
        tokio::time::timeout(Duration::from_secs(10), signal.lost())
            .await
            .expect("every lock of the session is reported lost");
    }
}
