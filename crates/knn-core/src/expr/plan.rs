//! From a parsed expression and the data to what engines run: features, the f32 program, and
//! the proven bound on its rounding.
//!
//! # Features
//! Subexpressions of `x` alone (such as `sqrt(x)`) and of `y` alone are computed once per value,
//! in f64 (the reference's own operations, so bit for bit its values) and rounded to f32: the
//! engine rows hold, per coordinate, these *channels* (`stride` values, a power of two, zero
//! padded). The per-pair program ([`EngineProgram`]) reads them and the running value `acc`.
//!
//! # The bound
//! For every pair, `|k̂ − k| ≤ A + R·|k|`, where `k` is the reference key (the accumulation in
//! f64, [`super::MetricExpr::key`]) and `k̂` the engine's f32 key. `A` and `R` come from a
//! forward analysis of the program over the data: every instruction gets an interval `V`
//! holding all the values it takes in f32 *and* in f64 (endpoints with directed rounding, then
//! outward to f32 values, which contain both roundings of any real value between them,
//! rounding being monotone) and an error `|v₃₂ − v₆₄| ≤ a + r·|v₆₄|`, propagated operation by
//! operation (see `apply`): relative where no cancellation can occur (sums of terms of one sign,
//! products, quotients, square roots: `|x − y|`, `x + y`, `(√x − √y)²` stay relative), absolute
//! (over `V`) where it can. Each rounding adds `2⁻²⁴` (f32) and `2⁻⁵³` (f64) relative, and
//! `2⁻¹⁴⁹` for subnormal results; `exp` and `log` take 4 ulp for f32 (CUDA's `expf` is within 2,
//! `logf` within 1; the CPU rounds the f64 function once) and 2 ulp for f64. A fused
//! multiply-add (CUDA contracts `a·b + c`) skips a rounding, so it stays within these. Channels
//! add one rounding to f32; constants their own. The accumulation is iterated over the `d`
//! coordinates from `acc = 0` (exactly, `d` steps), so `A`, `R` are those of `acc_d`; both values
//! of an instruction lie in `V`, so an error never exceeds `V`'s width.
//!
//! A row whose W-th computed key is `k̂_W` gets the floor `k̂_W − (A + R·m)`, `m` the largest
//! magnitude of a key at most `k̂_W` (`k̂_W` itself when keys are not negative): a point left
//! out has a computed key at least `k̂_W` and a reference key either above `k̂_W` or within
//! `A + R·m` of its computed key.
//!
//! Operations whose operands may leave their domain on this data (`sqrt` of a negative value,
//! `log` of a value ≤ 0, a divisor interval holding 0), values beyond the f32 range, and final
//! steps not shown non-decreasing over the keys' range are refused with a clear error.

use super::bound::{apply, check_final, num, round_down, Iv, St, ETA, U32};
use super::{apply_slices, ExprError, Func, MetricExpr, Op, Program, Span, MAX_NODES};
use crate::error::{KnnError, Result};
use crate::matrix::{Matrix, MatrixRef};
use rayon::prelude::*;
use std::collections::HashMap;

/// Most channels (distinct functions of `x`, or of `y`) an expression may use.
pub const MAX_CHANNELS: usize = 16;

/// An operand of an engine instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Src {
    /// The result of an earlier instruction.
    Value(u16),
    /// Channel `k` of the query's coordinate.
    X(u8),
    /// Channel `k` of the base point's coordinate.
    Y(u8),
    /// The running value.
    Acc,
    /// A constant.
    Const(f32),
}

/// One instruction: `func(a, b)` (`b` equals `a` for unary functions).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Instr {
    /// The operation.
    pub func: Func,
    /// First operand.
    pub a: Src,
    /// Second operand.
    pub b: Src,
}

/// The per-pair program engines run for each coordinate, in f32: instruction `i` computes
/// value `i`; the last one is the new `acc`. Engine rows hold `stride` channel values per
/// coordinate (`x_channels` of them used in query rows, `y_channels` in base rows).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineProgram {
    /// In evaluation order; operands refer to earlier values only.
    pub instrs: Vec<Instr>,
    /// Channel values per coordinate in the engine rows: 1, 2, 4, 8 or 16.
    pub stride: usize,
    /// Channels of query rows in use.
    pub x_channels: usize,
    /// Channels of base rows in use.
    pub y_channels: usize,
}

impl EngineProgram {
    /// One coordinate: the new `acc` from `acc` and the coordinate's channels (`xs`, `ys`).
    /// `v` holds at least `instrs.len()` values.
    #[inline(always)]
    pub fn step_f32(&self, acc: f32, xs: &[f32], ys: &[f32], v: &mut [f32]) -> f32 {
        let mut last = acc;
        for (i, ins) in self.instrs.iter().enumerate() {
            let get = |s: Src| match s {
                Src::Value(j) => v[j as usize],
                Src::X(k) => xs[k as usize],
                Src::Y(k) => ys[k as usize],
                Src::Acc => acc,
                Src::Const(c) => c,
            };
            last = ins.func.f32(get(ins.a), get(ins.b));
            v[i] = last;
        }
        last
    }

    /// The f32 key of a query row and a base row of the engine space, coordinate by coordinate
    /// from `acc = 0`: the plain evaluation every engine's keys are bounded against.
    pub fn key_f32(&self, x: &[f32], y: &[f32]) -> f32 {
        let mut v = [0.0f32; MAX_NODES];
        let mut acc = 0.0f32;
        for (xs, ys) in x.chunks_exact(self.stride).zip(y.chunks_exact(self.stride)) {
            acc = self.step_f32(acc, xs, ys, &mut v);
        }
        acc
    }

    /// A stable 64-bit fingerprint of the program (FNV-1a of its listing), for caches of
    /// compiled code.
    pub fn fingerprint(&self) -> u64 {
        let text = format!("{:?}/{}", self.instrs, self.stride);
        let mut h: u64 = 0xcbf29ce484222325;
        for b in text.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
        h
    }
}

/// What engines need to run an expression metric on prepared data: the program, the dimension
/// and the proven rounding bound (see the module docs).
#[derive(Clone, Debug)]
pub struct ExprPlan {
    program: EngineProgram,
    dim: usize,
    /// `|k̂ − k| ≤ abs + rel·|k|` for every pair (`k` the f64 key).
    abs: f64,
    rel: f64,
    /// The values f64 keys can take.
    keys: (f64, f64),
}

impl ExprPlan {
    /// The per-pair program.
    pub fn program(&self) -> &EngineProgram {
        &self.program
    }

    /// Coordinates per point `d`; engine rows hold `d · program().stride` values.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// A bound on `|computed − reference|` valid for every pair whose reference key is at most
    /// `key`: `abs + rel·m`, `m` the largest magnitude such a key can have.
    pub fn error_bound(&self, key: f32) -> f64 {
        let (lo, hi) = self.keys;
        let k = (key as f64).min(hi);
        let m = if lo >= 0.0 {
            k.max(0.0)
        } else {
            k.abs().max(lo.abs())
        };
        let e = self.abs + self.rel * m;
        if e.is_nan() {
            f64::INFINITY
        } else {
            e
        }
    }

    /// The floor of a row whose `width`-th computed key is `kth`: a lower bound on the reference
    /// key of every point left out, rounded down to f32 (`−∞` when the bound is unusable).
    ///
    /// A point left out has a computed key `k̂ ≥ kth`; its reference key is either above `kth`
    /// or at most `kth`, and then within `error_bound(kth)` of `k̂`.
    pub fn floor(&self, kth: f32) -> f32 {
        let f = kth as f64 - self.error_bound(kth) * (1.0 + 1e-9) - ETA;
        if f.is_nan() {
            return f32::NEG_INFINITY;
        }
        round_down(f) as f32
    }
}

/// An operand during the analysis (constants keep their f64 value).
#[derive(Clone, Copy, Debug, PartialEq)]
enum ASrc {
    Value(usize),
    X(usize),
    Y(usize),
    Acc,
    Const(f64),
}

/// The program split for engines: channel roots per side and the per-pair instructions.
struct Split {
    x_roots: Vec<u32>,
    y_roots: Vec<u32>,
    /// (function, operands, source position, depends on acc).
    instrs: Vec<(Func, ASrc, ASrc, Span, bool)>,
}

fn split(p: &Program) -> Split {
    let deps = p.deps();
    let pure = |d: u8| d == 0 || d == 2 || d == 4;
    let mut x_roots = Vec::new();
    let mut y_roots = Vec::new();
    for (i, n) in p.nodes.iter().enumerate() {
        if let Op::Apply(_, a, b) = n.op {
            if pure(deps[i]) {
                continue;
            }
            for o in [a, b] {
                let list = match deps[o as usize] {
                    2 => &mut x_roots,
                    4 => &mut y_roots,
                    _ => continue,
                };
                if !list.contains(&o) {
                    list.push(o);
                }
            }
        }
    }
    x_roots.sort_unstable();
    y_roots.sort_unstable();
    let mut value_of = vec![usize::MAX; p.nodes.len()];
    let mut instrs = Vec::new();
    for (i, n) in p.nodes.iter().enumerate() {
        let Op::Apply(f, a, b) = n.op else { continue };
        if pure(deps[i]) {
            continue;
        }
        let src = |o: u32| {
            let o = o as usize;
            match (p.nodes[o].op, deps[o]) {
                (Op::Acc, _) => ASrc::Acc,
                (Op::Const(c), _) => ASrc::Const(c),
                (_, 2) => ASrc::X(x_roots.iter().position(|&r| r as usize == o).expect("root")),
                (_, 4) => ASrc::Y(y_roots.iter().position(|&r| r as usize == o).expect("root")),
                _ => ASrc::Value(value_of[o]),
            }
        };
        let (sa, sb) = (src(a), src(b));
        value_of[i] = instrs.len();
        instrs.push((f, sa, sb, n.at, deps[i] & 1 != 0));
    }
    Split {
        x_roots,
        y_roots,
        instrs,
    }
}

/// Interned structure of pure subexpressions with the variable unnamed, so that `sqrt(x)` and
/// `sqrt(y)` get the same id (a self-join then shares one feature matrix).
fn pure_ids(p: &Program, intern: &mut HashMap<(u8, u64, u32, u32), u32>) -> Vec<u32> {
    let mut ids = vec![0u32; p.nodes.len()];
    for (i, n) in p.nodes.iter().enumerate() {
        let key = match n.op {
            Op::Acc => (0, 0, 0, 0),
            Op::X | Op::Y => (1, 0, 0, 0),
            Op::Const(c) => (2, c.to_bits(), 0, 0),
            Op::Apply(f, a, b) => (3, f as u64, ids[a as usize], ids[b as usize]),
        };
        let next = intern.len() as u32;
        ids[i] = *intern.entry(key).or_insert(next);
    }
    ids
}

/// Feature channels of one side: the values and error of each channel over the data.
struct Channels {
    data: Option<Matrix>,
    st: Vec<St>,
}

/// Computes the channels `roots` (pure in `var`: 2 = x, 4 = y) of every value of `m`, laid out
/// `stride` per coordinate; `None` as data when the only channel is the variable itself.
fn channels(
    e: &MetricExpr,
    roots: &[u32],
    var: u8,
    m: MatrixRef<'_>,
    stride: usize,
    what: &str,
) -> Result<Channels> {
    let p = e.accumulation();
    let deps = p.deps();
    let leaf = if var == 2 { Op::X } else { Op::Y };
    let identity = stride == 1 && roots.len() == 1 && p.nodes[roots[0] as usize].op == leaf;
    let (n, d) = (m.rows(), m.dim());
    if n == 0 {
        return Ok(Channels {
            data: None,
            st: vec![
                St {
                    v: Iv::point(0.0),
                    a: 0.0,
                    r: 0.0,
                };
                roots.len()
            ],
        });
    }
    if identity {
        let (lo, hi) = m
            .as_slice()
            .par_iter()
            .fold(
                || (f32::INFINITY, f32::NEG_INFINITY),
                |(lo, hi), &v| (lo.min(v), hi.max(v)),
            )
            .reduce(
                || (f32::INFINITY, f32::NEG_INFINITY),
                |a, b| (a.0.min(b.0), a.1.max(b.1)),
            );
        return Ok(Channels {
            data: None,
            st: vec![St {
                v: Iv {
                    lo: lo as f64,
                    hi: hi as f64,
                },
                a: 0.0,
                r: 0.0,
            }],
        });
    }
    // The nodes to evaluate per value: constants and those pure in `var`, in order.
    let order: Vec<usize> = (0..p.nodes.len())
        .filter(|&i| deps[i] == 0 || deps[i] == var)
        .collect();
    let nc = roots.len();
    /// Per chunk: ranges of each channel, and the first problem (row, col, node, value, result).
    type Part = (Vec<(f64, f64)>, Option<(usize, usize, usize, f32, f64)>);
    let rows_per = (4096 / d).max(1);
    let mut out = vec![0.0f32; n * d * stride];
    let parts: Vec<Part> = out
        .par_chunks_mut(rows_per * d * stride)
        .zip(m.as_slice().par_chunks(rows_per * d))
        .enumerate()
        .map(|(ci, (o, x))| {
            let mut ranges = vec![(f64::INFINITY, f64::NEG_INFINITY); nc];
            let at = |j: usize| (ci * rows_per + j / d, j % d);
            // Node by node over the chunk (vectorised loops), in f64: the reference's values.
            let mut vals: Vec<Vec<f64>> = vec![Vec::new(); p.nodes.len()];
            for &i in &order {
                let mut r = vec![0.0f64; x.len()];
                match p.nodes[i].op {
                    Op::X | Op::Y => r.iter_mut().zip(x).for_each(|(r, &v)| *r = v as f64),
                    Op::Const(c) => r.fill(c),
                    Op::Apply(f, a, b) => {
                        apply_slices(f, &vals[a as usize], &vals[b as usize], &mut r)
                    }
                    Op::Acc => unreachable!("acc is not pure"),
                }
                if let Some(j) = r.iter().position(|v| !v.is_finite()) {
                    let (row, col) = at(j);
                    return (ranges, Some((row, col, i, x[j], r[j])));
                }
                vals[i] = r;
            }
            for (k, &root) in roots.iter().enumerate() {
                let r = &vals[root as usize];
                if let Some(j) = r.iter().position(|&v| !(v as f32).is_finite()) {
                    let (row, col) = at(j);
                    return (ranges, Some((row, col, root as usize, x[j], r[j])));
                }
                for (o, &v) in o.chunks_exact_mut(stride).zip(r) {
                    o[k] = v as f32;
                }
                // Finite values: plain comparisons (no NaN handling) vectorise.
                let (mut lo, mut hi) = ranges[k];
                for &v in r {
                    let v32 = v as f32 as f64;
                    let (a, b) = if v < v32 { (v, v32) } else { (v32, v) };
                    lo = if a < lo { a } else { lo };
                    hi = if b > hi { b } else { hi };
                }
                ranges[k] = (lo, hi);
            }
            (ranges, None)
        })
        .collect();
    let mut ranges = vec![(f64::INFINITY, f64::NEG_INFINITY); nc];
    for (r, problem) in parts {
        if let Some((row, col, node, value, result)) = problem {
            let f = match p.nodes[node].op {
                Op::Apply(f, _, _) => f.name(),
                _ => "this",
            };
            let why = if result.is_finite() {
                format!("{}, beyond the f32 range", num(result))
            } else {
                format!("{result}")
            };
            return Err(KnnError::Expr(ExprError::at(
                e.text(),
                p.nodes[node].at,
                format!("{f} gives {why} for {what} row {row}, column {col} (value {value})"),
            )));
        }
        for (a, b) in ranges.iter_mut().zip(r) {
            a.0 = a.0.min(b.0);
            a.1 = a.1.max(b.1);
        }
    }
    let st = ranges
        .into_iter()
        // One rounding of the f64 value to f32.
        .map(|(lo, hi)| St {
            v: Iv { lo, hi },
            a: ETA,
            r: U32,
        })
        .collect();
    Ok(Channels {
        data: Some(Matrix::from_trusted(out, d * stride)),
        st,
    })
}

/// The analysis of the per-pair instructions over channel states `xs`, `ys`.
struct Analysis<'a> {
    text: &'a str,
    split: &'a Split,
    xs: &'a [St],
    ys: &'a [St],
    /// States of instructions that do not depend on acc (the same at every coordinate).
    fixed: Vec<Option<St>>,
}

impl Analysis<'_> {
    fn operand(&self, s: ASrc, vals: &[St], acc: St) -> std::result::Result<St, String> {
        Ok(match s {
            ASrc::Value(j) => vals[j],
            ASrc::X(k) => self.xs[k],
            ASrc::Y(k) => self.ys[k],
            ASrc::Acc => acc,
            ASrc::Const(c) => {
                let c32 = c as f32;
                if !c32.is_finite() {
                    return Err(format!("the constant {c} is beyond the f32 range"));
                }
                St {
                    v: Iv::of(c, c32 as f64),
                    a: (c - c32 as f64).abs(),
                    r: 0.0,
                }
            }
        })
    }

    /// Evaluates the instructions (those depending on acc, or all when `fixed` is empty) with
    /// `acc`; returns every instruction's state.
    fn step(&self, acc: St, vals: &mut Vec<St>) -> std::result::Result<(), ExprError> {
        vals.clear();
        for (i, &(f, a, b, at, acc_dep)) in self.split.instrs.iter().enumerate() {
            if let Some(Some(s)) = self.fixed.get(i).filter(|_| !acc_dep) {
                vals.push(*s);
                continue;
            }
            let r = self
                .operand(a, vals, acc)
                .and_then(|sa| Ok((sa, self.operand(b, vals, acc)?)))
                .and_then(|(sa, sb)| apply(f, sa, sb, a == b));
            match r {
                Ok(s) => vals.push(s),
                Err(msg) => return Err(ExprError::at(self.text, at, msg)),
            }
        }
        Ok(())
    }
}

/// Prepares an expression metric: engine features (`None` when the engine reads the data as
/// is), the program and its bound; refuses data on which the expression is undefined.
#[allow(clippy::type_complexity)]
pub(crate) fn prepare_expr(
    e: &MetricExpr,
    base: MatrixRef<'_>,
    queries: Option<MatrixRef<'_>>,
) -> Result<(ExprPlan, Option<(Matrix, Option<Matrix>)>)> {
    let text = e.text();
    let p = e.accumulation();
    let sp = split(p);
    let (nx, ny) = (sp.x_roots.len(), sp.y_roots.len());
    if nx.max(ny) > MAX_CHANNELS {
        return Err(KnnError::Expr(ExprError::at(
            text,
            p.whole,
            format!(
                "the accumulation uses {} different functions of {}; at most {MAX_CHANNELS} are supported",
                nx.max(ny),
                if nx >= ny { "x" } else { "y" }
            ),
        )));
    }
    let stride = nx.max(ny).max(1).next_power_of_two();
    let d = base.dim();
    let mut intern = HashMap::new();
    let ids = pure_ids(p, &mut intern);
    let same_functions = nx == ny
        && sp
            .x_roots
            .iter()
            .zip(&sp.y_roots)
            .all(|(&a, &b)| ids[a as usize] == ids[b as usize]);
    let ych = channels(e, &sp.y_roots, 4, base, stride, "base")?;
    let xch = match queries {
        Some(q) => channels(e, &sp.x_roots, 2, q, stride, "queries")?,
        None if same_functions => Channels {
            data: None,
            st: ych.st.clone(),
        },
        None => channels(e, &sp.x_roots, 2, base, stride, "base")?,
    };
    let engine = match (ych.data, xch.data, queries) {
        (None, None, _) => None,
        (yd, xd, q) => {
            let yd = yd.unwrap_or_else(|| Matrix::from_trusted(base.as_slice().to_vec(), d));
            let xd = match (xd, q) {
                (Some(m), _) => Some(m),
                (None, Some(q)) => Some(Matrix::from_trusted(q.as_slice().to_vec(), d)),
                (None, None) if same_functions => None,
                (None, None) => Some(Matrix::from_trusted(base.as_slice().to_vec(), d)),
            };
            Some((yd, xd))
        }
    };
    let program = EngineProgram {
        instrs: sp
            .instrs
            .iter()
            .map(|&(func, a, b, _, _)| {
                let src = |s: ASrc| match s {
                    ASrc::Value(j) => Src::Value(j as u16),
                    ASrc::X(k) => Src::X(k as u8),
                    ASrc::Y(k) => Src::Y(k as u8),
                    ASrc::Acc => Src::Acc,
                    ASrc::Const(c) => Src::Const(c as f32),
                };
                Instr {
                    func,
                    a: src(a),
                    b: src(b),
                }
            })
            .collect(),
        stride,
        x_channels: nx,
        y_channels: ny,
    };
    let nq = queries.map_or(base.rows(), |q| q.rows());
    let mut plan = ExprPlan {
        program,
        dim: d,
        abs: f64::INFINITY,
        rel: 0.0,
        keys: (f64::NEG_INFINITY, f64::INFINITY),
    };
    if nq == 0 {
        // Nothing will be evaluated.
        return Ok((plan, engine));
    }
    let mut an = Analysis {
        text,
        split: &sp,
        xs: &xch.st,
        ys: &ych.st,
        fixed: Vec::new(),
    };
    let zero = St {
        v: Iv::point(0.0),
        a: 0.0,
        r: 0.0,
    };
    // Instructions free of acc: their states hold at every coordinate.
    let mut vals = Vec::new();
    an.step(zero, &mut vals).map_err(KnnError::Expr)?;
    an.fixed = vals.iter().map(|&s| Some(s)).collect();
    let root = sp.instrs.len() - 1;
    let mut acc = zero;
    for _ in 0..d {
        an.step(acc, &mut vals).map_err(KnnError::Expr)?;
        acc = vals[root];
    }
    if let Some(f) = e.final_step() {
        check_final(text, f, acc.v).map_err(KnnError::Expr)?;
    }
    plan.abs = acc.a;
    plan.rel = acc.r;
    plan.keys = (acc.v.lo, acc.v.hi);
    Ok((plan, engine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{generate, Distribution};

    fn plan(text: &str, base: &[f32], queries: &[f32], d: usize) -> Result<ExprPlan> {
        let e = MetricExpr::parse(text).unwrap();
        let b = MatrixRef::new("base", base, d).unwrap();
        let q = MatrixRef::new("queries", queries, d).unwrap();
        prepare_expr(&e, b, Some(q)).map(|r| r.0)
    }

    fn expr_err(r: Result<ExprPlan>) -> ExprError {
        match r {
            Err(KnnError::Expr(e)) => e,
            other => panic!("expected an expression error, got {other:?}"),
        }
    }

    #[test]
    fn domain_problems_are_refused_with_their_column() {
        let pos = [0.0f32, 1.0, 2.0, 3.0];
        let neg = [0.0f32, -1.0, 2.0, 3.0];
        // (expression, column of the error, part of its message) on `pos`.
        for (text, column, part) in [
            ("acc + sqrt(x - y)", 7, "negative"),
            ("acc + abs(x - y) / (x + y)", 18, "divisor"),
            ("acc + log(abs(x - y))", 7, ""),
            (
                "acc + abs(x - y) ; acc * (2 - acc)",
                20,
                "must not decrease",
            ),
            ("acc + x - y ; sqrt(acc)", 15, ""),
        ] {
            let e = expr_err(plan(text, &pos, &pos, 2));
            assert_eq!(e.column(), column, "{text}: {e}");
            assert!(e.message().contains(part), "{text}: {e}");
        }
        let e = expr_err(plan("acc + (sqrt(x) - sqrt(y))^2", &neg, &pos, 2));
        assert_eq!(e.column(), 18);
        assert!(e.message().contains("base row 0, column 1"), "{e}");
        let big = [80.0f32, 90.0];
        let e = expr_err(plan("acc + exp(x) * y", &big, &big, 1));
        assert!(e.message().contains("f32 range"), "{e}");
        let e = expr_err(plan("acc + exp(x - y)", &[0.0, 200.0], &big, 1));
        assert!(e.message().contains("f32 range"), "{e}");
        // Valid on this data: the offset keeps sqrt's argument non-negative.
        plan("acc + sqrt(x - y + 3)", &pos, &pos, 2).unwrap();
        plan(
            "acc + abs(x - y) / (x + y + 1) ; sqrt(acc) * 2 + log(acc + 1)",
            &pos,
            &pos,
            2,
        )
        .unwrap();
    }

    /// Every f32 key (plain evaluation) is within the plan's bound of the f64 key, at the
    /// bound's own level, for assorted expressions and data.
    #[test]
    fn f32_keys_within_the_bound() {
        let exprs = [
            "acc + abs(x - y)",
            "max(acc, abs(x - y))",
            "acc + (sqrt(x) - sqrt(y))^2",
            "acc + (x - y)^2",
            "acc + abs(x - y) / (x + y + 1)",
            "acc + exp(-abs(x - y)) * log(x + 2)",
            "0.5 * acc + (x - y)^3",
            "acc - x * y",
            "min(acc, x) + y / 3",
        ];
        for (lo, hi) in [(0.0f32, 1.0f32), (0.0, 1000.0), (4.0e6, 4.0e6 + 1.0)] {
            for d in [1usize, 7, 64, 300] {
                let u = Distribution::Uniform { lo, hi };
                let b = generate(u, 60, d, 3 + d as u64);
                let q = generate(u, 20, d, 4 + d as u64);
                for text in exprs {
                    let e = MetricExpr::parse(text).unwrap();
                    let bm = MatrixRef::new("b", &b, d).unwrap();
                    let qm = MatrixRef::new("q", &q, d).unwrap();
                    let Ok((plan, engine)) = prepare_expr(&e, bm, Some(qm)) else {
                        // Refused (e.g. exp overflow far from the origin): fine here.
                        continue;
                    };
                    let (eb, eq) = match &engine {
                        Some((b, q)) => (b.view(), q.as_ref().map_or(b.view(), |q| q.view())),
                        None => (bm, qm),
                    };
                    for i in 0..qm.rows() {
                        for j in 0..bm.rows() {
                            let exact = e.key(qm.row(i), bm.row(j));
                            let got = plan.program().key_f32(eq.row(i), eb.row(j));
                            let bound = plan.error_bound(got.max(exact as f32));
                            assert!(
                                (got as f64 - exact).abs() <= bound,
                                "{text} d={d} [{lo},{hi}]: f32 {got} f64 {exact} bound {bound}"
                            );
                            assert!(
                                plan.floor(got) as f64 <= exact,
                                "{text}: floor above the key"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn channels_are_shared_in_a_self_join_when_they_match() {
        let data = [0.0f32, 1.0, 4.0, 9.0];
        let m = MatrixRef::new("p", &data, 2).unwrap();
        let h = MetricExpr::parse("acc + (sqrt(x) - sqrt(y))^2").unwrap();
        let (plan, engine) = prepare_expr(&h, m, None).unwrap();
        let (b, q) = engine.expect("square roots are features");
        assert!(q.is_none());
        assert_eq!(b.view().as_slice(), &[0.0, 1.0, 2.0, 3.0]);
        assert_eq!(plan.program().stride, 1);
        let l1 = MetricExpr::parse("acc + abs(x - y)").unwrap();
        assert!(prepare_expr(&l1, m, None).unwrap().1.is_none());
        let two = MetricExpr::parse("acc + abs(x - y) * sqrt(x)").unwrap();
        let (plan, engine) = prepare_expr(&two, m, None).unwrap();
        let (b, q) = engine.unwrap();
        assert_eq!(plan.program().stride, 2);
        assert_eq!(b.dim(), 4);
        assert_eq!(q.unwrap().view().row(1), &[4.0, 2.0, 9.0, 3.0]);
    }

    #[test]
    fn bounds_are_relative_where_nothing_cancels() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let d = 128;
        let b = generate(u, 50, d, 1);
        for text in [
            "acc + abs(x - y)",
            "acc + abs(x - y) / (x + y + 1e-6)",
            "max(acc, abs(x - y))",
        ] {
            let p = plan(text, &b, &b, d).unwrap();
            // Keys near 1 get a bound near (d + 3)·2⁻²⁴: relative, as for the built-in L1.
            assert!(p.error_bound(1.0) < 1e-5, "{text}: {}", p.error_bound(1.0));
            assert!(
                p.error_bound(1e-3) < 1e-8,
                "{text}: {}",
                p.error_bound(1e-3)
            );
            assert!(p.floor(1.0) < 1.0 && p.floor(1.0) > 0.99999);
        }
        // Differences of square roots cancel: an absolute part remains.
        let h = plan("acc + (sqrt(x) - sqrt(y))^2", &b, &b, d).unwrap();
        assert!(h.error_bound(0.0) > 0.0 && h.error_bound(0.0) < 1e-4);
    }
}
