//! The AVX-512 VNNI int8 fast path for squared L2 at small dimension.
//!
//! At small `d` the bf16 path spends as much time turning dot products into keys and comparing
//! them as on the products. Here coordinates are quantised once per request to 8-bit codes on a
//! common grid, `x ≈ m + s·X` (`m` the base's mid-range per dimension, `s` one step for all
//! dimensions, `X ∈ [−127, 127]`), and `vpdpbusd` (4 products of u8 × s8 per 32-bit lane, twice
//! the products of `vdpbf16ps` per instruction) computes the integer key
//!
//! `K = ‖B‖² − 2 Q·B = c_B − 2 Σ (Q_i + 128) B_i`, with `c_B = ‖B‖² + 256 Σ B_i`,
//!
//! exactly in i32, so `s²(‖Q‖² + K) = ‖q̃ − b̃‖²` is the exact squared distance of the quantised
//! points. The accumulators start at `−⌊c_B/2⌋`, so they hold `acc = dot − ⌊c_B/2⌋` and
//! `K = (c_B mod 2) − 2·acc`; `K < T` implies `acc > ⌊−T/2⌋`, one integer compare per 16 keys
//! (a filter: the list itself decides). Only keys that pass leave the registers.
//!
//! Exactness: with `E = ‖q − q̃‖ + max_b ‖b − b̃‖` (measured in f64, not assumed), the
//! triangle inequality gives `‖q − b‖² ≥ D̃ − 2√D̃·E` for `D̃ = ‖q̃ − b̃‖²`, so the w-th kept key
//! yields the floor for every point left out (see [`Plan::floor`]).

use crate::engine::BASE_TILE;
use knn_core::{CandidateRequest, MatrixRef, TopK};
use rayon::prelude::*;
use std::ops::Range;

/// Largest dimension sent to this path: `|K| ≤ 3·d·127²` stays below 2²⁴ (exact in f32 keys)
/// for `d ≤ 346`; beyond 64 the bf16 path is as fast and its relative bound tighter.
pub(crate) const MAX_DIM: usize = 64;
/// Base points per micro-kernel call.
const NR: usize = 8;
/// Queries per group (two zmm of i32 lanes).
const GROUP: usize = 32;

/// `true` when this CPU has AVX-512 VNNI (checked once; `KNN_CPU_NO_INT8` turns it off).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
                && std::env::var("KNN_CPU_NO_INT8").is_err()
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The quantised base of one request.
pub(crate) struct Plan {
    /// Grid centre `m` per dimension.
    centre: Vec<f32>,
    /// Grid step `s`, and its inverse used to round.
    step: f32,
    inv_step: f32,
    /// Words of 4 codes per point (`d.div_ceil(4)`).
    quads: usize,
    /// `quads` words per base point, codes `B_i` as i8 (zero padded).
    codes: Vec<u32>,
    /// `c_B = ‖B‖² + 256 Σ B_i` per base point.
    c: Vec<i32>,
    /// `max_b ‖b − b̃‖`, rounded up.
    base_err: f64,
}

impl Plan {
    /// Quantises `base`; `None` when the keys could overflow f32 (the bf16 path then runs).
    pub(crate) fn new(base: MatrixRef<'_>) -> Option<Self> {
        let d = base.dim();
        let (lo, hi) = base
            .as_slice()
            .par_chunks(d * 4096)
            .map(|c| {
                let (mut lo, mut hi) = (vec![f32::INFINITY; d], vec![f32::NEG_INFINITY; d]);
                for r in c.chunks(d) {
                    for i in 0..d {
                        lo[i] = lo[i].min(r[i]);
                        hi[i] = hi[i].max(r[i]);
                    }
                }
                (lo, hi)
            })
            .reduce(
                || (vec![f32::INFINITY; d], vec![f32::NEG_INFINITY; d]),
                |(mut a, mut b), (c, e)| {
                    a.iter_mut().zip(c).for_each(|(x, y)| *x = x.min(y));
                    b.iter_mut().zip(e).for_each(|(x, y)| *x = x.max(y));
                    (a, b)
                },
            );
        let centre: Vec<f32> = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &h)| ((l as f64 + h as f64) / 2.0) as f32)
            .collect();
        let half_range = lo
            .iter()
            .zip(&hi)
            .map(|(&l, &h)| (h as f64 - l as f64) / 2.0)
            .fold(0.0f64, f64::max);
        let step = if half_range > 0.0 && half_range.is_finite() {
            (half_range / 127.0) as f32
        } else {
            1.0
        };
        // Keys s²·(‖Q‖² + K) up to s²·4·d·127² must stay far from f32 overflow.
        if !(step as f64).is_normal()
            || (step as f64).powi(2) * 4.0 * d as f64 * 127.0 * 127.0 > f32::MAX as f64 / 16.0
        {
            return None;
        }
        let quads = d.div_ceil(4);
        let mut plan = Plan {
            centre,
            step,
            inv_step: 1.0 / step,
            quads,
            codes: Vec::new(),
            c: Vec::new(),
            base_err: 0.0,
        };
        let mut codes = vec![0u32; base.rows() * quads];
        let mut c = vec![0i32; base.rows()];
        let err = codes
            .par_chunks_mut(quads * 1024)
            .zip(c.par_chunks_mut(1024))
            .enumerate()
            .map(|(chunk, (codes, c))| {
                let mut worst = 0.0f64;
                let mut x = vec![0i8; quads * 4];
                for (j, (words, c)) in codes.chunks_mut(quads).zip(c).enumerate() {
                    worst = worst.max(plan.quantise(base.row(chunk * 1024 + j), &mut x));
                    let (sq, sum) = x.iter().fold((0i32, 0i32), |(s, t), &v| {
                        (s + v as i32 * v as i32, t + v as i32)
                    });
                    *c = sq + 256 * sum;
                    for (w, q) in words.iter_mut().zip(x.chunks_exact(4)) {
                        *w = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
                    }
                }
                worst
            })
            .reduce(|| 0.0, f64::max);
        plan.codes = codes;
        plan.c = c;
        plan.base_err = err.sqrt() * (1.0 + 1e-9);
        Some(plan)
    }

    /// Codes of `x` (zero padded to `quads·4`), returning `‖x − x̃‖²` in f64 (x̃ = m + s·X).
    fn quantise(&self, x: &[f32], out: &mut [i8]) -> f64 {
        out.fill(0);
        let mut err = 0.0f64;
        for (i, &v) in x.iter().enumerate() {
            // Round to nearest (even) by the 1.5·2²³ trick: no libm call, exact for |x| ≤ 127.
            let x = ((v - self.centre[i]) * self.inv_step).clamp(-127.0, 127.0);
            let code = (x + 12_582_912.0) - 12_582_912.0;
            out[i] = code as i8;
            // m + s·X and the difference are exact or within a few f64 ulps: negligible
            // next to the 1e-9 and 1e-6 margins applied to the bound.
            let e = v as f64 - (self.centre[i] as f64 + self.step as f64 * code as f64);
            err += e * e;
        }
        err
    }

    /// For one query: `(‖Q‖², s², ‖q − q̃‖ + max_b ‖b − b̃‖)`, where `s²·(‖Q‖² + K)` is the
    /// exact squared distance of the quantised points.
    pub(crate) fn query_terms(&self, q: &[f32]) -> (i64, f64, f64) {
        let mut x = vec![0i8; self.quads * 4];
        let err = self.quantise(q, &mut x);
        let sq = x.iter().map(|&v| v as i64 * v as i64).sum();
        let s = self.step as f64;
        (sq, s * s, err.sqrt() * (1.0 + 1e-9) + self.base_err)
    }

    /// A lower bound on `‖q − b‖²` for every point whose quantised squared distance is at
    /// least `dw`, given `e = ‖q − q̃‖ + max ‖b − b̃‖`: `‖q − b‖ ≥ √D̃ − e`, so
    /// `‖q − b‖² ≥ D̃ − 2√D̃·e`, which grows with `D̃` once `√D̃ ≥ e` (below, the bound is
    /// negative and 0 holds). Margins cover the f32 rounding of the reported keys (the
    /// pipeline infers its per-key slack from `key_w − floor`) and of the exact keys.
    pub(crate) fn floor(dw: f64, e: f64) -> f64 {
        dw * (1.0 - 1e-6) - 2.0 * dw.sqrt() * e * (1.0 + 1e-6) - f64::from(f32::MIN_POSITIVE)
    }
}

/// Packs queries `rows` as u8 codes `Q + 128` in groups of 32: word `(g·quads + t)·32 + l`
/// holds coordinates `4t..4t+4` of query `32g + l`; missing queries are zeros.
fn pack_queries(plan: &Plan, queries: MatrixRef<'_>, rows: Range<usize>) -> Vec<u32> {
    let quads = plan.quads;
    let groups = rows.len().div_ceil(GROUP);
    let mut out = vec![0u32; groups * quads * GROUP];
    let mut x = vec![0i8; quads * 4];
    for (i, r) in rows.enumerate() {
        let (g, l) = (i / GROUP, i % GROUP);
        plan.quantise(queries.row(r), &mut x);
        for (t, q) in x.chunks_exact(4).enumerate() {
            let u = |v: i8| (v as i32 + 128) as u8;
            out[(g * quads + t) * GROUP + l] = u32::from_le_bytes([u(q[0]), u(q[1]), u(q[2]), u(q[3])]);
        }
    }
    out
}

/// The filter value for a list threshold `t` (an integer key, or +∞): keys `K < t` have
/// `acc > ⌊−t/2⌋`.
#[inline]
fn filter(t: f32) -> i32 {
    if t == f32::INFINITY {
        i32::MIN
    } else {
        (-(t as i64)).div_euclid(2) as i32
    }
}

/// Folds the integer keys `K` of `queries[qr] × base[br]` into `tops`, like `gemm::fold_unit`.
pub(crate) fn fold_unit(
    req: &CandidateRequest<'_>,
    plan: &Plan,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let quads = plan.quads;
        let qpack = pack_queries(plan, req.queries, qr.clone());
        let nq = qr.len();
        let groups = nq.div_ceil(GROUP);
        // Padding lanes never pass (acc > i32::MAX is false).
        let mut thr = vec![i32::MAX; groups * GROUP];
        for (t, top) in thr.iter_mut().zip(tops.iter()) {
            *t = filter(top.threshold());
        }
        let skip: Vec<u32> = (0..groups * GROUP)
            .map(|i| match req.exclude {
                Some(e) if i < nq => e[qr.start + i],
                _ => u32::MAX,
            })
            .collect();
        let mut b0 = br.start;
        while b0 < br.end {
            let b1 = (b0 + BASE_TILE).min(br.end);
            for g in 0..groups {
                let q = &qpack[g * quads * GROUP..(g + 1) * quads * GROUP];
                let lists = &mut tops[g * GROUP..((g + 1) * GROUP).min(nq)];
                let thr: &mut [i32; GROUP] = (&mut thr[g * GROUP..(g + 1) * GROUP])
                    .try_into()
                    .expect("a group has 32 lanes");
                let skip = &skip[g * GROUP..(g + 1) * GROUP];
                let mut c = b0;
                while c < b1 {
                    let points = (b1 - c).min(NR);
                    let pts = Points {
                        codes: &plan.codes[c * quads..(c + points) * quads],
                        c: &plan.c[c..c + points],
                        first: c as u32,
                    };
                    // SAFETY: `available()` checked AVX-512F/BW/VNNI before this path was chosen;
                    // `q` holds quads·32 words and `pts` `points` rows of `quads` words.
                    unsafe { micro::block(quads, q, &pts, thr, skip, lists) };
                    c += points;
                }
            }
            b0 = b1;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (req, plan, qr, br, tops);
        unreachable!("int8 path is only chosen on x86-64");
    }
}

/// Up to [`NR`] consecutive base points for one micro-kernel call.
struct Points<'a> {
    codes: &'a [u32],
    c: &'a [i32],
    first: u32,
}

#[cfg(target_arch = "x86_64")]
mod micro {
    use super::{filter, Points, GROUP, NR};
    use knn_core::TopK;
    use std::arch::x86_64::*;

    /// Dispatches on the number of code words so the product loop is fully unrolled.
    ///
    /// # Safety
    /// AVX-512F/BW/VNNI must be available; `q` holds `quads·32` words, `pts.codes`
    /// `pts.c.len() · quads` (1 ≤ `pts.c.len()` ≤ 8).
    #[inline]
    pub(super) unsafe fn block(
        quads: usize,
        q: &[u32],
        pts: &Points<'_>,
        thr: &mut [i32; GROUP],
        skip: &[u32],
        tops: &mut [TopK],
    ) {
        macro_rules! go {
            ($($n:literal)*) => {
                match quads {
                    $($n => block_n::<$n>(q, pts, thr, skip, tops),)*
                    _ => unreachable!("d ≤ MAX_DIM"),
                }
            };
        }
        go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
    }

    /// Integer keys of up to 8 base points × 32 queries, folded into `tops` (see the module
    /// docs for `acc`, the filter and `K`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn block_n<const QUADS: usize>(
        q: &[u32],
        pts: &Points<'_>,
        thr: &mut [i32; GROUP],
        skip: &[u32],
        tops: &mut [TopK],
    ) {
        let points = pts.c.len();
        debug_assert!(q.len() >= QUADS * GROUP && pts.codes.len() >= points * QUADS);
        let bp = pts.codes.as_ptr();
        // Points beyond `points` repeat the last one: same cost, results ignored.
        let row: [*const u32; NR] = std::array::from_fn(|p| bp.add(p.min(points - 1) * QUADS));
        let init: [__m512i; NR] =
            std::array::from_fn(|p| _mm512_set1_epi32(-(pts.c[p.min(points - 1)] >> 1)));
        let qp = q.as_ptr();
        let (mut a00, mut a01, mut a10, mut a11) = (init[0], init[0], init[1], init[1]);
        let (mut a20, mut a21, mut a30, mut a31) = (init[2], init[2], init[3], init[3]);
        let (mut a40, mut a41, mut a50, mut a51) = (init[4], init[4], init[5], init[5]);
        let (mut a60, mut a61, mut a70, mut a71) = (init[6], init[6], init[7], init[7]);
        for t in 0..QUADS {
            let q0 = _mm512_loadu_si512(qp.add(t * GROUP) as *const _);
            let q1 = _mm512_loadu_si512(qp.add(t * GROUP + 16) as *const _);
            macro_rules! step {
                ($p:expr, $x0:ident, $x1:ident) => {
                    let b = _mm512_set1_epi32(*row[$p].add(t) as i32);
                    $x0 = _mm512_dpbusd_epi32($x0, q0, b);
                    $x1 = _mm512_dpbusd_epi32($x1, q1, b);
                };
            }
            step!(0, a00, a01);
            step!(1, a10, a11);
            step!(2, a20, a21);
            step!(3, a30, a31);
            step!(4, a40, a41);
            step!(5, a50, a51);
            step!(6, a60, a61);
            step!(7, a70, a71);
        }
        // Usually no key passes: test the lane-wise maximum over the 8 points first.
        let t0 = _mm512_loadu_si512(thr.as_ptr() as *const _);
        let t1 = _mm512_loadu_si512(thr.as_ptr().add(16) as *const _);
        let m = |a: __m512i, b: __m512i| _mm512_max_epi32(a, b);
        let x0 = m(m(m(a00, a10), m(a20, a30)), m(m(a40, a50), m(a60, a70)));
        let x1 = m(m(m(a01, a11), m(a21, a31)), m(m(a41, a51), m(a61, a71)));
        if _mm512_cmpgt_epi32_mask(x0, t0) == 0 && _mm512_cmpgt_epi32_mask(x1, t1) == 0 {
            return;
        }
        let acc = [
            [a00, a01],
            [a10, a11],
            [a20, a21],
            [a30, a31],
            [a40, a41],
            [a50, a51],
            [a60, a61],
            [a70, a71],
        ];
        let (mut t0, mut t1) = (t0, t1);
        for (p, acc) in acc.iter().enumerate().take(points) {
            let m0 = _mm512_cmpgt_epi32_mask(acc[0], t0);
            let m1 = _mm512_cmpgt_epi32_mask(acc[1], t1);
            let mut mask = (m0 as u32) | ((m1 as u32) << 16);
            if mask == 0 {
                continue;
            }
            let mut vals = [0i32; GROUP];
            _mm512_storeu_si512(vals.as_mut_ptr() as *mut _, acc[0]);
            _mm512_storeu_si512(vals.as_mut_ptr().add(16) as *mut _, acc[1]);
            let id = pts.first + p as u32;
            let odd = pts.c[p] & 1;
            while mask != 0 {
                let l = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if skip[l] != id {
                    tops[l].push((odd - 2 * vals[l]) as f32, id);
                    thr[l] = filter(tops[l].threshold());
                }
            }
            t0 = _mm512_loadu_si512(thr.as_ptr() as *const _);
            t1 = _mm512_loadu_si512(thr.as_ptr().add(16) as *const _);
        }
    }
}
