//! One round of queries: the first try, the exact re-rank of what the engine hands over, and
//! the one widening rule for rows whose floor does not prove them: the same width with precise
//! keys after a fast first try, then four times wider, then an exact scan.

use super::rerank::{
    as_atomic, as_atomic_f32, exact_scan, exact_scan_given, finish_row, BaseAux, Collector, Rerank,
};
use crate::engine::{
    CandidateRequest, Engine, ExactFrom, FinishedRows, GraphRequest, OutputRows, RowSlices,
};
use crate::error::{KnnError, Result};
use crate::given::GivenRows;
use crate::matrix::{Matrix, MatrixRef};
use crate::metric::Metric;
use crate::prepare::Prepared;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// Past this width a failing row is finished by a direct exact scan instead of a wider engine call.
fn max_engine_width(available: usize) -> usize {
    (available / 4).max(4096).min(available)
}

/// Rows a round needs before its failures switch later rounds to precise first tries.
const MIN_LOOSE_ROWS: usize = 64;

/// What every round of one pipeline run shares.
pub(super) struct Run<'a> {
    pub(super) metric: &'a Metric,
    pub(super) eb: MatrixRef<'a>,
    pub(super) eq: MatrixRef<'a>,
    pub(super) xb: MatrixRef<'a>,
    pub(super) xq: MatrixRef<'a>,
    pub(super) key_scale: f64,
    /// The engine computes on the exact space itself: it may hand over exact keys.
    pub(super) same_space: bool,
    pub(super) self_join: bool,
    pub(super) k: usize,
    pub(super) available: usize,
    pub(super) width0: usize,
    /// Rows whose first-try candidate lists the host holds at once (the memory budget of one
    /// round; see [`Run::round`]).
    pub(super) candidate_rows: usize,
    /// See [`CandidateRequest::base_key`].
    pub(super) base_key: u64,
    /// See [`CandidateRequest::exact_data`].
    pub(super) exact_data: bool,
    /// An expression metric's plan (keys from its program, see [`Engine::candidates_expr`]).
    pub(super) expr: Option<&'a crate::expr::ExprPlan>,
    /// First-try candidates of every row of a whole graph, computed at once with each
    /// unordered pair once (see [`Engine::graph_candidates`]).
    pub(super) symmetric: Option<crate::engine::Candidates>,
    /// Per-base values for the exact keys, taken once for the run where needed (see
    /// [`BaseAux`]).
    pub(super) aux: OnceLock<Option<BaseAux>>,
    /// Set when most rows of a round failed their first try's floor: the engine's fast
    /// first-try bound (bf16, TF32) is too wide for this data (cosine keys crowd within it),
    /// so later rounds ask for precise keys at once instead of paying for both. (Rows that fail
    /// on ties wider than the list set it too, and then pay the precise pass for nothing; telling
    /// the two apart would need the gap between the k-th and W-th keys against the bound.)
    pub(super) loose: AtomicBool,
    pub(super) profile: bool,
    /// The rows as given, when some came in f64 (see [`crate::given`]): the engine's rows are
    /// then their f32 rounding, and only the pipeline takes exact keys.
    pub(super) given: Option<&'a crate::given::GivenRows<'a>>,
}

impl<'a> Run<'a> {
    /// The run of `k` neighbours under `metric` on the preparation `prep` (queries, or a
    /// self-join), `available` candidates a row, first tries `width0` wide, first-try lists
    /// of `candidate_rows` rows held at once.
    pub(super) fn new(
        metric: &'a Metric,
        prep: &'a Prepared<'a>,
        given: Option<&'a GivenRows<'a>>,
        self_join: bool,
        (k, available, width0, candidate_rows): (usize, usize, usize, usize),
        base_key: u64,
        profile: bool,
    ) -> Self {
        let xb = prep.exact_base.view();
        Run {
            metric,
            eb: prep.engine_base(),
            eq: prep.engine_queries(),
            xb,
            xq: prep.exact_queries().unwrap_or(xb),
            key_scale: prep.key_scale,
            same_space: prep.engine.is_none()
                && given.is_none()
                && !matches!(metric, Metric::Cosine | Metric::Hellinger),
            self_join,
            k,
            available,
            width0,
            candidate_rows,
            base_key,
            exact_data: prep.engine.is_none(),
            expr: prep.expr.as_ref(),
            symmetric: None,
            aux: OnceLock::new(),
            loose: AtomicBool::new(false),
            profile,
            given,
        }
    }
}

impl Run<'_> {
    pub(super) fn lap(&self, what: &str, since: &mut std::time::Instant) {
        if self.profile {
            eprintln!(
                "pipeline: {what}: {:.2} ms",
                since.elapsed().as_secs_f64() * 1e3
            );
            *since = std::time::Instant::now();
        }
    }

    /// The request for the rows `qv` (query ids `pending`), `width` wide: a first try when
    /// `first` gives its rows' range (contiguous, not yet tried), precise otherwise or when
    /// `loose`.
    pub(super) fn request<'r>(
        &'r self,
        qv: MatrixRef<'r>,
        pending: &'r [u32],
        width: usize,
        first: Option<std::ops::Range<usize>>,
        loose: bool,
    ) -> CandidateRequest<'r> {
        CandidateRequest {
            base: self.eb,
            queries: qv,
            kernel: self.metric.kernel(),
            width,
            exclude: self.self_join.then_some(pending),
            precise: first.is_none() || loose,
            base_key: Some(self.base_key),
            exact_data: self.exact_data,
            // First tries of Hellinger: an engine may take the exact keys of the given rows.
            exact_from: first
                .filter(|_| matches!(self.metric, Metric::Hellinger) && self.given.is_none())
                .map(|r| ExactFrom::Hellinger {
                    base: self.xb,
                    queries: self.xq.slice_rows(r.start, r.end),
                }),
        }
    }

    /// Whether a first try not answered from host-side graph candidates asks the engine to
    /// finish its rows ([`Engine::finish_rows`]) rather than for candidates.
    pub(super) fn engine_may_finish(&self) -> bool {
        self.expr.is_none()
            && self.given.is_none()
            && (self.same_space || matches!(self.metric, Metric::Hellinger))
    }

    /// The first step of a whole graph (rows from `first` on, every one): host-side
    /// candidates of every row from the engine, else the engine told of the graph and given
    /// the chance to start it.
    pub(super) fn start_graph(&mut self, engine: &dyn Engine, first: usize) -> Result<()> {
        let mut since = std::time::Instant::now();
        let (kernel, width0) = (self.metric.kernel(), self.width0);
        self.symmetric = engine
            .graph_candidates(GraphRequest {
                points: self.eb,
                kernel,
                width: width0,
                precise: false,
            })
            .transpose()?;
        if self.symmetric.is_none() {
            let none = self.eq.slice_rows(first, first);
            let req = self.request(none, &[], width0, Some(first..first), false);
            let finish = self.engine_may_finish().then_some((self.metric, self.k));
            engine.begin_graph(&req, finish)?;
        }
        self.lap("engine (symmetric, all rows)", &mut since);
        Ok(())
    }

    /// Queries `start..end` to the end: first try, exact re-rank, wider retries of the rows
    /// whose floor does not prove them, and a direct scan past the widest engine call. Writes
    /// rows `start..end` into `out` (`k` per row), asking for its buffers only after the
    /// engine's first try (which, finishing the rows itself, overlaps their making).
    ///
    /// A round may hold more rows than [`Run::candidate_rows`] when the engine is to finish
    /// them itself (their candidates never come to the host); if it does not, the round's
    /// first tries are asked in pieces of at most that many rows, with `may_finish` false (the
    /// engine is not asked to finish them again).
    pub(super) fn round(
        &self,
        engine: &dyn Engine,
        start: usize,
        end: usize,
        out: &mut dyn OutputRows,
        may_finish: bool,
    ) -> Result<()> {
        let (k, available) = (self.k, self.available);
        let mut since = std::time::Instant::now();
        let mut pending: Vec<u32> = (start as u32..end as u32).collect();
        let mut width = self.width0;
        let loose = self.loose.load(Relaxed);
        let fast = !loose && self.expr.is_none() && engine.fast_first_tries(self.metric.kernel());
        let mut pass = 0usize;
        while !pending.is_empty() {
            // Gather the pending queries (contiguous on the first try: no copy).
            let contiguous = pass == 0;
            let gathered;
            let qv = if contiguous {
                self.eq.slice_rows(start, end)
            } else {
                let d = self.eq.dim();
                let mut v = Vec::with_capacity(pending.len() * d);
                for &i in &pending {
                    // Derived rows not made on the host are derived alone (same bits).
                    self.eq.extend_with_row(i as usize, &mut v);
                }
                gathered = Matrix::from_trusted(v, d);
                gathered.view()
            };
            let req = self.request(qv, &pending, width, contiguous.then_some(start..end), loose);
            let first_try = self.symmetric.as_ref().filter(|_| contiguous && !loose);
            // An engine that re-ranks on its own writes a first try's rows in place.
            let mut proven = vec![false; pending.len()];
            let finished = contiguous
                && may_finish
                && first_try.is_none()
                && self.engine_may_finish()
                && engine.finish_rows(
                    &req,
                    FinishedRows {
                        metric: self.metric,
                        k,
                        out: &mut *out,
                        proven: &mut proven,
                        key_scale: self.key_scale,
                    },
                )?;
            let (ids_out, dists_out) = out.buffers();
            if !finished && first_try.is_none() && contiguous && end - start > self.candidate_rows {
                // Not finished by the engine after all: candidates in pieces within the budget.
                let mut pieces = ids_out
                    .chunks_mut(self.candidate_rows * k)
                    .zip(dists_out.chunks_mut(self.candidate_rows * k));
                for s in (start..end).step_by(self.candidate_rows) {
                    let (ids, distances) = pieces.next().expect("one piece per step");
                    let e = (s + self.candidate_rows).min(end);
                    let mut piece = RowSlices { ids, distances, k };
                    self.round(engine, s, e, &mut piece, false)?;
                }
                return Ok(());
            }
            let rerank = Rerank {
                metric: self.metric,
                xb: self.xb,
                aux: &self.aux,
                // Pair by pair, each candidate costs a row of the base's work (its roots or
                // its norm) once more: more than the pass over the base only for many rows.
                aux_pays: pending.len() * width >= self.xb.rows(),
                self_join: self.self_join,
                xq: self.xq,
                k,
                key_scale: self.key_scale,
                complete: width >= available,
                given: self.given,
            };
            // Re-rank each row exactly as the engine hands it over (in the engine's order, on
            // its threads) and write the rows whose floor proves them complete straight into
            // the output; the others are asked again.
            let requested = pending.len();
            let sink = Collector {
                rerank: &rerank,
                start,
                pending: (!contiguous).then_some(&pending[..]),
                requested,
                first: start,
                width,
                out_ids: as_atomic(ids_out),
                out_dists: as_atomic_f32(dists_out),
                failed: Mutex::new(Vec::new()),
                handed: AtomicUsize::new(0),
                malformed: AtomicBool::new(false),
            };
            if finished {
                // Rows written by the engine; the unproven ones are asked again.
                sink.failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend((0..requested as u32).filter(|&j| !proven[j as usize]));
                sink.handed.store(requested, Relaxed);
            } else if let Some(all) = first_try {
                all.rows(start, end).hand_over(None, &sink);
            } else if let Some(plan) = self.expr {
                engine.candidates_expr(&req, plan)?.hand_over(None, &sink);
            } else {
                let want_exact = self.same_space || req.exact_from.is_some();
                engine.candidate_rows(&req, want_exact, &sink)?;
            }
            let handed = sink.handed.into_inner();
            if sink.malformed.into_inner() || handed != requested {
                return Err(KnnError::Device(format!(
                    "engine {} handed over {handed} candidate rows of {requested} (or rows of the wrong shape)",
                    engine.name(),
                )));
            }
            let mut failed = sink.failed.into_inner().unwrap_or_else(|e| e.into_inner());
            failed.sort_unstable();
            if contiguous && !loose && requested >= MIN_LOOSE_ROWS && 2 * failed.len() > requested {
                self.loose.store(true, Relaxed);
            }
            self.lap(
                &format!(
                    "candidates and re-rank ({requested} rows, width {width}, {} not proven)",
                    failed.len()
                ),
                &mut since,
            );
            pending = failed
                .iter()
                .map(|&j| {
                    if contiguous {
                        (start + j as usize) as u32
                    } else {
                        pending[j as usize]
                    }
                })
                .collect();
            if pending.is_empty() {
                break;
            }
            // Rows a fast first try left unproven are first asked again at the same width with
            // precise keys, then wider.
            if !(contiguous && fast) {
                width = (width * 4).min(available);
            }
            pass += 1;
            if width > max_engine_width(available) {
                // Ties or rounding too wide for candidate lists: scan these rows exactly.
                let scanned: Vec<(Vec<u32>, Vec<f32>)> = pending
                    .par_iter()
                    .map(|&qi| {
                        let skip = self.self_join.then_some(qi);
                        let exact = match self.given {
                            Some(g) => exact_scan_given(self.metric, g, qi as usize, k, skip),
                            None => {
                                exact_scan(self.metric, self.xb, self.xq.row(qi as usize), k, skip)
                            }
                        };
                        let (mut ids, mut dists) = (vec![0u32; k], vec![0f32; k]);
                        finish_row(self.metric, &exact, &mut ids, &mut dists);
                        (ids, dists)
                    })
                    .collect();
                for (&qi, (ids, dists)) in pending.iter().zip(scanned) {
                    let qi = qi as usize - start;
                    ids_out[qi * k..(qi + 1) * k].copy_from_slice(&ids);
                    dists_out[qi * k..(qi + 1) * k].copy_from_slice(&dists);
                }
                break;
            }
        }
        Ok(())
    }
}
