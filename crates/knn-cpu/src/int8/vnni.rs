//! The 8-bit form's block kernel on AVX-512 VNNI: `vpdpbusd` over 64 base points held in
//! registers, two queries a step, passing keys compressed into the queries' buffers.

use super::{Block, Buffers, LANES, NP};
use std::arch::x86_64::*;

/// Dispatches on the number of code words so the product loop is fully unrolled.
///
/// # Safety
/// AVX-512F/BW/VNNI must be available; `blk` holds `NP` panels of `quads` words per lane
/// and `q` `quads` words per query of `buf`.
#[inline]
pub(super) unsafe fn block(quads: usize, blk: &Block<'_>, q: &[u32], buf: &mut Buffers) {
    macro_rules! go {
        ($($n:literal)*) => {
            match quads {
                $($n => block_n::<$n>(blk, q, buf),)*
                _ => unreachable!("d ≤ max_dim()"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// Keys of 64 base points × every query of the unit; keys passing a query's threshold are
/// compressed into its buffer (see the module docs).
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
// `t` indexes the codes of four panels and two queries in step.
#[allow(clippy::needless_range_loop)]
unsafe fn block_n<const QUADS: usize>(blk: &Block<'_>, q: &[u32], buf: &mut Buffers) {
    let nq = buf.fill.len();
    debug_assert!(q.len() >= nq * QUADS && blk.codes.len() >= NP * QUADS * LANES);
    let bp = blk.codes.as_ptr() as *const __m512i;
    // The block's codes stay in registers for all queries (16 zmm at d = 16).
    let b: [[__m512i; QUADS]; NP] =
        std::array::from_fn(|p| std::array::from_fn(|t| _mm512_loadu_si512(bp.add(p * QUADS + t))));
    let init: [__m512i; NP] =
        std::array::from_fn(|p| _mm512_loadu_si512(blk.init.as_ptr().add(p * LANES) as *const _));
    let iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    // Two queries per step: twice the independent accumulator chains in flight.
    let mut i = 0;
    while i < nq {
        let pair = i + 1 < nq;
        let j = if pair { i + 1 } else { i };
        let (qi, qj) = (q.as_ptr().add(i * QUADS), q.as_ptr().add(j * QUADS));
        let (mut a0, mut a1, mut a2, mut a3) = (init[0], init[1], init[2], init[3]);
        let (mut c0, mut c1, mut c2, mut c3) = (init[0], init[1], init[2], init[3]);
        for t in 0..QUADS {
            let w = _mm512_set1_epi32(*qi.add(t) as i32);
            let v = _mm512_set1_epi32(*qj.add(t) as i32);
            a0 = _mm512_dpbusd_epi32(a0, b[0][t], w);
            a1 = _mm512_dpbusd_epi32(a1, b[1][t], w);
            a2 = _mm512_dpbusd_epi32(a2, b[2][t], w);
            a3 = _mm512_dpbusd_epi32(a3, b[3][t], w);
            c0 = _mm512_dpbusd_epi32(c0, b[0][t], v);
            c1 = _mm512_dpbusd_epi32(c1, b[1][t], v);
            c2 = _mm512_dpbusd_epi32(c2, b[2][t], v);
            c3 = _mm512_dpbusd_epi32(c3, b[3][t], v);
        }
        let thi = _mm512_set1_epi32(*buf.thr.get_unchecked(i));
        let thj = _mm512_set1_epi32(*buf.thr.get_unchecked(j));
        // Usually nothing passes: one compare of the lane-wise maximum per query decides.
        let ti = _mm512_max_epi32(_mm512_max_epi32(a0, a1), _mm512_max_epi32(a2, a3));
        let tj = _mm512_max_epi32(_mm512_max_epi32(c0, c1), _mm512_max_epi32(c2, c3));
        let (hi, hj) = (
            _mm512_cmpgt_epi32_mask(ti, thi),
            _mm512_cmpgt_epi32_mask(tj, thj),
        );
        if hi | hj != 0 {
            if hi != 0 {
                emit(blk, buf, i, [a0, a1, a2, a3], thi, iota);
            }
            if hj != 0 && pair {
                emit(blk, buf, j, [c0, c1, c2, c3], thj, iota);
            }
        }
        i += 2;
    }
}

/// Appends the keys of `acc` (64 base points, query `i`) above the threshold `th` to the
/// query's buffer; cuts the buffer when full.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
unsafe fn emit(
    blk: &Block<'_>,
    buf: &mut Buffers,
    i: usize,
    acc: [__m512i; NP],
    th: __m512i,
    iota: __m512i,
) {
    let mut m = 0u64;
    for (p, &a) in acc.iter().enumerate() {
        m |= (_mm512_cmpgt_epi32_mask(a, th) as u64) << (16 * p);
    }
    m &= blk.valid;
    if m == 0 {
        return;
    }
    let at = i * buf.cap;
    let mut fill = buf.fill[i];
    for (p, &a) in acc.iter().enumerate() {
        let mp = (m >> (16 * p)) as u16;
        if mp == 0 {
            continue;
        }
        // K' = parity − 2·acc, compressed with its ids.
        let par = _mm512_loadu_si512(blk.parity.as_ptr().add(p * LANES) as *const _);
        let k = _mm512_sub_epi32(par, _mm512_add_epi32(a, a));
        let ids = _mm512_add_epi32(
            _mm512_set1_epi32((blk.first + (p * LANES) as u32) as i32),
            iota,
        );
        debug_assert!(fill + LANES <= buf.cap);
        _mm512_storeu_si512(
            buf.keys.as_mut_ptr().add(at + fill) as *mut _,
            _mm512_maskz_compress_epi32(mp, k),
        );
        _mm512_storeu_si512(
            buf.ids.as_mut_ptr().add(at + fill) as *mut _,
            _mm512_maskz_compress_epi32(mp, ids),
        );
        fill += mp.count_ones() as usize;
    }
    buf.fill[i] = fill;
    if fill >= buf.limit {
        buf.cut(i);
    }
}
