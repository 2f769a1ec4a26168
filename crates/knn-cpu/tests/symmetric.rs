//! The symmetric kNN graph (each unordered pair computed once) against its contract and
//! against the one-sided path.

use knn_core::synth::{generate, Distribution};
use knn_core::{
    check, check_with_truth, graph, Engine, GraphRequest, Kernel, Matrix, MatrixRef, Metric,
    Symmetry, DEFAULT_TOLERANCE,
};
use knn_cpu::CpuEngine;
use knn_testkit::all_metrics;

/// Engine variants (threads, arithmetic) with the given symmetry.
fn engines(symmetry: Symmetry) -> Vec<(String, CpuEngine)> {
    [
        ("1 thread", CpuEngine::new(Some(1)).unwrap()),
        ("2 threads", CpuEngine::new(Some(2)).unwrap()),
        ("3 threads", CpuEngine::new(Some(3)).unwrap()),
        ("f32 only", CpuEngine::new(Some(2)).unwrap().f32_only()),
    ]
    .into_iter()
    .map(|(name, e)| (name.to_string(), e.with_symmetry(symmetry)))
    .collect()
}

fn data(dist: Distribution, n: usize, d: usize, seed: u64) -> Matrix {
    Matrix::new("points", generate(dist, n, d, seed), d).unwrap()
}

/// Data sets: sizes around the block edges (64-row alignment, 512-row blocks), duplicates
/// (ties at distance 0), a lattice (many equal distances) and an offset far from the origin.
fn data_sets() -> Vec<(String, Matrix)> {
    let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let mut sets: Vec<(String, Matrix)> = [2usize, 3, 63, 64, 65, 129, 511, 512, 513, 1100]
        .iter()
        .map(|&n| (format!("uniform n={n} d=9"), data(u, n, 9, n as u64)))
        .collect();
    sets.push((
        "gaussian n=700 d=40".into(),
        data(Distribution::Gaussian, 700, 40, 3),
    ));
    let protos = generate(u, 5, 7, 11);
    let dups: Vec<f32> = (0..600)
        .flat_map(|i| protos[(i * 7 % 5) * 7..(i * 7 % 5 + 1) * 7].to_vec())
        .collect();
    sets.push((
        "duplicates n=600".into(),
        Matrix::new("dups", dups, 7).unwrap(),
    ));
    let lattice: Vec<f32> = (0..729)
        .flat_map(|i| [(i % 9) as f32, (i / 9 % 9) as f32, (i / 81) as f32])
        .collect();
    sets.push((
        "lattice n=729".into(),
        Matrix::new("lattice", lattice, 3).unwrap(),
    ));
    let mut far = generate(u, 300, 6, 5);
    far.iter_mut().for_each(|v| *v += 4.0e6);
    sets.push((
        "offset 4e6 n=300".into(),
        Matrix::new("far", far, 6).unwrap(),
    ));
    sets
}

/// Every row holds `width` distinct ids other than its own, sorted by (key, id), and its floor
/// is at most the exact (f64) key of every point left out: the contract of
/// `Engine::graph_candidates`, checked on raw data (the engine space) for each kernel.
#[test]
fn candidates_keep_the_contract() {
    let kernels = [Kernel::SqL2, Kernel::NegDot, Kernel::L1, Kernel::Linf];
    for (name, points) in data_sets() {
        let (n, p) = (points.rows(), points.view());
        for kernel in kernels {
            for (ename, engine) in engines(Symmetry::On) {
                for width in [1, 5.min(n - 1), (n - 1) / 2 + 1, n - 1] {
                    let precise = width == 1;
                    let (c, stats) = engine
                        .symmetric_candidates(p, kernel, width, precise)
                        .unwrap();
                    let half = (n * (n - 1) / 2) as u64;
                    assert!(stats.pair_keys >= half, "{name}: {stats:?}");
                    for i in 0..n {
                        let ids = &c.ids[i * width..(i + 1) * width];
                        let keys = &c.keys[i * width..(i + 1) * width];
                        let what = format!("{name} {kernel:?} {ename} width={width} row {i}");
                        let mut seen = vec![false; n];
                        for (t, &j) in ids.iter().enumerate() {
                            assert!(j as usize != i && !seen[j as usize], "{what}: id {j}");
                            seen[j as usize] = true;
                            if t > 0 {
                                let prev = (keys[t - 1], ids[t - 1]);
                                assert!(prev < (keys[t], j), "{what}: order at {t}");
                            }
                        }
                        let floor = c.floor[i] as f64;
                        if width == n - 1 {
                            assert_eq!(floor, f64::INFINITY, "{what}");
                            continue;
                        }
                        for j in (0..n).filter(|&j| j != i && !seen[j]) {
                            let exact = kernel.exact(p.row(i), p.row(j));
                            assert!(
                                floor <= exact,
                                "{what}: floor {floor} above the exact key {exact} of {j}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The symmetric graph equals the one-sided graph (tie-aware, and in fact id for id: both are
/// exact and ordered by (distance, id)) and passes the oracle, for every metric.
#[test]
fn symmetric_graph_equals_one_sided() {
    let one_sided = CpuEngine::new(Some(2))
        .unwrap()
        .with_symmetry(Symmetry::Off);
    let mut failures = Vec::new();
    for (name, points) in data_sets() {
        let (n, p) = (points.rows(), points.view());
        if n < 3 {
            continue;
        }
        for metric in all_metrics(points.dim()) {
            if matches!(metric, Metric::Mahalanobis(_)) && n <= points.dim() + 1 {
                continue; // a covariance estimated from so few points is singular
            }
            if name.starts_with("duplicates") && matches!(metric, Metric::Mahalanobis(_)) {
                continue; // 5 distinct points in d=7: singular as well
            }
            if name.starts_with("lattice") && matches!(metric, Metric::Cosine) {
                continue; // the lattice holds the origin, where cosine is undefined
            }
            let mut ks = vec![1, 10.min(n - 1)];
            if n <= 130 {
                ks.push(n - 1);
            }
            for k in ks {
                let truth = match graph(&one_sided, p, k, &metric) {
                    Ok(t) => t,
                    Err(e) => {
                        // Outside the metric's domain (negative values for Hellinger): the
                        // symmetric path must refuse the same way.
                        let sym = CpuEngine::new(Some(2)).unwrap().with_symmetry(Symmetry::On);
                        assert_eq!(graph(&sym, p, k, &metric).unwrap_err(), e);
                        continue;
                    }
                };
                for (ename, engine) in engines(Symmetry::On)
                    .into_iter()
                    .filter(|(e, _)| e != "3 threads")
                {
                    let what = format!("{name} {metric} k={k} {ename}");
                    let got = graph(&engine, p, k, &metric).unwrap();
                    let rep =
                        check_with_truth(p, None, k, &metric, &got, &truth, DEFAULT_TOLERANCE)
                            .unwrap();
                    if !rep.passed() || got.ids != truth.ids {
                        failures.push(format!("{what}: differs from one-sided: {rep:?}"));
                        continue;
                    }
                    if k == 10.min(n - 1) && ename == "2 threads" {
                        let rep = check(p, None, k, &metric, &got, DEFAULT_TOLERANCE).unwrap();
                        if !rep.passed() {
                            failures.push(format!("{what}: oracle: {rep:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `Auto` takes the symmetric path only from `SYMMETRIC_MIN_POINTS` on, `Off` never, `On`
/// always; the direct kernels' symmetric candidates do not depend on the thread count (the
/// blocks do: a pair's key is computed the same way in any block).
#[test]
fn modes_and_thread_independence() {
    let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let small = data(u, knn_cpu::SYMMETRIC_MIN_POINTS - 1, 8, 1);
    let large = data(u, knn_cpu::SYMMETRIC_MIN_POINTS, 24, 2);
    let e = |s| CpuEngine::new(Some(2)).unwrap().with_symmetry(s);
    let asks = |engine: &CpuEngine, m: &Matrix| {
        engine
            .graph_candidates(GraphRequest {
                points: m.view(),
                kernel: Kernel::L1,
                width: 8,
                precise: false,
            })
            .is_some()
    };
    assert!(!asks(&e(Symmetry::Auto), &small));
    assert!(asks(&e(Symmetry::Auto), &large));
    assert!(!asks(&e(Symmetry::Off), &large));
    assert!(asks(&e(Symmetry::On), &small));
    let p: MatrixRef<'_> = large.view();
    for kernel in [Kernel::L1, Kernel::Linf] {
        let runs: Vec<_> = [1, 2, 3]
            .iter()
            .map(|&t| {
                CpuEngine::new(Some(t))
                    .unwrap()
                    .symmetric_candidates(p, kernel, 12, false)
                    .unwrap()
                    .0
            })
            .collect();
        assert_eq!(runs[0], runs[1]);
        assert_eq!(runs[0], runs[2]);
    }
}
