//! The AVX-512 BF16 fast path for GEMM-form keys.
//!
//! `vdpbf16ps` multiplies pairs of bf16 values and accumulates in f32 at twice the rate of f32
//! FMAs. Inputs rounded to bf16 (8 significant bits) make keys coarser, so the engine reports a
//! correspondingly wider error bound ([`knn_core::Kernel::error_bound`] with
//! `u_in = BF16_UNIT`); the pipeline's exact re-rank keeps results exact. For squared L2 the
//! data is centred on the base mean first, which shrinks norms and so the bound.
//!
//! Layout: queries sit in SIMD lanes, 32 per group (two zmm), packed once per work unit as
//! words of two bf16 (coordinates `2t`, `2t+1`); base points are converted row by row (a plain
//! SIMD conversion, no transposition) and broadcast one word at a time. The micro-kernel
//! computes an 8-point × 32-query block of dot products in 16 zmm accumulators and folds it
//! straight into the queries' top-k lists, comparing 16 keys with 16 thresholds at once.
//! Where the CPU has AMX tiles (`amx.rs`), they compute 32-point × 32-query blocks of the
//! same products instead, folded the same way.

use crate::engine::{GemmPlan, BASE_TILE};
use knn_core::{CandidateRequest, Kernel, MatrixRef, TopK};
use std::ops::Range;

/// Unit roundoff of rounding f32 to bf16 (8 significant bits).
pub(crate) const BF16_UNIT: f64 = 1.0 / 256.0;
/// Base points per micro-kernel call.
const NR: usize = 8;
/// Queries per group (two zmm of f32 lanes).
const GROUP: usize = 32;

/// `true` when this CPU has AVX-512 BF16 (checked once; `CpuEngine::f32_only` keeps an engine
/// off it).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// f32 → bf16, round to nearest even (inputs are finite and far below the overflow range).
#[inline]
fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

#[inline]
fn pair(a: f32, b: f32) -> u32 {
    to_bf16(a) as u32 | ((to_bf16(b) as u32) << 16)
}

/// Packs queries `rows` (dim `d`), centred on `mean`, in groups of 32: word
/// `(g·pairs + t)·32 + l` holds coordinates `2t`, `2t+1` of query `32g + l`; missing queries
/// and coordinates (`pairs ≥ d.div_ceil(2)`) are zeros.
fn pack_queries(
    data: &[f32],
    d: usize,
    pairs: usize,
    rows: Range<usize>,
    mean: Option<&[f32]>,
) -> Vec<u32> {
    let groups = rows.len().div_ceil(GROUP);
    let mut out = vec![0u32; groups * pairs * GROUP];
    for (i, r) in rows.enumerate() {
        let (g, l) = (i / GROUP, i % GROUP);
        let x = &data[r * d..(r + 1) * d];
        let v = |c: usize| {
            if c < d {
                x[c] - mean.map_or(0.0, |m| m[c])
            } else {
                0.0
            }
        };
        for t in 0..pairs {
            out[(g * pairs + t) * GROUP + l] = pair(v(2 * t), v(2 * t + 1));
        }
    }
    out
}

/// Folds the keys of `queries[qr] × base[br]` into `tops`, like `gemm::fold_unit`.
pub(crate) fn fold_unit(
    req: &CandidateRequest<'_>,
    plan: &GemmPlan,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
) {
    #[cfg(target_arch = "x86_64")]
    {
        let d = req.base.dim();
        let amx = crate::amx::available();
        // AMX tiles take 16 pairs per step.
        let pairs = match amx {
            true => d.div_ceil(2).next_multiple_of(crate::amx::PAIRS_PER_STEP),
            false => d.div_ceil(2),
        };
        let zero = vec![0.0f32; d];
        let mean = plan.mean.as_deref().unwrap_or(&zero);
        let qpack = pack_queries(
            req.queries.as_slice(),
            d,
            pairs,
            qr.clone(),
            plan.mean.as_deref(),
        );
        let nq = qr.len();
        let groups = nq.div_ceil(GROUP);
        let sql2 = req.kernel == Kernel::SqL2;
        let scale = if sql2 { -2.0f32 } else { -1.0 };
        // Per-query thresholds, kept equal to the lists' (−∞ on padding lanes: never pushed).
        let mut thr = vec![f32::NEG_INFINITY; groups * GROUP];
        for (t, top) in thr.iter_mut().zip(tops.iter()) {
            *t = top.threshold();
        }
        let skip: Vec<u32> = (0..groups * GROUP)
            .map(|i| match req.exclude {
                Some(e) if i < nq => e[qr.start + i],
                _ => u32::MAX,
            })
            .collect();
        // Rows past the tile's end stay zero (AMX blocks read 32 rows).
        let mut bpack = vec![0u32; BASE_TILE.next_multiple_of(crate::amx::BLOCK) * pairs];
        // SAFETY: `amx` says the tiles are available and granted.
        let tiles = amx.then(|| unsafe { crate::amx::Tiles::load() });
        let mut block = [[0.0f32; GROUP]; crate::amx::BLOCK];
        let no_norms = [0.0f32; BASE_TILE];
        let mut b0 = br.start;
        while b0 < br.end {
            let b1 = (b0 + BASE_TILE).min(br.end);
            let nb = b1 - b0;
            // What each point's keys add: its squared norm (squared L2) or nothing.
            let adds = match sql2 {
                true => &plan.norms.sq[b0..b1],
                false => &no_norms[..nb],
            };
            // SAFETY: `available()` checked AVX-512F and AVX-512 BF16 before this path was chosen;
            // every slice passed holds the sizes documented on the called functions.
            unsafe {
                micro::convert_rows(
                    &req.base.as_slice()[b0 * d..b1 * d],
                    d,
                    mean,
                    &mut bpack[..nb * pairs],
                    pairs,
                );
                if tiles.is_some() {
                    // The tile's last rows may hold an earlier tile's: zero them.
                    bpack[nb * pairs..].fill(0);
                }
                for g in 0..groups {
                    let q = &qpack[g * pairs * GROUP..(g + 1) * pairs * GROUP];
                    let lists = &mut tops[g * GROUP..((g + 1) * GROUP).min(nq)];
                    let (thr, skip) = (
                        &mut thr[g * GROUP..(g + 1) * GROUP],
                        &skip[g * GROUP..(g + 1) * GROUP],
                    );
                    if let Some(tiles) = &tiles {
                        for c in (0..nb).step_by(crate::amx::BLOCK) {
                            let points = (nb - c).min(crate::amx::BLOCK);
                            let b = bpack[c * pairs..].as_ptr();
                            tiles.dots(q.as_ptr(), b, pairs, pairs, &mut block);
                            let rows = (&block[..points], &adds[c..c + points]);
                            micro::fold_rows(rows, scale, (b0 + c) as u32, thr, skip, lists);
                        }
                        continue;
                    }
                    for c in (0..nb).step_by(NR) {
                        let points = (nb - c).min(NR);
                        micro::block(
                            q,
                            pairs,
                            &bpack[c * pairs..(c + points) * pairs],
                            points,
                            &adds[c..c + points],
                            scale,
                            (b0 + c) as u32,
                            thr,
                            skip,
                            lists,
                        );
                    }
                }
            }
            b0 = b1;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (req, plan, qr, br, tops);
        unreachable!("bf16 path is only chosen on x86-64");
    }
}

/// Every point of a symmetric self-join in both bf16 layouts, made once: as queries (groups of
/// 32 in lanes, see `pack_queries`) and as base rows (see `micro::convert_rows`), centred on
/// the plan's mean.
pub(crate) struct PackedPoints {
    queries: Vec<u32>,
    rows: Vec<u32>,
    pairs: usize,
}

impl PackedPoints {
    /// Packs `points` for `plan` (whose `bf16` is set, so AVX-512 BF16 is available); for AMX
    /// tiles when available (pairs padded to 16, a block of zero rows after the last).
    pub(crate) fn new(points: MatrixRef<'_>, plan: &GemmPlan) -> Self {
        let (n, d) = (points.rows(), points.dim());
        let (pairs, spare) = match crate::amx::available() {
            true => (
                d.div_ceil(2).next_multiple_of(crate::amx::PAIRS_PER_STEP),
                crate::amx::BLOCK,
            ),
            false => (d.div_ceil(2), 0),
        };
        let queries = pack_queries(points.as_slice(), d, pairs, 0..n, plan.mean.as_deref());
        let mut rows = vec![0u32; (n + spare) * pairs];
        #[cfg(target_arch = "x86_64")]
        {
            let zero = vec![0.0f32; d];
            let mean = plan.mean.as_deref().unwrap_or(&zero);
            // SAFETY: the plan's bf16 path was chosen after `available()` checked AVX-512F and
            // AVX-512 BF16; `rows` holds `n · pairs` words.
            unsafe {
                micro::convert_rows(points.as_slice(), d, mean, &mut rows[..n * pairs], pairs)
            };
        }
        PackedPoints {
            queries,
            rows,
            pairs,
        }
    }
}

/// Symmetric self-join: folds the keys of the block pair `ri × rj` of the packed points into
/// both sides' lists (see [`crate::symmetric`]); on the diagonal (`ri == rj`) only pairs
/// `i < j`. `ri.start` is a multiple of 32 (blocks are). Returns the number of pair keys
/// computed.
pub(crate) fn fold_pair(
    packed: &PackedPoints,
    kernel: Kernel,
    plan: &GemmPlan,
    ri: Range<usize>,
    rj: Range<usize>,
    sides: &mut crate::symmetric::Sides<'_>,
) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        debug_assert_eq!(ri.start % GROUP, 0);
        let pairs = packed.pairs;
        let (ni, nj) = (ri.len(), rj.len());
        let groups = ni.div_ceil(GROUP);
        let sql2 = kernel == Kernel::SqL2;
        let scale = if sql2 { -2.0f32 } else { -1.0 };
        let sq = |i: usize| if sql2 { plan.norms.sq[i] } else { 0.0 };
        let diagonal = sides.is_diagonal();
        let bpack = &packed.rows[rj.start * pairs..];
        let mut computed = 0u64;
        // SAFETY: `PackedPoints` was packed for the tiles when they are available.
        let tiles = crate::amx::available().then(|| unsafe { crate::amx::Tiles::load() });
        let mut block = [[0.0f32; GROUP]; crate::amx::BLOCK];
        for g in 0..groups {
            let first = ri.start / GROUP + g;
            let q = &packed.queries[first * pairs * GROUP..(first + 1) * pairs * GROUP];
            let a0 = g * GROUP;
            let lanes = (ni - a0).min(GROUP);
            let qsq: [f32; GROUP] = std::array::from_fn(|l| {
                if l < lanes {
                    sq(ri.start + a0 + l)
                } else {
                    0.0
                }
            });
            if let Some(tiles) = &tiles {
                for c in (0..nj).step_by(crate::amx::BLOCK) {
                    let points = (nj - c).min(crate::amx::BLOCK);
                    if diagonal && c + points <= a0 + 1 {
                        continue;
                    }
                    let bsq: Vec<f32> = (0..points).map(|p| sq(rj.start + c + p)).collect();
                    // SAFETY: the rows hold a spare block after the last point (`new`), `q`
                    // a group; the sides' thresholds as for `block_sym`.
                    unsafe {
                        tiles.dots(
                            q.as_ptr(),
                            bpack[c * pairs..].as_ptr(),
                            pairs,
                            pairs,
                            &mut block,
                        );
                        micro::fold_sym_rows(
                            (&block[..points], &bsq),
                            &qsq,
                            scale,
                            lanes,
                            (a0, c),
                            sides,
                        );
                    }
                    computed += (lanes * points) as u64;
                }
                continue;
            }
            for c in (0..nj).step_by(NR) {
                let points = (nj - c).min(NR);
                // On the diagonal, blocks with every column at or before every row hold no
                // pair `i < j`.
                if diagonal && c + points <= a0 + 1 {
                    continue;
                }
                let add: [f32; NR] = std::array::from_fn(|p| {
                    if p < points {
                        sq(rj.start + c + p)
                    } else {
                        0.0
                    }
                });
                // SAFETY: `PackedPoints` exists only where AVX-512 BF16 is available; `q`
                // holds a group, `bpack` `points` rows from `c`; the sides' row thresholds are
                // padded to whole groups.
                unsafe {
                    micro::block_sym(
                        q,
                        pairs,
                        &bpack[c * pairs..(c + points) * pairs],
                        points,
                        &qsq,
                        &add,
                        scale,
                        lanes,
                        (a0, c),
                        sides,
                    );
                }
                computed += (lanes * points) as u64;
            }
        }
        computed
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (packed, kernel, plan, ri, rj, sides);
        unreachable!("bf16 path is only chosen on x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
mod micro {
    use super::{GROUP, NR};
    use knn_core::TopK;
    use std::arch::x86_64::*;

    /// Converts rows of `x` (dim `d`) minus `mean` to bf16 pairs: `out` gets `pairs` words
    /// per row (`pairs ≥ d.div_ceil(2)`; words past the row's values are zeros).
    ///
    /// # Safety
    /// AVX-512F and AVX-512 BF16 must be available; `out.len() == rows · pairs`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn convert_rows(
        x: &[f32],
        d: usize,
        mean: &[f32],
        out: &mut [u32],
        pairs: usize,
    ) {
        let rows = x.len() / d;
        debug_assert!(out.len() == rows * pairs && pairs >= d.div_ceil(2));
        if pairs > d.div_ceil(2) {
            out.fill(0);
        }
        let mut tmp = [0u16; 32];
        for r in 0..rows {
            let row = x.as_ptr().add(r * d);
            let dst = out.as_mut_ptr().add(r * pairs) as *mut u16;
            let mut c = 0;
            while c < d {
                let n = (d - c).min(32);
                let m_lo: __mmask16 = if n >= 16 {
                    0xFFFF
                } else {
                    ((1u32 << n) - 1) as u16
                };
                let m_hi: __mmask16 = if n >= 32 {
                    0xFFFF
                } else if n > 16 {
                    ((1u32 << (n - 16)) - 1) as u16
                } else {
                    0
                };
                let lo = _mm512_sub_ps(
                    _mm512_maskz_loadu_ps(m_lo, row.add(c)),
                    _mm512_maskz_loadu_ps(m_lo, mean.as_ptr().add(c)),
                );
                let hi = if m_hi != 0 {
                    _mm512_sub_ps(
                        _mm512_maskz_loadu_ps(m_hi, row.add(c + 16)),
                        _mm512_maskz_loadu_ps(m_hi, mean.as_ptr().add(c + 16)),
                    )
                } else {
                    _mm512_setzero_ps()
                };
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                if n == 32 {
                    _mm512_storeu_si512(dst.add(c) as *mut _, v);
                } else {
                    // Last, partial chunk: n values, plus a zero to complete an odd pair.
                    _mm512_storeu_si512(tmp.as_mut_ptr() as *mut _, v);
                    let words = n.div_ceil(2) * 2;
                    std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst.add(c), words);
                }
                c += 32;
            }
        }
    }

    /// Dot products of `points ≤ 8` converted base rows (`pairs` words each) with one group of
    /// 32 packed queries, folded into `tops`: key = `add[p] + scale·dot` (`add`: one value per
    /// point), pushed where below the query's threshold `thr[l]` (kept up to date) and not
    /// `skip[l]`.
    ///
    /// # Safety
    /// AVX-512F and AVX-512 BF16 must be available; `q` holds `pairs·32` words, `b`
    /// `points·pairs`, `thr` and `skip` 32 entries, `tops` at most 32 lists (lanes beyond have
    /// threshold −∞).
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block(
        q: &[u32],
        pairs: usize,
        b: &[u32],
        points: usize,
        add: &[f32],
        scale: f32,
        first: u32,
        thr: &mut [f32],
        skip: &[u32],
        tops: &mut [TopK],
    ) {
        debug_assert!(q.len() >= pairs * GROUP && b.len() >= points * pairs && thr.len() == GROUP);
        debug_assert_eq!(add.len(), points);
        let acc = dots(q, pairs, b, points);
        for p in 0..points {
            let id = first + p as u32;
            fold_point(acc[p], add[p], scale, id, thr, skip, tops);
        }
    }

    /// [`block`]'s fold of dot products computed elsewhere (AMX tiles): `rows.0[p]` holds
    /// point `first + p`'s 32 dot products, `rows.1[p]` its added norm.
    ///
    /// # Safety
    /// AVX-512F must be available; `thr`, `skip` as for [`block`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn fold_rows(
        (rows, add): (&[[f32; GROUP]], &[f32]),
        scale: f32,
        first: u32,
        thr: &mut [f32],
        skip: &[u32],
        tops: &mut [TopK],
    ) {
        for (p, (row, &a)) in rows.iter().zip(add).enumerate() {
            let acc = [
                _mm512_loadu_ps(row.as_ptr()),
                _mm512_loadu_ps(row.as_ptr().add(16)),
            ];
            fold_point(acc, a, scale, first + p as u32, thr, skip, tops);
        }
    }

    /// One point's keys `add + scale·dot` (32 query lanes) pushed where below the lane's
    /// threshold `thr[l]` (kept up to date) and not `skip[l]`.
    #[inline(always)]
    unsafe fn fold_point(
        acc: [__m512; 2],
        add: f32,
        scale: f32,
        id: u32,
        thr: &mut [f32],
        skip: &[u32],
        tops: &mut [TopK],
    ) {
        // SAFETY: the callers enable AVX-512F; `thr` holds 32 values.
        unsafe {
            let (vscale, vadd) = (_mm512_set1_ps(scale), _mm512_set1_ps(add));
            let k0 = _mm512_fmadd_ps(acc[0], vscale, vadd);
            let k1 = _mm512_fmadd_ps(acc[1], vscale, vadd);
            let m0 = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(k0, _mm512_loadu_ps(thr.as_ptr()));
            let m1 = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(k1, _mm512_loadu_ps(thr.as_ptr().add(16)));
            let mut mask = (m0 as u32) | ((m1 as u32) << 16);
            if mask == 0 {
                return;
            }
            let mut keys = [0.0f32; GROUP];
            _mm512_storeu_ps(keys.as_mut_ptr(), k0);
            _mm512_storeu_ps(keys.as_mut_ptr().add(16), k1);
            while mask != 0 {
                let l = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if skip[l] != id {
                    tops[l].push(keys[l], id);
                    thr[l] = tops[l].threshold();
                }
            }
        }
    }

    /// The 8 × 32 block of dot products of `points ≤ 8` converted base rows (`pairs` words
    /// each) with one group of 32 packed queries: `[point][query vector]`. Inlined into its
    /// callers, which enable AVX-512 BF16.
    ///
    /// # Safety
    /// AVX-512F and AVX-512 BF16 must be available; `q` holds `pairs·32` words, `b`
    /// `points·pairs`, `1 ≤ points ≤ 8`.
    #[inline(always)]
    unsafe fn dots(q: &[u32], pairs: usize, b: &[u32], points: usize) -> [[__m512; 2]; NR] {
        // SAFETY: forwarded from the caller; every pointer stays inside `q` or `b`.
        unsafe {
            let bp = b.as_ptr();
            // Points beyond `points` repeat the last one: same cost, results ignored.
            let row: [*const u32; NR] = std::array::from_fn(|p| bp.add(p.min(points - 1) * pairs));
            let qp = q.as_ptr();
            // Sixteen named accumulators (8 points × 2 query vectors) so they all stay in
            // registers.
            let z = _mm512_setzero_ps();
            let (mut a00, mut a01, mut a10, mut a11, mut a20, mut a21, mut a30, mut a31) =
                (z, z, z, z, z, z, z, z);
            let (mut a40, mut a41, mut a50, mut a51, mut a60, mut a61, mut a70, mut a71) =
                (z, z, z, z, z, z, z, z);
            for t in 0..pairs {
                let q0: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(qp.add(t * GROUP) as *const _));
                let q1: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(qp.add(t * GROUP + 16) as *const _));
                macro_rules! step {
                    ($p:expr, $x0:ident, $x1:ident) => {
                        let a: __m512bh =
                            std::mem::transmute(_mm512_set1_epi32(*row[$p].add(t) as i32));
                        $x0 = _mm512_dpbf16_ps($x0, a, q0);
                        $x1 = _mm512_dpbf16_ps($x1, a, q1);
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
            [
                [a00, a01],
                [a10, a11],
                [a20, a21],
                [a30, a31],
                [a40, a41],
                [a50, a51],
                [a60, a61],
                [a70, a71],
            ]
        }
    }

    /// The symmetric form of [`block`]: the keys of one group of 32 row points (lanes, local
    /// indices `a0..a0 + 32` of `sides`' rows) against `points ≤ 8` column points (local indices
    /// `b0..` of its columns), each folded into **both** lists: the row's (id of the column) and
    /// the column's (id of the row). Keys are whole: `qsq[l] + bsq[p] + scale·dot` (the squared
    /// norms are zero for the inner product), so a pair's key is the same number for both.
    /// Lanes from `lanes` on are padding; on the diagonal only pairs with row < column count.
    ///
    /// # Safety
    /// AVX-512F and AVX-512 BF16 must be available; `q`, `b` as for [`block`]; `qsq` holds 32
    /// values; `sides`' row thresholds hold `a0 + 32` values, its columns `b0 + points`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn block_sym(
        q: &[u32],
        pairs: usize,
        b: &[u32],
        points: usize,
        qsq: &[f32],
        bsq: &[f32; NR],
        scale: f32,
        lanes: usize,
        (a0, b0): (usize, usize),
        sides: &mut crate::symmetric::Sides<'_>,
    ) {
        let acc = dots(q, pairs, b, points);
        for p in 0..points {
            fold_sym_point(acc[p], bsq[p], qsq, scale, lanes, (a0, b0 + p), sides);
        }
    }

    /// [`block_sym`]'s fold of dot products computed elsewhere (AMX tiles): `rows.0[p]` holds
    /// column `b0 + p`'s 32 dot products with the group's rows, `rows.1[p]` its squared norm.
    ///
    /// # Safety
    /// AVX-512F must be available; `qsq` and `sides` as for [`block_sym`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn fold_sym_rows(
        (rows, bsq): (&[[f32; GROUP]], &[f32]),
        qsq: &[f32],
        scale: f32,
        lanes: usize,
        (a0, b0): (usize, usize),
        sides: &mut crate::symmetric::Sides<'_>,
    ) {
        for (p, (row, &b)) in rows.iter().zip(bsq).enumerate() {
            let acc = [
                _mm512_loadu_ps(row.as_ptr()),
                _mm512_loadu_ps(row.as_ptr().add(16)),
            ];
            fold_sym_point(acc, b, qsq, scale, lanes, (a0, b0 + p), sides);
        }
    }

    /// One column's keys `qsq[l] + bsq + scale·dot` against the group's 32 row lanes, folded
    /// into both sides' lists (see [`block_sym`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn fold_sym_point(
        acc: [__m512; 2],
        bsq: f32,
        qsq: &[f32],
        scale: f32,
        lanes: usize,
        (a0, bl): (usize, usize),
        sides: &mut crate::symmetric::Sides<'_>,
    ) {
        // SAFETY: the callers enable AVX-512F; `qsq` holds 32 values, the sides' row
        // thresholds `a0 + 32`, its columns `bl + 1`.
        unsafe {
            let vscale = _mm512_set1_ps(scale);
            let q0 = _mm512_loadu_ps(qsq.as_ptr());
            let q1 = _mm512_loadu_ps(qsq.as_ptr().add(16));
            let valid: u32 = if lanes >= GROUP {
                u32::MAX
            } else {
                (1u32 << lanes) - 1
            };
            let diagonal = sides.is_diagonal();
            // On the diagonal only rows before the column (`a0 + l < bl`).
            let lanes_before = if !diagonal || bl >= a0 + GROUP {
                u32::MAX
            } else if bl <= a0 {
                0
            } else {
                (1u32 << (bl - a0)) - 1
            };
            let vb = _mm512_set1_ps(bsq);
            let k0 = _mm512_fmadd_ps(acc[0], vscale, _mm512_add_ps(q0, vb));
            let k1 = _mm512_fmadd_ps(acc[1], vscale, _mm512_add_ps(q1, vb));
            // `≤`: the lists decide ties by id (pushes arrive in no particular id order).
            let thr = sides.row_thr()[a0..a0 + GROUP].as_ptr();
            let r0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(k0, _mm512_loadu_ps(thr));
            let r1 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(k1, _mm512_loadu_ps(thr.add(16)));
            let vc = _mm512_set1_ps(sides.col_thr()[bl]);
            let c0 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(k0, vc);
            let c1 = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(k1, vc);
            let mut rmask = ((r0 as u32) | ((r1 as u32) << 16)) & valid & lanes_before;
            let mut cmask = ((c0 as u32) | ((c1 as u32) << 16)) & valid & lanes_before;
            if rmask | cmask == 0 {
                return;
            }
            let mut keys = [0.0f32; GROUP];
            _mm512_storeu_ps(keys.as_mut_ptr(), k0);
            _mm512_storeu_ps(keys.as_mut_ptr().add(16), k1);
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
