//! Whole-graph lists: every row's first-try lists of a kNN graph made at once on the device,
//! each unordered pair's key computed once (`kernels/sym.cu`), in the symmetric form (tiles of
//! row and column lists, split and merged) or the collect form (f16-rounded points, thresholds
//! from a sample, buffers sorted); and the graph's rows finished at once for the calls that
//! copy theirs out.

use super::finish::{exact_keys, launch_finish, DeviceIo, FinishedChunk};
use super::resident::Resident;
use super::select::merge_runs;
use super::share::{
    gather_thresholds, merge_parts, peer_rows, record, run_addresses, GraphShare, PartLists,
    Thresholds,
};
use super::timing::KernelTimer;
use super::{
    split_count, split_width, BASE_TILE, QUERY_TILE, ROW_BUF_SMEM, SENTINEL, SMALL_WIDTH_MAX,
    TILE_SMEM, TILE_SMEM_TF32,
};
use crate::device::{dev_err, Gpu};
use crate::tuning::{CollectPlan, CudaTuning};
use cudarc::driver::{sys, CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::{CandidateRequest, Kernel, KnnError, Result};
use std::sync::Arc;

/// Every row's first-try lists of a whole kNN graph, made at once with each unordered pair's
/// key computed once (`kernels/sym.cu`), kept on the device while the graph's rounds copy their
/// rows out of them.
pub(crate) struct GraphLists {
    key: u64,
    width: usize,
    kernel: String,
    pub(super) lists: Arc<CudaSlice<u64>>,
    /// Per row, the smallest entry a truncated list left out (as
    /// [`Output::cut`](super::Output::cut)).
    pub(super) cut: Arc<CudaSlice<u64>>,
    /// Set when these are this GPU's part of lists whose pairs several GPUs shared (see
    /// [`GraphShare`]): a row's lists are then the parts' merged.
    pub(super) shared: bool,
    /// Every row finished at once (exact keys and final rows), made by the first call that
    /// finishes rows; later calls only download theirs.
    finished: std::cell::OnceCell<GraphFinished>,
    /// Absolute input rounding of the lists' keys besides the relative one (per coordinate, in
    /// the engine rows' units: f16's subnormal spacing, see `round_f16`; 0 for TF32 and FP32).
    pub(super) input_abs: f64,
}

/// Every row of a graph finished on the device (see `finish_lists`), or this GPU's share of
/// them when several GPUs shared its pairs: `k` ids and distances a row (in buffers of its
/// own, or written to the caller's device memory), and per row the k-th exact key and the W-th
/// composite.
pub(super) struct GraphFinished {
    k: usize,
    mode: i32,
    /// The graph rows held (every row, or this GPU's share); buffers are indexed from its start.
    held: std::ops::Range<usize>,
    /// A shared graph's rows: the least of the parts' cuts of each held row (the graph's own
    /// cuts otherwise).
    merged: Option<CudaSlice<u64>>,
    rows: RowsAt,
    kth: CudaSlice<f64>,
    last: CudaSlice<u64>,
    /// Per launch of [`FINISH_ROWS`] rows: recorded behind it (its rows' downloads wait for it
    /// alone, on the copy stream, while the main stream finishes the next rows) ...
    ready: Vec<cudarc::driver::CudaEvent>,
    /// ... and its flag of a list holding an unwritten slot or the row's own id.
    bad: CudaSlice<u32>,
}

/// Where a finished graph's ids and distances are.
enum RowsAt {
    /// In buffers of its own, `n × k` each.
    Own(CudaSlice<u32>, CudaSlice<f32>),
    /// In the caller's device memory, bad lists flagged in the word at the address given.
    Into(DeviceIo, u64),
}

impl RowsAt {
    /// The device addresses of row `at`'s ids (i64 or not) and distances, `k` a row.
    fn row(&self, gpu: &Gpu, at: usize, k: usize) -> (u64, bool, u64) {
        match self {
            RowsAt::Own(ids, dists) => {
                let at = (at * k * 4) as u64;
                (gpu.ptr(ids) + at, false, gpu.ptr(dists) + at)
            }
            RowsAt::Into(io, _) => io.row(at, k),
        }
    }

    /// The caller's memory the rows went to and the word their bad lists were flagged in,
    /// if any.
    fn caller(&self) -> Option<(DeviceIo, u64)> {
        match self {
            RowsAt::Own(..) => None,
            RowsAt::Into(io, bad) => Some((*io, *bad)),
        }
    }
}

impl GraphFinished {
    /// Rows `at..at + out.kth.len()` into the host slices (their ids and distances only when
    /// `out.rows` asks for them: they are in buffers of this graph's own), once their launches
    /// are done (see `ready`); an error when one of those launches flagged a bad list.
    pub(super) fn download(
        &self,
        gpu: &Gpu,
        at: usize,
        out: FinishedChunk<'_>,
        cut: (&CudaSlice<u64>, &mut [u64]),
    ) -> Result<()> {
        let m = out.kth.len();
        if m == 0 {
            return Ok(());
        }
        let cut = (self.merged.as_ref().unwrap_or(cut.0), cut.1);
        let at = at - self.held.start;
        let (first, last) = (at / FINISH_ROWS, (at + m - 1) / FINISH_ROWS);
        let after = &self.ready[last];
        let k = self.k;
        if let (RowsAt::Own(ids, dists), Some((ids_out, dists_out))) = (&self.rows, out.rows) {
            gpu.download_range_after(ids, at * k, ids_out, after)?;
            gpu.download_range_after(dists, at * k, dists_out, after)?;
        }
        gpu.download_range_after(&self.kth, at, out.kth, after)?;
        gpu.download_range_after(&self.last, at, out.last, after)?;
        gpu.download_range_after(cut.0, at, cut.1, after)?;
        let mut flags = vec![0u32; last + 1 - first];
        gpu.download_range_after(&self.bad, first, &mut flags, after)?;
        if flags.iter().any(|&b| b != 0) {
            return Err(bad_list());
        }
        Ok(())
    }

    /// Whether graph rows `at..at + m` are held (see [`GraphFinished::download`]).
    pub(super) fn holds(&self, at: usize, m: usize) -> bool {
        self.held.start <= at && at + m <= self.held.end
    }

    /// Device addresses of graph row `at`'s k-th exact key and W-th composite.
    pub(super) fn facts_at(&self, gpu: &Gpu, at: usize) -> (u64, u64) {
        let at = ((at - self.held.start) * 8) as u64;
        (gpu.ptr(&self.kth) + at, gpu.ptr(&self.last) + at)
    }
}

fn bad_list() -> KnnError {
    KnnError::Device("a graph's list holds an unwritten slot or the row's own id".into())
}

/// Rows per launch when a whole graph is finished at once (bounds the exact keys' buffer).
const FINISH_ROWS: usize = 16384;

/// The finished rows of graph `g` for `k` neighbours as distances of `mode`, made now if they
/// were not (exact keys of `kind` of the given base at `given`, `n × d`), their ids and
/// distances written `into` the caller's device memory when given (a bad list flagged in the
/// word at the address given with it), else kept in buffers of their own; `None` when their
/// buffers do not fit `budget`, or `g` was finished for another `k`, `mode` or destination
/// (the caller's memory and flag word both: a call retried after running out of memory
/// flags into a summary of its own).
///
/// A graph whose pairs several GPUs shared is finished only given every part's lists (`parts`,
/// this GPU's part `own`), and then only this GPU's share of the rows (`GraphShare::row_share`,
/// the rounds the pipeline deals it first): the other parts' lists of those rows are copied
/// here (waited for: nothing of theirs is read later, so their memory may go with them) and
/// merged with this part's a launch's rows at a time (see `share::merge_parts`), into buffers
/// of its own.
pub(super) fn graph_finished<'g>(
    gpu: &Gpu,
    g: &'g GraphLists,
    (k, mode): (usize, i32),
    (kind, given, d): (Option<Kernel>, u64, usize),
    budget: usize,
    into: Option<(DeviceIo, u64)>,
    parts: Option<(&[Arc<PartLists>], usize)>,
) -> Result<Option<&'g GraphFinished>> {
    if let Some(f) = g.finished.get() {
        let same = f.rows.caller() == into;
        return Ok((f.k == k && f.mode == mode && same).then_some(f));
    }
    let (n, w) = (g.cut.len(), g.width);
    let held = match (g.shared, parts) {
        (false, _) => 0..n,
        (true, Some((parts, own))) if into.is_none() => {
            GraphShare::row_share_of(own, parts.len(), n)
        }
        // Otherwise a part's lists are merged with the other parts' round by round.
        (true, _) => return Ok(None),
    };
    let m_all = held.len();
    if m_all == 0 {
        return Ok(None);
    }
    let own_rows = if into.is_some() { 0 } else { m_all * 8 * k };
    // The other parts' rows copied here; the merges' results besides the exact keys, a
    // launch's rows each.
    let (copied, scratch) = match parts.filter(|_| g.shared) {
        Some((p, _)) => ((p.len() - 1) * m_all * (w + 1) * 8, 3),
        None => (0, 1),
    };
    if own_rows + m_all * 24 + copied + scratch * FINISH_ROWS * w * 8 > budget / 4 {
        return Ok(None);
    }
    let rows = match into {
        Some((io, bad)) => RowsAt::Into(io, bad),
        None => RowsAt::Own(gpu.alloc::<u32>(m_all * k)?, gpu.alloc::<f32>(m_all * k)?),
    };
    let (merged, copies) = match parts.filter(|_| g.shared) {
        Some((parts, own)) => {
            let copies = peer_rows(gpu, parts, own, held.clone(), w)?;
            gpu.sync()?;
            (Some(gpu.alloc::<u64>(m_all)?), copies)
        }
        None => (None, Vec::new()),
    };
    let mut f = GraphFinished {
        k,
        mode,
        held: held.clone(),
        merged,
        rows,
        kth: gpu.alloc::<f64>(m_all)?,
        last: gpu.alloc::<u64>(m_all)?,
        ready: Vec::new(),
        bad: gpu
            .stream
            .alloc_zeros::<u32>(m_all.div_ceil(FINISH_ROWS))
            .map_err(dev_err("allocating device memory"))?,
    };
    // Each row excludes itself.
    let own: Vec<u32> = held.clone().map(|i| i as u32).collect();
    let own = gpu.upload(&own)?;
    for at in held.clone().step_by(FINISH_ROWS) {
        let m = FINISH_ROWS.min(held.end - at);
        let local = at - held.start;
        // The rows' lists: the graph's, or the parts' merged (kept until the launches below
        // are queued; their memory is freed in stream order).
        let (lists, _merged) = match (&f.merged, parts) {
            (Some(cut), Some((parts, own))) => {
                let runs = run_addresses(gpu, parts, own, &copies, (at, held.start), w);
                let (rows, least) = merge_parts(gpu, &runs, (at, m, n, w))?;
                let to = gpu.ptr(cut) + (local * 8) as u64;
                // SAFETY: `cut` holds the share's rows from `local` on, `least` these m.
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        to,
                        gpu.ptr(&least),
                        m * 8,
                        gpu.stream.cu_stream(),
                    )
                }
                .map_err(dev_err("copying on the device"))?;
                (gpu.ptr(&rows.buf), Some((rows, least)))
            }
            _ => (gpu.ptr(&g.lists) + (at * w * 8) as u64, None),
        };
        let q = given + (at * d * 4) as u64;
        let keys = exact_keys(gpu, kind, (q, m), (given, n), lists, w, d)?;
        let (ids, ids_i64, dists) = f.rows.row(gpu, local, k);
        let out = (
            (ids, ids_i64),
            dists,
            gpu.ptr(&f.kth) + (local * 8) as u64,
            gpu.ptr(&f.last) + (local * 8) as u64,
        );
        let excl = gpu.ptr(&own) + (local * 4) as u64;
        launch_finish(
            gpu,
            (lists, gpu.ptr(&keys), w),
            (k, mode),
            (n, excl),
            match f.rows {
                RowsAt::Into(_, bad) => bad,
                RowsAt::Own(..) => gpu.ptr(&f.bad) + (local / FINISH_ROWS * 4) as u64,
            },
            out,
            m,
        )?;
        f.ready.push(
            gpu.stream
                .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(dev_err("recording an event"))?,
        );
    }
    Ok(Some(g.finished.get_or_init(|| f)))
}

impl GraphLists {
    /// Device bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        (self.lists.len() + self.cut.len()) * 8
    }

    /// The base key it belongs to.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// The graph it belongs to: base key and width.
    pub(super) fn graph(&self) -> (u64, usize) {
        (self.key, self.width)
    }
}

/// The symmetric kernel for first tries of width `w` with the built-in kernel `tag` (TF32 for
/// the GEMM kernels, FP32 for L1 and L∞), if there is one.
fn sym_kernel(tag: &str, tf: bool, w: usize) -> Option<String> {
    let slots = list_slots(w);
    let ok = match tag {
        "sql2" | "negdot" => tf,
        "l1" | "linf" => !tf,
        _ => false,
    };
    (ok && w <= SMALL_WIDTH_MAX)
        .then(|| format!("sym_{}{tag}_w{}", if tf { "tf32_" } else { "" }, 32 * slots))
}

/// 32-entry slots per lane of an on-chip list of width `w`.
pub(super) fn list_slots(w: usize) -> usize {
    if w <= 32 {
        1
    } else if w <= 64 {
        2
    } else {
        4
    }
}

/// The whole graph's lists for `req` (its base is the graph's points, `resident`):
/// the kept ones when they match, else made now (this GPU's part of them under `share`: the
/// collect form only). `None` when no symmetric kernel fits the request or its buffers do not
/// fit `budget` (the call then runs as usual). Returns the lists and the device time spent
/// making them.
#[allow(clippy::too_many_arguments)]
pub(super) fn graph_lists<'g>(
    gpu: &Gpu,
    tuning: &CudaTuning,
    req: &CandidateRequest<'_>,
    (tag, tf): (&str, bool),
    resident: &Resident,
    slot: &'g mut Option<GraphLists>,
    budget: usize,
    share: Option<&GraphShare>,
) -> Result<Option<(&'g GraphLists, f32)>> {
    let (n, d, w) = (req.base.rows(), req.base.dim(), req.width);
    let (b, bn) = (gpu.ptr(&resident.b), gpu.ptr(&resident.bn));
    let (Some(key), Some(_)) = (req.base_key, sym_kernel(tag, tf, w)) else {
        return Ok(None);
    };
    if slot
        .as_ref()
        .is_some_and(|g| g.key == key && g.width == w && g.kernel.contains(&format!("{tag}_w")))
    {
        return Ok(slot.as_ref().map(|g| (g, 0.0)));
    }
    *slot = None;
    // The TF32 GEMM kernels take the collect form (it replaced their fold: NOTES.md, stop 15),
    // which stages by cp.async: rows of a multiple of 4 floats. L1, L∞ and other d fold.
    if tf && d % 4 == 0 {
        let plan = tuning.collect.map(|p| p.valid_for(w));
        let shared = share.map(|s| (s, (key, w)));
        let made = collected_lists(gpu, (n, d, w), tag, resident, plan, budget, shared)?;
        if let Some((lists, ms)) = made {
            *slot = Some(GraphLists { key, ..lists });
            return Ok(slot.as_ref().map(|g| (g, ms)));
        }
    }
    // Each GPU of a share folding every pair itself would only repeat the others' work: their
    // rows go one-sided.
    if share.is_some() {
        return Ok(None);
    }
    let tiles = n.div_ceil(QUERY_TILE);
    // Partner tiles per tile, its own included.
    let partners = (tiles - 1) / 2 + 1;
    // Each point's 2·nsplit lists (by row and by column per split) keep ws entries each when
    // truncation is sound (see `split_width`), and enough splits that ws fits 32-entry lists.
    // Sound: every list is offered at least two tiles (at most one of them short), so each
    // holds ws entries, and the union at least w. Every tile has (tiles − 1) / 2 partners or
    // more at distances 1, 2, ..., of which split s takes s, s + nsplit, ...
    let trunc = |ns: usize| {
        if tuning.truncate_splits && n > w && 2 * ns <= (tiles - 1) / 2 {
            split_width(w, 2 * ns)
        } else {
            w
        }
    };
    let narrow = (1..=partners).find(|&ns| trunc(ns) <= 32).unwrap_or(1);
    let plan = |per_sm: usize| {
        tuning.splits.map_or_else(
            || split_count(tiles, gpu.sm_count * per_sm, partners).max(narrow),
            |v| v.clamp(1, partners),
        )
    };
    // Splits as for two blocks per SM; the kernel is chosen by the width each list keeps.
    let ws = trunc(plan(2)).min(w);
    let slots = list_slots(ws);
    let Some(name) = sym_kernel(tag, tf, 32 * slots) else {
        return Ok(None);
    };
    let lists = QUERY_TILE * 32 * slots * 8;
    let tile = if tf {
        TILE_SMEM_TF32
    } else {
        TILE_SMEM + ROW_BUF_SMEM
    };
    let smem = lists + tile + lists / 16 + BASE_TILE * 4 + 128;
    if smem > gpu.max_smem_optin {
        return Ok(None);
    }
    let (f, per_sm) = gpu.blocks_per_sm(&name, smem)?;
    let nsplit = plan(per_sm);
    let ws = trunc(nsplit).min(w).min(32 * slots);
    if n * w * 8 * (2 * nsplit + 1) > budget / 2 {
        return Ok(None);
    }
    let runs = gpu.alloc::<u64>(n * 2 * nsplit * w)?;
    gpu.fill_u64(gpu.ptr(&runs), runs.len(), SENTINEL)?;
    let locks = gpu
        .stream
        .alloc_zeros::<i32>(tiles * nsplit)
        .map_err(dev_err("allocating device memory"))?;
    let cut = gpu.alloc::<u64>(n)?;
    gpu.fill_u64(gpu.ptr(&cut), n, SENTINEL)?;
    let profile = std::env::var_os("KNN_PROFILE").is_some();
    let timer = KernelTimer::start(gpu, gpu.kernel_timing || profile)?;
    let (n64, d32, w32, ws32, ns32) = (n as i64, d as i32, w as i32, ws as i32, nsplit as i32);
    let (pr, pl, pc) = (gpu.ptr(&runs), gpu.ptr(&locks), gpu.ptr(&cut));
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&b)
        .arg(&bn)
        .arg(&n64)
        .arg(&d32)
        .arg(&w32)
        .arg(&ws32)
        .arg(&ns32)
        .arg(&pr)
        .arg(&pl)
        .arg(&pc);
    // SAFETY: b holds n×d floats and bn n, runs n×2·nsplit×w composites, locks tiles×nsplit
    // zeroed words, cut n; ws ≤ 32·slots; the shared memory is what the kernel lays out
    // (lists, key tile, a list row per warp, column thresholds and group masks).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((tiles * nsplit) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err(&name))?;
    if ws < w {
        let f = gpu.func("sym_cut")?;
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&pr)
            .arg(&n64)
            .arg(&ns32)
            .arg(&w32)
            .arg(&ws32)
            .arg(&pc);
        // SAFETY: runs holds n×2·nsplit×w composites, cut n; one thread per point.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (n.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(dev_err("sym_cut"))?;
    }
    let merged = merge_runs(gpu, n, w, 32 * list_slots(w), (pr, 2 * nsplit), 0)?;
    let (ms, _) = timer.stop(gpu, "")?;
    if profile {
        eprintln!(
            "cuda symmetric graph: {n} rows, {tiles} tiles, {nsplit} splits keeping {ws} of \
             {w} by row and by column, {ms:.2} ms"
        );
    }
    *slot = Some(GraphLists {
        finished: std::cell::OnceCell::new(),
        input_abs: 0.0,
        key,
        width: w,
        kernel: name,
        lists: Arc::new(merged.buf),
        cut: Arc::new(cut),
        shared: false,
    });
    Ok(slot.as_ref().map(|g| (g, ms)))
}

/// Sample stride of the collect form: the sample's pass costs about 2/stride of the pairs'
/// (n = 80 000, d = 256, w = 128 on an H100, thresholds / pairs / sort: stride 12, r = 27:
/// 5.0 / 17.2 / 1.3 ms; stride 16: 3.4 / 17.0 / 1.2; stride 20: 2.6 / 17.3 / 1.4).
const COLLECT_STRIDE: usize = 16;
/// Graphs of at most this many points + 1 keep every pair (no sample).
const COLLECT_ALL: usize = 1024;

impl CollectPlan {
    /// For `n` points and lists `w` wide. A point's w nearest hold about λ = w / stride sample
    /// points (Poisson), so the r-th smallest sample key bounds its w-th key unless r of them
    /// are sample points: r = ⌈λ + 4√λ + 3⌉ makes that rare (≈ 2e-5 at w = 128; such a point
    /// keeps fewer than w, with a `cut` that proves it unless too few are below its threshold,
    /// and the pipeline asks those again). With ⌈λ + 3√λ + 2⌉ two rows of 80 000 were asked
    /// again each time, which cost more than the smaller buffers saved. About r·stride keys
    /// (Gamma-like, sd √r·stride) pass the threshold; `cap` leaves 8 sd above that.
    /// This is the automatic plan; `CudaTuning::collect` gives another, for tests and
    /// measurements (any plan gives the same graph, only the retries differ).
    fn new(n: usize, w: usize) -> Self {
        if n <= COLLECT_ALL + 1 {
            return CollectPlan {
                stride: 0,
                r: 0,
                cap: n.saturating_sub(1).next_power_of_two().max(32),
            };
        }
        let stride = COLLECT_STRIDE;
        let lambda = w as f64 / stride as f64;
        let r = (lambda + 4.0 * lambda.sqrt() + 3.0).ceil() as usize;
        let spread = 8.0 * (r as f64).sqrt() * stride as f64;
        let cap = ((r * stride) as f64 + spread).ceil() as usize;
        CollectPlan {
            stride,
            r,
            cap: cap.next_power_of_two().max(2 * w).max(32),
        }
    }
}

/// Every point's lists of a graph in the collect form (see `kernels/sym.cu`) of the `resident`
/// base's points: thresholds from
/// the sample, each unordered pair's key once into the buffers of the points it does not
/// exceed, then each buffer sorted, by `plan` (`None`: the automatic one). `None` when its
/// buffers do not fit half the `budget`. Returns the lists (`key` left 0) and their device
/// time.
///
/// With `share` (and the graph's key), this GPU takes its part of the point tiles: their
/// thresholds (published, then every part's gathered), the pairs they meet, and every point's
/// part of the lists, published for the other parts (see [`GraphShare`]). `None` also when
/// another part declined, or on a second attempt at the same graph.
fn collected_lists(
    gpu: &Gpu,
    (n, d, w): (usize, usize, usize),
    tag: &str,
    resident: &Resident,
    plan: Option<CollectPlan>,
    budget: usize,
    share: Option<(&GraphShare, (u64, usize))>,
) -> Result<Option<(GraphLists, f32)>> {
    let plan = plan.unwrap_or_else(|| CollectPlan::new(n, w));
    let bn = gpu.ptr(&resident.bn);
    let CollectPlan { stride, r, cap } = plan;
    if share.is_some_and(|(s, key)| s.began(key)) || n * ((cap + w + 2) * 8 + d * 4) > budget / 2 {
        return Ok(None);
    }
    let tiles = n.div_ceil(QUERY_TILE);
    // The tiles whose thresholds and pairs this GPU computes.
    let mine = share.map_or(0..tiles, |(s, _)| s.tiles(tiles));
    let partners = (tiles - 1) / 2 + 1;
    let nsplit = partners.min(8);
    let profile = std::env::var_os("KNN_PROFILE").is_some();
    let mut timer = KernelTimer::start(gpu, gpu.kernel_timing || profile)?;
    // The points rounded once (the product's fragments are then taken as they are).
    let rounded = rounded_points(gpu, resident, n, d)?;
    let (pt, us) = (rounded.ptr, rounded.us);
    let name = format!("sym_collect_f16_{tag}");
    let (n64, d32) = (n as i64, rounded.words as i32);
    let hi = if stride == 0 {
        gpu.upload(&vec![f32::INFINITY; n])?
    } else {
        let hi = gpu.alloc::<f32>(n)?;
        let b0 = mine.start as i64;
        let smem = TILE_SMEM_TF32 + 2 * r * QUERY_TILE * 4;
        let f = gpu.func_with_smem(&format!("{name}_thr"), smem)?;
        let (q32, s64, r32, ph) = (
            stride as i32,
            n.div_ceil(stride) as i64,
            r as i32,
            gpu.ptr(&hi),
        );
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&pt)
            .arg(&bn)
            .arg(&n64)
            .arg(&d32)
            .arg(&q32)
            .arg(&s64)
            .arg(&r32)
            .arg(&ph)
            .arg(&us)
            .arg(&b0);
        // SAFETY: pt holds n rows of d32 words and bn n, hi n; the sample rows m·stride < n;
        // the tiles from b0 on hold points < n; the shared memory is the key tile and 2·r
        // keys per row.
        if !mine.is_empty() {
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (mine.len() as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: smem as u32,
                })
            }
            .map_err(dev_err(&name))?;
        }
        hi
    };
    let hi = Arc::new(hi);
    // A part publishes its points' thresholds and takes every other part's.
    let thresholds = match share {
        Some((s, key)) => {
            let rows = (mine.start * QUERY_TILE).min(n)..(mine.end * QUERY_TILE).min(n);
            let (ready, ctx) = (record(gpu)?, gpu.ctx.clone());
            let own = Arc::new(Thresholds {
                ctx,
                hi: hi.clone(),
                ready,
                rows,
            });
            s.publish_thresholds(key, own.clone());
            let Some(all) = s.wait_thresholds(key) else {
                return Ok(None);
            };
            gather_thresholds(gpu, &all, s.part().0, &hi)?;
            // The others' thresholds are freed on their own streams when their last holder
            // lets go: this one lets go of `all` only once its copies are done.
            gpu.sync()?;
            // Every part made its thresholds after copying its base rows: none reads this
            // part's share of them any more.
            s.release_rows();
            Some(own)
        }
        None => None,
    };
    timer.mark(gpu, "thresholds", profile)?;
    let cnt = gpu
        .stream
        .alloc_zeros::<u32>(n)
        .map_err(dev_err("allocating device memory"))?;
    let buf = gpu.alloc::<u64>(n * cap)?;
    let (ph, pc, pb, cap32) = (gpu.ptr(&hi), gpu.ptr(&cnt), gpu.ptr(&buf), cap as i32);
    let smem = COLLECT_SMEM;
    let f = gpu.func_with_smem(&name, smem)?;
    let (ns32, b0) = (nsplit as i32, mine.start as i64);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&pt)
        .arg(&bn)
        .arg(&n64)
        .arg(&d32)
        .arg(&ns32)
        .arg(&ph)
        .arg(&pc)
        .arg(&cap32)
        .arg(&pb)
        .arg(&us)
        .arg(&b0);
    // SAFETY: pt holds n rows of d32 words, bn, hi and cnt n, buf n×cap; the tiles from b0 on
    // are tiles of the n points; the shared memory is laid out as `COLLECT_SMEM` says.
    if !mine.is_empty() {
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: ((mine.len() * nsplit) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(dev_err(&name))?;
    }
    timer.mark(gpu, "pairs", profile)?;
    let lists = gpu.alloc::<u64>(n * w)?;
    let cut = gpu.alloc::<u64>(n)?;
    let smem = FINISH_WARPS * cap * 8;
    if smem > gpu.max_smem_optin {
        return Err(KnnError::Device(format!(
            "collect buffers of {cap} do not fit shared memory"
        )));
    }
    let f = gpu.func_with_smem("sym_collect_finish", smem)?;
    let (w32, pl, pcut) = (w as i32, gpu.ptr(&lists), gpu.ptr(&cut));
    let part = i32::from(share.is_some());
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&pb)
        .arg(&pc)
        .arg(&cap32)
        .arg(&n64)
        .arg(&w32)
        .arg(&ph)
        .arg(&pl)
        .arg(&pcut)
        .arg(&part);
    // SAFETY: buf n×cap, cnt and hi n, lists n×w, cut n; cap u64 of shared memory per warp.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n.div_ceil(FINISH_WARPS) as u32, 1, 1),
            block_dim: (32 * FINISH_WARPS as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err("sym_collect_finish"))?;
    let (ms, parts) = timer.stop(gpu, "sort")?;
    if profile {
        let over = count_over(gpu, &cnt, cap)?;
        eprintln!(
            "cuda symmetric graph (collect): {n} rows, {tiles} tiles, {nsplit} splits, {plan:?}, \
             {over} buffers overflowed, {ms:.2} ms: {parts}"
        );
    }
    let (lists, cut) = (Arc::new(lists), Arc::new(cut));
    if let (Some((s, key)), Some(thresholds)) = (share, thresholds) {
        let part = PartLists {
            ctx: gpu.ctx.clone(),
            lists: lists.clone(),
            cut: cut.clone(),
            ready: record(gpu)?,
            thresholds,
        };
        s.publish_lists(key, Arc::new(part));
    }
    let lists = GraphLists {
        finished: std::cell::OnceCell::new(),
        input_abs: rounded.input_abs,
        key: 0,
        width: w,
        kernel: format!("{name}_w{w}"),
        lists,
        cut,
        shared: share.is_some(),
    };
    Ok(Some((lists, ms)))
}

/// The points of a graph rounded once to f16 for the collect kernels' product (scaled by a
/// power of two, `round_f16`). (TF32 rounding, `round_tf32`, lost to it: NOTES.md, stop 17.)
struct Rounded {
    _mem: CudaSlice<u32>,
    ptr: u64,
    /// Words per row (the kernels' `d`): half of d rounded up to 8.
    words: usize,
    /// The product's keys are times us² (the inverse of the f16 scale).
    us: f32,
    /// Absolute rounding of each coordinate besides its relative 2⁻¹¹, in the rows' units.
    input_abs: f64,
}

/// Rounds the `n × d` points of the `resident` base for the collect kernels. f16 halves the product's
/// instructions and bytes against TF32 at the same relative rounding (10 explicit mantissa
/// bits); its narrow exponent is met by scaling every value by a power of two (exact) so that
/// the largest magnitude lies in [2¹⁴, 2¹⁵), and values it leaves below f16's normal range
/// are rounded to within 2⁻²⁵ (scaled), which the floors add (`input_abs`).
fn rounded_points(gpu: &Gpu, resident: &Resident, n: usize, d: usize) -> Result<Rounded> {
    let grid = |len: usize| (len.div_ceil(256).min(gpu.sm_count * 16).max(1) as u32, 1, 1);
    let b = gpu.ptr(&resident.b);
    // The largest magnitude, measured by the first graph of this resident base.
    let measured = match resident.f16_max.get() {
        Some(_) => None,
        None => {
            let maxbits = gpu
                .stream
                .alloc_zeros::<u32>(1)
                .map_err(dev_err("allocating device memory"))?;
            let (pm, len) = (gpu.ptr(&maxbits), (n * d) as i64);
            let f = gpu.func("abs_max_bits")?;
            let mut l = gpu.stream.launch_builder(f);
            l.arg(&b).arg(&len).arg(&pm);
            // SAFETY: b holds n×d floats, maxbits one word.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: grid(n * d),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })
            }
            .map_err(dev_err("abs_max_bits"))?;
            Some(maxbits)
        }
    };
    let Some(maxbits) = measured
        .as_ref()
        .or_else(|| resident.f16_max.get().map(|(m, _)| m))
    else {
        return Err(KnnError::Device(
            "no largest magnitude for the f16 scale".into(),
        ));
    };
    let pm = gpu.ptr(maxbits);
    let dp = d.next_multiple_of(8);
    let words = dp / 2;
    let mem = gpu.alloc::<u32>(n * words)?;
    let ptr = gpu.ptr(&mem);
    let (n64, d32, dp32) = (n as i64, d as i32, dp as i32);
    let f = gpu.func("round_f16")?;
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&b).arg(&n64).arg(&d32).arg(&dp32).arg(&pm).arg(&ptr);
    // SAFETY: b holds n×d floats, maxbits one word, mem n×dp halves.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: grid(n * dp),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err("round_f16"))?;
    let bits = match measured {
        Some(m) => {
            let bits = gpu.download(&m, 1)?[0];
            resident.f16_max.get_or_init(|| (m, bits)).1
        }
        None => match resident.f16_max.get() {
            Some((_, bits)) => *bits,
            None => return Err(KnnError::Device("no f16 scale for the graph".into())),
        },
    };
    let us = 1.0 / f16_scale(bits);
    Ok(Rounded {
        _mem: mem,
        ptr,
        words,
        us,
        input_abs: F16_SUBNORMAL_HALF_SPACING * us as f64,
    })
}

/// Half the spacing of f16's subnormals (2⁻²⁴): the largest error of rounding a scaled value
/// below f16's normal range.
const F16_SUBNORMAL_HALF_SPACING: f64 = 1.0 / (1u64 << 25) as f64;

/// `round_f16`'s scale for a largest magnitude of bits `maxbits` (as `f16_scale` in sym.cu):
/// 2^(14 − e) for the magnitude's binary exponent e, at most 2¹²⁷.
fn f16_scale(maxbits: u32) -> f32 {
    let e = (maxbits >> 23) as i32 - 127;
    let k = (14 - e).min(127);
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Appends queued in shared memory per block of the collect kernel (`COLLECT_QUEUE`).
const COLLECT_QUEUE: usize = 2048;
/// Shared memory of the collect kernel: the staging and key tile, 2 × 128 floats, the queue (a
/// composite and a point per entry) and its count.
const COLLECT_SMEM: usize = TILE_SMEM_TF32 + 2 * 128 * 4 + COLLECT_QUEUE * 12 + 16;
/// Points (warps) per block of `sym_collect_finish`.
const FINISH_WARPS: usize = 4;

/// Buffers of the collect form that overflowed (profiling only: a download).
fn count_over(gpu: &Gpu, cnt: &CudaSlice<u32>, cap: usize) -> Result<usize> {
    let c = gpu.download(cnt, cnt.len())?;
    Ok(c.iter().filter(|&&x| x as usize > cap).count())
}

#[cfg(test)]
mod tests {
    use super::{f16_scale, CollectPlan};

    #[test]
    fn f16_scale_puts_the_largest_magnitude_in_2_14_to_2_15() {
        for m in [
            1.0f32,
            0.75,
            3.0e-7,
            1.0e30,
            65504.0,
            f32::MAX,
            1.0e-38,
            1.0e-44,
        ] {
            let s = f16_scale(m.to_bits());
            let scaled = m as f64 * s as f64;
            assert!(scaled < 32768.0, "{m}: {scaled}");
            // Below 2^14 only where the scale is capped at 2^127.
            assert!(scaled >= 16384.0 || s == 2f32.powi(127), "{m}: {scaled}");
        }
        assert_eq!(f16_scale(0), 2f32.powi(127));
    }
    #[test]
    fn collect_plans_leave_margins() {
        // The seed-002 graph: λ = 128 / 16 = 8 sample points among a point's 128 nearest,
        // r = ⌈8 + 4√8 + 3⌉ = 23, about 23·16 = 368 keys kept (sd 77): 1024 slots.
        let p = CollectPlan::new(80_000, 128);
        assert_eq!((p.stride, p.r, p.cap), (16, 23, 1024));
        // k = 10 (w = 16): r = ⌈1 + 4 + 3⌉ = 8, 128 kept (sd 45), 512 slots.
        let p = CollectPlan::new(80_000, 16);
        assert_eq!((p.stride, p.r, p.cap), (16, 8, 512));
        for (n, w) in [(1026, 128), (7001, 32), (1_000_000, 128), (5000, 1)] {
            let p = CollectPlan::new(n, w);
            assert!(
                p.cap.is_power_of_two() && p.cap >= 2 * w && p.cap >= 32,
                "{p:?}"
            );
            // The sample has more than r points besides the point itself.
            assert!(n.div_ceil(p.stride) > p.r + 1, "{n} {w} {p:?}");
            // Margin: the expected keys kept, r·stride, at least twice the width.
            assert!(p.r * p.stride >= 2 * w, "{n} {w} {p:?}");
        }
        // Up to COLLECT_ALL + 1 points, every point keeps every other: no sample.
        let p = CollectPlan::new(1025, 128);
        assert_eq!((p.stride, p.cap), (0, 1024));
        assert_eq!(CollectPlan::new(2, 1).cap, 32);
    }
}
