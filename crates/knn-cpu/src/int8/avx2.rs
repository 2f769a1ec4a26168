//! The AVX2 form of [`super::vnni`]: the same block of `NP` panels, each panel's 16 lanes in two
//! ymm vectors, taken in parts against two queries at a time.

use super::{Block, Buffers, LANES, NP};
use std::arch::x86_64::*;

/// The block's keys for squared L2 (`L1` false) or L1, dispatched on the number of code
/// words so the word loop is unrolled.
///
/// # Safety
/// AVX2 must be available; `blk` holds `NP` panels of `quads` words per lane and `q`
/// `quads` words per query of `buf`, 16-bit codes.
#[inline]
pub(super) unsafe fn block<const L1: bool>(
    quads: usize,
    blk: &Block<'_>,
    q: &[u32],
    buf: &mut Buffers,
) {
    macro_rules! go {
        ($($n:literal)*) => {
            match quads {
                // Squared L2: two halves of 32 points; L1 (twice the registers a vector:
                // its 16-bit sums) four parts of 16.
                $($n if L1 => block_n::<$n, 2, true>(blk, q, buf),
                  $n => block_n::<$n, 4, false>(blk, q, buf),)*
                _ => unreachable!("d ≤ max_dim()"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64)
}

/// Keys of 64 base points × every query of the unit, in parts of `PART` vectors of 8
/// points, each against two queries at a time (each code vector loaded once for both).
/// Squared L2, as `vnni::block_n`: per code word, `vpmaddwd` adds each lane's two i16 ×
/// i16 products into 32 bits. L1: `acc = Σmin(Q, B) − ⌊ΣB/2⌋`, per code word `vpminsw`
/// and a 16-bit add; every `RUN` words the 16-bit sums (at most `RUN·2047 < 2¹⁵` each) go
/// into the 32-bit lanes by `vpmaddwd` by ones.
#[target_feature(enable = "avx2")]
#[allow(clippy::needless_range_loop)]
unsafe fn block_n<const QUADS: usize, const PART: usize, const L1: bool>(
    blk: &Block<'_>,
    q: &[u32],
    buf: &mut Buffers,
) {
    const RUN: usize = 8;
    let nq = buf.fill.len();
    debug_assert!(q.len() >= nq * QUADS && blk.codes.len() >= NP * QUADS * LANES);
    let bp = blk.codes.as_ptr();
    let (ones, zero) = (_mm256_set1_epi16(1), _mm256_setzero_si256());
    for part in 0..2 * NP / PART {
        let init: [__m256i; PART] = std::array::from_fn(|h| {
            _mm256_loadu_si256(blk.init.as_ptr().add((part * PART + h) * 8) as *const _)
        });
        // Vector h of this part: lanes 8·(v % 2).. of panel v / 2, v = part·PART + h.
        let at: [usize; PART] = std::array::from_fn(|h| {
            let v = part * PART + h;
            (v / 2) * QUADS * LANES + 8 * (v % 2)
        });
        let mut i = 0;
        while i < nq {
            let pair = i + 1 < nq;
            let j = if pair { i + 1 } else { i };
            let (qi, qj) = (q.as_ptr().add(i * QUADS), q.as_ptr().add(j * QUADS));
            let (mut a, mut c) = (init, init);
            let mut t = 0;
            while t < QUADS {
                let end = (t + RUN).min(QUADS);
                let (mut sa, mut sc) = ([zero; PART], [zero; PART]);
                for u in t..end {
                    let w = _mm256_set1_epi32(*qi.add(u) as i32);
                    let v = _mm256_set1_epi32(*qj.add(u) as i32);
                    for h in 0..PART {
                        let b = _mm256_loadu_si256(bp.add(at[h] + u * LANES) as *const __m256i);
                        if L1 {
                            sa[h] = _mm256_add_epi16(sa[h], _mm256_min_epi16(b, w));
                            sc[h] = _mm256_add_epi16(sc[h], _mm256_min_epi16(b, v));
                        } else {
                            a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(b, w));
                            c[h] = _mm256_add_epi32(c[h], _mm256_madd_epi16(b, v));
                        }
                    }
                }
                if L1 {
                    for h in 0..PART {
                        a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(sa[h], ones));
                        c[h] = _mm256_add_epi32(c[h], _mm256_madd_epi16(sc[h], ones));
                    }
                }
                t = end;
            }
            for (x, row) in [(&a, i), (&c, j)].into_iter().take(1 + pair as usize) {
                let th = _mm256_set1_epi32(*buf.thr.get_unchecked(row));
                // Usually nothing passes: one compare of the lane-wise maximum decides.
                let mut top = x[0];
                for &y in &x[1..] {
                    top = _mm256_max_epi32(top, y);
                }
                if _mm256_movemask_epi8(_mm256_cmpgt_epi32(top, th)) != 0 {
                    emit(blk, buf, row, x, part * PART, th);
                }
            }
            i += 2;
        }
    }
}

/// Appends the keys of `acc` (vectors `first..` of the block's eight, query `i`) above the
/// threshold `th` to the query's buffer; cuts the buffer when full.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn emit(
    blk: &Block<'_>,
    buf: &mut Buffers,
    i: usize,
    acc: &[__m256i],
    first: usize,
    th: __m256i,
) {
    let at = i * buf.cap;
    let mut fill = buf.fill[i];
    for (h, &a) in (first..).zip(acc) {
        let lanes = (blk.valid >> (8 * h)) as u32 & 0xff;
        let mut m =
            _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, th))) as u32 & lanes;
        if m == 0 {
            continue;
        }
        // K' = parity − 2·acc.
        let par = _mm256_loadu_si256(blk.parity.as_ptr().add(h * 8) as *const _);
        let mut k = [0i32; 8];
        _mm256_storeu_si256(
            k.as_mut_ptr() as *mut _,
            _mm256_sub_epi32(par, _mm256_add_epi32(a, a)),
        );
        let first = blk.first + (h * 8) as u32;
        debug_assert!(fill + 8 <= buf.cap);
        while m != 0 {
            let l = m.trailing_zeros() as usize;
            *buf.keys.get_unchecked_mut(at + fill) = k[l];
            *buf.ids.get_unchecked_mut(at + fill) = first + l as u32;
            fill += 1;
            m &= m - 1;
        }
    }
    buf.fill[i] = fill;
    if fill >= buf.limit {
        buf.cut(i);
    }
}
