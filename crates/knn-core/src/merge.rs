//! Answers over the parts of a base merged into the whole base's answer (`knn.dask` merges
//! each base chunk's partial answer so). A search chooses by exact key ([`crate::Metric`]'s
//! f64 keys) and reports distances rounded from them, which may make distinct keys equal: the
//! merge chooses by the parts' keys, as one search over the whole base would, and orders by
//! distance as it reports.

use crate::error::{KnnError, Result};
use rayon::prelude::*;

/// One part's answer to `rows` queries: `width` entries a row (row-major), each row ordered by
/// (distance, id) as a search orders it, with global ids and the exact key each entry was
/// chosen by (`knn::Index::exact_keys`).
pub struct PartAnswer<'a, D> {
    /// Entries per row.
    pub width: usize,
    /// Distances (or similarities), `rows·width`.
    pub distances: &'a [D],
    /// Global ids, `rows·width`.
    pub ids: &'a [i64],
    /// Exact keys, `rows·width`.
    pub keys: &'a [f64],
}

/// A merged answer: `rows × k` entries, as [`PartAnswer`] lays them out.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedAnswer<D> {
    /// Entries per row: the `k` asked for, or fewer where the parts hold fewer.
    pub k: usize,
    /// Distances (or similarities), `rows·k`.
    pub distances: Vec<D>,
    /// Global ids, `rows·k`.
    pub ids: Vec<i64>,
    /// Exact keys, `rows·k`.
    pub keys: Vec<f64>,
}

/// Rows merged per rayon task.
const ROWS_PER_TASK: usize = 256;

/// The answer over the union of the parts (disjoint parts of one base, so no id repeats in a
/// row): of each row's entries, the `k` smallest by (key, id), at most as many as the parts
/// hold, ordered by (distance, id) as a search orders them, that is by key, and among keys
/// that round to one distance by id. Equal to one search over the whole base when each part
/// answered with its own `k` best (or all it has).
///
/// Errors: a part whose arrays do not hold `rows × width` entries.
pub fn merge_answers<D>(
    parts: &[PartAnswer<'_, D>],
    rows: usize,
    k: usize,
) -> Result<MergedAnswer<D>>
where
    D: Copy + PartialEq + Send + Sync + Default,
{
    for (p, part) in parts.iter().enumerate() {
        let len = rows * part.width;
        let lens = [part.distances.len(), part.ids.len(), part.keys.len()];
        if lens.iter().any(|&l| l != len) {
            return Err(KnnError::Option(format!(
                "partial answer {p}: distances, ids and keys hold {lens:?} entries, expected \
                 {rows} rows × {} = {len}",
                part.width
            )));
        }
    }
    let k = k.min(parts.iter().map(|p| p.width).sum());
    let mut out = MergedAnswer {
        k,
        distances: vec![D::default(); rows * k],
        ids: vec![0; rows * k],
        keys: vec![0.0; rows * k],
    };
    if k == 0 {
        return Ok(out);
    }
    let per = ROWS_PER_TASK * k;
    (out.distances.par_chunks_mut(per))
        .zip(out.ids.par_chunks_mut(per))
        .zip(out.keys.par_chunks_mut(per))
        .enumerate()
        .for_each(|(t, ((dists, ids), keys))| {
            let mut row: Vec<(f64, i64, D)> = Vec::new();
            for (r, ((dists, ids), keys)) in (dists.chunks_mut(k))
                .zip(ids.chunks_mut(k))
                .zip(keys.chunks_mut(k))
                .enumerate()
            {
                let q = t * ROWS_PER_TASK + r;
                row.clear();
                for p in parts {
                    let at = q * p.width..(q + 1) * p.width;
                    row.extend(
                        (p.keys[at.clone()].iter())
                            .zip(&p.ids[at.clone()])
                            .zip(&p.distances[at])
                            .map(|((&key, &id), &d)| (key, id, d)),
                    );
                }
                let by_key =
                    |a: &(f64, i64, D), b: &(f64, i64, D)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
                if k < row.len() {
                    row.select_nth_unstable_by(k - 1, by_key);
                    row.truncate(k);
                }
                row.sort_unstable_by(by_key);
                // Keys in order, so equal distances stand together: each such run by id.
                for (at, &(key, id, d)) in row.iter().enumerate() {
                    let mut p = at;
                    while p > 0 && dists[p - 1] == d && ids[p - 1] > id {
                        (dists[p], ids[p], keys[p]) = (dists[p - 1], ids[p - 1], keys[p - 1]);
                        p -= 1;
                    }
                    (dists[p], ids[p], keys[p]) = (d, id, key);
                }
            }
        });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows split over three parts in every way and merged give the whole row's answer:
    /// chosen by (key, id), a key tie at the cut going to the smaller id; keys that round to
    /// one distance ordered by id; fewer entries than k in all.
    #[test]
    fn parts_merge_into_the_whole() {
        // (key, id, distance): ids 5 and 2 share a distance with distinct keys (5's smaller,
        // 2 first as reported); ids 7 and 3 tie in key at the cut of k = 4.
        let whole = [
            (1.0, 9, 1.0f32),
            (2.0, 5, 2.0),
            (2.5, 2, 2.0),
            (3.0, 7, 3.0),
            (3.0, 3, 3.0),
            (4.0, 1, 4.0),
        ];
        for mask in 0..3usize.pow(6) {
            let mut parts: Vec<Vec<(f64, i64, f32)>> = vec![vec![]; 3];
            for (j, e) in whole.iter().enumerate() {
                parts[mask / 3usize.pow(j as u32) % 3].push(*e);
            }
            // Two rows: the second with keys negated as an inner product's (distances are
            // similarities, reported in decreasing order).
            let cols: Vec<_> = parts
                .iter()
                .map(|p| {
                    let mut rows = [p.clone(), p.iter().map(|&(k, i, d)| (-k, i, -d)).collect()];
                    rows[0].sort_by(|a, b| a.2.total_cmp(&b.2).then(a.1.cmp(&b.1)));
                    rows[1].sort_by(|a, b| b.2.total_cmp(&a.2).then(a.1.cmp(&b.1)));
                    let flat: Vec<_> = rows.concat();
                    (
                        flat.iter().map(|e| e.2).collect::<Vec<_>>(),
                        flat.iter().map(|e| e.1).collect::<Vec<_>>(),
                        flat.iter().map(|e| e.0).collect::<Vec<_>>(),
                    )
                })
                .collect();
            let answers: Vec<_> = (cols.iter().zip(&parts))
                .map(|((d, i, k), p)| PartAnswer {
                    width: p.len(),
                    distances: d,
                    ids: i,
                    keys: k,
                })
                .collect();
            let m = merge_answers(&answers, 2, 4).unwrap();
            assert_eq!(m.k, 4);
            assert_eq!(&m.ids[..4], &[9, 2, 5, 3], "parts {parts:?}");
            assert_eq!(&m.distances[..4], &[1.0, 2.0, 2.0, 3.0]);
            assert_eq!(&m.keys[..4], &[1.0, 2.5, 2.0, 3.0]);
            // Negated: keys -4 (id 1), -3 (3, 7), -2.5 (2), ...; -2.5 and -2 share a
            // distance, so that run is by id.
            assert_eq!(&m.ids[4..], &[1, 3, 7, 2], "parts {parts:?}");
            let all = merge_answers(&answers, 2, 10).unwrap();
            assert_eq!(all.k, 6);
            assert_eq!(&all.ids[..6], &[9, 2, 5, 3, 7, 1]);
        }
    }
}
