//! The shared search pipeline: validate, prepare, ask an engine for candidates, re-rank them
//! exactly in f64, and widen the rows whose engine floor does not prove them complete.
//!
//! - [`schedule`]: one call from start to end: arguments checked, base and queries prepared
//!   (beside the engine's copy of the base and the output's pages), rounds of queries handed
//!   to the engine's workers, the output checked;
//! - [`rounds`]: one round: the first try, the exact re-rank, and the one widening rule for
//!   the rows whose floor does not prove them (wider lists, then an exact scan);
//! - [`rerank`]: the exact f64 keys of candidates and the rows they prove;
//! - [`keys`]: the exact keys of given (query, base row) pairs, for merges of partial answers.

mod keys;
mod rerank;
mod rounds;
mod schedule;

pub(crate) use keys::f32_pair_keys;
pub use keys::given_keys;
pub(crate) use rerank::exact_scan;

use crate::engine::Engine;
use crate::error::{KnnError, Result};
use crate::given::{Given, GivenRows};
use crate::matrix::MatrixRef;
use crate::metric::Metric;
use crate::neighbors::Neighbors;
use crate::prepare::PreparedBase;
use schedule::{run, Base};

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
    run(
        engine,
        Base::given(base),
        Some(queries),
        k,
        metric,
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
    let rows = 0..points.rows();
    run(engine, Base::given(points), None, k, metric, rows, progress)
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
    check_graph_rows(&rows, points.rows())?;
    run(engine, Base::given(points), None, k, metric, rows, progress)
}

/// [`search_with_progress`] against a base prepared once ([`PreparedBase::new`] of `base`
/// under `metric`; `base` holds the very rows it was made from, unchanged): the same answer,
/// without preparing the base again, and with the engine's copy of it (a device copy) kept
/// from one call to the next.
pub fn search_prepared(
    engine: &dyn Engine,
    prepared: &PreparedBase,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let rows = 0..queries.rows();
    let base = Base::prepared(base, prepared);
    run(engine, base, Some(queries), k, metric, rows, progress)
}

/// [`graph_rows`] of a base prepared once (see [`search_prepared`]).
pub fn graph_prepared(
    engine: &dyn Engine,
    prepared: &PreparedBase,
    points: MatrixRef<'_>,
    rows: std::ops::Range<usize>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    check_graph_rows(&rows, points.rows())?;
    let base = Base::prepared(points, prepared);
    run(engine, base, None, k, metric, rows, progress)
}

/// The first try of the whole kNN graph of a prepared base (see [`graph_prepared`]) as the
/// pipeline hands it to an engine that finishes rows itself ([`Engine::finish_rows`]): every
/// point's row, `k` neighbours, each excluding itself, the engine's first width; given to `f`
/// with the scale of the engine's keys (engine keys are exact keys times it), for an engine
/// that writes a graph where the pipeline's output is not (device memory). `None`, and `f`
/// not called, where the pipeline would not ask an engine to finish a graph's rows
/// (expression metrics, cosine, a base given in f64). Errors as [`graph_prepared`] on `k`.
pub fn with_graph_first_try<R>(
    engine: &dyn Engine,
    prepared: &PreparedBase,
    points: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    f: impl FnOnce(&crate::engine::CandidateRequest<'_>, f64) -> R,
) -> Result<Option<R>> {
    let available = crate::validate::validate(metric, points, None, k)?;
    let Some(prep) = prepared.with_queries(metric, points, None) else {
        return Ok(None);
    };
    let width0 = engine
        .candidate_width(k, available, metric.kernel())
        .clamp(k, available);
    let sizes = (k, available, width0, points.rows());
    let run = rounds::Run::new(metric, &prep, None, true, sizes, prepared.key, false);
    if !run.engine_may_finish() {
        return Ok(None);
    }
    let n = points.rows();
    let own: Vec<u32> = (0..n as u32).collect();
    let req = run.request(run.eq.slice_rows(0, n), &own, width0, Some(0..n), false);
    Ok(Some(f(&req, run.key_scale)))
}

/// [`search_prepared`] (or, with `prepared` `None`, [`search_with_progress`]) of rows given in
/// f64 as `given` (see [`crate::given`]): `base` and `queries` are their f32 rounding
/// ([`crate::given::round_to_f32`]; rows given in f32 are their own), on which the engine
/// computes; the exact re-rank takes the given values, and each row is proven against them.
/// Distances in f64: [`in_given_precision`].
#[allow(clippy::too_many_arguments)]
pub fn search_given(
    engine: &dyn Engine,
    prepared: Option<&PreparedBase>,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    given: &GivenRows<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    check_given_rows(metric, given, base, Some(queries))?;
    let rows = 0..queries.rows();
    let base = match prepared {
        Some(p) => Base::prepared(base, p),
        None => Base::given(base),
    };
    run(
        engine,
        base.rounded_from(given),
        Some(queries),
        k,
        metric,
        rows,
        progress,
    )
}

/// [`graph_prepared`] (or [`graph_rows`] with `prepared` `None`) of points given in f64 as
/// `given`, `points` their f32 rounding (see [`search_given`]).
#[allow(clippy::too_many_arguments)]
pub fn graph_given(
    engine: &dyn Engine,
    prepared: Option<&PreparedBase>,
    points: MatrixRef<'_>,
    given: &GivenRows<'_>,
    rows: std::ops::Range<usize>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    check_graph_rows(&rows, points.rows())?;
    check_given_rows(metric, given, points, None)?;
    let base = match prepared {
        Some(p) => Base::prepared(points, p),
        None => Base::given(points),
    };
    run(
        engine,
        base.rounded_from(given),
        None,
        k,
        metric,
        rows,
        progress,
    )
}

/// `given` describes rows of the shapes of `base` and `queries`, under a metric that takes f64.
fn check_given_rows(
    metric: &Metric,
    given: &GivenRows<'_>,
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
) -> Result<()> {
    crate::given::check_given(
        metric,
        given.base.is_f64() || given.queries.is_some_and(|q| q.is_f64()),
    )?;
    for (what, g) in [("base", Some(given.base)), ("queries", given.queries)] {
        if let Some(Given::F64(v)) = g {
            crate::given::check_given_domain(metric, what, v, given.dim)?;
        }
    }
    let shape = |g: Given<'_>, m: MatrixRef<'_>| g.len() == m.rows() * m.dim();
    let fits = given.dim == base.dim()
        && shape(given.base, base)
        && match (given.queries, queries) {
            (Some(g), Some(q)) => shape(g, q),
            (None, None) => true,
            _ => false,
        };
    if fits {
        Ok(())
    } else {
        Err(KnnError::Option(
            "the rows as given do not match the shapes of their f32 rounding".into(),
        ))
    }
}

/// Neighbours with distances in f64, from rows given in f64 (see [`search_given`]): each
/// distance taken again from the given rows (the key the re-rank chose by, so the sets stay),
/// and each row ordered by (distance, id) in f64. Row `i` of `out` is query `first + i` (a
/// piece of a graph: point `first + i`).
pub fn in_given_precision(
    metric: &Metric,
    given: &GivenRows<'_>,
    out: Neighbors,
    first: usize,
) -> Neighbors<f64> {
    use rayon::prelude::*;
    let k = out.k;
    let keys = given_keys(metric, given, &out.ids, k, first);
    let mut distances = vec![0.0f64; out.ids.len()];
    let mut ids = out.ids;
    let sign = if metric.is_similarity() { -1.0 } else { 1.0 };
    ids.par_chunks_mut(k.max(1))
        .zip(distances.par_chunks_mut(k.max(1)))
        .zip(keys.par_chunks(k.max(1)))
        .for_each(|((ids, dists), keys)| {
            let mut row: Vec<(f64, u32)> = (keys.iter().zip(ids.iter()))
                .map(|(&key, &b)| (metric.distance_from_key_f64(key), b))
                .collect();
            row.sort_by(|a, b| (sign * a.0).total_cmp(&(sign * b.0)).then(a.1.cmp(&b.1)));
            for ((id, dist), (d, b)) in ids.iter_mut().zip(dists.iter_mut()).zip(row) {
                *id = b;
                *dist = d;
            }
        });
    Neighbors { k, ids, distances }
}

/// Rows of a graph of `n` points.
fn check_graph_rows(rows: &std::ops::Range<usize>, n: usize) -> Result<()> {
    if rows.start > rows.end || rows.end > n {
        return Err(KnnError::Option(format!(
            "graph rows {}..{} outside the {n} points",
            rows.start, rows.end,
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rerank::{cosine_keys, finish_row, hellinger_keys, sum_sq, BaseAux};
    use super::*;
    use crate::engine::{CandidateRequest, FinishedRows, PinnedOutput};
    use crate::matrix::Matrix;
    use crate::oracle::oracle;
    use crate::synth::{generate, Distribution};

    #[test]
    fn hellinger_and_cosine_keys_are_exact_key_bit_for_bit() {
        for d in [13usize, 256] {
            // Values over many magnitudes, zeros included.
            let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
            let base: Vec<f32> = generate(u, 50, d, 7)
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    if i % 11 == 0 {
                        0.0
                    } else {
                        v * 10f32.powi((i % 9) as i32 - 3)
                    }
                })
                .collect();
            let q: Vec<f32> = generate(u, 1, d, 8).iter().map(|v| v * 4e6).collect();
            let roots: Vec<f64> = base.iter().map(|&v| (v as f64).sqrt()).collect();
            let rq: Vec<f64> = q.iter().map(|&v| (v as f64).sqrt()).collect();
            let ids: Vec<u32> = (0..21).map(|i| (i * 7 % 50) as u32).collect();
            let mut got = Vec::new();
            hellinger_keys(&rq, &roots, d, &ids, &mut got);
            assert_eq!(got.len(), ids.len());
            for (&(key, id), &want_id) in got.iter().zip(&ids) {
                let b = &base[want_id as usize * d..(want_id as usize + 1) * d];
                let want = Metric::Hellinger.exact_key(&q, b);
                assert_eq!((key.to_bits(), id), (want.to_bits(), want_id), "d={d}");
            }
            // Cosine, with the query equal to one candidate row (the −1 case).
            let xb = MatrixRef::new("b", &base, d).unwrap();
            let Some(BaseAux::CosineNorms(norms)) = BaseAux::new(&Metric::Cosine, xb) else {
                panic!("no cosine norms");
            };
            for q in [&q[..], xb.row(14)] {
                let mut got = Vec::new();
                cosine_keys(q, sum_sq(q), xb, &norms, &ids, &mut got);
                for (&(key, id), &want_id) in got.iter().zip(&ids) {
                    let want = Metric::Cosine.exact_key(q, xb.row(want_id as usize));
                    assert_eq!((key.to_bits(), id), (want.to_bits(), want_id), "d={d}");
                }
            }
        }
    }

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
                floor_bounds_rounding: true,
            })
        }
    }

    /// Keys far from the exact ones (id 1's 0.2 above) under floors that are exact lower
    /// bounds of the points left out, not the last key less a rounding bound: the contract
    /// allows it, and [`Candidates::floor_bounds_rounding`] says so.
    struct LooseKeys;

    impl Engine for LooseKeys {
        fn name(&self) -> String {
            "loose".into()
        }
        fn candidate_width(&self, _: usize, available: usize, _: crate::Kernel) -> usize {
            3.min(available)
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            let (nq, nb, w) = (req.queries.rows(), req.base.rows(), req.width);
            let (mut ids, mut keys, mut floor) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..nq {
                let q = req.queries.row(i);
                let exact = |b: u32| req.kernel.exact(q, req.base.row(b as usize));
                let mut row: Vec<(f32, u32)> = (0..nb as u32)
                    .map(|b| ((exact(b) + if b == 1 { 0.2 } else { 0.0 }) as f32, b))
                    .collect();
                row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                let left = row[w..]
                    .iter()
                    .map(|r| exact(r.1))
                    .fold(f64::INFINITY, f64::min);
                floor.push((left as f32).next_down());
                keys.extend(row[..w].iter().map(|r| r.0));
                ids.extend(row[..w].iter().map(|r| r.1));
            }
            Ok(crate::Candidates {
                width: w,
                ids,
                keys,
                floor,
                floor_bounds_rounding: false,
            })
        }
    }

    /// The re-rank reads every candidate of a row whose floor is not a rounding margin: here
    /// the nearest point (id 1, at 1.0) comes second by its key, after id 0 (at 1.1), and a
    /// margin recovered from the floor (the last key less a floor far above it) would have
    /// stopped before it.
    #[test]
    fn floors_that_are_no_rounding_margin_keep_every_candidate() {
        let base = Matrix::new("base", vec![1.1f32.sqrt(), 1.0, 3f32.sqrt(), 4.0, 5.0], 1).unwrap();
        let query = Matrix::new("queries", vec![0.0], 1).unwrap();
        let got = search(&LooseKeys, base.view(), query.view(), 1, &Metric::SqL2).unwrap();
        assert_eq!(got.ids, [1]);
    }

    /// [`AllPoints`] that finishes even rows itself (as the re-rank would) and leaves odd rows
    /// unproven, with garbage in their outputs.
    #[derive(Default)]
    struct Finisher(std::sync::atomic::AtomicUsize);

    impl Engine for Finisher {
        fn name(&self) -> String {
            "finisher".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            AllPoints.candidates(req)
        }
        fn finish_rows(&self, req: &CandidateRequest<'_>, out: FinishedRows<'_>) -> Result<bool> {
            let (metric, k) = (out.metric, out.k);
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let c = AllPoints.candidates(req)?;
            let w = c.width;
            let (all_ids, all_dists) = out.out.buffers();
            for i in 0..req.queries.rows() {
                let (ids, dists) = (&mut all_ids[i * k..][..k], &mut all_dists[i * k..][..k]);
                if i % 2 == 1 {
                    ids.fill(u32::MAX);
                    dists.fill(-1.0);
                    out.proven[i] = false;
                    continue;
                }
                let q = req.queries.row(i);
                let mut row: Vec<(f64, u32)> = c.ids[i * w..(i + 1) * w]
                    .iter()
                    .map(|&b| (req.kernel.exact(q, req.base.row(b as usize)), b))
                    .collect();
                row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                row.truncate(k);
                out.proven[i] = row[k - 1].0 < c.floor[i] as f64 || w >= req.available();
                finish_row(metric, &row, ids, dists);
            }
            Ok(true)
        }
    }

    #[test]
    fn rows_finished_by_the_engine_equal_the_rerank() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let b = Matrix::new("b", generate(u, 300, 3, 8), 3).unwrap();
        let q = Matrix::new("q", generate(u, 41, 3, 9), 3).unwrap();
        for metric in [Metric::L2, Metric::L1, Metric::SqL2] {
            let e = Finisher(Default::default());
            let got = search(&e, b.view(), q.view(), 4, &metric).unwrap();
            assert_eq!(e.0.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert_eq!(
                got,
                search(&AllPoints, b.view(), q.view(), 4, &metric).unwrap()
            );
            let want = oracle(b.view(), Some(q.view()), 4, &metric).unwrap();
            assert_eq!(got.ids, want.ids, "{metric}");
            let g = graph(&e, b.view(), 3, &metric).unwrap();
            assert_eq!(g, graph(&AllPoints, b.view(), 3, &metric).unwrap());
        }
    }

    /// [`Finisher`] that records the pipeline's calls of the output and graph hooks.
    #[derive(Default)]
    struct Hooks {
        finisher: Finisher,
        calls: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    }

    impl Hooks {
        fn log(&self, what: String) {
            self.calls.lock().unwrap().push(what);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    impl Engine for Hooks {
        fn name(&self) -> String {
            "hooks".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            self.finisher.candidates(req)
        }
        fn finish_rows(&self, req: &CandidateRequest<'_>, out: FinishedRows<'_>) -> Result<bool> {
            self.finisher.finish_rows(req, out)
        }
        fn begin_graph(
            &self,
            first: &CandidateRequest<'_>,
            finish: Option<(&Metric, usize)>,
        ) -> Result<()> {
            let rows = (first.queries.rows(), first.exclude.map(<[u32]>::len));
            let (w, k) = (first.width, finish.map(|(_, k)| k));
            self.log(format!(
                "begin {rows:?} w={w} k={k:?} first={}",
                !first.precise
            ));
            Ok(())
        }
        fn pin_output(&self, ids: &mut [u32], distances: &mut [f32]) -> Option<PinnedOutput> {
            self.log(format!("pin {} {}", ids.len(), distances.len()));
            // Logs its release when dropped.
            struct Unpin(std::sync::Arc<std::sync::Mutex<Vec<String>>>, String);
            impl Drop for Unpin {
                fn drop(&mut self) {
                    self.0.lock().unwrap().push(std::mem::take(&mut self.1));
                }
            }
            let what = format!("unpin {} {}", ids.len(), distances.len());
            Some(PinnedOutput::new(Unpin(self.calls.clone(), what)))
        }
    }

    #[test]
    fn output_and_graph_hooks_are_called_in_order() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let b = Matrix::new("b", generate(u, 300, 3, 8), 3).unwrap();
        let q = Matrix::new("q", generate(u, 41, 3, 9), 3).unwrap();
        let e = Hooks::default();
        let g = graph(&e, b.view(), 3, &Metric::L2).unwrap();
        assert_eq!(g, graph(&AllPoints, b.view(), 3, &Metric::L2).unwrap());
        // (The output is pinned on a thread of its own, at any point before the rounds.)
        let mut calls = e.take();
        let at = calls.iter().position(|c| c == "pin 900 900");
        assert!(at.is_some_and(|i| i < 2), "{calls:?}");
        calls.remove(at.unwrap());
        // Told of the graph (first tries 7 wide: the default width for k = 3) and that the
        // rows will be finished.
        assert_eq!(
            calls,
            [
                "begin (0, Some(0)) w=7 k=Some(3) first=true",
                "unpin 900 900"
            ]
        );
        // A search: no graph hook; the output is pinned and unpinned.
        search(&e, b.view(), q.view(), 4, &Metric::L2).unwrap();
        assert_eq!(e.take(), ["pin 164 164", "unpin 164 164"]);
        // An error after the output was made unpins it too.
        let mut bad = generate(u, 300, 3, 8);
        bad[7] = -1.0;
        let bad = Matrix::new("b", bad, 3).unwrap();
        assert!(graph(&e, bad.view(), 3, &Metric::Hellinger).is_err());
        assert_eq!(e.take(), ["pin 900 900", "unpin 900 900"]);
    }

    /// [`AllPoints`] asking for every point on first tries (lists 8 200 wide, so that the
    /// host's candidate budget holds 1 024 rows) and for rounds of any size: it records the
    /// most rows of one request.
    #[derive(Default)]
    struct Wide(std::sync::atomic::AtomicUsize);

    impl Engine for Wide {
        fn name(&self) -> String {
            "wide".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            let rows = req.queries.rows();
            self.0.fetch_max(rows, std::sync::atomic::Ordering::Relaxed);
            AllPoints.candidates(req)
        }
        fn candidate_width(&self, _: usize, available: usize, _: crate::Kernel) -> usize {
            available
        }
        fn min_round_queries(&self) -> usize {
            1 << 20
        }
    }

    /// A round the engine was to finish but did not asks for its candidates in pieces within
    /// the host's budget, and answers as the oracle does.
    #[test]
    fn unfinished_rounds_ask_in_pieces() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let b = Matrix::new("b", generate(u, 8200, 2, 3), 2).unwrap();
        let q = Matrix::new("q", generate(u, 2100, 2, 4), 2).unwrap();
        let e = Wide::default();
        let got = search(&e, b.view(), q.view(), 3, &Metric::L2).unwrap();
        assert_eq!(
            got,
            oracle(b.view(), Some(q.view()), 3, &Metric::L2).unwrap()
        );
        // 64 MiB of 8-byte entries, 8 200 per row: 1 023 rows, raised to the least of 1 024.
        assert_eq!(e.0.load(std::sync::atomic::Ordering::Relaxed), 1024);
    }

    /// Hellinger's check of the base rides on the preparation's pass: a negative value is still
    /// named, for graphs and searches, in base and queries; -0 is no negative.
    #[test]
    fn hellinger_domain_errors_name_the_value() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let mut v = generate(u, 300, 3, 8);
        v[57 * 3 + 2] = -0.5;
        v[200 * 3] = -1.0;
        let bad = Matrix::new("b", v, 3).unwrap();
        let good = Matrix::new("q", generate(u, 20, 3, 9), 3).unwrap();
        let named = |r: Result<Neighbors>, want: (&str, usize, usize)| match r {
            Err(KnnError::Negative { what, row, col, .. }) => {
                assert_eq!((what.as_str(), row, col), want)
            }
            r => panic!("{:?}", r.map(|_| ())),
        };
        named(
            graph(&AllPoints, bad.view(), 3, &Metric::Hellinger),
            ("base", 57, 2),
        );
        named(
            search(&AllPoints, bad.view(), good.view(), 3, &Metric::Hellinger),
            ("base", 57, 2),
        );
        named(
            search(&AllPoints, good.view(), bad.view(), 3, &Metric::Hellinger),
            ("queries", 57, 2),
        );
        let mut v = generate(u, 300, 3, 8);
        v[5] = -0.0;
        let zero = Matrix::new("b", v, 3).unwrap();
        assert!(graph(&AllPoints, zero.view(), 3, &Metric::Hellinger).is_ok());
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
