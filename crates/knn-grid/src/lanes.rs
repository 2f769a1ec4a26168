//! Keys of four points at a time, from the index's columns: SSE2 on x86_64 (part of every
//! x86_64 target, so no run-time dispatch), plain arrays elsewhere. The compiler does not
//! vectorise the per-lane selects of these loops by itself.
//!
//! Every lane computes exactly what `KeyKind::fold` computes for one point (the same
//! operations in the same order: no fused multiply-add), so the keys are bit for bit those of
//! the scalar scan.

/// Points per group.
pub(crate) const WIDTH: usize = 4;

/// Per-lane running state of a single selection over groups of points: each lane's smallest
/// key, its position and the lane's second smallest key.
pub(crate) struct SingleLanes {
    pub first: [f32; WIDTH],
    pub second: [f32; WIDTH],
    pub at: [u32; WIDTH],
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::{SingleLanes, WIDTH};
    use crate::search::KeyKind;
    use std::arch::x86_64::*;

    /// The keys of the `WIDTH` points at positions `i..i + WIDTH` (columns padded past their
    /// end, so the loads stay inside).
    #[inline(always)]
    fn keys<K: KeyKind, const D: usize>(cols: &[&[f32]; D], q: &[f32; D], i: usize) -> __m128 {
        // SAFETY: SSE2 is part of every x86_64 target; `col` holds WIDTH f32 (checked by the
        // slicing), read by an unaligned load.
        unsafe {
            let mut acc = _mm_setzero_ps();
            for j in 0..D {
                let col = &cols[j][i..i + WIDTH];
                let p = _mm_loadu_ps(col.as_ptr());
                acc = K::fold_x4(acc, _mm_sub_ps(_mm_set1_ps(q[j]), p));
            }
            acc
        }
    }

    /// Lanes `0..n` set (all ones), the others clear.
    #[inline(always)]
    fn valid(n: usize) -> __m128 {
        let n = n.min(WIDTH) as i32;
        // SAFETY: SSE2 is part of every x86_64 target.
        unsafe {
            _mm_castsi128_ps(_mm_cmplt_epi32(
                _mm_setr_epi32(0, 1, 2, 3),
                _mm_set1_epi32(n),
            ))
        }
    }

    /// `a` where `m` is set, else `b`.
    #[inline(always)]
    fn select(m: __m128, a: __m128, b: __m128) -> __m128 {
        // SAFETY: SSE is part of every x86_64 target.
        unsafe { _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b)) }
    }

    /// Folds the points at positions `s..e` into `lanes`.
    #[inline(always)]
    pub(crate) fn single<K: KeyKind, const D: usize>(
        cols: &[&[f32]; D],
        q: &[f32; D],
        s: usize,
        e: usize,
        lanes: &mut SingleLanes,
    ) {
        // SAFETY: SSE2 is part of every x86_64 target; each lane array holds exactly WIDTH
        // values of 4 bytes, read and written by unaligned accesses.
        unsafe {
            let mut first = _mm_loadu_ps(lanes.first.as_ptr());
            let mut second = _mm_loadu_ps(lanes.second.as_ptr());
            let mut at = _mm_loadu_si128(lanes.at.as_ptr().cast());
            let inf = _mm_set1_ps(f32::INFINITY);
            let step = _mm_setr_epi32(0, 1, 2, 3);
            let mut i = s;
            while i < e {
                let key = select(valid(e - i), keys::<K, D>(cols, q, i), inf);
                let below = _mm_cmplt_ps(key, first);
                second = _mm_min_ps(second, select(below, first, key));
                let pos = _mm_add_epi32(_mm_set1_epi32(i as i32), step);
                let bi = _mm_castps_si128(below);
                at = _mm_or_si128(_mm_and_si128(bi, pos), _mm_andnot_si128(bi, at));
                first = _mm_min_ps(first, key);
                i += WIDTH;
            }
            _mm_storeu_ps(lanes.first.as_mut_ptr(), first);
            _mm_storeu_ps(lanes.second.as_mut_ptr(), second);
            _mm_storeu_si128(lanes.at.as_mut_ptr().cast(), at);
        }
    }

    /// The keys of positions `i..i + WIDTH` (`+∞` from lane `e − i` on) and whether any is at
    /// most `limit`.
    #[inline(always)]
    pub(crate) fn group<K: KeyKind, const D: usize>(
        cols: &[&[f32]; D],
        q: &[f32; D],
        i: usize,
        e: usize,
        limit: f32,
    ) -> ([f32; WIDTH], bool) {
        let key = select(valid(e - i), keys::<K, D>(cols, q, i), splat(f32::INFINITY));
        let mut out = [0f32; WIDTH];
        // SAFETY: SSE is part of every x86_64 target; `out` holds WIDTH f32.
        let enter = unsafe {
            _mm_storeu_ps(out.as_mut_ptr(), key);
            _mm_movemask_ps(_mm_cmple_ps(key, _mm_set1_ps(limit))) != 0
        };
        (out, enter)
    }

    /// `x` in every lane.
    #[inline(always)]
    fn splat(x: f32) -> __m128 {
        // SAFETY: SSE is part of every x86_64 target.
        unsafe { _mm_set1_ps(x) }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    use super::{SingleLanes, WIDTH};
    use crate::search::KeyKind;

    #[inline(always)]
    fn keys<K: KeyKind, const D: usize>(
        cols: &[&[f32]; D],
        q: &[f32; D],
        i: usize,
        e: usize,
    ) -> [f32; WIDTH] {
        std::array::from_fn(|l| {
            if i + l < e {
                (0..D).fold(0.0, |a, j| K::fold(a, q[j] - cols[j][i + l]))
            } else {
                f32::INFINITY
            }
        })
    }

    #[inline(always)]
    pub(crate) fn single<K: KeyKind, const D: usize>(
        cols: &[&[f32]; D],
        q: &[f32; D],
        s: usize,
        e: usize,
        lanes: &mut SingleLanes,
    ) {
        let mut i = s;
        while i < e {
            let key = keys::<K, D>(cols, q, i, e);
            for l in 0..WIDTH {
                let below = key[l] < lanes.first[l];
                let other = if below { lanes.first[l] } else { key[l] };
                if other < lanes.second[l] {
                    lanes.second[l] = other;
                }
                if below {
                    lanes.first[l] = key[l];
                    lanes.at[l] = (i + l) as u32;
                }
            }
            i += WIDTH;
        }
    }

    #[inline(always)]
    pub(crate) fn group<K: KeyKind, const D: usize>(
        cols: &[&[f32]; D],
        q: &[f32; D],
        i: usize,
        e: usize,
        limit: f32,
    ) -> ([f32; WIDTH], bool) {
        let key = keys::<K, D>(cols, q, i, e);
        let enter = key.iter().any(|&k| k <= limit);
        (key, enter)
    }
}

pub(crate) use imp::{group, single};

impl SingleLanes {
    /// Empty lanes, with `(key, pos, runner_up)` (a pair already selected) in lane 0.
    pub(crate) fn new(key: f32, pos: u32, runner_up: f32) -> Self {
        let mut s = SingleLanes {
            first: [f32::INFINITY; WIDTH],
            second: [f32::INFINITY; WIDTH],
            at: [0; WIDTH],
        };
        (s.first[0], s.second[0], s.at[0]) = (key, runner_up, pos);
        s
    }

    /// The lanes merged: `(key, position, runner-up)` of the smallest first key, every other
    /// key joining the runner-up; `None` when two lanes share the smallest key, or the runner-up
    /// equals it (a tie the ids must break), or nothing was seen.
    pub(crate) fn merge(&self) -> Option<(f32, u32, f32)> {
        let mut w = 0;
        for l in 1..WIDTH {
            if self.first[l] < self.first[w] {
                w = l;
            }
        }
        let mut runner_up = f32::INFINITY;
        for l in 0..WIDTH {
            runner_up = runner_up.min(self.second[l]);
            if l != w {
                runner_up = runner_up.min(self.first[l]);
            }
        }
        let key = self.first[w];
        (key < runner_up).then_some((key, self.at[w], runner_up))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::tests::mixed_values;
    use crate::search::{KeyKind, Linf, SqL2, L1};

    /// The lanes compute the scalar keys bit for bit, mask the lanes past the end, and the
    /// single selection finds the smallest key, its position and the runner-up.
    #[test]
    fn lanes_match_the_scalar_keys() {
        fn check<K: KeyKind>() {
            let mut next = mixed_values(0x2545_F491_4F6C_DD1D);
            let n = 37;
            let cols: Vec<Vec<f32>> = (0..3)
                .map(|_| {
                    let mut c: Vec<f32> = (0..n).map(|_| next()).collect();
                    c.resize(n + WIDTH - 1, 0.0);
                    c
                })
                .collect();
            let cols: [&[f32]; 3] = std::array::from_fn(|j| &cols[j][..]);
            let q = [next(), next(), next()];
            let key = |i: usize| K::key(&q, &[cols[0][i], cols[1][i], cols[2][i]]);
            for s in 0..n {
                for e in s + 1..=n.min(s + 9) {
                    let (got, _) = group::<K, 3>(&cols, &q, s, e, 0.0);
                    for (l, &k) in got.iter().enumerate() {
                        let want = if s + l < e { key(s + l) } else { f32::INFINITY };
                        assert_eq!(k.to_bits(), want.to_bits(), "lane {l} of {s}..{e}");
                    }
                    let mut lanes = SingleLanes::new(f32::INFINITY, 0, f32::INFINITY);
                    single::<K, 3>(&cols, &q, s, e, &mut lanes);
                    let mut all: Vec<(f32, usize)> = (s..e).map(|i| (key(i), i)).collect();
                    all.sort_by(|a, b| a.0.total_cmp(&b.0));
                    let runner = all.get(1).map_or(f32::INFINITY, |p| p.0);
                    match lanes.merge() {
                        Some((k, pos, r)) => {
                            assert_eq!((k, pos as usize, r), (all[0].0, all[0].1, runner))
                        }
                        None => assert_eq!(all[0].0, runner, "only a tie gives no answer"),
                    }
                }
            }
        }
        check::<SqL2>();
        check::<L1>();
        check::<Linf>();
    }
}
