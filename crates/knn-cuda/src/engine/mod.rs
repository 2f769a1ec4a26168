//! [`CudaEngine`]: the public face of the crate; no CUDA types cross it.

mod device_io;
mod finish;
mod method;
mod rows;

pub use device_io::{DeviceMemory, DeviceQueries, DeviceResults, DeviceSearch, Plain};
pub use method::Method;

use crate::device::{driver_device_count, Gpu, HostVec, LockedPool};
use crate::floor::{centred_norms, floors, mean, F32_UNIT, TF32_ACC_UNIT, TF32_INPUT_UNIT};
use crate::fused::{
    self, GraphLists, GraphShare, Resident, Results, SELECT_WIDTH_MAX, SMALL_WIDTH_MAX,
};
use crate::tuning::CudaTuning;
use knn_core::{
    CandidateRequest, Candidates, Engine, ExactFrom, ExprPlan, FinishedRows, Kernel, KnnError,
    MatrixRef, Metric, PinnedOutput, Result, RowSlices, Symmetry,
};
use rows::Rows;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A CUDA device with one method. Calls are serialised on the device's stream.
pub struct CudaEngine {
    gpu: Mutex<Gpu>,
    method: Method,
    ordinal: usize,
    budget: Option<usize>,
    last_kernel_ms: Mutex<Option<f32>>,
    /// The fused method's base kept on the device between the calls of one pipeline run.
    resident: Mutex<Option<Resident>>,
    /// What the host derived from the base of the last keyed request.
    base_info: Mutex<Option<BaseInfo>>,
    /// Whether kNN graphs compute each unordered pair once (fused method).
    symmetry: Symmetry,
    /// Widths, splits, the collect plan and copy threads (automatic by default).
    tuning: CudaTuning,
    /// The whole graph announced by [`Engine::begin_graph`]: base key and first-try width.
    graph_ahead: Mutex<Option<(u64, usize)>>,
    /// Its symmetric lists, once made.
    graph: Mutex<Option<GraphLists>>,
    /// The engines (other GPUs) this one shares graphs' pairs with, if any.
    share: Option<GraphShare>,
    /// Graphs whose first tries were made symmetrically so far.
    graphs_made: AtomicUsize,
    /// The given base of the coming requests, copied while the host prepared.
    prefetched: Mutex<Option<fused::Prefetched>>,
    /// Serves the requests wider than the kernels' lists ([`SELECT_WIDTH_MAX`]): the engine
    /// the caller paired this one with (`knn` gives the CPU engine).
    fallback: Option<Box<dyn Engine + Send>>,
    /// The device's context and its page-locked host ranges (see `Engine::pin_output`),
    /// reachable without the device's lock.
    pins: (
        Arc<cudarc::driver::CudaContext>,
        Arc<crate::device::HostPins>,
    ),
    /// Page-locked blocks for the calls' host lists (see `fused::HostLists`).
    lists_pool: Arc<LockedPool>,
}

/// Device bytes an engine's resident base and graph lists hold.
fn held_bytes(resident: &Option<Resident>, graph: &Option<GraphLists>) -> usize {
    resident.as_ref().map_or(0, Resident::bytes) + graph.as_ref().map_or(0, GraphLists::bytes)
}

/// The exact keys the fused method gives for `req` when `wanted`: the kernel's, or Hellinger's
/// of the given rows the request names (which must pair with its rows).
fn exact_view<'a>(req: &CandidateRequest<'a>, wanted: bool) -> Option<fused::Exact<'a>> {
    match req.exact_from {
        _ if !wanted => None,
        None => Some(fused::Exact::Kernel),
        Some(ExactFrom::Hellinger { base, queries })
            if base.rows() == req.base.rows()
                && queries.rows() == req.queries.rows()
                && base.dim() == req.base.dim()
                && queries.dim() == req.base.dim() =>
        {
            Some(fused::Exact::Hellinger {
                base: base.as_slice(),
                queries: queries.as_slice(),
            })
        }
        Some(_) => None,
    }
}

/// Host-side facts about a base, kept per [`CandidateRequest::base_key`].
#[derive(Clone)]
struct BaseInfo {
    key: Option<u64>,
    kernel: Kernel,
    exact_data: bool,
    /// The centre the fused method subtracts (squared L2), as f32.
    centre: Option<Vec<f32>>,
    /// Upper bound on the norms of the (centred) base rows.
    bn_max: f32,
    /// Upper bounds on each (centred) base row's norm, as `floors` takes them: the floors of
    /// a graph's rows (rows of the base) read them instead of measuring the rows per call.
    /// `None` for L1 and L∞, and for rows the device derives and measures.
    norms: Option<Arc<[f32]>>,
}

/// Smallest working budget tried before giving up with `OutOfMemory`.
const MIN_BUDGET: usize = 16 << 20;

/// Points from which [`Symmetry::Auto`] computes graphs symmetrically (see
/// [`CudaEngine::pays_symmetric`]).
const SYMMETRIC_MIN_POINTS: usize = 40_000;
/// Points from which [`Symmetry::Auto`] computes graphs of the TF32 GEMM kernels in the
/// collect form.
const COLLECT_MIN_POINTS: usize = 10_000;

/// Widest candidate lists finished on the device (`finish_lists` sorts a row in shared memory).
const FINISH_WIDTH_MAX: usize = 2048;

/// Output buffers from this size on are page-locked for the rounds (`Engine::pin_output`).
/// From 4 MiB before: the seed-002 Hellinger graph at n = 10 000 (two 4 000 000-byte buffers)
/// took 3.51–3.72 ms with its rows staged, 3.02–3.11 ms locked (H100, medians of 9).
const PIN_OUTPUT_MIN: usize = 1 << 20;

impl CudaEngine {
    /// Opens device `ordinal`, compiles (or loads from the cache) the kernels.
    pub fn new(ordinal: usize, method: Method) -> Result<Self> {
        let gpu = Gpu::new(ordinal)?;
        let pins = (gpu.ctx.clone(), gpu.pins.clone());
        let lists_pool = LockedPool::new(gpu.ctx.clone(), gpu.pins.clone());
        Ok(Self {
            pins,
            lists_pool,
            gpu: Mutex::new(gpu),
            method,
            ordinal,
            budget: None,
            last_kernel_ms: Mutex::new(None),
            resident: Mutex::new(None),
            base_info: Mutex::new(None),
            symmetry: Symmetry::Auto,
            tuning: CudaTuning::default(),
            graph_ahead: Mutex::new(None),
            graph: Mutex::new(None),
            share: None,
            graphs_made: AtomicUsize::new(0),
            prefetched: Mutex::new(None),
            fallback: None,
        })
    }

    /// The same engine with `fallback` serving the requests wider than its kernels' lists
    /// ([`SELECT_WIDTH_MAX`]; only re-asks of a few hard rows, or k beyond it). Without one
    /// such requests are refused with an error.
    pub fn with_fallback(mut self, fallback: Box<dyn Engine + Send>) -> Self {
        self.fallback = Some(fallback);
        self
    }

    /// The fallback engine for a request of width `w`.
    fn fallback(&self, w: usize) -> Result<&dyn Engine> {
        self.fallback.as_deref().map(|e| e as &dyn Engine).ok_or_else(|| {
            KnnError::Option(format!(
                "{}: candidate lists of {w} exceed the kernels' {SELECT_WIDTH_MAX} and no fallback engine was given",
                self.name()
            ))
        })
    }

    /// The same engine sharing the pairs of symmetric kNN graphs with the other engines of
    /// `share` (one per GPU, see [`GraphShare`]): told of a graph (`Engine::begin_graph`), it
    /// makes its part of the collect form's lists at once, and each of its rounds merges every
    /// part's lists of its rows. The answer is the same as alone.
    pub fn with_graph_share(mut self, share: GraphShare) -> Self {
        self.share = Some(share);
        self
    }

    /// Lets the GPUs of `engines` read and write one another's memory directly (peer access,
    /// where the devices allow it): give it the engines that share graphs ([`GraphShare`]),
    /// whose parts copy base rows, thresholds and lists from one another.
    pub fn link_peers(engines: &[&CudaEngine]) {
        let gpus: Vec<_> = engines
            .iter()
            .filter_map(|e| e.locked().ok().map(|g| (g.ctx.clone(), g.pool)))
            .collect();
        crate::device::link_peers(&gpus);
    }

    /// The same engine with kNN graphs computed symmetrically `On`, `Off`, or where it pays
    /// (`Auto`, the default: see [`CudaEngine::pays_symmetric`]): each unordered pair's key
    /// computed once on the tensor cores (L1, L∞: FP32) and folded into both points' lists,
    /// for first tries of width up to 128. The answer is the same either way.
    pub fn with_symmetry(mut self, symmetry: Symmetry) -> Self {
        self.symmetry = symmetry;
        self
    }

    /// The same engine with `tuning` in place of the automatic choices (see [`CudaTuning`]:
    /// `CudaTuning::default()` is what [`CudaEngine::new`] gives). The answer is the same
    /// whatever the tuning.
    pub fn with_tuning(mut self, tuning: CudaTuning) -> Self {
        let gpu = self.gpu.get_mut().unwrap_or_else(|p| p.into_inner());
        gpu.set_copy_threads(tuning.copy_threads());
        self.tuning = tuning;
        self
    }

    /// The tuning this engine runs with.
    pub fn tuning(&self) -> &CudaTuning {
        &self.tuning
    }

    /// How many graphs' first tries this engine has made symmetrically (tests, benchmarks).
    pub fn symmetric_graphs(&self) -> usize {
        self.graphs_made.load(Ordering::Relaxed)
    }

    /// `Auto`'s rule for a graph of `n` points of dimension `d` with first tries of `kernel`,
    /// `width` wide. The TF32 GEMM kernels (d a multiple of 4) take the collect form from
    /// 10 000 points; the folds (L1, L∞, and GEMM kernels of other d) from 40 000 points, with
    /// lists wider than 32 or the direct kernels. Measured on an H100 (end to end, one-sided /
    /// symmetric, same graphs): collect form, d = 256, k = 100: Hellinger 1.08× at n = 10 000,
    /// 1.18× at 20 000, 1.25× at 40 000, 1.32× at 80 000; L2 1.40×, cosine 1.04× at 80 000;
    /// d = 128, n = 80 000: L2 k = 10 1.38×, k = 30 1.38×. Fold: L1 d = 128, k = 10, n =
    /// 80 000 1.37×; Hellinger d = 256, k = 100: 0.89× at 10 000, 1.07× at 40 000. Those runs
    /// may have reused the first graph's lists (see NOTES.md, "Graphs computed anew"); each
    /// graph computed anew on an H200: collect form, Hellinger d = 256, k = 100 1.17× at 10 000,
    /// 2.01× at 20 000, 2.52× at 40 000; L2 d = 128, k = 10 1.00× at 10 000, 1.35× at 20 000.
    pub fn pays_symmetric(&self, n: usize, d: usize, kernel: Kernel, width: usize) -> bool {
        if kernel.is_gemm() && d.is_multiple_of(4) {
            n >= COLLECT_MIN_POINTS
        } else {
            n >= SYMMETRIC_MIN_POINTS && (width > 32 || !kernel.is_gemm())
        }
    }

    /// Caps the device memory this engine's tiles may use (default: 70 % of free memory);
    /// small caps force query and base tiling (base streamed from host), as for inputs larger
    /// than the GPU.
    pub fn with_memory_budget(mut self, bytes: usize) -> Self {
        self.budget = Some(bytes.max(1 << 16));
        self
    }

    /// The same engine timing each fused call's kernels with CUDA events, read by
    /// [`CudaEngine::last_kernel_ms`] (benchmarks). Off by default: the events are driver calls
    /// on the path of every search, and the host then waits twice (for the events and for the
    /// rows): about 10 µs of a 0.2–0.4 ms small search.
    pub fn with_kernel_timing(mut self) -> Self {
        self.gpu
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .kernel_timing = true;
        self
    }

    /// Device time in ms of the last fused call's kernels (CUDA events; transfers and host
    /// work excluded), for benchmarks; `None` unless the engine was made
    /// [`CudaEngine::with_kernel_timing`].
    pub fn last_kernel_ms(&self) -> Option<f32> {
        self.last_kernel_ms.lock().ok().and_then(|m| *m)
    }

    /// `true` when a CUDA driver and at least one device are present. Never panics.
    pub fn available() -> bool {
        driver_device_count() > 0
    }

    /// Registers, local (spill) bytes and static shared memory of the main kernels, for tuning.
    pub fn kernel_report(&self) -> String {
        match self.gpu.lock() {
            Ok(g) => g.kernel_report(),
            Err(_) => String::new(),
        }
    }

    /// The method this engine runs.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The centre and norm bound of `req`'s base: computed once per base key.
    fn base_info(&self, req: &CandidateRequest<'_>) -> BaseInfo {
        // The lock is not held while the facts are computed on the rayon pool: a join there
        // may run another round's task on this thread, which would wait for this lock.
        if let Some(info) = self
            .base_info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            if info.key.is_some()
                && info.key == req.base_key
                && info.kernel == req.kernel
                && info.exact_data == req.exact_data
            {
                return info.clone();
            }
        }
        // Centring pays only for the GEMM form of squared L2 (translation-invariant keys whose
        // rounding bound grows with the norms), and is sound only on exact data (see
        // `CandidateRequest::exact_data`); the baselines keep the data as given.
        let centre = (self.method == Method::Fused && req.kernel == Kernel::SqL2 && req.exact_data)
            .then(|| mean(req.base));
        let (bn_max, norms) = if !req.kernel.is_gemm() {
            (0.0, None)
        } else if self.method == Method::Fused && req.base.centred_roots().is_some_and(|r| !r.made)
        {
            // Rows the device derives and measures itself (see `CudaEngine::device_norms`).
            (f32::NAN, None)
        } else {
            let norms: Arc<[f32]> = centred_norms(req.base, centre.as_deref()).into();
            (norms.iter().copied().fold(0.0, f32::max), Some(norms))
        };
        let info = BaseInfo {
            key: req.base_key,
            kernel: req.kernel,
            exact_data: req.exact_data,
            centre,
            bn_max,
            norms,
        };
        *self.base_info.lock().unwrap_or_else(|p| p.into_inner()) = Some(info.clone());
        info
    }

    /// After a call on `req`: the norm bound of its base when the device measured the rows it
    /// derived (`info.bn_max` is NaN until then; measured on the host if the device did not
    /// keep them), and the norms of the queries when they are rows of that base (the
    /// device's, else those `info` keeps).
    fn device_norms(&self, req: &CandidateRequest<'_>, info: &mut BaseInfo) -> Option<Vec<f32>> {
        let resident = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        let norms = resident
            .as_ref()
            .filter(|r| Some(r.key) == req.base_key)
            .and_then(|r| r.norm_up.as_deref());
        if info.bn_max.is_nan() {
            // Not kept by the device: measured here once, and kept for the floors of the
            // graph's rows.
            if norms.is_none() {
                info.norms = Some(centred_norms(req.base, info.centre.as_deref()).into());
            }
            info.bn_max = norms
                .or(info.norms.as_deref())
                .map_or(0.0, |n| n.iter().copied().fold(0.0, f32::max));
            let mut kept = self.base_info.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(k) = kept
                .as_mut()
                .filter(|k| k.key == info.key && k.bn_max.is_nan())
            {
                k.bn_max = info.bn_max;
                k.norms = info.norms.clone();
            }
        }
        let at = req.queries.row_offset_in(&req.base)?;
        let rows = at..at + req.queries.rows();
        match norms {
            Some(n) => Some(n[rows].to_vec()),
            None => info.norms.as_ref().map(|n| n[rows].to_vec()),
        }
    }

    /// Every slot of the `w`-wide rows `ids` of `req` holds a valid base id that its row may
    /// return (a slot the kernels left unwritten, or an excluded id, is a device fault).
    fn check_ids(&self, req: &CandidateRequest<'_>, ids: &[u32], w: usize) -> Result<()> {
        let nb = req.base.rows();
        for (i, row) in ids.chunks(w).enumerate() {
            let skip = req.exclude.map(|e| e[i]);
            if let Some(&bad) = row
                .iter()
                .find(|&&id| id as usize >= nb || Some(id) == skip)
            {
                return Err(KnnError::Device(format!(
                    "{}: query {i} holds invalid base id {bad} (unwritten or excluded slot)",
                    self.name()
                )));
            }
        }
        Ok(())
    }

    /// The device, locked and bound to this thread.
    fn locked(&self) -> Result<std::sync::MutexGuard<'_, Gpu>> {
        let gpu = self
            .gpu
            .lock()
            .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
        gpu.ctx
            .bind_to_thread()
            .map_err(crate::device::dev_err("binding the context"))?;
        Ok(gpu)
    }

    /// Remembers that `first` (a graph's first try) starts a graph: its rows are made anew
    /// by the next call that asks for them. Lists (and finished rows) kept from an earlier
    /// graph of the same base would answer this one from that call's work, which is not what
    /// a caller times or what a peer recomputing its graph is compared with. Returns the
    /// graph's (base key, width).
    fn graph_anew(&self, first: &CandidateRequest<'_>) -> Result<Option<(u64, usize)>> {
        let ahead = first.base_key.map(|key| (key, first.width));
        *self.graph_ahead.lock().unwrap_or_else(|p| p.into_inner()) = ahead;
        // Device memory is freed with its context bound to the thread (cudarc's drop does not
        // bind it).
        let _gpu = self.locked()?;
        *self.graph.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Some(share) = &self.share {
            share.restart();
        }
        Ok(ahead)
    }

    /// The distance mode (`finish_lists`) in which this engine finishes `req`'s rows for `k`
    /// neighbours under `metric`, or `None` when it does not (see `Engine::finish_rows`).
    fn finish_mode(&self, req: &CandidateRequest<'_>, metric: &Metric, k: usize) -> Option<i32> {
        let w = req.width;
        let mode = match metric {
            Metric::SqL2 | Metric::L1 | Metric::Linf => 0,
            Metric::L2 | Metric::Mahalanobis(_) => 1,
            Metric::InnerProduct => 2,
            Metric::Hellinger => 3,
            _ => return None,
        };
        let hellinger = matches!(exact_view(req, true)?, fused::Exact::Hellinger { .. });
        let ok = self.method == Method::Fused
            && hellinger == matches!(metric, Metric::Hellinger)
            && metric.kernel() == req.kernel
            && k != 0
            && k <= w
            && w <= FINISH_WIDTH_MAX
            && w <= req.available();
        ok.then_some(mode)
    }

    /// Whether `req`'s base stays resident with its exact rows under the budget (streamed
    /// bases give no exact keys): already held so, or fitting.
    fn finishes_resident(
        &self,
        gpu: &Gpu,
        req: &CandidateRequest<'_>,
        info: &BaseInfo,
    ) -> Result<bool> {
        let (nb, d) = (req.base.rows(), req.base.dim());
        let Some(exact) = exact_view(req, true) else {
            return Ok(false);
        };
        // Held: no need to ask the device for its free memory (a driver call of ~8 µs, on the
        // path of every small search).
        let held = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(key), Some(r)) = (req.base_key, held.as_ref()) {
            if r.serves(key, info.centre.as_deref(), Some(exact)) {
                return Ok(true);
            }
        }
        drop(held);
        let derived = req.base.centred_roots().is_some();
        let budget = self.budget(gpu)?;
        Ok(fused::base_fits(
            nb,
            d,
            Some(exact),
            (info.centre.is_some(), derived),
            budget,
        ))
    }

    /// Device bytes a call may use: the cap given, else 70 % of the free memory, counting the
    /// resident base (ours to reuse) as free.
    fn budget(&self, gpu: &Gpu) -> Result<usize> {
        let resident = self.resident.lock().unwrap_or_else(|p| p.into_inner());
        let graph = self.graph.lock().unwrap_or_else(|p| p.into_inner());
        self.budget_with(gpu, held_bytes(&resident, &graph), false)
    }

    /// [`CudaEngine::budget`] with `held` bytes resident; with `kept`, from the free memory
    /// last read, when there is one (see `rows`).
    fn budget_with(&self, gpu: &Gpu, held: usize, kept: bool) -> Result<usize> {
        if let Some(b) = self.budget {
            return Ok(b);
        }
        let free = match gpu.free_seen() {
            Some(free) if kept => free,
            _ => gpu.mem_info()?.0,
        };
        Ok((free + held) / 10 * 7)
    }
}

impl Engine for CudaEngine {
    fn name(&self) -> String {
        format!("cuda:{}/{}", self.ordinal, self.method)
    }

    /// The fused method's first tries of GEMM kernels run on TF32 tensor cores, whose rounding
    /// bound (about 4·2⁻¹¹‖q‖‖b‖, less on centred data) spans more neighbours: lists get at
    /// least k/4 more entries.
    fn candidate_width(&self, k: usize, available: usize, kernel: Kernel) -> usize {
        let w = k + 4 + k / 16;
        let w = if let Some(f) = self.tuning.width {
            f.max(k)
        } else if self.method != Method::Fused || !kernel.is_gemm() {
            w
        } else if w.max(k + k / 4) <= SMALL_WIDTH_MAX {
            // On-chip lists: a multiple of 8, at least k + k/4 (k = 16: 24, k = 100: 128).
            // Every entry beyond the k-th costs insertions in every split; these margins
            // proved the rows of uniform data with no retry (k = 16 at 21: 10 of 4096 rows).
            w.max(k + k / 4).next_multiple_of(8)
        } else {
            w.max(k + k / 4)
        };
        w.min(available)
    }

    /// Two: the host's exact re-rank of one round overlaps the device's work on the next.
    fn concurrent_rounds(&self) -> usize {
        2
    }

    /// Under a memory cap the base may be streamed, once per call: then rounds as large as the
    /// pipeline's memory bound allows (n = 4e6, d = 128, k = 10 under 2 GiB: 64 rounds of 62 500
    /// queries sent 128 GB, 29 s on top of 72 s).
    /// Without a cap, 16384: each call has a fixed cost (uploads, downloads, host floors) of a
    /// few ms, which rounds of 4096 queries paid 20 times over for an 80 000-point graph.
    fn min_round_queries(&self) -> usize {
        if self.budget.is_some() {
            1 << 20
        } else {
            16384
        }
    }

    fn candidates(&self, req: &CandidateRequest<'_>) -> Result<Candidates> {
        self.candidates_inner(req, false).map(|(c, _)| c)
    }

    /// The fused method's first tries of GEMM kernels run on TF32 tensor cores.
    fn fast_first_tries(&self, kernel: Kernel) -> bool {
        self.method == Method::Fused && kernel.is_gemm()
    }

    /// The fused method copies the given base while the host prepares (when it would stay
    /// resident: four times its size fits the memory budget); the first request that uploads
    /// those rows takes the copy.
    fn prefetch_base(&self, base_key: u64, base: MatrixRef<'_>) {
        let Some(rows) = base.values().filter(|_| self.method == Method::Fused) else {
            return;
        };
        let Ok(gpu) = self.gpu.lock() else {
            return;
        };
        if gpu.ctx.bind_to_thread().is_err() {
            return;
        }
        let mut slot = self.prefetched.lock().unwrap_or_else(|p| p.into_inner());
        *slot = None;
        let fits = self
            .budget(&gpu)
            .is_ok_and(|b| 4 * std::mem::size_of_val(rows) <= b);
        // A failed copy only loses the head start: the request uploads the rows itself.
        if let Some(buf) = fits.then(|| gpu.upload(rows).ok()).flatten() {
            *slot = Some(fused::Prefetched {
                key: base_key,
                host: (rows.as_ptr() as usize, rows.len()),
                buf,
            });
        }
    }

    /// The output is page-locked in place: the finished rows' downloads then go straight
    /// into it at the bus's speed (through the staging memory, the host's copy of them was
    /// most of a graph's rounds).
    fn pin_output(&self, ids: &mut [u32], distances: &mut [f32]) -> Option<PinnedOutput> {
        if self.method != Method::Fused || std::mem::size_of_val(ids) < PIN_OUTPUT_MIN {
            return None;
        }
        let (ctx, pins) = &self.pins;
        let mut ranges = [
            crate::staging::bytes_of_mut(ids),
            crate::staging::bytes_of_mut(distances),
        ];
        pins.pin_all(ctx, &mut ranges).map(PinnedOutput::new)
    }

    /// Remembered: the first try of that graph's first round makes every row's lists with the
    /// symmetric kernels (when this engine's [`Symmetry`] says so), the rounds copy theirs.
    /// With `finish`, the whole graph's lists are made and every row finished (queued on the
    /// device) now, while the host makes the output's pages; the rounds then only download
    /// their rows. A GPU that shares the graph's pairs with others makes its part of the
    /// lists, and with `finish`, once every part is made, merges and finishes its share of the
    /// rows (those whose rounds the pipeline deals it first).
    fn begin_graph(
        &self,
        first: &CandidateRequest<'_>,
        finish: Option<(&Metric, usize)>,
    ) -> Result<()> {
        let ahead = self.graph_anew(first)?;
        if let (Some(share), Some(graph)) = (&self.share, ahead) {
            // Every part is made now, whatever finishes the rows: the other parts wait for
            // this one's thresholds. However the attempt ends, the others learn of it.
            let made = self.locked().and_then(|mut gpu| {
                let info = self.base_info(first);
                let to = Results::Lists(Default::default());
                self.rows(&mut gpu, first, &info, true, None, to).map(drop)
            });
            share.settle(graph);
            made?;
            // Without every part (one declined) the rounds compute the rows one-sided.
            if finish.is_none() || share.wait_lists(graph).is_none() {
                return Ok(());
            }
        }
        let Some((metric, k)) = finish else {
            return Ok(());
        };
        let Some(mode) = self.finish_mode(first, metric, k) else {
            return Ok(());
        };
        let info = self.base_info(first);
        let mut gpu = self.locked()?;
        if self.finishes_resident(&gpu, first, &info)? {
            let finish = fused::Finish {
                k,
                mode,
                host: &mut RowSlices {
                    ids: &mut [],
                    distances: &mut [],
                    k,
                },
                device: None,
                // A graph's rows lie in the resident base: the host's floors prove them.
                proof: None,
            };
            let to = Results::Finished(finish);
            self.rows(&mut gpu, first, &info, true, None, to)?;
        }
        Ok(())
    }

    /// The fused method computes the candidates' exact keys on the device (f64, the host's
    /// summation order) while the base is resident: the pipeline then reads no base rows.
    fn candidates_with_exact(
        &self,
        req: &CandidateRequest<'_>,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        self.candidates_inner(req, self.method == Method::Fused)
    }
    /// The fused method finishes first tries on the device when it keeps the base resident:
    /// exact keys, the k best of each row in (distance, id) order and the k-th exact key come
    /// back instead of whole candidate lists (a sixth of the bytes at k = 100), and only the
    /// floors are taken here.
    fn finish_rows(&self, req: &CandidateRequest<'_>, out: FinishedRows<'_>) -> Result<bool> {
        let nq = req.queries.rows();
        if nq == 0 || !out.holds(nq) {
            return Ok(false);
        }
        match self.finish_on_device(req, out.metric, out.k, out.key_scale, out.out, None)? {
            Some(done) => {
                out.proven.copy_from_slice(&done.proven);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Expression metrics run the fused method (whatever this engine's method) with the
    /// program's kernels: the L1 kernel's structure, the generated operation in its place.
    fn candidates_expr(&self, req: &CandidateRequest<'_>, plan: &ExprPlan) -> Result<Candidates> {
        let (nq, w) = (req.queries.rows(), req.width);
        req.check_width()?;
        if nq == 0 {
            return Ok(Candidates::empty(w));
        }
        if w > SELECT_WIDTH_MAX {
            // Only re-asks of a few hard rows get this wide.
            return self.fallback(w)?.candidates_expr(req, plan);
        }
        let to = Results::Lists(fused::HostLists::new(nq * w, false, &self.lists_pool));
        let (lists, cut) = {
            let mut gpu = self.locked()?;
            let tag = gpu.expr_kernels(plan.program(), req.base.dim())?;
            // Expression features are used as given: no centre, no norm bound.
            let info = BaseInfo {
                key: None,
                kernel: req.kernel,
                exact_data: false,
                centre: None,
                bn_max: 0.0,
                norms: None,
            };
            let rows = self.rows(&mut gpu, req, &info, false, Some(&tag), to)?;
            (rows.lists, rows.cut)
        };
        let (keys, ids) = lists.split();
        self.check_ids(req, &ids, w)?;
        let complete = w >= req.available();
        let floor = (0..nq)
            .map(|i| {
                if complete {
                    f32::INFINITY
                } else {
                    plan.floor(keys[i * w + w - 1].min(cut[i]))
                }
            })
            .collect();
        Ok(Candidates {
            width: w,
            ids,
            keys,
            floor,
            // The plan's floor of a key at most the last: less than its error bound.
            floor_bounds_rounding: true,
        })
    }
}

impl CudaEngine {
    fn candidates_inner(
        &self,
        req: &CandidateRequest<'_>,
        want_exact: bool,
    ) -> Result<(Candidates, Option<Vec<f64>>)> {
        let (nq, w) = (req.queries.rows(), req.width);
        req.check_width()?;
        if nq == 0 {
            return Ok((Candidates::empty(w), None));
        }
        if w > SELECT_WIDTH_MAX {
            // Only re-asks of a few hard rows get this wide.
            return Ok((self.fallback(w)?.candidates(req)?, None));
        }
        // Made before the device is taken: the other round's GPU work runs meanwhile.
        let lists = match self.method {
            Method::Fused => fused::HostLists::new(nq * w, want_exact, &self.lists_pool),
            _ => fused::HostLists::default(),
        };
        let t0 = std::time::Instant::now();
        let mut info = self.base_info(req);
        let (
            waited,
            Rows {
                lists,
                exact,
                cut,
                input_abs,
                ..
            },
            qn,
        ) = {
            let mut gpu = self
                .gpu
                .lock()
                .map_err(|_| KnnError::Device("a previous GPU call panicked".into()))?;
            let waited = t0.elapsed();
            let rows = self.rows(
                &mut gpu,
                req,
                &info,
                want_exact,
                None,
                Results::Lists(lists),
            )?;
            // Read while this call holds the device: another call's `rows` holds the resident
            // base (and its norms) for as long as its GPU work runs.
            let qn = self.device_norms(req, &mut info);
            (waited, rows, qn)
        };
        let t1 = std::time::Instant::now();
        let (keys, ids) = lists.split();
        self.check_ids(req, &ids, w)?;
        let (u, u_in) = if self.method == Method::Fused && fused::uses_tf32(req) {
            (TF32_ACC_UNIT, TF32_INPUT_UNIT)
        } else {
            (F32_UNIT, 0.0)
        };
        let floor = floors(
            req,
            (&keys, w),
            &cut,
            (info.bn_max, qn.as_deref()),
            info.centre.as_deref(),
            (u, u_in, input_abs),
        );
        if std::env::var_os("KNN_PROFILE").is_some() {
            eprintln!(
                "cuda call ({nq} rows): waited for the GPU {:.2} ms, GPU work {:.2} ms, decoding, checks and floors {:.2} ms",
                waited.as_secs_f64() * 1e3,
                (t1 - t0 - waited).as_secs_f64() * 1e3,
                t1.elapsed().as_secs_f64() * 1e3
            );
        }
        let c = Candidates {
            width: w,
            ids,
            keys,
            floor,
            // `floors`: the last key (or the cut, below it) less the keys' error bound.
            floor_bounds_rounding: true,
        };
        Ok((c, exact.map(HostVec::into_vec)))
    }
}
