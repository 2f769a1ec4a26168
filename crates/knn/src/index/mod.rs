//! [`Index`]: a base validated, prepared and placed on its device once, then searched many
//! times.

mod device;

pub use device::{DeviceMemory, DeviceQueries, DeviceResults};

use crate::{Device, Knn, Options};
use knn_core::given::{
    check_given, check_given_domain, round_to_f32, Given, GivenRows, RowRounding,
};
use knn_core::{
    check_base, KnnError, MatrixRef, Metric, Neighbors, PreparedBase, ProgressFn, Result,
};
use std::sync::Arc;

/// The rows an [`Index`] keeps, row-major, in f32 or f64: its own, or the caller's, shared and
/// used in place (no copy), such as a NumPy array kept alive by the Python package. Shared rows
/// must not change while the index lives.
///
/// Rows given in f64 stay the truth: engines compute on their f32 rounding (a copy the index
/// makes), and every answer is exact with respect to the f64 values (see `knn_core::given`).
#[derive(Clone)]
pub enum Rows {
    /// f32 rows the index owns.
    Owned(Vec<f32>),
    /// f32 rows shared with the caller.
    Shared(Arc<dyn AsRef<[f32]> + Send + Sync>),
    /// f64 rows the index owns.
    OwnedF64(Vec<f64>),
    /// f64 rows shared with the caller.
    SharedF64(Arc<dyn AsRef<[f64]> + Send + Sync>),
}

impl Rows {
    /// The values, row after row, in the type they were given in.
    pub fn given(&self) -> Given<'_> {
        match self {
            Rows::Owned(v) => Given::F32(v),
            Rows::Shared(s) => Given::F32((**s).as_ref()),
            Rows::OwnedF64(v) => Given::F64(v),
            Rows::SharedF64(s) => Given::F64((**s).as_ref()),
        }
    }

    /// The values, when they are f32.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.given() {
            Given::F32(v) => Some(v),
            Given::F64(_) => None,
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.given().len()
    }

    /// `true` when there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows followed by `more` (its values in f64 when either side is f64).
    pub fn append(&self, more: Given<'_>) -> Rows {
        match (self.given(), more) {
            (Given::F32(a), Given::F32(b)) => Rows::Owned([a, b].concat()),
            (a, b) => {
                let mut all = Vec::with_capacity(a.len() + b.len());
                for g in [a, b] {
                    match g {
                        Given::F32(v) => all.extend(v.iter().map(|&x| x as f64)),
                        Given::F64(v) => all.extend_from_slice(v),
                    }
                }
                Rows::OwnedF64(all)
            }
        }
    }
}

impl From<Vec<f32>> for Rows {
    fn from(v: Vec<f32>) -> Self {
        Rows::Owned(v)
    }
}

impl From<Vec<f64>> for Rows {
    fn from(v: Vec<f64>) -> Self {
        Rows::OwnedF64(v)
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
            Rows::OwnedF64(_) => "OwnedF64",
            Rows::SharedF64(_) => "SharedF64",
        };
        write!(f, "Rows::{kind}({} values)", self.len())
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
    /// The f32 rounding of rows given in f64 (what engines compute on).
    rounded: Option<Vec<f32>>,
    /// The largest rounding of a base row, for the proofs of rows given in f64.
    rounding: RowRounding,
    dim: usize,
    metric: Metric,
    knn: Knn,
    prepared: PreparedBase,
}

impl Index {
    /// An index of `rows` (row-major, `dim` values per row, f32 or f64) under `metric`, on the
    /// device and with the method of `opts` (see [`Knn::new`]).
    pub fn new(rows: impl Into<Rows>, dim: usize, metric: Metric, opts: &Options) -> Result<Self> {
        Self::with_engine(rows.into(), dim, metric, Knn::new(opts)?)
    }

    fn with_engine(rows: Rows, dim: usize, metric: Metric, knn: Knn) -> Result<Self> {
        let (rounded, rounding, prepared) = Self::prepare(&rows, dim, &metric, &knn)?;
        Ok(Index {
            rows,
            rounded,
            rounding,
            dim,
            metric,
            knn,
            prepared,
        })
    }

    /// Checks and prepares `rows` (their f32 rounding and its bound where they are f64) and
    /// places them on the engine's device.
    fn prepare(
        rows: &Rows,
        dim: usize,
        metric: &Metric,
        knn: &Knn,
    ) -> Result<(Option<Vec<f32>>, RowRounding, PreparedBase)> {
        let (rounded, rounding) = match rows.given() {
            Given::F32(_) => (None, RowRounding::default()),
            Given::F64(v) => {
                check_given(metric, true)?;
                let r = round_to_f32("base", v, dim)?;
                check_given_domain(metric, "base", v, dim)?;
                (Some(r), RowRounding::of_rows(metric, v, dim))
            }
        };
        let values = rounded
            .as_deref()
            .or(rows.as_f32())
            .expect("f32 rows or their rounding");
        let base = MatrixRef::new("base", values, dim)?;
        let engine = knn.engine_for(base.rows(), dim, metric)?;
        let key = knn_core::base_key();
        // The base is placed on the device now, not at the first search: a GPU engine copies
        // the given rows while the host checks and prepares them, and the prepared rows after
        // that where they differ (the first search takes the copy). Expression metrics
        // compute on features made per call: nothing to place.
        let place = !metric.is_expr();
        let since = std::time::Instant::now();
        let prepared = std::thread::scope(|s| {
            if place {
                s.spawn(|| engine.prefetch_base(key, base));
            }
            check_base(metric, base)?;
            PreparedBase::new(metric, base, key)
        })?;
        let engine_rows = prepared.engine_base(base);
        if place && engine_rows.as_slice().as_ptr() != base.as_slice().as_ptr() {
            engine.prefetch_base(key, engine_rows);
        }
        if std::env::var_os("KNN_PROFILE").is_some() {
            eprintln!(
                "index: base checked, prepared and placed in {:.2} ms",
                since.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok((rounded, rounding, prepared))
    }

    /// The rows engines compute on (the given f32 rows, or the rounding of f64 ones), checked
    /// when the index was built.
    fn base(&self) -> MatrixRef<'_> {
        let values = self.rounded.as_deref().or(self.rows.as_f32());
        MatrixRef::new_unchecked_values(
            "base",
            values.expect("f32 rows or their rounding"),
            self.dim,
        )
        .expect("checked when the index was built")
    }

    /// The rows as given, when some are f64 (`queries` `None`: a graph).
    fn given<'a>(&'a self, queries: Option<Given<'a>>) -> Option<GivenRows<'a>> {
        let f64_queries = queries.is_some_and(|q| q.is_f64());
        (self.rounded.is_some() || f64_queries).then(|| GivenRows {
            base: self.rows.given(),
            queries,
            dim: self.dim,
            base_rounding: self.rounding,
        })
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
        let (p, m) = (&self.prepared, &self.metric);
        match (
            self.given(Some(Given::F32(queries.as_slice()))),
            queries.values(),
        ) {
            (Some(g), Some(_)) => {
                knn_core::search_given(engine, Some(p), base, queries, &g, k, m, progress)
            }
            _ => knn_core::search_prepared(engine, p, base, queries, k, m, progress),
        }
    }

    /// [`Index::search`] of queries given in f64 (row-major, [`Index::dim`] values each):
    /// exact with respect to the f64 values (engines compute on their f32 rounding), distances
    /// in f64.
    pub fn search_f64(
        &self,
        queries: &[f64],
        k: usize,
        progress: ProgressFn<'_>,
    ) -> Result<Neighbors<f64>> {
        let rounded = round_to_f32("queries", queries, self.dim)?;
        let q = MatrixRef::new_unchecked_values("queries", &rounded, self.dim)?;
        let given = self.given(Some(Given::F64(queries))).expect("f64 queries");
        let base = self.base();
        let engine = self.knn.engine_for(base.rows(), self.dim, &self.metric)?;
        let (p, m) = (&self.prepared, &self.metric);
        let out = knn_core::search_given(engine, Some(p), base, q, &given, k, m, progress)?;
        Ok(knn_core::in_given_precision(m, &given, out, 0))
    }

    /// The exact keys by which [`Index::search`] chooses neighbours: entry `i·k + j` is the
    /// metric's f64 key ([`Metric::exact_key`]) of query `i` and base row `ids[i·k + j]`, from
    /// the rows as given (f32 or f64; whitened for Mahalanobis). A search keeps the k smallest
    /// by (key, id), then reports f32 (or f64) distances of those keys, which may round
    /// distinct keys to one distance: answers of several indexes over parts of a base, merged
    /// by (key, id), are what one index over the whole base answers; merged by distances they
    /// may not be (`knn.dask` merges so).
    ///
    /// Errors: queries not finite or of another dimension, `ids` not `k` per query, an id
    /// outside the index.
    pub fn exact_keys(&self, queries: Given<'_>, ids: &[u32], k: usize) -> Result<Vec<f64>> {
        let dim = self.dim;
        let rows = match queries {
            Given::F32(q) => MatrixRef::new("queries", q, dim)?.rows(),
            Given::F64(q) => round_to_f32("queries", q, dim)?.len() / dim.max(1),
        };
        if ids.len() != rows * k {
            return Err(KnnError::Option(format!(
                "{} ids for {rows} queries of k = {k} (expected {})",
                ids.len(),
                rows * k
            )));
        }
        if let Some(&bad) = ids.iter().find(|&&b| b as usize >= self.len()) {
            return Err(KnnError::Option(format!(
                "id {bad} is not a row of the index ({} rows)",
                self.len()
            )));
        }
        Ok(match queries {
            Given::F32(q) if self.rounded.is_none() => {
                let q = MatrixRef::new_unchecked_values("queries", q, dim)?;
                (self.prepared).exact_keys(&self.metric, self.base(), q, ids, k)
            }
            // Rows given in f64 on either side: the re-rank reads them as given.
            _ => {
                let given = GivenRows {
                    base: self.rows.given(),
                    queries: Some(queries),
                    dim,
                    base_rounding: self.rounding,
                };
                knn_core::given_keys(&self.metric, &given, ids, k, 0)
            }
        })
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
        let (p, m) = (&self.prepared, &self.metric);
        match self.given(None) {
            Some(g) => knn_core::graph_given(engine, Some(p), base, &g, rows, k, m, progress),
            None => knn_core::graph_prepared(engine, p, base, rows, k, m, progress),
        }
    }

    /// [`Index::graph_rows`] with distances in f64: for rows given in f64, the distances of
    /// the given values (for f32 rows, their f32 distances widened).
    pub fn graph_rows_f64(
        &self,
        rows: std::ops::Range<usize>,
        k: usize,
        progress: ProgressFn<'_>,
    ) -> Result<Neighbors<f64>> {
        let first = rows.start;
        let out = self.graph_rows(rows, k, progress)?;
        Ok(match self.given(None) {
            Some(g) => knn_core::in_given_precision(&self.metric, &g, out, first),
            None => Neighbors {
                k: out.k,
                ids: out.ids,
                distances: out.distances.iter().map(|&d| d as f64).collect(),
            },
        })
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
        let mut more = Vec::with_capacity(rows.rows() * self.dim);
        for i in 0..rows.rows() {
            rows.extend_with_row(i, &mut more);
        }
        self.append(Given::F32(&more))
    }

    /// [`Index::add`] of rows given in f64 (an index of f32 rows keeps f64 ones from then on).
    pub fn add_f64(&mut self, rows: &[f64]) -> Result<()> {
        let rounded = round_to_f32("added rows", rows, self.dim)?;
        check_given_domain(&self.metric, "added rows", rows, self.dim)?;
        let m = MatrixRef::new_unchecked_values("added rows", &rounded, self.dim)?;
        self.metric.check_domain("added rows", m)?;
        self.append(Given::F64(rows))
    }

    /// The index of every row and `more`, built again; on error the index stays as it was.
    fn append(&mut self, more: Given<'_>) -> Result<()> {
        let all = self.rows.append(more);
        let (rounded, rounding, prepared) = Self::prepare(&all, self.dim, &self.metric, &self.knn)?;
        (self.rows, self.rounded, self.rounding, self.prepared) =
            (all, rounded, rounding, prepared);
        Ok(())
    }

    /// Base points.
    pub fn len(&self) -> usize {
        self.rows.len() / self.dim
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

    /// The engine that computes this index's searches, by name: `cpu`, `grid`, `cuda:0`,
    /// `cuda:0/grid`, several GPUs joined by `+`.
    pub fn engine_name(&self) -> Result<String> {
        let engine = self.knn.engine_for(self.len(), self.dim, &self.metric)?;
        Ok(engine.name())
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
