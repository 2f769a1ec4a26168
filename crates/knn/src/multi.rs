//! Several engines (one per GPU) behind one [`Engine`]: searches of large bases split the base
//! among them (each holds a part; their lists are merged), everything else splits the queries.

use knn_core::{
    part_key, CandidateRequest, Candidates, Engine, ExactFrom, ExprPlan, Kernel, KnnError,
    MatrixRef, Metric, PinnedOutput, Result,
};
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Several engines (GPUs) behind one [`Engine`].
///
/// - A search whose base holds at least [`MultiEngine::splitting_bases_from`] bytes (256 MiB by
///   default) splits the base: engine `g` holds rows `parts[g]` (its copy a G-th of the base's,
///   all copies side by side), every request's queries go to every engine, and the lists are
///   merged by (key, id) into the whole base's (see [`merge_parts`]). Copying the whole base to
///   every GPU is what held back the query split on large bases: 4 H200s, 10⁷ × 128 base,
///   4 × 5.12 GB shared the host's copy bandwidth for 1.1 s of a 2.5 s search.
/// - Otherwise (graphs, smaller bases) the pipeline hands whole rounds of queries to each engine
///   ([`Engine::devices`]; a symmetric graph's first tries then come from the pairs the engines
///   shared, see below); a request that reaches this engine directly is cut into query tiles
///   taken from a shared queue, one host thread per engine, each tile's rows back in place.
/// - Every engine is told of a whole graph ([`Engine::begin_graph`]) at once, a thread each:
///   CUDA engines that share graphs' pairs (`knn_cuda::GraphShare`) each make their part then.
pub(crate) struct MultiEngine {
    engines: Vec<Box<dyn Engine + Send>>,
    /// Base bytes (f32 values) from which searches split the base.
    split_bases_from: usize,
    /// Held while the engines are told of a graph: the parts of one graph wait for each other,
    /// so two graphs told at once could each hold an engine the other waits for.
    graph_begun: Mutex<()>,
}

/// Tiles per engine and request of the query split. Each tile is one engine call, and a CUDA
/// engine call uploads the whole base (measured on 2 H200s, n = 1e6, d = 256: 4096-query tiles
/// made two GPUs slower than one), so there is one tile per engine.
const TILES_PER_ENGINE: usize = 1;
/// Fewest queries per tile, so small requests are not cut up.
const MIN_TILE: usize = 1024;
/// Default of [`MultiEngine::splitting_bases_from`].
const SPLIT_BASES_FROM: usize = 256 << 20;

impl MultiEngine {
    /// The engines, at least one.
    pub(crate) fn new(engines: Vec<Box<dyn Engine + Send>>) -> Self {
        assert!(!engines.is_empty(), "MultiEngine needs an engine");
        MultiEngine {
            engines,
            split_bases_from: SPLIT_BASES_FROM,
            graph_begun: Mutex::new(()),
        }
    }

    /// The same engines, splitting the bases of searches from `bytes` of base values on (the
    /// answer is the same either way).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn splitting_bases_from(mut self, bytes: usize) -> Self {
        self.split_bases_from = bytes;
        self
    }

    /// Whether requests on `base` without exclusions split it among the engines.
    fn splits(&self, base: MatrixRef<'_>) -> bool {
        self.engines.len() > 1
            && base.rows() >= 2 * self.engines.len()
            && base.rows() * base.dim() * 4 >= self.split_bases_from
    }

    /// Whether `req` is shared among the engines by parts of its base: a search (no
    /// exclusions) of a base they split, whose parts' lists hold its width together.
    fn splits_request(&self, req: &CandidateRequest<'_>) -> bool {
        let parts = self.parts(req.base.rows());
        req.exclude.is_none()
            && self.splits(req.base)
            && parts
                .iter()
                .map(|r| part_width(req.width, r.len()))
                .sum::<usize>()
                >= req.width
    }

    /// `f(g, engine g)` for every engine at once, a host thread each; every answer, or the
    /// first error (a thread's panic as one).
    fn on_every_engine<T: Send>(
        &self,
        f: impl Fn(usize, &(dyn Engine + Send)) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        std::thread::scope(|s| {
            let f = &f;
            let threads: Vec<_> = (self.engines.iter().enumerate())
                .map(|(g, e)| s.spawn(move || f(g, e.as_ref())))
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join().unwrap_or_else(|_| {
                        Err(KnnError::Device("an engine's thread panicked".into()))
                    })
                })
                .collect()
        })
    }

    /// The base rows each engine holds: consecutive, as even as can be.
    fn parts(&self, rows: usize) -> Vec<std::ops::Range<usize>> {
        let g = self.engines.len();
        (0..g).map(|i| rows * i / g..rows * (i + 1) / g).collect()
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

    /// When any engine's are: the pipeline then asks unproven rows again with precise keys
    /// before it widens them.
    fn fast_first_tries(&self, kernel: Kernel) -> bool {
        self.engines.iter().any(|e| e.fast_first_tries(kernel))
    }

    /// Every engine copies its part of a base it splits (at once, each on a thread).
    fn prefetch_base(&self, base_key: u64, base: MatrixRef<'_>) {
        if !self.splits(base) {
            return;
        }
        let parts = self.parts(base.rows());
        std::thread::scope(|s| {
            for (g, (e, r)) in self.engines.iter().zip(parts).enumerate() {
                let part = base.slice_rows(r.start, r.end);
                s.spawn(move || e.prefetch_base(part_key(base_key, g), part));
            }
        });
    }

    /// Searches of a base it splits: none (this engine takes the rounds and shares each
    /// request); otherwise every engine.
    fn devices(&self, base: MatrixRef<'_>, self_join: bool) -> Vec<&dyn Engine> {
        if !self_join && self.splits(base) {
            return Vec::new();
        }
        self.engines
            .iter()
            .map(|e| e.as_ref() as &dyn Engine)
            .collect()
    }

    /// Every engine, at once (a thread each), the first error returned.
    fn begin_graph(
        &self,
        first: &CandidateRequest<'_>,
        finish: Option<(&Metric, usize)>,
    ) -> Result<()> {
        let _one = self.graph_begun.lock().unwrap_or_else(|p| p.into_inner());
        self.on_every_engine(|_, e| e.begin_graph(first, finish))
            .map(drop)
    }

    /// The first engine's page lock: the CUDA engines of a process share theirs (portable
    /// locks), so every engine's downloads of finished rows go straight into the output.
    fn pin_output(&self, ids: &mut [u32], distances: &mut [f32]) -> Option<PinnedOutput> {
        self.engines.first()?.pin_output(ids, distances)
    }

    /// One more than any engine's (this engine takes the rounds only of a base it splits,
    /// see [`MultiEngine::devices`]): each such round takes every engine, and its calls reach
    /// an engine's lock in whichever order they come, so of two rounds in flight each often
    /// waited for the other on some GPU; both then ended together and every GPU sat idle while
    /// the host merged them (4 H200s, 10⁷ × 10⁵: ~36 ms a pair of rounds of ~179 ms). A third
    /// round keeps a call queued on every GPU meanwhile.
    fn concurrent_rounds(&self) -> usize {
        let most = self.engines.iter().map(|e| e.concurrent_rounds()).max();
        most.unwrap_or(1) + 1
    }

    fn min_round_queries(&self) -> usize {
        self.engines
            .iter()
            .map(|e| e.min_round_queries())
            .max()
            .unwrap_or(4096)
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        if self.splits_request(req) {
            return self.split_base(req, Keys::Kernel).map(|(c, _)| c);
        }
        self.split(req, |e, sub| e.candidates(sub))
    }

    fn candidates_with_exact(
        &self,
        req: &CandidateRequest<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        if self.splits_request(req) {
            return self.split_base(req, Keys::Kernel);
        }
        Ok((self.candidates(req)?, None))
    }

    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        if self.splits_request(req) {
            return self.split_base(req, Keys::Expr(plan)).map(|(c, _)| c);
        }
        self.split(req, |e, sub| e.candidates_expr(sub, plan))
    }
}

/// What a request's keys are, for the floors of a merge.
#[derive(Clone, Copy)]
enum Keys<'p> {
    /// The request's kernel.
    Kernel,
    /// An expression metric's program.
    Expr(&'p ExprPlan),
}

/// One engine's answer for its part of the base.
struct Part {
    cand: Candidates,
    /// Exact keys of `cand`'s entries, when the engine gave them.
    exact: Option<Vec<f64>>,
    /// The part's first base row: its ids are local, `offset + id` global.
    offset: u32,
}

impl MultiEngine {
    /// `req` with every engine computing the lists of all its queries against its part of the
    /// base (at once, a host thread each), merged by [`merge_parts`].
    fn split_base(
        &self,
        req: &CandidateRequest<'_>,
        keys: Keys<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        req.check_width()?;
        let parts = self.parts(req.base.rows());
        let parts = self.on_every_engine(|g, e| {
            let r = &parts[g];
            let sub = CandidateRequest {
                base: req.base.slice_rows(r.start, r.end),
                width: part_width(req.width, r.len()),
                base_key: req.base_key.map(|k| part_key(k, g)),
                exact_from: req.exact_from.map(|ExactFrom::Hellinger { base, queries }| {
                    ExactFrom::Hellinger {
                        base: base.slice_rows(r.start, r.end),
                        queries,
                    }
                }),
                ..*req
            };
            let (cand, exact) = match keys {
                Keys::Kernel => e.candidates_with_exact(&sub)?,
                Keys::Expr(plan) => (e.candidates_expr(&sub, plan)?, None),
            };
            let rows = sub.queries.rows();
            let exact = exact.filter(|x| x.len() == cand.ids.len());
            if cand.width != sub.width
                || cand.floor.len() != rows
                || cand.ids.len() != rows * cand.width
                || cand.keys.len() != cand.ids.len()
            {
                return Err(KnnError::Device(format!(
                    "engine {} returned {} floors and {} ids of width {} for {rows} queries of width {}",
                    e.name(),
                    cand.floor.len(),
                    cand.ids.len(),
                    cand.width,
                    sub.width
                )));
            }
            Ok(Part {
                cand,
                exact,
                offset: r.start as u32,
            })
        })?;
        Ok(merge_parts(req, &parts, keys))
    }
}

/// The whole base's lists of `req` from its parts' lists: per row the `req.width` smallest
/// entries by (key, global id) of the parts' rows (each the smallest of its part, so these are
/// the smallest of the base), with their exact keys when every part gave them.
///
/// The floor bounds the exact key of every point left out: a point outside every part's list
/// lies above its part's floor, and an entry the merge drops lies at its exact key, known from
/// the part's exact keys (the kernel's of the request's rows), computed here from the rows when
/// the part gave none (or gave Hellinger's of the given rows), or, under an expression metric,
/// above the plan's floor of its computed key. Where every part's floors bound their rows'
/// rounding ([`Candidates::floor_bounds_rounding`]), the floor is also kept at most the last key
/// less the largest bound a part's row shows (`key − floor` of its last entry), so that the
/// merged floors bound the merged rows' rounding too.
fn merge_parts(
    req: &CandidateRequest<'_>,
    parts: &[Part],
    keys: Keys<'_>,
) -> (Candidates, Option<Vec<f64>>) {
    let (nq, w) = (req.queries.rows(), req.width);
    let rounding = parts.iter().all(|p| p.cand.floor_bounds_rounding);
    let mut ids = vec![0u32; nq * w];
    let mut out_keys = vec![0f32; nq * w];
    let mut floor = vec![0f32; nq];
    // Filled from the parts that gave exact keys; kept when all did.
    let mut exact = vec![0f64; nq * w];
    ids.par_chunks_mut(w)
        .zip(out_keys.par_chunks_mut(w))
        .zip(exact.par_chunks_mut(w))
        .zip(floor.par_iter_mut())
        .enumerate()
        .for_each(|(i, (((ids, ks), ex), fl))| {
            // Next entry of each part's row.
            let mut at = vec![0usize; parts.len()];
            for slot in 0..w {
                let mut best: Option<(usize, f32, u32)> = None;
                for (g, p) in parts.iter().enumerate() {
                    if at[g] < p.cand.width {
                        let j = i * p.cand.width + at[g];
                        let (k, id) = (p.cand.keys[j], p.offset + p.cand.ids[j]);
                        let before = |&(_, bk, bid): &(usize, f32, u32)| {
                            k.total_cmp(&bk).then(id.cmp(&bid)).is_lt()
                        };
                        if best.as_ref().is_none_or(before) {
                            best = Some((g, k, id));
                        }
                    }
                }
                let (g, k, id) = best.expect("the parts hold `width` entries per row together");
                let j = i * parts[g].cand.width + at[g];
                (ks[slot], ids[slot]) = (k, id);
                ex[slot] = parts[g].exact.as_ref().map_or(f64::NAN, |e| e[j]);
                at[g] += 1;
            }
            // Where the parts' floors bound their rows' rounding, the merged floor must bound
            // the merged row's: each part's bound, recovered the same way, must fit in it.
            let slack = if rounding {
                parts
                    .iter()
                    .map(|p| p.cand.keys[(i + 1) * p.cand.width - 1] - p.cand.floor[i])
                    .fold(0.0, f32::max)
            } else {
                f32::NEG_INFINITY
            };
            *fl = parts
                .iter()
                .zip(&at)
                .map(|(p, &next)| {
                    let dropped = i * p.cand.width + next..(i + 1) * p.cand.width;
                    p.cand.floor[i].min(dropped_floor(req, p, dropped, keys))
                })
                .fold(f32_at_most(ks[w - 1] as f64 - slack as f64), f32::min);
        });
    let all_exact = parts.iter().all(|p| p.exact.is_some());
    let cand = Candidates {
        width: w,
        ids,
        keys: out_keys,
        floor,
        floor_bounds_rounding: rounding,
    };
    (cand, all_exact.then_some(exact))
}

/// A lower bound on the exact key of part `p`'s entries `dropped` (indices into its lists) of
/// their row (see [`merge_parts`]); `+∞` for none.
fn dropped_floor(
    req: &CandidateRequest<'_>,
    p: &Part,
    dropped: std::ops::Range<usize>,
    keys: Keys<'_>,
) -> f32 {
    if dropped.is_empty() {
        return f32::INFINITY;
    }
    let least = match (keys, &p.exact) {
        // Every dropped entry's computed key is at least the first's.
        (Keys::Expr(plan), _) => return plan.floor(p.cand.keys[dropped.start]),
        (Keys::Kernel, Some(exact)) if req.exact_from.is_none() => {
            exact[dropped].iter().copied().fold(f64::INFINITY, f64::min)
        }
        (Keys::Kernel, _) => {
            let q = req.queries.row(dropped.start / p.cand.width);
            p.cand.ids[dropped]
                .iter()
                .map(|&id| req.kernel.exact(q, req.base.row((p.offset + id) as usize)))
                .fold(f64::INFINITY, f64::min)
        }
    };
    f32_at_most(least)
}

/// The width asked of a part of `rows` rows for lists `width` wide: never all its rows, so that
/// its floor is finite (a part's lists holding all its points would have an infinite floor,
/// which says nothing of its keys' rounding, see [`merge_parts`]).
fn part_width(width: usize, rows: usize) -> usize {
    width.min(rows - 1)
}

/// The largest f32 not above `x` (NaN stays NaN: no bound).
fn f32_at_most(x: f64) -> f32 {
    let f = x as f32;
    if f as f64 > x {
        f.next_down()
    } else {
        f
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
            floor_bounds_rounding: true,
        };
        for r in done.into_inner().unwrap_or_else(|p| p.into_inner()) {
            let c = r.ok_or_else(|| {
                KnnError::Device("a GPU stopped before its tiles were done".into())
            })??;
            out.ids.extend_from_slice(&c.ids);
            out.keys.extend_from_slice(&c.keys);
            out.floor.extend_from_slice(&c.floor);
            out.floor_bounds_rounding &= c.floor_bounds_rounding;
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

    /// A CPU engine that never gives exact keys (the merge then computes the dropped ones).
    struct NoExact(knn_cpu::CpuEngine);

    impl Engine for NoExact {
        fn name(&self) -> String {
            "no-exact".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
            self.0.candidates(req)
        }
        fn candidates_expr(
            &self,
            req: &CandidateRequest<'_>,
            plan: &ExprPlan,
        ) -> Result<Candidates> {
            self.0.candidates_expr(req, plan)
        }
    }

    fn cpu() -> Box<dyn Engine + Send> {
        Box::new(knn_cpu::CpuEngine::new(Some(1)).unwrap())
    }

    /// 1000 distinct rows three times over: every point has twins in the other parts, so the
    /// merge meets equal keys at every slot.
    fn twins(d: usize) -> Matrix {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let rows = generate(u, 1000, d, 5);
        Matrix::new("base", [&rows[..], &rows[..], &rows[..]].concat(), d).unwrap()
    }

    #[test]
    fn split_bases_give_the_single_engine_answer() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let d = 9;
        let queries = Matrix::new("queries", generate(u, 700, d, 2), d).unwrap();
        let one = knn_cpu::CpuEngine::new(Some(1)).unwrap();
        let l1 = Metric::Expr(std::sync::Arc::new(
            knn_core::MetricExpr::parse("acc + abs(x - y)").unwrap(),
        ));
        let metrics = [
            Metric::L2,
            Metric::SqL2,
            Metric::L1,
            Metric::Linf,
            Metric::InnerProduct,
            Metric::Cosine,
            Metric::Hellinger,
            l1,
        ];
        for base in [
            Matrix::new("base", generate(u, 3001, d, 1), d).unwrap(),
            twins(d),
        ] {
            let split = MultiEngine::new(vec![cpu(), cpu(), cpu()]).splitting_bases_from(0);
            let no_exact = MultiEngine::new(vec![
                Box::new(NoExact(knn_cpu::CpuEngine::new(Some(1)).unwrap())),
                Box::new(NoExact(knn_cpu::CpuEngine::new(Some(1)).unwrap())),
            ])
            .splitting_bases_from(0);
            assert!(split.devices(base.view(), false).is_empty());
            assert_eq!(split.devices(base.view(), true).len(), 3);
            for metric in &metrics {
                for k in [1, 10, 64] {
                    let a = knn_core::search(&one, base.view(), queries.view(), k, metric).unwrap();
                    let b = knn_core::search(&split, base.view(), queries.view(), k, metric);
                    assert_eq!(a, b.unwrap(), "{metric} k={k}");
                    let c = knn_core::search(&no_exact, base.view(), queries.view(), k, metric);
                    assert_eq!(a, c.unwrap(), "{metric} k={k}, no exact keys");
                }
            }
        }
    }

    /// The merged lists are each row's smallest by (key, id) among the parts' lists, and every
    /// point left out lies at or above the row's floor (checked against every point's exact
    /// key), with and without the parts' exact keys.
    #[test]
    fn merged_floors_bound_every_point_left_out() {
        let u = Distribution::Uniform { lo: -1.0, hi: 1.0 };
        let d = 7;
        let queries = Matrix::new("queries", generate(u, 300, d, 3), d).unwrap();
        for base in [
            Matrix::new("base", generate(u, 2000, d, 4), d).unwrap(),
            twins(d),
        ] {
            let engines = [
                MultiEngine::new(vec![cpu(), cpu(), cpu(), cpu()]).splitting_bases_from(0),
                MultiEngine::new(vec![
                    Box::new(NoExact(knn_cpu::CpuEngine::new(Some(1)).unwrap())),
                    Box::new(NoExact(knn_cpu::CpuEngine::new(Some(1)).unwrap())),
                    Box::new(NoExact(knn_cpu::CpuEngine::new(Some(1)).unwrap())),
                ])
                .splitting_bases_from(0),
            ];
            for multi in &engines {
                for (kernel, width) in [(Kernel::SqL2, 5), (Kernel::L1, 40), (Kernel::NegDot, 17)] {
                    let req = CandidateRequest {
                        base: base.view(),
                        queries: queries.view(),
                        kernel,
                        width,
                        exclude: None,
                        precise: false,
                        base_key: Some(knn_core::base_key()),
                        exact_data: true,
                        exact_from: None,
                    };
                    let (c, exact) = multi.candidates_with_exact(&req).unwrap();
                    assert_eq!(c.width, width);
                    for i in 0..queries.rows() {
                        let (ids, keys) =
                            (&c.ids[i * width..][..width], &c.keys[i * width..][..width]);
                        for j in 1..width {
                            let order = keys[j - 1]
                                .total_cmp(&keys[j])
                                .then(ids[j - 1].cmp(&ids[j]));
                            assert!(order.is_lt(), "row {i} out of order at {j}");
                        }
                        let q = queries.view().row(i);
                        // The re-rank's reading of a floor: no candidate's exact key lies
                        // further below its computed key than the last one's below the floor.
                        assert!(c.floor_bounds_rounding);
                        let slack = keys[width - 1] as f64 - c.floor[i] as f64;
                        for (&id, &key) in ids.iter().zip(keys) {
                            let x = kernel.exact(q, base.view().row(id as usize));
                            assert!(x >= key as f64 - slack, "row {i}: {id} beyond the slack");
                        }
                        for p in 0..base.rows() as u32 {
                            let x = kernel.exact(q, base.view().row(p as usize));
                            match ids.iter().position(|&id| id == p) {
                                None => {
                                    assert!(x >= c.floor[i] as f64, "row {i}: {p} below the floor")
                                }
                                Some(j) => {
                                    if let Some(e) = &exact {
                                        assert_eq!(e[i * width + j], x);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// A maker of fused CUDA engines on device 0 (the CPU engine their fallback), or `None`
    /// without a usable device: the test is skipped then, and fails with `KNN_REQUIRE_GPU=1`.
    fn cuda_engine() -> Option<impl Fn() -> knn_cuda::CudaEngine> {
        if !knn_cuda::CudaEngine::available() {
            assert!(
                std::env::var_os("KNN_REQUIRE_GPU").is_none(),
                "KNN_REQUIRE_GPU is set but no CUDA device is usable"
            );
            eprintln!("skipped: no CUDA device");
            return None;
        }
        Some(|| {
            let fallback = Box::new(knn_cpu::CpuEngine::new(None).unwrap());
            knn_cuda::CudaEngine::new(0, knn_cuda::Method::Fused)
                .unwrap()
                .with_fallback(fallback)
        })
    }

    /// Two CUDA engines on one device, each holding half the base: the answer of the CPU
    /// engine alone (skipped without a GPU, a failure then with `KNN_REQUIRE_GPU=1`).
    #[test]
    fn cuda_engines_split_the_base() {
        let Some(gpu) = cuda_engine() else {
            return;
        };
        let split =
            MultiEngine::new(vec![Box::new(gpu()), Box::new(gpu())]).splitting_bases_from(0);
        let one = knn_cpu::CpuEngine::new(None).unwrap();
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        for (nb, d) in [(20_001, 64), (4099, 3)] {
            let base = Matrix::new("base", generate(u, nb, d, 6), d).unwrap();
            let queries = Matrix::new("queries", generate(u, 1500, d, 7), d).unwrap();
            for base in [base, twins(d)] {
                for metric in [
                    Metric::L2,
                    Metric::InnerProduct,
                    Metric::Cosine,
                    Metric::L1,
                    Metric::Hellinger,
                ] {
                    for k in [1, 16, 100] {
                        let a = knn_core::search(&one, base.view(), queries.view(), k, &metric);
                        let b = knn_core::search(&split, base.view(), queries.view(), k, &metric);
                        assert_eq!(
                            a.unwrap(),
                            b.unwrap(),
                            "{metric} k={k} n={} d={d}",
                            base.rows()
                        );
                    }
                }
            }
        }
    }

    /// Three CUDA engines on one device sharing the pairs of symmetric graphs (each a third of
    /// the collect form's tiles, rows merged from the three parts): the CPU engine's graphs
    /// (skipped without a GPU, a failure then with `KNN_REQUIRE_GPU=1`).
    #[test]
    fn cuda_engines_share_graph_pairs() {
        let Some(gpu) = cuda_engine() else {
            return;
        };
        let shares = knn_cuda::GraphShare::new(3);
        let watch = shares[0].clone();
        let engines = shares
            .into_iter()
            .map(|share| -> Box<dyn Engine + Send> {
                Box::new(
                    gpu()
                        .with_symmetry(knn_core::Symmetry::On)
                        .with_graph_share(share),
                )
            })
            .collect();
        let shared = MultiEngine::new(engines);
        let one = knn_cpu::CpuEngine::new(None).unwrap();
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        // 20 001 points: thresholds from a sample; 1000: every pair kept; 200: two tiles, so
        // one part has none; the twins: every point thrice, ties across the parts.
        for (n, d) in [(20_001, 64), (1000, 32), (200, 16)] {
            let points = Matrix::new("points", generate(u, n, d, 8), d).unwrap();
            for points in [points, twins(d)] {
                for metric in [
                    Metric::L2,
                    Metric::InnerProduct,
                    Metric::Cosine,
                    Metric::Hellinger,
                ] {
                    for k in [1, 16, 100] {
                        if k >= points.rows() {
                            continue;
                        }
                        let before = watch.rows_merged();
                        let a = knn_core::graph(&one, points.view(), k, &metric).unwrap();
                        let b = knn_core::graph(&shared, points.view(), k, &metric).unwrap();
                        let what = format!("{metric} k={k} n={} d={d}", points.rows());
                        assert_eq!(a, b, "{what}");
                        assert!(watch.rows_merged() > before, "{what}: no rows were merged");
                    }
                }
            }
        }
    }
}
