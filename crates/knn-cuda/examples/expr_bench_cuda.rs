//! Expression metrics against the built-in metrics they spell, on the GPU, side by side on the
//! same data (default: the seed-000 size, 16384 base × 4096 queries, d = 128, k = 16):
//! `cargo run --release -p knn-cuda --example expr_bench_cuda [nb nq d k [reps]]`.
//!
//! For `acc + abs(x - y)` against the built-in L1: the fused kernels alone (CUDA events),
//! `candidates` and the whole exact `search` (wall clock), medians after warm-up, and their
//! ratios. For the Hellinger expression `acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)`:
//! whether its kNN graph equals the built-in Hellinger graph, and both times.

use knn_core::prepare::prepare;
use knn_core::synth::{generate, Distribution};
use knn_core::{graph, search, CandidateRequest, Engine, Matrix, Metric, MetricExpr};
use knn_cuda::{CudaEngine, Method};
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median wall time (ms) of `f` and of the engine's kernels over `reps` runs after 2 warm-ups.
fn time(e: &CudaEngine, reps: usize, mut f: impl FnMut()) -> (f64, Option<f64>) {
    let (mut wall, mut kern) = (Vec::new(), Vec::new());
    for i in 0..reps + 2 {
        let t = Instant::now();
        f();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if i >= 2 {
            wall.push(ms);
            if let Some(k) = e.last_kernel_ms() {
                kern.push(k as f64);
            }
        }
    }
    let kern = (kern.len() == wall.len()).then(|| median(kern));
    (median(wall), kern)
}

fn main() {
    let a: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|s| s.parse().ok())
        .collect();
    let (nb, nq, d, k) = (
        *a.first().unwrap_or(&16384),
        *a.get(1).unwrap_or(&4096),
        *a.get(2).unwrap_or(&128),
        *a.get(3).unwrap_or(&16),
    );
    let reps = *a.get(4).unwrap_or(&10);
    if !CudaEngine::available() {
        eprintln!("no CUDA device");
        std::process::exit(1);
    }
    let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let base = Matrix::new("base", generate(u, nb, d, 1), d).unwrap();
    let queries = Matrix::new("queries", generate(u, nq, d, 2), d).unwrap();
    let e = CudaEngine::new(0, Method::Fused)
        .unwrap()
        .with_kernel_timing();
    let expr = |t: &str| Metric::Expr(Arc::new(MetricExpr::parse(t).unwrap()));
    println!("nb={nb} nq={nq} d={d} k={k}, medians of {reps}");

    // L1: the kernels alone, candidates, and the whole search.
    let l1 = expr("acc + abs(x - y)");
    let prep = prepare(&l1, base.view(), Some(queries.view())).unwrap();
    let plan = prep.expr.as_ref().unwrap();
    let req = CandidateRequest {
        base: prep.engine_base(),
        queries: prep.engine_queries(),
        kernel: Metric::L1.kernel(),
        width: e.candidate_width(k, nb, Metric::L1.kernel()),
        exclude: None,
        precise: false,
        base_key: None,
        exact_data: false,
        exact_from: None,
    };
    let (cb, kb) = time(&e, reps, || {
        std::hint::black_box(e.candidates(&req).unwrap());
    });
    let (ce, ke) = time(&e, reps, || {
        std::hint::black_box(e.candidates_expr(&req, plan).unwrap());
    });
    let (sb, _) = time(&e, reps, || {
        std::hint::black_box(search(&e, base.view(), queries.view(), k, &Metric::L1).unwrap());
    });
    let (se, _) = time(&e, reps, || {
        std::hint::black_box(search(&e, base.view(), queries.view(), k, &l1).unwrap());
    });
    if let (Some(kb), Some(ke)) = (kb, ke) {
        println!(
            "kernels     l1 {kb:8.3} ms | expr {ke:8.3} ms | ratio {:.3}",
            ke / kb
        );
    }
    println!(
        "candidates  l1 {cb:8.3} ms | expr {ce:8.3} ms | ratio {:.3}",
        ce / cb
    );
    println!(
        "search      l1 {sb:8.3} ms | expr {se:8.3} ms | ratio {:.3}",
        se / sb
    );
    let (rb, re) = (
        search(&e, base.view(), queries.view(), k, &Metric::L1).unwrap(),
        search(&e, base.view(), queries.view(), k, &l1).unwrap(),
    );
    let same = rb.ids.iter().zip(&re.ids).filter(|(x, y)| x == y).count();
    println!(
        "l1 ids equal in {same} of {} slots (the f64 sums differ in order: exact ties may swap)",
        rb.ids.len()
    );

    // Hellinger: the graph must be the built-in one, bit for bit.
    let h = expr("acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)");
    let gb = graph(&e, base.view(), k, &Metric::Hellinger).unwrap();
    let ge = graph(&e, base.view(), k, &h).unwrap();
    let (tb, _) = time(&e, reps.min(3), || {
        std::hint::black_box(graph(&e, base.view(), k, &Metric::Hellinger).unwrap());
    });
    let (te, _) = time(&e, reps.min(3), || {
        std::hint::black_box(graph(&e, base.view(), k, &h).unwrap());
    });
    println!(
        "hellinger graph: identical {} | built-in {tb:8.3} ms | expr {te:8.3} ms",
        gb == ge
    );
    if gb != ge {
        std::process::exit(1);
    }
}
