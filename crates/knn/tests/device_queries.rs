//! `Index::search_device`: queries in GPU memory, results written to GPU memory, equal bit for
//! bit to `Index::search` of the same values, for every metric (the device's own path and the
//! host's), adversarial data, sizes on tile edges, a stream of the caller's, ids as u32 and as i64; bad input refused
//! with the host's messages. Skipped without a GPU (`KNN_REQUIRE_GPU=1` makes that a failure).

use cudarc::driver::{CudaContext, CudaStream, DevicePtr};
mod common;

use common::{gpu, uniform};
use knn::{Device, DeviceQueries, Index, MatrixRef, Metric, Neighbors, Options};
use std::sync::Arc;

/// `index.search_device` of `queries` (uploaded on `stream`), the results read back; ids
/// written as i64 when `ids_i64` (each must fit a u32 then), else as u32.
fn search_on_device(
    index: &Index,
    stream: &Arc<CudaStream>,
    queries: &[f32],
    k: usize,
    ids_i64: bool,
) -> knn::Result<Neighbors> {
    let n = queries.len() / index.dim();
    let q = stream.clone_htod(queries).unwrap();
    let (qp, _q) = q.device_ptr(stream);
    let rows = DeviceQueries {
        ptr: qp,
        rows: n,
        device: 0,
        stream: stream.cu_stream() as u64,
    };
    // SAFETY: the buffers hold n × d queries and n × k results on device 0, and `stream` is a
    // live stream of its primary context.
    common::results_on_device(stream, (n, k), ids_i64, |out| unsafe {
        index.search_device(rows, k, out)
    })
}

/// The shared data sets, and two of this file's own: queries a trillion times larger than the
/// base (another scaling: the host's path), and a grid of small integers (many equal distances).
fn data_sets(d: usize) -> Vec<(&'static str, Vec<f32>, Vec<f32>)> {
    let grid: Vec<f32> = (0..512 * d).map(|i| ((i * 7) % 5) as f32).collect();
    let huge: Vec<f32> = uniform(40, d, 9).iter().map(|v| v * 1e13).collect();
    let mut sets = common::data_sets(d);
    sets.push(("huge queries", uniform(500, d, 8), huge));
    sets.push(("integer grid", grid.clone(), grid[..129 * d].to_vec()));
    sets
}

#[test]
fn device_queries_equal_host_queries() {
    let Some(opts) = gpu("device queries") else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let d = 6;
    let failures =
        common::failures_on_every_metric(&opts, d, data_sets(d), &[1, 10, 33], |index, q, k| {
            let want = MatrixRef::new("queries", q, d).and_then(|q| index.search(q, k));
            let got = search_on_device(index, &stream, q, k, k == 10);
            match (got, want) {
                (Ok(g), Ok(w)) if g == w => None,
                (Err(g), Err(w)) if g.to_string() == w.to_string() => None,
                (Err(e), _) | (_, Err(e)) => Some(e.to_string()),
                _ => Some("different neighbours".into()),
            }
        });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The device's own path at realistic sizes, query counts on the tiles' edges, on a stream
/// of the caller's (the queries' copy still running when the search is called).
#[test]
fn device_queries_on_tile_edges_and_a_stream_of_the_callers() {
    let Some(opts) = gpu("device queries") else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let d = 128;
    let base = uniform(20_000, d, 11);
    let queries = uniform(4100, d, 12);
    for metric in [Metric::L2, Metric::SqL2, Metric::InnerProduct, Metric::L1] {
        let index = Index::new(base.clone(), d, metric.clone(), &opts).unwrap();
        for (n, k) in [
            (1, 10),
            (127, 16),
            (128, 1),
            (129, 100),
            (4100, 16),
            (300, 1024),
        ] {
            let q = &queries[..n * d];
            let want = index
                .search(MatrixRef::new("queries", q, d).unwrap(), k)
                .unwrap();
            let got = search_on_device(&index, &stream, q, k, k % 2 == 0).unwrap();
            assert!(got == want, "{metric} n={n} k={k}");
        }
    }
}

#[test]
fn device_queries_errors_name_what_and_where() {
    let Some(opts) = gpu("device queries") else {
        return;
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    let d = 8;
    let index = Index::new(uniform(300, d, 13), d, Metric::L2, &opts).unwrap();
    let mut q = uniform(40, d, 14);
    q[17 * d + 3] = f32::NAN;
    let e = search_on_device(&index, &stream, &q, 5, false)
        .unwrap_err()
        .to_string();
    let host = MatrixRef::new("queries", &q, d).err().unwrap().to_string();
    assert_eq!(e, host);
    assert!(e.contains("row 17") && e.contains("column 3"), "{e}");
    q[17 * d + 3] = f32::INFINITY;
    assert!(search_on_device(&index, &stream, &q, 5, false).is_err());
    let q = uniform(40, d, 14);
    let e = search_on_device(&index, &stream, &q, 301, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("k=301"), "{e}");
    let e = search_on_device(&index, &stream, &q, 0, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains('k'), "{e}");
    // An index on the CPU does not read GPU memory: a clear error, with the fix.
    let cpu = Options {
        device: Device::Cpu,
        ..Options::default()
    };
    let index = Index::new(uniform(300, d, 13), d, Metric::L2, &cpu).unwrap();
    let e = search_on_device(&index, &stream, &q, 5, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("copy them to the host"), "{e}");
}
