//! [`CpuEngine`]: splits the work into units of (query tile × base range), runs them on rayon,
//! merges the per-unit top-k lists.

use knn_core::{CandidateRequest, Candidates, Engine, Kernel, KnnError, Result, TopK};
use rayon::prelude::*;
use std::sync::Arc;

/// Queries per work unit: the GEMM block is `QUERY_TILE × BASE_TILE` f32 (512 KiB, in L2).
pub(crate) const QUERY_TILE: usize = 256;
/// Base points per GEMM block.
pub(crate) const BASE_TILE: usize = 512;
/// Unit roundoff of f32.
pub(crate) const F32_UNIT: f64 = 1.0 / (1u64 << 24) as f64;

/// The multithreaded CPU engine.
#[derive(Clone, Debug, Default)]
pub struct CpuEngine {
    /// Its own pool when a thread count was given; else rayon's global pool (one per core).
    pool: Option<Arc<rayon::ThreadPool>>,
}

impl CpuEngine {
    /// An engine on `threads` threads (`None`: all cores).
    pub fn new(threads: Option<usize>) -> Result<Self> {
        let pool = match threads {
            None => None,
            Some(t) => Some(Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t.max(1))
                    .build()
                    .map_err(|e| KnnError::Option(format!("cannot start {t} threads: {e}")))?,
            )),
        };
        Ok(Self { pool })
    }

    /// Worker threads used.
    pub fn threads(&self) -> usize {
        self.pool
            .as_ref()
            .map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }
}

/// Per-query selections of one work unit, with the unit's query range.
pub(crate) struct UnitResult {
    pub q_start: usize,
    pub tops: Vec<TopK>,
}

impl Engine for CpuEngine {
    fn name(&self) -> String {
        "cpu".into()
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        Ok(match &self.pool {
            Some(p) => p.install(|| candidates(req)),
            None => candidates(req),
        })
    }
}

fn candidates(req: &CandidateRequest<'_>) -> Candidates {
    let (nq, nb, d) = (req.queries.rows(), req.base.rows(), req.base.dim());
    let width = req.width;
    let threads = rayon::current_num_threads();
    let base_norms = crate::gemm::sq_norms(req.base);
    let q_tiles = nq.div_ceil(QUERY_TILE).max(1);
    // Few queries: split the base too, so every thread has work.
    let b_splits = (2 * threads)
        .div_ceil(q_tiles)
        .clamp(1, nb.div_ceil(BASE_TILE).max(1));
    let b_chunk = nb.div_ceil(b_splits);
    let units: Vec<(usize, usize)> = (0..q_tiles)
        .flat_map(|t| (0..b_splits).map(move |s| (t, s)))
        .collect();
    let results: Vec<UnitResult> = units
        .par_iter()
        .map(|&(t, s)| {
            let q0 = t * QUERY_TILE;
            let q1 = (q0 + QUERY_TILE).min(nq);
            let b0 = s * b_chunk;
            let b1 = (b0 + b_chunk).min(nb);
            let mut tops = vec![TopK::new(width); q1 - q0];
            if req.kernel.is_gemm() {
                crate::gemm::fold_unit(req, &base_norms, q0..q1, b0..b1, &mut tops);
            } else {
                crate::direct::fold_unit(req, q0..q1, b0..b1, &mut tops);
            }
            UnitResult { q_start: q0, tops }
        })
        .collect();

    // Merge units of the same query tile; write rows.
    let mut ids = vec![0u32; nq * width];
    let mut keys = vec![0f32; nq * width];
    let mut merged: Vec<Option<TopK>> = (0..nq).map(|_| None).collect();
    for u in results {
        for (j, t) in u.tops.into_iter().enumerate() {
            let slot = &mut merged[u.q_start + j];
            match slot {
                None => *slot = Some(t),
                Some(m) => {
                    let mut t = t;
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
    let available = req.available();
    let bn_max = base_norms.max_norm;
    let mut floor = vec![f32::INFINITY; nq];
    ids.par_chunks_mut(width)
        .zip(keys.par_chunks_mut(width))
        .zip(merged.par_iter_mut())
        .zip(floor.par_iter_mut())
        .enumerate()
        .for_each(|(i, (((ids, keys), top), floor))| {
            let mut top = top.take().expect("every query belongs to a unit");
            debug_assert_eq!(top.len(), width);
            top.drain_sorted_into(keys, ids);
            if width < available {
                let worst = keys[width - 1];
                let (qn, keyed) = match req.kernel {
                    Kernel::SqL2 => {
                        // Keys so far are ‖b‖² − 2q·b; add ‖q‖² to make them squared distances.
                        let qn2 = crate::gemm::sq_norm(req.queries.row(i));
                        keys.iter_mut().for_each(|k| *k += qn2);
                        (qn2.sqrt(), worst + qn2)
                    }
                    Kernel::NegDot => (crate::gemm::sq_norm(req.queries.row(i)).sqrt(), worst),
                    _ => (0.0, worst),
                };
                let bound = req.kernel.error_bound(d, qn, bn_max, keyed, F32_UNIT);
                *floor = round_down(keyed as f64 - bound as f64);
            } else if req.kernel == Kernel::SqL2 {
                let qn2 = crate::gemm::sq_norm(req.queries.row(i));
                keys.iter_mut().for_each(|k| *k += qn2);
            }
        });
    Candidates {
        width,
        ids,
        keys,
        floor,
    }
}

/// The largest f32 not above `x`, so a floor stays a floor after rounding.
fn round_down(x: f64) -> f32 {
    let f = x as f32;
    if (f as f64) > x {
        f.next_down()
    } else {
        f
    }
}
