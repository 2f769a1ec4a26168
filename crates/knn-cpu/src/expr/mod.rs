//! Expression metrics ([`knn_core::Metric::Expr`]) on the CPU: the plan's f32 program run by a
//! bytecode loop over blocks of lanes.
//!
//! # Layout
//! Queries sit in lanes: a group of [`LANES`] queries is packed coordinate-major
//! (`[coordinate][channel][lane]`); a base point's channels are broadcast to every lane. The
//! program runs on blocks of [`CB`] coordinates × [`NR`] base points × [`LANES`] queries:
//! - instructions that do not depend on `acc` (here `abs(x − y)`, `(√x − √y)²`, …) run once per
//!   block each, so one dispatch feeds `CB · NR · LANES` lane operations, in 16-lane chunks that
//!   the compiler keeps in vector registers (AVX-512 or AVX2, picked at run time);
//! - the rest runs per coordinate, in order; the usual last step `acc + t` or `max(acc, t)` is
//!   one fused loop that keeps `acc` in registers across the block's coordinates.
//!
//! Registers are reused after their last use (a few KiB each, in L1).
//!
//! # Exactness
//! Every operation is the IEEE f32 one (`exp`, `log` through f64, rounded once), applied to each
//! pair in coordinate order from `acc = 0`, the same operations as
//! [`knn_core::EngineProgram::key_f32`]: the model of [`knn_core::ExprPlan`], whose
//! [`floor`](knn_core::ExprPlan::floor) gives each row's floor.

use crate::engine::QUERY_TILE;
use crate::isa::Isa;
use knn_core::expr::{Func, Src};
use knn_core::{CandidateRequest, Candidates, ExprPlan, TopK};
use std::ops::Range;

/// Queries per group (lanes).
pub(crate) const LANES: usize = 64;
/// Base points per pass of the program.
const NR: usize = 4;
/// Coordinates per block of the instructions free of `acc`.
const CB: usize = 8;
/// Lanes per chunk: one AVX-512 register (two AVX2 ones).
const CHUNK: usize = 16;
/// Values of one register: `[coordinate][point][lane]`.
const REG: usize = CB * NR * LANES;
/// Base points per block (their channels stay in L2 while every group of a unit runs).
const BASE_BLOCK: usize = 256;

type Chunk = [f32; CHUNK];

/// An operand of a compiled instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Arg {
    /// A register (register 0 holds `acc`).
    Reg(u16),
    /// Channel `k` of the group's queries.
    X(u8),
    /// Channel `k` of the base point (broadcast).
    Y(u8),
    /// Constant `i` of [`Compiled::consts`] (broadcast).
    K(u16),
}

/// What an instruction computes: a plan function, or a fused pair of them (the same
/// roundings in the same order as the pair).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    F(Func),
    /// `|a − b|`.
    AbsDiff,
    /// `t·t` with `t = a − b`.
    SqDiff,
}

impl Kind {
    /// Kinds that a fused `acc ⊕ t` computes in its loop.
    fn folds(self) -> bool {
        matches!(
            self,
            Kind::AbsDiff | Kind::SqDiff | Kind::F(Func::Abs | Func::Sub | Func::Add | Func::Mul)
        )
    }
}

/// One instruction with registers allocated.
#[derive(Clone, Copy, Debug)]
struct Op {
    kind: Kind,
    a: Arg,
    b: Arg,
    dst: u16,
}

/// The operand of a fused `acc ⊕ t`.
#[derive(Clone, Copy, Debug)]
enum Fold {
    /// `t` as stored.
    Value(Arg),
    /// `t = kind(a, b)`, computed in the loop.
    Op(Kind, Arg, Arg),
}

/// The plan's program with registers allocated: instructions free of `acc` first (they run
/// per block), then those depending on it (per coordinate); each value takes the lowest
/// register free after its operands' last uses; the last instruction writes `acc` (register
/// 0). `fused`: the only `acc` instruction is `acc ⊕ t` (`⊕` = `+` or `max`), run as one loop;
/// when `t` is the result of the last block instruction and used nowhere else, that
/// instruction runs inside the loop too (`t` then never reaches memory).
#[derive(Clone, Debug)]
pub(crate) struct Compiled {
    pre: Vec<Op>,
    post: Vec<Op>,
    fused: Option<(Func, Fold)>,
    consts: Vec<f32>,
    regs: usize,
    stride: usize,
    dim: usize,
}

impl Compiled {
    pub(crate) fn new(plan: &ExprPlan) -> Self {
        let prog = plan.program();
        let n = prog.instrs.len();
        let mut on_acc = vec![false; n];
        for (i, ins) in prog.instrs.iter().enumerate() {
            on_acc[i] = [ins.a, ins.b].iter().any(|s| match *s {
                Src::Acc => true,
                Src::Value(j) => on_acc[j as usize],
                _ => false,
            });
        }
        // Free of acc first: they never read values that depend on acc.
        let order: Vec<usize> = (0..n)
            .filter(|&i| !on_acc[i])
            .chain((0..n).filter(|&i| on_acc[i]))
            .collect();
        let mut last_use = vec![0usize; n];
        for (pos, &i) in order.iter().enumerate() {
            let ins = prog.instrs[i];
            for s in [ins.a, ins.b] {
                if let Src::Value(j) = s {
                    last_use[j as usize] = pos;
                }
            }
        }
        let mut reg_of = vec![0u16; n];
        let mut free: Vec<u16> = Vec::new();
        let mut regs = 1usize;
        let (mut pre, mut post) = (Vec::new(), Vec::new());
        let mut consts: Vec<f32> = Vec::new();
        for (pos, &i) in order.iter().enumerate() {
            let ins = prog.instrs[i];
            let mut arg = |s: Src| match s {
                Src::Value(j) => Arg::Reg(reg_of[j as usize]),
                Src::X(k) => Arg::X(k),
                Src::Y(k) => Arg::Y(k),
                Src::Acc => Arg::Reg(0),
                Src::Const(c) => {
                    consts.push(c);
                    Arg::K((consts.len() - 1) as u16)
                }
            };
            let (a, b) = (arg(ins.a), arg(ins.b));
            // Operands used for the last time free their registers for this result (each
            // coordinate of a register is its own slot, so a per-coordinate result may take a
            // block value's register once that value's last reader ran).
            for s in [ins.a, ins.b] {
                if let Src::Value(j) = s {
                    let r = reg_of[j as usize];
                    if last_use[j as usize] == pos && !free.contains(&r) {
                        free.push(r);
                    }
                }
            }
            let dst = if i + 1 == n {
                0
            } else {
                free.sort_unstable_by(|x, y| y.cmp(x));
                free.pop().unwrap_or_else(|| {
                    regs += 1;
                    (regs - 1) as u16
                })
            };
            reg_of[i] = dst;
            let op = Op {
                kind: Kind::F(ins.func),
                a,
                b,
                dst,
            };
            if on_acc[i] {
                post.push(op);
            } else {
                pre.push(op);
            }
        }
        let mut pre = fuse_differences(pre);
        let fused = match post.as_slice() {
            [op] if matches!(op.kind, Kind::F(Func::Add | Func::Max)) => match (op.a, op.b) {
                (Arg::Reg(0), Arg::Reg(0)) => None,
                (Arg::Reg(0), t) | (t, Arg::Reg(0)) => {
                    let Kind::F(f) = op.kind else { unreachable!() };
                    let last = pre.last().copied();
                    match (t, last) {
                        // The last block instruction's value has no other reader; common
                        // kinds run inside the loop (the others would multiply the code).
                        (Arg::Reg(r), Some(l)) if l.dst == r && l.kind.folds() => {
                            pre.pop();
                            Some((f, Fold::Op(l.kind, l.a, l.b)))
                        }
                        _ => Some((f, Fold::Value(t))),
                    }
                }
                _ => None,
            },
            _ => None,
        };
        Compiled {
            pre,
            post,
            fused,
            consts,
            regs,
            stride: prog.stride,
            dim: plan.dim(),
        }
    }
}

/// Fuses `t = a − b` with a following `|t|` or `t·t` that is its only reader.
fn fuse_differences(ops: Vec<Op>) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    for op in ops {
        if let Some(prev) = out.last().copied() {
            let t = Arg::Reg(prev.dst);
            let only = |o: &Op| {
                // `prev`'s value is read by `o` alone: `o` overwrites its register, or no later
                // block instruction reads it before it is overwritten.
                o.dst == prev.dst
            };
            if prev.kind == Kind::F(Func::Sub) && only(&op) {
                let fused = match op.kind {
                    Kind::F(Func::Abs) if op.a == t => Some(Kind::AbsDiff),
                    Kind::F(Func::Mul) if op.a == t && op.b == t => Some(Kind::SqDiff),
                    _ => None,
                };
                if let Some(kind) = fused {
                    out.pop();
                    out.push(Op {
                        kind,
                        a: prev.a,
                        b: prev.b,
                        dst: op.dst,
                    });
                    continue;
                }
            }
        }
        out.push(op);
    }
    out
}

/// A block operand: the chunk of (coordinate `c`, point `p`, chunk `v`).
trait Operand: Copy {
    /// # Safety
    /// The operand's pointers cover every `c < cb`, `p < NR`, `v < LANES / CHUNK` of the call.
    unsafe fn chunk(self, c: usize, p: usize, v: usize) -> Chunk;
}

/// Lanes in memory: registers (`pstride = LANES`) or the packed queries (`pstride = 0`).
#[derive(Clone, Copy)]
struct InLanes {
    ptr: *const f32,
    cstride: usize,
    pstride: usize,
}

impl Operand for InLanes {
    #[inline(always)]
    unsafe fn chunk(self, c: usize, p: usize, v: usize) -> Chunk {
        // SAFETY: forwarded from the caller.
        unsafe {
            std::ptr::read_unaligned(
                self.ptr
                    .add(c * self.cstride + p * self.pstride + v * CHUNK)
                    as *const Chunk,
            )
        }
    }
}

/// A base point's channel, broadcast: `ptr[rows[p] + c · cstride]` (a constant: one value,
/// strides 0).
#[derive(Clone, Copy)]
struct InRows {
    ptr: *const f32,
    rows: [usize; NR],
    cstride: usize,
}

impl Operand for InRows {
    #[inline(always)]
    unsafe fn chunk(self, c: usize, p: usize, _: usize) -> Chunk {
        // SAFETY: forwarded from the caller.
        [unsafe { *self.ptr.add(self.rows[p] + c * self.cstride) }; CHUNK]
    }
}

/// An operand of either kind (constants are rows of one value with stride 0).
#[derive(Clone, Copy)]
enum Any {
    L(InLanes),
    R(InRows),
}

/// `dst[c][p] = f(a[c][p], b[c][p])` for `c < cb` (`dst` rows `dcs` apart); each chunk is read
/// before it is written, so `dst` may be an operand.
///
/// # Safety
/// `dst` covers `cb` rows of `NR · LANES` values; the operands cover the block.
#[inline(always)]
unsafe fn body<A: Operand, B: Operand>(
    dst: *mut f32,
    dcs: usize,
    a: A,
    b: B,
    cb: usize,
    f: impl Fn(f32, f32) -> f32,
) {
    for c in 0..cb {
        for p in 0..NR {
            for v in 0..LANES / CHUNK {
                // SAFETY: forwarded from the caller.
                unsafe {
                    let (x, y) = (a.chunk(c, p, v), b.chunk(c, p, v));
                    let mut r = [0.0f32; CHUNK];
                    for l in 0..CHUNK {
                        r[l] = f(x[l], y[l]);
                    }
                    let at = dst.add(c * dcs + p * LANES + v * CHUNK);
                    std::ptr::write_unaligned(at as *mut Chunk, r);
                }
            }
        }
    }
}

/// `min(a, b)` without `f32::min`'s NaN handling (one instruction): the plan refuses data on
/// which a value could be NaN, and on values the two agree (up to the sign of a zero).
#[inline(always)]
fn min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// `max(a, b)`, as [`min`].
#[inline(always)]
fn max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// [`body`] of `kind` (unary functions ignore `b`).
///
/// # Safety
/// As [`body`].
#[inline(always)]
unsafe fn kind_body<A: Operand, B: Operand>(
    kind: Kind,
    dst: *mut f32,
    dcs: usize,
    a: A,
    b: B,
    cb: usize,
) {
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        match kind {
            Kind::F(Func::Neg) => body(dst, dcs, a, a, cb, |x, _| -x),
            Kind::F(Func::Abs) => body(dst, dcs, a, a, cb, |x, _| x.abs()),
            Kind::F(Func::Sqrt) => body(dst, dcs, a, a, cb, |x, _| x.sqrt()),
            Kind::F(Func::Exp) => body(dst, dcs, a, a, cb, |x, _| Func::Exp.f32(x, x)),
            Kind::F(Func::Log) => body(dst, dcs, a, a, cb, |x, _| Func::Log.f32(x, x)),
            Kind::F(Func::Add) => body(dst, dcs, a, b, cb, |x, y| x + y),
            Kind::F(Func::Sub) => body(dst, dcs, a, b, cb, |x, y| x - y),
            Kind::F(Func::Mul) => body(dst, dcs, a, b, cb, |x, y| x * y),
            Kind::F(Func::Div) => body(dst, dcs, a, b, cb, |x, y| x / y),
            Kind::F(Func::Min) => body(dst, dcs, a, b, cb, min),
            Kind::F(Func::Max) => body(dst, dcs, a, b, cb, max),
            Kind::AbsDiff => body(dst, dcs, a, b, cb, |x, y| (x - y).abs()),
            Kind::SqDiff => body(dst, dcs, a, b, cb, |x, y| (x - y) * (x - y)),
        }
    }
}

/// One instruction over a block: dispatches on the operand kinds once, so the loops inside
/// are branch-free.
///
/// # Safety
/// As [`body`].
#[inline(always)]
unsafe fn exec(kind: Kind, dst: *mut f32, dcs: usize, a: Any, b: Any, cb: usize) {
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        match (a, b) {
            (Any::L(a), Any::L(b)) => kind_body(kind, dst, dcs, a, b, cb),
            (Any::L(a), Any::R(b)) => kind_body(kind, dst, dcs, a, b, cb),
            (Any::R(a), Any::L(b)) => kind_body(kind, dst, dcs, a, b, cb),
            (Any::R(a), Any::R(b)) => kind_body(kind, dst, dcs, a, b, cb),
        }
    }
}

/// `acc = acc ⊕ g(a[c], b[c])` for `c < cb` in order (`⊕` is `f`: `+` or `max`), the
/// `NR × LANES` accumulators held in vector registers across the block (query chunks loaded
/// once per coordinate for every point, each point's broadcast once for every chunk) and `g`'s
/// value never stored.
///
/// # Safety
/// `acc` covers `NR · LANES` values; the operands cover the block.
#[inline(always)]
unsafe fn fold_acc<A: Operand, B: Operand>(
    acc: *mut f32,
    a: A,
    b: B,
    cb: usize,
    g: impl Fn(f32, f32) -> f32,
    f: impl Fn(f32, f32) -> f32,
) {
    const V: usize = LANES / CHUNK;
    // SAFETY: forwarded from the caller.
    unsafe {
        // Plain loops, not `array::from_fn`: it copies large arrays through memcpy.
        let mut s = [[[0.0f32; CHUNK]; V]; NR];
        for (p, sp) in s.iter_mut().enumerate() {
            for (v, sv) in sp.iter_mut().enumerate() {
                *sv = std::ptr::read_unaligned(acc.add(p * LANES + v * CHUNK) as *const Chunk);
            }
        }
        for c in 0..cb {
            for (p, sp) in s.iter_mut().enumerate() {
                for (v, sv) in sp.iter_mut().enumerate() {
                    let (x, y) = (a.chunk(c, p, v), b.chunk(c, p, v));
                    for l in 0..CHUNK {
                        sv[l] = f(sv[l], g(x[l], y[l]));
                    }
                }
            }
        }
        for (p, sp) in s.iter().enumerate() {
            for (v, sv) in sp.iter().enumerate() {
                std::ptr::write_unaligned(acc.add(p * LANES + v * CHUNK) as *mut Chunk, *sv);
            }
        }
    }
}

/// [`fold_acc`] with `⊕ = f` and `g = kind` (`None`: `g(a, b) = a`).
///
/// # Safety
/// As [`fold_acc`].
#[inline(always)]
unsafe fn fold_kind<A: Operand, B: Operand>(
    f: Func,
    kind: Option<Kind>,
    acc: *mut f32,
    a: A,
    b: B,
    cb: usize,
) {
    macro_rules! by_kind {
        ($f:expr) => {
            match kind {
                Some(Kind::F(Func::Abs)) => fold_acc(acc, a, b, cb, |x, _| x.abs(), $f),
                Some(Kind::F(Func::Add)) => fold_acc(acc, a, b, cb, |x, y| x + y, $f),
                Some(Kind::F(Func::Sub)) => fold_acc(acc, a, b, cb, |x, y| x - y, $f),
                Some(Kind::F(Func::Mul)) => fold_acc(acc, a, b, cb, |x, y| x * y, $f),
                Some(Kind::AbsDiff) => fold_acc(acc, a, b, cb, |x, y| (x - y).abs(), $f),
                Some(Kind::SqDiff) => fold_acc(acc, a, b, cb, |x, y| (x - y) * (x - y), $f),
                // `None`, and kinds `Compiled` never fuses.
                _ => fold_acc(acc, a, b, cb, |x, _| x, $f),
            }
        };
    }
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        if f == Func::Max {
            by_kind!(max)
        } else {
            by_kind!(|s, t| s + t)
        }
    }
}

/// [`fold_kind`] for operands of any kinds.
///
/// # Safety
/// As [`fold_acc`].
#[inline(always)]
unsafe fn fold_any(f: Func, kind: Option<Kind>, acc: *mut f32, a: Any, b: Any, cb: usize) {
    // SAFETY (every arm): forwarded from the caller.
    unsafe {
        match (a, b) {
            (Any::L(a), Any::L(b)) => fold_kind(f, kind, acc, a, b, cb),
            (Any::L(a), Any::R(b)) => fold_kind(f, kind, acc, a, b, cb),
            (Any::R(a), Any::L(b)) => fold_kind(f, kind, acc, a, b, cb),
            (Any::R(a), Any::R(b)) => fold_kind(f, kind, acc, a, b, cb),
        }
    }
}

/// One query group: packed channels, thresholds (`-∞` in unused lanes), excluded ids.
struct Group {
    packed: Vec<f32>,
    thr: [f32; LANES],
    skip: [u32; LANES],
    first: usize,
    len: usize,
}

/// Keys of base points `b0..b0 + np` (`np ≤ NR`) against a group, folded into its top-k lists.
/// `regs` holds `Compiled::regs · REG` values (register `r` at `r · REG`, `[c][p][lane]`;
/// register 0, `acc`, uses its first `NR · LANES`).
#[inline(always)]
fn pass(
    c: &Compiled,
    g: &mut Group,
    base: &[f32],
    b0: usize,
    np: usize,
    regs: &mut [f32],
    tops: &mut [TopK],
) {
    let row_len = c.dim * c.stride;
    assert!(regs.len() >= c.regs * REG && g.packed.len() >= row_len * LANES);
    assert!(np >= 1 && base.len() >= (b0 + np) * row_len);
    regs[..NR * LANES].fill(0.0);
    // Rows past the end repeat the last point; their keys are never pushed.
    let rows: [usize; NR] = std::array::from_fn(|p| (b0 + p.min(np - 1)) * row_len);
    let rp = regs.as_mut_ptr();
    let (xp, bp) = (g.packed.as_ptr(), base.as_ptr());
    let mut j0 = 0;
    while j0 < c.dim {
        // Without block values, one block spans the row (fewer dispatches).
        let cb = if c.pre.is_empty() {
            c.dim
        } else {
            CB.min(c.dim - j0)
        };
        // Operands of the block at coordinate offset `c0` within it.
        // SAFETY (pointer offsets): registers are below `c.regs`, channels below `stride`,
        // coordinates below `dim` (asserted sizes above).
        let opnd = |arg: Arg, c0: usize| match arg {
            Arg::Reg(0) => Any::L(InLanes {
                ptr: rp,
                cstride: 0,
                pstride: LANES,
            }),
            Arg::Reg(r) => Any::L(InLanes {
                ptr: unsafe { rp.add(r as usize * REG + c0 * NR * LANES) },
                cstride: NR * LANES,
                pstride: LANES,
            }),
            Arg::X(k) => Any::L(InLanes {
                ptr: unsafe { xp.add(((j0 + c0) * c.stride + k as usize) * LANES) },
                cstride: c.stride * LANES,
                pstride: 0,
            }),
            Arg::Y(k) => Any::R(InRows {
                ptr: bp,
                rows: rows.map(|r| r + (j0 + c0) * c.stride + k as usize),
                cstride: c.stride,
            }),
            Arg::K(i) => Any::R(InRows {
                ptr: c.consts[i as usize..].as_ptr(),
                rows: [0; NR],
                cstride: 0,
            }),
        };
        let dst = |r: u16, c0: usize| {
            if r == 0 {
                (rp, 0)
            } else {
                // SAFETY: as above.
                (
                    unsafe { rp.add(r as usize * REG + c0 * NR * LANES) },
                    NR * LANES,
                )
            }
        };
        for op in &c.pre {
            let (d, dcs) = dst(op.dst, 0);
            // SAFETY: every operand and the destination cover the block.
            unsafe { exec(op.kind, d, dcs, opnd(op.a, 0), opnd(op.b, 0), cb) };
        }
        match c.fused {
            // SAFETY: `acc` and the operand cover the block.
            Some((f, Fold::Value(t))) => unsafe {
                fold_any(f, None, rp, opnd(t, 0), opnd(t, 0), cb)
            },
            // SAFETY: as above.
            Some((f, Fold::Op(kind, a, b))) => unsafe {
                fold_any(f, Some(kind), rp, opnd(a, 0), opnd(b, 0), cb)
            },
            None => {
                for c0 in 0..cb {
                    for op in &c.post {
                        let (d, dcs) = dst(op.dst, c0);
                        // SAFETY: one coordinate of the block, inside every operand.
                        unsafe { exec(op.kind, d, dcs, opnd(op.a, c0), opnd(op.b, c0), 1) };
                    }
                }
            }
        }
        j0 += cb;
    }
    for p in 0..np {
        let keys = &regs[p * LANES..(p + 1) * LANES];
        let id = (b0 + p) as u32;
        let mut mask = 0u64;
        for (l, (k, t)) in keys.iter().zip(&g.thr).enumerate() {
            mask |= u64::from(k <= t) << l;
        }
        while mask != 0 {
            let l = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            if g.skip[l] != id {
                let t = &mut tops[l];
                t.push(keys[l], id);
                g.thr[l] = t.threshold();
            }
        }
    }
}

/// Base points `br` against every group, in blocks.
#[inline(always)]
fn fold_groups(
    c: &Compiled,
    groups: &mut [Group],
    base: &[f32],
    br: Range<usize>,
    tops: &mut [TopK],
) {
    let mut regs = vec![0.0f32; c.regs * REG];
    let mut b0 = br.start;
    while b0 < br.end {
        let b1 = (b0 + BASE_BLOCK).min(br.end);
        for g in groups.iter_mut() {
            let tops = &mut tops[g.first..g.first + g.len];
            let mut b = b0;
            while b < b1 {
                let np = (b1 - b).min(NR);
                pass(c, g, base, b, np, &mut regs, tops);
                b += np;
            }
        }
        b0 = b1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fold_avx512(
    c: &Compiled,
    groups: &mut [Group],
    base: &[f32],
    br: Range<usize>,
    tops: &mut [TopK],
) {
    fold_groups(c, groups, base, br, tops)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fold_avx2(
    c: &Compiled,
    groups: &mut [Group],
    base: &[f32],
    br: Range<usize>,
    tops: &mut [TopK],
) {
    fold_groups(c, groups, base, br, tops)
}

/// The unit `qr × br` with `isa` (which the CPU must have): packs the groups, then runs the
/// program.
fn fold_unit(
    req: &CandidateRequest<'_>,
    plan: &ExprPlan,
    c: &Compiled,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
    isa: Isa,
) {
    if isa == Isa::Scalar {
        let prog = plan.program();
        for (t, q) in tops.iter_mut().zip(qr) {
            let skip = req.exclude.map(|e| e[q] as usize);
            for b in br.clone().filter(|&b| Some(b) != skip) {
                t.push(prog.key_f32(req.queries.row(q), req.base.row(b)), b as u32);
            }
        }
        return;
    }
    let rs = c.dim * c.stride;
    let mut groups: Vec<Group> = qr
        .clone()
        .step_by(LANES)
        .map(|first| {
            let len = (qr.end - first).min(LANES);
            let mut packed = vec![0.0f32; rs * LANES];
            let mut thr = [f32::NEG_INFINITY; LANES];
            let mut skip = [u32::MAX; LANES];
            for l in 0..len {
                for (v, &x) in req.queries.row(first + l).iter().enumerate() {
                    packed[v * LANES + l] = x;
                }
                thr[l] = tops[first - qr.start + l].threshold();
                skip[l] = req.exclude.map_or(u32::MAX, |e| e[first + l]);
            }
            Group {
                packed,
                thr,
                skip,
                first: first - qr.start,
                len,
            }
        })
        .collect();
    let base = req.base.as_slice();
    match isa {
        // SAFETY: the caller checked that the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { fold_avx512(c, &mut groups, base, br, tops) },
        // SAFETY: the caller checked that the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { fold_avx2(c, &mut groups, base, br, tops) },
        _ => unreachable!("the plain path returned above"),
    }
}

/// Candidates of an expression request (see [`knn_core::Engine::candidates_expr`]).
pub(crate) fn candidates(req: &CandidateRequest<'_>, plan: &ExprPlan) -> Candidates {
    candidates_with(req, plan, Isa::best())
}

fn candidates_with(req: &CandidateRequest<'_>, plan: &ExprPlan, isa: Isa) -> Candidates {
    let c = Compiled::new(plan);
    let (nq, nb) = (req.queries.rows(), req.base.rows());
    let width = req.width;
    let merged =
        crate::units::fold_units((nq, nb), width, (QUERY_TILE, BASE_BLOCK), |qr, br, tops| {
            fold_unit(req, plan, &c, qr, br, tops, isa)
        });
    let available = req.available();
    crate::units::into_candidates(merged, width, |_, keys, floor| {
        if width < available {
            *floor = plan.floor(keys[width - 1]);
        }
    })
}

#[cfg(test)]
mod tests;
