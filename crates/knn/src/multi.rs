//! Several engines (one per GPU) behind one [`Engine`].

use knn_core::{CandidateRequest, Candidates, Engine, ExprPlan, Kernel, KnnError, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Several engines (GPUs) behind one [`Engine`]: the queries of a request are cut into tiles
/// taken from a shared queue by one host thread per GPU, so faster or less loaded GPUs take
/// more; each tile's rows come back in place.
pub(crate) struct MultiEngine {
    engines: Vec<Box<dyn Engine + Send>>,
}

/// Tiles per engine and request. Each tile is one engine call, and a CUDA engine call uploads
/// the whole base (measured on 2 H200s, n = 1e6, d = 256: 4096-query tiles made two GPUs slower
/// than one), so there is one tile per engine until the base stays resident between calls.
const TILES_PER_ENGINE: usize = 1;
/// Fewest queries per tile, so small requests are not cut up.
const MIN_TILE: usize = 1024;

impl MultiEngine {
    /// The engines, at least one.
    pub(crate) fn new(engines: Vec<Box<dyn Engine + Send>>) -> Self {
        assert!(!engines.is_empty(), "MultiEngine needs an engine");
        MultiEngine { engines }
    }
}

impl Engine for MultiEngine {
    fn name(&self) -> String {
        let names: Vec<String> = self.engines.iter().map(|e| e.name()).collect();
        names.join("+")
    }

    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        self.engines[0].candidate_width(k, available, kernel)
    }

    /// The pipeline hands whole rounds to each engine (each overlapping its device work with
    /// the host's re-rank), instead of cutting every call in pieces.
    fn fast_first_tries(&self, kernel: Kernel) -> bool {
        self.engines.iter().any(|e| e.fast_first_tries(kernel))
    }

    fn devices(&self) -> Vec<&dyn Engine> {
        self.engines
            .iter()
            .map(|e| e.as_ref() as &dyn Engine)
            .collect()
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        self.split(req, |e, sub| e.candidates(sub))
    }

    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        self.split(req, |e, sub| e.candidates_expr(sub, plan))
    }
}

impl MultiEngine {
    /// Cuts the request's queries into tiles that the engines take from a shared queue, each
    /// tile computed by `run`; the rows come back in place.
    fn split(
        &self,
        req: &CandidateRequest<'_>,
        run: impl Fn(&dyn Engine, &CandidateRequest<'_>) -> Result<Candidates> + Sync,
    ) -> Result<Candidates> {
        let nq = req.queries.rows();
        let tile = nq
            .div_ceil(TILES_PER_ENGINE * self.engines.len())
            .max(MIN_TILE)
            .min(nq)
            .max(1);
        let tiles = nq.div_ceil(tile);
        let next = AtomicUsize::new(0);
        let done: Mutex<Vec<Option<Result<Candidates>>>> =
            Mutex::new((0..tiles).map(|_| None).collect());
        std::thread::scope(|s| {
            for e in &self.engines {
                let (next, done) = (&next, &done);
                let run = &run;
                s.spawn(move || loop {
                    let t = next.fetch_add(1, Ordering::Relaxed);
                    if t >= tiles {
                        break;
                    }
                    let (q0, q1) = (t * tile, ((t + 1) * tile).min(nq));
                    let sub = CandidateRequest {
                        queries: req.queries.slice_rows(q0, q1),
                        exclude: req.exclude.map(|x| &x[q0..q1]),
                        ..*req
                    };
                    let r = run(e.as_ref(), &sub);
                    let failed = r.is_err();
                    done.lock().unwrap_or_else(|p| p.into_inner())[t] = Some(r);
                    if failed {
                        // Stop handing out tiles: the request fails anyway.
                        next.store(tiles, Ordering::Relaxed);
                    }
                });
            }
        });
        let mut out = Candidates {
            width: req.width,
            ids: Vec::with_capacity(nq * req.width),
            keys: Vec::with_capacity(nq * req.width),
            floor: Vec::with_capacity(nq),
        };
        for r in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
            let c = r.ok_or_else(|| {
                KnnError::Device("a GPU stopped before its tiles were done".into())
            })??;
            out.ids.extend_from_slice(&c.ids);
            out.keys.extend_from_slice(&c.keys);
            out.floor.extend_from_slice(&c.floor);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use knn_core::synth::{generate, Distribution};
    use knn_core::{Matrix, Metric};

    #[test]
    fn several_engines_give_the_single_engine_answer() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let d = 9;
        let base = Matrix::new("base", generate(u, 3001, d, 1), d).unwrap();
        let queries = Matrix::new("queries", generate(u, 9000, d, 2), d).unwrap();
        let one = knn_cpu::CpuEngine::new(Some(1)).unwrap();
        let multi = MultiEngine::new(vec![
            Box::new(knn_cpu::CpuEngine::new(Some(1)).unwrap()),
            Box::new(knn_cpu::CpuEngine::new(Some(1)).unwrap()),
            Box::new(knn_cpu::CpuEngine::new(Some(1)).unwrap()),
        ]);
        assert_eq!(multi.name(), "cpu+cpu+cpu");
        let l1 = Metric::Expr(std::sync::Arc::new(
            knn_core::MetricExpr::parse("acc + abs(x - y)").unwrap(),
        ));
        for metric in [Metric::L2, Metric::L1, l1] {
            let a = knn_core::search(&one, base.view(), queries.view(), 10, &metric).unwrap();
            let b = knn_core::search(&multi, base.view(), queries.view(), 10, &metric).unwrap();
            assert_eq!(a, b);
            let a = knn_core::graph(&one, base.view(), 5, &metric).unwrap();
            let b = knn_core::graph(&multi, base.view(), 5, &metric).unwrap();
            assert_eq!(a, b);
        }
    }
}
