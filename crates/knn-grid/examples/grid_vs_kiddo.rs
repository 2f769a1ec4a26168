//! Side by side with kiddo 6 (`ImmutableKdTree`, batch queries on rayon, build included), same
//! data, same process, same thread count: uniform [0,1]³ and 100 gaussian blobs, k = 1 and 16.
//!
//! `cargo run --release -p knn-grid --example grid_vs_kiddo -- [log2 n = 20] [runs = 3] [threads = 2]`
//!
//! Ours is timed twice, each time from a fresh engine (grid build included):
//! - `search`: the whole exact pipeline, `knn_core::search(.., Metric::SqL2)` (candidates,
//!   f64 re-rank, retries);
//! - `raw`: the engine alone: one `Engine::candidate_rows` call for every query (width k,
//!   with exact keys, as the pipeline asks), the rows discarded as they come, no re-rank.
//!
//! Every figure is the median of `runs` runs after one warm-up run; kiddo, search, raw and
//! build take turns run by run, so a burst of load from other processes hits all of them
//! alike. Wall-clock medians first, then (on Linux) the CPU time of all threads for kiddo and
//! the search, which moves less when other processes compete for the cores. Results are cross-checked:
//! the k-th distance of every query must agree with kiddo's within f32 rounding.

use knn_core::synth::{generate, Distribution};
use knn_core::{
    search, CandidateRequest, CandidateRows, Engine, Kernel, MatrixRef, Metric, RowSink,
};
use knn_grid::GridEngine;
use std::num::NonZeroUsize;
use std::time::Instant;

type Tree = kiddo::ImmutableKdTree<f32, 3>;

/// A sink that drops the rows (the `raw` figure: the engine alone).
struct Discard;

impl RowSink for Discard {
    fn take(&self, rows: CandidateRows<'_>) {
        std::hint::black_box(rows.ids);
    }
}

/// CPU time (ns) this process's threads have run so far, from Linux's per-thread
/// `schedstat`; `None` elsewhere. On a shared machine it moves less with other processes' load
/// than the wall clock (time waiting for a core is not counted).
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Medians (ms) of `runs` timed calls of each closure, after one warm-up call of each: wall
/// clock, and CPU time of all threads when known. The closures take turns run by run, so load
/// from other processes on a shared machine falls on all of them alike instead of on
/// whichever happened to run during it.
fn interleaved_medians_ms(
    runs: usize,
    fs: &mut [&mut dyn FnMut()],
) -> (Vec<f64>, Option<Vec<f64>>) {
    for f in fs.iter_mut() {
        f(); // warm-up
    }
    let mut wall = vec![Vec::with_capacity(runs); fs.len()];
    let mut cpu = vec![Vec::with_capacity(runs); fs.len()];
    let mut cpu_known = true;
    for _ in 0..runs {
        for ((f, w), c) in fs.iter_mut().zip(&mut wall).zip(&mut cpu) {
            let (s, c0) = (Instant::now(), cpu_ns());
            f();
            w.push(s.elapsed().as_secs_f64() * 1e3);
            match (c0, cpu_ns()) {
                (Some(a), Some(b)) => c.push((b - a) as f64 / 1e6),
                _ => cpu_known = false,
            }
        }
    }
    let medians = |t: Vec<Vec<f64>>| -> Vec<f64> {
        t.into_iter()
            .map(|mut t| {
                t.sort_by(f64::total_cmp);
                t[t.len() / 2]
            })
            .collect()
    };
    (medians(wall), cpu_known.then(|| medians(cpu)))
}

/// kiddo's k-th squared distance per query (build included in the timed closure).
fn kiddo_kth(base: &[[f32; 3]], queries: &[[f32; 3]], k: usize) -> Vec<f32> {
    let tree = Tree::new_from_slice(base).expect("kiddo build");
    if k == 1 {
        tree.query_batch(queries)
            .nearest_one::<kiddo::SquaredEuclidean<f32>>()
            .execute()
            .iter()
            .map(|r| r.distance)
            .collect()
    } else {
        let res = tree
            .query_batch(queries)
            .nearest_n::<kiddo::SquaredEuclidean<f32>>(NonZeroUsize::new(k).unwrap())
            .execute();
        res.iter().map(|g| g[k - 1].distance).collect()
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments: log2n runs threads"))
        .collect();
    let log2n = args.first().copied().unwrap_or(20);
    let runs = args.get(1).copied().unwrap_or(3);
    let threads = args.get(2).copied().unwrap_or(2);
    let n = 1usize << log2n;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();

    println!("n = {n} points, {n} queries, d = 3, {threads} threads, median of {runs} runs (ms)");
    println!(
        "| data | k | kiddo (build+query) | grid search | ratio | grid raw (engine alone) | ratio | grid build | levels, largest leaf | CPU kiddo | CPU grid search | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, dist) in [
        (
            "uniform [0,1]^3",
            Distribution::Uniform { lo: 0.0, hi: 1.0 },
        ),
        (
            "100 gaussian blobs (sd 0.01)",
            Distribution::Clustered {
                clusters: 100,
                spread: 0.01,
            },
        ),
    ] {
        // Base and queries from one draw (the blobs' centres come from the seed).
        let all = generate(dist, 2 * n, 3, 1);
        let (b, q) = all.split_at(n * 3);
        let base = MatrixRef::new("base", b, 3).unwrap();
        let queries = MatrixRef::new("queries", q, 3).unwrap();
        let kb: Vec<[f32; 3]> = b.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
        let kq: Vec<[f32; 3]> = q.chunks_exact(3).map(|p| [p[0], p[1], p[2]]).collect();
        for k in [1usize, 16] {
            pool.install(|| {
                let mut shape = (0, 0);
                let (t, cpu) = interleaved_medians_ms(
                    runs,
                    &mut [
                        &mut || {
                            std::hint::black_box(kiddo_kth(&kb, &kq, k));
                        },
                        &mut || {
                            let e = GridEngine::new(None).unwrap();
                            std::hint::black_box(
                                search(&e, base, queries, k, &Metric::SqL2).unwrap(),
                            );
                        },
                        &mut || {
                            let e = GridEngine::new(None).unwrap();
                            let width = e.candidate_width(k, n, Kernel::SqL2);
                            let req = CandidateRequest {
                                base,
                                queries,
                                kernel: Kernel::SqL2,
                                width,
                                exclude: None,
                                precise: false,
                                base_key: None,
                                exact_data: false,
                                exact_from: None,
                            };
                            e.candidate_rows(&req, true, &Discard).unwrap();
                        },
                        &mut || {
                            shape = GridEngine::new(None).unwrap().index_shape(base);
                        },
                    ],
                );
                let (t_kiddo, t_search, t_raw, t_build) = (t[0], t[1], t[2], t[3]);
                // Cross-check the k-th distances.
                let want = kiddo_kth(&kb, &kq, k);
                let e = GridEngine::new(None).unwrap();
                let got = search(&e, base, queries, k, &Metric::SqL2).unwrap();
                let bad = (0..n)
                    .filter(|&i| {
                        let (a, w) = (got.distances[i * k + k - 1], want[i]);
                        (a - w).abs() > 1e-5 * w.max(1e-30)
                    })
                    .count();
                assert_eq!(bad, 0, "{name} k={k}: {bad} queries disagree with kiddo");
                let cpu = cpu.map_or("- | - | -".to_string(), |c| {
                    format!("{:.0} | {:.0} | {:.2}x", c[0], c[1], c[0] / c[1])
                });
                println!(
                    "| {name} | {k} | {t_kiddo:.0} | {t_search:.0} | {:.2}x | {t_raw:.0} | {:.2}x | {t_build:.0} | {}, {} | {cpu} |",
                    t_kiddo / t_search,
                    t_kiddo / t_raw,
                    shape.0,
                    shape.1
                );
            });
        }
    }
}
