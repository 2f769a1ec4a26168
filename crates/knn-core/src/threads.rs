//! The threads a CPU engine computes on.

use crate::error::{KnnError, Result};
use std::sync::Arc;

/// An engine's threads: a rayon pool of its own when a thread count was given, else rayon's
/// global pool (one thread per core). Clones share the pool.
#[derive(Clone, Debug, Default)]
pub struct Threads(Option<Arc<rayon::ThreadPool>>);

impl Threads {
    /// `threads` threads (at least one), or `None`: rayon's global pool.
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let pool = match threads {
            None => None,
            Some(t) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t.max(1))
                    .build()
                    .map_err(|e| KnnError::Option(format!("cannot start {t} threads: {e}")))?,
            )),
        };
        Ok(Threads(pool))
    }

    /// How many threads work.
    pub fn count(&self) -> usize {
        self.0
            .as_ref()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }

    /// Runs `f` on these threads (rayon's parallel iterators inside it use them).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.0 {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}
