//! The symmetric self-join's direct kernel: each pair of points' key computed once and folded
//! into both points' lists (see [`crate::symmetric`]), with the micro-kernel layout of
//! [`super`].

#[cfg(target_arch = "x86_64")]
use super::simd::x86;
use super::simd::{Scalar, Simd};
use super::{accumulate, sums_f64, DirectOp, DirectPlan};
use super::{OP_ABS_DIFF, OP_MAX_ABS_DIFF, OP_MIN, OP_MIN_NON_NEGATIVE};
use crate::isa::Isa;
use knn_core::MatrixRef;
use rayon::prelude::*;
use std::ops::Range;

/// Symmetric self-join: folds the keys of the block pair `points[ri] × points[rj]` into both
/// sides' lists (see [`crate::symmetric`]); on the diagonal (`ri == rj`) only pairs `i < j`.
/// The rows sit in SIMD lanes, the columns are broadcast, as in [`fold_unit`]; a pair's key is
/// one number for both points (`Σq + Σb` adds the same two f32 values either way). Returns the
/// number of pair keys computed.
pub(crate) fn fold_pair(
    points: MatrixRef<'_>,
    plan: &DirectPlan,
    packed: &PackedGroups,
    ri: Range<usize>,
    rj: Range<usize>,
    sides: &mut crate::symmetric::Sides<'_>,
) -> u64 {
    debug_assert_eq!(packed.width, group_width(Isa::best()));
    debug_assert_eq!(ri.start % packed.width, 0);
    let pair = Pair {
        points,
        plan,
        packed,
        ri,
        rj,
    };
    match Isa::best() {
        // SAFETY: `best_isa` found the features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::fold_pair_avx512(&pair, sides) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::fold_pair_avx2(&pair, sides) },
        // SAFETY: the scalar "vectors" need no CPU feature.
        _ => unsafe { fold_pair_with::<Scalar, 2, 4>(&pair, sides) },
    }
}

/// One block pair's inputs.
pub(super) struct Pair<'a, 'p> {
    points: MatrixRef<'p>,
    plan: &'a DirectPlan,
    packed: &'a PackedGroups,
    ri: Range<usize>,
    rj: Range<usize>,
}

/// Queries per packed group of the micro-kernel of `isa` (`QV · LANES`).
pub(super) fn group_width(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 64,
        Isa::Avx2 => 16,
        Isa::Scalar => 2,
    }
}

/// Every point of a symmetric self-join packed once as query groups for the best instruction
/// set (coordinate-major, `width` lanes, zero padded), with the f32-rounded f64 sums the `Min`
/// form needs.
pub(crate) struct PackedGroups {
    data: Vec<f32>,
    sums: Vec<f32>,
    width: usize,
}

impl PackedGroups {
    /// Packs `points`.
    pub(crate) fn new(points: MatrixRef<'_>) -> Self {
        let (n, d) = (points.rows(), points.dim());
        let width = group_width(Isa::best());
        let groups = n.div_ceil(width);
        let mut data = vec![0.0f32; groups * d * width];
        let mut sums = vec![0.0f32; groups * width];
        data.par_chunks_mut(d * width)
            .zip(sums.par_chunks_mut(width))
            .enumerate()
            .for_each(|(g, (packed, sums))| {
                for l in 0..width.min(n - g * width) {
                    let q = points.row(g * width + l);
                    for (j, &v) in q.iter().enumerate() {
                        packed[j * width + l] = v;
                    }
                    sums[l] = sums_f64(q).0 as f32;
                }
            });
        PackedGroups { data, sums, width }
    }
}

/// [`fold_pair`] with vectors `S`, groups of `QV` vectors, `NR` columns per micro-kernel.
///
/// # Safety
/// The CPU has `S`'s features.
#[inline(always)]
pub(super) unsafe fn fold_pair_with<S: Simd, const QV: usize, const NR: usize>(
    pair: &Pair<'_, '_>,
    sides: &mut crate::symmetric::Sides<'_>,
) -> u64 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match pair.plan.op {
            DirectOp::AbsDiff => fold_pair_op::<S, OP_ABS_DIFF, QV, NR>(pair, sides),
            DirectOp::Min => fold_pair_op::<S, OP_MIN, QV, NR>(pair, sides),
            DirectOp::MinNonNegative => fold_pair_op::<S, OP_MIN_NON_NEGATIVE, QV, NR>(pair, sides),
            DirectOp::MaxAbsDiff => fold_pair_op::<S, OP_MAX_ABS_DIFF, QV, NR>(pair, sides),
            // Self-joins of squared L2 take the GEMM form's pairs (`gemm::fold_pair`).
            DirectOp::Dot => unreachable!("the Dot form folds queries against a base only"),
        }
    }
}

/// [`fold_pair_with`] for one operation.
///
/// # Safety
/// The CPU has `S`'s features.
#[inline(always)]
unsafe fn fold_pair_op<S: Simd, const OP: u8, const QV: usize, const NR: usize>(
    pair: &Pair<'_, '_>,
    sides: &mut crate::symmetric::Sides<'_>,
) -> u64 {
    let (points, ri, rj) = (pair.points, pair.ri.clone(), pair.rj.clone());
    let d = points.dim();
    let width = QV * S::LANES;
    let (ni, nj) = (ri.len(), rj.len());
    let diagonal = sides.is_diagonal();
    let base = points.as_slice();
    let mut computed = 0u64;
    for a0 in (0..ni).step_by(width) {
        let lanes = (ni - a0).min(width);
        let g = (ri.start + a0) / width;
        let packed = &pair.packed.data[g * d * width..(g + 1) * d * width];
        let sums = &pair.packed.sums[g * width..(g + 1) * width];
        // On the diagonal, columns up to the group's first row hold no pair `i < j`.
        let mut c = if diagonal { (a0 + 1).min(nj) } else { 0 };
        while c < nj {
            let points_left = nj - c;
            // SAFETY: columns `c..c + NR` (or `c`) lie in `rj`; forwarded features; the sides'
            // row thresholds are padded to whole 64-row groups.
            unsafe {
                if points_left >= NR {
                    micro_sym::<S, OP, QV, NR>(
                        packed,
                        sums,
                        base,
                        d,
                        pair.plan,
                        rj.start,
                        (a0, c),
                        lanes,
                        sides,
                    );
                    c += NR;
                    computed += (lanes * NR) as u64;
                } else {
                    micro_sym::<S, OP, QV, 1>(
                        packed,
                        sums,
                        base,
                        d,
                        pair.plan,
                        rj.start,
                        (a0, c),
                        lanes,
                        sides,
                    );
                    c += 1;
                    computed += lanes as u64;
                }
            }
        }
    }
    computed
}

/// The symmetric micro-kernel: keys of the row group at local rows `a0..a0 + lanes` (packed in
/// `packed`, sums in `sums`) against local columns `b0..b0 + NR` (global `col_start + b`), each
/// offered to the row's list and to the column's where at most their thresholds (`≤`: the
/// lists settle ties by id). On the diagonal only pairs with row < column.
///
/// # Safety
/// The CPU has `S`'s features; `packed` holds `d·QV·LANES` values, `sums` `QV·LANES`; columns
/// `b0..b0 + NR` exist; the sides' row thresholds hold `a0 + QV·LANES` values.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn micro_sym<S: Simd, const OP: u8, const QV: usize, const NR: usize>(
    packed: &[f32],
    sums: &[f32],
    base: &[f32],
    d: usize,
    plan: &DirectPlan,
    col_start: usize,
    (a0, b0): (usize, usize),
    lanes: usize,
    sides: &mut crate::symmetric::Sides<'_>,
) {
    let lane_w = S::LANES;
    let width = QV * lane_w;
    debug_assert!(packed.len() == d * width && width <= 64);
    debug_assert!(sides.row_thr().len() >= a0 + width);
    let rows: [*const f32; NR] = std::array::from_fn(|p| base[(col_start + b0 + p) * d..].as_ptr());
    let valid: u64 = if lanes >= 64 {
        u64::MAX
    } else {
        (1u64 << lanes) - 1
    };
    let diagonal = sides.is_diagonal();
    // SAFETY: see the function's contract.
    unsafe {
        let acc = accumulate::<S, OP, QV, NR>(packed.as_ptr(), width, rows, d);
        let min_form = OP == OP_MIN || OP == OP_MIN_NON_NEGATIVE;
        let qs: [S::V; QV] = std::array::from_fn(|v| {
            if min_form {
                S::load(sums.as_ptr().add(v * lane_w))
            } else {
                S::zero()
            }
        });
        for (p, acc) in acc.into_iter().enumerate() {
            let bl = b0 + p;
            let before: u64 = if !diagonal || bl >= a0 + 64 {
                u64::MAX
            } else if bl <= a0 {
                0
            } else {
                (1u64 << (bl - a0)) - 1
            };
            let sb = S::splat(if min_form {
                plan.base_sums[col_start + bl]
            } else {
                0.0
            });
            let ct = S::splat(sides.col_thr()[bl]);
            let mut keys_v = acc;
            let (mut rmask, mut cmask) = (0u64, 0u64);
            for v in 0..QV {
                if min_form {
                    keys_v[v] = S::minus_twice(S::add(qs[v], sb), acc[v]);
                }
                let t = S::load(sides.row_thr().as_ptr().add(a0 + v * lane_w));
                rmask |= u64::from(S::le_mask(keys_v[v], t)) << (v * lane_w);
                cmask |= u64::from(S::le_mask(keys_v[v], ct)) << (v * lane_w);
            }
            rmask &= valid & before;
            cmask &= valid & before;
            if rmask | cmask == 0 {
                continue;
            }
            let mut keys = [0.0f32; 64];
            for (v, k) in keys_v.into_iter().enumerate() {
                S::store(keys.as_mut_ptr().add(v * lane_w), k);
            }
            while rmask != 0 {
                let l = rmask.trailing_zeros() as usize;
                rmask &= rmask - 1;
                sides.push_row(a0 + l, keys[l], sides.col_id(bl));
            }
            while cmask != 0 {
                let l = cmask.trailing_zeros() as usize;
                cmask &= cmask - 1;
                sides.push_col(bl, keys[l], sides.row_id(a0 + l));
            }
        }
    }
}
