//! Callers taking and giving back one resource as fast as they can, counting their grants: the
//! crowd a fairness test puts a newcomer in.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The running callers.
pub struct Turnover {
    grants: Grants,
    stop: CancellationToken,
    callers: tokio::task::JoinSet<()>,
}

/// What a caller tells each time it has the resource.
#[derive(Clone)]
pub struct Grants {
    count: Arc<AtomicUsize>,
    warm: Arc<watch::Sender<usize>>,
}

impl Grants {
    /// Counts one grant.
    pub fn granted(&self) {
        self.warm
            .send_replace(self.count.fetch_add(1, Ordering::SeqCst) + 1);
    }
}

impl Turnover {
    /// Starts one caller per `round`, each running its round (take the resource, call
    /// [`Grants::granted`], give it back) again and again until stopped; returns once 30
    /// grants have been made.
    pub async fn start<F, Fut>(rounds: Vec<F>) -> Turnover
    where
        F: Fn(Grants) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let (warm, mut warmed) = watch::channel(0usize);
        let grants = Grants {
            count: Arc::new(AtomicUsize::new(0)),
            warm: Arc::new(warm),
        };
        let stop = CancellationToken::new();
        let mut callers = tokio::task::JoinSet::new();
        for round in rounds {
            let (grants, stop) = (grants.clone(), stop.clone());
            callers.spawn(async move {
                while !stop.is_cancelled() {
                    round(grants.clone()).await;
                }
            });
        }
        warmed
            .wait_for(|granted| *granted >= 30)
            .await
            .expect("callers run");
        Turnover {
            grants,
            stop,
            callers,
        }
    }

    /// The grants made so far.
    pub fn grants(&self) -> usize {
        self.grants.count.load(Ordering::SeqCst)
    }

    /// Stops the callers and waits for them.
    pub async fn stop(mut self) {
        self.stop.cancel();
        while let Some(caller) = self.callers.join_next().await {
            caller.expect("a caller");
        }
    }
}
