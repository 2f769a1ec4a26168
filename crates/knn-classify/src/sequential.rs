//! Sequential mode (seed 003's "punisher"), computed for all new points at once.
//!
//! Ids: the `n` labelled points are `0..n`, new point `j` is `n + j`. New point `j` is decided
//! by its k nearest among ids `< n + j` (labelled points and earlier new points), by
//! (exact key, id), exactly what a one-by-one loop would search. The work:
//!
//! 1. **Candidates, all at once.** One engine search of the new points against the labelled
//!    points (k each) and one of the new points against themselves (`w = 2k + 2` each).
//!    For point `j`, the k best of {its labelled k} ∪ {earlier new points in its list} are its
//!    true k nearest when they provably beat every new point left out of the list: the list is
//!    the engine's exact top `w` by (key, id), so every point outside it ranks after the list's
//!    last entry, and it is enough that the k-th chosen ranks before that entry (or that the
//!    list holds all new points).
//! 2. **Rows not proved** (new points crowding around an early point, the head of a chain) are
//!    asked again with a list four times wider (up to [`WIDEN_ROUNDS`] times), or, when the point
//!    has few earlier new points (≤ 4w), finished by an exact scan of those.
//! 3. **Waves.** Each new point depends on the earlier new points among its k nearest. A wave
//!    is every undecided point whose dependencies are all decided; its votes are independent and
//!    run in parallel (Kahn's topological order: each edge is visited once, so a chain of m points
//!    costs m small waves, not m passes over everything).

use crate::classifier::{by_key_then_id, keyed, Problem, Stats, Votes};
use crate::error::Result;
use crate::vote::{normalise, vote};
use knn::{Matrix, MatrixRef};
use rayon::prelude::*;

/// Widening rounds before the remaining rows are scanned exactly.
const WIDEN_ROUNDS: usize = 3;

/// Waves smaller than this are decided on the calling thread (no fork-join overhead).
const PARALLEL_WAVE: usize = 256;

/// The k nearest (global ids, keys) of new point `j` from its labelled k and its list of new
/// neighbours (new indices), or `None` when the list does not prove them.
fn resolve(
    p: &Problem<'_>,
    j: usize,
    labelled: &[(f64, u32)],
    new_list: &[u32],
    list_is_everything: bool,
) -> Option<Vec<(f64, u32)>> {
    let n = p.train.rows() as u32;
    let q = p.queries.row(j);
    let listed = keyed(p.metric, q, p.queries, new_list);
    let mut cand: Vec<(f64, u32)> = labelled.to_vec();
    cand.extend(
        listed
            .iter()
            .filter(|&&(_, i)| (i as usize) < j)
            .map(|&(key, i)| (key, n + i)),
    );
    cand.sort_unstable_by(by_key_then_id);
    cand.truncate(p.k);
    if list_is_everything {
        return Some(cand);
    }
    let last = listed.last().map(|&(key, i)| (key, n + i))?;
    (by_key_then_id(&cand[p.k - 1], &last).is_le()).then_some(cand)
}

/// The k nearest of new point `j` by an exact scan of every earlier new point.
fn scan(p: &Problem<'_>, j: usize, labelled: &[(f64, u32)]) -> Vec<(f64, u32)> {
    let n = p.train.rows() as u32;
    let q = p.queries.row(j);
    let mut cand: Vec<(f64, u32)> = labelled.to_vec();
    cand.extend((0..j).map(|i| (p.metric.exact_key(q, p.queries.row(i)), n + i as u32)));
    if cand.len() > p.k {
        cand.select_nth_unstable_by(p.k - 1, by_key_then_id);
        cand.truncate(p.k);
    }
    cand.sort_unstable_by(by_key_then_id);
    cand
}

/// Rows `rows` of `m`, gathered into a matrix.
fn gather(m: MatrixRef<'_>, rows: &[usize]) -> Matrix {
    let mut v = Vec::with_capacity(rows.len() * m.dim());
    for &r in rows {
        v.extend_from_slice(m.row(r));
    }
    Matrix::new("new points", v, m.dim()).expect("rows of a validated matrix")
}

/// Sequential classification of `p.queries` (see the module docs).
pub(crate) fn classify(p: &Problem<'_>, want_scores: bool) -> Result<Votes> {
    let m = p.queries.rows();
    let n = p.train.rows();
    let k = p.k;
    let mut stats = Stats::default();
    if m == 0 {
        return Ok(Votes {
            class: Vec::new(),
            scores: want_scores.then(Vec::new),
            stats,
        });
    }

    // 1. Candidates for every new point at once.
    let to_labelled = p.knn.search(p.train, p.queries, k, p.metric)?;
    let labelled: Vec<Vec<(f64, u32)>> = (0..m)
        .into_par_iter()
        .map(|j| keyed(p.metric, p.queries.row(j), p.train, to_labelled.ids_of(j)))
        .collect();
    drop(to_labelled);
    let mut width = (2 * k + 2).min(m);
    let among_new = p.knn.search(p.queries, p.queries, width, p.metric)?;
    let mut near: Vec<Option<Vec<(f64, u32)>>> = (0..m)
        .into_par_iter()
        .map(|j| resolve(p, j, &labelled[j], among_new.ids_of(j), width == m))
        .collect();
    drop(among_new);

    // 2. Rows the lists did not prove: wider lists, then exact scans.
    let mut pending: Vec<usize> = (0..m).filter(|&j| near[j].is_none()).collect();
    for _ in 0..WIDEN_ROUNDS {
        let next = (width * 4).min(m);
        let (wide, small): (Vec<usize>, Vec<usize>) = std::mem::take(&mut pending)
            .into_iter()
            .partition(|&j| j > 4 * width && next > width);
        if wide.is_empty() {
            pending = small;
            break;
        }
        width = next;
        stats.widened += wide.len();
        let rows = gather(p.queries, &wide);
        let lists = p.knn.search(p.queries, rows.view(), width, p.metric)?;
        let found: Vec<Option<Vec<(f64, u32)>>> = wide
            .par_iter()
            .enumerate()
            .map(|(r, &j)| resolve(p, j, &labelled[j], lists.ids_of(r), width == m))
            .collect();
        pending = small;
        for (&j, row) in wide.iter().zip(found) {
            match row {
                Some(r) => near[j] = Some(r),
                None => pending.push(j),
            }
        }
    }
    stats.scanned = pending.len();
    let scanned: Vec<Vec<(f64, u32)>> = pending
        .par_iter()
        .map(|&j| scan(p, j, &labelled[j]))
        .collect();
    for (&j, row) in pending.iter().zip(scanned) {
        near[j] = Some(row);
    }
    drop(labelled);
    let near: Vec<Vec<(f64, u32)>> = near
        .into_iter()
        .map(|r| r.expect("every row resolved"))
        .collect();

    // 3. Waves: decide each point once all earlier new points among its k nearest are decided.
    let mut waiting = vec![0u32; m];
    let mut dependents_start = vec![0usize; m + 1];
    for row in &near {
        for &(_, id) in row {
            if id as usize >= n {
                dependents_start[id as usize - n + 1] += 1;
            }
        }
    }
    for i in 0..m {
        dependents_start[i + 1] += dependents_start[i];
    }
    let mut fill = dependents_start.clone();
    let mut dependents = vec![0u32; dependents_start[m]];
    for (j, row) in near.iter().enumerate() {
        for &(_, id) in row {
            if id as usize >= n {
                let i = id as usize - n;
                dependents[fill[i]] = j as u32;
                fill[i] += 1;
                waiting[j] += 1;
            }
        }
    }
    drop(fill);

    const UNDECIDED: u32 = u32::MAX;
    let mut class = vec![UNDECIDED; m];
    let mut scores = want_scores.then(|| vec![0.0f64; m * p.classes]);
    let mut wave: Vec<u32> = (0..m as u32)
        .filter(|&j| waiting[j as usize] == 0)
        .collect();
    let decide = |j: usize, class: &[u32], s: &mut [f64]| {
        let nb: Vec<(f64, u32)> = near[j]
            .iter()
            .map(|&(key, id)| {
                let c = if (id as usize) < n {
                    p.train_labels[id as usize]
                } else {
                    class[id as usize - n]
                };
                debug_assert_ne!(c, UNDECIDED);
                (key, c)
            })
            .collect();
        let c = vote(&nb, p.weights, p.metric, s);
        normalise(s);
        c
    };
    let mut decided = 0usize;
    while !wave.is_empty() {
        stats.waves += 1;
        stats.largest_wave = stats.largest_wave.max(wave.len());
        let results: Vec<(u32, Option<Vec<f64>>)> = if wave.len() >= PARALLEL_WAVE {
            wave.par_iter()
                .map_init(
                    || vec![0.0f64; p.classes],
                    |s, &j| {
                        let c = decide(j as usize, &class, s);
                        (c, want_scores.then(|| s.clone()))
                    },
                )
                .collect()
        } else {
            let mut s = vec![0.0f64; p.classes];
            wave.iter()
                .map(|&j| {
                    let c = decide(j as usize, &class, &mut s);
                    (c, want_scores.then(|| s.clone()))
                })
                .collect()
        };
        for (&j, (c, s)) in wave.iter().zip(results) {
            class[j as usize] = c;
            if let (Some(all), Some(s)) = (scores.as_mut(), s) {
                all[j as usize * p.classes..(j as usize + 1) * p.classes].copy_from_slice(&s);
            }
        }
        decided += wave.len();
        let mut next = Vec::new();
        for &j in &wave {
            let j = j as usize;
            for &d in &dependents[dependents_start[j]..dependents_start[j + 1]] {
                waiting[d as usize] -= 1;
                if waiting[d as usize] == 0 {
                    next.push(d);
                }
            }
        }
        wave = next;
    }
    debug_assert_eq!(decided, m, "dependencies point to earlier points only");
    Ok(Votes {
        class,
        scores,
        stats,
    })
}
