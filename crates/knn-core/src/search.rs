//! The shared search pipeline: validate, prepare, ask an engine for candidates, re-rank them
//! exactly in f64, and widen the rows whose engine floor does not prove them complete.

use crate::engine::{CandidateRequest, Engine};
use crate::error::{KnnError, Result};
use crate::matrix::{Matrix, MatrixRef};
use crate::metric::Metric;
use crate::neighbors::Neighbors;
use crate::prepare::prepare;
use rayon::prelude::*;

/// Queries handled per round of the pipeline, so that candidate lists stay a small fraction of
/// memory next to the output.
const CANDIDATE_BYTES_PER_ROUND: usize = 64 << 20;

/// Past this width a failing row is finished by a direct exact scan instead of a wider engine call.
fn max_engine_width(available: usize) -> usize {
    (available / 4).max(4096).min(available)
}

/// Checks the arguments shared by search and graph.
fn validate(
    metric: &Metric,
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
) -> Result<usize> {
    if base.rows() == 0 {
        return Err(KnnError::EmptyBase);
    }
    if base.rows() > u32::MAX as usize {
        return Err(KnnError::TooManyPoints { n: base.rows() });
    }
    if k == 0 {
        return Err(KnnError::ZeroK);
    }
    if let Some(q) = queries {
        if q.dim() != base.dim() {
            return Err(KnnError::DimMismatch {
                base: base.dim(),
                queries: q.dim(),
            });
        }
    }
    let available = base.rows() - usize::from(queries.is_none());
    if k > available {
        let hint = if queries.is_none() {
            format!(
                " (a graph excludes each point itself: {} points less one)",
                base.rows()
            )
        } else {
            String::new()
        };
        return Err(KnnError::KTooLarge {
            k,
            n: available,
            hint,
        });
    }
    metric.check_domain("base", base)?;
    if let Some(q) = queries {
        metric.check_domain("queries", q)?;
    }
    Ok(available)
}

/// Called with (queries done, queries in all) as work completes.
pub type ProgressFn<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// Exact k nearest base points of every query under `metric`, computed by `engine`.
pub fn search(
    engine: &dyn Engine,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
) -> Result<Neighbors> {
    search_with_progress(engine, base, queries, k, metric, &|_, _| {})
}

/// [`search`], reporting progress.
pub fn search_with_progress(
    engine: &dyn Engine,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let available = validate(metric, base, Some(queries), k)?;
    run(
        engine,
        base,
        Some(queries),
        k,
        metric,
        available,
        0..queries.rows(),
        progress,
    )
}

/// Exact kNN graph: the k nearest other points of every point (its own id excluded; duplicates
/// of it are still neighbours, at distance 0).
pub fn graph(
    engine: &dyn Engine,
    points: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
) -> Result<Neighbors> {
    graph_with_progress(engine, points, k, metric, &|_, _| {})
}

/// [`graph`], reporting progress.
pub fn graph_with_progress(
    engine: &dyn Engine,
    points: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let available = validate(metric, points, None, k)?;
    run(
        engine,
        points,
        None,
        k,
        metric,
        available,
        0..points.rows(),
        progress,
    )
}

/// Rows `rows` of the kNN graph of `points` (a `rows.len() × k` result, row `i` for point
/// `rows.start + i`): the same rows [`graph`] computes, so a graph can be computed, saved and
/// resumed in pieces.
pub fn graph_rows(
    engine: &dyn Engine,
    points: MatrixRef<'_>,
    rows: std::ops::Range<usize>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let available = validate(metric, points, None, k)?;
    if rows.start > rows.end || rows.end > points.rows() {
        return Err(KnnError::Option(format!(
            "graph rows {}..{} outside the {} points",
            rows.start,
            rows.end,
            points.rows()
        )));
    }
    run(engine, points, None, k, metric, available, rows, progress)
}

/// Queries per round when reporting progress: small enough for a smooth bar, large enough to
/// keep every engine's tiles full.
const MIN_ROUND: usize = 4096;

/// One row's candidates as the engine returned them.
struct RowCandidates<'c> {
    ids: &'c [u32],
    keys: &'c [f32],
    floor: f32,
    /// The engine's exact keys of `ids`, when it gave them (see
    /// [`Engine::candidates_with_exact`]).
    exact: Option<&'c [f64]>,
}

/// What stays fixed across the rows of one pipeline run.
struct Rerank<'m, 'x> {
    metric: &'m Metric,
    xb: MatrixRef<'x>,
    k: usize,
    key_scale: f64,
    /// `true` when the candidate lists hold every available point.
    complete: bool,
}

impl Rerank<'_, '_> {
    /// Re-ranks one row exactly into `ids_out` / `dists_out` (`k` each) and returns `true`
    /// when its floor proves it complete; `false` leaves the outputs unspecified (the row is
    /// asked again). `scratch` is reused across rows, so no row allocates.
    fn row(
        &self,
        q: &[f32],
        c: &RowCandidates<'_>,
        scratch: &mut Vec<(f64, u32)>,
        ids_out: &mut [u32],
        dists_out: &mut [f32],
    ) -> bool {
        let (k, width) = (self.k, c.ids.len());
        scratch.clear();
        if let Some(exact) = c.exact {
            scratch.extend(exact.iter().copied().zip(c.ids.iter().copied()));
        } else if let Metric::Expr(e) = self.metric {
            // Expression keys are chains of dependent f64 operations: every candidate at once,
            // several chains interleaved, beats stopping early one key at a time.
            e.keys(q, self.xb, c.ids, scratch);
        } else {
            // The engine's rounding bound, recovered from its floor; candidates whose key less
            // that bound exceeds an exact k-th key cannot enter the top k.
            let floor = c.floor as f64;
            let slack = if floor.is_finite() {
                c.keys[width - 1] as f64 - floor
            } else {
                f64::INFINITY
            };
            let mut kth_bound = f64::INFINITY;
            for (&b, &key) in c.ids.iter().zip(c.keys) {
                if scratch.len() >= k && key as f64 - slack > kth_bound {
                    break;
                }
                scratch.push((self.metric.exact_key(q, self.xb.row(b as usize)), b));
                if scratch.len() == k {
                    kth_bound = scratch
                        .iter()
                        .map(|e| e.0)
                        .fold(f64::NEG_INFINITY, f64::max)
                        * self.key_scale;
                }
            }
        }
        let by_key = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if k < scratch.len() {
            scratch.select_nth_unstable_by(k - 1, by_key);
            scratch.truncate(k);
        }
        scratch.sort_unstable_by(by_key);
        let kth = scratch[k - 1].0;
        if !(kth * self.key_scale < c.floor as f64 || self.complete) {
            return false;
        }
        finish_row(self.metric, scratch, ids_out, dists_out);
        true
    }
}

/// The pipeline for the query rows `rows` (all of them, or a piece of a graph); the result's row
/// `i` is query `rows.start + i`.
#[allow(clippy::too_many_arguments)]
fn run(
    engine: &dyn Engine,
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    available: usize,
    rows: std::ops::Range<usize>,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let profile = std::env::var_os("KNN_PROFILE").is_some();
    let clock = std::time::Instant::now();
    let lap = |what: &str, since: &mut std::time::Instant| {
        if profile {
            eprintln!(
                "pipeline: {what}: {:.2} ms",
                since.elapsed().as_secs_f64() * 1e3
            );
            *since = std::time::Instant::now();
        }
    };
    let mut since = clock;
    let prep = prepare(metric, base, queries)?;
    lap("prepare", &mut since);
    let eb = prep.engine_base();
    let eq = prep.engine_queries();
    let xb = prep.exact_base.view();
    let xq = prep.exact_queries().unwrap_or(xb);
    // The engine computes on the exact space itself: it may hand over exact keys.
    let same_space = prep.engine.is_none() && !matches!(metric, Metric::Cosine | Metric::Hellinger);
    let self_join = queries.is_none();
    let first = rows.start;
    let nq = rows.end;
    let mut out = Neighbors::with_shape(rows.len(), k);
    let kernel = metric.kernel();
    let width0 = engine
        .candidate_width(k, available, kernel)
        .clamp(k, available);
    let per_round = (CANDIDATE_BYTES_PER_ROUND / (8 * width0)).max(1024).min(
        (rows.len() / 32)
            .max(MIN_ROUND)
            .max(engine.min_round_queries()),
    );

    for start in rows.clone().step_by(per_round) {
        let end = (start + per_round).min(nq);
        let mut pending: Vec<u32> = (start as u32..end as u32).collect();
        let mut width = width0;
        while !pending.is_empty() {
            // Gather the pending queries (contiguous on the first round: no copy).
            let contiguous = pending.len() == end - start && width == width0;
            let gathered;
            let qv = if contiguous {
                eq.slice_rows(start, end)
            } else {
                let d = eq.dim();
                let mut v = Vec::with_capacity(pending.len() * d);
                for &i in &pending {
                    v.extend_from_slice(eq.row(i as usize));
                }
                gathered = Matrix::from_trusted(v, d);
                gathered.view()
            };
            let exclude = self_join.then_some(pending.as_slice());
            let req = CandidateRequest {
                base: eb,
                queries: qv,
                kernel,
                width,
                exclude,
                precise: !contiguous,
            };
            let (cand, exact) = if let Some(plan) = &prep.expr {
                (engine.candidates_expr(&req, plan)?, None)
            } else if same_space {
                engine.candidates_with_exact(&req)?
            } else {
                (engine.candidates(&req)?, None)
            };
            lap("engine", &mut since);
            debug_assert_eq!(cand.ids.len(), pending.len() * width);
            debug_assert!(exact.as_ref().is_none_or(|e| e.len() == cand.ids.len()));
            let exact = exact.filter(|e| e.len() == cand.ids.len());
            let rerank = Rerank {
                metric,
                xb,
                k,
                key_scale: prep.key_scale,
                complete: width >= available,
            };
            let row_of = |j: usize| RowCandidates {
                ids: &cand.ids[j * width..(j + 1) * width],
                keys: &cand.keys[j * width..(j + 1) * width],
                floor: cand.floor[j],
                exact: exact.as_ref().map(|e| &e[j * width..(j + 1) * width]),
            };
            // Re-rank each row exactly; keep rows whose floor proves them complete. On the
            // first try the rows are written in place; retries go through a buffer.
            let mut proven = vec![false; pending.len()];
            if contiguous {
                out.ids[(start - first) * k..(end - first) * k]
                    .par_chunks_mut(k)
                    .zip(out.distances[(start - first) * k..(end - first) * k].par_chunks_mut(k))
                    .zip(proven.par_iter_mut())
                    .enumerate()
                    .with_min_len(256)
                    .for_each_init(Vec::new, |scratch, (j, ((ids, dists), ok))| {
                        let q = xq.row(start + j);
                        *ok = rerank.row(q, &row_of(j), scratch, ids, dists);
                    });
            } else {
                let mut ids_buf = vec![0u32; pending.len() * k];
                let mut dists_buf = vec![0f32; pending.len() * k];
                ids_buf
                    .par_chunks_mut(k)
                    .zip(dists_buf.par_chunks_mut(k))
                    .zip(proven.par_iter_mut())
                    .enumerate()
                    .with_min_len(64)
                    .for_each_init(Vec::new, |scratch, (j, ((ids, dists), ok))| {
                        let q = xq.row(pending[j] as usize);
                        *ok = rerank.row(q, &row_of(j), scratch, ids, dists);
                    });
                for (j, &qi) in pending.iter().enumerate() {
                    if proven[j] {
                        let qi = qi as usize - first;
                        out.ids[qi * k..(qi + 1) * k].copy_from_slice(&ids_buf[j * k..(j + 1) * k]);
                        out.distances[qi * k..(qi + 1) * k]
                            .copy_from_slice(&dists_buf[j * k..(j + 1) * k]);
                    }
                }
            }
            lap("re-rank", &mut since);
            pending = pending
                .iter()
                .zip(&proven)
                .filter(|(_, &ok)| !ok)
                .map(|(&qi, _)| qi)
                .collect();
            if pending.is_empty() {
                break;
            }
            width = (width * 4).min(available);
            if width > max_engine_width(available) {
                // Ties or rounding too wide for candidate lists: scan these rows exactly.
                let scanned: Vec<(Vec<u32>, Vec<f32>)> = pending
                    .par_iter()
                    .map(|&qi| {
                        let skip = self_join.then_some(qi);
                        let exact = exact_scan(metric, xb, xq.row(qi as usize), k, skip);
                        let (mut ids, mut dists) = (vec![0u32; k], vec![0f32; k]);
                        finish_row(metric, &exact, &mut ids, &mut dists);
                        (ids, dists)
                    })
                    .collect();
                for (&qi, (ids, dists)) in pending.iter().zip(scanned) {
                    let qi = qi as usize - first;
                    out.ids[qi * k..(qi + 1) * k].copy_from_slice(&ids);
                    out.distances[qi * k..(qi + 1) * k].copy_from_slice(&dists);
                }
                break;
            }
        }
        progress(end - first, rows.len());
    }
    lap("rounds done", &mut since);
    if let Some(i) = out.distances.par_iter().position_first(|d| !d.is_finite()) {
        return Err(KnnError::Overflow {
            metric: metric.name(),
            row: first + i / k,
        });
    }
    Ok(out)
}

/// The chosen k (selected by exact f64 key, sorted by (key, id)) as reported, into `ids` and
/// `dists`: f32 distances, ordered by (distance, id) — by decreasing similarity for the inner
/// product. Rounding to f32 can make distinct keys equal, so the order is fixed after rounding
/// (an insertion sort: the rows arrive sorted but for such groups).
fn finish_row(metric: &Metric, exact: &[(f64, u32)], ids: &mut [u32], dists: &mut [f32]) {
    let sign = if metric.is_similarity() { -1.0f32 } else { 1.0 };
    let before = |a: (f32, u32), b: (f32, u32)| {
        (sign * a.0)
            .total_cmp(&(sign * b.0))
            .then(a.1.cmp(&b.1))
            .is_lt()
    };
    for (t, e) in exact.iter().enumerate() {
        let item = (metric.distance_from_key(e.0), e.1);
        let mut p = t;
        while p > 0 && before(item, (dists[p - 1], ids[p - 1])) {
            dists[p] = dists[p - 1];
            ids[p] = ids[p - 1];
            p -= 1;
        }
        dists[p] = item.0;
        ids[p] = item.1;
    }
}

/// The k smallest exact keys of one query over the whole base, sorted by (key, id).
pub(crate) fn exact_scan(
    metric: &Metric,
    base: MatrixRef<'_>,
    q: &[f32],
    k: usize,
    skip: Option<u32>,
) -> Vec<(f64, u32)> {
    let mut all: Vec<(f64, u32)> = match metric {
        Metric::Expr(e) => {
            let ids: Vec<u32> = (0..base.rows() as u32)
                .filter(|&b| Some(b) != skip)
                .collect();
            let mut all = Vec::with_capacity(ids.len());
            e.keys(q, base, &ids, &mut all);
            all
        }
        _ => (0..base.rows() as u32)
            .filter(|&b| Some(b) != skip)
            .map(|b| (metric.exact_key(q, base.row(b as usize)), b))
            .collect(),
    };
    let cmp = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, cmp);
        all.truncate(k);
    }
    all.sort_unstable_by(cmp);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::oracle;
    use crate::synth::{generate, Distribution};

    /// An engine that returns every point (so the pipeline alone decides): enough to check
    /// that pieces of a graph are the graph's rows.
    struct AllPoints;

    impl Engine for AllPoints {
        fn name(&self) -> String {
            "all".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            let (nq, nb) = (req.queries.rows(), req.base.rows());
            let w = req.width;
            let mut ids = Vec::with_capacity(nq * w);
            let mut keys = Vec::with_capacity(nq * w);
            for i in 0..nq {
                let q = req.queries.row(i);
                let mut row: Vec<(f32, u32)> = (0..nb as u32)
                    .filter(|&b| req.exclude.is_none_or(|e| e[i] != b))
                    .map(|b| (req.kernel.exact(q, req.base.row(b as usize)) as f32, b))
                    .collect();
                row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                row.truncate(w);
                keys.extend(row.iter().map(|r| r.0));
                ids.extend(row.iter().map(|r| r.1));
            }
            // Exact f32 keys of f64 values: a floor just below the w-th, or +inf when complete.
            let floor = (0..nq)
                .map(|i| {
                    if w >= req.available() {
                        f32::INFINITY
                    } else {
                        keys[i * w + w - 1].next_down().next_down()
                    }
                })
                .collect();
            Ok(crate::Candidates {
                width: w,
                ids,
                keys,
                floor,
            })
        }
    }

    #[test]
    fn graph_rows_are_the_graphs_rows() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let p = Matrix::new("p", generate(u, 230, 5, 3), 5).unwrap();
        let whole = oracle(p.view(), None, 6, &Metric::L2).unwrap();
        let mut pieced = Neighbors::with_shape(0, 6);
        for r in [0..1, 1..100, 100..100, 100..230] {
            let part = graph_rows(&AllPoints, p.view(), r, 6, &Metric::L2, &|_, _| {}).unwrap();
            pieced.ids.extend(part.ids);
            pieced.distances.extend(part.distances);
        }
        assert_eq!(pieced.ids, whole.ids);
        assert!(graph_rows(&AllPoints, p.view(), 200..231, 6, &Metric::L2, &|_, _| {}).is_err());
    }
}
