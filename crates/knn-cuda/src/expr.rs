//! Expression metrics on the GPU: the plan's program as CUDA source, compiled with the fused
//! kernels (`kernels/expr.cu`) into one module per program, cached like the others.
//!
//! The generated `expr_op` is the per-coordinate operation of the direct kernels (what
//! `acc + fabsf(a − b)` is for L1): one statement per instruction, IEEE operations (`sqrtf`,
//! `/` correctly rounded; `expf`, `logf` within 2 and 1 ulp; NVRTC's defaults, no fast math),
//! which is the rounding model of [`knn_core::ExprPlan`]'s bound; contractions into `fmaf` only
//! remove roundings.

use knn_core::expr::{Func, Src};
use knn_core::EngineProgram;
use std::fmt::Write;

/// Values per row staged at once by the fused kernels (`KC` in `kernels/tiles.cu`).
const STAGE: usize = 16;

/// The generated part of an expression module for rows of `values` floats: `EXPR_CH`,
/// `EXPR_TAIL` (whether the last stage of a row is partial), `expr_op(acc, x, y)` (`x`, `y`:
/// the coordinate's `EXPR_CH` channel values of query and base point) and the declaration of
/// `tile_compute_expr`, which `tiles.cu` calls and `expr.cu` defines.
pub(crate) fn prelude(p: &EngineProgram, values: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated: expression program ({} instructions).",
        p.instrs.len()
    );
    let _ = writeln!(s, "#define EXPR_CH {}", p.stride);
    let _ = writeln!(
        s,
        "#define EXPR_TAIL {}",
        u8::from(!values.is_multiple_of(STAGE))
    );
    s.push_str(
        "__device__ __forceinline__ void tile_compute_expr(const float* __restrict__ Q, \
         long long nq, long long q0, const float* __restrict__ B, long long nb, long long b0, \
         int d, long long ldb, float* work, float acc[8][8]);\n",
    );
    s.push_str(
        "__device__ __forceinline__ float expr_op(float acc, const float* x, const float* y) {\n",
    );
    let src = |s: Src| match s {
        Src::Value(j) => format!("v{j}"),
        Src::X(k) => format!("x[{k}]"),
        Src::Y(k) => format!("y[{k}]"),
        Src::Acc => "acc".into(),
        // Exact: the f32 constant's bits.
        Src::Const(c) => format!("__uint_as_float(0x{:08x}u)", c.to_bits()),
    };
    for (i, ins) in p.instrs.iter().enumerate() {
        let (a, b) = (src(ins.a), src(ins.b));
        let e = match ins.func {
            Func::Neg => format!("-{a}"),
            Func::Abs => format!("fabsf({a})"),
            Func::Sqrt => format!("sqrtf({a})"),
            Func::Exp => format!("expf({a})"),
            Func::Log => format!("logf({a})"),
            Func::Add => format!("{a} + {b}"),
            Func::Sub => format!("{a} - {b}"),
            Func::Mul => format!("{a} * {b}"),
            Func::Div => format!("{a} / {b}"),
            Func::Min => format!("fminf({a}, {b})"),
            Func::Max => format!("fmaxf({a}, {b})"),
        };
        let _ = writeln!(s, "    const float v{i} = {e};");
    }
    let _ = writeln!(s, "    return v{};\n}}", p.instrs.len().saturating_sub(1));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use knn_core::prepare::prepare;
    use knn_core::{Matrix, Metric, MetricExpr};
    use std::sync::Arc;

    pub(crate) fn program(text: &str) -> EngineProgram {
        let m = Metric::Expr(Arc::new(MetricExpr::parse(text).unwrap()));
        let b = Matrix::new("b", vec![1.0, 2.0, 3.0, 4.0], 2).unwrap();
        let prep = prepare(&m, b.view(), None).unwrap();
        prep.expr.unwrap().program().clone()
    }

    #[test]
    fn l1_is_the_built_in_operation() {
        let s = prelude(&program("acc + abs(x - y)"), 128);
        assert!(
            s.contains("#define EXPR_CH 1\n#define EXPR_TAIL 0\n"),
            "{s}"
        );
        assert!(prelude(&program("acc + abs(x - y)"), 129).contains("EXPR_TAIL 1"));
        assert!(
            s.contains("v0 = x[0] - y[0];\n    const float v1 = fabsf(v0);\n    const float v2 = acc + v1;\n    return v2;"),
            "{s}"
        );
    }

    #[test]
    fn channels_and_constants() {
        let s = prelude(&program("acc + abs(x - y) * sqrt(x) + exp(-0.5 * y)"), 4);
        assert!(s.contains("#define EXPR_CH 2\n"), "{s}");
        assert!(s.contains("x[1]") && s.contains("y[0]"), "{s}");
        let h = prelude(&program("acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)"), 2);
        // The square roots are features; the program squares a difference of channels.
        assert!(h.contains("x[0] - y[0]") && !h.contains("sqrtf"), "{h}");
        let k = prelude(&program("acc + 0.1 * abs(x - y)"), 2);
        assert!(k.contains(&format!("0x{:08x}u", 0.1f32.to_bits())), "{k}");
    }
}
