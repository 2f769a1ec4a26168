//! One request's work in units, tiles of queries × splits of the base, computed in parallel
//! and merged per query (the GEMM-form, direct and expression kernels share it).

use knn_core::{Candidates, TopK};
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

/// Candidate lists of the merged `tops` (one per query, each holding `width` pairs): each row
/// sorted by (key, id), then `finish(row, keys, floor)` turns its keys into the kernel's and
/// sets its floor (left at +∞: the row holds every point), rows in parallel.
pub(crate) fn into_candidates(
    mut tops: Vec<TopK>,
    width: usize,
    finish: impl Fn(usize, &mut [f32], &mut f32) + Sync,
) -> Candidates {
    let nq = tops.len();
    let mut ids = vec![0u32; nq * width];
    let mut keys = vec![0f32; nq * width];
    let mut floor = vec![f32::INFINITY; nq];
    ids.par_chunks_mut(width)
        .zip(keys.par_chunks_mut(width))
        .zip(tops.par_iter_mut())
        .zip(floor.par_iter_mut())
        .enumerate()
        .for_each(|(i, (((ids, keys), top), floor))| {
            debug_assert_eq!(top.len(), width);
            top.drain_sorted_into(keys, ids);
            finish(i, keys, floor);
        });
    // Every `finish` makes a finite floor as the last key less a bound on the row's keys.
    Candidates {
        width,
        ids,
        keys,
        floor,
        floor_bounds_rounding: true,
    }
}
