//! Rows given in f64 are the truth: an index of f64 rows (or f64 queries) gives the k nearest
//! under the f64 values, ordered by (f64 distance, id), with f64 distances, on data where the
//! f32 rounding alone would give another order (points closer than an f32 step, far from the
//! origin). Checked against a brute force in f64 for every metric that takes f64, on the CPU
//! and, where one is usable, the GPU. Also: cosine with all-zero rows (distance 1 to every
//! row, scikit-learn's convention).

mod common;

use common::{cpu, gpu};
use knn::synth::{generate, Distribution};
use knn::{Index, MatrixRef, Metric, Options};
use knn_testkit::all_metrics;

/// The k nearest of every query by brute force on the f64 values: (distance, id) pairs.
fn oracle(
    metric: &Metric,
    base: &[f64],
    queries: &[f64],
    d: usize,
    k: usize,
) -> Vec<Vec<(f64, u32)>> {
    queries
        .chunks(d)
        .map(|q| {
            let mut all: Vec<(f64, u32)> = base
                .chunks(d)
                .enumerate()
                .map(|(i, b)| (metric.exact_key(q, b), i as u32))
                .collect();
            all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            all.truncate(k);
            all.iter()
                .map(|&(key, i)| (metric.distance_from_key_f64(key), i))
                .collect()
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * (1.0 + a.abs().max(b.abs()))
}

/// Compares an answer with the oracle's: ids equal, distances equal to 1e-12 (relative).
fn compare(what: &str, got: &knn::Neighbors<f64>, want: &[Vec<(f64, u32)>]) -> Vec<String> {
    let mut bad = Vec::new();
    for (qi, w) in want.iter().enumerate() {
        let ids: Vec<u32> = w.iter().map(|p| p.1).collect();
        let dists: Vec<f64> = w.iter().map(|p| p.0).collect();
        let (gi, gd) = (got.ids_of(qi), got.distances_of(qi));
        if gi != ids.as_slice() || !gd.iter().zip(&dists).all(|(&a, &b)| close(a, b)) {
            bad.push(format!(
                "{what}: query {qi}: got {gi:?} {gd:?}, want {ids:?} {dists:?}"
            ));
            break;
        }
    }
    bad
}

fn uniform(n: usize, d: usize, seed: u64) -> Vec<f64> {
    generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, seed)
        .into_iter()
        .map(f64::from)
        .collect()
}

/// (name, base, queries) in f64: plain; far from the origin with jitter below an f32 step
/// (every f32 rounding ties); duplicates (exact ties, broken by id).
fn data_sets(d: usize) -> Vec<(&'static str, Vec<f64>, Vec<f64>)> {
    let jitter = |n: usize, seed: u64| -> Vec<f64> {
        uniform(n, d, seed)
            .iter()
            .map(|v| 1000.0 + (v - 0.5) * 1e-7)
            .collect()
    };
    let protos = uniform(4, d, 9);
    let dup: Vec<f64> = (0..300)
        .flat_map(|i| protos[(i % 4) * d..(i % 4 + 1) * d].to_vec())
        .collect();
    vec![
        ("uniform", uniform(520, d, 1), uniform(40, d, 2)),
        ("jitter below an f32 step", jitter(400, 3), jitter(30, 4)),
        ("duplicates", dup.clone(), dup[..20 * d].to_vec()),
    ]
}

/// Every metric that takes f64 rows, on every data set: the f64 index's search and graph equal
/// the f64 brute force; f64 queries against an f32 index too.
fn f64_rows_are_exact(opts: &Options) {
    let (d, k) = (5, 7);
    let mut failures = Vec::new();
    for metric in all_metrics(d) {
        if matches!(metric, Metric::Mahalanobis(_) | Metric::Expr(_)) {
            continue;
        }
        for (name, base, queries) in data_sets(d) {
            let what = format!("{} on {name}", metric.name());
            let index = Index::new(base.clone(), d, metric.clone(), opts).unwrap();
            let got = index.search_f64(&queries, k, &|_, _| {}).unwrap();
            failures.extend(compare(
                &what,
                &got,
                &oracle(&metric, &base, &queries, d, k),
            ));

            // The graph: each point's k nearest other points.
            let n = base.len() / d;
            let graph = index.graph_rows_f64(0..n, k, &|_, _| {}).unwrap();
            let want: Vec<Vec<(f64, u32)>> = oracle(&metric, &base, &base, d, k + n)
                .into_iter()
                .enumerate()
                .map(|(i, row)| {
                    row.into_iter()
                        .filter(|p| p.1 as usize != i)
                        .take(k)
                        .collect()
                })
                .collect();
            failures.extend(compare(&format!("{what}, graph"), &graph, &want));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn f64_rows_are_exact_cpu() {
    f64_rows_are_exact(&cpu());
}

#[test]
fn f64_rows_are_exact_gpu() {
    if let Some(opts) = gpu("f64 rows (GPU)") {
        f64_rows_are_exact(&opts);
    }
}

/// The case: f32 rounding makes every point equal to the query; in f64 the order is
/// [2 1 0 3], with the f64 distances.
#[test]
fn points_closer_than_an_f32_step() {
    let base = vec![1.0, 1.0 + 1e-9, 1.0 + 2e-9, 1.0 - 3e-9];
    let query = [1.0 + 2.1e-9];
    let mut runs = vec![cpu()];
    runs.extend(gpu("f64 rows (GPU)"));
    for opts in runs {
        let index = Index::new(base.clone(), 1, Metric::L2, &opts).unwrap();
        let nn = index.search_f64(&query, 4, &|_, _| {}).unwrap();
        assert_eq!(nn.ids_of(0), &[2, 1, 0, 3]);
        let want = [0.1e-9, 1.1e-9, 2.1e-9, 5.1e-9];
        for (g, w) in nn.distances_of(0).iter().zip(want) {
            assert!((g - w).abs() < 1e-15, "{:?}", nn.distances_of(0));
        }
        // f64 queries against f32 rows: the same order as the f64 values of those rows.
        let f32_index = Index::new(vec![1.0f32, 2.0, 3.0], 1, Metric::L2, &opts).unwrap();
        let nn = f32_index.search_f64(&[2.5 + 1e-12], 3, &|_, _| {}).unwrap();
        assert_eq!(nn.ids_of(0), &[2, 1, 0]);
    }
}

/// `add_f64` continues the ids and keeps the answers exact in f64.
#[test]
fn added_f64_rows_continue_the_ids() {
    let mut index = Index::new(vec![1.0f32, 5.0], 1, Metric::L2, &cpu()).unwrap();
    index.add_f64(&[3.0 + 1e-9, 3.0 - 2e-9]).unwrap();
    let nn = index.search_f64(&[3.0], 4, &|_, _| {}).unwrap();
    assert_eq!(nn.ids_of(0), &[2, 3, 0, 1]);
    assert_eq!(index.len(), 4);
}

/// Mahalanobis and expression metrics compute on their own f32 features: f64 rows are refused
/// with the reason, and bad f64 values are named.
#[test]
fn f64_errors() {
    let d = 3;
    let base = uniform(20, d, 1);
    for metric in all_metrics(d) {
        if matches!(metric, Metric::Mahalanobis(_) | Metric::Expr(_)) {
            let err = Index::new(base.clone(), d, metric.clone(), &cpu()).unwrap_err();
            assert!(
                err.to_string().contains("float64"),
                "{}: {err}",
                metric.name()
            );
        }
    }
    let mut bad = base.clone();
    bad[7] = f64::NAN;
    let err = Index::new(bad, d, Metric::L2, &cpu())
        .unwrap_err()
        .to_string();
    assert!(err.contains("row 2") && err.contains("NaN"), "{err}");
    let mut huge = base.clone();
    huge[4] = 1e300;
    let err = Index::new(huge, d, Metric::L2, &cpu())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("row 1") && err.contains("float32 range"),
        "{err}"
    );
    let index = Index::new(base, d, Metric::L2, &cpu()).unwrap();
    let err = index.search_f64(&[1.0, 2.0], 1, &|_, _| {}).unwrap_err();
    assert!(err.to_string().contains("3"), "{err}");
}

/// Hellinger's domain is checked on the f64 values: −1e-50 rounds to −0 in f32 and would
/// pass a check of the rounding, then give NaN roots.
#[test]
fn hellinger_negative_f64_values_are_refused() {
    let d = 3;
    let mut base = uniform(10, d, 4);
    base[5] = -1e-50;
    let err = Index::new(base.clone(), d, Metric::Hellinger, &cpu())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("base") && err.contains("row 1") && err.contains("column 2"),
        "{err}"
    );
    base[5] = 0.5;
    let mut index = Index::new(base, d, Metric::Hellinger, &cpu()).unwrap();
    let err = index.add_f64(&[0.1, -1e-300, 0.2]).unwrap_err().to_string();
    assert!(
        err.contains("added rows") && err.contains("column 1"),
        "{err}"
    );
    assert_eq!(index.len(), 10, "a refused add leaves the index as it was");
    let err = index
        .search_f64(&[0.1, 0.2, -1e-45], 1, &|_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("queries") && err.contains("column 2"), "{err}");
}

/// Cosine with all-zero rows: distance 1 between a zero row and every row, itself included
/// (scikit-learn's `cosine_distances`), on the CPU and the GPU, one-off and graph.
#[test]
fn cosine_all_zero_rows() {
    let d = 4;
    let mut base = generate(Distribution::Uniform { lo: -1.0, hi: 1.0 }, 50, d, 3);
    base[7 * d..8 * d].fill(0.0);
    base[20 * d..21 * d].fill(0.0);
    let mut queries = vec![0.0f32; d];
    queries.extend_from_slice(&base[3 * d..4 * d]);
    let mut runs = vec![cpu()];
    runs.extend(gpu("f64 rows (GPU)"));
    for opts in runs {
        let index = Index::new(base.clone(), d, Metric::Cosine, &opts).unwrap();
        let nn = index
            .search(MatrixRef::new("queries", &queries, d).unwrap(), 50)
            .unwrap();
        // The zero query: every base row at 1, so ids in order.
        assert!(
            nn.distances_of(0).iter().all(|&x| x == 1.0),
            "{:?}",
            nn.distances_of(0)
        );
        assert_eq!(nn.ids_of(0), (0..50).collect::<Vec<u32>>().as_slice());
        // A non-zero query: the zero rows at exactly 1, itself first at 0.
        assert_eq!(nn.ids_of(1)[0], 3);
        for (&id, &dist) in nn.ids_of(1).iter().zip(nn.distances_of(1)) {
            if id == 7 || id == 20 {
                assert_eq!(dist, 1.0);
            }
        }
        let graph = index.graph(3).unwrap();
        assert!(graph.distances_of(7).iter().all(|&x| x == 1.0));
        assert_eq!(graph.ids_of(7), &[0, 1, 2]);
    }
}
