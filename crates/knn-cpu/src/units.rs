//! One request's work in units, tiles of queries × splits of the base, computed in parallel
//! and merged per query (the GEMM-form, direct and expression kernels share it).

use knn_core::TopK;
use rayon::prelude::*;
use std::ops::Range;

/// The `width` smallest keys of each of `nq` queries against `nb` base points: units of at
/// most `q_tile` queries × one split of the base, each folded by `fold(queries, base, tops)`
/// into one list per query of the unit, on the current rayon pool. The base is split (in
/// multiples of `b_tile` points at least) only when the query tiles are fewer than twice the
/// threads, so that every thread has work; a query's lists from several splits are merged.
pub(crate) fn fold_units(
    (nq, nb): (usize, usize),
    width: usize,
    (q_tile, b_tile): (usize, usize),
    fold: impl Fn(Range<usize>, Range<usize>, &mut [TopK]) + Sync,
) -> Vec<TopK> {
    let threads = rayon::current_num_threads();
    let q_tiles = nq.div_ceil(q_tile).max(1);
    let b_splits = (2 * threads)
        .div_ceil(q_tiles)
        .clamp(1, nb.div_ceil(b_tile).max(1));
    let b_chunk = nb.div_ceil(b_splits);
    let units: Vec<(usize, usize)> = (0..q_tiles)
        .flat_map(|t| (0..b_splits).map(move |s| (t, s)))
        .collect();
    let results: Vec<(usize, Vec<TopK>)> = units
        .par_iter()
        .map(|&(t, s)| {
            let q0 = t * q_tile;
            let q1 = (q0 + q_tile).min(nq);
            let b0 = (s * b_chunk).min(nb);
            let b1 = (b0 + b_chunk).min(nb);
            let mut tops = vec![TopK::new(width); q1.saturating_sub(q0)];
            if q0 < q1 && b0 < b1 {
                fold(q0..q1, b0..b1, &mut tops);
            }
            (q0, tops)
        })
        .collect();
    let mut merged: Vec<Option<TopK>> = (0..nq).map(|_| None).collect();
    for (q_start, tops) in results {
        for (j, mut t) in tops.into_iter().enumerate() {
            match &mut merged[q_start + j] {
                slot @ None => *slot = Some(t),
                Some(m) => {
                    let n = t.len();
                    let (mut k, mut i) = (vec![0.0; n], vec![0; n]);
                    t.drain_sorted_into(&mut k, &mut i);
                    for (k, i) in k.into_iter().zip(i) {
                        m.push(k, i);
                    }
                }
            }
        }
    }
    merged
        .into_iter()
        .map(|t| t.expect("every query belongs to a unit"))
        .collect()
}
