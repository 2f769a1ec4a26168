//! [`Index`]: a base validated, prepared and placed on its device once, then searched many
//! times.

use crate::{Device, Knn, Options};
use knn_core::{
    check_base, KnnError, MatrixRef, Metric, Neighbors, PreparedBase, ProgressFn, Result,
};
use std::sync::Arc;

/// The rows an [`Index`] keeps, row-major f32: its own, or the caller's, shared and used in
/// place (no copy), such as a NumPy array kept alive by the Python package. Shared rows must
/// not change while the index lives.
#[derive(Clone)]
pub enum Rows {
    /// Rows the index owns.
    Owned(Vec<f32>),
    /// Rows shared with the caller.
    Shared(Arc<dyn AsRef<[f32]> + Send + Sync>),
}

impl Rows {
    /// The values, row after row.
    pub fn as_slice(&self) -> &[f32] {
        match self {
            Rows::Owned(v) => v,
            Rows::Shared(s) => (**s).as_ref(),
        }
    }
}

impl From<Vec<f32>> for Rows {
    fn from(v: Vec<f32>) -> Self {
        Rows::Owned(v)
    }
}

impl From<knn_core::Matrix> for Rows {
    fn from(m: knn_core::Matrix) -> Self {
        Rows::Owned(m.into_vec())
    }
}

impl std::fmt::Debug for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            Rows::Owned(_) => "Owned",
            Rows::Shared(_) => "Shared",
        };
        write!(f, "Rows::{kind}({} values)", self.as_slice().len())
    }
}

/// A base prepared once and searched many times: FAISS's `index.search`, scikit-learn's `fit`
/// then `kneighbors`.
///
/// Building it checks the base (shape, finite values, the metric's domain), prepares it once
/// (centring and scaling, unit rows for cosine, square roots for Hellinger, whitening for
/// Mahalanobis) and opens its engine, which keeps its own copy of the base (on a GPU: device
/// memory) from the first search until the index is dropped. Every search gives exactly what
/// the one-off [`Knn::search`] of the same rows gives, ties included.
///
/// `Index` is `Send + Sync`: many threads may search one index at once, each getting what a
/// lone caller gets.
///
/// ```
/// use knn::{Index, MatrixRef, Metric, Options};
/// let index = Index::new(vec![0.0f32, 0.0, 1.0, 0.0, 5.0, 5.0], 2, Metric::L2, &Options::default()).unwrap();
/// let nn = index.search(MatrixRef::new("queries", &[0.9, 0.1], 2).unwrap(), 2).unwrap();
/// assert_eq!(nn.ids_of(0), &[1, 0]);
/// let graph = index.graph(1).unwrap(); // each point's nearest other point
/// assert_eq!(graph.ids_of(2), &[1]);
/// ```
pub struct Index {
    rows: Rows,
    dim: usize,
    metric: Metric,
    knn: Knn,
    prepared: PreparedBase,
}

impl Index {
    /// An index of `rows` (row-major, `dim` values per row) under `metric`, on the device and
    /// with the method of `opts` (see [`Knn::new`]).
    pub fn new(rows: impl Into<Rows>, dim: usize, metric: Metric, opts: &Options) -> Result<Self> {
        Self::with_engine(rows.into(), dim, metric, Knn::new(opts)?)
    }

    fn with_engine(rows: Rows, dim: usize, metric: Metric, knn: Knn) -> Result<Self> {
        let base = MatrixRef::new("base", rows.as_slice(), dim)?;
        let engine = knn.engine_for(base.rows(), dim, &metric)?;
        let key = knn_core::base_key();
        // The base is placed on the device now, not at the first search: a GPU engine copies
        // the given rows while the host checks and prepares them, and the prepared rows after
        // that where they differ (the first search takes the copy). Expression metrics
        // compute on features made per call: nothing to place.
        let place = !metric.is_expr();
        let prepared = std::thread::scope(|s| {
            if place {
                s.spawn(|| engine.prefetch_base(key, base));
            }
            check_base(&metric, base)?;
            PreparedBase::new(&metric, base, key)
        })?;
        let engine_rows = prepared.engine_base(base);
        if place && engine_rows.as_slice().as_ptr() != base.as_slice().as_ptr() {
            engine.prefetch_base(key, engine_rows);
        }
        Ok(Index {
            rows,
            dim,
            metric,
            knn,
            prepared,
        })
    }

    /// The base, checked when the index was built.
    fn base(&self) -> MatrixRef<'_> {
        MatrixRef::new_unchecked_values("base", self.rows.as_slice(), self.dim)
            .expect("checked when the index was built")
    }

    /// The k nearest base points of every query, ordered by (distance, id); ids are row
    /// numbers of the base (rows added later continue the count).
    pub fn search(&self, queries: MatrixRef<'_>, k: usize) -> Result<Neighbors> {
        self.search_with_progress(queries, k, &|_, _| {})
    }

    /// [`Index::search`] with a progress callback `(done, total)`.
    pub fn search_with_progress(
        &self,
        queries: MatrixRef<'_>,
        k: usize,
        progress: ProgressFn<'_>,
    ) -> Result<Neighbors> {
        let base = self.base();
        let engine = self.knn.engine_for(base.rows(), self.dim, &self.metric)?;
        knn_core::search_prepared(
            engine,
            &self.prepared,
            base,
            queries,
            k,
            &self.metric,
            progress,
        )
    }

    /// The kNN graph of the index's own points: each point's k nearest other points (its own
    /// id excluded; duplicates of it are still neighbours, at distance 0).
    pub fn graph(&self, k: usize) -> Result<Neighbors> {
        self.graph_rows(0..self.len(), k, &|_, _| {})
    }

    /// Rows `rows` of [`Index::graph`] (row `i` of the result for point `rows.start + i`): a
    /// graph in pieces, for checkpoints, with a progress callback `(done, total)`.
    pub fn graph_rows(
        &self,
        rows: std::ops::Range<usize>,
        k: usize,
        progress: ProgressFn<'_>,
    ) -> Result<Neighbors> {
        let base = self.base();
        let engine = self.knn.engine_for(base.rows(), self.dim, &self.metric)?;
        knn_core::graph_prepared(
            engine,
            &self.prepared,
            base,
            rows,
            k,
            &self.metric,
            progress,
        )
    }

    /// Appends `rows` (same dimension) to the base; their ids continue from [`Index::len`].
    /// The base is checked and prepared again as a whole (centre and scale follow the data),
    /// so later searches equal a one-off search of all the rows. Shared rows are copied into
    /// the index first.
    pub fn add(&mut self, rows: MatrixRef<'_>) -> Result<()> {
        if rows.dim() != self.dim {
            return Err(KnnError::DimMismatch {
                base: self.dim,
                queries: rows.dim(),
            });
        }
        self.metric.check_domain("added rows", rows)?;
        let mut all = match std::mem::replace(&mut self.rows, Rows::Owned(Vec::new())) {
            Rows::Owned(v) => v,
            Rows::Shared(s) => (*s).as_ref().to_vec(),
        };
        let before = all.len();
        all.reserve(rows.rows() * self.dim);
        for i in 0..rows.rows() {
            rows.extend_with_row(i, &mut all);
        }
        let base = MatrixRef::new_unchecked_values("base", &all, self.dim)?;
        let prepared = check_base(&self.metric, base)
            .and_then(|_| PreparedBase::new(&self.metric, base, knn_core::base_key()));
        match prepared {
            Ok(prepared) => {
                self.prepared = prepared;
                self.rows = Rows::Owned(all);
                Ok(())
            }
            Err(e) => {
                // The index stays as it was.
                all.truncate(before);
                self.rows = Rows::Owned(all);
                Err(e)
            }
        }
    }

    /// Base points.
    pub fn len(&self) -> usize {
        self.rows.as_slice().len() / self.dim
    }

    /// Always `false`: an index holds at least one point.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values per point.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The distance.
    pub fn metric(&self) -> &Metric {
        &self.metric
    }

    /// Where it computes.
    pub fn device(&self) -> Device {
        self.knn.device()
    }

    /// The rows of the base, as kept.
    pub fn rows(&self) -> &Rows {
        &self.rows
    }
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("len", &self.len())
            .field("dim", &self.dim)
            .field("metric", &self.metric.name())
            .field("device", &self.device())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn index_is_send_and_sync() {
        assert_send_sync::<Index>();
    }
}
