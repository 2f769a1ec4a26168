//! Expression metrics against the built-in metrics they spell, through the whole search
//! pipeline, side by side on the same data:
//! `cargo run --release -p knn-cpu --example expr_bench [threads] [repeat] [nb] [nq] [metric]`
//! (default 100 000 base × 1000 queries, d = 128, k = 10, uniform [0, 1)). Prints each median,
//! the expression / built-in ratio, and whether both found the same neighbours.

use knn_core::synth::{generate, Distribution};
use knn_core::{search, MatrixRef, Metric, MetricExpr};
use knn_cpu::CpuEngine;
use std::sync::Arc;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>());
    let threads = args.next().transpose()?.unwrap_or(1);
    let repeat = args.next().transpose()?.unwrap_or(5);
    let nb = args.next().transpose()?.unwrap_or(100_000);
    let nq = args.next().transpose()?.unwrap_or(1000);
    let (d, k) = (128, 10);
    let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
    let base = generate(u, nb, d, 1);
    let queries = generate(u, nq, d, 2);
    let engine = CpuEngine::new(Some(threads))?;
    let (b, q) = (
        MatrixRef::new("base", &base, d)?,
        MatrixRef::new("queries", &queries, d)?,
    );
    let expr = |t: &str| -> Result<Metric, Box<dyn std::error::Error>> {
        Ok(Metric::Expr(Arc::new(MetricExpr::parse(t)?)))
    };
    let pairs = [
        (Metric::L1, expr("acc + abs(x - y)")?),
        (Metric::Linf, expr("max(acc, abs(x - y))")?),
        (
            Metric::Hellinger,
            expr("acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)")?,
        ),
    ];
    println!("{nb} base × {nq} queries, d = {d}, k = {k}, {threads} thread(s), median of {repeat}");
    let only = std::env::args().nth(5);
    for (builtin, ex) in pairs {
        if only.as_ref().is_some_and(|m| *m != builtin.name()) {
            continue;
        }
        // Alternate the two in each round so that drift on a shared machine hits both alike.
        let (mut tb, mut te) = (Vec::new(), Vec::new());
        let (mut rb, mut re) = (None, None);
        for r in 0..repeat + 1 {
            let t = Instant::now();
            rb = Some(search(&engine, b, q, k, &builtin)?);
            let t1 = t.elapsed().as_secs_f64();
            let t = Instant::now();
            re = Some(search(&engine, b, q, k, &ex)?);
            let t2 = t.elapsed().as_secs_f64();
            if r > 0 {
                tb.push(t1);
                te.push(t2);
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (mb, me) = (med(&mut tb), med(&mut te));
        let (rb, re) = (rb.expect("ran"), re.expect("ran"));
        let same = rb.ids.iter().zip(&re.ids).filter(|(a, b)| a == b).count();
        println!(
            "{builtin:>10}: {:8.1} ms | {ex}: {:8.1} ms | ratio {:.2} | same ids {:.4}",
            mb * 1e3,
            me * 1e3,
            me / mb,
            same as f64 / rb.ids.len() as f64
        );
    }
    Ok(())
}
