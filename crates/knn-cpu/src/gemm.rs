//! GEMM-form kernels: `key(q, b) = ‖b‖² − 2 q·b` (squared L2 less the constant ‖q‖²) or
//! `−q·b`, one `QUERY_TILE × BASE_TILE` block at a time, folded into running top-k lists.

use crate::engine::BASE_TILE;
use faer::{Accum, MatMut, MatRef, Par};
use knn_core::{CandidateRequest, Kernel, MatrixRef, TopK};
use multiversion::multiversion;
use rayon::prelude::*;
use std::ops::Range;

/// Squared norms of the base points and the largest norm (for error bounds).
pub(crate) struct BaseNorms {
    pub sq: Vec<f32>,
    pub max_norm: f32,
}

/// `Σ xᵢ²` in f32 with 16 independent lanes.
#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
pub(crate) fn sq_norm(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..16 {
            acc[l] += c[l] * c[l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for v in rest {
        s += v * v;
    }
    s
}

/// `Σ (xᵢ − mᵢ)²` in f32 (`m` = 0 when absent).
pub(crate) fn sq_norm_centred(x: &[f32], mean: Option<&[f32]>) -> f32 {
    match mean {
        None => sq_norm(x),
        Some(m) => centred_sq_norms(x, m).0,
    }
}

/// `Σ (xᵢ − mᵢ)²` in one pass: in f32, bit for bit as [`sq_norm`] sums the centred row (the
/// keys' norms), and in f64 over 16 lanes for error bounds (any order of the f64 sum is within
/// the bounds' `1 + 10⁻⁶` margin). `m = 0` leaves the row as it is (`x − 0 = x`, bit for bit).
#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn centred_sq_norms(x: &[f32], m: &[f32]) -> (f32, f64) {
    let (mut acc, mut wide) = ([0.0f32; 16], [0.0f64; 16]);
    let (xs, ms) = (x.chunks_exact(16), m.chunks_exact(16));
    let (x_rest, m_rest) = (xs.remainder(), ms.remainder());
    for (a, b) in xs.zip(ms) {
        for l in 0..16 {
            let c = a[l] - b[l];
            acc[l] += c * c;
            wide[l] += c as f64 * c as f64;
        }
    }
    let mut s: f32 = acc.iter().sum();
    let mut w: f64 = wide.iter().sum();
    for (&a, &b) in x_rest.iter().zip(m_rest) {
        let c = a - b;
        s += c * c;
        w += c as f64 * c as f64;
    }
    (s, w)
}

/// `Σ (xᵢ − mᵢ)²` in f64, for error bounds.
pub(crate) fn sq_norm_f64(x: &[f32], mean: Option<&[f32]>) -> f64 {
    match mean {
        None => x.iter().map(|&v| (v as f64).powi(2)).sum(),
        Some(m) => x
            .iter()
            .zip(m)
            .map(|(&v, &mu)| ((v - mu) as f64).powi(2))
            .sum(),
    }
}

/// Rows the centre of [`mean`] is taken from, at most.
const MEAN_ROWS: usize = 1 << 16;

/// The centre the bf16 path subtracts: the mean of at most [`MEAN_ROWS`] base rows evenly
/// spread over the base (f64 sums, rounded to f32). Any centre keeps the keys exact (squared
/// distances do not change under translation, and the bounds use the norms of the rows as
/// centred); a sample's mean shrinks the norms as the full mean would, for a sixteenth of a
/// pass over 10⁶ rows.
pub(crate) fn mean(base: MatrixRef<'_>) -> Vec<f32> {
    let (n, d) = (base.rows(), base.dim());
    let step = n.div_ceil(MEAN_ROWS).max(1);
    let picked: Vec<usize> = (0..n).step_by(step).collect();
    let sums = picked
        .par_chunks(512)
        .map(|rows| {
            let mut s = vec![0.0f64; d];
            for &i in rows {
                s.iter_mut()
                    .zip(base.row(i))
                    .for_each(|(a, &v)| *a += v as f64);
            }
            s
        })
        .reduce(
            || vec![0.0f64; d],
            |mut a, b| {
                a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                a
            },
        );
    sums.iter()
        .map(|s| (s / picked.len() as f64) as f32)
        .collect()
}

/// Squared norms of the base points (centred on `mean` when given) and the largest norm, in
/// one pass over the rows.
pub(crate) fn sq_norms(base: MatrixRef<'_>, mean: Option<&[f32]>) -> BaseNorms {
    const ROWS: usize = 1024;
    let zeros;
    let m = match mean {
        Some(m) => m,
        None => {
            zeros = vec![0.0f32; base.dim()];
            &zeros
        }
    };
    let mut sq = vec![0.0f32; base.rows()];
    // The largest squared norm in f64, so that the error bound stays a bound.
    let max_sq = sq
        .par_chunks_mut(ROWS)
        .enumerate()
        .map(|(c, out)| {
            let mut top = 0.0f64;
            for (j, o) in out.iter_mut().enumerate() {
                let (s, w) = centred_sq_norms(base.row(c * ROWS + j), m);
                *o = s;
                top = top.max(w);
            }
            top
        })
        .reduce(|| 0.0, f64::max);
    BaseNorms {
        sq,
        max_norm: (max_sq.sqrt() * (1.0 + 1e-6)) as f32,
    }
}

/// Folds the keys of `queries[qr] × base[br]` into `tops` (one per query of `qr`).
pub(crate) fn fold_unit(
    req: &CandidateRequest<'_>,
    norms: &BaseNorms,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
) {
    let d = req.base.dim();
    let nq = qr.len();
    let q = &req.queries.as_slice()[qr.start * d..qr.end * d];
    let mut block = vec![0.0f32; nq * BASE_TILE];
    let zeros = vec![0.0f32; BASE_TILE];
    let mut b0 = br.start;
    while b0 < br.end {
        let b1 = (b0 + BASE_TILE).min(br.end);
        let nb = b1 - b0;
        let b = &req.base.as_slice()[b0 * d..b1 * d];
        let out = &mut block[..nq * nb];
        // block = −2 · Q · Bᵀ (or −Q·Bᵀ for the inner product).
        let alpha = if req.kernel == Kernel::SqL2 {
            -2.0f32
        } else {
            -1.0
        };
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(out, nq, nb),
            Accum::Replace,
            MatRef::from_row_major_slice(q, nq, d),
            MatRef::from_column_major_slice(b, d, nb),
            alpha,
            Par::Seq,
        );
        let add: &[f32] = if req.kernel == Kernel::SqL2 {
            &norms.sq[b0..b1]
        } else {
            &zeros[..nb]
        };
        for (i, top) in tops.iter_mut().enumerate() {
            let skip = req.exclude.map(|e| e[qr.start + i]);
            scan_row(&out[i * nb..(i + 1) * nb], add, b0 as u32, skip, top);
        }
        b0 = b1;
    }
}

/// Pushes `row[j] + add[j]` for every j (id `first + j`) that beats the current threshold.
/// Ids rise along the row, so `key < threshold` alone decides ties correctly.
#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn scan_row(row: &[f32], add: &[f32], first: u32, skip: Option<u32>, top: &mut TopK) {
    let mut thr = top.threshold();
    let add = &add[..row.len()];
    let mut offer = |k: f32, j: usize, thr: &mut f32| {
        let id = first + j as u32;
        if k < *thr && Some(id) != skip {
            top.push(k, id);
            *thr = top.threshold();
        }
    };
    // Fixed-size chunks: no bounds checks in the loop, so it is vectorised (on AVX2, 0.29
    // against 0.90 ns a key when indexing `row[j + l]`, one-thread micro-benchmark).
    let (rows, adds) = (row.chunks_exact(16), add.chunks_exact(16));
    let (row_rest, add_rest) = (rows.remainder(), adds.remainder());
    for (c, (r, a)) in rows.zip(adds).enumerate() {
        let (r, a): (&[f32; 16], &[f32; 16]) =
            (r.try_into().expect("16"), a.try_into().expect("16"));
        let mut keys = [0.0f32; 16];
        let mut hit = false;
        for l in 0..16 {
            keys[l] = r[l] + a[l];
            hit |= keys[l] < thr;
        }
        if hit {
            for (l, &k) in keys.iter().enumerate() {
                offer(k, 16 * c + l, &mut thr);
            }
        }
    }
    let tail = row.len() - row_rest.len();
    for (l, (&r, &a)) in row_rest.iter().zip(add_rest).enumerate() {
        offer(r + a, tail + l, &mut thr);
    }
}

/// Rows of a block pair per faer product in [`fold_pair`]: the f32 block stays in L2.
const PAIR_ROWS: usize = 256;

/// Symmetric self-join with f32 products: folds the keys of the block pair
/// `points[ri] × points[rj]` into both sides' lists (see [`crate::symmetric`]); on the
/// diagonal (`ri == rj`) only pairs `i < j`. Keys are whole, `‖x‖² + ‖y‖² − 2x·y` (or `−x·y`),
/// the same number for both points. Returns the number of pair keys computed.
pub(crate) fn fold_pair(
    points: MatrixRef<'_>,
    kernel: Kernel,
    norms: &BaseNorms,
    ri: Range<usize>,
    rj: Range<usize>,
    sides: &mut crate::symmetric::Sides<'_>,
) -> u64 {
    let d = points.dim();
    let nj = rj.len();
    let data = points.as_slice();
    let sql2 = kernel == Kernel::SqL2;
    let alpha = if sql2 { -2.0f32 } else { -1.0 };
    let zeros = vec![0.0f32; nj];
    let bsq: &[f32] = if sql2 { &norms.sq[rj.clone()] } else { &zeros };
    let b = MatRef::from_column_major_slice(&data[rj.start * d..rj.end * d], d, nj);
    let diagonal = sides.is_diagonal();
    let mut block = vec![0.0f32; PAIR_ROWS.min(ri.len()) * nj];
    let mut computed = 0u64;
    for a0 in (0..ri.len()).step_by(PAIR_ROWS) {
        let a1 = (a0 + PAIR_ROWS).min(ri.len());
        let na = a1 - a0;
        // On the diagonal, columns up to the chunk's first row hold no pair `i < j`.
        let c0 = if diagonal { (a0 + 1).min(nj) } else { 0 };
        if c0 == nj {
            continue;
        }
        let out = &mut block[..na * (nj - c0)];
        faer::linalg::matmul::matmul(
            MatMut::from_row_major_slice_mut(out, na, nj - c0),
            Accum::Replace,
            MatRef::from_row_major_slice(&data[(ri.start + a0) * d..(ri.start + a1) * d], na, d),
            b.subcols(c0, nj - c0),
            alpha,
            Par::Seq,
        );
        computed += (na * (nj - c0)) as u64;
        for a in a0..a1 {
            let qsq = if sql2 { norms.sq[ri.start + a] } else { 0.0 };
            // On the diagonal only columns after the row.
            let from = if diagonal { a + 1 } else { 0 }.max(c0);
            let row = &out[(a - a0) * (nj - c0)..(a - a0 + 1) * (nj - c0)];
            scan_row_sym(&row[from - c0..], &bsq[from..], qsq, a, from, sides);
        }
    }
    computed
}

/// Keys `qsq + add[j] + row[j]` of local row `a` against local columns `first + j`, offered to
/// the row's list and to each column's list where at most their thresholds (`≤`: the lists
/// settle ties by id).
#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn scan_row_sym(
    row: &[f32],
    add: &[f32],
    qsq: f32,
    a: usize,
    first: usize,
    sides: &mut crate::symmetric::Sides<'_>,
) {
    let n = row.len();
    let mut j = 0;
    while j < n {
        let m = (n - j).min(16);
        let mut keys = [0.0f32; 16];
        let mut hit = false;
        let (rthr, cthr) = (
            sides.row_thr()[a],
            &sides.col_thr()[first + j..first + j + m],
        );
        if m == 16 {
            // A fixed-length body on fixed-size arrays (no bounds checks), so the compiler
            // vectorises it.
            let r: &[f32; 16] = row[j..j + 16].try_into().expect("16");
            let b: &[f32; 16] = add[j..j + 16].try_into().expect("16");
            let c: &[f32; 16] = cthr.try_into().expect("16");
            for l in 0..16 {
                keys[l] = (qsq + b[l]) + r[l];
                hit |= keys[l] <= rthr || keys[l] <= c[l];
            }
        } else {
            for l in 0..m {
                keys[l] = (qsq + add[j + l]) + row[j + l];
                hit |= keys[l] <= rthr || keys[l] <= cthr[l];
            }
        }
        if hit {
            for (l, &k) in keys[..m].iter().enumerate() {
                let b = first + j + l;
                if k <= sides.row_thr()[a] {
                    sides.push_row(a, k, sides.col_id(b));
                }
                if k <= sides.col_thr()[b] {
                    sides.push_col(b, k, sides.row_id(a));
                }
            }
        }
        j += m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One pass gives the f32 norms the keys always had (the centred row summed by
    /// `sq_norm`), bit for bit, and f64 norms within the bounds' margin of a plain sum.
    #[test]
    fn one_pass_norms_are_the_two_pass_ones() {
        for d in [1, 5, 16, 17, 67, 128] {
            let rows = 300;
            // Values of both signs, a negative zero among them.
            let x: Vec<f32> = (0..rows * d)
                .map(|i| match i % 13 {
                    0 => -0.0,
                    _ => ((i * 7919 % 1009) as f32 - 504.5) * 0.37,
                })
                .collect();
            let base = MatrixRef::new("base", &x, d).unwrap();
            for mean in [None, Some(super::mean(base))] {
                let norms = sq_norms(base, mean.as_deref());
                let mut top = 0.0f64;
                for i in 0..rows {
                    let r = base.row(i);
                    let centred: Vec<f32> = match &mean {
                        Some(m) => r.iter().zip(m).map(|(a, b)| a - b).collect(),
                        None => r.to_vec(),
                    };
                    assert_eq!(
                        norms.sq[i].to_bits(),
                        sq_norm(&centred).to_bits(),
                        "d={d} row {i}"
                    );
                    top = top.max(centred.iter().map(|&c| (c as f64).powi(2)).sum::<f64>());
                }
                let want = (top.sqrt() * (1.0 + 1e-6)) as f32;
                assert!((norms.max_norm - want).abs() <= 1e-6 * want, "d={d}");
            }
        }
    }
}
