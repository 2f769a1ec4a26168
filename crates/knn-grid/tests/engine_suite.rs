//! The shared engine suite on the grid engine, with 1 and 2 threads: tile edges as the testkit
//! runs them (d up to 1000: slow for a grid but still exact), and every metric the grid
//! supports.

use knn_core::synth::{generate, Distribution};
use knn_core::{search, KnnError, Matrix, Metric};
use knn_grid::GridEngine;
use knn_testkit::{self as kit, Case};

fn engines() -> Vec<GridEngine> {
    vec![
        GridEngine::new(Some(1)).unwrap(),
        GridEngine::new(Some(2)).unwrap(),
    ]
}

fn uniform(n: usize, d: usize, seed: u64) -> Matrix {
    Matrix::new(
        "uniform",
        generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed),
        d,
    )
    .unwrap()
}

#[test]
fn tile_edges() {
    for e in engines() {
        // The chunk of queries per task and the crowded-cell threshold are the grid's edges.
        kit::check_tile_edges(&e, &[48, 256]);
    }
}

#[test]
fn metrics_low_d() {
    let mut cases = Vec::new();
    for d in [1usize, 2, 3, 12] {
        for (mi, metric) in kit::grid_metrics(d).into_iter().enumerate() {
            for (nb, nq, k) in [(200usize, 37usize, 1usize), (530, 64, 20), (97, 10, 97)] {
                let seed = 100 + mi as u64 * 10 + nb as u64 + d as u64 * 1000;
                cases.push(Case {
                    name: format!("{metric} nb={nb} nq={nq} d={d} k={k} seed={seed}"),
                    base: uniform(nb, d, seed),
                    queries: Some(uniform(nq, d, seed + 1)),
                    k,
                    metric: metric.clone(),
                });
            }
            cases.push(Case {
                name: format!("{metric} graph nb=150 d={d} k=9"),
                base: uniform(150, d, 77 + mi as u64),
                queries: None,
                k: 9,
                metric: metric.clone(),
            });
        }
    }
    for e in engines() {
        kit::run_cases(&e, &cases);
    }
}

#[test]
fn inner_product_and_cosine_are_refused_clearly() {
    let e = GridEngine::new(Some(1)).unwrap();
    let b = uniform(10, 3, 1);
    for m in [Metric::InnerProduct, Metric::Cosine] {
        let err = search(&e, b.view(), b.view(), 1, &m).expect_err("must be refused");
        match err {
            KnnError::Option(msg) => {
                assert!(msg.contains("grid") && msg.contains("cosine"), "{msg}")
            }
            other => panic!("expected an option error, got {other}"),
        }
    }
}

#[test]
fn errors_of_the_pipeline_still_apply() {
    let e = GridEngine::new(Some(1)).unwrap();
    let b = uniform(10, 3, 1);
    let q4 = uniform(2, 4, 3);
    assert_eq!(
        search(&e, b.view(), b.view(), 0, &Metric::L2).unwrap_err(),
        KnnError::ZeroK
    );
    assert!(matches!(
        search(&e, b.view(), b.view(), 11, &Metric::L2).unwrap_err(),
        KnnError::KTooLarge { k: 11, n: 10, .. }
    ));
    assert!(matches!(
        search(&e, b.view(), q4.view(), 1, &Metric::L2).unwrap_err(),
        KnnError::DimMismatch { .. }
    ));
}
