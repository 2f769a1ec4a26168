//! # knn-testkit
//!
//! One test body for every engine. Each `check_*` function runs a family of cases through
//! the shared pipeline ([`knn_core::search()`] / [`knn_core::graph()`]) with the given engine
//! and compares every row with the f64 oracle ([`knn_core::check()`]); it panics with the list
//! of failing cases (seed, sizes, metric, first problem) so a failure can be replayed.
//!
//! GPU engines call [`gpu_available_or_skip`] first: without a device the tests print that
//! they were skipped, unless `KNN_REQUIRE_GPU=1`, which turns a missing device into a failure.

use knn_core::synth::{generate, Distribution, Rng};
use knn_core::{
    check, check_with_truth, graph, oracle, search, Covariance, Engine, KnnError, Matrix,
    MatrixRef, Metric, MetricExpr, DEFAULT_TOLERANCE,
};
use std::sync::Arc;

/// An expression metric ([`Metric::Expr`]) from its text.
pub fn expr(text: &str) -> Metric {
    Metric::Expr(Arc::new(
        MetricExpr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}")),
    ))
}

/// Expression metrics for data in `[0, 1)`: the built-in metrics spelled out, division, exp and
/// log, several channels, an accumulation that is not monotone, one that is not symmetric, and
/// one with negative keys.
pub fn expr_metrics() -> Vec<Metric> {
    [
        "acc + abs(x - y)",
        "max(acc, abs(x - y))",
        "acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)",
        "acc + (x - y)^2 ; sqrt(acc)",
        "acc + abs(x - y) / (x + y + 1)",
        "acc + log(1 + abs(x - y)) * exp(-x)",
        "acc + abs(x - y) * sqrt(x + 1) + (sqrt(y) - x)^2",
        "0.75 * acc + abs(x - y)^3",
        "acc + abs(x - 2 * y)",
        "acc - x * y",
    ]
    .into_iter()
    .map(expr)
    .collect()
}

/// Every metric: [`plain_metrics`], Mahalanobis with the base's covariance and with a fixed
/// one, and [`expr_metrics`].
pub fn all_metrics(d: usize) -> Vec<Metric> {
    let mut cov = vec![0.0f32; d * d];
    for i in 0..d {
        for j in 0..d {
            cov[i * d + j] = if i == j {
                2.0
            } else {
                0.5 / (1.0 + (i as f32 - j as f32).abs())
            };
        }
    }
    let mahalanobis = [
        Metric::Mahalanobis(Covariance::FromBase),
        Metric::Mahalanobis(Covariance::Given(Arc::new(
            Matrix::new("cov", cov, d).unwrap(),
        ))),
    ];
    plain_metrics()
        .into_iter()
        .chain(mahalanobis)
        .chain(expr_metrics())
        .collect()
}

/// The built-in metrics that take no parameters (all but Mahalanobis).
pub fn plain_metrics() -> Vec<Metric> {
    Metric::PLAIN.to_vec()
}

/// One case: data, k, metric, self-join or not.
pub struct Case {
    /// Description for failure messages.
    pub name: String,
    /// Base points.
    pub base: Matrix,
    /// Queries (`None`: graph / self-join).
    pub queries: Option<Matrix>,
    /// Neighbours.
    pub k: usize,
    /// Metric.
    pub metric: Metric,
}

impl Case {
    /// Runs the case with `engine`; `Err` describes the failure.
    pub fn run(&self, engine: &dyn Engine) -> Result<(), String> {
        let b = self.base.view();
        let q = self.queries.as_ref().map(|q| q.view());
        let res = match q {
            Some(q) => search(engine, b, q, self.k, &self.metric),
            None => graph(engine, b, self.k, &self.metric),
        }
        .map_err(|e| format!("{}: error {e}", self.name))?;
        compare_with_oracle(&self.name, b, q, self.k, &self.metric, &res)
    }
}

/// `Err` describing the first problem when `res` is not an exact answer for base `b` and
/// queries `q` (`None`: the graph of `b`), by the tie-aware check against the f64 oracle.
pub fn compare_with_oracle(
    name: &str,
    b: MatrixRef<'_>,
    q: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    res: &knn_core::Neighbors,
) -> Result<(), String> {
    let rep = check(b, q, k, metric, res, DEFAULT_TOLERANCE)
        .map_err(|e| format!("{name}: oracle error {e}"))?;
    if rep.passed() {
        Ok(())
    } else {
        Err(format!(
            "{name}: {} of {} rows wrong, recall {:.5}, first: {}",
            rep.bad_rows,
            rep.rows,
            rep.recall,
            rep.first_problem.unwrap_or_default()
        ))
    }
}

/// [`compare_with_oracle`] that panics with the problem.
pub fn check_with_oracle(
    name: &str,
    b: MatrixRef<'_>,
    q: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    res: &knn_core::Neighbors,
) {
    if let Err(e) = compare_with_oracle(name, b, q, k, metric, res) {
        panic!("{e}");
    }
}

fn matrix(data: Vec<f32>, d: usize) -> Matrix {
    Matrix::new("generated", data, d).expect("generated data is finite")
}

fn uniform(n: usize, d: usize, seed: u64) -> Matrix {
    matrix(
        generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed),
        d,
    )
}

/// The metrics whose kernel has a distance-to-cell bound (all but inner product, cosine and
/// expressions): what grid engines support.
pub fn grid_metrics(d: usize) -> Vec<Metric> {
    all_metrics(d)
        .into_iter()
        .filter(|m| !matches!(m, Metric::InnerProduct | Metric::Cosine | Metric::Expr(_)))
        .collect()
}

/// A search case for each k of `ks` (those up to the base size) and a graph case with
/// `graph_k`, all on `base` / `queries` under `metric`, named after `name`.
pub fn search_and_graph_cases(
    name: &str,
    base: &Matrix,
    queries: &Matrix,
    metric: &Metric,
    ks: &[usize],
    graph_k: usize,
) -> Vec<Case> {
    let mut cases: Vec<Case> = ks
        .iter()
        .filter(|&&k| k >= 1 && k <= base.rows())
        .map(|&k| Case {
            name: format!("{name} {metric} k={k}"),
            base: base.clone(),
            queries: Some(queries.clone()),
            k,
            metric: metric.clone(),
        })
        .collect();
    cases.push(Case {
        name: format!("{name} {metric} graph k={graph_k}"),
        base: base.clone(),
        queries: None,
        k: graph_k,
        metric: metric.clone(),
    });
    cases
}

/// Runs every case on `engine` and fails listing every case that failed.
pub fn run_cases(engine: &dyn Engine, cases: &[Case]) {
    let failures: Vec<String> = cases.iter().filter_map(|c| c.run(engine).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed on engine {}:\n{}",
        failures.len(),
        cases.len(),
        engine.name(),
        failures.join("\n")
    );
}

/// Random uniform data at sizes on tile edges, for the tile sizes the engine names (its query
/// tile and base tile, for example), k from 1 to n, d from 1 to 1000, search and graph.
pub fn check_tile_edges(engine: &dyn Engine, tiles: &[usize]) {
    let mut sizes = vec![1usize, 2, 3, 17, 31];
    for &t in tiles {
        sizes.extend([t - 1, t, t + 1]);
    }
    sizes.sort_unstable();
    sizes.dedup();
    let mut cases = Vec::new();
    let mut seed = 1;
    for &nb in &sizes {
        for &nq in &[1usize, 5, sizes[sizes.len() / 2]] {
            for &d in &[1usize, 3, 16, 33] {
                for k in [1, 4.min(nb), nb] {
                    seed += 1;
                    cases.push(Case {
                        name: format!("uniform nb={nb} nq={nq} d={d} k={k} seed={seed}"),
                        base: uniform(nb, d, seed),
                        queries: Some(uniform(nq, d, seed + 1000)),
                        k,
                        metric: Metric::SqL2,
                    });
                }
            }
        }
        if nb >= 2 {
            seed += 1;
            cases.push(Case {
                name: format!("graph nb={nb} d=8 k={} seed={seed}", (nb - 1).min(7)),
                base: uniform(nb, 8, seed),
                queries: None,
                k: (nb - 1).min(7),
                metric: Metric::L2,
            });
        }
    }
    for &d in &[128usize, 257, 1000] {
        seed += 1;
        cases.push(Case {
            name: format!("uniform nb=300 nq=20 d={d} k=10 seed={seed}"),
            base: uniform(300, d, seed),
            queries: Some(uniform(20, d, seed + 7)),
            k: 10,
            metric: Metric::SqL2,
        });
    }
    run_cases(engine, &cases);
}

/// Every metric on random data, search and graph, small and large k.
pub fn check_metrics(engine: &dyn Engine) {
    let mut cases = Vec::new();
    for (mi, metric) in all_metrics(12).into_iter().enumerate() {
        for (nb, nq, k) in [(200usize, 37usize, 1usize), (530, 64, 20), (97, 10, 97)] {
            let seed = 100 + mi as u64 * 10 + nb as u64;
            cases.push(Case {
                name: format!("{metric} nb={nb} nq={nq} d=12 k={k} seed={seed}"),
                base: uniform(nb, 12, seed),
                queries: Some(uniform(nq, 12, seed + 1)),
                k,
                metric: metric.clone(),
            });
        }
        cases.push(Case {
            name: format!("{metric} graph nb=150 d=12 k=9"),
            base: uniform(150, 12, 77 + mi as u64),
            queries: None,
            k: 9,
            metric: metric.clone(),
        });
    }
    run_cases(engine, &cases);
}

/// Duplicates, equidistant points, large offsets, values near the f32 limits, clustered data.
pub fn check_adversarial(engine: &dyn Engine) {
    let mut cases = Vec::new();
    let metrics = [
        Metric::SqL2,
        Metric::L2,
        Metric::L1,
        Metric::Linf,
        Metric::InnerProduct,
        Metric::Cosine,
        expr("acc + abs(x - y)"),
        expr("max(acc, abs(x - y))"),
        expr("acc + (x - y)^2 ; sqrt(acc)"),
    ];
    let d = 6;
    // Many exact duplicates: ties everywhere, distance exactly 0.
    let mut rng = Rng::new(5);
    let protos = generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, 7, d, 9);
    let dup: Vec<f32> = (0..300)
        .flat_map(|_| {
            let p = rng.below(7) as usize;
            protos[p * d..(p + 1) * d].to_vec()
        })
        .collect();
    // Integer lattice: many equal distances.
    let lattice: Vec<f32> = (0..343)
        .flat_map(|i| {
            [
                (i % 7 + 1) as f32,
                (i / 7 % 7 + 1) as f32,
                (i / 49 + 1) as f32,
            ]
        })
        .collect();
    // Large offset: points near 4e6 with jitter below 1 (the GEMM form alone fails here).
    let mut off = generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, 400, d, 11);
    off.iter_mut().for_each(|v| *v += 4.0e6);
    // Two far-apart tight clusters: centring alone does not help.
    let mut two = generate(Distribution::Uniform { lo: 0.0, hi: 0.5 }, 400, d, 12);
    two.iter_mut().enumerate().for_each(|(i, v)| {
        if (i / d) % 2 == 0 {
            *v += 1.0e5
        } else {
            *v -= 1.0e5
        }
    });
    // Near the f32 limits.
    let huge: Vec<f32> = generate(Distribution::Uniform { lo: -1.0, hi: 1.0 }, 200, d, 13)
        .iter()
        .map(|v| v * 3.0e37)
        .collect();
    let tiny: Vec<f32> = generate(Distribution::Uniform { lo: -1.0, hi: 1.0 }, 200, d, 14)
        .iter()
        .map(|v| v * 1.0e-36)
        .collect();
    let clustered = generate(
        Distribution::Clustered {
            clusters: 5,
            spread: 1e-4,
        },
        500,
        d,
        15,
    );
    let sets: Vec<(&str, Matrix)> = vec![
        ("duplicates", matrix(dup, d)),
        ("lattice", matrix(lattice, 3)),
        ("offset 4e6", matrix(off, d)),
        ("two far clusters", matrix(two, d)),
        ("near f32 max", matrix(huge, d)),
        ("near f32 min", matrix(tiny, d)),
        ("clustered", matrix(clustered, d)),
    ];
    for (name, data) in &sets {
        let n = data.rows();
        let dd = data.dim();
        let split = n * 3 / 4;
        let all = data.view().as_slice();
        let base = matrix(all[..split * dd].to_vec(), dd);
        let queries = matrix(all[split * dd..].to_vec(), dd);
        // Hellinger where the values are non-negative: near 4e6 its square roots round by as
        // much as the distances between them, which the preparation must keep inside the bounds.
        let hellinger =
            matches!(*name, "offset 4e6" | "duplicates" | "lattice").then_some(Metric::Hellinger);
        for metric in metrics.iter().chain(hellinger.as_ref()) {
            if *name == "near f32 max"
                && matches!(
                    metric,
                    Metric::SqL2 | Metric::InnerProduct | Metric::Expr(_)
                )
            {
                continue; // their values overflow f32: checked in check_errors / check_expr
            }
            for k in [1usize, 10, 50] {
                cases.push(Case {
                    name: format!("{name} {metric} k={k}"),
                    base: base.clone(),
                    queries: Some(queries.clone()),
                    k,
                    metric: metric.clone(),
                });
            }
            cases.push(Case {
                name: format!("{name} {metric} graph k=10"),
                base: data.clone(),
                queries: None,
                k: 10,
                metric: metric.clone(),
            });
        }
    }
    run_cases(engine, &cases);
}

/// Bad input gives the right error, never a panic.
pub fn check_errors(engine: &dyn Engine) {
    let b = uniform(10, 3, 1);
    let q = uniform(2, 3, 2);
    let q4 = uniform(2, 4, 3);
    let (bv, qv) = (b.view(), q.view());
    let e = |r: knn_core::Result<knn_core::Neighbors>| r.expect_err("must fail");
    assert_eq!(e(search(engine, bv, qv, 0, &Metric::L2)), KnnError::ZeroK);
    let big = e(search(engine, bv, qv, 11, &Metric::L2));
    assert!(
        big.to_string().contains("k=11") && big.to_string().contains("10"),
        "{big}"
    );
    let g = e(graph(engine, bv, 10, &Metric::L2));
    assert!(
        g.to_string().contains("k=10") && g.to_string().contains('9'),
        "{g}"
    );
    assert_eq!(
        e(search(engine, bv, q4.view(), 1, &Metric::L2)),
        KnnError::DimMismatch {
            base: 3,
            queries: 4
        }
    );
    let empty = MatrixRef::new("base", &[], 3).unwrap();
    assert_eq!(
        e(search(engine, empty, qv, 1, &Metric::L2)),
        KnnError::EmptyBase
    );
    let neg = matrix(vec![0.5, -0.25, 1.0], 3);
    let h = e(search(engine, neg.view(), qv, 1, &Metric::Hellinger));
    assert!(
        matches!(h, KnnError::Negative { row: 0, col: 1, .. }),
        "{h}"
    );
    let huge = matrix(vec![3e37, -3e37, 1.0], 3);
    let o = e(search(
        engine,
        huge.view(),
        huge.view(),
        1,
        &Metric::InnerProduct,
    ));
    assert!(matches!(o, KnnError::Overflow { row: 0, .. }), "{o}");
    let nan = MatrixRef::new("queries", &[1.0, f32::NAN, 0.0], 3).unwrap_err();
    assert!(
        matches!(nan, KnnError::NonFinite { row: 0, col: 1, .. }),
        "{nan}"
    );
}

/// Expression metrics against the built-in metrics they spell (tie-aware: the expression's rows
/// must be true nearest sets under the built-in metric, distances within tolerance; Hellinger,
/// whose f64 keys are the same operations, must give identical results), then the expression
/// suite on varied data, and errors with their columns.
pub fn check_expr(engine: &dyn Engine) {
    let mut failures = Vec::new();
    let same_as = [
        ("acc + abs(x - y)", Metric::L1),
        ("max(acc, abs(x - y))", Metric::Linf),
        ("acc + (x - y)^2 ; sqrt(acc)", Metric::L2),
        ("acc + (x - y)^2", Metric::SqL2),
        (
            "acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)",
            Metric::Hellinger,
        ),
    ];
    for (text, builtin) in same_as {
        for (nb, nq, d, k) in [
            (500usize, 40usize, 24usize, 10usize),
            (300, 7, 128, 16),
            (64, 3, 3, 64),
        ] {
            let seed = 900 + nb as u64 + d as u64;
            let b = uniform(nb, d, seed);
            let q = uniform(nq, d, seed + 1);
            let m = expr(text);
            for queries in [Some(q.view()), None] {
                let k = k.min(nb - usize::from(queries.is_none()));
                let name = format!(
                    "{text} as {builtin} nb={nb} nq={nq} d={d} k={k} {}",
                    if queries.is_some() { "search" } else { "graph" }
                );
                let run = |metric: &Metric| match queries {
                    Some(q) => search(engine, b.view(), q, k, metric),
                    None => graph(engine, b.view(), k, metric),
                };
                let (got, want) = match (run(&m), run(&builtin)) {
                    (Ok(g), Ok(w)) => (g, w),
                    (g, w) => {
                        failures.push(format!("{name}: {:?} / {:?}", g.err(), w.err()));
                        continue;
                    }
                };
                let truth = oracle(b.view(), queries, k, &builtin).expect("oracle");
                let rep = check_with_truth(
                    b.view(),
                    queries,
                    k,
                    &builtin,
                    &got,
                    &truth,
                    DEFAULT_TOLERANCE,
                )
                .expect("check");
                if !rep.passed() {
                    failures.push(format!("{name}: {:?}", rep.first_problem));
                }
                if builtin == Metric::Hellinger && got != want {
                    failures.push(format!("{name}: differs from the built-in Hellinger"));
                }
            }
        }
    }
    // The expression suite on clustered data and duplicates (many near ties).
    let d = 9;
    let clustered = matrix(
        generate(
            Distribution::Clustered {
                clusters: 4,
                spread: 1e-3,
            },
            400,
            d,
            31,
        )
        .into_iter()
        .map(|v| v.abs())
        .collect(),
        d,
    );
    let protos = generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, 5, d, 32);
    let dup = matrix(
        (0..200)
            .flat_map(|i| protos[(i % 5) * d..(i % 5 + 1) * d].to_vec())
            .collect(),
        d,
    );
    let mut cases = Vec::new();
    for (name, data) in [("clustered", &clustered), ("duplicates", &dup)] {
        let split = data.rows() * 3 / 4;
        let all = data.view().as_slice();
        let base = matrix(all[..split * d].to_vec(), d);
        let queries = matrix(all[split * d..].to_vec(), d);
        for metric in expr_metrics() {
            cases.extend(search_and_graph_cases(
                name,
                &base,
                &queries,
                &metric,
                &[1, 12],
                12,
            ));
        }
    }
    failures.extend(cases.iter().filter_map(|c| c.run(engine).err()));
    // Errors name the column of the operation and the data that breaks it.
    let b = uniform(20, 4, 3);
    let mut neg = b.view().as_slice().to_vec();
    neg[2 * 4 + 1] = -0.5;
    let neg = matrix(neg, 4);
    let mut zero = b.view().as_slice().to_vec();
    zero[7] = 0.0;
    let zero = matrix(zero, 4);
    let e = |r: knn_core::Result<knn_core::Neighbors>| match r {
        Err(KnnError::Expr(e)) => Some(e),
        _ => None,
    };
    let cases: Vec<(&str, Option<knn_core::ExprError>, usize, &str)> = vec![
        (
            "sqrt of a negative value",
            e(search(
                engine,
                neg.view(),
                b.view(),
                3,
                &expr("acc + (sqrt(x) - sqrt(y))^2"),
            )),
            18,
            "base row 2, column 1",
        ),
        (
            "a divisor that can be 0",
            e(graph(
                engine,
                zero.view(),
                3,
                &expr("acc + abs(x - y) / (x + y)"),
            )),
            18,
            "divisor",
        ),
        (
            "f32 overflow",
            e(graph(
                engine,
                b.view(),
                3,
                &expr("acc + exp(100 * abs(x - y))"),
            )),
            7,
            "f32 range",
        ),
        (
            "a final step that decreases",
            e(graph(
                engine,
                b.view(),
                3,
                &expr("acc + abs(x - y) ; 1 - acc"),
            )),
            20,
            "must not decrease",
        ),
    ];
    for (what, err, col, text) in cases {
        match err {
            Some(e) if e.column() == col && e.message().contains(text) => {}
            other => failures.push(format!(
                "{what}: expected column {col} and '{text}', got {other:?}"
            )),
        }
    }
    assert!(
        failures.is_empty(),
        "{} expression checks failed on engine {}:\n{}",
        failures.len(),
        engine.name(),
        failures.join("\n")
    );
}

/// Whether a GPU test may run: `available` says whether the engine found a device. Without
/// one the test prints that it was skipped and returns `false`; with `KNN_REQUIRE_GPU=1` it
/// panics instead.
pub fn gpu_available_or_skip(available: bool, test: &str) -> bool {
    if available {
        return true;
    }
    if std::env::var("KNN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("{test}: KNN_REQUIRE_GPU=1 but no usable CUDA device was found");
    }
    eprintln!("{test}: SKIPPED (no CUDA device; set KNN_REQUIRE_GPU=1 to make this a failure)");
    false
}
