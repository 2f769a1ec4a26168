//! The f64 brute-force oracle and the tie-aware check that every engine, test and `knn verify`
//! use.

use crate::error::{KnnError, Result};
use crate::given::{check_given, round_to_f32, Given};
use crate::matrix::MatrixRef;
use crate::metric::Metric;
use crate::neighbors::Neighbors;
use crate::prepare::prepare;
use crate::search::exact_scan;
use crate::topk::TopK;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Relative tolerance of the exactness contract (of the k-th distance).
pub const DEFAULT_TOLERANCE: f64 = 1e-5;

/// Brute force in f64: for every query (or every point, excluding itself, when `queries` is
/// `None`) the k nearest by (exact distance, id). Slow (n_q·n·d f64 operations); for tests
/// and verification. Arguments must already be valid (see [`crate::search()`]).
pub fn oracle(
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
) -> Result<Neighbors> {
    oracle_counted(base, queries, k, metric, &RowCount::new(None))
}

/// Rows of a long computation done so far, told to a caller's `progress` (from any thread,
/// once per row; the counts rise but may arrive out of order).
struct RowCount<'a> {
    done: AtomicUsize,
    progress: Option<&'a (dyn Fn(usize) + Sync)>,
}

impl<'a> RowCount<'a> {
    fn new(progress: Option<&'a (dyn Fn(usize) + Sync)>) -> Self {
        RowCount {
            done: AtomicUsize::new(0),
            progress,
        }
    }

    fn one(&self) {
        if let Some(p) = self.progress {
            p(self.done.fetch_add(1, Relaxed) + 1);
        }
    }
}

/// [`oracle`], counting its rows.
fn oracle_counted(
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    count: &RowCount<'_>,
) -> Result<Neighbors> {
    let prep = prepare(metric, base, queries)?;
    let xb = prep.exact_base.view();
    let xq = prep.exact_queries().unwrap_or(xb);
    let rows: Vec<Vec<(f64, u32)>> = (0..xq.rows())
        .into_par_iter()
        .map(|i| {
            let row = exact_scan(
                metric,
                xb,
                xq.row(i),
                k,
                queries.is_none().then_some(i as u32),
            );
            count.one();
            row
        })
        .collect();
    let mut out = Neighbors::with_shape(xq.rows(), k);
    for (i, row) in rows.into_iter().enumerate() {
        for (j, (key, id)) in row.into_iter().enumerate() {
            out.ids[i * k + j] = id;
            out.distances[i * k + j] = metric.distance_from_key(key);
        }
    }
    Ok(out)
}

/// What [`check`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckReport {
    /// Rows checked.
    pub rows: usize,
    /// Rows with at least one problem.
    pub bad_rows: usize,
    /// Tie-aware recall: share of returned ids that belong to a true k-nearest set.
    pub recall: f64,
    /// Largest |reported − exact| distance, relative to the row's k-th distance (or absolute
    /// when that is 0).
    pub max_distance_error: f64,
    /// The first problem, in words.
    pub first_problem: Option<String>,
}

impl CheckReport {
    /// `true` when every row is a valid exact answer.
    pub fn passed(&self) -> bool {
        self.bad_rows == 0
    }
}

/// Tie-aware check of `result` against the f64 oracle: a row passes when its k ids are
/// distinct, valid and (for graphs) not the query itself, every returned id's exact distance is
/// within `tol` (relative to the k-th distance) of the true k-th distance or better, the reported
/// distances are within `tol` of the exact ones (exactly 0 where the exact distance is 0), and the
/// row is ordered. Ids among equal distances may differ from the oracle's: ties are sets.
pub fn check(
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    result: &Neighbors,
    tol: f64,
) -> Result<CheckReport> {
    let truth = oracle(base, queries, k, metric)?;
    check_with_truth(base, queries, k, metric, result, &truth, tol)
}

/// [`check`] against an oracle answer computed once (by [`oracle`] on the same arguments), for
/// checking several results of the same problem.
pub fn check_with_truth(
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    result: &Neighbors,
    truth: &Neighbors,
    tol: f64,
) -> Result<CheckReport> {
    check_against(base, queries, k, metric, result, truth, tol)
}

/// [`check_with_truth`] of a result with distances of any precision.
fn check_against<D: Copy + Into<f64> + std::fmt::Display + Sync>(
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    result: &Neighbors<D>,
    truth: &Neighbors,
    tol: f64,
) -> Result<CheckReport> {
    let prep = prepare(metric, base, queries)?;
    let xb = prep.exact_base.view();
    let xq = prep.exact_queries().unwrap_or(xb);
    let rows = Rows {
        queries: xq.rows(),
        base: xb.rows(),
        self_join: queries.is_none(),
    };
    let exact = |i: usize, id: usize| {
        metric.distance_from_key(metric.exact_key(xq.row(i), xb.row(id))) as f64
    };
    let kth = |i: usize| truth.distances_of(i)[k - 1] as f64;
    Ok(check_rows(rows, k, metric, result, &kth, &exact, tol))
}

impl CheckReport {
    /// [`check`] of rows given in f32 or f64 (see [`crate::given`]): the truth is the k
    /// nearest under the given values, found by brute force in f64, with distances in f64
    /// ([`Metric::distance_from_key_f64`]), so an answer computed on the f32 rounding of f64
    /// rows fails where the rounding changed it. `queries` `None`: a graph of `base`. The
    /// result's distances may be f32 or f64; each is compared with the f64 distance of the
    /// given rows within `tol` as [`check`] compares. Rows given in f32 alone are checked as
    /// [`check`] checks them; Mahalanobis and expression metrics refuse f64 rows (as
    /// [`crate::given::check_given`] says), and NaN, infinite or (for f64) beyond-f32 values
    /// are refused as [`crate::given::round_to_f32`] refuses them. `progress`, when given, is
    /// told the number of rows whose truth is known so far (from any thread, once per row):
    /// the truth is most of the time.
    #[allow(clippy::too_many_arguments)]
    pub fn of_given<D: Copy + Into<f64> + std::fmt::Display + Sync>(
        base: Given<'_>,
        queries: Option<Given<'_>>,
        dim: usize,
        k: usize,
        metric: &Metric,
        result: &Neighbors<D>,
        tol: f64,
        progress: Option<&(dyn Fn(usize) + Sync)>,
    ) -> Result<CheckReport> {
        let count = RowCount::new(progress);
        let any_f64 = base.is_f64() || queries.is_some_and(|q| q.is_f64());
        check_given(metric, any_f64)?;
        if let (false, Given::F32(b), None | Some(Given::F32(_))) = (any_f64, base, queries) {
            // f32 rows: the f32 oracle and check (Mahalanobis in its whitened space too).
            let b = MatrixRef::new("base", b, dim)?;
            let q = match queries {
                Some(Given::F32(q)) => Some(MatrixRef::new("queries", q, dim)?),
                _ => None,
            };
            let truth = oracle_counted(b, q, k, metric, &count)?;
            return check_against(b, q, k, metric, result, &truth, tol);
        }
        // NaN, infinities and values beyond f32's range refused as the engines refuse them.
        validate("base", base, dim)?;
        if let Some(q) = queries {
            validate("queries", q, dim)?;
        }
        let q_given = queries.unwrap_or(base);
        let rows = Rows {
            queries: q_given.len() / dim,
            base: base.len() / dim,
            self_join: queries.is_none(),
        };
        let available = rows.base - usize::from(rows.self_join);
        if k == 0 || k > available {
            return Err(KnnError::Option(format!(
                "k={k} but there are {available} points to choose from"
            )));
        }
        // The truth: the k nearest of every query under the given values, by (key, id).
        let kth: Vec<f64> = (0..rows.queries)
            .into_par_iter()
            .map(|i| {
                let skip = rows.self_join.then_some(i);
                let mut best = TopK::<f64>::new(k);
                for b in (0..rows.base).filter(|&b| Some(b) != skip) {
                    best.push(given_key(metric, q_given, i, base, b, dim), b as u32);
                }
                count.one();
                metric.distance_from_key_f64(best.into_sorted()[k - 1].0)
            })
            .collect();
        let exact = |i: usize, id: usize| {
            metric.distance_from_key_f64(given_key(metric, q_given, i, base, id, dim))
        };
        Ok(check_rows(
            rows,
            k,
            metric,
            result,
            &|i| kth[i],
            &exact,
            tol,
        ))
    }
}

/// Refuses rows the engines refuse: a shape that is no whole number of rows, NaN, infinities
/// and (for f64) values beyond f32's range.
fn validate(what: &str, g: Given<'_>, dim: usize) -> Result<()> {
    match g {
        Given::F32(v) => MatrixRef::new(what, v, dim).map(|_| ()),
        Given::F64(v) => round_to_f32(what, v, dim).map(|_| ()),
    }
}

/// The exact key of query row `qi` of `q` and base row `bi` of `b`, in their given types.
fn given_key(metric: &Metric, q: Given<'_>, qi: usize, b: Given<'_>, bi: usize, dim: usize) -> f64 {
    let (qs, bs) = (qi * dim..(qi + 1) * dim, bi * dim..(bi + 1) * dim);
    match (q, b) {
        (Given::F32(q), Given::F32(b)) => metric.exact_key(&q[qs], &b[bs]),
        (Given::F32(q), Given::F64(b)) => metric.exact_key(&q[qs], &b[bs]),
        (Given::F64(q), Given::F32(b)) => metric.exact_key(&q[qs], &b[bs]),
        (Given::F64(q), Given::F64(b)) => metric.exact_key(&q[qs], &b[bs]),
    }
}

/// The shape of a checked problem.
#[derive(Clone, Copy)]
struct Rows {
    queries: usize,
    base: usize,
    /// A graph: a row's own id may not be returned.
    self_join: bool,
}

/// The tie-aware check of [`check_with_truth`], on any rows: `kth(i)` is the true k-th
/// distance of row `i`, `exact(i, id)` the exact distance of row `i` to base point `id`.
fn check_rows<D: Copy + Into<f64> + std::fmt::Display + Sync>(
    shape: Rows,
    k: usize,
    metric: &Metric,
    result: &Neighbors<D>,
    kth: &(dyn Fn(usize) -> f64 + Sync),
    exact: &(dyn Fn(usize, usize) -> f64 + Sync),
    tol: f64,
) -> CheckReport {
    let sim = metric.is_similarity();
    let nq = shape.queries;
    if result.k != k || result.rows() != nq {
        return CheckReport {
            rows: nq,
            bad_rows: nq,
            recall: 0.0,
            max_distance_error: f64::INFINITY,
            first_problem: Some(format!(
                "result is {}×{}, expected {nq}×{k}",
                result.rows(),
                result.k
            )),
        };
    }
    let per_row: Vec<(usize, f64, Option<String>)> = (0..nq)
        .into_par_iter()
        .map(|i| {
            let kth = kth(i);
            let scale = kth.abs().max(f64::MIN_POSITIVE);
            let slack = tol * scale + 1e-30;
            let ids = result.ids_of(i);
            let dists = result.distances_of(i);
            let mut good = 0usize;
            let mut err = 0.0f64;
            let mut problem = None;
            let mut seen = std::collections::HashSet::with_capacity(k);
            for j in 0..k {
                let id = ids[j];
                let say = |p: String, problem: &mut Option<String>| {
                    if problem.is_none() {
                        *problem = Some(format!("row {i}, position {j}: {p}"));
                    }
                };
                if id as usize >= shape.base {
                    say(format!("id {id} out of range"), &mut problem);
                    continue;
                }
                if !seen.insert(id) {
                    say(format!("id {id} repeated"), &mut problem);
                    continue;
                }
                if shape.self_join && id as usize == i {
                    say("the point itself was returned".into(), &mut problem);
                    continue;
                }
                let exact = exact(i, id as usize);
                let reported: f64 = dists[j].into();
                let e = (reported - exact).abs();
                err = err.max(e / scale);
                if exact == 0.0 && reported != 0.0 {
                    say(
                        format!("id {id} is identical but reported at distance {}", dists[j]),
                        &mut problem,
                    );
                } else if e > slack {
                    say(
                        format!("id {id}: reported {} but exact is {exact}", dists[j]),
                        &mut problem,
                    );
                }
                let within = if sim {
                    exact >= kth - slack
                } else {
                    exact <= kth + slack
                };
                if within {
                    good += 1;
                } else {
                    say(
                        format!("id {id} at {exact} is not among the k nearest (k-th is {kth})"),
                        &mut problem,
                    );
                }
                if j > 0 {
                    let (a, b): (f64, f64) = (dists[j - 1].into(), reported);
                    let disordered = if sim { b > a } else { b < a };
                    if disordered || (a == b && ids[j - 1] > id) {
                        say("row not ordered by (distance, id)".into(), &mut problem);
                    }
                }
            }
            (good, err, problem)
        })
        .collect();
    let mut rep = CheckReport {
        rows: nq,
        ..Default::default()
    };
    let mut good = 0usize;
    for (g, e, p) in per_row {
        good += g;
        rep.max_distance_error = rep.max_distance_error.max(e);
        if p.is_some() {
            rep.bad_rows += 1;
            if rep.first_problem.is_none() {
                rep.first_problem = p;
            }
        }
    }
    rep.recall = if nq == 0 {
        1.0
    } else {
        good as f64 / (nq * k) as f64
    };
    rep
}

/// Plain id recall of `result` against ground-truth ids (`truth_k` per row, the first `k`
/// used): the share of returned ids found in the row's first k true ids. Without the data, ties
/// cannot be recognised; prefer [`check`] when the data is at hand.
pub fn id_recall(result: &Neighbors, truth: &[u32], truth_k: usize) -> f64 {
    let k = result.k.min(truth_k);
    let rows = result.rows();
    if rows == 0 || k == 0 {
        return 1.0;
    }
    let hits: usize = (0..rows)
        .map(|i| {
            let t = &truth[i * truth_k..i * truth_k + k];
            result.ids_of(i)[..k]
                .iter()
                .filter(|id| t.contains(id))
                .count()
        })
        .sum();
    hits as f64 / (rows * k) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::Covariance;

    /// The case: 1-D points closer together than an f32 step.
    const BASE: [f64; 4] = [1.0, 1.0 + 1e-9, 1.0 + 2e-9, 1.0 - 3e-9];
    const QUERY: [f64; 1] = [1.0 + 2.1e-9];

    fn answer<D>(ids: &[u32], distances: Vec<D>) -> Neighbors<D> {
        Neighbors {
            k: ids.len(),
            ids: ids.to_vec(),
            distances,
        }
    }

    fn check_f64<D: Copy + Into<f64> + std::fmt::Display + Sync>(
        result: &Neighbors<D>,
    ) -> CheckReport {
        let q = Some(Given::F64(&QUERY));
        CheckReport::of_given(
            Given::F64(&BASE),
            q,
            1,
            4,
            &Metric::L2,
            result,
            DEFAULT_TOLERANCE,
            None,
        )
        .unwrap()
    }

    #[test]
    fn f64_rows_are_checked_against_their_own_values() {
        let exact = [0.1e-9, 1.1e-9, 2.1e-9, 5.1e-9];
        let exact: Vec<f64> = [2usize, 1, 0, 3]
            .iter()
            .zip(exact)
            .map(|(&i, _)| (QUERY[0] - BASE[i]).abs())
            .collect();
        let right = check_f64(&answer(&[2, 1, 0, 3], exact.clone()));
        assert!(right.passed() && right.recall == 1.0, "{right:?}");
        // The same answer with its distances in f32 passes too (within the tolerance).
        let narrowed: Vec<f32> = exact.iter().map(|&d| d as f32).collect();
        assert!(check_f64(&answer(&[2, 1, 0, 3], narrowed)).passed());
        // The answer of the f32 rounding: every point at 0, ids in order.
        let rounded = check_f64(&answer(&[0, 1, 2, 3], vec![0.0f32; 4]));
        assert!(!rounded.passed(), "{rounded:?}");
        assert_eq!(rounded.bad_rows, 1);
        let p = rounded.first_problem.unwrap();
        assert!(p.contains("row 0, position 0: id 0: reported 0"), "{p}");
        // The right ids in the wrong order.
        let swapped = check_f64(&answer(
            &[1, 2, 0, 3],
            vec![exact[1], exact[0], exact[2], exact[3]],
        ));
        assert!(!swapped.passed());
        // k = 2: a far id fails recall.
        let q = Some(Given::F64(&QUERY[..]));
        let two = answer(&[2, 0], vec![exact[0], exact[2]]);
        let r = CheckReport::of_given(Given::F64(&BASE), q, 1, 2, &Metric::L2, &two, 1e-5, None)
            .unwrap();
        assert!(!r.passed() && r.recall == 0.5, "{r:?}");
    }

    #[test]
    fn f64_graphs_and_mixed_rows() {
        // Graph: each point's 3 nearest other points by (f64 distance, id).
        let d = |a: usize, b: usize| (BASE[a] - BASE[b]).abs();
        let mut rows = answer(&[], Vec::new());
        rows.k = 3;
        for i in 0..4 {
            let mut others: Vec<(f64, u32)> = (0..4)
                .filter(|&j| j != i)
                .map(|j| (d(i, j), j as u32))
                .collect();
            others.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            rows.ids.extend(others.iter().map(|p| p.1));
            rows.distances.extend(others.iter().map(|p| p.0));
        }
        assert_eq!(rows.ids_of(0), &[1, 2, 3]);
        let r = CheckReport::of_given(
            Given::F64(&BASE),
            None,
            1,
            3,
            &Metric::L2,
            &rows,
            1e-5,
            None,
        )
        .unwrap();
        assert!(r.passed(), "{r:?}");
        // The point itself is refused.
        let mut own = rows.clone();
        own.ids[0] = 0;
        let r = CheckReport::of_given(Given::F64(&BASE), None, 1, 3, &Metric::L2, &own, 1e-5, None)
            .unwrap();
        assert!(r.first_problem.unwrap().contains("the point itself"));
        // f32 queries against f64 rows: checked against the f64 values.
        let q32 = [1.0f32];
        let nn = answer(&[0, 1, 2], vec![0.0, 1e-9, 2e-9]);
        let r = CheckReport::of_given(
            Given::F64(&BASE),
            Some(Given::F32(&q32)),
            1,
            3,
            &Metric::L2,
            &nn,
            1e-5,
            None,
        )
        .unwrap();
        assert!(r.passed(), "{r:?}");
    }

    #[test]
    fn f32_rows_are_checked_as_check_does_and_f64_refusals() {
        let base = [0.0f32, 0.0, 1.0, 0.0, 5.0, 5.0];
        let q = [0.9f32, 0.1];
        let b = MatrixRef::new("base", &base, 2).unwrap();
        let qm = MatrixRef::new("queries", &q, 2).unwrap();
        let nn = oracle(b, Some(qm), 2, &Metric::L2).unwrap();
        let r = CheckReport::of_given(
            Given::F32(&base),
            Some(Given::F32(&q)),
            2,
            2,
            &Metric::L2,
            &nn,
            1e-5,
            None,
        )
        .unwrap();
        assert_eq!(r, check(b, Some(qm), 2, &Metric::L2, &nn, 1e-5).unwrap());
        assert!(r.passed());
        let maha = Metric::Mahalanobis(Covariance::FromBase);
        let e = CheckReport::of_given(Given::F64(&BASE), None, 1, 1, &maha, &nn, 1e-5, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("float64") && e.contains("float32"), "{e}");
        let nan = [1.0, f64::NAN];
        let e = CheckReport::of_given(Given::F64(&nan), None, 1, 1, &Metric::L2, &nn, 1e-5, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("base: row 1, column 0") && e.contains("NaN"),
            "{e}"
        );
        let e = CheckReport::of_given(Given::F64(&BASE), None, 1, 4, &Metric::L2, &nn, 1e-5, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("k=4") && e.contains('3'), "{e}");
    }
}
