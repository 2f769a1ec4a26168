//! The few vector operations the micro-kernels need ([`Simd`]), for plain f32 and, on x86-64,
//! AVX-512 and AVX2 + FMA, with the `target_feature` entry points that compile the kernels of
//! [`super`] and [`super::pair`] for each instruction set.

/// The few vector operations the micro-kernel needs, on `LANES` f32 lanes.
///
/// Every method is `unsafe`: it may only run on a CPU with the instruction set of the
/// implementation (checked by [`super::fold_unit`] before it enters the matching `target_feature`
/// function, into which these `inline(always)` bodies are inlined).
pub(super) trait Simd {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn min(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn abs(a: Self::V) -> Self::V;
    /// `a + x` computed by a fused multiply-add `x·1 + a` (the same single rounding as an
    /// addition), which runs on the FMA pipes and leaves the adder pipes to `min`/`sub`.
    unsafe fn add_on_fma(a: Self::V, x: Self::V) -> Self::V;
    /// `a·b + c` (one rounding where the CPU fuses it; two for the scalar fallback).
    unsafe fn mul_add(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `min` of the lanes read as signed 32-bit integers: the float minimum when neither is
    /// negative (`−0.0` included).
    unsafe fn min_bits(a: Self::V, b: Self::V) -> Self::V;
    /// `max` of the lanes read as signed 32-bit integers: the float maximum of values that are
    /// not negative (such as `|x|`).
    unsafe fn max_bits(a: Self::V, b: Self::V) -> Self::V;
    /// `t − 2·a`, rounded once (`2·a` is exact).
    unsafe fn minus_twice(t: Self::V, a: Self::V) -> Self::V;
    /// Bit `l` set when lane `l` of `a` is `≤` that of `b` (false for NaN).
    unsafe fn le_mask(a: Self::V, b: Self::V) -> u32;
}

/// Plain f32: the fallback for CPUs without AVX2.
pub(super) struct Scalar;

impl Simd for Scalar {
    type V = f32;
    const LANES: usize = 1;
    #[inline(always)]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> f32 {
        // SAFETY: the caller passes a pointer into a live slice.
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: f32) {
        // SAFETY: the caller passes a pointer into a live, exclusive buffer.
        unsafe { *p = v }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> f32 {
        x
    }
    #[inline(always)]
    unsafe fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    unsafe fn sub(a: f32, b: f32) -> f32 {
        a - b
    }
    #[inline(always)]
    unsafe fn min(a: f32, b: f32) -> f32 {
        a.min(b)
    }
    #[inline(always)]
    unsafe fn abs(a: f32) -> f32 {
        a.abs()
    }
    #[inline(always)]
    unsafe fn add_on_fma(a: f32, x: f32) -> f32 {
        a + x
    }
    #[inline(always)]
    unsafe fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
    #[inline(always)]
    unsafe fn min_bits(a: f32, b: f32) -> f32 {
        f32::from_bits((a.to_bits() as i32).min(b.to_bits() as i32) as u32)
    }
    #[inline(always)]
    unsafe fn max_bits(a: f32, b: f32) -> f32 {
        f32::from_bits((a.to_bits() as i32).max(b.to_bits() as i32) as u32)
    }
    #[inline(always)]
    unsafe fn minus_twice(t: f32, a: f32) -> f32 {
        t - 2.0 * a
    }
    #[inline(always)]
    unsafe fn le_mask(a: f32, b: f32) -> u32 {
        u32::from(a <= b)
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) mod x86 {
    use super::super::pair::{fold_pair_with, Pair};
    use super::super::{fold, Unit};
    use super::Simd;
    use crate::symmetric::Sides;
    use knn_core::TopK;
    use std::arch::x86_64::*;

    pub(in crate::direct) struct Avx512;
    pub(in crate::direct) struct Avx2;

    // SAFETY (all methods below): `fold_unit` only reaches them after checking the CPU
    // features, inside functions compiled with those features; pointers come from live slices
    // with at least `LANES` values from the pointer on (see `fold`).
    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            unsafe { _mm512_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            unsafe { _mm512_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            unsafe { _mm512_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            unsafe { _mm512_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn min(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_min_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn abs(a: __m512) -> __m512 {
            unsafe { _mm512_abs_ps(a) }
        }
        #[inline(always)]
        unsafe fn add_on_fma(a: __m512, x: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(x, _mm512_set1_ps(1.0), a) }
        }
        #[inline(always)]
        unsafe fn mul_add(a: __m512, b: __m512, c: __m512) -> __m512 {
            unsafe { _mm512_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn min_bits(a: __m512, b: __m512) -> __m512 {
            unsafe {
                _mm512_castsi512_ps(_mm512_min_epi32(
                    _mm512_castps_si512(a),
                    _mm512_castps_si512(b),
                ))
            }
        }
        #[inline(always)]
        unsafe fn max_bits(a: __m512, b: __m512) -> __m512 {
            unsafe {
                _mm512_castsi512_ps(_mm512_max_epi32(
                    _mm512_castps_si512(a),
                    _mm512_castps_si512(b),
                ))
            }
        }
        #[inline(always)]
        unsafe fn minus_twice(t: __m512, a: __m512) -> __m512 {
            unsafe { _mm512_fnmadd_ps(_mm512_set1_ps(2.0), a, t) }
        }
        #[inline(always)]
        unsafe fn le_mask(a: __m512, b: __m512) -> u32 {
            unsafe { u32::from(_mm512_cmp_ps_mask::<_CMP_LE_OQ>(a, b)) }
        }
    }

    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            unsafe { _mm256_storeu_ps(p, v) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_sub_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn min(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_min_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn abs(a: __m256) -> __m256 {
            unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
        }
        #[inline(always)]
        unsafe fn add_on_fma(a: __m256, x: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(x, _mm256_set1_ps(1.0), a) }
        }
        #[inline(always)]
        unsafe fn mul_add(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn min_bits(a: __m256, b: __m256) -> __m256 {
            unsafe {
                _mm256_castsi256_ps(_mm256_min_epi32(
                    _mm256_castps_si256(a),
                    _mm256_castps_si256(b),
                ))
            }
        }
        #[inline(always)]
        unsafe fn max_bits(a: __m256, b: __m256) -> __m256 {
            unsafe {
                _mm256_castsi256_ps(_mm256_max_epi32(
                    _mm256_castps_si256(a),
                    _mm256_castps_si256(b),
                ))
            }
        }
        #[inline(always)]
        unsafe fn minus_twice(t: __m256, a: __m256) -> __m256 {
            unsafe { _mm256_fnmadd_ps(_mm256_set1_ps(2.0), a, t) }
        }
        #[inline(always)]
        unsafe fn le_mask(a: __m256, b: __m256) -> u32 {
            unsafe { _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(a, b)) as u32 }
        }
    }

    /// [`fold`] with AVX-512: 6 base points × 64 queries (24 zmm accumulators, 4 query
    /// vectors, one broadcast per 4 operations).
    #[target_feature(enable = "avx512f")]
    pub(in crate::direct) unsafe fn fold_avx512(unit: &Unit<'_, '_>, tops: &mut [TopK]) {
        // SAFETY: this function's features are those `Avx512` needs.
        unsafe { fold::<Avx512, 4, 6>(unit, tops) }
    }

    /// [`fold`] with AVX2 + FMA: 4 base points × 16 queries (8 ymm accumulators).
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::direct) unsafe fn fold_avx2(unit: &Unit<'_, '_>, tops: &mut [TopK]) {
        // SAFETY: this function's features are those `Avx2` needs.
        unsafe { fold::<Avx2, 2, 4>(unit, tops) }
    }

    /// [`fold_pair_with`] with AVX-512, blocked as [`fold_avx512`].
    #[target_feature(enable = "avx512f")]
    pub(in crate::direct) unsafe fn fold_pair_avx512(
        pair: &Pair<'_, '_>,
        sides: &mut Sides<'_>,
    ) -> u64 {
        // SAFETY: this function's features are those `Avx512` needs.
        unsafe { fold_pair_with::<Avx512, 4, 6>(pair, sides) }
    }

    /// [`fold_pair_with`] with AVX2 + FMA, blocked as [`fold_avx2`].
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::direct) unsafe fn fold_pair_avx2(
        pair: &Pair<'_, '_>,
        sides: &mut Sides<'_>,
    ) -> u64 {
        // SAFETY: this function's features are those `Avx2` needs.
        unsafe { fold_pair_with::<Avx2, 2, 4>(pair, sides) }
    }
}
