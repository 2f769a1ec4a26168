//! `Index::graph_device`: a graph of the index's base written to GPU memory, equal bit for bit
//! to `Index::graph`, for every metric (the device's own path and the host's), adversarial
//! data, sizes on tile edges and on the collect form's edge, every symmetry setting, a stream
//! of the caller's, ids as u32 and as i64; errors as the host's. Skipped without a GPU
//! (`KNN_REQUIRE_GPU=1` makes that a failure).

use cudarc::driver::{CudaContext, CudaStream};
mod common;

use common::{gpu, uniform};
use knn::{Index, Metric, Neighbors, Options, Symmetry};
use std::sync::Arc;

/// `index.graph_device` into buffers made on `stream`, read back; ids written as i64 when
/// `ids_i64`, else as u32.
fn graph_on_device(
    index: &Index,
    stream: &Arc<CudaStream>,
    k: usize,
    ids_i64: bool,
) -> knn::Result<Neighbors> {
    // SAFETY: the buffers hold n × k results on device 0, and `stream` is a live stream of
    // its primary context.
    common::results_on_device(stream, (index.len(), k), ids_i64, |out| unsafe {
        index.graph_device(k, 0, stream.cu_stream() as u64, out)
    })
}

/// Bit for bit: ids, and distances by their bits.
fn same(a: &Neighbors, b: &Neighbors) -> bool {
    a.k == b.k
        && a.ids == b.ids
        && a.distances.len() == b.distances.len()
        && a.distances
            .iter()
            .zip(&b.distances)
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// `graph_device` and `graph` of `index` for `k` give the same graph, or the same error.
fn check(index: &Index, stream: &Arc<CudaStream>, k: usize, ids_i64: bool) -> Option<String> {
    let want = index.graph(k);
    let got = graph_on_device(index, stream, k, ids_i64);
    match (got, want) {
        (Ok(g), Ok(w)) if same(&g, &w) => None,
        (Err(g), Err(w)) if g.to_string() == w.to_string() => None,
        (Ok(_), Ok(_)) => Some("different graphs".into()),
        (g, w) => Some(format!(
            "device {:?}, host {:?}",
            g.map(|_| ()).map_err(|e| e.to_string()),
            w.map(|_| ()).map_err(|e| e.to_string())
        )),
    }
}

fn with_symmetry(opts: &Options, symmetric: Symmetry) -> Options {
    Options {
        symmetric,
        ..opts.clone()
    }
}

#[test]
fn device_graphs_equal_host_graphs() {
    let Some(opts) = gpu("device graphs") else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let d = 6;
    let sets = common::data_sets(d);
    let failures = common::failures_on_every_metric(&opts, d, sets, &[1, 10, 33], |index, _, k| {
        (k < index.len()).then(|| check(index, &stream, k, k == 10))?
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The device's own path at the sizes that change its form: tile edges, the collect form's
/// edge (1025 / 1026 points), the seed-002 Hellinger case; every symmetry setting, a stream
/// of the caller's, points in runs of duplicates and rows over many binary orders.
#[test]
fn device_graphs_on_edges_settings_and_streams() {
    let Some(opts) = gpu("device graphs") else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mut failures = Vec::new();
    let mut cases: Vec<(&str, Vec<f32>, usize)> = Vec::new();
    for (n, d) in [
        (2, 5),
        (3, 8),
        (129, 16),
        (1025, 32),
        (1026, 32),
        (4100, 64),
    ] {
        cases.push(("uniform", uniform(n, d, n as u64), d));
    }
    let d = 12;
    let distinct = uniform(60, d, 77);
    let runs: Vec<f32> = (0..3000)
        .flat_map(|i| distinct[(i / 50) * d..(i / 50 + 1) * d].to_vec())
        .collect();
    cases.push(("runs of duplicates", runs, d));
    let d = 16;
    let u = uniform(2500, d, 91);
    let spread: Vec<f32> = (0..2500)
        .flat_map(|i| {
            let s = if i == 7 {
                0.0
            } else {
                (-3.0 * (i % 12) as f32).exp2()
            };
            u[i * d..(i + 1) * d]
                .iter()
                .map(move |&v| v * s)
                .collect::<Vec<_>>()
        })
        .collect();
    cases.push(("33 binary orders", spread, d));
    for symmetric in [Symmetry::Auto, Symmetry::On, Symmetry::Off] {
        let opts = with_symmetry(&opts, symmetric);
        for (name, points, d) in &cases {
            let n = points.len() / d;
            for metric in [
                Metric::SqL2,
                Metric::L2,
                Metric::InnerProduct,
                Metric::Hellinger,
                Metric::L1,
            ] {
                let index = Index::new(points.clone(), *d, metric.clone(), &opts).unwrap();
                let all = if n <= 1026 { n - 1 } else { 1 };
                for k in [1, 7, 100, all].into_iter().filter(|&k| k < n) {
                    if let Some(e) = check(&index, &stream, k, k % 2 == 0) {
                        failures.push(format!("{symmetric:?} {name} n={n} {metric} k={k}: {e}"));
                    }
                }
            }
        }
    }
    // The seed-002 case, repeated on one index (each graph made anew), with host graphs and
    // searches between.
    let (n, d) = (10_000, 256);
    let points = uniform(n, d, 2);
    let index = Index::new(points.clone(), d, Metric::Hellinger, &opts).unwrap();
    let want = index.graph(100).unwrap();
    for ids_i64 in [true, false, true] {
        let got = graph_on_device(&index, &stream, 100, ids_i64).unwrap();
        if !same(&got, &want) {
            failures.push(format!("seed-002 Hellinger, ids_i64 {ids_i64}"));
        }
        let q = knn::MatrixRef::new("queries", &points[..300 * d], d).unwrap();
        index.search(q, 10).unwrap();
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Bad input: the host's errors (k = 0, k ≥ n, distances that overflow f32), and an index
/// that does not compute on that GPU.
#[test]
fn device_graph_errors_are_the_hosts() {
    let Some(opts) = gpu("device graphs") else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let d = 8;
    let index = Index::new(uniform(300, d, 13), d, Metric::L2, &opts).unwrap();
    for k in [0, 300, 301] {
        let e = graph_on_device(&index, &stream, k, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            index.graph(k).unwrap_err().to_string(),
            "k={k}"
        );
    }
    // Squared distances beyond f32: the overflow the host reports.
    let huge: Vec<f32> = uniform(500, d, 5).iter().map(|v| v * 3e19).collect();
    for metric in [Metric::SqL2, Metric::InnerProduct, Metric::L2] {
        let index = Index::new(huge.clone(), d, metric.clone(), &opts).unwrap();
        let want = index.graph(5).map_err(|e| e.to_string());
        let got = graph_on_device(&index, &stream, 5, true);
        match (&got, &want) {
            (Ok(g), Ok(w)) => assert!(same(g, w), "{metric}"),
            (Err(g), Err(w)) => assert_eq!(&g.to_string(), w, "{metric}"),
            _ => panic!("{metric}: device {:?}, host {want:?}", got.map(|_| ())),
        }
    }
    let cpu = Options {
        device: knn::Device::Cpu,
        ..Options::default()
    };
    let index = Index::new(uniform(300, d, 13), d, Metric::L2, &cpu).unwrap();
    let e = graph_on_device(&index, &stream, 5, false).unwrap_err();
    assert!(e.to_string().contains("cuda:0"), "{e}");
}
