//! The base set the bindings search: a [`knn::Index`] behind a pointer that `add` swaps.
//!
//! Calls take a snapshot (`Arc<Index>`) and run on it without holding a lock, so no call ever
//! waits for a lock while it holds the GIL, and `add` (which builds the grown index aside)
//! waits for no search.

use knn::given::{round_to_f32, Given};
use knn::{
    Device, DeviceResults, Index, KnnError, MatrixRef, Metric, Neighbors, Options, Result, Rows,
    Symmetry,
};
use std::sync::{Arc, Mutex};

/// Neighbours with their distances in the precision of the rows they came from: f32, or f64
/// for rows given in f64.
pub enum Found {
    F32(Neighbors),
    F64(Neighbors<f64>),
}

/// An index and the options it was built with.
pub struct Base {
    current: Mutex<Arc<Index>>,
    /// Held while rows are added, so that two `add` calls both land.
    adding: Mutex<()>,
    opts: Options,
}

impl Base {
    /// Checks and prepares `rows` (`rows.len() / dim` points, f32 or f64) and opens the engine
    /// of `opts`.
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

    /// Appends `rows` (`dim` values each, checked like the base): a grown index is built from
    /// all the rows, then takes the place of the current one. Ids continue from the current
    /// length. Rows given in f64 stay f64 (an index of f32 rows keeps f64 ones from then on,
    /// its f32 rows widened exactly), as [`Index::add_f64`] does.
    pub fn add(&self, rows: Given<'_>, dim: usize) -> Result<()> {
        let _one_at_a_time = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        let index = self.snapshot();
        if dim != index.dim() {
            return Err(KnnError::Option(format!(
                "the added rows have d={dim}, the index has d={}",
                index.dim()
            )));
        }
        let rounded;
        let checked = match rows {
            Given::F32(v) => MatrixRef::new("added rows", v, dim)?,
            Given::F64(v) => {
                rounded = round_to_f32("added rows", v, dim)?;
                MatrixRef::new_unchecked_values("added rows", &rounded, dim)?
            }
        };
        index.metric().check_domain("added rows", checked)?;
        let all = index.rows().append(rows);
        let grown = Index::new(all, index.dim(), index.metric().clone(), &self.opts)?;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(grown);
        Ok(())
    }

    /// The kNN graph of `index` with pairs computed once where `symmetric` says (see
    /// [`Base::with_symmetry`]). Distances in f64 when the rows were given in f64.
    pub fn graph(&self, index: &Index, k: usize, symmetric: Symmetry) -> Result<Found> {
        let other = self.with_symmetry(index, symmetric)?;
        let index = other.as_ref().unwrap_or(index);
        match index.rows().given() {
            Given::F32(_) => index.graph(k).map(Found::F32),
            Given::F64(_) => index
                .graph_rows_f64(0..index.len(), k, &|_, _| {})
                .map(Found::F64),
        }
    }

    /// [`Base::graph`] of f32 rows written to GPU memory (see [`Index::graph_device`]).
    ///
    /// # Safety
    /// As [`Index::graph_device`].
    pub unsafe fn graph_device(
        &self,
        index: &Index,
        (k, symmetric): (usize, Symmetry),
        (device, stream): (usize, u64),
        out: DeviceResults,
    ) -> Result<()> {
        let other = self.with_symmetry(index, symmetric)?;
        let index = other.as_ref().unwrap_or(index);
        // SAFETY: as the caller vouches.
        unsafe { index.graph_device(k, device, stream, out) }
    }

    /// `None` when `index` computes graphs with the `symmetric` setting (its options), else
    /// an index of the same rows with that setting (the engines take it when they are made).
    fn with_symmetry(&self, index: &Index, symmetric: Symmetry) -> Result<Option<Index>> {
        if symmetric == self.opts.symmetric {
            return Ok(None);
        }
        let opts = Options {
            symmetric,
            ..self.opts.clone()
        };
        let rows = index.rows().clone();
        Index::new(rows, index.dim(), index.metric().clone(), &opts).map(Some)
    }

    /// The device of the index (`Auto` resolved).
    pub fn device(&self) -> Device {
        self.snapshot().device()
    }
}
