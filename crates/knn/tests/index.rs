//! `knn::Index`: searches of an index built once equal the one-off calls bit for bit (every
//! metric, adversarial data, queries that change the scaling), its graph equals the one-off
//! graph, `add` continues the ids, many threads get what one gets, and bad input is refused.
//! The CPU cases run everywhere; the GPU ones where a GPU is usable (`KNN_REQUIRE_GPU=1`
//! makes a missing one a failure).

mod common;

use common::{cpu, data_sets, gpu, uniform};
use knn::{Index, Knn, Matrix, MatrixRef, Metric, Options, Rows};
use knn_testkit::{all_metrics, check_with_oracle};
use std::sync::Arc;

/// Every metric on every data set: the index's search and graph equal the one-off calls'.
fn index_equals_one_off(opts: &Options) {
    let d = 6;
    let knn = Knn::new(opts).unwrap();
    let mut failures = Vec::new();
    for metric in all_metrics(d) {
        for (name, base, queries) in data_sets(d) {
            let b = MatrixRef::new("base", &base, d).unwrap();
            let q = MatrixRef::new("queries", &queries, d).unwrap();
            let index = match Index::new(base.clone(), d, metric.clone(), opts) {
                Ok(index) => index,
                Err(e) => {
                    // Refused as the one-off call refuses it (a singular covariance).
                    let one_off = knn.search(b, q, 1, &metric).unwrap_err();
                    assert_eq!(e.to_string(), one_off.to_string(), "{metric} {name}");
                    continue;
                }
            };
            for k in [1, 10, 33] {
                let want = knn.search(b, q, k, &metric).unwrap();
                // Twice: the second search reuses what the first left on the engine.
                for pass in 0..2 {
                    let got = index.search(q, k).unwrap();
                    if got != want {
                        failures.push(format!("{metric} {name} k={k} search pass {pass}"));
                    }
                }
                let want = knn.graph(b, k, &metric).unwrap();
                if index.graph(k).unwrap() != want {
                    failures.push(format!("{metric} {name} k={k} graph"));
                }
            }
            check_with_oracle(
                &format!("{metric} {name}"),
                b,
                Some(q),
                10,
                &metric,
                &index.search(q, 10).unwrap(),
            );
        }
    }
    assert!(
        failures.is_empty(),
        "differ from one-off calls: {failures:#?}"
    );
}

#[test]
fn cpu_index_equals_one_off_calls() {
    index_equals_one_off(&cpu());
}

#[test]
fn gpu_index_equals_one_off_calls() {
    if let Some(opts) = gpu("index (GPU)") {
        index_equals_one_off(&opts);
    }
}

/// Queries far larger or smaller than the base call for another scaling than the base's own:
/// the index then prepares both together, as the one-off call does.
#[test]
fn queries_that_change_the_scaling() {
    let d = 4;
    let base = uniform(300, d, 8);
    let knn = Knn::new(&cpu()).unwrap();
    for metric in [Metric::L2, Metric::L1, Metric::InnerProduct, Metric::Cosine] {
        let index = Index::new(base.clone(), d, metric.clone(), &cpu()).unwrap();
        for factor in [1e30f32, 1e-30] {
            let queries: Vec<f32> = uniform(20, d, 9).iter().map(|v| v * factor).collect();
            let q = MatrixRef::new("queries", &queries, d).unwrap();
            let b = MatrixRef::new("base", &base, d).unwrap();
            let want = knn.search(b, q, 5, &metric).unwrap();
            assert_eq!(index.search(q, 5).unwrap(), want, "{metric} x{factor}");
        }
    }
}

/// `add` appends: ids continue, and the index equals one built from all the rows.
#[test]
fn add_continues_the_ids() {
    let d = 5;
    let all = uniform(900, d, 10);
    let queries = uniform(40, d, 11);
    let q = MatrixRef::new("queries", &queries, d).unwrap();
    for metric in [Metric::L2, Metric::Hellinger, Metric::Cosine, Metric::L1] {
        let whole = Index::new(all.clone(), d, metric.clone(), &cpu()).unwrap();
        let mut grown = Index::new(all[..400 * d].to_vec(), d, metric.clone(), &cpu()).unwrap();
        let rest = MatrixRef::new("rows", &all[400 * d..], d).unwrap();
        grown.add(rest).unwrap();
        assert_eq!(grown.len(), 900);
        assert_eq!(
            grown.search(q, 12).unwrap(),
            whole.search(q, 12).unwrap(),
            "{metric}"
        );
        assert_eq!(grown.graph(7).unwrap(), whole.graph(7).unwrap(), "{metric}");
    }
    // A point added later is found under its new id.
    let mut index = Index::new(vec![0.0f32, 0.0, 10.0, 10.0], 2, Metric::L2, &cpu()).unwrap();
    index
        .add(MatrixRef::new("rows", &[5.0, 5.0], 2).unwrap())
        .unwrap();
    let nn = index
        .search(MatrixRef::new("q", &[5.1, 5.0], 2).unwrap(), 1)
        .unwrap();
    assert_eq!(nn.ids_of(0), &[2]);
}

/// Bad rows are refused and leave the index as it was.
#[test]
fn bad_input_is_refused() {
    let d = 3;
    let err = |r: knn::Result<Index>| r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(Index::new(Vec::<f32>::new(), d, Metric::L2, &cpu())).contains("empty"));
    let nan = vec![0.0f32, 1.0, f32::NAN];
    assert!(err(Index::new(nan, d, Metric::L2, &cpu())).contains("row 0, column 2"));
    let neg = vec![0.5f32, -1.0, 0.5];
    assert!(err(Index::new(neg, d, Metric::Hellinger, &cpu())).contains(">= 0"));
    let ragged = vec![0.0f32; 7];
    assert!(!err(Index::new(ragged, d, Metric::L2, &cpu())).is_empty());

    let mut index = Index::new(uniform(10, d, 1), d, Metric::Hellinger, &cpu()).unwrap();
    let q2 = MatrixRef::new("queries", &[0.5, 0.5], 2).unwrap();
    assert!(index.search(q2, 1).unwrap_err().to_string().contains("d=3"));
    let q = MatrixRef::new("queries", &[0.5, 0.5, 0.5], 3).unwrap();
    let msg = index.search(q, 11).unwrap_err().to_string();
    assert!(msg.contains("11") && msg.contains("10"), "{msg}");
    assert!(index.add(q2).is_err());
    let bad = MatrixRef::new("rows", &[0.5, -0.5, 0.5], 3).unwrap();
    assert!(index.add(bad).unwrap_err().to_string().contains(">= 0"));
    assert_eq!(index.len(), 10);
    assert_eq!(index.search(q, 10).unwrap().ids_of(0).len(), 10);
}

/// Shared rows are used in place: the index keeps the caller's very values.
#[test]
fn shared_rows_are_used_in_place() {
    let d = 8;
    let values: Arc<Vec<f32>> = Arc::new(uniform(500, d, 12));
    let rows = Rows::Shared(values.clone());
    let index = Index::new(rows, d, Metric::L2, &cpu()).unwrap();
    assert_eq!(index.rows().as_f32().unwrap().as_ptr(), values.as_ptr());
    let queries = uniform(9, d, 13);
    let q = MatrixRef::new("queries", &queries, d).unwrap();
    let one_off = knn::search(MatrixRef::new("b", &values, d).unwrap(), q, 4, &Metric::L2);
    let want = Knn::new(&cpu())
        .unwrap()
        .search(MatrixRef::new("b", &values, d).unwrap(), q, 4, &Metric::L2)
        .unwrap();
    assert_eq!(index.search(q, 4).unwrap(), want);
    drop(one_off);
}

/// A search of no queries gives no rows (its output is made though no round asks for it), and
/// the index searches as before afterwards.
#[test]
fn no_queries_give_no_rows() {
    let d = 4;
    let index = Index::new(uniform(200, d, 15), d, Metric::L2, &cpu()).unwrap();
    let none = index
        .search(MatrixRef::new("queries", &[], d).unwrap(), 3)
        .unwrap();
    assert_eq!((none.ids.len(), none.distances.len()), (0, 0));
    let queries = uniform(5, d, 16);
    let q = MatrixRef::new("queries", &queries, d).unwrap();
    assert_eq!(index.search(q, 3).unwrap().ids.len(), 15);
}

/// 8 threads × 100 searches of one index give what one thread gets.
fn threads_share_one_index(opts: &Options) {
    let d = 16;
    let index = Index::new(uniform(3000, d, 14), d, Metric::L2, opts).unwrap();
    let batches: Vec<Matrix> = (0..8)
        .map(|t| Matrix::new("q", uniform(50, d, 100 + t), d).unwrap())
        .collect();
    let want: Vec<_> = batches
        .iter()
        .map(|q| index.search(q.view(), 10).unwrap())
        .collect();
    std::thread::scope(|s| {
        for (q, want) in batches.iter().zip(&want) {
            let index = &index;
            s.spawn(move || {
                for _ in 0..100 {
                    assert_eq!(&index.search(q.view(), 10).unwrap(), want);
                }
            });
        }
    });
}

/// Searches with large outputs run as tasks of a pool, more tasks than its threads: an index's
/// (its output's pages made early by a job on that pool, see `EARLY_PAGES_MIN` in knn-core)
/// and one-off calls (their output made by the first round that asks, on a pool's thread).
/// Each gives what it gives alone, and none waits for output work stuck behind the tasks
/// themselves. (Where a thread of its own made the output with the pool's help, every thread
/// of the pool ended up waiting for it: this test hung.)
#[test]
fn large_outputs_searched_from_a_busy_pool() {
    use rayon::prelude::*;
    let d = 8;
    let base = uniform(3000, d, 21);
    let index = Index::new(base.clone(), d, Metric::L2, &cpu()).unwrap();
    let knn = Knn::new(&cpu()).unwrap();
    let b = MatrixRef::new("base", &base, d).unwrap();
    let batches: Vec<Matrix> = (0..2 * rayon::current_num_threads().max(2))
        .map(|t| Matrix::new("q", uniform(4096, d, 200 + t as u64), d).unwrap())
        .collect();
    let k = 64; // 4096 × 64 = 2^18 entries: the early pages' size, buffers of 1 MiB
    let want: Vec<_> = batches
        .iter()
        .map(|q| index.search(q.view(), k).unwrap())
        .collect();
    let got: Vec<_> = batches
        .par_iter()
        .map(|q| index.search(q.view(), k).unwrap())
        .collect();
    assert_eq!(got, want);
    let one_off: Vec<_> = batches
        .par_iter()
        .map(|q| knn.search(b, q.view(), k, &Metric::L2).unwrap())
        .collect();
    assert_eq!(one_off, want);
}

#[test]
fn threads_share_one_cpu_index() {
    threads_share_one_index(&cpu());
}

#[test]
fn threads_share_one_gpu_index() {
    if let Some(opts) = gpu("index (GPU)") {
        threads_share_one_index(&opts);
    }
}

/// Host queries of the first case (up to 2 MiB of them against a resident base of
/// 16 384 rows) on the GPU: the same answer as the CPU's, bit for bit, for query counts on and
/// off the tile edges, with ties (the base's second half repeats its first) and queries that
/// are base rows (distance 0).
#[test]
fn gpu_host_queries_equal_the_cpu() {
    let Some(opts) = gpu("host queries against a resident base") else {
        return;
    };
    let d = 128;
    let mut base = uniform(8192, d, 61);
    base.extend_from_within(..);
    for nq in [2048, 3001, 4096] {
        let mut queries = uniform(nq, d, 62 + nq as u64);
        queries[..64 * d].copy_from_slice(&base[100 * d..164 * d]);
        let q = MatrixRef::new("queries", &queries, d).unwrap();
        for metric in [Metric::L2, Metric::SqL2, Metric::InnerProduct] {
            let on_gpu = Index::new(base.clone(), d, metric.clone(), &opts).unwrap();
            let on_cpu = Index::new(base.clone(), d, metric.clone(), &cpu()).unwrap();
            for k in [1, 16] {
                let want = on_cpu.search(q, k).unwrap();
                // Twice: the second search finds the base resident.
                for pass in 0..2 {
                    let got = on_gpu.search(q, k).unwrap();
                    assert!(got == want, "{metric} nq={nq} k={k} pass {pass}");
                }
            }
        }
    }
}

/// Answers of two indexes over the halves of a base, merged by (exact key, id), equal one
/// index over the whole base (every metric whose parts whiten alike, every data set, and two
/// keys that round to one f32 distance across the halves); merged by distances they differ
/// in that last case, which is why `Index::exact_keys` exists.
#[test]
fn halves_merged_by_exact_keys_equal_the_whole() {
    let d = 6;
    let opts = cpu();
    let metrics = knn_testkit::all_metrics(d)
        .into_iter()
        .filter(|m| !matches!(m, Metric::Mahalanobis(knn::Covariance::FromBase)));
    let mut failures = Vec::new();
    for metric in metrics {
        for (name, base, queries) in data_sets(d) {
            for k in [1, 10] {
                let Some(same) = halves_merged(&base, &queries, d, k, &metric, &opts) else {
                    continue;
                };
                if !same {
                    failures.push(format!("{metric} {name} k={k}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");

    // Keys 1 + 4e-8 (id 0, first half) and 1 + 1e-8 (id 3, second half) from the query at
    // the origin: both distances round to 1.0 in f32; the whole index answers id 3.
    let base = vec![1.0f32, 2e-4, 9.0, 9.0, 9.0, 8.0, 1.0, 1e-4, 8.0, 9.0];
    for metric in [Metric::L2, Metric::SqL2] {
        let whole = Index::new(base.clone(), 2, metric.clone(), &opts).unwrap();
        let nn = whole
            .search(MatrixRef::new("q", &[0.0, 0.0], 2).unwrap(), 1)
            .unwrap();
        assert_eq!(nn.ids, vec![3], "{metric}");
        assert_eq!(
            halves_merged(&base, &[0.0, 0.0], 2, 1, &metric, &opts),
            Some(true)
        );
        let keys = whole
            .exact_keys(knn::given::Given::F32(&[0.0, 0.0]), &[0, 3], 2)
            .unwrap();
        assert!(keys[1] < keys[0], "{metric}: {keys:?}");
        let d0 = whole
            .search(MatrixRef::new("q", &[0.0, 0.0], 2).unwrap(), 3)
            .unwrap();
        assert_eq!(
            d0.distances[0], d0.distances[1],
            "{metric}: the distances tie"
        );
    }
    // Bad input: ids not k per query, an id outside the index, another dimension.
    let index = Index::new(base, 2, Metric::L2, &opts).unwrap();
    let q = knn::given::Given::F32(&[0.0, 0.0]);
    let err = |r: knn::Result<Vec<f64>>| r.unwrap_err().to_string();
    assert!(err(index.exact_keys(q, &[0, 1, 2], 2)).contains("3 ids for 1 queries"));
    assert!(err(index.exact_keys(q, &[5], 1)).contains("id 5 is not a row"));
    let q3 = knn::given::Given::F32(&[0.0, 0.0, 0.0]);
    assert!(index.exact_keys(q3, &[0], 1).is_err());
    let nan = knn::given::Given::F64(&[f64::NAN, 0.0]);
    assert!(err(index.exact_keys(nan, &[0], 1)).contains("NaN"));
}

/// Whether `base`'s two halves, each an index, searched with `queries` and merged by (exact
/// key, id), then ordered by (distance, id), give the whole index's answer bit for bit;
/// `None` when an index refuses the data (as the whole does).
fn halves_merged(
    base: &[f32],
    queries: &[f32],
    d: usize,
    k: usize,
    metric: &Metric,
    opts: &Options,
) -> Option<bool> {
    let n = base.len() / d;
    let q = MatrixRef::new("queries", queries, d).unwrap();
    let whole = Index::new(base.to_vec(), d, metric.clone(), opts).ok()?;
    let want = whole.search(q, k.min(n)).unwrap();
    let mut rows: Vec<Vec<(f64, u32, f32)>> = vec![Vec::new(); q.rows()];
    for (lo, hi) in [(0, n / 2), (n / 2, n)] {
        let part = Index::new(base[lo * d..hi * d].to_vec(), d, metric.clone(), opts).ok()?;
        let kp = k.min(hi - lo);
        let nn = part.search(q, kp).unwrap();
        let keys = part
            .exact_keys(knn::given::Given::F32(queries), &nn.ids, kp)
            .unwrap();
        let entries = keys.iter().zip(&nn.ids).zip(&nn.distances);
        for (j, ((&key, &id), &dist)) in entries.enumerate() {
            rows[j / kp].push((key, id + lo as u32, dist));
        }
    }
    let sign = if metric.is_similarity() { -1.0f32 } else { 1.0 };
    let mut got = Vec::new();
    for mut row in rows {
        row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        row.truncate(k.min(n));
        row.sort_by(|a, b| (sign * a.2).total_cmp(&(sign * b.2)).then(a.1.cmp(&b.1)));
        got.extend(row);
    }
    let ids: Vec<u32> = got.iter().map(|e| e.1).collect();
    let dists: Vec<u32> = got.iter().map(|e| e.2.to_bits()).collect();
    let want_dists: Vec<u32> = want.distances.iter().map(|v| v.to_bits()).collect();
    Some(ids == want.ids && dists == want_dists)
}
