//! The one trait every engine (CPU, CUDA, grid) implements.

use crate::error::{KnnError, Result};
use crate::matrix::MatrixRef;
use crate::metric::Kernel;
use rayon::prelude::*;

/// One candidate computation: for every query, the `width` base points with the smallest
/// kernel keys.
#[derive(Clone, Copy, Debug)]
pub struct CandidateRequest<'a> {
    /// Base points (prepared data: the engine space of the metric).
    pub base: MatrixRef<'a>,
    /// Query points, same dimension.
    pub queries: MatrixRef<'a>,
    /// What to compute.
    pub kernel: Kernel,
    /// Candidates per query, `1 ≤ width ≤` the base points available to each query.
    pub width: usize,
    /// For self-joins: `exclude[i]` is the base id that query `i` must never return.
    pub exclude: Option<&'a [u32]>,
    /// `true` on retries: the pipeline asks again, wider, for rows whose floor was too low, and
    /// an engine with a reduced-precision fast path should use full f32 precision now.
    pub precise: bool,
}

impl CandidateRequest<'_> {
    /// Base points each query may return (the base size, less one when excluding).
    pub fn available(&self) -> usize {
        self.base.rows() - usize::from(self.exclude.is_some())
    }
}

/// An engine's answer: `rows × width` candidate ids and approximate keys, each row sorted by
/// (key, id), and per row a `floor`: a lower bound on the exact kernel key of every base point
/// that is *not* in the row (`+∞` when the row holds every available point).
#[derive(Clone, Debug, PartialEq)]
pub struct Candidates {
    /// Candidates per row.
    pub width: usize,
    /// `rows·width` base ids.
    pub ids: Vec<u32>,
    /// `rows·width` approximate kernel keys.
    pub keys: Vec<f32>,
    /// One per row.
    pub floor: Vec<f32>,
}

/// Candidate rows as an engine hands them to the visitor of [`Engine::candidate_rows`]: the
/// rows of [`Candidates`] of the request rows `rows` (indices into `req.queries`, in the
/// engine's order), and optionally their exact keys (see [`Engine::candidates_with_exact`]).
#[derive(Clone, Copy, Debug)]
pub struct CandidateRows<'a> {
    /// Request row of each row here.
    pub rows: &'a [u32],
    /// Candidates per row.
    pub width: usize,
    /// `rows.len()·width` base ids, each row sorted by (key, id).
    pub ids: &'a [u32],
    /// `rows.len()·width` approximate kernel keys.
    pub keys: &'a [f32],
    /// One per row: a lower bound on the exact key of every available point not in the row.
    pub floor: &'a [f32],
    /// `rows.len()·width` exact keys, when given: `exact[i] == req.kernel.exact(query,
    /// base row ids[i])`, bit for bit.
    pub exact: Option<&'a [f64]>,
}

impl CandidateRows<'_> {
    /// `true` when the slices have the lengths `rows` and `width` call for.
    pub fn is_consistent(&self) -> bool {
        let n = self.rows.len() * self.width;
        self.ids.len() == n
            && self.keys.len() == n
            && self.floor.len() == self.rows.len()
            && self.exact.is_none_or(|e| e.len() == n)
    }
}

/// Receives the candidate rows of [`Engine::candidate_rows`], on the engine's threads.
pub trait RowSink: Sync {
    /// A hint: the request rows `rows` will be handed over soon, from this thread (a sink that
    /// writes rows at scattered places may fetch those places into cache meanwhile). Default:
    /// nothing.
    fn upcoming(&self, rows: &[u32]) {
        let _ = rows;
    }
    /// Takes a batch of rows.
    fn take(&self, rows: CandidateRows<'_>);
}

/// A kNN engine: computes candidate lists; the shared pipeline ([`crate::search`]) re-ranks
/// them exactly and asks again, wider, for the rows whose floor does not prove them complete.
///
/// Contract: row `i` holds the `width` smallest computed keys of query `i` (ties by smaller
/// id), and `floor[i]` is a true lower bound on the exact key of every point left out.
pub trait Engine: Sync {
    /// Name for logs and tables, e.g. `cpu` or `cuda:0/fused`.
    fn name(&self) -> String;
    /// Computes the candidate lists.
    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates>;

    /// Candidates to ask for on the first try, for `k` neighbours of `available` points: a few
    /// more than k, so that rounding rarely forces a retry. Engines with coarser arithmetic ask
    /// for more.
    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        let _ = kernel;
        (k + 4 + k / 16).min(available)
    }

    /// [`Engine::candidates`], plus, optionally, the exact kernel key of every candidate.
    ///
    /// The pipeline calls this instead of `candidates` only when the request's data *is* the
    /// metric's exact space (nothing centred, scaled, normalised or square-rooted in between) and
    /// the metric's exact key is `req.kernel.exact`. An engine that holds the candidates'
    /// coordinates at hand (a cache-resident copy of the base) may then return
    /// `Some(exact)` with `exact.len() == ids.len()` and, bit for bit,
    /// `exact[i] == req.kernel.exact(query row, req.base.row(ids[i]))` (the same function on the
    /// same f32 values); the pipeline uses these instead of reading each candidate's base row.
    /// Default: the candidates and `None`.
    fn candidates_with_exact(
        &self,
        req: &CandidateRequest<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        Ok((self.candidates(req)?, None))
    }

    /// Queries per pipeline round the engine wants at least (the pipeline still bounds a round
    /// by its memory budget). Small rounds give smooth progress reports; an engine that reorders
    /// the queries of a call for locality (the grid) gains from large ones. Default 4096.
    fn min_round_queries(&self) -> usize {
        4096
    }

    /// The rows of [`Engine::candidates`] (`want_exact`: of [`Engine::candidates_with_exact`],
    /// under the same condition) handed to `sink` in batches, each request row exactly once,
    /// in any order and from any thread of the current rayon pool.
    ///
    /// An engine that orders queries for itself (the grid) hands over each batch as soon as it
    /// is done, while it is in cache, and never builds the whole candidate lists nor writes
    /// them back in the caller's order; it announces each batch's rows
    /// ([`RowSink::upcoming`]) before computing them. Default: [`Engine::candidates`] (or
    /// `candidates_with_exact`), then batches of consecutive rows in parallel.
    fn candidate_rows(
        &self,
        req: &CandidateRequest<'_>,
        want_exact: bool,
        sink: &dyn RowSink,
    ) -> Result<()> {
        /// Rows per batch of the default.
        const BATCH: usize = 256;
        let (cand, exact) = if want_exact {
            self.candidates_with_exact(req)?
        } else {
            (self.candidates(req)?, None)
        };
        let (n, w) = (req.queries.rows(), cand.width);
        if cand.floor.len() != n || cand.ids.len() != n * w || cand.keys.len() != n * w {
            return Err(KnnError::Device(format!(
                "engine {} returned {} floors and {} ids of width {w} for {n} queries",
                self.name(),
                cand.floor.len(),
                cand.ids.len()
            )));
        }
        let exact = exact.filter(|e| e.len() == cand.ids.len());
        let rows: Vec<u32> = (0..n as u32).collect();
        rows.par_chunks(BATCH).enumerate().for_each(|(i, r)| {
            let (a, b) = (i * BATCH, i * BATCH + r.len());
            sink.take(CandidateRows {
                rows: r,
                width: w,
                ids: &cand.ids[a * w..b * w],
                keys: &cand.keys[a * w..b * w],
                floor: &cand.floor[a..b],
                exact: exact.as_ref().map(|e| &e[a * w..b * w]),
            })
        });
        Ok(())
    }
}
