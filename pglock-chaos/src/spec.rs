//! What a worker process is told, as command-line arguments, and how the run is tuned.

use std::time::Duration;

/// How the workload protects its work: the checked way, or one of two negative controls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Fenced as the guide teaches: sections that run as the lock's critical section (cancelled
    /// when it goes) and whose writes are fenced, counters raised before the read, leader work
    /// under `run_as_leader` with fenced appends.
    Safe,
    /// The first negative control, the fence taken away: counters checked on the write alone,
    /// and sections and leader work that ignore the loss of their lock and write their end (and
    /// appends) unfenced. The lock itself is sound.
    Unsafe,
    /// The second negative control, the lock broken: the workload of [`Mode::Safe`], through a
    /// manager that takes every exclusive lock in shared mode
    /// ([`ExclusiveAsShared`](crate::broken::ExclusiveAsShared)). The fences are sound.
    BrokenLock,
}

impl Mode {
    /// The mode's name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Safe => "safe",
            Mode::Unsafe => "unsafe",
            Mode::BrokenLock => "broken-lock",
        }
    }

    /// The mode named `text`.
    pub fn parse(text: &str) -> Option<Mode> {
        [Mode::Safe, Mode::Unsafe, Mode::BrokenLock]
            .into_iter()
            .find(|mode| mode.as_str() == text)
    }

    /// Whether the workload writes through the fence (all but [`Mode::Unsafe`]).
    pub fn is_fenced(self) -> bool {
        self != Mode::Unsafe
    }
}

/// The lock managers' settings: short, so faults are noticed quickly.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// `probe_interval` of every manager.
    pub probe: Duration,
    /// `probe_grace` of every manager.
    pub grace: Duration,
    /// The silent-holder bound (`silence_timeout`); `None` turns it off.
    pub silence: Option<Duration>,
}

impl Default for Timing {
    fn default() -> Timing {
        Timing {
            probe: Duration::from_millis(150),
            grace: Duration::from_millis(300),
            // Short, so a holder frozen or cut off for longer loses its locks to the others
            // within the run; the probe (a ping that keeps healthy sessions heard) is well
            // under a quarter of it.
            silence: Some(Duration::from_secs(2)),
        }
    }
}

/// A worker's orders.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// The worker's name in the history: `w1`, `w2`, ...
    pub name: String,
    /// The pid of the process that spawned it: any other parent means stray arguments.
    pub parent: u32,
    /// The port of the worker's proxy to the lock server.
    pub lock_port: u16,
    /// The fenced resource's database.
    pub resource_url: String,
    /// The run's table prefix.
    pub prefix: String,
    /// Tasks in the process.
    pub tasks: u32,
    /// The worker's random seed.
    pub seed: u64,
    /// How the work is protected.
    pub mode: Mode,
    /// The managers' settings.
    pub timing: Timing,
}

impl WorkerSpec {
    /// The spec as arguments after the program name (`--worker NAME ...`).
    pub fn to_args(&self) -> Vec<String> {
        let silence = self.timing.silence.map_or(0, |s| s.as_millis());
        [
            ("--worker", self.name.clone()),
            ("--parent", self.parent.to_string()),
            ("--lock-port", self.lock_port.to_string()),
            ("--resource-url", self.resource_url.clone()),
            ("--prefix", self.prefix.clone()),
            ("--tasks", self.tasks.to_string()),
            ("--seed", self.seed.to_string()),
            ("--mode", self.mode.as_str().to_owned()),
            ("--probe-ms", self.timing.probe.as_millis().to_string()),
            ("--grace-ms", self.timing.grace.as_millis().to_string()),
            ("--silence-ms", silence.to_string()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value])
        .collect()
    }

    /// Reads a spec written by [`to_args`](Self::to_args).
    ///
    /// # Errors
    ///
    /// A message naming the missing or malformed argument.
    pub fn from_args(args: &[String]) -> Result<WorkerSpec, String> {
        let get = |flag: &str| -> Result<&str, String> {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .map(String::as_str)
                .ok_or_else(|| format!("missing {flag}"))
        };
        let num = |flag: &str| -> Result<u64, String> {
            get(flag)?.parse().map_err(|_| format!("bad {flag}"))
        };
        let silence = num("--silence-ms")?;
        Ok(WorkerSpec {
            name: get("--worker")?.to_owned(),
            parent: num("--parent")? as u32,
            lock_port: num("--lock-port")? as u16,
            resource_url: get("--resource-url")?.to_owned(),
            prefix: get("--prefix")?.to_owned(),
            tasks: num("--tasks")? as u32,
            seed: num("--seed")?,
            mode: Mode::parse(get("--mode")?).ok_or("bad --mode")?,
            timing: Timing {
                probe: Duration::from_millis(num("--probe-ms")?),
                grace: Duration::from_millis(num("--grace-ms")?),
                silence: (silence > 0).then(|| Duration::from_millis(silence)),
            },
        })
    }
}

/// The run's fixed names, shared by the parent (which creates the tables) and the workers.
pub mod names {
    /// Keys of the critical sections.
    pub const SECTIONS: [&str; 2] = ["section:0", "section:1"];
    /// Keys of the counters (the counter row's key is the lock key).
    pub const COUNTERS: [&str; 2] = ["counter:0", "counter:1"];
    /// The leadership's name; its lock key and fenced log key are `leader:chaos`.
    pub const LEADER: &str = "chaos";
    /// The fenced log's key (the election's lock key).
    pub const LOG: &str = "leader:chaos";
    /// The scheduled job's name.
    pub const JOB: &str = "chaos-job";
    /// The scheduled job's period.
    pub const JOB_PERIOD: std::time::Duration = std::time::Duration::from_secs(1);

    /// The run's fencing table.
    pub fn fencing_table(prefix: &str) -> String {
        format!("{prefix}_fencing")
    }

    /// The run's job table.
    pub fn job_table(prefix: &str) -> String {
        format!("{prefix}_jobs")
    }
}
