//! Direct kernels for L1 and L∞: per-coordinate work, no GEMM form.
//!
//! # Layout (a GEMM-style register-blocked micro-kernel)
//! Queries sit in SIMD lanes: a work unit packs its queries once, in groups of `QV·LANES`
//! (64 with AVX-512: 4 zmm; 16 with AVX2: 2 ymm; 2 scalar), coordinate-major (`[j][lane]`).
//! Base points are read straight from their rows and one coordinate is broadcast at a time.
//! The micro-kernel keeps `NR` base points × `QV` query vectors of accumulators in registers
//! (6 × 4 zmm with AVX-512), so each broadcast feeds `QV` operations and each query load `NR`.
//! Its keys are compared with the group's thresholds a vector at a time; only keys under a
//! threshold reach the top-k lists. A unit walks the base in blocks of [`BASE_BLOCK`] points
//! (in L2) and runs every query group over each block. SIMD is chosen at run time (AVX-512,
//! AVX2 + FMA, scalar).
//!
//! # Operations ([`DirectOp`])
//! Measured on Zen 4: float `min`, `max`, `add` and `sub` all issue to the same two adder
//! pipes, while integer `min`/`max`, logic and FMAs can use the other two; so the kernels
//! accumulate through FMAs (`x·1 + acc`, rounded exactly like an addition) and take `min`/`max`
//! on the bits as integers where the values are non-negative.
//! - L∞: `acc = max(acc, |q − b|)` (max on the bits: `|x|` is never negative). `max` is exact
//!   and each `|q − b|` is rounded once, so `|key − exact| ≤ u·key`, within
//!   [`Kernel::error_bound`](knn_core::Kernel::error_bound)`= γ_{d+8}·key`.
//! - L1 (`AbsDiff`): `acc += |q − b|`: 3 operations; `|key − exact| ≤ γ_{d+8}·key`, the same
//!   bound. Used on retries (`precise`) and for data far from the origin.
//! - L1 (`Min`, `MinNonNegative`): `|q − b| = q + b − 2·min(q, b)`, so
//!   `Σ|qᵢ − bᵢ| = Σq + Σb − 2·Σmin(qᵢ, bᵢ)`: 2 operations per pair (min, add). Rounding now
//!   scales with the sizes of the values, not with the distance; [`DirectPlan::bound`] derives
//!   the proven bound the floors use.

mod pair;
mod simd;

pub(crate) use pair::{fold_pair, PackedGroups};
#[cfg(target_arch = "x86_64")]
use simd::x86;
use simd::{Scalar, Simd};

use crate::engine::F32_UNIT;
use crate::isa::Isa;
use knn_core::{CandidateRequest, Kernel, TopK};
use rayon::prelude::*;
use std::ops::Range;

/// Base points per block: `BASE_BLOCK · d` f32 (256 KiB at d = 128) stay in L2 while every
/// query group of the unit runs over them.
const BASE_BLOCK: usize = 512;
/// Base rows sampled to decide whether the data sits near the origin.
const SAMPLE_ROWS: usize = 1024;
/// The `Min` form is used when `Σ|mean|` is at most this many times the mean absolute
/// deviation summed over coordinates: its bound (∝ `Σ|q| + Σ|b|`) then stays a small
/// fraction of typical distances (∝ the deviation).
const MIN_FORM_MAX_OFFSET: f64 = 8.0;

/// What the micro-kernel computes per coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectOp {
    /// L1: `acc += |q − b|`.
    AbsDiff,
    /// L1: `acc += min(q, b)`, key `Σq + Σb − 2·acc`.
    Min,
    /// `Min` on data without negative values (`−0.0` allowed): `min` on the bits as signed
    /// integers, which order such floats as their values do and run on more SIMD pipes.
    MinNonNegative,
    /// L∞: `acc = max(acc, |q − b|)`.
    MaxAbsDiff,
    /// Squared L2 in the GEMM form at small `d`: `acc += q·b` (FMAs), key `‖b‖² − 2·acc`
    /// (`base_sums` hold `‖b‖²`; the query's `‖q‖²` is added later, as for the GEMM path's
    /// keys, and the GEMM plan's bound holds: it covers any summation order). The products
    /// never leave the registers, where a GEMM of depth `d` writes and rereads every key.
    Dot,
}

const OP_ABS_DIFF: u8 = 0;
const OP_MIN: u8 = 1;
const OP_MAX_ABS_DIFF: u8 = 2;
const OP_MIN_NON_NEGATIVE: u8 = 3;
const OP_DOT: u8 = 4;

/// Per-request choices of the direct path and what its floors need.
pub(crate) struct DirectPlan {
    pub op: DirectOp,
    /// `Min` only: `Σᵢ bᵢ` per base point (f64 sum rounded to f32).
    base_sums: Vec<f32>,
    /// `Min` only: `max_b Σᵢ |bᵢ|` (f64).
    max_base_abs: f64,
}

impl DirectPlan {
    /// Picks the operation: `Min` for L1 on data near the origin (relative to its spread) unless
    /// the request asks for full precision; `AbsDiff` for other L1; `MaxAbsDiff` for L∞.
    pub(crate) fn new(req: &CandidateRequest<'_>) -> Self {
        let op = match req.kernel {
            Kernel::Linf => DirectOp::MaxAbsDiff,
            Kernel::L1 if !req.precise => match min_form_fits(req) {
                Some(true) => DirectOp::MinNonNegative,
                Some(false) => DirectOp::Min,
                None => DirectOp::AbsDiff,
            },
            _ => DirectOp::AbsDiff,
        };
        let (mut base_sums, mut max_base_abs) = (Vec::new(), 0.0);
        if matches!(op, DirectOp::Min | DirectOp::MinNonNegative) {
            let d = req.base.dim();
            base_sums = vec![0.0f32; req.base.rows()];
            max_base_abs = base_sums
                .par_chunks_mut(1024)
                .zip(req.base.as_slice().par_chunks(1024 * d))
                .map(|(sums, rows)| {
                    let mut max_abs = 0.0f64;
                    for (s, r) in sums.iter_mut().zip(rows.chunks_exact(d)) {
                        let (sum, abs) = sums_f64(r);
                        *s = sum as f32;
                        max_abs = max_abs.max(abs);
                    }
                    max_abs
                })
                .reduce(|| 0.0, f64::max);
        }
        DirectPlan {
            op,
            base_sums,
            max_base_abs,
        }
    }

    /// The `Dot` form over a base whose squared norms are `base_sq` (the GEMM plan's, which
    /// also bounds its keys).
    pub(crate) fn dot(base_sq: Vec<f32>) -> Self {
        DirectPlan {
            op: DirectOp::Dot,
            base_sums: base_sq,
            max_base_abs: 0.0,
        }
    }

    /// `|computed key − exact key| ≤ bound` for query `q` and every base point whose computed
    /// key is at most `worst_key`.
    ///
    /// `AbsDiff`, `MaxAbsDiff`: [`Kernel::error_bound`] `= γ_{d+8}·worst_key`.
    ///
    /// `Min`, with `A = Σ|qᵢ| + max_b Σ|bᵢ|`, `u = 2⁻²⁴`, `γₙ = n·u/(1 − n·u)`: the key is
    /// `fl(fl(S_q + S_b) − 2·Ŝ)` where `Ŝ` is the f32 sum of the exact `mᵢ = min(qᵢ, bᵢ)` and
    /// `S_q`, `S_b` are f64 sums rounded to f32. Then
    /// 1. `|Ŝ − Σmᵢ| ≤ γ_{d−1} Σ|mᵢ| ≤ γ_{d−1}·A` (any summation order; `|mᵢ| ≤ |qᵢ| + |bᵢ|`);
    /// 2. `|S_q − Σqᵢ| ≤ (u + d·2⁻⁵²)(1 + u)·Σ|qᵢ|`, the same for `S_b`;
    /// 3. the addition adds at most `u(1 + u)²·A`, the subtraction `u·(|t| + 2|Ŝ|) ≤ 3u(1 + γ_d)·A`;
    ///
    /// in all at most `(2γ_{d−1} + 6u + d·2⁻⁵¹ + O(u²))·A ≤ 2γ_{d+8}·A` for `d < 2²⁷`
    /// (`2γ_{d+8} − 2γ_{d−1} ≥ 18u`). `2·Ŝ` and `min` are exact; subnormal results of additions
    /// are exact, and the f64→f32 roundings of `S_q`, `S_b` lose at most `2⁻¹⁵⁰` more each,
    /// covered by the added `f32::MIN_POSITIVE`. The bound is rounded up by `1 + 10⁻⁶` so it
    /// stays a bound in f32.
    pub(crate) fn bound(&self, kernel: Kernel, q: &[f32], worst_key: f32) -> f32 {
        let d = q.len();
        match self.op {
            DirectOp::Min | DirectOp::MinNonNegative => {
                let a = sums_f64(q).1 + self.max_base_abs;
                let n = (d + 8) as f64 * F32_UNIT;
                let gamma = n / (1.0 - n);
                let b = 2.0 * gamma * a;
                (b * (1.0 + 1e-6) + f64::from(f32::MIN_POSITIVE)) as f32
            }
            DirectOp::AbsDiff | DirectOp::MaxAbsDiff => {
                kernel.error_bound(d, 0.0, 0.0, worst_key, F32_UNIT, 0.0)
            }
            // Not reached: the engine bounds these keys with its GEMM plan (the norms).
            DirectOp::Dot => f32::INFINITY,
        }
    }
}

/// `(Σ xᵢ, Σ |xᵢ|)` in f64.
fn sums_f64(x: &[f32]) -> (f64, f64) {
    let (mut s, mut a) = ([0.0f64; 4], [0.0f64; 4]);
    let chunks = x.chunks_exact(4);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..4 {
            s[l] += c[l] as f64;
            a[l] += (c[l] as f64).abs();
        }
    }
    for &v in rest {
        s[0] += v as f64;
        a[0] += (v as f64).abs();
    }
    (s.iter().sum(), a.iter().sum())
}

/// Whether the `Min` form's bound stays small next to typical distances: the base (sampled)
/// sits near the origin relative to its spread, and every sum stays far from overflow.
/// `Some(no negative value in base and queries)` when it does, else `None`.
fn min_form_fits(req: &CandidateRequest<'_>) -> Option<bool> {
    let (n, d) = (req.base.rows(), req.base.dim());
    if n == 0 {
        return None;
    }
    let step = n.div_ceil(SAMPLE_ROWS).max(1);
    let rows: Vec<&[f32]> = (0..n).step_by(step).map(|r| req.base.row(r)).collect();
    let mut mean = vec![0.0f64; d];
    for r in &rows {
        for (m, &v) in mean.iter_mut().zip(*r) {
            *m += v as f64;
        }
    }
    mean.iter_mut().for_each(|m| *m /= rows.len() as f64);
    let mut deviation = 0.0f64;
    for r in &rows {
        for (m, &v) in mean.iter().zip(*r) {
            deviation += (v as f64 - m).abs();
        }
    }
    deviation /= rows.len() as f64;
    let offset: f64 = mean.iter().map(|m| m.abs()).sum();
    // Sums of |values| of any point: at most d · max |value| (prepare keeps values ≤ 2⁴⁰).
    let range = |m: knn_core::MatrixRef<'_>| {
        m.as_slice()
            .par_iter()
            .fold(
                || (f32::INFINITY, 0.0f32),
                |(lo, top), &v| (lo.min(v), top.max(v.abs())),
            )
            .reduce(
                || (f32::INFINITY, 0.0f32),
                |a, b| (a.0.min(b.0), a.1.max(b.1)),
            )
    };
    let (rb, rq) = (range(req.base), range(req.queries));
    let top = rb.1.max(rq.1) as f64;
    let fits =
        offset <= MIN_FORM_MAX_OFFSET * deviation && top * (d as f64) * 8.0 < f32::MAX as f64;
    fits.then_some(rb.0 >= 0.0 && rq.0 >= 0.0)
}

/// Folds the keys of `queries[qr] × base[br]` into `tops` (one per query of `qr`).
pub(crate) fn fold_unit(
    req: &CandidateRequest<'_>,
    plan: &DirectPlan,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
) {
    let unit = Unit { req, plan, qr, br };
    fold_with(Isa::best(), &unit, tops);
}

/// Runs the unit with `isa`, which must not be better than [`Isa::best`].
fn fold_with(isa: Isa, unit: &Unit<'_, '_>, tops: &mut [TopK]) {
    match isa {
        // SAFETY: `isa` is at most the best this CPU has: the features are present.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::fold_avx512(unit, tops) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::fold_avx2(unit, tops) },
        // SAFETY: the scalar "vectors" need no CPU feature.
        _ => unsafe { fold::<Scalar, 2, 4>(unit, tops) },
    }
}

/// One work unit's inputs.
struct Unit<'a, 'r> {
    req: &'a CandidateRequest<'r>,
    plan: &'a DirectPlan,
    qr: Range<usize>,
    br: Range<usize>,
}

/// One query group: `2·LANES` queries packed coordinate-major, their sums (`Min`), running
/// thresholds (`-∞` in lanes past the last query, which then never take a key) and excluded ids.
struct Group {
    packed: Vec<f32>,
    sums: Vec<f32>,
    thr: Vec<f32>,
    skip: Vec<u32>,
    first: usize,
    len: usize,
}

/// The whole unit with vectors `S`, groups of `QV` query vectors and `NR` base points per
/// micro-kernel call.
#[inline(always)]
unsafe fn fold<S: Simd, const QV: usize, const NR: usize>(unit: &Unit<'_, '_>, tops: &mut [TopK]) {
    let req = unit.req;
    let d = req.base.dim();
    let width = QV * S::LANES;
    let mut groups: Vec<Group> = unit
        .qr
        .clone()
        .step_by(width)
        .map(|first| {
            let len = (unit.qr.end - first).min(width);
            let mut packed = vec![0.0f32; d * width];
            let mut sums = vec![0.0f32; width];
            let mut thr = vec![f32::NEG_INFINITY; width];
            let mut skip = vec![u32::MAX; width];
            for l in 0..len {
                let q = req.queries.row(first + l);
                for (j, &v) in q.iter().enumerate() {
                    packed[j * width + l] = v;
                }
                if unit.plan.op != DirectOp::Dot {
                    sums[l] = sums_f64(q).0 as f32;
                }
                thr[l] = tops[first - unit.qr.start + l].threshold();
                skip[l] = req.exclude.map_or(u32::MAX, |e| e[first + l]);
            }
            Group {
                packed,
                sums,
                thr,
                skip,
                first: first - unit.qr.start,
                len,
            }
        })
        .collect();
    let base = req.base.as_slice();
    let mut b0 = unit.br.start;
    while b0 < unit.br.end {
        let b1 = (b0 + BASE_BLOCK).min(unit.br.end);
        for g in &mut groups {
            let tops = &mut tops[g.first..g.first + g.len];
            // SAFETY: forwarded from the caller (the CPU has `S`'s features).
            unsafe {
                match unit.plan.op {
                    DirectOp::AbsDiff => {
                        fold_group::<S, OP_ABS_DIFF, QV, NR>(g, base, d, b0..b1, unit.plan, tops)
                    }
                    DirectOp::Min => {
                        fold_group::<S, OP_MIN, QV, NR>(g, base, d, b0..b1, unit.plan, tops)
                    }
                    DirectOp::MinNonNegative => fold_group::<S, OP_MIN_NON_NEGATIVE, QV, NR>(
                        g,
                        base,
                        d,
                        b0..b1,
                        unit.plan,
                        tops,
                    ),
                    DirectOp::MaxAbsDiff => fold_group::<S, OP_MAX_ABS_DIFF, QV, NR>(
                        g,
                        base,
                        d,
                        b0..b1,
                        unit.plan,
                        tops,
                    ),
                    DirectOp::Dot => {
                        fold_group::<S, OP_DOT, QV, NR>(g, base, d, b0..b1, unit.plan, tops)
                    }
                }
            }
        }
        b0 = b1;
    }
}

/// Base points `br` against one query group: full micro-kernels of `NR` points, then the
/// remaining points one at a time.
#[inline(always)]
unsafe fn fold_group<S: Simd, const OP: u8, const QV: usize, const NR: usize>(
    g: &mut Group,
    base: &[f32],
    d: usize,
    br: Range<usize>,
    plan: &DirectPlan,
    tops: &mut [TopK],
) {
    let full = br.start + (br.len() / NR) * NR;
    let mut b = br.start;
    // SAFETY (both loops): rows `b..b + NR` lie in `br`, inside the base; forwarded features.
    while b < full {
        unsafe { micro::<S, OP, QV, NR>(g, base, d, b, plan, tops) };
        b += NR;
    }
    while b < br.end {
        unsafe { micro::<S, OP, QV, 1>(g, base, d, b, plan, tops) };
        b += 1;
    }
}

/// Keys of base points `b0..b0 + NR` against the group, folded into its top-k lists.
#[inline(always)]
unsafe fn micro<S: Simd, const OP: u8, const QV: usize, const NR: usize>(
    g: &mut Group,
    base: &[f32],
    d: usize,
    b0: usize,
    plan: &DirectPlan,
    tops: &mut [TopK],
) {
    let lanes = S::LANES;
    let width = QV * lanes;
    debug_assert!(base.len() >= (b0 + NR) * d && g.packed.len() == d * width && width <= 64);
    let rows: [*const f32; NR] = std::array::from_fn(|p| base[(b0 + p) * d..].as_ptr());
    let qp = g.packed.as_ptr();
    // SAFETY: the caller's CPU has `S`'s features; every pointer stays inside its slice:
    // `qp + j·width + v·lanes + LANES ≤ d·width`, `rows[p] + j < (b0 + p + 1)·d`, and the
    // group's `thr`/`sums` hold `width` values.
    unsafe {
        let acc = accumulate::<S, OP, QV, NR>(qp, width, rows, d);
        // `Dot` shares the `Min` form's finish, its query sums zero: `‖b‖² − 2·acc`.
        let min_form = OP == OP_MIN || OP == OP_MIN_NON_NEGATIVE || OP == OP_DOT;
        let sums: [S::V; QV] = std::array::from_fn(|v| {
            if min_form {
                S::load(g.sums.as_ptr().add(v * lanes))
            } else {
                S::zero()
            }
        });
        for (p, acc) in acc.into_iter().enumerate() {
            let id = b0 + p;
            let sb = S::splat(if min_form { plan.base_sums[id] } else { 0.0 });
            let mut keys_v = acc;
            let mut mask = 0u64;
            for v in 0..QV {
                if min_form {
                    keys_v[v] = S::minus_twice(S::add(sums[v], sb), acc[v]);
                }
                // Thresholds are reloaded per point: a push may have just lowered them.
                let t = S::load(g.thr.as_ptr().add(v * lanes));
                mask |= u64::from(S::le_mask(keys_v[v], t)) << (v * lanes);
            }
            if mask == 0 {
                continue;
            }
            let mut keys = [0.0f32; 64];
            for (v, k) in keys_v.into_iter().enumerate() {
                S::store(keys.as_mut_ptr().add(v * lanes), k);
            }
            while mask != 0 {
                let l = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if g.skip[l] != id as u32 {
                    let t = &mut tops[l];
                    t.push(keys[l], id as u32);
                    g.thr[l] = t.threshold();
                }
            }
        }
    }
}

/// The accumulators of `NR` base rows (`rows[p]`, `d` coordinates) against one packed query
/// group (`qp`, `width` lanes per coordinate): `[point][query vector]`, before the `Min` form's
/// sums are applied.
///
/// # Safety
/// The CPU has `S`'s features; `qp` holds `d·width` values and each `rows[p]` `d`.
#[inline(always)]
unsafe fn accumulate<S: Simd, const OP: u8, const QV: usize, const NR: usize>(
    qp: *const f32,
    width: usize,
    rows: [*const f32; NR],
    d: usize,
) -> [[S::V; QV]; NR] {
    let lanes = S::LANES;
    // SAFETY: forwarded from the caller.
    unsafe {
        let mut acc = [[S::zero(); QV]; NR];
        for j in 0..d {
            let q: [S::V; QV] = std::array::from_fn(|v| S::load(qp.add(j * width + v * lanes)));
            for (p, acc) in acc.iter_mut().enumerate() {
                let b = S::splat(*rows[p].add(j));
                for (v, a) in acc.iter_mut().enumerate() {
                    // Pipes (Zen 4): float min/max/add/sub share the two adder pipes; integer
                    // min/max, logic and FMAs use the others. Accumulating half the vectors (or
                    // all, for `AbsDiff`) by FMA balances the load.
                    *a = match OP {
                        OP_MIN_NON_NEGATIVE if v % 2 == 0 => {
                            S::add_on_fma(*a, S::min_bits(q[v], b))
                        }
                        OP_MIN_NON_NEGATIVE => S::add(*a, S::min_bits(q[v], b)),
                        OP_MIN if v % 2 == 0 => S::add_on_fma(*a, S::min(q[v], b)),
                        OP_MIN => S::add(*a, S::min(q[v], b)),
                        OP_MAX_ABS_DIFF => S::max_bits(*a, S::abs(S::sub(q[v], b))),
                        OP_DOT => S::mul_add(q[v], b, *a),
                        _ => S::add_on_fma(*a, S::abs(S::sub(q[v], b))),
                    };
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knn_core::MatrixRef;

    /// A small deterministic generator (xorshift), values in `[lo, lo + span)`.
    fn values(n: usize, seed: u64, lo: f32, span: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                lo + span * ((s >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect()
    }

    /// Every base point for every query.
    fn request<'a>(
        b: &'a [f32],
        q: &'a [f32],
        d: usize,
        kernel: Kernel,
        precise: bool,
    ) -> CandidateRequest<'a> {
        let base = MatrixRef::new("b", b, d).unwrap();
        CandidateRequest {
            base,
            queries: MatrixRef::new("q", q, d).unwrap(),
            kernel,
            width: base.rows(),
            exclude: None,
            precise,
            base_key: None,
            exact_data: false,
            exact_from: None,
        }
    }

    /// Checks that `plan` on `isa` lists every point for every query, with keys (plus
    /// `shift(q)`) within `bound(q, worst key)` of the exact keys.
    fn check_all_keys(
        req: &CandidateRequest<'_>,
        plan: &DirectPlan,
        isa: Isa,
        shift: impl Fn(&[f32]) -> f32,
        bound: impl Fn(&[f32], f32) -> f32,
        what: &str,
    ) {
        let (nq, nb) = (req.queries.rows(), req.base.rows());
        let mut tops = vec![TopK::new(nb); nq];
        let unit = Unit {
            req,
            plan,
            qr: 0..nq,
            br: 0..nb,
        };
        fold_with(isa, &unit, &mut tops);
        let (mut keys, mut ids) = (vec![0.0; nb], vec![0u32; nb]);
        for (i, t) in tops.iter_mut().enumerate() {
            assert_eq!(t.len(), nb);
            t.drain_sorted_into(&mut keys, &mut ids);
            let qi = req.queries.row(i);
            let s = shift(qi);
            let bound = bound(qi, keys[nb - 1] + s) as f64;
            let mut seen = vec![false; nb];
            for (&k, &id) in keys.iter().zip(&ids) {
                seen[id as usize] = true;
                let exact = req.kernel.exact(qi, req.base.row(id as usize));
                let k = (k + s) as f64;
                assert!(
                    (k - exact).abs() <= bound,
                    "{isa:?} {what}: key {k} exact {exact} bound {bound}"
                );
            }
            assert!(seen.iter().all(|&s| s));
        }
    }

    /// Every key the kernels compute (width = all points) is within the plan's bound of the
    /// exact key, for each operation, at dimensions around the vector widths and tile sizes.
    #[test]
    fn keys_within_bound_of_exact() {
        for &(nq, nb, d) in &[
            (1, 1, 1),
            (33, 45, 3),
            (17, 9, 16),
            (40, 37, 17),
            (70, 530, 129),
        ] {
            for (lo, span) in [
                (0.0, 1.0),
                (-3.0, 6.0),
                (1000.0, 1.0),
                (-1e5, 3e5),
                (0.0, 1e-38),
            ] {
                let q = values(nq * d, 1 + d as u64, lo, span);
                let b = values(nb * d, 2 + nb as u64, lo, span);
                for kernel in [Kernel::L1, Kernel::Linf] {
                    for precise in [false, true] {
                        let req = request(&b, &q, d, kernel, precise);
                        let plan = DirectPlan::new(&req);
                        for isa in Isa::available() {
                            let what = format!("{:?} {kernel:?} d={d} lo={lo}", plan.op);
                            let bound = |qi: &[f32], worst| plan.bound(kernel, qi, worst);
                            check_all_keys(&req, &plan, isa, |_| 0.0, bound, &what);
                        }
                    }
                }
            }
        }
    }

    /// The `Dot` form's keys, with `‖q‖²` added as the engine adds it, are within the GEMM
    /// plan's bound of the exact squared distance, on every instruction set, and every point
    /// reaches the lists.
    #[test]
    fn dot_keys_within_the_gemm_bound() {
        for &(nq, nb, d) in &[
            (1, 1, 1),
            (33, 45, 3),
            (17, 9, 16),
            (40, 37, 17),
            (21, 70, 24),
        ] {
            for (lo, span) in [(0.0, 1.0), (-3.0, 6.0), (1000.0, 1.0), (-1e5, 3e5)] {
                let q = values(nq * d, 1 + d as u64, lo, span);
                let b = values(nb * d, 2 + nb as u64, lo, span);
                let req = request(&b, &q, d, Kernel::SqL2, false);
                let norms = crate::gemm::sq_norms(req.base, None);
                let plan = DirectPlan::dot(norms.sq.clone());
                let bound = |qi: &[f32], worst| {
                    let qn = (crate::gemm::sq_norm_f64(qi, None).sqrt() * (1.0 + 1e-6)) as f32;
                    Kernel::SqL2.error_bound(d, qn, norms.max_norm, worst, F32_UNIT, 0.0)
                };
                for isa in Isa::available() {
                    let what = format!("Dot d={d} lo={lo}");
                    check_all_keys(&req, &plan, isa, crate::gemm::sq_norm, bound, &what);
                }
            }
        }
    }

    #[test]
    fn min_form_only_near_the_origin_and_not_when_precise() {
        let d = 8;
        let near = values(100 * d, 3, -1.0, 2.0);
        let far = values(100 * d, 3, 4e6, 1.0);
        let op = |data: &[f32], kernel, precise| {
            let m = MatrixRef::new("x", data, d).unwrap();
            DirectPlan::new(&CandidateRequest {
                base: m,
                queries: m,
                kernel,
                width: 1,
                exclude: None,
                precise,
                base_key: None,
                exact_data: false,
                exact_from: None,
            })
            .op
        };
        assert_eq!(op(&near, Kernel::L1, false), DirectOp::Min);
        let positive = values(100 * d, 3, 0.0, 2.0);
        assert_eq!(op(&positive, Kernel::L1, false), DirectOp::MinNonNegative);
        assert_eq!(op(&near, Kernel::L1, true), DirectOp::AbsDiff);
        assert_eq!(op(&far, Kernel::L1, false), DirectOp::AbsDiff);
        assert_eq!(op(&near, Kernel::Linf, false), DirectOp::MaxAbsDiff);
    }
}
