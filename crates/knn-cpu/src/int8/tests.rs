//! Tests of the integer path: every form this CPU has, against the codes' integer keys.

use super::*;
use knn_core::Kernel;

/// Every instruction form this CPU runs gives each pair's integer key exactly, `K =
/// ‖B‖² − 2·Q·B` of the codes (computed here in i64), with ids, for every base point of a
/// range that starts and ends inside SIMD blocks, at dimensions on and off word edges, on
/// codes at both ends of the range.
#[test]
fn kernels_give_the_codes_integer_keys() {
    let mut forms = vec![];
    if available() == Some(Products::Vnni) {
        forms.push(Products::Vnni);
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        forms.push(Products::Avx2);
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Values at the ends of the range too (codes ±c).
        match x % 8 {
            0 => -3.0,
            1 => 5.0,
            _ => (x >> 11) as f32 / (1u64 << 53) as f32 * 8.0 - 3.0,
        }
    };
    for (products, kernel) in forms
        .iter()
        .flat_map(|&p| [(p, Kernel::SqL2), (p, Kernel::L1)])
        .filter(|(p, k)| p.takes(*k))
    {
        for d in [1usize, 2, 3, 7, 16, 33, 64, 127, 128] {
            if d > products.max_dim() {
                continue;
            }
            let (n, m) = (150, 9);
            let base: Vec<f32> = (0..n * d).map(|_| next()).collect();
            let queries: Vec<f32> = (0..m * d).map(|_| next()).collect();
            let (bm, qm) = (
                MatrixRef::new("base", &base, d).unwrap(),
                MatrixRef::new("queries", &queries, d).unwrap(),
            );
            let plan = Plan::new(bm, products, kernel).expect("keys fit");
            let br = 5..141;
            let req = CandidateRequest {
                base: bm,
                queries: qm,
                kernel,
                width: br.len(),
                exclude: None,
                precise: false,
                base_key: None,
                exact_data: false,
                exact_from: None,
            };
            let mut tops: Vec<TopK> = (0..m).map(|_| TopK::new(br.len())).collect();
            let codes = QueryCodes::new(&plan, qm);
            fold_unit(&req, &plan, &codes, 0..m, br.clone(), &mut tops);
            let codes = |row: &[f32]| {
                let mut c = vec![0i16; plan.quads * products.per_word()];
                plan.quantise(row, &mut c);
                c
            };
            for (i, top) in tops.into_iter().enumerate() {
                let q = codes(qm.row(i));
                let mut want: Vec<(f32, u32)> = br
                    .clone()
                    .map(|j| {
                        let b = codes(bm.row(j));
                        let key: i64 = if kernel == Kernel::L1 {
                            b.iter()
                                .zip(&q)
                                .map(|(&u, &v)| (u as i64 - v as i64).abs())
                                .sum()
                        } else {
                            let bb: i64 = b.iter().map(|&v| v as i64 * v as i64).sum();
                            let qb: i64 =
                                b.iter().zip(&q).map(|(&u, &v)| u as i64 * v as i64).sum();
                            bb - 2 * qb
                        };
                        (key as f32, j as u32)
                    })
                    .collect();
                want.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                assert_eq!(
                    top.into_sorted(),
                    want,
                    "{products:?} {kernel:?} d={d} query {i}"
                );
            }
        }
    }
}
