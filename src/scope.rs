//! Which critical sections the running future is inside of: what tells a nested acquisition
//! (fails at once) from a sibling one (queues).
//!
//! A critical section ([`LockGuard::run`](crate::LockGuard::run), and so `with_lock`) runs its
//! body inside a task-local frame naming its holder and key. A task-local value is set only
//! while the future it wraps is being polled, so the body and everything it polls (its own
//! `join!`s included) see the frame, while sibling futures of the same task, polled next to
//! the body rather than inside it, do not. Spawned tasks start with no frame: a task is
//! another caller.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::{LockKey, LockMode};

tokio::task_local! {
    static SECTION: Option<Arc<Frame>>;
}

/// One critical section, and the one it is nested in.
struct Frame {
    holder: Arc<str>,
    key: LockKey,
    mode: LockMode,
    outer: Option<Arc<Frame>>,
}

/// Set for good by the first critical section of the process: until then no caller can be
/// inside one, and the task-local lookup (on every acquisition) is skipped.
static ANY_SECTION: AtomicBool = AtomicBool::new(false);

/// Refuses an acquisition of `key` inside a critical section of `holder` on it, where waiting
/// would wait for itself: the one home of the nesting rule.
pub(crate) fn refuse_nested(holder: &str, key: &LockKey) -> crate::Result<()> {
    if is_inside(holder, key) {
        return Err(crate::Error::Reentrant { key: key.clone() });
    }
    Ok(())
}

/// True when the caller runs inside a critical section of `holder` on `key`.
pub(crate) fn is_inside(holder: &str, key: &LockKey) -> bool {
    // Relaxed suffices: a section is entered by the task that polls it, so a caller inside one
    // runs after the store, in the same thread or after a hand-over that synchronises.
    if !ANY_SECTION.load(Ordering::Relaxed) {
        return false;
    }
    SECTION
        .try_with(|section| {
            let mut frame = section.as_deref();
            while let Some(f) = frame {
                if &*f.holder == holder && &f.key == key {
                    return true;
                }
                frame = f.outer.as_deref();
            }
            false
        })
        .unwrap_or(false)
}

/// The keys (and modes) of the critical sections of `holder` the caller runs inside, innermost
/// first: what it holds while it waits for another key (see `core/cycles/`).
pub(crate) fn held_by(holder: &str) -> Vec<(LockKey, LockMode)> {
    if !ANY_SECTION.load(Ordering::Relaxed) {
        return Vec::new();
    }
    SECTION
        .try_with(|section| {
            let mut held = Vec::new();
            let mut frame = section.as_deref();
            while let Some(f) = frame {
                if &*f.holder == holder {
                    held.push((f.key.clone(), f.mode));
                }
                frame = f.outer.as_deref();
            }
            held
        })
        .unwrap_or_default()
}

/// Runs `body` as the critical section of `holder` on `key`, held in `mode`.
pub(crate) fn inside<F: Future>(
    holder: Arc<str>,
    key: LockKey,
    mode: LockMode,
    body: F,
) -> impl Future<Output = F::Output> {
    inside_all(holder, [(key, mode)], body)
}

/// Runs `body` as the critical section of `holder` on every one of `keys` at once.
pub(crate) fn inside_all<F: Future>(
    holder: Arc<str>,
    keys: impl IntoIterator<Item = (LockKey, LockMode)>,
    body: F,
) -> impl Future<Output = F::Output> {
    ANY_SECTION.store(true, Ordering::Relaxed);
    let mut frame = SECTION.try_with(Clone::clone).ok().flatten();
    for (key, mode) in keys {
        frame = Some(Arc::new(Frame {
            holder: Arc::clone(&holder),
            key,
            mode,
            outer: frame,
        }));
    }
    SECTION.scope(frame, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn siblings_are_outside_and_nested_calls_inside() {
        let key = LockKey::from("k");
        let holder: Arc<str> = "h".into();
        assert!(!is_inside("h", &key));
        let (inner, sibling) = tokio::join!(
            inside(holder.clone(), key.clone(), LockMode::Exclusive, async {
                tokio::task::yield_now().await;
                let nested = inside("h".into(), "other".into(), LockMode::Shared, async {
                    is_inside("h", &LockKey::from("k")) && is_inside("h", &"other".into())
                })
                .await;
                nested && !is_inside("someone else", &LockKey::from("k"))
            }),
            async {
                tokio::task::yield_now().await;
                is_inside("h", &LockKey::from("k"))
            }
        );
        assert!(
            inner,
            "a nested call sees every enclosing section of its holder"
        );
        assert!(!sibling, "a sibling future is not inside the section");
        let in_task = inside(holder, key, LockMode::Exclusive, async {
            tokio::spawn(async { is_inside("h", &LockKey::from("k")) })
                .await
                .unwrap()
        })
        .await;
        assert!(!in_task, "a spawned task is another caller");
    }
}
