//! The symmetric kNN graph (each unordered pair once) against the one-sided path, side by side
//! on the same data in the same process:
//! `cargo run --release -p knn-cpu --example graph_bench -- [n] [d] [k] [metric] [repeat] [threads]
//! [both|on|off]` (defaults: 20000 128 10 l2 5 all both; uniform [0, 1) data). Runs alternate between the
//! two paths after one warm-up each; prints the median and minimum wall time of each, their
//! ratio, the median CPU time (all threads) of each and its ratio, the pair keys each computed,
//! and checks that both graphs are identical.

use knn_core::synth::{generate, Distribution};
use knn_core::{graph, Engine, MatrixRef, Metric, Symmetry};
use knn_cpu::CpuEngine;
use std::time::Instant;

/// CPU time of this process's threads so far, in seconds (`/proc/self/task/*/schedstat`, ns;
/// 0 where unavailable): on a shared machine it drifts less than wall time.
fn cpu_seconds() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let n: usize = arg(0, "20000").parse()?;
    let d: usize = arg(1, "128").parse()?;
    let k: usize = arg(2, "10").parse()?;
    let metric: Metric = arg(3, "l2").parse()?;
    let repeat: usize = arg(4, "5").parse()?;
    let threads: Option<usize> = match arg(5, "all").as_str() {
        "all" => None,
        t => Some(t.parse()?),
    };
    // `only`: time just `off` or `on` (for profilers); default both.
    let only = arg(6, "both");
    let data = generate(Distribution::Uniform { lo: 0.0, hi: 1.0 }, n, d, 7);
    let points = MatrixRef::new("points", &data, d)?;
    let one_sided = CpuEngine::new(threads)?.with_symmetry(Symmetry::Off);
    let symmetric = CpuEngine::new(threads)?.with_symmetry(Symmetry::On);

    let mut times = [Vec::new(), Vec::new()];
    let mut cpu = [Vec::new(), Vec::new()];
    let mut results = [None, None];
    for r in 0..=repeat {
        for (s, engine) in [&one_sided, &symmetric].into_iter().enumerate() {
            if (only == "on" && s == 0) || (only == "off" && s == 1) {
                continue;
            }
            let (t, c) = (Instant::now(), cpu_seconds());
            let nn = graph(engine, points, k, &metric)?;
            let dt = t.elapsed().as_secs_f64() * 1e3;
            if r > 0 {
                times[s].push(dt);
                cpu[s].push((cpu_seconds() - c) * 1e3);
            }
            results[s] = Some(nn);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0])
    };
    if only != "both" {
        let s = usize::from(only == "on");
        let (m, _) = med(&mut times[s]);
        let (c, _) = med(&mut cpu[s]);
        println!("graph n={n} d={d} k={k} {metric} {only}: median {m:.1} ms, CPU time {c:.1} ms");
        return Ok(());
    }
    let [a, b] = results;
    let same =
        a.as_ref().map(|x| (&x.ids, &x.distances)) == b.as_ref().map(|x| (&x.ids, &x.distances));

    // Pair keys: the one-sided path computes every ordered pair (n²); the symmetric path
    // reports what its kernels computed.
    let width = symmetric.candidate_width(k, n - 1, metric.kernel());
    let (_, stats) = symmetric.symmetric_candidates(points, metric.kernel(), width, false)?;
    let (m0, min0) = med(&mut times[0]);
    let (m1, min1) = med(&mut times[1]);
    let (c0, _) = med(&mut cpu[0]);
    let (c1, _) = med(&mut cpu[1]);
    let full = (n as u64) * (n as u64);
    println!(
        "graph n={n} d={d} k={k} {metric} threads={}: one-sided median {m0:.1} ms (min {min0:.1}), \
         symmetric median {m1:.1} ms (min {min1:.1}); ratio one-sided/symmetric {:.2}; \
         CPU time median {c0:.1} vs {c1:.1} ms, ratio {:.2}; pair keys {full} vs {} ({:.3}); blocks {}x{} rows, {} rounds; identical graphs: {same}",
        symmetric.threads(),
        m0 / m1,
        c0 / c1,
        stats.pair_keys,
        stats.pair_keys as f64 / full as f64,
        stats.blocks,
        stats.block_rows,
        stats.rounds,
    );
    if !same {
        return Err("the two paths gave different graphs".into());
    }
    Ok(())
}
