//! The base set the bindings search: a [`knn::Index`] behind a pointer that `add` swaps.
//!
//! Calls take a snapshot (`Arc<Index>`) and run on it without holding a lock, so no call ever
//! waits for a lock while it holds the GIL, and `add` (which builds the grown index aside)
//! waits for no search.

use knn::given::Given;
use knn::{Device, Index, KnnError, MatrixRef, Metric, Neighbors, Options, Result, Rows, Symmetry};
use std::sync::{Arc, Mutex};

/// An index and the options it was built with.
pub struct Base {
    current: Mutex<Arc<Index>>,
    /// Held while rows are added, so that two `add` calls both land.
    adding: Mutex<()>,
    opts: Options,
}

impl Base {
    /// Checks and prepares `rows` (`rows.len() / dim` points) and opens the engine of `opts`.
    pub fn new(rows: Rows, dim: usize, metric: Metric, opts: Options) -> Result<Self> {
        let index = Index::new(rows, dim, metric, &opts)?;
        Ok(Self {
            current: Mutex::new(Arc::new(index)),
            adding: Mutex::new(()),
            opts,
        })
    }

    /// The index as it is now.
    pub fn snapshot(&self) -> Arc<Index> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Appends rows (checked like the base): a grown index is built from all the rows, then
    /// takes the place of the current one. Ids continue from the current length.
    pub fn add(&self, rows: MatrixRef<'_>) -> Result<()> {
        let _one_at_a_time = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        let index = self.snapshot();
        if rows.dim() != index.dim() {
            return Err(KnnError::Option(format!(
                "the added rows have d={}, the index has d={}",
                rows.dim(),
                index.dim()
            )));
        }
        index.metric().check_domain("added rows", rows)?;
        let all = index.rows().append(Given::F32(rows.as_slice()));
        let grown = Index::new(all, index.dim(), index.metric().clone(), &self.opts)?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(grown);
        Ok(())
    }

    /// The kNN graph of `index` with pairs computed once where `symmetric` says: the index
    /// itself for `Auto` (its options), else an index of the same rows with that setting.
    pub fn graph(&self, index: &Index, k: usize, symmetric: Symmetry) -> Result<Neighbors> {
        if symmetric == self.opts.symmetric {
            return index.graph(k);
        }
        let opts = Options {
            symmetric,
            ..self.opts.clone()
        };
        Index::new(
            index.rows().clone(),
            index.dim(),
            index.metric().clone(),
            &opts,
        )?
        .graph(k)
    }

    /// The device of the index (`Auto` resolved).
    pub fn device(&self) -> Device {
        self.snapshot().device()
    }
}
