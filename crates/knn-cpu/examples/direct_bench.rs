//! Times the direct kernels (L1, L∞) through the whole search pipeline on the seed-000 size:
//! `cargo run --release -p knn-cpu --example direct_bench [threads] [repeat]`
//! (16384 base × 4096 queries, d = 128, k = 16, uniform [0, 1)). Prints the median and the
//! rate in pair-coordinates per second per thread.

use knn_core::synth::{generate, Distribution};
use knn_core::{search, MatrixRef, Metric};
use knn_cpu::CpuEngine;
use std::time::Instant;

mod common;
use common::cpu_seconds;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let threads = args.next().transpose()?.unwrap_or(1);
    let repeat = args.next().transpose()?.unwrap_or(5);
    let (nb, nq, d, k) = (16384, 4096, 128, 16);
    let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let base = generate(u, nb, d, 1);
    let queries = generate(u, nq, d, 2);
    let engine = CpuEngine::new(Some(threads))?;
    let (b, q) = (
        MatrixRef::new("base", &base, d)?,
        MatrixRef::new("queries", &queries, d)?,
    );
    for metric in [Metric::L1, Metric::Linf] {
        let mut times = Vec::new();
        let mut cpu = 0.0;
        for r in 0..repeat + 1 {
            if r == 1 {
                cpu = cpu_seconds();
            }
            let t = Instant::now();
            let nn = search(&engine, b, q, k, &metric)?;
            times.push(t.elapsed().as_secs_f64());
            std::hint::black_box(nn);
        }
        cpu = (cpu_seconds() - cpu) / repeat as f64;
        times.remove(0);
        times.sort_by(f64::total_cmp);
        let med = times[times.len() / 2];
        let pairs = (nb * nq * d) as f64;
        println!(
            "{metric}: median {:.1} ms (min {:.1}), {:.2} G pair-coordinates/s per thread; \
             CPU time {:.1} ms per run ({:.2} G/s per CPU-second)",
            med * 1e3,
            times[0] * 1e3,
            pairs / med / 1e9 / threads as f64,
            cpu * 1e3,
            pairs / cpu / 1e9
        );
    }
    Ok(())
}
