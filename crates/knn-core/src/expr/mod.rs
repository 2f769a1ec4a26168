//! User-defined distances ([`crate::Metric::Expr`], `--metric-expr`): a per-coordinate
//! accumulation with an optional final step, parsed and checked here, evaluated in f64 by the
//! exact re-rank and the oracle, and compiled by the engines (a bytecode loop on the CPU, CUDA
//! source through NVRTC on GPUs).
//!
//! # Syntax
//! `ACCUMULATION` or `ACCUMULATION ; FINAL`, for example
//! - `acc + abs(x - y)` (L1), `max(acc, abs(x - y))` (L∞),
//! - `acc + (x - y)^2 ; sqrt(acc)` (L2),
//! - `acc + (sqrt(x) - sqrt(y))^2 ; sqrt(0.5 * acc)` (Hellinger),
//! - `acc + abs(x - y) / (x + y + 1)` (a Canberra-like sum).
//!
//! The accumulation sees `acc` (the running value), `x` (the query's coordinate) and `y` (the
//! base point's coordinate) and must use all three; the final step sees `acc` only. Numbers
//! (`2`, `0.5`, `1e-3`), `+ - * /`, unary minus, `^n` for whole powers `0 ≤ n ≤ 64` (`-x^2` is
//! `-(x^2)`), and the functions `abs`, `sqrt`, `exp`, `log` (natural), `min`, `max` (two or more
//! arguments). Errors name the column of the problem.
//!
//! # Meaning
//! `key(x, y) = acc_d` with `acc_0 = 0` and `acc_{i+1} = F(acc_i, x_i, y_i)`, evaluated in f64 in
//! coordinate order; a smaller key is a better neighbour. The reported distance is
//! `FINAL(key)` in f64, rounded to f32 (the key itself without a final step). `FINAL` must be
//! non-decreasing in `acc` over the keys the data can produce; this is checked on the data.
//!
//! # Exactness
//! Engines compute keys in f32; [`ExprPlan`] holds a proven bound on `|f32 key − f64 key|`
//! derived by interval analysis over the data's range (see `plan.rs`), from which each row's
//! floor follows. Values that would make an operation undefined (a negative `sqrt`, `log` of a
//! value ≤ 0, a divisor that can be 0) or leave the f32 range are refused before any work, with
//! the column of the operation and the data that triggers it.

mod bound;
mod parse;
mod plan;

pub(crate) use plan::prepare_expr;
pub use plan::{EngineProgram, ExprPlan, Instr, Src};

use crate::matrix::MatrixRef;
use std::fmt;

/// Most operations (nodes) an expression may have after simplification.
pub const MAX_NODES: usize = 128;

/// An operation of an expression: unary (`Neg` … `Log`) or binary (`Add` … `Max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Func {
    /// `−a`.
    Neg,
    /// `|a|`.
    Abs,
    /// `√a`.
    Sqrt,
    /// `eᵃ`.
    Exp,
    /// `ln a`.
    Log,
    /// `a + b`.
    Add,
    /// `a − b`.
    Sub,
    /// `a · b`.
    Mul,
    /// `a / b`.
    Div,
    /// `min(a, b)`.
    Min,
    /// `max(a, b)`.
    Max,
}

impl Func {
    /// `true` for the one-operand functions.
    pub fn is_unary(self) -> bool {
        matches!(
            self,
            Func::Neg | Func::Abs | Func::Sqrt | Func::Exp | Func::Log
        )
    }

    /// The operation in f64 (`b` ignored when unary): the reference semantics.
    #[inline(always)]
    pub fn f64(self, a: f64, b: f64) -> f64 {
        match self {
            Func::Neg => -a,
            Func::Abs => a.abs(),
            Func::Sqrt => a.sqrt(),
            Func::Exp => a.exp(),
            Func::Log => a.ln(),
            Func::Add => a + b,
            Func::Sub => a - b,
            Func::Mul => a * b,
            Func::Div => a / b,
            Func::Min => a.min(b),
            Func::Max => a.max(b),
        }
    }

    /// The operation in f32 as the CPU engine computes it: IEEE operations (correctly
    /// rounded); `exp` and `log` through f64, rounded once (within the 4-ulp allowance of
    /// [`ExprPlan`]'s bound).
    #[inline(always)]
    pub fn f32(self, a: f32, b: f32) -> f32 {
        match self {
            Func::Neg => -a,
            Func::Abs => a.abs(),
            Func::Sqrt => a.sqrt(),
            Func::Exp => (a as f64).exp() as f32,
            Func::Log => (a as f64).ln() as f32,
            Func::Add => a + b,
            Func::Sub => a - b,
            Func::Mul => a * b,
            Func::Div => a / b,
            Func::Min => a.min(b),
            Func::Max => a.max(b),
        }
    }

    /// Name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Func::Neg => "unary minus",
            Func::Abs => "abs",
            Func::Sqrt => "sqrt",
            Func::Exp => "exp",
            Func::Log => "log",
            Func::Add => "+",
            Func::Sub => "-",
            Func::Mul => "*",
            Func::Div => "/",
            Func::Min => "min",
            Func::Max => "max",
        }
    }
}

/// A position in the expression text: first character (0-based) and length, in characters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Span {
    pub start: u32,
    pub len: u32,
}

/// One node of a program: a leaf or an operation on earlier nodes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Op {
    Acc,
    X,
    Y,
    Const(f64),
    /// Function and operand node indices (the second equals the first when unary).
    Apply(Func, u32, u32),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Node {
    pub op: Op,
    /// The token that names the operation (function name, operator, number, variable).
    pub at: Span,
}

/// Nodes in evaluation order (operands before their users); the last is the result.
/// Identical subexpressions share one node and constant subexpressions are folded.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Program {
    pub nodes: Vec<Node>,
    /// The span of the whole part (accumulation or final step).
    pub whole: Span,
}

impl Program {
    /// One evaluation in f64 (`v` holds at least as many values as there are nodes).
    #[inline(always)]
    pub fn eval_f64(&self, acc: f64, x: f64, y: f64, v: &mut [f64]) -> f64 {
        let mut last = 0.0;
        for (i, n) in self.nodes.iter().enumerate() {
            last = match n.op {
                Op::Acc => acc,
                Op::X => x,
                Op::Y => y,
                Op::Const(c) => c,
                Op::Apply(f, a, b) => f.f64(v[a as usize], v[b as usize]),
            };
            v[i] = last;
        }
        last
    }

    /// Bit set of the variables node `i` depends on: 1 = acc, 2 = x, 4 = y.
    pub fn deps(&self) -> Vec<u8> {
        let mut deps = vec![0u8; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            deps[i] = match n.op {
                Op::Acc => 1,
                Op::X => 2,
                Op::Y => 4,
                Op::Const(_) => 0,
                Op::Apply(_, a, b) => deps[a as usize] | deps[b as usize],
            };
        }
        deps
    }
}

/// A parse or check error of an expression, with the column (1-based, in characters) of the
/// problem. Displays as `column N: message`, then the text with a caret line under the problem.
#[derive(Clone, Debug, PartialEq)]
pub struct ExprError {
    message: String,
    text: String,
    column: usize,
    width: usize,
}

impl ExprError {
    pub(crate) fn at(text: &str, at: Span, message: impl Into<String>) -> Self {
        ExprError {
            message: message.into(),
            text: text.to_string(),
            column: at.start as usize + 1,
            width: (at.len as usize).max(1),
        }
    }

    /// The column (1-based, in characters) where the problem is.
    pub fn column(&self) -> usize {
        self.column
    }

    /// The message, without position.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ExprError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "column {}: {}\n    {}\n    {}{}",
            self.column,
            self.message,
            self.text,
            " ".repeat(self.column - 1),
            "^".repeat(self.width)
        )
    }
}

impl std::error::Error for ExprError {}

/// A parsed and checked expression metric (see the [module docs](self) for the syntax).
#[derive(Clone)]
pub struct MetricExpr {
    text: String,
    acc: Program,
    fin: Option<Program>,
    fold: Option<Fold>,
}

/// Coordinates per block of [`MetricExpr::keys`]' fold form.
const BLOCK: usize = 64;
/// Pairs whose folds [`MetricExpr::keys`] interleaves.
const PAIRS: usize = 8;

/// An accumulation `acc ⊕ t` (or `t ⊕ acc`) whose `t` does not depend on `acc`: `t` can be
/// computed for many coordinates at once, node by node, before the fold.
#[derive(Clone, Debug)]
struct Fold {
    func: Func,
    acc_first: bool,
    /// Node of `t`.
    t: usize,
    /// The nodes `t` needs that depend on `x` alone or on nothing, in order: the same for
    /// every base point.
    shared: Vec<usize>,
    /// The other nodes `t` needs, in order (every node but these, `acc` and the root).
    own: Vec<usize>,
    /// Per node: in `shared`.
    is_shared: Vec<bool>,
}

impl Fold {
    fn of(p: &Program) -> Option<Fold> {
        let deps = p.deps();
        let root = p.nodes.len() - 1;
        let Op::Apply(func, a, b) = p.nodes[root].op else {
            return None;
        };
        let (a, b) = (a as usize, b as usize);
        let is_acc = |i: usize| p.nodes[i].op == Op::Acc;
        let (acc_first, t) = match (is_acc(a), is_acc(b)) {
            (true, false) => (true, b),
            (false, true) => (false, a),
            _ => return None,
        };
        if func.is_unary() || deps[t] & 1 != 0 {
            return None;
        }
        // Every node but the root and acc is free of acc (so `t` is all that is left).
        let nodes: Vec<usize> = (0..root).filter(|&i| !is_acc(i)).collect();
        let (shared, own): (Vec<usize>, Vec<usize>) =
            nodes.iter().partition(|&&i| deps[i] == 0 || deps[i] == 2);
        let is_shared = (0..p.nodes.len()).map(|i| shared.contains(&i)).collect();
        nodes.iter().all(|&i| deps[i] & 1 == 0).then_some(Fold {
            func,
            acc_first,
            t,
            shared,
            own,
            is_shared,
        })
    }
}

/// `acc[p] = acc[p] ⊕ buf[ts[p] + c]` for `c < n` in order, the rows interleaved (`⊕` =
/// `func`, `acc` on the left when `acc_first`); the function chosen once for the block.
#[inline(always)]
fn fold_block(
    acc: &mut [f64; PAIRS],
    buf: &[f64],
    ts: &[usize; PAIRS],
    n: usize,
    func: Func,
    acc_first: bool,
) {
    #[inline(always)]
    fn each(
        acc: &mut [f64; PAIRS],
        buf: &[f64],
        ts: &[usize; PAIRS],
        n: usize,
        g: impl Fn(f64, f64) -> f64,
    ) {
        let rows: [&[f64]; PAIRS] = std::array::from_fn(|p| &buf[ts[p]..ts[p] + n]);
        let mut a = *acc;
        for c in 0..n {
            for (a, row) in a.iter_mut().zip(&rows) {
                *a = g(*a, row[c]);
            }
        }
        *acc = a;
    }
    match (func, acc_first) {
        (Func::Add, _) => each(acc, buf, ts, n, |a, t| a + t),
        (Func::Max, true) => each(acc, buf, ts, n, |a, t| a.max(t)),
        (Func::Max, false) => each(acc, buf, ts, n, |a, t| t.max(a)),
        (Func::Min, true) => each(acc, buf, ts, n, |a, t| a.min(t)),
        (Func::Min, false) => each(acc, buf, ts, n, |a, t| t.min(a)),
        (Func::Mul, _) => each(acc, buf, ts, n, |a, t| a * t),
        (Func::Sub, true) => each(acc, buf, ts, n, |a, t| a - t),
        (Func::Sub, false) => each(acc, buf, ts, n, |a, t| t - a),
        (Func::Div, true) => each(acc, buf, ts, n, |a, t| a / t),
        (Func::Div, false) => each(acc, buf, ts, n, |a, t| t / a),
        (g, true) => each(acc, buf, ts, n, |a, t| g.f64(a, t)),
        (g, false) => each(acc, buf, ts, n, |a, t| g.f64(t, a)),
    }
}

/// `out[l] = f(a[l], b[l])` in f64, the function chosen once for the whole slice (the same
/// operations as [`Func::f64`], in loops the compiler vectorises).
#[inline(always)]
pub(crate) fn apply_slices(f: Func, a: &[f64], b: &[f64], out: &mut [f64]) {
    #[inline(always)]
    fn each(a: &[f64], b: &[f64], out: &mut [f64], g: impl Fn(f64, f64) -> f64) {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = g(x, y);
        }
    }
    match f {
        Func::Neg => each(a, b, out, |x, y| Func::Neg.f64(x, y)),
        Func::Abs => each(a, b, out, |x, y| Func::Abs.f64(x, y)),
        Func::Sqrt => each(a, b, out, |x, y| Func::Sqrt.f64(x, y)),
        Func::Exp => each(a, b, out, |x, y| Func::Exp.f64(x, y)),
        Func::Log => each(a, b, out, |x, y| Func::Log.f64(x, y)),
        Func::Add => each(a, b, out, |x, y| Func::Add.f64(x, y)),
        Func::Sub => each(a, b, out, |x, y| Func::Sub.f64(x, y)),
        Func::Mul => each(a, b, out, |x, y| Func::Mul.f64(x, y)),
        Func::Div => each(a, b, out, |x, y| Func::Div.f64(x, y)),
        Func::Min => each(a, b, out, |x, y| Func::Min.f64(x, y)),
        Func::Max => each(a, b, out, |x, y| Func::Max.f64(x, y)),
    }
}

impl MetricExpr {
    /// Parses and checks `text` (`ACCUMULATION` or `ACCUMULATION ; FINAL`). Checks that need the
    /// data (domains, f32 range, a non-decreasing final step) happen when a search starts.
    pub fn parse(text: &str) -> Result<Self, ExprError> {
        let (acc, fin) = parse::parse(text)?;
        Ok(MetricExpr {
            text: text.to_string(),
            fold: Fold::of(&acc),
            acc,
            fin,
        })
    }

    /// The text it was parsed from.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The exact (reference) key of two points: the accumulation over every coordinate in
    /// order, from `acc = 0`, in f64.
    pub fn key(&self, x: &[f32], y: &[f32]) -> f64 {
        match &self.fold {
            Some(f) => {
                let mut buf = Vec::new();
                let mut out = [0.0];
                self.fold_keys(f, x, &[y], &mut out, &mut buf);
                out[0]
            }
            None => self.key_plain(x, y),
        }
    }

    /// [`MetricExpr::key`] of `x` and every base row `ids`, as `(key, id)` pairs appended to
    /// `out`, in the order of `ids`. Faster than one key at a time: each key is a chain of
    /// dependent f64 operations, and this runs several chains at once.
    pub fn keys(&self, x: &[f32], base: MatrixRef<'_>, ids: &[u32], out: &mut Vec<(f64, u32)>) {
        let Some(f) = &self.fold else {
            out.extend(
                ids.iter()
                    .map(|&b| (self.key_plain(x, base.row(b as usize)), b)),
            );
            return;
        };
        let mut buf = Vec::new();
        for group in ids.chunks(PAIRS) {
            let rows: [&[f32]; PAIRS] =
                std::array::from_fn(|p| base.row(group[p.min(group.len() - 1)] as usize));
            let mut keys = [0.0; PAIRS];
            self.fold_keys(f, x, &rows[..group.len()], &mut keys, &mut buf);
            out.extend(keys.iter().zip(group).map(|(&k, &b)| (k, b)));
        }
    }

    /// Keys one coordinate at a time, whatever the form.
    fn key_plain(&self, x: &[f32], y: &[f32]) -> f64 {
        let mut v = [0.0f64; MAX_NODES];
        let mut acc = 0.0f64;
        for (&a, &b) in x.iter().zip(y) {
            acc = self.acc.eval_f64(acc, a as f64, b as f64, &mut v);
        }
        acc
    }

    /// Keys of `acc ⊕ t` forms for `x` and up to [`PAIRS`] rows `ys` into `out`: per block of
    /// coordinates, `t` node by node (the nodes of `x` alone once for all rows), then the rows'
    /// folds interleaved, each in coordinate order. The same operations on the same values as
    /// [`MetricExpr::key_plain`], so the same bits. `buf` is scratch space.
    fn fold_keys(&self, f: &Fold, x: &[f32], ys: &[&[f32]], out: &mut [f64], buf: &mut Vec<f64>) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                return unsafe { self.fold_keys_avx512(f, x, ys, out, buf) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2.
                return unsafe { self.fold_keys_avx2(f, x, ys, out, buf) };
            }
        }
        self.fold_keys_with(f, x, ys, out, buf)
    }

    /// [`MetricExpr::fold_keys_with`] compiled for AVX-512 (IEEE operations give the same bits
    /// on every instruction set; the compiler forms no FMAs).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn fold_keys_avx512(
        &self,
        f: &Fold,
        x: &[f32],
        ys: &[&[f32]],
        out: &mut [f64],
        buf: &mut Vec<f64>,
    ) {
        self.fold_keys_with(f, x, ys, out, buf)
    }

    /// [`MetricExpr::fold_keys_with`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn fold_keys_avx2(
        &self,
        f: &Fold,
        x: &[f32],
        ys: &[&[f32]],
        out: &mut [f64],
        buf: &mut Vec<f64>,
    ) {
        self.fold_keys_with(f, x, ys, out, buf)
    }

    #[inline(always)]
    fn fold_keys_with(
        &self,
        f: &Fold,
        x: &[f32],
        ys: &[&[f32]],
        out: &mut [f64],
        buf: &mut Vec<f64>,
    ) {
        let nodes = self.acc.nodes.len();
        let np = ys.len();
        // Blocks of node values: the shared ones, then one region per row.
        let region = nodes * BLOCK;
        buf.resize(region * (1 + np), 0.0);
        let slot = |i: usize, p: usize| {
            if f.is_shared[i] {
                i * BLOCK
            } else {
                (1 + p) * region + i * BLOCK
            }
        };
        let slot = &slot;
        let mut acc = [0.0f64; PAIRS];
        let mut c0 = 0;
        while c0 < x.len() {
            let n = BLOCK.min(x.len() - c0);
            // A macro, not a closure: closures are compiled without this function's target
            // features (and not inlined), which makes the loops scalar.
            macro_rules! eval {
                ($i:expr, $p:expr, $y:expr) => {{
                    let (i, p, y): (usize, usize, &[f32]) = ($i, $p, $y);
                    // Operands come before the node: in the shared region or earlier in its own.
                    let (lo, hi) = buf.split_at_mut(slot(i, p));
                    let r = &mut hi[..n];
                    match self.acc.nodes[i].op {
                        Op::X => r.iter_mut().zip(&x[c0..c0 + n]).for_each(|(r, &v)| *r = v as f64),
                        Op::Y => r.iter_mut().zip(&y[c0..c0 + n]).for_each(|(r, &v)| *r = v as f64),
                        Op::Const(c) => r.fill(c),
                        Op::Apply(g, a, b) => {
                            let (sa, sb) = (slot(a as usize, p), slot(b as usize, p));
                            apply_slices(g, &lo[sa..sa + n], &lo[sb..sb + n], r);
                        }
                        Op::Acc => unreachable!("acc is not among the fold's nodes"),
                    }
                }};
            }
            for &i in &f.shared {
                eval!(i, 0, &[]);
            }
            for (p, y) in ys.iter().enumerate() {
                for &i in &f.own {
                    eval!(i, p, y);
                }
            }
            // All PAIRS chains (the unused ones repeat the last row): fixed-size loops.
            let ts: [usize; PAIRS] = std::array::from_fn(|p| slot(f.t, p.min(np - 1)));
            fold_block(&mut acc, buf, &ts, n, f.func, f.acc_first);
            c0 += n;
        }
        out[..np].copy_from_slice(&acc[..np]);
    }

    /// The distance of a key: the final step in f64 (the key itself without one).
    pub fn distance(&self, key: f64) -> f64 {
        match &self.fin {
            None => key,
            Some(p) => {
                let mut v = [0.0f64; MAX_NODES];
                p.eval_f64(key, 0.0, 0.0, &mut v)
            }
        }
    }

    pub(crate) fn accumulation(&self) -> &Program {
        &self.acc
    }

    pub(crate) fn final_step(&self) -> Option<&Program> {
        self.fin.as_ref()
    }

    /// `true` when `key(x, y) == key(y, x)` bit for bit, shown structurally: the accumulation
    /// is unchanged by swapping `x` and `y` up to the order of `+`, `*`, `min`, `max` operands
    /// and the sign inside `abs(a − b)` and `(a − b)^2`.
    pub fn is_symmetric(&self) -> bool {
        parse::is_symmetric(&self.acc)
    }
}

impl PartialEq for MetricExpr {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl fmt::Debug for MetricExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MetricExpr({:?})", self.text)
    }
}

impl fmt::Display for MetricExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for MetricExpr {
    type Err = ExprError;
    fn from_str(s: &str) -> Result<Self, ExprError> {
        MetricExpr::parse(s)
    }
}
