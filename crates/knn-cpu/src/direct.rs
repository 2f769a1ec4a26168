//! Direct kernels for L1 and L∞: per-coordinate work, no GEMM form. Four queries share each
//! base point load; 16 independent lanes per query keep the SIMD units busy.

use knn_core::{CandidateRequest, Kernel, TopK};
use multiversion::multiversion;
use std::ops::Range;

/// Queries processed together against each base point.
const QUERY_GROUP: usize = 4;

/// Folds the keys of `queries[qr] × base[br]` into `tops`.
pub(crate) fn fold_unit(
    req: &CandidateRequest<'_>,
    qr: Range<usize>,
    br: Range<usize>,
    tops: &mut [TopK],
) {
    let d = req.base.dim();
    let linf = req.kernel == Kernel::Linf;
    let mut i = qr.start;
    while i < qr.end {
        let g = (qr.end - i).min(QUERY_GROUP);
        let qs: Vec<&[f32]> = (0..QUERY_GROUP)
            .map(|l| req.queries.row(i + l.min(g - 1)))
            .collect();
        let skips: Vec<Option<u32>> = (0..g).map(|l| req.exclude.map(|e| e[i + l])).collect();
        let mut thr: Vec<f32> = (0..g).map(|l| tops[i - qr.start + l].threshold()).collect();
        for b in br.clone() {
            let row = &req.base.as_slice()[b * d..(b + 1) * d];
            let keys = if linf {
                linf4(&qs, row)
            } else {
                l1_4(&qs, row)
            };
            for l in 0..g {
                if keys[l] < thr[l] && Some(b as u32) != skips[l] {
                    let t = &mut tops[i - qr.start + l];
                    t.push(keys[l], b as u32);
                    thr[l] = t.threshold();
                }
            }
        }
        i += g;
    }
}

#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn l1_4(qs: &[&[f32]], b: &[f32]) -> [f32; QUERY_GROUP] {
    let mut acc = [[0.0f32; 16]; QUERY_GROUP];
    let d = b.len();
    let full = d / 16 * 16;
    let mut j = 0;
    while j < full {
        for (a, q) in acc.iter_mut().zip(qs) {
            for l in 0..16 {
                a[l] += (q[j + l] - b[j + l]).abs();
            }
        }
        j += 16;
    }
    let mut out = [0.0f32; QUERY_GROUP];
    for (o, (a, q)) in out.iter_mut().zip(acc.iter().zip(qs)) {
        *o = a.iter().sum::<f32>() + (full..d).map(|j| (q[j] - b[j]).abs()).sum::<f32>();
    }
    out
}

#[multiversion(targets("x86_64+avx512f+avx512vl", "x86_64+avx2+fma"))]
fn linf4(qs: &[&[f32]], b: &[f32]) -> [f32; QUERY_GROUP] {
    let mut acc = [[0.0f32; 16]; QUERY_GROUP];
    let d = b.len();
    let full = d / 16 * 16;
    let mut j = 0;
    while j < full {
        for (a, q) in acc.iter_mut().zip(qs) {
            for l in 0..16 {
                a[l] = a[l].max((q[j + l] - b[j + l]).abs());
            }
        }
        j += 16;
    }
    let mut out = [0.0f32; QUERY_GROUP];
    for (o, (a, q)) in out.iter_mut().zip(acc.iter().zip(qs)) {
        *o = (full..d).fold(a.iter().fold(0.0f32, |m, &v| m.max(v)), |m, j| {
            m.max((q[j] - b[j]).abs())
        });
    }
    out
}
