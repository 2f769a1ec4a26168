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
    run(engine, base, Some(queries), k, metric, available, progress)
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
    run(engine, points, None, k, metric, available, progress)
}

/// Queries per round when reporting progress: small enough for a smooth bar, large enough to
/// keep every engine's tiles full.
const MIN_ROUND: usize = 4096;

fn run(
    engine: &dyn Engine,
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    available: usize,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let prep = prepare(metric, base, queries)?;
    let eb = prep.engine_base();
    let eq = prep.engine_queries();
    let xb = prep.exact_base.view();
    let xq = prep.exact_queries().unwrap_or(xb);
    let self_join = queries.is_none();
    let nq = eq.rows();
    let mut out = Neighbors::with_shape(nq, k);
    let kernel = metric.kernel();
    let width0 = engine
        .candidate_width(k, available, kernel)
        .clamp(k, available);
    let per_round = (CANDIDATE_BYTES_PER_ROUND / (8 * width0))
        .max(1024)
        .min((nq / 32).max(MIN_ROUND));

    for start in (0..nq).step_by(per_round) {
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
            let cand = engine.candidates(&CandidateRequest {
                base: eb,
                queries: qv,
                kernel,
                width,
                exclude,
                precise: !contiguous,
            })?;
            debug_assert_eq!(cand.ids.len(), pending.len() * width);
            // Re-rank each row exactly; keep rows whose floor proves them complete.
            let finished: Vec<Option<(Vec<u32>, Vec<f32>)>> = pending
                .par_iter()
                .enumerate()
                .map(|(j, &qi)| {
                    let ids = &cand.ids[j * width..(j + 1) * width];
                    let keys = &cand.keys[j * width..(j + 1) * width];
                    let q = xq.row(qi as usize);
                    // The engine's rounding bound, recovered from its floor; candidates whose
                    // key less that bound exceeds an exact k-th key cannot enter the top k.
                    let floor = cand.floor[j] as f64;
                    let slack = if floor.is_finite() {
                        keys[width - 1] as f64 - floor
                    } else {
                        f64::INFINITY
                    };
                    let mut exact: Vec<(f64, u32)> = Vec::with_capacity(width);
                    let mut kth_bound = f64::INFINITY;
                    for (&b, &key) in ids.iter().zip(keys) {
                        if exact.len() >= k && key as f64 - slack > kth_bound {
                            break;
                        }
                        exact.push((metric.exact_key(q, xb.row(b as usize)), b));
                        if exact.len() == k {
                            kth_bound = exact.iter().map(|e| e.0).fold(f64::NEG_INFINITY, f64::max)
                                * prep.key_scale;
                        }
                    }
                    exact.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                    let kth = exact[k - 1].0;
                    if kth * prep.key_scale < cand.floor[j] as f64 || width >= available {
                        Some(finish_row(metric, &exact[..k]))
                    } else {
                        None
                    }
                })
                .collect();
            let mut failed = Vec::new();
            for (j, row) in finished.into_iter().enumerate() {
                let qi = pending[j] as usize;
                match row {
                    Some((ids, dists)) => {
                        out.ids[qi * k..(qi + 1) * k].copy_from_slice(&ids);
                        out.distances[qi * k..(qi + 1) * k].copy_from_slice(&dists);
                    }
                    None => failed.push(pending[j]),
                }
            }
            pending = failed;
            if pending.is_empty() {
                break;
            }
            width = (width * 4).min(available);
            if width > max_engine_width(available) {
                // Ties or rounding too wide for candidate lists: scan these rows exactly.
                let rows: Vec<(Vec<u32>, Vec<f32>)> = pending
                    .par_iter()
                    .map(|&qi| {
                        let skip = self_join.then_some(qi);
                        let exact = exact_scan(metric, xb, xq.row(qi as usize), k, skip);
                        finish_row(metric, &exact)
                    })
                    .collect();
                for (&qi, (ids, dists)) in pending.iter().zip(rows) {
                    let qi = qi as usize;
                    out.ids[qi * k..(qi + 1) * k].copy_from_slice(&ids);
                    out.distances[qi * k..(qi + 1) * k].copy_from_slice(&dists);
                }
                break;
            }
        }
        progress(end, nq);
    }
    if let Some(i) = out.distances.iter().position(|d| !d.is_finite()) {
        return Err(KnnError::Overflow {
            metric: metric.name(),
            row: i / k,
        });
    }
    Ok(out)
}

/// The chosen k (selected by exact f64 key) as reported: f32 distances, ordered by
/// (distance, id) — by decreasing similarity for the inner product. Rounding to f32 can make
/// distinct keys equal, so the order is fixed after rounding.
fn finish_row(metric: &Metric, exact: &[(f64, u32)]) -> (Vec<u32>, Vec<f32>) {
    let sign = if metric.is_similarity() { -1.0f32 } else { 1.0 };
    let mut row: Vec<(f32, u32)> = exact
        .iter()
        .map(|e| (metric.distance_from_key(e.0), e.1))
        .collect();
    row.sort_by(|a, b| (sign * a.0).total_cmp(&(sign * b.0)).then(a.1.cmp(&b.1)));
    row.into_iter().map(|(d, i)| (i, d)).unzip()
}

/// The k smallest exact keys of one query over the whole base, sorted by (key, id).
pub(crate) fn exact_scan(
    metric: &Metric,
    base: MatrixRef<'_>,
    q: &[f32],
    k: usize,
    skip: Option<u32>,
) -> Vec<(f64, u32)> {
    let mut all: Vec<(f64, u32)> = (0..base.rows() as u32)
        .filter(|&b| Some(b) != skip)
        .map(|b| (metric.exact_key(q, base.row(b as usize)), b))
        .collect();
    let cmp = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, cmp);
        all.truncate(k);
    }
    all.sort_unstable_by(cmp);
    all
}
