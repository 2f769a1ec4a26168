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
use crate::lanes::{self, SingleLanes};
use knn_core::Kernel;

/// What differs between kernels: the f32 key of two points and how per-axis gaps combine
/// into a lower bound of the key.
pub(crate) trait KeyKind: Copy + Send + Sync + 'static {
    /// One coordinate's difference `t` folded into a partial key `a` (keys start from 0).
    fn fold(a: f32, t: f32) -> f32;
    /// [`KeyKind::fold`] on four lanes, the same operations lane by lane.
    #[cfg(target_arch = "x86_64")]
    fn fold_x4(a: X4, t: X4) -> X4;
    /// The key computed directly in f32 (relative error below `(d + 2)·u`, see
    /// [`crate::engine`]).
    #[inline(always)]
    fn key(q: &[f32], p: &[f32]) -> f32 {
        q.iter().zip(p).fold(0.0, |a, (x, y)| Self::fold(a, x - y))
    }
    /// One axis's share of a lower bound, from the gap `g ≥ 0` on that axis: the gap itself,
    /// unless the kernel says otherwise.
    #[inline(always)]
    fn term(g: f64) -> f64 {
        g
    }
    /// Two shares joined (their sum, or their maximum for L∞); exact up to f64 rounding.
    fn join(a: f64, b: f64) -> f64;
    /// The kernel's exact key: the f64 gaps between the coordinates, each made a share and
    /// joined in order from 0. Bit for bit [`Kernel::exact`] for rows shorter than 8 (where
    /// it starts from 0 and folds the coordinates in order), inlined here for the grid's
    /// fixed dimensions 1 to 3.
    #[inline(always)]
    fn exact(q: &[f32], p: &[f32]) -> f64 {
        q.iter().zip(p).fold(0.0, |s, (&a, &b)| {
            Self::join(s, Self::term((a as f64 - b as f64).abs()))
        })
    }
    /// The kernel this is.
    const KERNEL: Kernel;
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m128 as X4, _mm_add_ps, _mm_andnot_ps, _mm_max_ps, _mm_mul_ps, _mm_set1_ps,
};

/// `|t|` on four lanes (the sign bit cleared).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn abs_x4(t: X4) -> X4 {
    // SAFETY: SSE is part of every x86_64 target.
    unsafe { _mm_andnot_ps(_mm_set1_ps(-0.0), t) }
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
    fn fold(a: f32, t: f32) -> f32 {
        a + t * t
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn fold_x4(a: X4, t: X4) -> X4 {
        // SAFETY: SSE is part of every x86_64 target.
        unsafe { _mm_add_ps(a, _mm_mul_ps(t, t)) }
    }
    #[inline(always)]
    fn term(g: f64) -> f64 {
        g * g
    }
    #[inline(always)]
    fn join(a: f64, b: f64) -> f64 {
        a + b
    }
    const KERNEL: Kernel = Kernel::SqL2;
}

impl KeyKind for L1 {
    #[inline(always)]
    fn fold(a: f32, t: f32) -> f32 {
        a + t.abs()
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn fold_x4(a: X4, t: X4) -> X4 {
        // SAFETY: SSE is part of every x86_64 target.
        unsafe { _mm_add_ps(a, abs_x4(t)) }
    }
    #[inline(always)]
    fn join(a: f64, b: f64) -> f64 {
        a + b
    }
    const KERNEL: Kernel = Kernel::L1;
}

impl KeyKind for Linf {
    #[inline(always)]
    fn fold(a: f32, t: f32) -> f32 {
        a.max(t.abs())
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn fold_x4(a: X4, t: X4) -> X4 {
        // SAFETY: SSE is part of every x86_64 target.
        unsafe { _mm_max_ps(a, abs_x4(t)) }
    }
    #[inline(always)]
    fn join(a: f64, b: f64) -> f64 {
        a.max(b)
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
    // Plain comparisons: `f64::max` spends several instructions on NaN, which cannot occur
    // here (finite coordinates; the bounds of a slab with points are finite).
    let g = if lo - q > q - hi { lo - q } else { q - hi };
    if g > 0.0 {
        g
    } else {
        0.0
    }
}

/// Smaller of two keys (never NaN: keys of finite points).
#[inline(always)]
pub(crate) fn min_key(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// Offers the points at positions `s..e` of the index to `best`.
#[inline(always)]
fn scan<K: KeyKind, const D: usize>(
    ix: &GridIndex,
    q: &[f32],
    s: usize,
    e: usize,
    best: &mut Best,
) {
    if D > 0 && !ix.cols.is_empty() {
        let q: &[f32; D] = q[..D].try_into().expect("query has D coordinates");
        let cols: [&[f32]; D] = std::array::from_fn(|j| &ix.cols[j][..]);
        if best.is_single() {
            scan_single::<K, D>(cols, q, s, e, best)
        } else {
            scan_lanes::<K, D>(cols, q, s, e, best)
        }
    } else {
        let d = ix.d;
        for (p, pos) in ix.points[s * d..e * d].chunks_exact(d).zip(s..e) {
            best.offer(K::key(&q[..d], p), pos as u32);
        }
    }
}

/// [`scan`] for one neighbour and no excluded id: the best pair and the runner-up (the second
/// smallest key) kept in registers, without branches but on equal keys.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `i` indexes all D columns
fn scan_single<K: KeyKind, const D: usize>(
    cols: [&[f32]; D],
    q: &[f32; D],
    s: usize,
    e: usize,
    best: &mut Best,
) {
    let (mut key_best, mut pos_best) = best.single();
    let mut runner_up = best.runner_up;
    let cols: [&[f32]; D] = std::array::from_fn(|j| &cols[j][s..e]);
    for i in 0..e - s {
        let mut key = 0f32;
        for j in 0..D {
            key = K::fold(key, q[j] - cols[j][i]);
        }
        let pos = (s + i) as u32;
        let better = key < key_best || (key == key_best && best.id(pos) < best.id(pos_best));
        // The second smallest of a multiset: the larger of the newcomer and the best so far.
        runner_up = min_key(runner_up, if key < key_best { key_best } else { key });
        if better {
            (key_best, pos_best) = (key, pos);
        }
    }
    best.set_single(key_best, pos_best, runner_up);
}

/// [`scan`], four points at a time: the keys of a group first (vectorised), then, only when
/// one of them can enter, the group offered.
#[inline(always)]
fn scan_lanes<K: KeyKind, const D: usize>(
    cols: [&[f32]; D],
    q: &[f32; D],
    s: usize,
    e: usize,
    best: &mut Best,
) {
    let mut i = s;
    while i < e {
        let (key, enter) = lanes::group::<K, D>(&cols, q, i, e, best.limit);
        if enter {
            best.offer_lanes(&key, i as u32, (e - i).min(lanes::WIDTH));
        } else {
            let least = key.iter().fold(f32::INFINITY, |a, &k| min_key(a, k));
            best.runner_up = min_key(best.runner_up, least);
        }
        i += lanes::WIDTH;
    }
}

/// The 3×3×3 block of cells around cell `c` of a level without sub-grids, for a single
/// selection ([`Best::is_single`]): every point examined, four at a time, each lane keeping
/// its smallest key, that key's position and its second smallest key, without a branch.
/// Returns `false`, leaving `best` as it was, when two points (or one and the pair already
/// selected) share the smallest key: the caller then searches the block one point at a time,
/// breaking the tie by id.
#[inline(always)]
fn block_single<K: KeyKind, const D: usize>(
    ix: &GridIndex,
    level: &Level,
    q: &[f32],
    c: &[usize; MAX_AXES],
    best: &mut Best,
) -> bool {
    let q: &[f32; D] = q[..D].try_into().expect("query has D coordinates");
    let cols: [&[f32]; D] = std::array::from_fn(|j| &ix.cols[j][..]);
    let res = level.res;
    let (held_key, held_pos) = best.single();
    let mut state = SingleLanes::new(held_key, held_pos, best.runner_up);
    let span = |j: usize| c[j].saturating_sub(1)..(c[j] + 2).min(res[j]);
    let (lo0, hi0) = (c[0].saturating_sub(1), (c[0] + 1).min(res[0] - 1));
    for i2 in span(2) {
        for i1 in span(1) {
            let row = (i2 * res[1] + i1) * res[0];
            let (s, e) = (
                level.start[row + lo0] as usize,
                level.start[row + hi0 + 1] as usize,
            );
            lanes::single::<K, D>(&cols, q, s, e, &mut state);
        }
    }
    // A tie for the smallest key needs the ids: not decided here.
    let Some((key, pos, runner_up)) = state.merge() else {
        return false;
    };
    best.set_single(key, pos, runner_up);
    true
}

/// Searches one query through `level` and its sub-grids, folding keys into `best`. `qa` are the
/// query's gridded coordinates, `q` all of them; `D` is the dimension when known at compile
/// time (0: read it from the index).
///
/// First the 3×3×3 block of cells around the query's cell (rows of cells along axis 0, nearest
/// rows first, each row and each end cell tested against the running limit), then rings of
/// cells of Chebyshev radius 2, 3, ... until the limit is below the bound of every cell left.
#[inline]
pub(crate) fn search_level<K: KeyKind, const D: usize>(
    ix: &GridIndex,
    level: &Level,
    q: &[f32],
    qa: &[f32; MAX_AXES],
    best: &mut Best,
) {
    let g = ix.g;
    let res = level.res;
    let mut c = [0usize; MAX_AXES];
    let mut boxterm = [0f64; MAX_AXES];
    for j in 0..g {
        c[j] = level.axis_cell(j, qa[j]);
        boxterm[j] = K::term(gap(qa[j], level.bbox_lo[j], level.bbox_hi[j]));
    }
    // Per-axis terms of each slab are reused by many cells of a ring: computed on demand.
    let slab_term =
        |j: usize, i: usize| K::term(gap(qa[j], level.slab_lo[j][i], level.slab_hi[j][i]));
    let has_children = !level.children.is_empty();

    // Cells `a..=b` of the row of cells starting at cell `row` (axis 0 innermost): contiguous
    // in the point arrays, so one scan for the run, unless a crowded cell in it has a
    // sub-grid. `rt` is the joined term of the row's other axes; with `test`, the run is first
    // tested against the limit as a whole.
    let visit_run = |row: usize, a: usize, b: usize, rt: f64, test: bool, best: &mut Best| {
        let (s, e) = (
            level.start[row + a] as usize,
            level.start[row + b + 1] as usize,
        );
        if s == e {
            return;
        }
        if test && best.is_full() {
            // Slabs a..=b lie within [lo_from[a], hi_below[b + 1]].
            let lb = K::join(
                rt,
                K::term(gap(qa[0], level.lo_from[0][a], level.hi_below[0][b + 1])),
            );
            if lb > best.limit as f64 {
                return best.skip(lb);
            }
        }
        if !has_children {
            return scan::<K, D>(ix, q, s, e, best);
        }
        for i0 in a..=b {
            let cell = row + i0;
            let (s, e) = (level.start[cell] as usize, level.start[cell + 1] as usize);
            if s == e {
                continue;
            }
            if best.is_full() {
                let lb = K::join(rt, slab_term(0, i0));
                if lb > best.limit as f64 {
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
                None => scan::<K, D>(ix, q, s, e, best),
            }
        }
    };

    // Lower bound of every cell outside the cube of radius `r` around `c` (beyond it on some
    // axis j, inside the bounding box at least on the others); `None` when nothing is left.
    let outside = |r: usize| -> Option<f64> {
        let mut covered = true;
        let mut bound = f64::INFINITY;
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
            let mut t = K::term(side(below).min(side(above))).max(boxterm[j]);
            for (i, &bt) in boxterm.iter().enumerate().take(g) {
                if i != j {
                    t = K::join(t, bt);
                }
            }
            bound = bound.min(t);
        }
        (!covered && bound < f64::INFINITY).then_some(bound)
    };
    // Stops the search when the limit is proven below every cell outside radius `r`.
    let done = |r: usize, best: &mut Best| -> bool {
        let Some(lb) = outside(r) else {
            return true;
        };
        best.settle();
        if best.is_full() && (best.limit as f64) < lb {
            best.skip(lb);
            return true;
        }
        false
    };

    // The block: terms of slabs c−1, c, c+1 per axis (+∞ where there is no such slab; axes
    // past `g` have the one slab, term 0).
    let mut t = [[f64::INFINITY; 3]; MAX_AXES];
    for (j, tj) in t.iter_mut().enumerate() {
        if j >= g {
            tj[1] = 0.0;
            continue;
        }
        for (o, to) in tj.iter_mut().enumerate() {
            if c[j] + o >= 1 && c[j] + o - 1 < res[j] {
                *to = slab_term(j, c[j] + o - 1);
            }
        }
    }
    // Rows nearest first: the query's own, then the near neighbour on axes 1 and 2, and so on.
    let near = |j: usize| if t[j][0] <= t[j][2] { 0 } else { 2 };
    let (n1, n2) = (near(1), near(2));
    let (f1, f2) = (2 - n1, 2 - n2);
    let rows = [
        (1, 1),
        (n1, 1),
        (1, n2),
        (n1, n2),
        (f1, 1),
        (1, f2),
        (f1, n2),
        (n1, f2),
        (f1, f2),
    ];
    let (n0, f0) = (near(0), 2 - near(0));
    let fast = !has_children
        && best.is_single()
        && D > 0
        && !ix.cols.is_empty()
        && block_single::<K, D>(ix, level, q, &c, best);
    if !fast {
        for (o1, o2) in rows {
            let rt = K::join(t[1][o1], t[2][o2]);
            if rt == f64::INFINITY {
                continue; // no such row, or no points in its slabs
            }
            if best.is_full() && rt > best.limit as f64 {
                best.skip(rt);
                continue;
            }
            let row = ((c[2] + o2 - 1) * res[1] + (c[1] + o1 - 1)) * res[0];
            let x = |o: usize| c[0] + o - 1;
            if (o1, o2) == (1, 1) {
                // The query's own cell, then its neighbours along axis 0, nearest first.
                visit_run(row, c[0], c[0], rt, true, best);
                for o in [n0, f0] {
                    if t[0][o] < f64::INFINITY {
                        visit_run(row, x(o), x(o), rt, true, best);
                    }
                }
                continue;
            }
            // Another row: the cells along axis 0 that can still hold a better point.
            let mut pass = [false; 3];
            for (o, p) in pass.iter_mut().enumerate() {
                if t[0][o] == f64::INFINITY {
                    continue;
                }
                let lb = K::join(rt, t[0][o]);
                if best.is_full() && lb > best.limit as f64 {
                    best.skip(lb);
                } else {
                    *p = true;
                }
            }
            match pass {
                [false, false, false] => {}
                [true, false, true] => {
                    visit_run(row, x(0), x(0), rt, false, best);
                    visit_run(row, x(2), x(2), rt, false, best);
                }
                _ => {
                    let a = pass.iter().position(|&p| p).unwrap_or(1);
                    let b = pass.iter().rposition(|&p| p).unwrap_or(1);
                    visit_run(row, x(a), x(b), rt, false, best);
                }
            }
        }
    }
    if done(1, best) {
        return;
    }

    // Rings of radius 2, 3, ...: within a ring, rows nearest the query come first (the query's
    // own slab, then the neighbour on the side of the query's half of its cell, then the other
    // side, and so on), so the running limit tightens before the farther rows are tested.
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
    let mut r = 2usize;
    loop {
        // Ring r: cells whose largest axis offset from `c` is exactly r, clamped to the grid.
        let lo0 = c[0].saturating_sub(r);
        let hi0 = (c[0] + r).min(res[0] - 1);
        let steps: [usize; MAX_AXES] = std::array::from_fn(|j| 2 * r.min(res[j] - 1));
        for i2 in (0..=steps[2]).filter_map(|t| nth(2, t)) {
            let on2 = i2.abs_diff(c[2]) == r;
            let t2 = if g > 2 { slab_term(2, i2) } else { 0.0 };
            for i1 in (0..=steps[1]).filter_map(|t| nth(1, t)) {
                let on1 = on2 || i1.abs_diff(c[1]) == r;
                let t1 = if g > 1 { slab_term(1, i1) } else { 0.0 };
                let rt = K::join(t1, t2);
                let row = (i2 * res[1] + i1) * res[0];
                if on1 {
                    visit_run(row, lo0, hi0, rt, true, best);
                } else {
                    for i0 in [nth(0, 2 * r - 1), nth(0, 2 * r)].into_iter().flatten() {
                        visit_run(row, i0, i0, rt, true, best);
                    }
                }
            }
        }
        if done(r, best) {
            return;
        }
        r += 1;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Coordinates of mixed magnitudes and signs, from a xorshift generator seeded with `seed`.
    pub(crate) fn mixed_values(seed: u64) -> impl FnMut() -> f32 {
        let mut x = seed;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let m = (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            m * [1e-3f32, 1.0, 7e3, 3e7][(x & 3) as usize]
        }
    }

    /// The inlined exact keys are the pipeline's [`Kernel::exact`], bit for bit.
    #[test]
    fn exact_keys_match_the_kernel_bit_for_bit() {
        fn check<K: KeyKind>() {
            let mut next = mixed_values(0x9E37_79B9_7F4A_7C15);
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
