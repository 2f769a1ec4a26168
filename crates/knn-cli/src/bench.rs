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

/// Seed 000's own times on a Tesla V100 for its three CUDA programs, in milliseconds per run,
/// at its sizes ([`SEED_SIZES`], l2, uniform random data).
const SEED_V100_MS: [(Method, f64); 3] = [
    (Method::Global, 48.79),
    (Method::Texture, 63.05),
    (Method::Cublas, 31.75),
];

/// Seed 000's sizes: references, queries, dimension, k.
const SEED_SIZES: (usize, usize, usize, usize) = (16384, 4096, 128, 16);

/// Where the seed's figures come from, for the line under the table.
const SEED_SOURCE: &str = "seed 000, \"3 CUDA Implementations of the kNN Algorithm\" (2019, after \
                           Garcia, Debreuve and Barlaud, \"Fast k nearest neighbor search using GPU\", \
                           2008), on a Tesla V100";

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
            "brute force, CPU".into(),
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
                ("brute force", Method::Brute),
                ("seed 000 global", Method::Global),
                ("seed 000 texture", Method::Texture),
                ("seed 000 cublas", Method::Cublas),
            ] {
                runs.push((
                    format!("{label}, GPU {ordinal}"),
                    Options {
                        device: Device::Cuda(ordinal),
                        method,
                        ..Default::default()
                    },
                ));
            }
        }
    }
    // The seed's own times compare with ours only at its sizes and metric, program for program.
    let seed_like = (a.refs, a.queries, a.dim, a.k) == SEED_SIZES && metric == Metric::L2;
    let seed_ms = |opts: &Options| {
        SEED_V100_MS
            .iter()
            .find(|(m, _)| seed_like && opts.method == *m && opts.device != Device::Cpu)
            .map(|(_, ms)| *ms)
    };
    let show_seed = runs.iter().any(|(_, o)| seed_ms(o).is_some());
    println!(
        "{:<28} {:>10} {:>10}  {:<22} {:<10}{}",
        "method, device",
        "median ms",
        "GFLOP/s",
        "seed check",
        "exact",
        if show_seed {
            format!(" {:>12}", "seed V100 ms")
        } else {
            String::new()
        }
    );
    let mut all_ok = true;
    for (name, opts) in &runs {
        let knn = match Knn::new(opts) {
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
        let seed = match (show_seed, seed_ms(opts)) {
            (true, Some(v)) => format!(" {v:>12.2}"),
            _ => String::new(),
        };
        println!(
            "{name:<28} {ms:>10.2} {:>10.1}  {:<22} {:<10}{seed}",
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
    println!(
        "median ms: of {} timed runs after a warm-up; GFLOP/s: 2·refs·queries·d per second; seed \
         check: seed 000's test, distances within 1e-3 and ids equal to the f64 truth for >= 99.9 % \
         of entries (shares in brackets); exact: every row a true k-nearest set, ties allowed \
         (relative tolerance {DEFAULT_TOLERANCE:e}).",
        a.repeat.max(1)
    );
    if show_seed {
        println!(
            "seed V100 ms: the same program's time at the same sizes in {SEED_SOURCE}; the GPU \
             here differs."
        );
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
