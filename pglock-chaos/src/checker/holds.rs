//! Holds: each granted acquisition of a lock, paired with its release, as its task saw them.

use std::collections::HashMap;

use crate::history::{Op, Outcome, Record};

/// One granted acquisition (an `acquire` or `acquire_shared` record that ended `ok`) and its
/// `release` record, if there is one: same holder, key and token.
#[derive(Debug, Clone, Copy)]
pub struct Hold<'h> {
    /// The acquisition.
    pub acquire: &'h Record,
    /// Its release; `None` when the task never got to release (its worker was killed).
    pub release: Option<&'h Record>,
}

/// How a hold ended, as its task was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// pglock confirmed the release: the lock was held from the grant until then.
    Confirmed,
    /// pglock said the lock had been lost, at some moment after the grant.
    Lost,
    /// Unknown: the release was not confirmed, or never made (a killed worker).
    Unknown,
}

impl<'h> Hold<'h> {
    /// The lock's key.
    pub fn key(&self) -> &'h str {
        &self.acquire.key
    }

    /// The task that held it.
    pub fn holder(&self) -> &'h str {
        self.acquire
            .holder
            .as_deref()
            .unwrap_or(&self.acquire.process)
    }

    /// The acquisition's fencing token.
    pub fn token(&self) -> Option<i64> {
        self.acquire.token
    }

    /// Whether it was taken in shared mode.
    pub fn is_shared(&self) -> bool {
        self.acquire.op == Op::AcquireShared
    }

    /// How it ended.
    pub fn ending(&self) -> Ending {
        match self.release.map(|r| r.outcome) {
            Some(Outcome::Ok) => Ending::Confirmed,
            Some(Outcome::Fail) => Ending::Lost,
            Some(Outcome::Info) | None => Ending::Unknown,
        }
    }

    /// For a confirmed hold, when the lock was surely held: from the acquisition's return (the
    /// task was told it had the lock) to the release's call (the task let it go). `None` for
    /// the others, which may have lost the lock at any moment after the grant.
    pub fn surely_held(&self) -> Option<(u64, u64)> {
        let release = self.release.filter(|r| r.outcome == Outcome::Ok)?;
        Some((self.acquire.end_us, release.start_us))
    }

    /// When the grant surely happened: between the acquisition's call and its return.
    pub fn granted_within(&self) -> (u64, u64) {
        (self.acquire.start_us, self.acquire.end_us)
    }

    /// Whether two holds cannot both hold the key at once: not both shared.
    pub fn excludes(&self, other: &Hold<'_>) -> bool {
        !(self.is_shared() && other.is_shared())
    }
}

/// Every granted acquisition of `history`, each with its release, in the history's order.
pub fn holds(history: &[Record]) -> Vec<Hold<'_>> {
    let mut releases: HashMap<(Option<&str>, &str, Option<i64>), &Record> = HashMap::new();
    for release in history.iter().filter(|r| r.op == Op::Release) {
        let pair = (
            release.holder.as_deref(),
            release.key.as_str(),
            release.token,
        );
        let kept = releases.entry(pair).or_insert(release);
        // A settled history has one record per release; should there be more, a known
        // outcome outweighs an unknown one.
        if kept.outcome == Outcome::Info {
            *kept = release;
        }
    }
    history
        .iter()
        .filter(|r| matches!(r.op, Op::Acquire | Op::AcquireShared) && r.outcome == Outcome::Ok)
        .map(|acquire| Hold {
            acquire,
            release: releases
                .get(&(
                    acquire.holder.as_deref(),
                    acquire.key.as_str(),
                    acquire.token,
                ))
                .copied(),
        })
        .collect()
}

/// How the granted acquisitions of a history ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldCounts {
    /// Granted acquisitions.
    pub granted: usize,
    /// Of them, released with confirmation.
    pub confirmed: usize,
    /// Lost, as pglock told their tasks.
    pub lost: usize,
    /// Released without confirmation, or never released.
    pub unknown: usize,
    /// Acquisitions whose outcome is unknown (an error or a timeout, a killed worker).
    pub unknown_acquisitions: usize,
}

impl HoldCounts {
    /// The counts of `holds`, and of the unknown acquisitions in `history`.
    pub fn of(history: &[Record], holds: &[Hold<'_>]) -> HoldCounts {
        let mut counts = HoldCounts {
            granted: holds.len(),
            unknown_acquisitions: history
                .iter()
                .filter(|r| r.op.is_lock() && r.op != Op::Release && r.outcome == Outcome::Info)
                .count(),
            ..HoldCounts::default()
        };
        for hold in holds {
            match hold.ending() {
                Ending::Confirmed => counts.confirmed += 1,
                Ending::Lost => counts.lost += 1,
                Ending::Unknown => counts.unknown += 1,
            }
        }
        counts
    }
}
