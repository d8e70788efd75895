//! Counts the lock operations that reach each await point, through the managers' stage hook:
//! a signal a test can wait for (bounded) instead of yielding and hoping the other tasks got
//! there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pglock_testing::{Stage, StageHook};
use tokio::sync::watch;

/// How many operations reached each (stage, key).
#[derive(Clone)]
pub struct StageCounts {
    counts: Arc<watch::Sender<HashMap<(Stage, String), usize>>>,
}

impl Default for StageCounts {
    fn default() -> Self {
        StageCounts {
            counts: Arc::new(watch::channel(HashMap::new()).0),
        }
    }
}

impl StageCounts {
    /// The hook to install with a builder's `stage_hook`; it counts and never parks.
    pub fn hook(&self) -> StageHook {
        let counts = Arc::clone(&self.counts);
        Arc::new(move |stage, key| {
            counts.send_modify(|counts| *counts.entry((stage, key.to_owned())).or_default() += 1);
            Box::pin(async {})
        })
    }

    /// How many operations on `key` have reached `stage` so far.
    pub fn count(&self, stage: Stage, key: &str) -> usize {
        self.counts
            .borrow()
            .get(&(stage, key.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Waits until `n` operations on `key` have reached `stage`; panics after 10 s.
    pub async fn wait_for(&self, stage: Stage, key: &str, n: usize) {
        let mut seen = self.counts.subscribe();
        let reached =
            seen.wait_for(|counts| counts.get(&(stage, key.to_owned())).copied().unwrap_or(0) >= n);
        match tokio::time::timeout(Duration::from_secs(10), reached).await {
            Ok(Ok(_)) => {}
            _ => panic!(
                "{n} operations on {key} never reached {stage:?} (only {})",
                self.count(stage, key)
            ),
        }
    }
}
