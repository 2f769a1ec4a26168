//! Times squared-L2 search at small d (the classification shape of issue 4) on each CPU path:
//! `cargo run --release -p knn-cpu --example small_d_bench [threads] [repeat] [queries] [default,bf16,f32]`
//! (200 000 base, uniform [−100, 100], d = 16, k = 15, width as the pipeline asks). Prints the
//! median and minimum wall time (and the minimum in ns per (query, base point) pair and
//! thread) and the median CPU time for the default engine
//! (int8 at this d), bf16 only and f32 only.

use knn_core::synth::{generate, Distribution};
use knn_core::{search, MatrixRef, Metric};
use knn_cpu::CpuEngine;
use std::time::Instant;

mod common;
use common::cpu_seconds;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let threads = args.next().transpose()?.unwrap_or(1);
    let repeat = args.next().transpose()?.unwrap_or(3);
    let nq = args.next().transpose()?.unwrap_or(4096);
    let only = std::env::args().nth(4);
    let (nb, d, k) = (200_000, 16, 15);
    let u = Distribution::Uniform {
        lo: -100.0,
        hi: 100.0,
    };
    let base = generate(u, nb, d, 1);
    let queries = generate(u, nq, d, 2);
    let (b, q) = (
        MatrixRef::new("base", &base, d)?,
        MatrixRef::new("queries", &queries, d)?,
    );
    let engines = [
        ("default", CpuEngine::new(Some(threads))?),
        ("bf16", CpuEngine::new(Some(threads))?.without_int8()),
        ("f32", CpuEngine::new(Some(threads))?.f32_only()),
    ];
    let mut reference = None;
    for (name, engine) in &engines {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|x| x == *name))
        {
            continue;
        }
        let (mut wall, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..repeat {
            let (t, c) = (Instant::now(), cpu_seconds());
            let r = search(engine, b, q, k, &Metric::SqL2)?;
            wall.push(t.elapsed().as_secs_f64());
            cpu.push(cpu_seconds() - c);
            match &reference {
                None => reference = Some((r.ids, r.distances)),
                Some((ids, dist)) => {
                    if let Some(i) = (0..ids.len()).find(|&i| ids[i] != r.ids[i]) {
                        let row = i / k * k..(i / k + 1) * k;
                        panic!(
                            "{name} differs from the default engine at query {}: {:?} {:?} vs {:?} {:?}",
                            i / k,
                            &ids[row.clone()],
                            &dist[row.clone()],
                            &r.ids[row.clone()],
                            &r.distances[row]
                        );
                    }
                }
            }
        }
        wall.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        let (w, c) = (wall[wall.len() / 2], cpu[cpu.len() / 2]);
        println!(
            "{name:8} {nq} x {nb}, d={d}, k={k}, {threads} thread(s): wall median {w:.3} s, min {:.3} s ({:.3} ns/pair·thread), cpu {c:.2} s",
            wall[0],
            wall[0] * 1e9 * threads as f64 / (nq * nb) as f64
        );
    }
    Ok(())
}
