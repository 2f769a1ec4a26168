//! The ring search of one query: cells of growing Chebyshev radius around the query's cell,
//! until the running `width`-th key is below a proven lower bound on every unvisited cell.
//!
//! Lower bounds come from per-axis gaps between the query and the actual coordinates of the
//! points in the slabs of cells not yet visited (see [`crate::build`]): any unvisited point lies
//! beyond the ring on some axis `j`, and within the level's bounding box on the others, so its
//! key is at least the kernel's combination of those gaps. Gaps and bounds are computed in f64
//! from f32 coordinates and rounded *down* to f32, so they bound the exact key.

use crate::best::Best;
use crate::build::{GridIndex, Level, CROWDED, MAX_AXES};
use knn_core::Kernel;

/// What differs between kernels: the f32 key of two points and how per-axis gaps combine
/// into a lower bound of the key.
pub(crate) trait KeyKind: Copy + Send + Sync + 'static {
    /// The key computed directly in f32 (relative error below `(d + 2)·u`, see
    /// [`crate::engine`]).
    fn key(q: &[f32], p: &[f32]) -> f32;
    /// Lower bound of the key from per-axis gaps (`≥ 0`), exact up to f64 rounding.
    fn combine(gaps: &[f64]) -> f64;
    /// The kernel's exact key, bit for bit [`Kernel::exact`] for rows shorter than 8 (where
    /// it starts from 0 and folds the coordinates in order), inlined here for the grid's
    /// fixed dimensions 1 to 3.
    fn exact(q: &[f32], p: &[f32]) -> f64;
    /// The kernel this is.
    const KERNEL: Kernel;
}

/// Squared Euclidean: `Σ (qᵢ − pᵢ)²`.
#[derive(Clone, Copy)]
pub(crate) struct SqL2;
/// Manhattan: `Σ |qᵢ − pᵢ|`.
#[derive(Clone, Copy)]
pub(crate) struct L1;
/// Chebyshev: `max |qᵢ − pᵢ|`.
#[derive(Clone, Copy)]
pub(crate) struct Linf;

impl KeyKind for SqL2 {
    #[inline(always)]
    fn key(q: &[f32], p: &[f32]) -> f32 {
        let mut s = 0.0f32;
        for (a, b) in q.iter().zip(p) {
            let t = a - b;
            s += t * t;
        }
        s
    }
    #[inline(always)]
    fn combine(gaps: &[f64]) -> f64 {
        gaps.iter().map(|g| g * g).sum()
    }
    #[inline(always)]
    fn exact(q: &[f32], p: &[f32]) -> f64 {
        let mut s = 0.0f64;
        for (&a, &b) in q.iter().zip(p) {
            let (a, b) = (a as f64, b as f64);
            s += (a - b) * (a - b);
        }
        s
    }
    const KERNEL: Kernel = Kernel::SqL2;
}

impl KeyKind for L1 {
    #[inline(always)]
    fn key(q: &[f32], p: &[f32]) -> f32 {
        let mut s = 0.0f32;
        for (a, b) in q.iter().zip(p) {
            s += (a - b).abs();
        }
        s
    }
    #[inline(always)]
    fn combine(gaps: &[f64]) -> f64 {
        gaps.iter().sum()
    }
    #[inline(always)]
    fn exact(q: &[f32], p: &[f32]) -> f64 {
        let mut s = 0.0f64;
        for (&a, &b) in q.iter().zip(p) {
            s += (a as f64 - b as f64).abs();
        }
        s
    }
    const KERNEL: Kernel = Kernel::L1;
}

impl KeyKind for Linf {
    #[inline(always)]
    fn key(q: &[f32], p: &[f32]) -> f32 {
        let mut s = 0.0f32;
        for (a, b) in q.iter().zip(p) {
            s = s.max((a - b).abs());
        }
        s
    }
    #[inline(always)]
    fn combine(gaps: &[f64]) -> f64 {
        gaps.iter().fold(0.0, |m, &g| m.max(g))
    }
    #[inline(always)]
    fn exact(q: &[f32], p: &[f32]) -> f64 {
        let mut s = 0.0f64;
        for (&a, &b) in q.iter().zip(p) {
            s = s.max((a as f64 - b as f64).abs());
        }
        s
    }
    const KERNEL: Kernel = Kernel::Linf;
}

/// The largest f32 not above `x` (after shaving the f64 rounding of the gap arithmetic: a few
/// operations of relative error 2⁻⁵³ each).
#[inline]
pub(crate) fn f32_below(x: f64) -> f32 {
    let x = x * (1.0 - 1e-12);
    let f = x as f32;
    if (f as f64) > x {
        f.next_down()
    } else {
        f
    }
}

/// Gap between coordinate `q` and the interval `[lo, hi]` (0 inside; `+∞` for an empty slab,
/// whose bounds are `+∞ / −∞`).
#[inline(always)]
fn gap(q: f32, lo: f32, hi: f32) -> f64 {
    let (q, lo, hi) = (q as f64, lo as f64, hi as f64);
    if lo > hi {
        return f64::INFINITY;
    }
    (lo - q).max(q - hi).max(0.0)
}

/// Searches one query through `level` and its sub-grids, folding keys into `best`. `qa` are the
/// query's gridded coordinates, `q` all of them; `D` is the dimension when known at compile
/// time (0: read it from the index).
#[inline]
pub(crate) fn search_level<K: KeyKind, const D: usize>(
    ix: &GridIndex,
    level: &Level,
    q: &[f32],
    qa: &[f32; MAX_AXES],
    best: &mut Best,
) {
    let g = ix.g;
    let d = if D == 0 { ix.d } else { D };
    let res = level.res;
    let mut c = [0usize; MAX_AXES];
    let mut boxgap = [0f64; MAX_AXES];
    for j in 0..g {
        c[j] = level.axis_cell(j, qa[j]);
        boxgap[j] = gap(qa[j], level.bbox_lo[j], level.bbox_hi[j]);
    }
    // Per-axis gaps of each slab are reused by many cells of a ring: computed on demand.
    let slab_gap = |j: usize, i: usize| gap(qa[j], level.slab_lo[j][i], level.slab_hi[j][i]);

    let scan = |s: usize, e: usize, best: &mut Best| {
        let pts = &ix.points[s * d..e * d];
        if D > 0 {
            // Fixed-size rows: the key loop is fully unrolled.
            let q: &[f32; D] = q[..D].try_into().expect("query has D coordinates");
            for (i, pos) in (s..e).enumerate() {
                let p: &[f32; D] = pts[i * D..(i + 1) * D].try_into().expect("row of D");
                best.offer(K::key(q, p), pos as u32);
            }
        } else {
            for (p, pos) in pts.chunks_exact(d).zip(s..e) {
                best.offer(K::key(&q[..d], p), pos as u32);
            }
        }
    };

    // Cells `a..=b` of one row (axis 0 innermost) are contiguous in the point arrays: one
    // bound test and one scan for the run, unless a crowded cell in it has a sub-grid.
    let has_children = !level.children.is_empty();
    let visit_run =
        |row: usize, a: usize, b: usize, gaps: &mut [f64; MAX_AXES], best: &mut Best| {
            let (s, e) = (
                level.start[row + a] as usize,
                level.start[row + b + 1] as usize,
            );
            if s == e {
                return;
            }
            if best.is_full() {
                // Slabs a..=b lie within [lo_from[a], hi_below[b + 1]].
                gaps[0] = gap(qa[0], level.lo_from[0][a], level.hi_below[0][b + 1]);
                let lb = f32_below(K::combine(&gaps[..g]));
                if lb > best.limit {
                    return best.skip(lb);
                }
            }
            if !has_children {
                return scan(s, e, best);
            }
            for i0 in a..=b {
                let cell = row + i0;
                let (s, e) = (level.start[cell] as usize, level.start[cell + 1] as usize);
                if s == e {
                    continue;
                }
                if best.is_full() {
                    gaps[0] = slab_gap(0, i0);
                    let lb = f32_below(K::combine(&gaps[..g]));
                    if lb > best.limit {
                        best.skip(lb);
                        continue;
                    }
                }
                let child = if e - s > CROWDED {
                    level.child(cell)
                } else {
                    None
                };
                match child {
                    Some(child) => search_level::<K, D>(ix, child, q, qa, best),
                    None => scan(s, e, best),
                }
            }
        };

    let mut gaps = [0f64; MAX_AXES];
    // Within a ring, rows nearest the query come first (the query's own slab, then the
    // neighbour on the side of the query's half of its cell, then the other side, and so on),
    // so the running limit tightens before the farther rows are tested.
    let near_up: [bool; MAX_AXES] = std::array::from_fn(|j| {
        j < g && (qa[j] - level.origin[j]) * level.inv[j] - c[j] as f32 >= 0.5
    });
    // The `t`-th slab of ring `r` on axis `j` in that order (`None`: outside the grid).
    let nth = |j: usize, t: usize| -> Option<usize> {
        if t == 0 {
            return Some(c[j]);
        }
        let s = t.div_ceil(2);
        if (t % 2 == 1) == near_up[j] {
            (c[j] + s < res[j]).then_some(c[j] + s)
        } else {
            c[j].checked_sub(s)
        }
    };
    let mut r = 0usize;
    loop {
        // Ring r: cells whose largest axis offset from `c` is exactly r, clamped to the grid.
        let lo0 = c[0].saturating_sub(r);
        let hi0 = (c[0] + r).min(res[0] - 1);
        let steps: [usize; MAX_AXES] = std::array::from_fn(|j| 2 * r.min(res[j] - 1));
        for i2 in (0..=steps[2]).filter_map(|t| nth(2, t)) {
            let on2 = i2.abs_diff(c[2]) == r;
            if g > 2 {
                gaps[2] = slab_gap(2, i2);
            }
            for i1 in (0..=steps[1]).filter_map(|t| nth(1, t)) {
                let on1 = on2 || i1.abs_diff(c[1]) == r;
                if g > 1 {
                    gaps[1] = slab_gap(1, i1);
                }
                let row = (i2 * res[1] + i1) * res[0];
                if on1 {
                    visit_run(row, lo0, hi0, &mut gaps, best);
                } else if r > 0 {
                    for i0 in [nth(0, 2 * r - 1), nth(0, 2 * r)].into_iter().flatten() {
                        visit_run(row, i0, i0, &mut gaps, best);
                    }
                }
            }
        }
        // Lower bound of every cell outside the visited cube: beyond it on some axis j, inside
        // the bounding box (at least) on the others.
        let mut covered = true;
        let mut unvisited = f64::INFINITY;
        for j in 0..g {
            let below = if c[j] > r {
                covered = false;
                qa[j] as f64 - level.hi_below[j][c[j] - r] as f64
            } else {
                f64::NEG_INFINITY
            };
            let above = if c[j] + r + 1 < res[j] {
                covered = false;
                level.lo_from[j][c[j] + r + 1] as f64 - qa[j] as f64
            } else {
                f64::NEG_INFINITY
            };
            // An empty side gives −∞ − q or +∞ − q: no points there.
            let side = |v: f64| {
                if v == f64::NEG_INFINITY {
                    f64::INFINITY
                } else {
                    v.max(0.0)
                }
            };
            let ring_gap = side(below).min(side(above)).max(boxgap[j]);
            let mut gs = boxgap;
            gs[j] = ring_gap;
            unvisited = unvisited.min(K::combine(&gs[..g]));
        }
        if covered || unvisited == f64::INFINITY {
            return;
        }
        let lb = f32_below(unvisited);
        best.settle();
        if best.is_full() && best.limit < lb {
            return best.skip(lb);
        }
        r += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The inlined exact keys are the pipeline's [`Kernel::exact`], bit for bit.
    #[test]
    fn exact_keys_match_the_kernel_bit_for_bit() {
        fn check<K: KeyKind>() {
            let mut x = 0x9E37_79B9_7F4A_7C15u64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Mixed magnitudes and signs.
                let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                m * [1e-3f32, 1.0, 7e3, 3e7][(x & 3) as usize]
            };
            for d in 1..=3 {
                for _ in 0..20_000 {
                    let q: Vec<f32> = (0..d).map(|_| next()).collect();
                    let p: Vec<f32> = (0..d).map(|_| next()).collect();
                    let want = K::KERNEL.exact(&q, &p);
                    assert_eq!(K::exact(&q, &p).to_bits(), want.to_bits(), "{q:?} {p:?}");
                }
            }
        }
        check::<SqL2>();
        check::<L1>();
        check::<Linf>();
    }
}
