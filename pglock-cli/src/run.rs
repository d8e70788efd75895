//! `pglock run KEY -- CMD ARGS...`: a command run under a lock, like `flock(1)`.

use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use pglock::{LockGuard, LossCause, LossSignal, PostgresLockManager};
use sqlx::PgPool;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep_until};

use crate::text::parse_duration;
use crate::{EXIT_CONFLICT, EXIT_LOST, EXIT_RUNTIME, Failure};

/// The options of `run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lock key.
    key: String,
    /// Give up waiting after DURATION (exit 75).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "no_wait")]
    timeout: Option<Duration>,
    /// Try once, without waiting (exit 75 if the lock is held).
    #[arg(long, short = 'n')]
    no_wait: bool,
    /// Take the lock in shared mode: other shared holders may run too; exclusive ones not.
    #[arg(long)]
    shared: bool,
    /// The holder id to show in pg_stat_activity and `pglock holders`.
    /// Default: {host}:{pid}:{random}.
    #[arg(long, value_name = "ID")]
    holder_id: Option<String>,
    /// The exit status when the lock is held elsewhere.
    #[arg(long, value_name = "CODE", default_value_t = EXIT_CONFLICT)]
    conflict_exit_code: u8,
    /// After the lock is lost, how long the command has to exit after SIGTERM before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    kill_after: Duration,
    /// How often to check that the server still holds the lock.
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = parse_duration)]
    probe_interval: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl RunArgs {
    /// `None`: wait as long as it takes; `Some(ZERO)`: one try.
    fn wait(&self) -> Option<Duration> {
        if self.no_wait {
            Some(Duration::ZERO)
        } else {
            self.timeout
        }
    }
}

/// Takes the lock, runs the command under it, and returns the exit code to leave with.
pub(crate) async fn run(pool: PgPool, args: &RunArgs) -> Result<u8, Failure> {
    let mut builder = PostgresLockManager::builder(pool.clone())
        .probe_interval(args.probe_interval)
        // One lock, then the process ends: keep no idle session open for a next one, so
        // closing the pool at the end does not wait for it.
        .session_idle_timeout(Duration::ZERO);
    if let Some(holder_id) = &args.holder_id {
        builder = builder.holder_id(holder_id.clone());
    }
    let locks = builder.build();
    let acquired = match args.shared {
        false => locks.acquire(args.key.as_str(), args.wait()).await,
        true => locks.acquire_shared(args.key.as_str(), args.wait()).await,
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(err) if err.is_timeout() => {
            eprintln!(
                "pglock: {:?} is held by another holder; not running the command",
                args.key
            );
            return Ok(args.conflict_exit_code);
        }
        Err(err) => return Err(Failure(EXIT_RUNTIME, err.to_string())),
    };
    // Installed before the command starts, so no signal meant for it can end pglock first.
    let mut signals = Signals::new()
        .map_err(|err| Failure(EXIT_RUNTIME, format!("cannot handle signals: {err}")))?;
    let code = match spawn(args, &guard) {
        Ok(mut child) => {
            let (status, lost) = supervise(&mut child, &mut signals, guard.loss_signal(), args)
                .await
                .map_err(|err| {
                    Failure(EXIT_RUNTIME, format!("cannot wait for the command: {err}"))
                })?;
            match lost {
                Some(_) => EXIT_LOST,
                None => exit_code(status),
            }
        }
        Err((code, message)) => {
            eprintln!("pglock: {message}");
            code
        }
    };
    release(guard).await;
    pool.close().await;
    Ok(code)
}

fn spawn(args: &RunArgs, guard: &LockGuard) -> Result<Child, (u8, String)> {
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("PGLOCK_KEY", &args.key)
        .env("PGLOCK_LOCK_ID", guard.info().lock_id.to_string())
        .env("PGLOCK_HOLDER_ID", &*guard.info().holder_id);
    command.spawn().map_err(|err| match err.kind() {
        std::io::ErrorKind::NotFound => (127, format!("command not found: {program}")),
        _ => (126, format!("cannot run {program}: {err}")),
    })
}

/// Waits for the command. If the lock is lost meanwhile, asks it to stop (SIGTERM), and kills
/// it `kill_after` later if it has not. SIGTERM and SIGHUP sent to pglock are passed on;
/// SIGINT is not (a terminal sends Ctrl-C to the command as well), and does not stop pglock,
/// which keeps the lock until the command is gone.
async fn supervise(
    child: &mut Child,
    signals: &mut Signals,
    loss: &LossSignal,
    args: &RunArgs,
) -> std::io::Result<(ExitStatus, Option<LossCause>)> {
    let mut lost = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        tokio::select! {
            status = child.wait() => return Ok((status?, lost)),
            cause = loss.lost(), if lost.is_none() => {
                eprintln!(
                    "pglock: the lock on {:?} was lost ({cause}); terminating the command",
                    args.key
                );
                signals::terminate(child);
                kill_at = Some(Instant::now() + args.kill_after);
                lost = Some(cause);
            }
            () = sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                eprintln!("pglock: the command outlived --kill-after; killing it");
                let _ = child.start_kill();
                kill_at = None;
            }
            forward = signals.next() => signals::forward(child, forward),
        }
    }
}

/// The command's exit code, or 128 + the number of the signal that ended it, as a shell says.
fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return code as u8;
    }
    #[cfg(unix)]
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        return 128u8.saturating_add(signal as u8);
    }
    EXIT_RUNTIME
}

async fn release(guard: LockGuard) {
    if guard.loss_signal().is_lost() {
        return;
    }
    if let Err(err) = guard.release().await {
        // The session is closed when a release is unconfirmed, which frees the lock anyway.
        eprintln!("pglock: warning: {err}");
    }
}

use signals::Signals;

#[cfg(unix)]
mod signals {
    use rustix::process::{Pid, Signal, kill_process};
    use tokio::process::Child;
    use tokio::signal::unix::{SignalKind, signal};

    /// The signals pglock receives while the command runs.
    pub(super) struct Signals {
        term: tokio::signal::unix::Signal,
        hup: tokio::signal::unix::Signal,
        int: tokio::signal::unix::Signal,
    }

    impl Signals {
        pub(super) fn new() -> std::io::Result<Self> {
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                hup: signal(SignalKind::hangup())?,
                int: signal(SignalKind::interrupt())?,
            })
        }

        /// The next signal to pass on, or `None` for one to swallow.
        pub(super) async fn next(&mut self) -> Option<Signal> {
            tokio::select! {
                Some(()) = self.term.recv() => Some(Signal::TERM),
                Some(()) = self.hup.recv() => Some(Signal::HUP),
                Some(()) = self.int.recv() => None,
            }
        }
    }

    pub(super) fn forward(child: &Child, signal: Option<Signal>) {
        if let Some(signal) = signal {
            send(child, signal);
        }
    }

    pub(super) fn terminate(child: &mut Child) {
        send(child, Signal::TERM);
    }

    fn send(child: &Child, signal: Signal) {
        // `id` is `None` once the child has been reaped; until then its pid cannot be reused.
        let pid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw);
        if let Some(pid) = pid {
            let _ = kill_process(pid, signal);
        }
    }
}

#[cfg(not(unix))]
mod signals {
    use tokio::process::Child;

    pub(super) struct Signals;

    impl Signals {
        pub(super) fn new() -> std::io::Result<Self> {
            Ok(Signals)
        }

        pub(super) async fn next(&mut self) -> Option<()> {
            std::future::pending().await
        }
    }

    pub(super) fn forward(_: &Child, _: Option<()>) {}

    pub(super) fn terminate(child: &mut Child) {
        let _ = child.start_kill();
    }
}
