//! Times `knn::Index` as a user sees it: the index built once, then `search` from host
//! queries to host results (median of repeated calls after warm-up), next to the one-off
//! `Knn::search` of the same data, whose answer the index must equal.
//!
//! Usage: `index_bench NB NQ D K [REPEAT] [--metric l2] [--device auto|cpu|cuda] [--threads T]
//! [--concurrent C]` (uniform [0, 1) data from fixed seeds). Prints one `index:` line to be
//! read by `bench/gpu/index_vs_torch.py`; with `--concurrent C`, also the throughput of C
//! threads searching the one index at once (REPEAT searches each) against one thread. On a
//! GPU it also prints a `device:` line: `Index::search_device` timed from queries in GPU
//! memory to results in GPU memory, its answer compared with the host search's, and a
//! `pinned:` line: the host search of the same queries in page-locked host memory.

use knn::synth::{generate, Distribution};
use knn::{Device, Index, Knn, MatrixRef, Metric, Options};
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut pos = Vec::new();
    let (mut metric, mut device, mut threads) = ("l2".to_string(), "auto".to_string(), None);
    let mut concurrent = 0usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--metric" => metric = args.next().expect("--metric NAME"),
            "--device" => device = args.next().expect("--device auto|cpu|cuda"),
            "--threads" => threads = args.next().map(|t| t.parse::<usize>().expect("threads")),
            "--concurrent" => {
                concurrent = args
                    .next()
                    .and_then(|c| c.parse().ok())
                    .expect("--concurrent C")
            }
            _ => pos.push(a.parse::<usize>().expect("NB NQ D K [REPEAT]")),
        }
    }
    let [nb, nq, d, k] = pos[..4] else {
        panic!("usage: index_bench NB NQ D K [REPEAT] [--metric M] [--device D]")
    };
    let repeat = pos.get(4).copied().unwrap_or(20);
    let metric: Metric = metric.parse().expect("metric");
    let opts = Options {
        device: device.parse::<Device>().expect("device"),
        threads,
        ..Options::default()
    };
    let uniform = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let base = generate(uniform, nb, d, 1);
    let queries = generate(uniform, nq, d, 2);
    let q = MatrixRef::new("queries", &queries, d).expect("finite");

    let t = Instant::now();
    let index = Index::new(base.clone(), d, metric.clone(), &opts).expect("index");
    let build = t.elapsed().as_secs_f64() * 1e3;
    let t = Instant::now();
    let first = index.search(q, k).expect("search");
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    for _ in 0..3 {
        index.search(q, k).expect("search");
    }
    let times: Vec<f64> = (0..repeat)
        .map(|_| {
            let t = Instant::now();
            let nn = index.search(q, k).expect("search");
            let ms = t.elapsed().as_secs_f64() * 1e3;
            drop(nn);
            ms
        })
        .collect();
    let (lo, hi) = (
        times.iter().copied().fold(f64::INFINITY, f64::min),
        times.iter().copied().fold(0.0, f64::max),
    );
    let searched = median(times);

    // The one-off call: the base checked, prepared and uploaded again each time.
    let knn = Knn::new(&opts).expect("engine");
    let b = MatrixRef::new("base", &base, d).expect("finite");
    let want = knn.search(b, q, k, &metric).expect("one-off search");
    let one_off = median(
        (0..repeat.clamp(3, 10))
            .map(|_| {
                let t = Instant::now();
                knn.search(b, q, k, &metric).expect("one-off search");
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    );
    let same = if first == want { "same" } else { "DIFFERENT" };
    println!(
        "index: {} nb={nb} nq={nq} d={d} k={k} {metric}: build {build:.2} ms, first search \
         {first_ms:.2} ms, search median {searched:.3} ms (min {lo:.3}, max {hi:.3}, {repeat} runs); \
         one-off Knn::search {one_off:.3} ms; answers {same}",
        knn.engine_name()
    );
    if first != want {
        std::process::exit(1);
    }
    if let Device::Cuda(ordinal) = index.device() {
        device_search(&index, ordinal, &queries, k, repeat, &first);
    }
    if concurrent > 0 {
        // Searches per second: one thread, then `concurrent` threads on the same index, each
        // checking its answers against the lone caller's.
        let one = repeat as f64 / (searched * repeat as f64 / 1e3);
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..concurrent {
                s.spawn(|| {
                    for _ in 0..repeat {
                        assert!(
                            index.search(q, k).expect("search") == want,
                            "a concurrent search differs"
                        );
                    }
                });
            }
        });
        let many = (concurrent * repeat) as f64 / t.elapsed().as_secs_f64();
        println!(
            "concurrent: {concurrent} threads x {repeat} searches: {many:.1} searches/s, one \
             thread {one:.1} searches/s ({:.2}x); every answer the lone caller's",
            many / one
        );
    }
}

/// Times `Index::search_device` (queries and results in GPU memory, the queries uploaded once
/// before) and checks its answer against the host search's `want`.
fn device_search(
    index: &Index,
    ordinal: usize,
    queries: &[f32],
    k: usize,
    repeat: usize,
    want: &knn::Neighbors,
) {
    use cudarc::driver::{CudaContext, DevicePtr};
    use knn::{DeviceQueries, DeviceResults};
    let ctx = CudaContext::new(ordinal).expect("CUDA context");
    let stream = ctx.default_stream();
    let nq = queries.len() / index.dim();
    let q = stream.clone_htod(queries).expect("upload");
    let ids = stream.alloc_zeros::<u32>(nq * k).expect("alloc");
    let dists = stream.alloc_zeros::<f32>(nq * k).expect("alloc");
    let (qp, _q) = q.device_ptr(&stream);
    let (ip, _i) = ids.device_ptr(&stream);
    let (dp, _d) = dists.device_ptr(&stream);
    let rows = DeviceQueries {
        ptr: qp,
        rows: nq,
        device: ordinal,
        stream: stream.cu_stream() as u64,
    };
    let out = DeviceResults {
        ids: ip,
        ids_i64: false,
        distances: dp,
    };
    // SAFETY: the buffers hold nq × d queries and nq × k results on this device.
    let run = || unsafe { index.search_device(rows, k, out) }.expect("device search");
    let device_ms = median_ms(repeat, run);
    // Host queries in, host results out, through the device path: the queries uploaded (from
    // pageable memory), searched on the device, the results downloaded.
    let mut qd = stream.alloc_zeros::<f32>(queries.len()).expect("alloc");
    let (mut hi, mut hd) = (vec![0u32; nq * k], vec![0f32; nq * k]);
    let via_rows = DeviceQueries {
        ptr: qd.device_ptr(&stream).0,
        ..rows
    };
    let via_ms = median_ms(repeat, || {
        stream.memcpy_htod(queries, &mut qd).expect("upload");
        // SAFETY: `qd` holds nq × d queries on this device.
        unsafe { index.search_device(via_rows, k, out) }.expect("device search");
        stream.memcpy_dtoh(&ids, &mut hi).expect("download");
        stream.memcpy_dtoh(&dists, &mut hd).expect("download");
    });
    answers(
        &format!("via device: upload + search_device + download median {via_ms:.3} ms"),
        hi == want.ids && hd == want.distances,
    );
    // The same host search of queries that lie in page-locked host memory (as PyTorch's
    // `pin_memory()` gives): their upload is the device's own copy, with no staging.
    // SAFETY: the memory is written below before it is read.
    let mut pinned = unsafe { ctx.alloc_pinned::<f32>(queries.len()) }.expect("pinned memory");
    pinned
        .as_mut_slice()
        .expect("pinned memory")
        .copy_from_slice(queries);
    let pq = pinned.as_slice().expect("pinned memory");
    let pq = MatrixRef::new("queries", pq, index.dim()).expect("finite");
    let pinned_ms = median_ms(repeat, || {
        index.search(pq, k).expect("search");
    });
    answers(
        &format!(
            "pinned: search median {pinned_ms:.3} ms (host queries in page-locked memory, \
             host results)"
        ),
        index.search(pq, k).expect("search") == *want,
    );
    answers(
        &format!(
            "device: search_device median {device_ms:.3} ms (queries and results in GPU memory)"
        ),
        stream.clone_dtoh(&ids).expect("download") == want.ids
            && stream.clone_dtoh(&dists).expect("download") == want.distances,
    );
}

/// Median wall time in ms of `repeat` runs of `f` after three warm-up runs.
fn median_ms(repeat: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    median(
        (0..repeat)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    )
}

/// Prints `line` with whether the answers are the host search's; exits with 1 when not.
fn answers(line: &str, same: bool) {
    println!(
        "{line}; answers {}",
        if same { "same" } else { "DIFFERENT" }
    );
    if !same {
        std::process::exit(1);
    }
}
