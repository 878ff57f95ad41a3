//! Request preparation off the async workers. Reading a body, rendering the template,
//! tokenizing and compiling a grammar can take seconds for a large request; on the two async
//! workers that would stall `/health` and every other client's stream. Preparation runs on
//! tokio's blocking threads instead, at most [`PreparationPool::size`] at once; requests beyond
//! that wait without holding a worker, and the queue limit counts them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

use super::{ApiError, ApiState};

/// How many requests are prepared at once.
#[derive(Debug)]
pub struct PreparationPool {
    permits: Semaphore,
    size: usize,
    /// Requests waiting for a permit or being prepared.
    pending: AtomicUsize,
}

impl PreparationPool {
    /// A pool preparing at most `size` requests at once (at least one).
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        PreparationPool { permits: Semaphore::new(size), size, pending: AtomicUsize::new(0) }
    }

    /// The most requests prepared at once.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Requests being prepared or waiting for their turn.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

/// Runs `work` on a blocking thread once the pool has room. A panic in it is this request's
/// 500, not the server's end.
pub(crate) async fn off_workers<T, F>(state: &Arc<ApiState>, work: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&Arc<ApiState>) -> Result<T, ApiError> + Send + 'static,
{
    struct Pending<'a>(&'a AtomicUsize);
    impl Drop for Pending<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let pool = &state.preparation;
    pool.pending.fetch_add(1, Ordering::Relaxed);
    // Counted until done, however it ends (a client that leaves drops this future).
    let _pending = Pending(&pool.pending);
    let _permit = pool.permits.acquire().await.map_err(|_| ApiError::internal("the preparation pool is closed"))?;
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || work(&state))
        .await
        .map_err(|e| ApiError::internal(format!("preparing the request failed: {e}")))?
}
