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

mod parse;
mod plan;

pub(crate) use plan::prepare_expr;
pub use plan::{EngineProgram, ExprPlan, Instr, Src};

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
}

impl MetricExpr {
    /// Parses and checks `text` (`ACCUMULATION` or `ACCUMULATION ; FINAL`). Checks that need the
    /// data (domains, f32 range, a non-decreasing final step) happen when a search starts.
    pub fn parse(text: &str) -> Result<Self, ExprError> {
        let (acc, fin) = parse::parse(text)?;
        Ok(MetricExpr {
            text: text.to_string(),
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
        let mut v = [0.0f64; MAX_NODES];
        let mut acc = 0.0f64;
        for (&a, &b) in x.iter().zip(y) {
            acc = self.acc.eval_f64(acc, a as f64, b as f64, &mut v);
        }
        acc
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
