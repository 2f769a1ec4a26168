//! `knn bench`: the seed-000 experiment (16384 references, 4096 queries, d=128, k=16, random
//! data), one row per method and device: median time, the seed's PASSED/FAILED criteria
//! (distance error ≤ 1e-3 and ≥ 99.9 % of ids equal to the ground truth's) and our tie-aware
//! check against the f64 oracle.

use crate::args::BenchArgs;
use anyhow::{bail, Result};
use knn::synth::{generate, Distribution};
use knn::{
    check_with_truth, oracle, Device, Knn, Matrix, Method, Metric, Neighbors, Options,
    DEFAULT_TOLERANCE,
};
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

/// The seed's figures on a V100 for its three CUDA implementations (seconds per run).
const SEED_V100_MS: [(&str, f64); 3] = [("global", 48.79), ("texture", 63.05), ("cublas", 31.75)];

/// The seed's acceptance test: shares of distances within 1e-3 and of ids equal to the truth.
fn seed_criteria(res: &Neighbors, truth: &Neighbors) -> (f64, f64) {
    let n = res.ids.len().max(1) as f64;
    let close = res
        .distances
        .iter()
        .zip(&truth.distances)
        .filter(|(a, b)| (*a - *b).abs() <= 1e-3)
        .count();
    let same = res
        .ids
        .iter()
        .zip(&truth.ids)
        .filter(|(a, b)| a == b)
        .count();
    (close as f64 / n, same as f64 / n)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn bench(a: &BenchArgs, quiet: bool) -> Result<ExitCode> {
    let metric: Metric = a.metric.parse()?;
    if a.refs == 0 || a.queries == 0 || a.dim == 0 || a.k == 0 || a.k > a.refs {
        bail!("bench needs refs, queries, dim ≥ 1 and 1 ≤ k ≤ refs");
    }
    let uniform = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let base = Matrix::new("refs", generate(uniform, a.refs, a.dim, a.seed), a.dim)?;
    let queries = Matrix::new(
        "queries",
        generate(uniform, a.queries, a.dim, a.seed + 1),
        a.dim,
    )?;
    let flops = 2.0 * a.refs as f64 * a.queries as f64 * a.dim as f64;
    println!(
        "knn bench: {} references, {} queries, d={}, k={}, {} (uniform random, seed {})",
        a.refs, a.queries, a.dim, a.k, metric, a.seed
    );
    if !quiet {
        eprint!("computing the f64 ground truth... ");
        std::io::stderr().flush().ok();
    }
    let t0 = Instant::now();
    let truth = oracle(base.view(), Some(queries.view()), a.k, &metric)?;
    if !quiet {
        eprintln!("{:.1} s", t0.elapsed().as_secs_f64());
    }

    let mut runs: Vec<(String, Options)> = Vec::new();
    let want = |d: &str| a.devices == "all" || a.devices == d;
    if want("cpu") {
        runs.push((
            "cpu (gemm + fused top-k)".into(),
            Options {
                device: Device::Cpu,
                ..Default::default()
            },
        ));
    }
    if want("cuda") && knn::gpu_devices().is_empty() {
        println!("cuda: no rows, no usable GPU ({})", knn::gpu_status());
    }
    if want("cuda") {
        for (ordinal, _) in knn::gpu_devices() {
            for (label, method) in [
                ("fused", Method::Brute),
                ("global", Method::Global),
                ("texture", Method::Texture),
                ("cublas", Method::Cublas),
            ] {
                runs.push((
                    format!("cuda:{ordinal} {label}"),
                    Options {
                        device: Device::Cuda(ordinal),
                        method,
                        ..Default::default()
                    },
                ));
            }
        }
    }
    println!(
        "{:<28} {:>10} {:>10}  {:<22} {:<10} {:>12}",
        "method", "median ms", "GFLOP/s", "seed check", "exact", "seed V100 ms"
    );
    let mut all_ok = true;
    for (name, opts) in runs {
        let knn = match Knn::new(&opts) {
            Ok(k) => k,
            Err(e) => {
                println!("{name:<28} unavailable: {e}");
                continue;
            }
        };
        let run = || knn.search(base.view(), queries.view(), a.k, &metric);
        let res = run()?; // warm-up (also compiles GPU kernels)
        let mut times = Vec::new();
        for _ in 0..a.repeat.max(1) {
            let t = Instant::now();
            run()?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let ms = median(times);
        let (close, same) = seed_criteria(&res, &truth);
        let seed_ok = close >= 0.999 && same >= 0.999;
        let rep = check_with_truth(
            base.view(),
            Some(queries.view()),
            a.k,
            &metric,
            &res,
            &truth,
            DEFAULT_TOLERANCE,
        )?;
        all_ok &= seed_ok && rep.passed();
        let seed_ms = SEED_V100_MS
            .iter()
            .find(|(m, _)| name.ends_with(m))
            .map_or("".into(), |(_, v)| format!("{v:.2}"));
        println!(
            "{name:<28} {ms:>10.2} {:>10.1}  {:<22} {:<10} {seed_ms:>12}",
            flops / (ms * 1e-3) / 1e9,
            format!(
                "{} ({:.2}%/{:.2}%)",
                if seed_ok { "PASSED" } else { "FAILED" },
                close * 100.0,
                same * 100.0
            ),
            if rep.passed() { "PASSED" } else { "FAILED" },
        );
        if let Some(p) = rep.first_problem {
            println!("    first problem: {p}");
        }
    }
    println!("seed check: distance error <= 1e-3 and ids equal to the f64 ground truth for >= 99.9 % of entries (as in seed 000)");
    println!("exact: tie-aware check of every row against the f64 oracle (relative tolerance {DEFAULT_TOLERANCE:e})");
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
