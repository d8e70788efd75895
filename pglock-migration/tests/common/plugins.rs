//! Scriptable plug-ins: a store registry and a sync lag.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use pglock_migration::{BoxError, StoreRegistry, SyncLag};
use tokio::sync::{Notify, Semaphore};
use uuid::Uuid;

use super::{SOURCE, TARGET};

/// A store registry that knows SOURCE and TARGET (or what it is told), each healthy
/// unless told otherwise.
#[derive(Debug, Default)]
pub struct TestStores {
    known: Mutex<HashSet<String>>,
    unhealthy: Mutex<HashMap<String, String>>,
}

impl TestStores {
    pub fn new() -> Arc<TestStores> {
        TestStores::with(&[SOURCE, TARGET])
    }

    pub fn with(ids: &[&str]) -> Arc<TestStores> {
        let stores = TestStores::default();
        stores
            .known
            .lock()
            .unwrap()
            .extend(ids.iter().map(|id| id.to_string()));
        Arc::new(stores)
    }

    pub fn set_unhealthy(&self, id: &str, message: &str) {
        self.unhealthy
            .lock()
            .unwrap()
            .insert(id.to_owned(), message.to_owned());
    }
}

#[async_trait]
impl StoreRegistry for TestStores {
    fn is_registered(&self, store_id: &str) -> bool {
        self.known.lock().unwrap().contains(store_id)
    }

    async fn check_health(&self, store_id: &str) -> Result<(), BoxError> {
        match self.unhealthy.lock().unwrap().get(store_id) {
            Some(message) => Err(message.clone().into()),
            None => Ok(()),
        }
    }
}

/// A scriptable sync lag: scripted answers first, then a default; optionally slow, or
/// parked on its next call until the test lets it go.
#[derive(Default)]
pub struct TestLag {
    script: Mutex<VecDeque<Option<u64>>>,
    default: Mutex<Option<u64>>,
    delay: Mutex<Option<Duration>>,
    hold: Mutex<Option<Hold>>,
    calls: AtomicUsize,
}

impl fmt::Debug for TestLag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestLag")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// The test's side of a parked lag call.
#[derive(Clone)]
pub struct Hold {
    reached: Arc<Notify>,
    release: Arc<Semaphore>,
}

impl Hold {
    /// Completes once a call is parked; panics after 30 s, so a test whose cutover never
    /// gets there fails instead of hanging.
    pub async fn reached(&self) {
        let reached = self.reached.notified();
        if tokio::time::timeout(Duration::from_secs(30), reached)
            .await
            .is_err()
        {
            panic!("no lag call parked within 30 s");
        }
    }

    /// Lets the parked call answer.
    pub fn release(&self) {
        self.release.add_permits(1);
    }
}

impl TestLag {
    /// Always answers `lag` (`None`: cannot be calculated).
    pub fn fixed(lag: Option<u64>) -> Arc<TestLag> {
        let test = TestLag::default();
        *test.default.lock().unwrap() = lag;
        Arc::new(test)
    }

    /// Answers these first, one per call.
    pub fn script(&self, answers: &[Option<u64>]) {
        self.script.lock().unwrap().extend(answers.iter().copied());
    }

    /// Takes `delay` before each answer (a slow lag source, not a synchronisation).
    pub fn slow(&self, delay: Duration) {
        *self.delay.lock().unwrap() = Some(delay);
    }

    /// Parks the next call until the returned hold is released.
    pub fn hold_next(&self) -> Hold {
        let hold = Hold {
            reached: Arc::new(Notify::new()),
            release: Arc::new(Semaphore::new(0)),
        };
        *self.hold.lock().unwrap() = Some(hold.clone());
        hold
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl SyncLag for TestLag {
    async fn lag(&self, _: Uuid, _: &str, _: &str) -> Result<Option<u64>, BoxError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hold = self.hold.lock().unwrap().take();
        if let Some(hold) = hold {
            hold.reached.notify_one();
            hold.release.acquire().await.expect("open").forget();
        }
        let delay = *self.delay.lock().unwrap();
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        let scripted = self.script.lock().unwrap().pop_front();
        Ok(scripted.unwrap_or(*self.default.lock().unwrap()))
    }
}
