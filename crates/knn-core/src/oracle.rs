//! The f64 brute-force oracle and the tie-aware check that every engine, test and `knn verify`
//! use.

use crate::error::Result;
use crate::matrix::MatrixRef;
use crate::metric::Metric;
use crate::neighbors::Neighbors;
use crate::prepare::prepare;
use crate::search::exact_scan;
use rayon::prelude::*;

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
    let prep = prepare(metric, base, queries)?;
    let xb = prep.exact_base.view();
    let xq = prep.exact_queries().unwrap_or(xb);
    let rows: Vec<Vec<(f64, u32)>> = (0..xq.rows())
        .into_par_iter()
        .map(|i| {
            exact_scan(
                metric,
                xb,
                xq.row(i),
                k,
                queries.is_none().then_some(i as u32),
            )
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
    let prep = prepare(metric, base, queries)?;
    let xb = prep.exact_base.view();
    let xq = prep.exact_queries().unwrap_or(xb);
    let sim = metric.is_similarity();
    let nq = xq.rows();
    if result.k != k || result.rows() != nq {
        return Ok(CheckReport {
            rows: nq,
            bad_rows: nq,
            recall: 0.0,
            max_distance_error: f64::INFINITY,
            first_problem: Some(format!(
                "result is {}×{}, expected {nq}×{k}",
                result.rows(),
                result.k
            )),
        });
    }
    let per_row: Vec<(usize, f64, Option<String>)> = (0..nq)
        .into_par_iter()
        .map(|i| {
            let kth = truth.distances_of(i)[k - 1] as f64;
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
                if id as usize >= xb.rows() {
                    say(format!("id {id} out of range"), &mut problem);
                    continue;
                }
                if !seen.insert(id) {
                    say(format!("id {id} repeated"), &mut problem);
                    continue;
                }
                if queries.is_none() && id as usize == i {
                    say("the point itself was returned".into(), &mut problem);
                    continue;
                }
                let exact = metric
                    .distance_from_key(metric.exact_key(xq.row(i), xb.row(id as usize)))
                    as f64;
                let e = (dists[j] as f64 - exact).abs();
                err = err.max(e / scale);
                if exact == 0.0 && dists[j] != 0.0 {
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
                    let (a, b) = (dists[j - 1], dists[j]);
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
    Ok(rep)
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
