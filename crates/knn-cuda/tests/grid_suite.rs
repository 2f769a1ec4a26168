//! The CUDA grid engine against the f64 oracle: the shared tile-edge suite, every metric the
//! grid supports in 1-3 dimensions, grid-specific adversarial data, and GPU = CPU grid. Without
//! a GPU every test prints SKIPPED and passes (`KNN_REQUIRE_GPU=1` makes that a failure).

use knn_core::synth::{generate, Distribution, Rng};
use knn_core::{search, KnnError, Matrix, Metric};
use knn_cuda::{CudaEngine, CudaGridEngine};
use knn_testkit::{self as kit, Case};

/// Device 0's grid, paired as `knn` pairs it: the CPU grid serves wide lists and d > 3.
fn engine() -> CudaGridEngine {
    CudaGridEngine::new(0)
        .expect("CUDA grid engine")
        .with_fallback(Box::new(knn_grid::GridEngine::default()))
}

fn m(data: Vec<f32>, d: usize) -> Matrix {
    Matrix::new("data", data, d).unwrap()
}

fn uniform(n: usize, d: usize, seed: u64) -> Vec<f32> {
    generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed)
}

#[test]
fn tile_edges() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "grid tile_edges") {
        return;
    }
    // The scan block (4096 cells) and the query block (128 threads) are the kernels' edges.
    kit::check_tile_edges(&engine(), &[128, 4096]);
}

#[test]
fn metrics_low_d() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "grid metrics_low_d") {
        return;
    }
    let mut cases = Vec::new();
    for d in [1usize, 2, 3] {
        for (mi, metric) in kit::grid_metrics(d).into_iter().enumerate() {
            for (nb, nq, k) in [
                (200usize, 37usize, 1usize),
                (530, 64, 8),
                (530, 64, 20),
                (97, 10, 97),
            ] {
                let seed = 100 + mi as u64 * 10 + nb as u64 + d as u64 * 1000;
                cases.push(Case {
                    name: format!("{metric} nb={nb} nq={nq} d={d} k={k} seed={seed}"),
                    base: m(uniform(nb, d, seed), d),
                    queries: Some(m(uniform(nq, d, seed + 1), d)),
                    k,
                    metric: metric.clone(),
                });
            }
            cases.push(Case {
                name: format!("{metric} graph nb=150 d={d} k=9"),
                base: m(uniform(150, d, 77 + mi as u64), d),
                queries: None,
                k: 9,
                metric: metric.clone(),
            });
        }
    }
    kit::run_cases(&engine(), &cases);
}

/// Data the grid finds hard: cell boundaries, one crowded cell, many identical points, queries
/// far outside the box, k beyond any cell's population, large offsets, tiny values, clusters.
#[test]
fn adversarial_low_d() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "grid adversarial_low_d") {
        return;
    }
    let d = 3;
    let mut rng = Rng::new(3);
    // An integer lattice: points on cell boundaries, many equal distances.
    let lattice: Vec<f32> = (0..1000)
        .flat_map(|i| [(i % 10) as f32, (i / 10 % 10) as f32, (i / 100) as f32])
        .collect();
    // 200 identical points and a few others.
    let mut same: Vec<f32> = (0..200).flat_map(|_| [0.5f32, 0.5, 0.5]).collect();
    same.extend(uniform(40, d, 5));
    // Almost everything in one tiny corner, a few points far away.
    let mut crowded: Vec<f32> = uniform(2000, d, 6).iter().map(|v| v * 1e-4).collect();
    crowded.extend(uniform(20, d, 7).iter().map(|v| v * 1e3));
    let offset: Vec<f32> = uniform(1500, d, 8).iter().map(|v| v + 4.0e6).collect();
    let tiny: Vec<f32> = uniform(800, d, 9).iter().map(|v| v * 1e-36).collect();
    let clustered = generate(
        Distribution::Clustered {
            clusters: 7,
            spread: 1e-3,
        },
        3000,
        d,
        10,
    );
    let far: Vec<f32> = (0..60)
        .flat_map(|_| {
            let s = if rng.below(2) == 0 { 1e4 } else { -1e4 };
            [s * rng.uniform() as f32, 0.5, -s]
        })
        .collect();
    let sets: Vec<(&str, Matrix, Matrix)> = vec![
        (
            "lattice",
            m(lattice.clone(), d),
            m(lattice[..300].to_vec(), d),
        ),
        ("identical", m(same.clone(), d), m(same[..90].to_vec(), d)),
        ("crowded", m(crowded.clone(), d), m(uniform(100, d, 11), d)),
        (
            "offset 4e6",
            m(offset.clone(), d),
            m(offset[..600].to_vec(), d),
        ),
        ("tiny", m(tiny.clone(), d), m(tiny[..300].to_vec(), d)),
        (
            "clustered",
            m(clustered.clone(), d),
            m(clustered[..900].to_vec(), d),
        ),
        ("far queries", m(uniform(3000, d, 12), d), m(far, d)),
    ];
    let mut cases = Vec::new();
    for (name, base, queries) in &sets {
        for metric in [Metric::L2, Metric::SqL2, Metric::L1, Metric::Linf] {
            cases.extend(kit::search_and_graph_cases(
                name,
                base,
                queries,
                &metric,
                &[1, 8, 32, 70],
                5,
            ));
        }
    }
    kit::run_cases(&engine(), &cases);
}

#[test]
fn gpu_grid_equals_cpu_grid() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "gpu_grid_equals_cpu_grid") {
        return;
    }
    let cpu = knn_grid::GridEngine::new(None).unwrap();
    let gpu = engine();
    for (d, n, k) in [
        (3usize, 100_000usize, 1usize),
        (3, 50_000, 16),
        (2, 40_000, 7),
        (1, 20_000, 3),
    ] {
        let b = m(uniform(n, d, d as u64), d);
        let q = m(uniform(n / 4, d, 9), d);
        for metric in [Metric::L2, Metric::L1] {
            let a = search(&cpu, b.view(), q.view(), k, &metric).unwrap();
            let g = search(&gpu, b.view(), q.view(), k, &metric).unwrap();
            assert_eq!(a, g, "d={d} n={n} k={k} {metric}");
        }
    }
}

#[test]
fn refuses_inner_product_and_cosine() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "grid refuses") {
        return;
    }
    let e = engine();
    let b = m(uniform(10, 3, 1), 3);
    for metric in [Metric::InnerProduct, Metric::Cosine] {
        let err = search(&e, b.view(), b.view(), 1, &metric).expect_err("refused");
        assert!(
            matches!(err, KnnError::Option(ref s) if s.contains("grid")),
            "{err}"
        );
    }
}

#[test]
fn a_base_changed_in_place_is_binned_anew() {
    if !kit::gpu_available_or_skip(CudaEngine::available(), "grid base changed in place") {
        return;
    }
    let e = engine();
    let mut data = uniform(5000, 3, 21);
    let q = m(uniform(300, 3, 22), 3);
    for round in 0..3 {
        let b = Matrix::new("base", data.clone(), 3).unwrap();
        let got = search(&e, b.view(), q.view(), 4, &Metric::L2).unwrap();
        let want = knn_core::oracle(b.view(), Some(q.view()), 4, &Metric::L2).unwrap();
        assert_eq!(got.ids, want.ids, "round {round}");
        // Move every point: a stale grid would now return wrong neighbours.
        data.iter_mut().for_each(|v| *v = (*v * 7.0 + 0.3).fract());
    }
    // The same buffer changed in place between two searches.
    let mut buf = uniform(5000, 3, 23);
    for round in 0..2 {
        let base = knn_core::MatrixRef::new("base", &buf, 3).unwrap();
        let got = search(&e, base, q.view(), 2, &Metric::L1).unwrap();
        let want = knn_core::oracle(base, Some(q.view()), 2, &Metric::L1).unwrap();
        assert_eq!(got.ids, want.ids, "in place, round {round}");
        buf.iter_mut().for_each(|v| *v = 1.0 - *v);
    }
}
