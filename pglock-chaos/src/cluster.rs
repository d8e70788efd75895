//! The lock server under the nemesis: a private primary with a synchronous streaming standby,
//! reached by the workers through proxies the run controls. It restarts, fails over to the
//! standby (the proxies follow the new primary), and a new standby is then made of it.
//!
//! Commits are synchronous (locally and on the standby), so neither a crash nor a failover
//! loses a committed fencing token or job claim: what the run checks is the lock library, not
//! a configuration that is documented to lose commits.

use std::io;
use std::sync::{Arc, Mutex};

use pglock_testing::TempPostgres;

/// The primary and its standby.
#[derive(Debug)]
pub struct Cluster {
    servers: Mutex<Servers>,
}

#[derive(Debug)]
struct Servers {
    primary: Arc<TempPostgres>,
    standby: Option<Arc<TempPostgres>>,
}

impl Cluster {
    /// Starts a primary and a synchronous standby. Blocking: call from `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// When a server cannot be started.
    pub fn start() -> io::Result<Cluster> {
        Cluster::start_with(true)
    }

    /// Starts a primary, and a synchronous standby if `standby` (a run without failovers can do
    /// without, and starts a few seconds sooner). Blocking: call from `spawn_blocking`.
    ///
    /// # Errors
    ///
    /// When a server cannot be started.
    pub fn start_with(standby: bool) -> io::Result<Cluster> {
        let primary = Arc::new(TempPostgres::start()?);
        primary.configure("synchronous_commit", "on")?;
        let standby = if standby {
            Some(attach_standby(&primary)?)
        } else {
            None
        };
        Ok(Cluster {
            servers: Mutex::new(Servers { primary, standby }),
        })
    }

    /// The current primary.
    pub fn primary(&self) -> Arc<TempPostgres> {
        self.lock().primary.clone()
    }

    /// Whether a standby is ready to take over.
    pub fn has_standby(&self) -> bool {
        self.lock().standby.is_some()
    }

    /// Crashes the primary (an immediate stop). Blocking.
    ///
    /// # Errors
    ///
    /// When `pg_ctl` fails.
    pub fn crash_primary(&self) -> io::Result<()> {
        self.primary().stop_immediately()
    }

    /// Starts the crashed primary again. Blocking.
    ///
    /// # Errors
    ///
    /// When `pg_ctl` fails.
    pub fn restart_primary(&self) -> io::Result<()> {
        self.primary().start_again()
    }

    /// Crashes the primary and promotes the standby, which becomes the primary; returns its
    /// port. Blocking.
    ///
    /// # Errors
    ///
    /// When there is no standby, or a step fails.
    pub fn fail_over(&self) -> io::Result<u16> {
        let (old, standby) = {
            let mut servers = self.lock();
            let standby = servers
                .standby
                .take()
                .ok_or_else(|| io::Error::other("no standby"))?;
            (servers.primary.clone(), standby)
        };
        old.stop_immediately()?;
        standby.promote()?;
        let port = standby.port();
        let old = std::mem::replace(&mut self.lock().primary, standby);
        // Deleted now (a long run fails over many times); a fault that still holds it
        // keeps it until that fault ends.
        drop(old);
        Ok(port)
    }

    /// Makes a new synchronous standby of the current primary, for the next failover.
    /// Blocking.
    ///
    /// # Errors
    ///
    /// When the base backup or the start fails.
    pub fn rebuild_standby(&self) -> io::Result<()> {
        let primary = self.primary();
        let standby = attach_standby(&primary)?;
        self.lock().standby = Some(standby);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Servers> {
        self.servers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A streaming standby of `primary`, made synchronous only once it runs: the base backup
/// copies the primary's settings, and a standby that inherited `synchronous_standby_names`
/// would, once promoted, wait for a standby of its own that does not exist.
fn attach_standby(primary: &TempPostgres) -> io::Result<Arc<TempPostgres>> {
    primary.configure("synchronous_standby_names", "")?;
    let standby = Arc::new(primary.start_standby()?);
    primary.configure("synchronous_standby_names", "*")?;
    Ok(standby)
}
