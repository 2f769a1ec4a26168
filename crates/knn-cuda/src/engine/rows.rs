//! One call's rows under the device's lock: [`CudaEngine::rows`] and what it returns.

use super::{exact_view, held_bytes, BaseInfo, CudaEngine, Method, MIN_BUDGET};
use crate::device::{is_oom, Gpu, HostVec};
use crate::fused;

use knn_core::{CandidateRequest, KnnError, Result, Symmetry};
use std::sync::atomic::Ordering;

/// One call's rows: approximate keys and ids (`nq × W`), and the exact keys when computed.
pub(super) struct Rows {
    pub(super) lists: Lists,
    pub(super) exact: Option<HostVec<f64>>,
    /// Per row, a key every point left out is at least, besides the W-th key (truncated
    /// splits of the fused method; +∞ elsewhere).
    pub(super) cut: Vec<f32>,
    /// Set when the rows were finished on the device (`keys`, `ids` and `exact` are empty).
    pub(super) finished: Option<fused::Finished>,
    /// Absolute input rounding of the keys per coordinate (see `fused::Output::input_abs`).
    pub(super) input_abs: f64,
}

/// A call's `nq × W` lists as they came from the device.
pub(super) enum Lists {
    /// The fused method's (key, id) composites, decoded by [`Lists::split`] once the device's
    /// lock is released: on a base split among 4 GPUs each round's 1.8·10⁶ entries took ~6 ms
    /// of the device's time from the next round's kernels. Decoded on the calling thread: on
    /// the rayon pool they queued behind the pipeline's work on other rounds.
    Composites(HostVec<u64>),
    /// Keys and ids (the reference kernels').
    Split(Vec<f32>, Vec<u32>),
}

impl Lists {
    /// Keys and ids, row-major.
    pub(super) fn split(self) -> (Vec<f32>, Vec<u32>) {
        match self {
            Lists::Composites(c) => c.iter().map(|&x| fused::decode(x)).unzip(),
            Lists::Split(keys, ids) => (keys, ids),
        }
    }
}

impl CudaEngine {
    /// Row-major `nq × W` (keys, ids) of `req` with this engine's method, or with the fused
    /// method and an expression module's kernels when `expr` names one; `to` says where the
    /// fused method's rows go.
    pub(super) fn rows(
        &self,
        gpu: &mut Gpu,
        req: &CandidateRequest<'_>,
        info: &BaseInfo,
        exact: bool,
        expr: Option<&str>,
        mut to: fused::Results<'_>,
    ) -> Result<Rows> {
        gpu.ctx
            .bind_to_thread()
            .map_err(crate::device::dev_err("binding the context"))?;
        let mut resident = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        let mut graph = self.graph.lock().unwrap_or_else(|p| p.into_inner());
        // A search of the resident base sizes its buffers from the free memory last read: it
        // uploads no base, and its buffers are mostly the previous call's, which the pool
        // keeps. Memory taken by others meanwhile shows as an allocation failure, and the
        // call then reads the device (below).
        let mut kept = match (req.base_key, resident.as_ref()) {
            (Some(key), Some(r)) => r.serves(key, info.centre.as_deref(), exact_view(req, exact)),
            _ => false,
        };
        let mut budget = self.budget_with(gpu, held_bytes(&resident, &graph), kept)?;
        if graph
            .as_ref()
            .is_some_and(|g| Some(g.key()) != req.base_key)
        {
            *graph = None;
        }
        let mut prefetched = self.prefetched.lock().unwrap_or_else(|p| p.into_inner());
        let ahead = *self.graph_ahead.lock().unwrap_or_else(|p| p.into_inner());
        let symmetric = self.method == Method::Fused
            && expr.is_none()
            && req.base_key.is_some()
            && ahead == req.base_key.map(|k| (k, req.width))
            && match self.symmetry {
                Symmetry::On => true,
                Symmetry::Off => false,
                Symmetry::Auto => {
                    self.pays_symmetric(req.base.rows(), req.base.dim(), req.kernel, req.width)
                }
            };
        if symmetric {
            gpu.sym_kernels()?;
        }
        let had_graph = graph.is_some();
        loop {
            let r = match (self.method, expr) {
                (Method::Fused, _) | (_, Some(_)) => {
                    let tag = expr.unwrap_or_else(|| fused::kernel_tag(req.kernel));
                    let base = fused::BaseView {
                        centre: info.centre.as_deref(),
                        cache: &mut resident,
                        exact: exact_view(req, exact && expr.is_none()),
                        graph: symmetric.then_some(&mut *graph),
                        share: self.share.as_ref(),
                        prefetched: &mut prefetched,
                    };
                    let to = to.reborrow();
                    let tuning = &self.tuning;
                    fused::run(gpu, req, budget, base, tag, tuning, to).map(|out| {
                        if let Ok(mut m) = self.last_kernel_ms.lock() {
                            *m = out.kernel_ms;
                        }
                        let cut = out
                            .cut
                            .into_iter()
                            .map(|c| {
                                if c == u64::MAX {
                                    f32::INFINITY
                                } else {
                                    fused::decode(c).0
                                }
                            })
                            .collect();
                        Rows {
                            lists: Lists::Composites(out.composites),
                            exact: out.exact,
                            cut,
                            finished: out.finished,
                            input_abs: out.input_abs,
                        }
                    })
                }
                (m, None) => crate::baseline::run(gpu, req, m, budget).map(|(keys, ids)| Rows {
                    lists: Lists::Split(keys, ids),
                    exact: None,
                    cut: vec![f32::INFINITY; req.queries.rows()],
                    finished: None,
                    input_abs: 0.0,
                }),
            };
            match r {
                Err(e) if is_oom(&e) && kept => {
                    // Sized from an old reading: read the device, keep the base.
                    let _ = gpu.sync();
                    kept = false;
                    budget = self.budget_with(gpu, held_bytes(&resident, &graph), false)?;
                }
                Err(e) if is_oom(&e) => {
                    let _ = gpu.sync();
                    *resident = None;
                    *graph = None;
                    // The share would keep this part's lists alive.
                    if let (Some(share), Some(key)) = (&self.share, ahead) {
                        share.withdraw(key);
                    }
                    if budget / 2 < MIN_BUDGET {
                        let d = req.base.dim();
                        return Err(KnnError::OutOfMemory {
                            device: gpu.name.clone(),
                            needed: (MIN_BUDGET + (req.queries.rows().min(128) + 128) * (d + 1) * 4)
                                as u64,
                            available: gpu.mem_info().map_or(0, |m| m.0) as u64,
                        });
                    }
                    budget /= 2;
                }
                r => {
                    if !had_graph && graph.is_some() {
                        self.graphs_made.fetch_add(1, Ordering::Relaxed);
                    }
                    return r;
                }
            }
        }
    }
}
