//! Times the CUDA engine on the seed-000 size (16384 base × 4096 queries, d = 128, k = 16):
//! the fused kernels alone (CUDA events), `candidates` and the full exact `search` (wall clock,
//! synchronous), median of repeated runs after warm-up, for every method and for L1.
//! Usage: cargo run --release -p knn-cuda --example bench_cuda [nb nq d k [reps]] [fused] [l2]
//! [--data DIR] (`fused`: only the fused method; `l2`: skip L1; `--data`: base and queries from
//! DIR/base.npy and DIR/queries.npy, whose shapes then replace nb, nq and d, so that a peer
//! can run on the same values: `bench/gpu/vs_torch.py`). The candidate width is the engine's
//! own first-try width (`Engine::candidate_width`), as in `search`. Tuning for measurements
//! (`CudaTuning`, automatic when left out): `--splits N`, `--width N`, `--no-truncate`.

use knn_core::synth::{generate, Distribution};
use knn_core::{search, CandidateRequest, Candidates, Engine, Kernel, Matrix, Metric, Result};
use knn_cuda::{CudaEngine, CudaTuning, Method};
use std::sync::Mutex;
use std::time::Instant;

/// Delegates to the engine and records every `candidates` call: (rows, width, precise, ms).
struct Counting<'a> {
    inner: &'a CudaEngine,
    calls: Mutex<Vec<(usize, usize, bool, f64)>>,
}

impl Engine for Counting<'_> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        self.inner.candidate_width(k, available, kernel)
    }
    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        let t = Instant::now();
        let c = self.inner.candidates(req);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if let Ok(mut v) = self.calls.lock() {
            v.push((req.queries.rows(), req.width, req.precise, ms));
        }
        c
    }
}

/// A float32 matrix from a `.npy` file (exits with the reader's message on failure).
fn load(path: &std::path::Path) -> Matrix {
    let t = knn_io::read_f32(path, None).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    });
    Matrix::new(&path.display().to_string(), t.data, t.cols).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2);
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value after `flag` in `args`, removed with it (exits when it is missing or no number
/// where `number` is asked).
fn take_value(args: &mut Vec<String>, flag: &str) -> Option<String> {
    let i = args.iter().position(|s| s == flag)?;
    if i + 1 >= args.len() {
        eprintln!("{flag} needs a value");
        std::process::exit(2);
    }
    args.remove(i);
    Some(args.remove(i))
}

fn number(v: Option<String>, flag: &str) -> Option<usize> {
    v.map(|v| {
        v.parse().unwrap_or_else(|_| {
            eprintln!("{flag} needs a number, not {v}");
            std::process::exit(2);
        })
    })
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let data = take_value(&mut args, "--data").map(std::path::PathBuf::from);
    let tuning = CudaTuning {
        splits: number(take_value(&mut args, "--splits"), "--splits"),
        width: number(take_value(&mut args, "--width"), "--width"),
        truncate_splits: !args.iter().any(|s| s == "--no-truncate"),
        ..CudaTuning::default()
    };
    let a: Vec<usize> = args.iter().filter_map(|s| s.parse().ok()).collect();
    let (nb, nq, d, k) = (
        *a.first().unwrap_or(&16384),
        *a.get(1).unwrap_or(&4096),
        *a.get(2).unwrap_or(&128),
        *a.get(3).unwrap_or(&16),
    );
    let reps = *a.get(4).unwrap_or(&10);
    let only_fused = std::env::args().any(|s| s == "fused");
    let only_l2 = std::env::args().any(|s| s == "l2");
    let (base, queries) = match &data {
        Some(dir) => (load(&dir.join("base.npy")), load(&dir.join("queries.npy"))),
        None => {
            let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
            (
                Matrix::new("base", generate(u, nb, d, 1), d).unwrap(),
                Matrix::new("queries", generate(u, nq, d, 2), d).unwrap(),
            )
        }
    };
    let (nb, nq, d) = (base.rows(), queries.rows(), base.dim());
    if queries.dim() != d {
        eprintln!("base has {d} columns, queries {}", queries.dim());
        std::process::exit(2);
    }
    let floor_ms = 2.0 * nq as f64 * nb as f64 * d as f64 / 51e12 * 1e3;
    println!("nb={nb} nq={nq} d={d} k={k}; FP32 floor {floor_ms:.3} ms (51 TFLOP/s)");
    if !CudaEngine::available() {
        eprintln!("no CUDA device");
        std::process::exit(1);
    }
    for (metric, methods) in [
        (
            Metric::SqL2,
            if only_fused {
                &Method::ALL[..1]
            } else {
                &Method::ALL[..]
            },
        ),
        (
            Metric::L1,
            if only_l2 {
                &Method::ALL[..0]
            } else {
                &[Method::Fused][..]
            },
        ),
    ] {
        for &m in methods {
            let e = CudaEngine::new(0, m)
                .unwrap()
                .with_tuning(tuning.clone())
                .with_kernel_timing();
            if m == Method::Fused && metric == Metric::SqL2 {
                println!("{}", e.kernel_report());
            }
            let mut kern = Vec::new();
            let mut wall = Vec::new();
            let r = if m == Method::Fused {
                reps
            } else {
                reps.min(3)
            };
            for i in 0..r + 2 {
                let t = Instant::now();
                let res = search(&e, base.view(), queries.view(), k, &metric).unwrap();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                std::hint::black_box(&res);
                if i >= 2 {
                    wall.push(ms);
                    if let Some(km) = e.last_kernel_ms() {
                        kern.push(km as f64);
                    }
                }
            }
            // Where the wall time of one more `search` goes: engine calls (first tries and
            // retries of rows whose floor was too low) and the rest (prepare, f64 re-rank).
            let counting = Counting {
                inner: &e,
                calls: Mutex::new(Vec::new()),
            };
            let t = Instant::now();
            let res = search(&counting, base.view(), queries.view(), k, &metric).unwrap();
            let total = t.elapsed().as_secs_f64() * 1e3;
            std::hint::black_box(&res);
            let calls = counting.calls.into_inner().unwrap_or_default();
            let first: f64 = calls.iter().filter(|c| !c.2).map(|c| c.3).sum();
            let retry_rows: usize = calls.iter().filter(|c| c.2).map(|c| c.0).sum();
            let retry: f64 = calls.iter().filter(|c| c.2).map(|c| c.3).sum();
            let widths: Vec<usize> = calls.iter().filter(|c| c.2).map(|c| c.1).collect();
            println!(
                "{metric:>11} {m:>8}: search {total:8.3} ms = first tries {first:8.3} ms ({} calls) + retries {retry:8.3} ms ({retry_rows} rows, widths {widths:?}) + re-rank/prepare {:8.3} ms",
                calls.iter().filter(|c| !c.2).count(),
                total - first - retry
            );
            // The engine alone on the whole request (the pipeline above may also make small
            // retry calls, so its last_kernel_ms is not the figure to report).
            let req = CandidateRequest {
                base: base.view(),
                queries: queries.view(),
                kernel: metric.kernel(),
                width: e.candidate_width(k, nb, metric.kernel()),
                exclude: None,
                precise: false,
                base_key: None,
                exact_data: false,
                exact_from: None,
            };
            kern.clear();
            let mut cand = Vec::new();
            for i in 0..r + 2 {
                let t = Instant::now();
                let c = e.candidates(&req).unwrap();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                std::hint::black_box(&c);
                if i >= 2 {
                    cand.push(ms);
                    if let Some(km) = e.last_kernel_ms() {
                        kern.push(km as f64);
                    }
                }
            }
            println!(
                "{metric:>11} {m:>8}: candidates {:8.3} ms (wall, incl. upload + host floors), width {}",
                median(cand),
                req.width
            );
            let w = median(wall);
            if kern.is_empty() {
                println!("{metric:>11} {m:>8}: search {w:8.3} ms (wall, incl. transfers + exact re-rank)");
            } else {
                let kk = median(kern);
                println!(
                    "{metric:>11} {m:>8}: kernels {kk:8.3} ms ({:5.1}% of FP32 floor), search {w:8.3} ms (wall)",
                    100.0 * floor_ms / kk
                );
            }
        }
    }
}
