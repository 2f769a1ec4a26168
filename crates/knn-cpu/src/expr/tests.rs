//! Tests of the CPU expression kernels.

use super::*;
use knn_core::prepare::prepare;
use knn_core::synth::{generate, Distribution};
use knn_core::{Matrix, Metric, MetricExpr};
use std::sync::Arc;

/// The bytecode loop computes the plan's plain f32 keys bit for bit (same operations, same
/// order), for programs with shared values, register reuse and several channels.
#[test]
fn keys_are_the_plain_f32_keys() {
    let u = Distribution::Uniform { lo: 0.0, hi: 2.0 };
    for text in [
        "acc + abs(x - y)",
        "max(acc, abs(x - y))",
        "acc + (sqrt(x) - sqrt(y))^2",
        "acc + abs(x - y) * sqrt(x) + exp(-y) * (x - y)^2",
        "0.5 * acc + min(x, y) / (1 + max(x, y))",
        "acc + log(x + 1) * log(y + 1) - x * y",
    ] {
        for (nq, nb, d) in [(1usize, 1usize, 1usize), (70, 9, 5), (3, 130, 33)] {
            let b = Matrix::new("b", generate(u, nb, d, 1), d).unwrap();
            let q = Matrix::new("q", generate(u, nq, d, 2), d).unwrap();
            let m = Metric::Expr(Arc::new(MetricExpr::parse(text).unwrap()));
            let prep = prepare(&m, b.view(), Some(q.view())).unwrap();
            let plan = prep.expr.as_ref().unwrap();
            let (eb, eq) = (prep.engine_base(), prep.engine_queries());
            let req = CandidateRequest {
                base: eb,
                queries: eq,
                kernel: m.kernel(),
                width: nb,
                exclude: None,
                precise: false,
                base_key: None,
                exact_data: false,
                exact_from: None,
            };
            for isa in Isa::available() {
                let cand = candidates_with(&req, plan, isa);
                for i in 0..nq {
                    for j in 0..nb {
                        let id = cand.ids[i * nb + j] as usize;
                        let want = plan.program().key_f32(eq.row(i), eb.row(id));
                        assert_eq!(
                            cand.keys[i * nb + j].to_bits(),
                            want.to_bits(),
                            "{text} {isa:?} q{i} b{id}"
                        );
                    }
                    assert_eq!(cand.floor[i], f32::INFINITY);
                }
            }
        }
    }
}

fn compiled(text: &str) -> Compiled {
    let m = Metric::Expr(Arc::new(MetricExpr::parse(text).unwrap()));
    let b = Matrix::new("b", vec![1.0, 2.0], 1).unwrap();
    let prep = prepare(&m, b.view(), None).unwrap();
    Compiled::new(prep.expr.as_ref().unwrap())
}

#[test]
fn registers_are_reused_and_common_steps_fused() {
    // x − y is read twice: not fused with either reader.
    let c = compiled("acc + ((x - y)^2 + 1) * (abs(x - y) + 2)");
    assert!(c.regs <= 3, "{c:?}");
    assert_eq!(c.pre[0].kind, Kind::F(Func::Sub), "{c:?}");
    assert!(
        matches!(c.fused, Some((Func::Add, Fold::Op(Kind::F(Func::Mul), ..)))),
        "{c:?}"
    );
    let c = compiled("acc + abs(x - y)");
    assert!(c.pre.is_empty(), "{c:?}");
    assert!(
        matches!(
            c.fused,
            Some((Func::Add, Fold::Op(Kind::AbsDiff, Arg::X(0), Arg::Y(0))))
        ),
        "{c:?}"
    );
    let c = compiled("max(acc, (sqrt(x) - sqrt(y))^2 * 3)");
    assert_eq!(c.pre[0].kind, Kind::SqDiff, "{c:?}");
    assert!(
        matches!(c.fused, Some((Func::Max, Fold::Op(Kind::F(Func::Mul), ..)))),
        "{c:?}"
    );
    let c = compiled("0.5 * acc + abs(x - y)");
    assert!(c.fused.is_none() && c.post.len() == 2, "{c:?}");
    assert_eq!(c.post.last().unwrap().dst, 0);
}
