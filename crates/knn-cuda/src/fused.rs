//! Host side of the fused method: tiles of queries and base points under a memory budget,
//! on-chip top-W for W ≤ 128 ([`SMALL_WIDTH_MAX`]), device key tiles + radix select beyond.

use crate::device::{dev_err, Gpu};
use crate::tuning::{CollectPlan, CudaTuning};
use cudarc::driver::{sys, CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use knn_core::{CandidateRequest, Kernel, KnnError, Result};

/// Queries per block tile of the fused kernels (`BQ` in `kernels/fused.cu`).
pub const QUERY_TILE: usize = 128;
/// Base points per block tile (`BB`).
pub const BASE_TILE: usize = 128;
/// Widest list kept on chip.
pub const SMALL_WIDTH_MAX: usize = 128;
/// Widest list the radix select sorts in shared memory.
pub const SELECT_WIDTH_MAX: usize = 8192;
/// Key columns per select step on the large-width path's overflow fallback.
const KEY_BLOCK: usize = 32768;
/// Survivor slots per query of the large-width threshold filter (at least 2·W).
const FILTER_CAP: usize = 16384;
/// Key tile bytes in shared memory: FP32 tiles (128 × 129 floats) and TF32 ones (128 × 136).
const TILE_SMEM: usize = 128 * 129 * 4;
const TILE_SMEM_TF32: usize = 128 * 136 * 4;
/// The list kernels' row buffers of candidate columns (`CBUF` bytes per row) after the key
/// tile: room is left in the TF32 tile (stored 128 × 132), the FP32 tile needs it added.
const ROW_BUF_SMEM: usize = 128 * 16;

/// `true` when the request runs on the tensor cores (TF32 inputs, see [`crate::floor`]): GEMM
/// kernels on first tries. Retries (`precise`) and L1/L∞ use the FP32 kernels.
pub(crate) fn uses_tf32(req: &CandidateRequest<'_>) -> bool {
    !req.precise && req.kernel.is_gemm()
}

/// Splits of the base for `qblocks` query tiles on `slots` resident blocks: the fewest whose
/// last wave is at least 95 % full (else the fullest), at most `tiles`.
fn split_count(qblocks: usize, slots: usize, tiles: usize) -> usize {
    let limit = (4 * slots).div_ceil(qblocks).clamp(1, tiles.max(1));
    let eff = |n: usize| {
        let blocks = qblocks * n;
        blocks as f64 / (blocks.div_ceil(slots) * slots) as f64
    };
    let mut best = 1;
    for n in 1..=limit {
        if eff(n) >= 0.95 {
            return n;
        }
        if eff(n) > eff(best) + 1e-9 {
            best = n;
        }
    }
    best
}

/// Entries each of `nsplit` splits keeps of a `w`-wide search when splits are truncated: the
/// fewest with `nsplit · P(Binomial(w, 1/nsplit) ≥ ws) ≤ 1e-5`. Splits take strided rows, so a
/// query's w nearest fall into them about uniformly, and a row loses its proof only when one
/// split holds ws of them (then the pipeline retries it). Fewer entries per split mean far
/// fewer insertions: each split inserts about ws·(1 + ln(len/ws)) keys.
/// (`CudaTuning::truncate_splits` = false keeps w; callers decide.)
pub(crate) fn split_width(w: usize, nsplit: usize) -> usize {
    if nsplit <= 1 {
        return w;
    }
    let p = 1.0 / nsplit as f64;
    // ln C(w, i) + i ln p + (w - i) ln(1 - p), summed from the top.
    let ln_fact = |n: usize| (1..=n).map(|x| (x as f64).ln()).sum::<f64>();
    let term = |i: usize| {
        (ln_fact(w) - ln_fact(i) - ln_fact(w - i)
            + i as f64 * p.ln()
            + (w - i) as f64 * (-p).ln_1p())
        .exp()
    };
    let mut tail = 0.0;
    for ws in (1..=w).rev() {
        tail += term(ws);
        if nsplit as f64 * tail > 1e-5 {
            return (ws + 1).min(w);
        }
    }
    1
}

/// The fused kernel of one call and how it splits the base.
struct SplitPlan<'a> {
    f: &'a CudaFunction,
    name: String,
    smem: usize,
    nsplit: usize,
    /// Entries each split keeps: `w`, or fewer for truncated splits (see the kernel).
    ws: usize,
}

/// Picks the narrowest list kernel (32, 64 or 128 slots, at most the `slots` of width `w`)
/// that holds the entries its splits keep: a narrower kernel takes less shared memory, so
/// more blocks per SM, and its splits keep fewer entries. Splits fill the last wave of
/// resident blocks (with 79 query tiles on 132 single-block SMs, 5 splits fill 3 waves),
/// unless `tuning` fixes the splits; `tuning` also says whether splits are truncated.
#[allow(clippy::too_many_arguments)]
fn split_plan<'a>(
    gpu: &'a Gpu,
    tuning: &CudaTuning,
    tf: bool,
    tag: &str,
    slots: usize,
    w: usize,
    qblocks: usize,
    tiles: usize,
    rows: usize,
) -> Result<SplitPlan<'a>> {
    for s in [1, 2, 4].into_iter().filter(|&s| s <= slots) {
        let name = format!("fused_{}{tag}_w{}", if tf { "tf32_" } else { "" }, 32 * s);
        let f = gpu.func(&name)?;
        let tile = if tf {
            TILE_SMEM_TF32
        } else {
            TILE_SMEM + ROW_BUF_SMEM
        };
        let smem = QUERY_TILE * 32 * s * 8 + tile;
        if smem > gpu.max_smem_optin {
            return Err(KnnError::Device(format!(
                "{name} needs {smem} bytes of shared memory, the device allows {}",
                gpu.max_smem_optin
            )));
        }
        let per_sm = blocks_per_sm(f, smem)?;
        let nsplit = tuning.splits.map_or_else(
            || split_count(qblocks, gpu.sm_count * per_sm, tiles),
            |v| v.clamp(1, tiles.max(1)),
        );
        // Truncation needs every split to hold ws rows and the union w of them.
        let ws = if tuning.truncate_splits && rows > w && rows / nsplit.max(1) >= w {
            split_width(w, nsplit)
        } else {
            w
        };
        if ws <= 32 * s || s == slots {
            return Ok(SplitPlan {
                f,
                name,
                smem,
                nsplit,
                ws: ws.min(w),
            });
        }
    }
    Err(KnnError::Device(format!("no list kernel for width {w}")))
}

/// Allows a list kernel `smem` bytes of dynamic shared memory and returns how many of its
/// 256-thread blocks fit on one SM, counting at most 2 (the memory plan of `run` assumes it).
fn blocks_per_sm(f: &CudaFunction, smem: usize) -> Result<usize> {
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .map_err(dev_err("shared memory limit"))?;
    Ok(
        f.occupancy_max_active_blocks_per_multiprocessor(256, smem, None)
            .unwrap_or(1)
            .clamp(1, 2) as usize,
    )
}

const SENTINEL: u64 = u64::MAX;

/// The name part of a built-in kernel's functions (`fused_{tag}_w32`, ...); expression modules
/// have their own tags (see [`crate::device::Gpu::expr_kernels`]).
pub(crate) fn kernel_tag(k: Kernel) -> &'static str {
    match k {
        Kernel::SqL2 => "sql2",
        Kernel::NegDot => "negdot",
        Kernel::L1 => "l1",
        Kernel::Linf => "linf",
    }
}

/// Decodes a composite (orderable key bits, id) into (key, id).
pub(crate) fn decode(c: u64) -> (f32, u32) {
    let ord = (c >> 32) as u32;
    let bits = if ord & 0x8000_0000 != 0 {
        ord ^ 0x8000_0000
    } else {
        !ord
    };
    (f32::from_bits(bits), c as u32)
}

struct Lists {
    buf: CudaSlice<u64>,
}

/// A base kept on the device between calls: its rows (centred when `centre` was given) and
/// squared norms, for the base the pipeline identifies by `key` (see
/// [`CandidateRequest::base_key`]).
pub(crate) struct Resident {
    pub(crate) key: u64,
    centre: Option<Vec<f32>>,
    b: CudaSlice<f32>,
    bn: CudaSlice<f32>,
    /// The rows exact keys are taken of, when they are not `b`: the rows as given when `b` is
    /// centred, or Hellinger's given rows (`hellinger`; `b` holds their square roots).
    orig: Option<CudaSlice<f32>>,
    hellinger: bool,
    /// When the device derived `b` from the given rows (Hellinger's centred roots, see
    /// [`knn_core::CentredRoots`]): each row's norm rounded up, for the floors, which then never
    /// make the host derive the rows.
    pub(crate) norm_up: Option<Vec<f32>>,
}

impl Resident {
    /// Device bytes it holds.
    pub(crate) fn bytes(&self) -> usize {
        (self.b.len() + self.bn.len() + self.orig.as_ref().map_or(0, |o| o.len())) * 4
    }

    /// The rows the exact keys `exact` asks for are taken of, if held.
    fn given(&self, exact: Exact<'_>) -> Option<&CudaSlice<f32>> {
        match exact {
            Exact::Hellinger { .. } => self.orig.as_ref().filter(|_| self.hellinger),
            Exact::Kernel if self.hellinger => None,
            Exact::Kernel if self.centre.is_none() => Some(&self.b),
            Exact::Kernel => self.orig.as_ref(),
        }
    }
}

/// How the fused method sees the base of one call.
pub(crate) struct BaseView<'a> {
    /// Subtracted from base and queries on the device (squared L2 only: translation leaves
    /// its keys unchanged, and smaller norms tighten the GEMM form's rounding bound).
    pub centre: Option<&'a [f32]>,
    /// The device copy kept from earlier calls, reused when its key and centre match and
    /// replaced otherwise (only when the request has a `base_key` and the base fits).
    pub cache: &'a mut Option<Resident>,
    /// Also compute each candidate's exact f64 key on the device (see
    /// [`knn_core::Engine::candidates_with_exact`]), when the base stays resident.
    pub exact: Option<Exact<'a>>,
    /// Set when the request may be a first try of a whole graph the engine was told of
    /// ([`knn_core::Engine::expect_graph`]): the symmetric lists kept for it, made on the
    /// first such request (see [`GraphLists`]).
    pub graph: Option<&'a mut Option<GraphLists>>,
    /// The given base rows copied ahead (see [`Prefetched`]), taken by the upload of those rows.
    pub prefetched: &'a mut Option<Prefetched>,
}

/// Every row's first-try lists of a whole kNN graph, made at once with each unordered pair's
/// key computed once (`kernels/sym.cu`), kept on the device while the graph's rounds copy their
/// rows out of them.
pub(crate) struct GraphLists {
    key: u64,
    width: usize,
    kernel: String,
    lists: CudaSlice<u64>,
    /// Per row, the smallest entry a truncated list left out (as [`Output::cut`]).
    cut: CudaSlice<u64>,
    /// Every row finished at once (exact keys and final rows), made by the first call that
    /// finishes rows; later calls only download theirs.
    finished: std::cell::OnceCell<GraphFinished>,
    /// Absolute input rounding of the lists' keys besides the relative one (per coordinate, in
    /// the engine rows' units: f16's subnormal spacing, see `round_f16`; 0 for TF32 and FP32).
    input_abs: f64,
}

/// The given base rows copied to the device while the host prepared (see
/// `Engine::prefetch_base`), for the requests keyed `key` that upload these very host rows.
pub(crate) struct Prefetched {
    pub(crate) key: u64,
    /// Address and length of the host rows.
    pub(crate) host: (usize, usize),
    pub(crate) buf: CudaSlice<f32>,
}

/// `rows` on the device: the prefetched copy when it holds these very host rows for a request
/// keyed as it is, else uploaded now (a copy prefetched for another key is dropped).
fn upload_rows(
    gpu: &Gpu,
    slot: &mut Option<Prefetched>,
    key: Option<u64>,
    rows: &[f32],
) -> Result<CudaSlice<f32>> {
    if slot.as_ref().is_some_and(|p| Some(p.key) != key) {
        *slot = None;
    }
    if slot
        .as_ref()
        .is_some_and(|p| p.host == (rows.as_ptr() as usize, rows.len()))
    {
        return Ok(slot.take().expect("checked above").buf);
    }
    gpu.upload(rows)
}

/// Every row of a graph finished on the device (see `finish_lists`): `n × k` ids and
/// distances, and per row the k-th exact key and the W-th composite.
struct GraphFinished {
    k: usize,
    mode: i32,
    ids: CudaSlice<u32>,
    dists: CudaSlice<f32>,
    kth: CudaSlice<f64>,
    last: CudaSlice<u64>,
    /// Per launch of [`FINISH_ROWS`] rows: recorded behind it (its rows' downloads wait for it
    /// alone, on the copy stream, while the main stream finishes the next rows) ...
    ready: Vec<cudarc::driver::CudaEvent>,
    /// ... and its flag of a list holding an unwritten slot or the row's own id.
    bad: CudaSlice<u32>,
}

impl GraphFinished {
    /// Rows `at..at + ids.len() / k` into the host slices, once their launches are done (see
    /// `ready`); an error when one of those launches flagged a bad list.
    fn download(
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
        let (first, last) = (at / FINISH_ROWS, (at + m - 1) / FINISH_ROWS);
        let after = &self.ready[last];
        let k = self.k;
        gpu.download_range_after(&self.ids, at * k, out.ids, after)?;
        gpu.download_range_after(&self.dists, at * k, out.dists, after)?;
        gpu.download_range_after(&self.kth, at, out.kth, after)?;
        gpu.download_range_after(&self.last, at, out.last, after)?;
        gpu.download_range_after(cut.0, at, cut.1, after)?;
        let mut flags = vec![0u32; last + 1 - first];
        gpu.download_range_after(&self.bad, first, &mut flags, after)?;
        if flags.iter().any(|&b| b != 0) {
            return Err(KnnError::Device(
                "a graph's list holds an unwritten slot or the row's own id".into(),
            ));
        }
        Ok(())
    }
}

/// Rows per launch when a whole graph is finished at once (bounds the exact keys' buffer).
const FINISH_ROWS: usize = 16384;

/// The finished rows of graph `g` for `k` neighbours as distances of `mode`, made now if they
/// were not (exact keys of `kind` of the given base at `given`, `n × d`), or `None` when their
/// buffers do not fit `budget` or `g` was finished for another `k` or `mode`.
fn graph_finished<'g>(
    gpu: &Gpu,
    g: &'g GraphLists,
    (k, mode): (usize, i32),
    (kind, given, d): (Option<Kernel>, u64, usize),
    budget: usize,
) -> Result<Option<&'g GraphFinished>> {
    if let Some(f) = g.finished.get() {
        return Ok((f.k == k && f.mode == mode).then_some(f));
    }
    let (n, w) = (g.cut.len(), g.width);
    if n * (8 * k + 16) + FINISH_ROWS * w * 8 > budget / 4 {
        return Ok(None);
    }
    let mut f = GraphFinished {
        k,
        mode,
        ids: gpu.alloc::<u32>(n * k)?,
        dists: gpu.alloc::<f32>(n * k)?,
        kth: gpu.alloc::<f64>(n)?,
        last: gpu.alloc::<u64>(n)?,
        ready: Vec::new(),
        bad: gpu
            .stream
            .alloc_zeros::<u32>(n.div_ceil(FINISH_ROWS))
            .map_err(dev_err("allocating device memory"))?,
    };
    // Each row excludes itself.
    let own: Vec<u32> = (0..n as u32).collect();
    let own = gpu.upload(&own)?;
    for at in (0..n).step_by(FINISH_ROWS) {
        let m = FINISH_ROWS.min(n - at);
        let lists = gpu.ptr(&g.lists) + (at * w * 8) as u64;
        let q = given + (at * d * 4) as u64;
        let keys = exact_keys(gpu, kind, (q, m), (given, n), lists, w, d)?;
        let out = (
            gpu.ptr(&f.ids) + (at * k * 4) as u64,
            gpu.ptr(&f.dists) + (at * k * 4) as u64,
            gpu.ptr(&f.kth) + (at * 8) as u64,
            gpu.ptr(&f.last) + (at * 8) as u64,
        );
        let excl = gpu.ptr(&own) + (at * 4) as u64;
        launch_finish(
            gpu,
            (lists, gpu.ptr(&keys), w),
            (k, mode),
            (n, excl),
            gpu.ptr(&f.bad) + (at / FINISH_ROWS * 4) as u64,
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
fn list_slots(w: usize) -> usize {
    if w <= 32 {
        1
    } else if w <= 64 {
        2
    } else {
        4
    }
}

/// The whole graph's lists for `req` (its base is the graph's points, resident at `b`, `bn`):
/// the kept ones when they match, else made now. `None` when no symmetric kernel fits the
/// request or its buffers do not fit `budget` (the call then runs as usual). Returns the
/// lists and the device time spent making them.
fn graph_lists<'g>(
    gpu: &Gpu,
    tuning: &CudaTuning,
    req: &CandidateRequest<'_>,
    (tag, tf): (&str, bool),
    (b, bn): (u64, u64),
    slot: &'g mut Option<GraphLists>,
    budget: usize,
) -> Result<Option<(&'g GraphLists, f32)>> {
    let (n, d, w) = (req.base.rows(), req.base.dim(), req.width);
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
        if let Some((lists, ms)) = collected_lists(gpu, (n, d, w), tag, (b, bn), plan, budget)? {
            *slot = Some(GraphLists { key, ..lists });
            return Ok(slot.as_ref().map(|g| (g, ms)));
        }
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
    let f = gpu.func(&name)?;
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
    let nsplit = plan(blocks_per_sm(f, smem)?);
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
    let timer = KernelTimer::start(gpu)?;
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
    if std::env::var_os("KNN_PROFILE").is_some() {
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
        lists: merged.buf,
        cut,
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

/// Every point's lists of a graph in the collect form (see `kernels/sym.cu`): thresholds from
/// the sample, each unordered pair's key once into the buffers of the points it does not
/// exceed, then each buffer sorted, by `plan` (`None`: the automatic one). `None` when its
/// buffers do not fit half the `budget`. Returns the lists (`key` left 0) and their device
/// time.
fn collected_lists(
    gpu: &Gpu,
    (n, d, w): (usize, usize, usize),
    tag: &str,
    (b, bn): (u64, u64),
    plan: Option<CollectPlan>,
    budget: usize,
) -> Result<Option<(GraphLists, f32)>> {
    let plan = plan.unwrap_or_else(|| CollectPlan::new(n, w));
    let CollectPlan { stride, r, cap } = plan;
    if n * ((cap + w + 2) * 8 + d * 4) > budget / 2 {
        return Ok(None);
    }
    let tiles = n.div_ceil(QUERY_TILE);
    let partners = (tiles - 1) / 2 + 1;
    let nsplit = partners.min(8);
    let mut timer = KernelTimer::start(gpu)?;
    let profile = std::env::var_os("KNN_PROFILE").is_some();
    // The points rounded once (the product's fragments are then taken as they are).
    let rounded = rounded_points(gpu, b, n, d)?;
    let (pt, us) = (rounded.ptr, rounded.us);
    let name = format!("sym_collect_f16_{tag}");
    let (n64, d32) = (n as i64, rounded.words as i32);
    let hi = if stride == 0 {
        gpu.upload(&vec![f32::INFINITY; n])?
    } else {
        let hi = gpu.alloc::<f32>(n)?;
        let f = gpu.func(&format!("{name}_thr"))?;
        let smem = TILE_SMEM_TF32 + 2 * r * QUERY_TILE * 4;
        blocks_per_sm(f, smem)?;
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
            .arg(&us);
        // SAFETY: pt holds n rows of d32 words and bn n, hi n; the sample rows m·stride < n;
        // the shared memory is the key tile and 2·r keys per row.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (tiles as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(dev_err(&name))?;
        hi
    };
    timer.mark(gpu, "thresholds", profile)?;
    let cnt = gpu
        .stream
        .alloc_zeros::<u32>(n)
        .map_err(dev_err("allocating device memory"))?;
    let buf = gpu.alloc::<u64>(n * cap)?;
    let (ph, pc, pb, cap32) = (gpu.ptr(&hi), gpu.ptr(&cnt), gpu.ptr(&buf), cap as i32);
    let f = gpu.func(&name)?;
    let smem = COLLECT_SMEM;
    blocks_per_sm(f, smem)?;
    let ns32 = nsplit as i32;
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
        .arg(&us);
    // SAFETY: pt holds n rows of d32 words, bn, hi and cnt n, buf n×cap; the shared memory is
    // laid out as `COLLECT_SMEM` says.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((tiles * nsplit) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err(&name))?;
    timer.mark(gpu, "pairs", profile)?;
    let lists = gpu.alloc::<u64>(n * w)?;
    let cut = gpu.alloc::<u64>(n)?;
    let f = gpu.func("sym_collect_finish")?;
    let smem = FINISH_WARPS * cap * 8;
    if smem > gpu.max_smem_optin {
        return Err(KnnError::Device(format!(
            "collect buffers of {cap} do not fit shared memory"
        )));
    }
    blocks_per_sm(f, smem)?;
    let (w32, pl, pcut) = (w as i32, gpu.ptr(&lists), gpu.ptr(&cut));
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&pb)
        .arg(&pc)
        .arg(&cap32)
        .arg(&n64)
        .arg(&w32)
        .arg(&ph)
        .arg(&pl)
        .arg(&pcut);
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
    let lists = GraphLists {
        finished: std::cell::OnceCell::new(),
        input_abs: rounded.input_abs,
        key: 0,
        width: w,
        kernel: format!("{name}_w{w}"),
        lists,
        cut,
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

/// Rounds the `n × d` points at `b` for the collect kernels. f16 halves the product's
/// instructions and bytes against TF32 at the same relative rounding (10 explicit mantissa
/// bits); its narrow exponent is met by scaling every value by a power of two (exact) so that
/// the largest magnitude lies in [2¹⁴, 2¹⁵), and values it leaves below f16's normal range
/// are rounded to within 2⁻²⁵ (scaled), which the floors add (`input_abs`).
fn rounded_points(gpu: &Gpu, b: u64, n: usize, d: usize) -> Result<Rounded> {
    let grid = |len: usize| (len.div_ceil(256).min(gpu.sm_count * 16).max(1) as u32, 1, 1);
    let maxbits = gpu
        .stream
        .alloc_zeros::<u32>(1)
        .map_err(dev_err("allocating device memory"))?;
    let pm = gpu.ptr(&maxbits);
    let len = (n * d) as i64;
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
    let us = 1.0 / f16_scale(gpu.download(&maxbits, 1)?[0]);
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

/// Device time between its start and [`KernelTimer::stop`] (CUDA events; 0 after a plain
/// sync when events are not available), with the parts between its marks.
struct KernelTimer {
    start: Option<cudarc::driver::CudaEvent>,
    marks: Vec<(&'static str, cudarc::driver::CudaEvent)>,
}

impl KernelTimer {
    fn event(gpu: &Gpu) -> Result<Option<cudarc::driver::CudaEvent>> {
        let e = gpu
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok();
        if let Some(e) = &e {
            e.record(&gpu.stream).map_err(dev_err("event"))?;
        }
        Ok(e)
    }

    fn start(gpu: &Gpu) -> Result<Self> {
        Ok(KernelTimer {
            start: Self::event(gpu)?,
            marks: Vec::new(),
        })
    }

    /// Ends the part `what` here (when `on`: profiling).
    fn mark(&mut self, gpu: &Gpu, what: &'static str, on: bool) -> Result<()> {
        if let (true, Some(e)) = (on, Self::event(gpu)?) {
            self.marks.push((what, e));
        }
        Ok(())
    }

    /// The total ms and "part ms, ..." of the marked parts (the rest is `last`).
    fn stop(self, gpu: &Gpu, last: &str) -> Result<(f32, String)> {
        let (Some(t0), Some(t1)) = (self.start, Self::event(gpu)?) else {
            gpu.sync()?;
            return Ok((0.0, String::new()));
        };
        t1.synchronize().map_err(dev_err("event"))?;
        let ms = |e: &cudarc::driver::CudaEvent| t0.elapsed_ms(e).unwrap_or(0.0);
        let mut parts = String::new();
        let mut at = 0.0;
        for (what, e) in &self.marks {
            parts += &format!("{what} {:.2}, ", ms(e) - at);
            at = ms(e);
        }
        let total = ms(&t1);
        if !self.marks.is_empty() {
            parts += &format!("{last} {:.2}", total - at);
        }
        Ok((total, parts))
    }
}

/// Whether `exclude` excludes from each query its own row `at + i` of the base.
fn excludes_itself(exclude: Option<&[u32]>, at: usize) -> bool {
    exclude.is_some_and(|e| e.iter().enumerate().all(|(i, &x)| x as usize == at + i))
}

/// Copies of the base a call keeps: exact keys of a centred base, or Hellinger's, need the given
/// rows beside the base's, and so does a base the device derives (`derived`: from given rows).
fn copies(exact: Option<Exact<'_>>, centred: bool, derived: bool) -> usize {
    match exact {
        _ if derived => 2,
        Some(Exact::Hellinger { .. }) => 2,
        Some(Exact::Kernel) if centred => 2,
        _ => 1,
    }
}

/// Whether [`run`] keeps a base of `nb × d` resident under `budget` (it then gives exact keys
/// and finishes rows): when its copies and norms take at most half the budget.
pub(crate) fn base_fits(
    nb: usize,
    d: usize,
    exact: Option<Exact<'_>>,
    (centred, derived): (bool, bool),
    budget: usize,
) -> bool {
    nb * ((d + 1) * 4 + (copies(exact, centred, derived) - 1) * d * 4) <= budget / 2
}

/// Which exact keys a call computes besides its candidates.
#[derive(Clone, Copy)]
pub(crate) enum Exact<'a> {
    /// The kernel's key (`Kernel::exact`) of the request's rows as given (uncentred).
    Kernel,
    /// Hellinger's key (`Metric::exact_key`) of these given rows, `nb × d` and `nq × d`: the
    /// request's rows are their square roots (maybe centred).
    Hellinger { base: &'a [f32], queries: &'a [f32] },
}

/// What [`run`] returns: `nq × W` composites (rows sorted), the exact keys of the candidates
/// when asked for and possible, and the kernels' device time when it could be measured.
pub(crate) struct Output {
    pub composites: Vec<u64>,
    /// Per row, the smallest entry a truncated split left out (SENTINEL: none): every base
    /// point missing from the row is at least min(its W-th composite, this).
    pub cut: Vec<u64>,
    pub exact: Option<Vec<f64>>,
    /// Set when the rows were finished on the device (then `composites` and `exact` are
    /// empty).
    pub finished: Option<Finished>,
    pub kernel_ms: Option<f32>,
    /// Absolute input rounding of the keys per coordinate besides the relative one (see
    /// `GraphLists::input_abs`), for the floors.
    pub input_abs: f64,
}

/// Runs the fused method with the kernels named by `tag` (a built-in kernel's
/// [`kernel_tag`], or an expression module's) under `tuning`; returns `nq × W` composites,
/// rows sorted. Also returns the device time of the kernels (CUDA events), when it could be
/// measured.
pub(crate) fn run(
    gpu: &Gpu,
    req: &CandidateRequest<'_>,
    budget: usize,
    base: BaseView<'_>,
    tag: &str,
    tuning: &CudaTuning,
    mut finish: Option<Finish<'_>>,
) -> Result<Output> {
    let (nq, nb, d, w) = (
        req.queries.rows(),
        req.base.rows(),
        req.base.dim(),
        req.width,
    );
    let small = w <= SMALL_WIDTH_MAX;
    let slots = list_slots(w);
    // Base: resident when it takes at most half the budget, else streamed in chunks.
    let row_bytes = (d + 1) * 4;
    let centre_dev = base.centre.map(|c| gpu.upload(c)).transpose()?;
    let centre_ptr = centre_dev.as_ref().map_or(0, |c| gpu.ptr(c));
    let cached = match (req.base_key, base.cache.as_ref()) {
        (Some(key), Some(r)) => {
            r.key == key
                && r.centre.as_deref() == base.centre
                && base.exact.is_none_or(|e| r.given(e).is_some())
        }
        _ => false,
    };
    if !cached {
        // Free the old copy before a new base takes its place.
        *base.cache = None;
    }
    let centred = base.centre.is_some();
    let derived = req.base.centred_roots().is_some() && !centred;
    let fits = base_fits(nb, d, base.exact, (centred, derived), budget);
    let copies = copies(base.exact, centred, derived);
    let bc = if cached || fits {
        nb
    } else {
        ((budget / 2 / row_bytes) / BASE_TILE * BASE_TILE).max(BASE_TILE)
    };
    let base_bytes = bc * row_bytes;
    let rest = budget.saturating_sub(base_bytes).max(1 << 20);
    let nsplit_max = (8 * gpu.sm_count).max(1);
    let tf = uses_tf32(req);
    let cap = FILTER_CAP.max(2 * w);
    let per_query = d * 4
        + 8
        + 2 * w * 8
        + if small {
            nsplit_max.min(nb.div_ceil(BASE_TILE)) * w * 8
        } else {
            cap * 8 + 4
        };
    let mut qc = rest / per_query;
    if small {
        // The split lists of one call number at most 4·slots + qblocks tiles of QUERY_TILE rows
        // (see `split_count`; slots ≤ 2 per SM), far fewer than `nsplit_max` per query once
        // the chunk is large: with that bound, a streamed base is sent once per call instead
        // of once per small query chunk.
        let fixed = (nsplit_max + 1) * QUERY_TILE * w * 8;
        let lean = d * 4 + 8 + 3 * w * 8;
        qc = qc.max(rest.saturating_sub(fixed) / lean);
    }
    let qc = qc.clamp(1, nq.max(1));
    let qc = if qc >= QUERY_TILE {
        qc / QUERY_TILE * QUERY_TILE
    } else {
        qc
    };

    let mut phases = Phases::new();
    let mut own = None;
    if bc == nb && !cached {
        let r = if let Some(roots) = req.base.centred_roots().filter(|_| derived) {
            // Hellinger's centred roots, derived here from the given rows (uploaded once, and
            // kept for the exact keys) with the host's centre: the same bits as the host's.
            let orig = upload_rows(gpu, base.prefetched, req.base_key, roots.given.as_slice())?;
            let centre = gpu.upload(roots.centre)?;
            let (b, norm_up) = (gpu.alloc::<f32>(nb * d)?, gpu.alloc::<f32>(nb)?);
            let ptrs = (gpu.ptr(&b), gpu.ptr(&norm_up));
            gpu.hellinger_roots(gpu.ptr(&orig), nb, d, gpu.ptr(&centre), ptrs)?;
            let bn = gpu.alloc::<f32>(nb)?;
            gpu.sq_norms(gpu.ptr(&b), nb, d, gpu.ptr(&bn))?;
            Resident {
                key: req.base_key.unwrap_or(0),
                centre: None,
                b,
                bn,
                orig: Some(orig),
                hellinger: true,
                norm_up: Some(gpu.download(&norm_up, nb)?),
            }
        } else {
            let given = upload_rows(gpu, base.prefetched, req.base_key, req.base.as_slice())?;
            let orig = match base.exact {
                Some(Exact::Hellinger { base: rows, .. }) => {
                    Some(upload_rows(gpu, base.prefetched, req.base_key, rows)?)
                }
                _ if copies == 2 => Some(
                    gpu.stream
                        .clone_dtod(&given)
                        .map_err(dev_err("copying on the device"))?,
                ),
                _ => None,
            };
            let bn = gpu.alloc::<f32>(nb)?;
            gpu.centre_sq_norms(gpu.ptr(&given), nb, d, centre_ptr, gpu.ptr(&bn))?;
            Resident {
                key: req.base_key.unwrap_or(0),
                centre: base.centre.map(<[f32]>::to_vec),
                b: given,
                bn,
                orig,
                hellinger: matches!(base.exact, Some(Exact::Hellinger { .. })),
                norm_up: None,
            }
        };
        if req.base_key.is_some() {
            *base.cache = Some(r);
        } else {
            own = Some(r);
        }
    }
    let held = if bc == nb {
        own.as_ref().or(base.cache.as_ref())
    } else {
        None
    };
    let resident = held.map(|r| (&r.b, &r.bn));
    // A first try of a whole graph the engine was told of: every row's lists made at once,
    // each unordered pair once, then each call's rows copied out of them.
    let graph = match (base.graph, resident) {
        (Some(slot), Some((b, bn)))
            if small
                && req
                    .queries
                    .row_offset_in(&req.base)
                    .is_some_and(|at| excludes_itself(req.exclude, at)) =>
        {
            graph_lists(
                gpu,
                tuning,
                req,
                (tag, uses_tf32(req)),
                (gpu.ptr(b), gpu.ptr(bn)),
                slot,
                rest,
            )?
        }
        _ => None,
    };
    // Rows taken from the graph's lists carry its keys' absolute input rounding.
    let input_abs = graph.map_or(0.0, |(g, _)| g.input_abs);
    let given_base = base.exact.zip(held).and_then(|(e, r)| r.given(e));
    // Rows finish here only with exact keys at hand.
    let mut finish = finish.take().filter(|_| given_base.is_some());
    let lists = if finish.is_some() { 0 } else { nq * w };
    let mut exact = given_base.map(|_| vec![0.0f64; lists]);
    // Every row is written by a download below: zeroed (lazily mapped) memory, not a fill.
    let mut out = vec![0u64; lists];
    let mut cut_all = vec![0u64; nq];
    let mut finished = finish.as_ref().map(|_| Finished {
        kth: vec![0.0; nq],
        last: vec![0; nq],
    });
    let mut bad_flagged = false;
    let bad = gpu
        .stream
        .alloc_zeros::<u32>(1)
        .map_err(dev_err("allocating device memory"))?;
    let mut kernel_ms = Some(graph.map_or(0.0, |g| g.1));
    // Which exact keys the given rows give: Hellinger's, or the kernel's.
    let exact_kind = match base.exact {
        Some(Exact::Hellinger { .. }) => None,
        _ => Some(req.kernel),
    };
    phases.lap(gpu, "base up");
    // A graph's call for no rows (`Engine::begin_graph`): every row is finished now, queued on
    // the device for the calls to come.
    if let (0, Some((g, _)), Some(f), Some(gb)) = (nq, graph, finish.as_ref(), given_base) {
        graph_finished(gpu, g, (f.k, f.mode), (exact_kind, gpu.ptr(gb), d), rest)?;
    }
    for qs in (0..nq).step_by(qc) {
        let qe = (qs + qc).min(nq);
        let n = qe - qs;
        // Queries that are rows of the resident base (a graph's rounds) are read where the
        // base lies: nothing to upload, centre or measure again.
        let rows = req.queries.slice_rows(qs, qe);
        let alias = resident.and_then(|_| rows.row_offset_in(&req.base));
        // Buffers of this chunk's own, kept until its kernels are done.
        let (mut q_own, mut _qn_own) = (None, None);
        let mut given_own: Option<CudaSlice<f32>> = None;
        let (q, qn) = match (alias, resident) {
            (Some(at), Some((b, bn))) => (
                gpu.ptr(b) + (at * d * 4) as u64,
                gpu.ptr(bn) + (at * 4) as u64,
            ),
            _ => {
                let (own, norms) = (gpu.upload(rows.as_slice())?, gpu.alloc::<f32>(n)?);
                let ptrs = (gpu.ptr(&own), gpu.ptr(&norms));
                (q_own, _qn_own) = (Some(own), Some(norms));
                ptrs
            }
        };
        // The given query rows, for exact keys (uncentred; Hellinger's: not square-rooted).
        let q_given = match (base.exact, given_base) {
            (Some(Exact::Hellinger { base: hb, queries }), Some(gb)) => {
                let rows = &queries[qs * d..qe * d];
                match rows_within(hb, rows, d) {
                    Some(at) => gpu.ptr(gb) + (at * d * 4) as u64,
                    None => gpu.ptr(given_own.insert(gpu.upload(rows)?)),
                }
            }
            (_, Some(gb)) if centre_ptr != 0 => match alias {
                Some(at) => gpu.ptr(gb) + (at * d * 4) as u64,
                None => {
                    // Copied before the queries are centred in place below.
                    let own = q_own.as_ref().expect("uploaded above");
                    let copy = gpu
                        .stream
                        .clone_dtod(own)
                        .map_err(dev_err("copying on the device"))?;
                    gpu.ptr(given_own.insert(copy))
                }
            },
            _ => q,
        };
        if alias.is_none() {
            gpu.centre_sq_norms(q, n, d, centre_ptr, qn)?;
        }
        phases.lap(gpu, "queries up");
        // Rows of a graph whose lists are made: every row is finished at once, by the first
        // call, and each call downloads its own.
        if let (Some((g, _)), Some(at), Some(f), Some(done), Some(gb)) =
            (graph, alias, finish.as_mut(), finished.as_mut(), given_base)
        {
            let given = (exact_kind, gpu.ptr(gb), d);
            if let Some(all) = graph_finished(gpu, g, (f.k, f.mode), given, rest)? {
                let k = f.k;
                let rows = FinishedChunk {
                    ids: &mut f.ids[qs * k..qe * k],
                    dists: &mut f.dists[qs * k..qe * k],
                    kth: &mut done.kth[qs..qe],
                    last: &mut done.last[qs..qe],
                };
                all.download(gpu, at, rows, (&g.cut, &mut cut_all[qs..qe]))?;
                phases.lap(gpu, "finished or keys down");
                continue;
            }
        }
        let excl = match req.exclude {
            Some(e) => Some(gpu.upload(&e[qs..qe])?),
            None => None,
        };
        let excl_ptr = excl.as_ref().map_or(0, |e| gpu.ptr(e));
        let mut cut = gpu.alloc::<u64>(n)?;
        gpu.fill_u64(gpu.ptr(&cut), n, SENTINEL)?;
        let mut running: Option<Lists> = None;
        let t0 = gpu
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok();
        if let Some(e) = &t0 {
            e.record(&gpu.stream).map_err(dev_err("event"))?;
        }
        let copied = if let (Some((g, _)), Some(at)) = (graph, alias) {
            // The graph's lists of these rows (the same candidates and floors as the kernels'
            // below would give: every other point was met once, by row or by column).
            let mut rows = gpu.alloc::<u64>(n * w)?;
            gpu.stream
                .memcpy_dtod(&g.lists.slice(at * w..(at + n) * w), &mut rows)
                .map_err(dev_err("copying on the device"))?;
            running = Some(Lists { buf: rows });
            gpu.stream
                .memcpy_dtod(&g.cut.slice(at..at + n), &mut cut)
                .map_err(dev_err("copying on the device"))?;
            true
        } else {
            false
        };
        let chunks = if copied { 0 } else { nb };
        for bs in (0..chunks).step_by(bc) {
            let be = (bs + bc).min(nb);
            let chunk;
            let (b, bn) = match resident {
                Some((b, bn)) => (b, bn),
                None => {
                    chunk = upload_base(gpu, req, bs, be, centre_ptr)?;
                    (&chunk.0, &chunk.1)
                }
            };
            let bl = be - bs;
            if small {
                let tiles = bl.div_ceil(BASE_TILE);
                let qblocks = n.div_ceil(QUERY_TILE);
                let plan = split_plan(gpu, tuning, tf, tag, slots, w, qblocks, tiles, bl)?;
                let SplitPlan {
                    f,
                    name,
                    smem,
                    nsplit,
                    ws,
                } = plan;
                // Several splits take strided rows (split y: rows y, y + nsplit, ...), so that
                // a run of stored neighbours spreads over them (what truncation relies on).
                let (split_len, strided) = if nsplit > 1 {
                    (0, 1)
                } else {
                    (tiles.div_ceil(nsplit) * BASE_TILE, 0)
                };
                let nsplit = bl.div_ceil(split_len.max(1)).min(nsplit).max(1);
                // Not filled: every (row, split) writes all its w slots.
                let partial = gpu.alloc::<u64>(n * nsplit * w)?;
                // Shared thresholds: truncated splits only read them, and unprimed (no earlier
                // base chunk) they would all be SENTINEL, so then the kernel gets none.
                let gthr = if ws < w && running.is_none() {
                    None
                } else {
                    let g = gpu.alloc::<u64>(n)?;
                    gpu.fill_u64(gpu.ptr(&g), n, SENTINEL)?;
                    Some(g)
                };
                let pg = gthr.as_ref().map_or(0, |g| gpu.ptr(g));
                let launch =
                    |rows: usize, split: (usize, i32, usize, i32), out: u64, thr: u64, cut: u64| {
                        let (split_len, strided, nsplit, ws) = split;
                        let args = (
                            (q, qn, n as i64),
                            (gpu.ptr(b), gpu.ptr(bn), rows as i64, bs as u32),
                            (d as i32, excl_ptr, w as i32, ws, split_len as i64, strided),
                            (out, thr, cut),
                        );
                        let mut l = gpu.stream.launch_builder(f);
                        l.arg(&args.0 .0)
                            .arg(&args.0 .1)
                            .arg(&args.0 .2)
                            .arg(&args.1 .0)
                            .arg(&args.1 .1)
                            .arg(&args.1 .2)
                            .arg(&args.1 .3)
                            .arg(&args.2 .0)
                            .arg(&args.2 .1)
                            .arg(&args.2 .2)
                            .arg(&args.2 .3)
                            .arg(&args.2 .4)
                            .arg(&args.2 .5)
                            .arg(&args.3 .0)
                            .arg(&args.3 .1)
                            .arg(&args.3 .2);
                        // SAFETY: buffers sized as the kernel documents: q n×d, qn n, b ≥ rows×d,
                        // bn ≥ rows, exclude n (or null), out n×nsplit×w, thr and cut n (or null).
                        unsafe {
                            l.launch(LaunchConfig {
                                grid_dim: (qblocks as u32, nsplit as u32, 1),
                                block_dim: (256, 1, 1),
                                shared_mem_bytes: smem as u32,
                            })
                        }
                        .map_err(dev_err(&name))
                        .map(|_| ())
                    };
                // Prime each query's shared threshold with a proven bound on its W-th
                // composite: the W-th of the lists so far (earlier base chunks). (Priming
                // with a prefix of the base lost: NOTES.md, 2026-11-23, "Tried and left off".)
                if let Some(r) = &running {
                    prime_thresholds(gpu, gpu.ptr(&r.buf), n, w, pg)?;
                }
                launch(
                    bl,
                    (split_len, strided, nsplit, ws as i32),
                    gpu.ptr(&partial),
                    pg,
                    gpu.ptr(&cut),
                )?;
                // One split and no earlier chunk: the split's sorted list is the answer.
                let next = if nsplit == 1 && running.is_none() {
                    Lists { buf: partial }
                } else {
                    merge_runs(
                        gpu,
                        n,
                        w,
                        32 * slots,
                        (gpu.ptr(&partial), nsplit),
                        running.as_ref().map_or(0, |r| gpu.ptr(&r.buf)),
                    )?
                };
                // A streamed chunk's host staging is reused by the next upload; resident
                // buffers are freed in stream order, so the host need not wait here.
                if resident.is_none() {
                    gpu.sync()?;
                }
                running = Some(next);
            } else {
                let ctx = Large {
                    tag,
                    tf,
                    n,
                    d,
                    w,
                    cap,
                    q,
                    qn,
                    excl: excl_ptr,
                    b: gpu.ptr(b),
                    bn: gpu.ptr(bn),
                    id0: bs,
                };
                running = Some(large(gpu, &ctx, bl, running)?);
            }
        }
        if let (Some(t0), Some(t1)) = (
            &t0,
            gpu.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .ok(),
        ) {
            t1.record(&gpu.stream).map_err(dev_err("event"))?;
            t1.synchronize().map_err(dev_err("event"))?;
            kernel_ms = kernel_ms.zip(t0.elapsed_ms(&t1).ok()).map(|(a, b)| a + b);
        } else {
            kernel_ms = None;
        }
        let r = running.expect("the base is not empty");
        phases.lap(gpu, "kernels");
        if let (Some(gb), Some(ex)) = (given_base, exact.as_mut()) {
            let (gb, rb) = (gpu.ptr(gb), gpu.ptr(&r.buf));
            let keys = exact_keys(gpu, exact_kind, (q_given, n), (gb, nb), rb, w, d)?;
            phases.lap(gpu, "exact keys");
            if let (Some(f), Some(done)) = (finish.as_mut(), finished.as_mut()) {
                let k = f.k;
                let lists = (&r.buf, &keys, w);
                let rows = FinishedChunk {
                    ids: &mut f.ids[qs * k..qe * k],
                    dists: &mut f.dists[qs * k..qe * k],
                    kth: &mut done.kth[qs..qe],
                    last: &mut done.last[qs..qe],
                };
                finish_lists(gpu, lists, (k, f.mode), (nb, excl_ptr), gpu.ptr(&bad), rows)?;
                bad_flagged = true;
            } else {
                gpu.download_into(&keys, &mut ex[qs * w..qe * w])?;
            }
        }
        phases.lap(gpu, "finished or keys down");
        if finished.is_none() {
            gpu.download_into(&r.buf, &mut out[qs * w..qe * w])?;
        }
        gpu.download_into(&cut, &mut cut_all[qs..qe])?;
        phases.lap(gpu, "downloads");
    }
    phases.print(nq);
    // (Only `finish_lists` flags it: rows from a finished graph were checked by their own
    // download, and waiting here would wait for the graph's later launches too.)
    if bad_flagged && gpu.download(&bad, 1)?[0] != 0 {
        return Err(KnnError::Device(
            "a candidate list holds an unwritten slot or an excluded id".into(),
        ));
    }
    Ok(Output {
        composites: out,
        cut: cut_all,
        exact: exact.filter(|_| finished.is_none()),
        finished,
        kernel_ms,
        input_abs,
    })
}

/// Rows to finish on the device (see `knn_core::Engine::finish_rows`): the `k` best of each
/// row's candidates by exact key, as distances of `mode` (see `finish_lists` in
/// `common.cuh`), written into `ids` and `dists` (`nq × k`).
pub(crate) struct Finish<'a> {
    pub k: usize,
    pub mode: i32,
    pub ids: &'a mut [u32],
    pub dists: &'a mut [f32],
}

impl Finish<'_> {
    /// The same rows, borrowed again (for a retry of a call).
    pub(crate) fn reborrow(&mut self) -> Finish<'_> {
        Finish {
            k: self.k,
            mode: self.mode,
            ids: self.ids,
            dists: self.dists,
        }
    }
}

/// What the host needs besides the finished rows: per row, the k-th exact key and the W-th
/// composite (whose key, with the row's `cut`, gives its floor).
pub(crate) struct Finished {
    pub kth: Vec<f64>,
    pub last: Vec<u64>,
}

/// One query chunk's share of the finished rows.
struct FinishedChunk<'a> {
    ids: &'a mut [u32],
    dists: &'a mut [f32],
    kth: &'a mut [f64],
    last: &'a mut [u64],
}

/// Launches `finish_lists` on the chunk's candidate lists (`lists`: composites, exact keys,
/// width) and downloads its rows into `out`.
fn finish_lists(
    gpu: &Gpu,
    lists: (&CudaSlice<u64>, &CudaSlice<f64>, usize),
    (k, mode): (usize, i32),
    (nb, excl): (usize, u64),
    bad: u64,
    out: FinishedChunk<'_>,
) -> Result<()> {
    let (comps, exact, w) = lists;
    let n = out.kth.len();
    let ids = gpu.alloc::<u32>(n * k)?;
    let dists = gpu.alloc::<f32>(n * k)?;
    let kth = gpu.alloc::<f64>(n)?;
    let last = gpu.alloc::<u64>(n)?;
    let rows = (
        gpu.ptr(&ids),
        gpu.ptr(&dists),
        gpu.ptr(&kth),
        gpu.ptr(&last),
    );
    let lists = (gpu.ptr(comps), gpu.ptr(exact), w);
    launch_finish(gpu, lists, (k, mode), (nb, excl), bad, rows, n)?;
    gpu.download_into(&ids, out.ids)?;
    gpu.download_into(&dists, out.dists)?;
    gpu.download_into(&kth, out.kth)?;
    gpu.download_into(&last, out.last)?;
    Ok(())
}

/// Launches `finish_lists` (see `common.cuh`) on `n` rows: composites and exact keys at
/// `lists` (`n × w` each), the rows' excluded ids at `excl` (or 0), into the device addresses
/// `out` (ids and distances `n × k`, k-th keys and W-th composites `n`).
fn launch_finish(
    gpu: &Gpu,
    (comps, exact, w): (u64, u64, usize),
    (k, mode): (usize, i32),
    (nb, excl): (usize, u64),
    bad: u64,
    (ids, dists, kth, last): (u64, u64, u64, u64),
    n: usize,
) -> Result<()> {
    let (p, pk) = (w.next_power_of_two(), k.next_power_of_two());
    let f = gpu.func("finish_lists")?;
    let (ww, pp, kk, ppk, nb64) = (w as i32, p as i32, k as i32, pk as i32, nb as i64);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&comps)
        .arg(&exact)
        .arg(&ww)
        .arg(&pp)
        .arg(&kk)
        .arg(&ppk)
        .arg(&mode)
        .arg(&nb64)
        .arg(&excl)
        .arg(&ids)
        .arg(&dists)
        .arg(&kth)
        .arg(&last)
        .arg(&bad);
    // SAFETY: comps and exact hold n×w entries, excl n ids (or null), ids and dists n×k, kth
    // and last n, bad one word; the shared memory is the 12·(p + pk) bytes the kernel uses.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: ((p / 2).clamp(32, 512) as u32, 1, 1),
            shared_mem_bytes: (12 * (p + pk)) as u32,
        })
    }
    .map_err(dev_err("finish_lists"))?;
    Ok(())
}

/// The row of `base` (rows of `d` values) at which `part` starts when `part` is a run of whole
/// rows of that very memory (a borrow of it), else `None`.
fn rows_within(base: &[f32], part: &[f32], d: usize) -> Option<usize> {
    let (b0, p0) = (base.as_ptr() as usize, part.as_ptr() as usize);
    let inside = p0 >= b0 && p0 + std::mem::size_of_val(part) <= b0 + std::mem::size_of_val(base);
    (inside && d > 0 && (p0 - b0) % (4 * d) == 0).then(|| (p0 - b0) / (4 * d))
}

/// Wall-clock phases of one [`run`], summed over its query chunks and printed to stderr when
/// `KNN_PROFILE` is set. Each phase ends with a device sync, so profiling slows a call a little.
struct Phases {
    since: Option<std::time::Instant>,
    parts: Vec<(&'static str, f64)>,
}

impl Phases {
    fn new() -> Phases {
        Phases {
            since: std::env::var_os("KNN_PROFILE").map(|_| std::time::Instant::now()),
            parts: Vec::new(),
        }
    }

    fn lap(&mut self, gpu: &Gpu, what: &'static str) {
        if let Some(t) = self.since {
            let _ = gpu.sync();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            match self.parts.iter_mut().find(|p| p.0 == what) {
                Some(p) => p.1 += ms,
                None => self.parts.push((what, ms)),
            }
            self.since = Some(std::time::Instant::now());
        }
    }

    fn print(&self, rows: usize) {
        if self.since.is_some() {
            let parts: Vec<String> = (self.parts.iter())
                .map(|(w, ms)| format!("{w} {ms:.2}"))
                .collect();
            eprintln!("cuda fused ({rows} rows), ms: {}", parts.join(", "));
        }
    }
}

/// `gthr[i]` = the W-th composite of row `i` of the sorted lists at `lists` (`n × w`), plus one
/// (filters keep composites strictly below the threshold, and that entry must stay).
fn prime_thresholds(gpu: &Gpu, lists: u64, n: usize, w: usize, gthr: u64) -> Result<()> {
    let f = gpu.func("prime_thresholds")?;
    let (n64, ww) = (n as i64, w as i32);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&lists).arg(&n64).arg(&ww).arg(&gthr);
    // SAFETY: lists holds n×w composites and gthr n.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n.div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err("prime_thresholds"))?;
    Ok(())
}

/// Exact f64 keys (as the host's `Kernel::exact` of `kernel`, or with `None` Hellinger's
/// `Metric::exact_key`) of the `n × w` candidate composites `comps` for the given (uncentred)
/// queries `q` (address, rows) against the given base `b` (address, rows).
fn exact_keys(
    gpu: &Gpu,
    kernel: Option<Kernel>,
    q: (u64, usize),
    b: (u64, usize),
    comps: u64,
    w: usize,
    d: usize,
) -> Result<CudaSlice<f64>> {
    let n = q.1;
    let out = gpu.alloc::<f64>(n * w)?;
    let kind: Option<i32> = kernel.map(|k| match k {
        Kernel::SqL2 => 0,
        Kernel::NegDot => 1,
        Kernel::L1 => 2,
        Kernel::Linf => 3,
    });
    let name = if kind.is_some() {
        "exact_keys"
    } else {
        "exact_keys_hellinger"
    };
    let f = gpu.func(name)?;
    let (nb64, n64, ww, dd, pc, po) = (
        b.1 as i64,
        n as i64,
        w as i32,
        d as i32,
        comps,
        gpu.ptr(&out),
    );
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&q.0)
        .arg(&b.0)
        .arg(&nb64)
        .arg(&pc)
        .arg(&n64)
        .arg(&ww)
        .arg(&dd);
    if let Some(kind) = &kind {
        l.arg(kind);
    }
    l.arg(&po);
    let cfg = if kind.is_some() {
        // One thread per (row, slot).
        LaunchConfig {
            grid_dim: ((n * w).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        // One block per row (its query's roots shared), one thread per slot.
        LaunchConfig {
            grid_dim: (n as u32, w.div_ceil(128) as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        }
    };
    // SAFETY: q holds n×d floats, b nb×d, comps and out n×w entries.
    unsafe { l.launch(cfg) }.map_err(dev_err(name))?;
    Ok(out)
}

/// Base rows `bs..be` on the device, centred by the device vector at `centre` when it is not 0,
/// with their squared norms.
fn upload_base(
    gpu: &Gpu,
    req: &CandidateRequest<'_>,
    bs: usize,
    be: usize,
    centre: u64,
) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
    let d = req.base.dim();
    let b = gpu.upload(&req.base.as_slice()[bs * d..be * d])?;
    let bn = gpu.alloc::<f32>(be - bs)?;
    gpu.centre_sq_norms(gpu.ptr(&b), be - bs, d, centre, gpu.ptr(&bn))?;
    Ok((b, bn))
}

/// Launches `merge_w{slots}` for `n` rows: the top `w` of `a.1` sorted runs of `w` composites per
/// row at `a.0` and, when `b` is not 0, of one more sorted run per row at `b`; one warp per row.
fn merge_runs(
    gpu: &Gpu,
    n: usize,
    w: usize,
    slots: usize,
    a: (u64, usize),
    b: u64,
) -> Result<Lists> {
    let out = gpu.alloc::<u64>(n * w)?;
    let name = format!("merge_w{slots}");
    let f = gpu.func(&name)?;
    let (runs, n64, ww, po) = (a.1 as i32, n as i64, w as i32, gpu.ptr(&out));
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&a.0).arg(&runs).arg(&b).arg(&n64).arg(&ww).arg(&po);
    // SAFETY: a holds n×runs×w composites, b (or null) n×w, out n×w; every slot of out written.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((n * 32).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .map_err(dev_err(&name))?;
    Ok(Lists { buf: out })
}

/// Launches `select_topk` for `n` rows: union of two composite lists (pointer, per-row count;
/// `bcount`, when not 0, points to per-row counts that cap b's) and optionally a key block
/// (pointer, columns, row stride, first id, exclude pointer).
fn select(
    gpu: &Gpu,
    n: usize,
    w: usize,
    a: (u64, usize),
    b: (u64, usize),
    bcount: u64,
    keys: Option<(u64, usize, usize, u32, u64)>,
) -> Result<Lists> {
    let out = gpu.alloc::<u64>(n * w)?;
    // Poison: an unwritten slot decodes to an invalid id and is caught on the host.
    gpu.fill_u64(gpu.ptr(&out), n * w, SENTINEL)?;
    let p = w.next_power_of_two();
    let smem = p * 8;
    let f = gpu.func("select_topk")?;
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .map_err(dev_err("shared memory limit"))?;
    let (pk, nk, ld, id0, px) = keys.unwrap_or((0, 0, 0, 0, 0));
    let (ma, mb, nk32, ld64, ww, pp) = (
        a.1 as i32, b.1 as i32, nk as i32, ld as i64, w as i32, p as i32,
    );
    let po = gpu.ptr(&out);
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&a.0)
        .arg(&ma)
        .arg(&b.0)
        .arg(&mb)
        .arg(&bcount)
        .arg(&pk)
        .arg(&ld64)
        .arg(&nk32)
        .arg(&id0)
        .arg(&px)
        .arg(&ww)
        .arg(&pp)
        .arg(&po);
    // SAFETY: lists hold n rows of ma / mb composites, keys n rows of stride ld, out n×w.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err("select_topk"))?;
    Ok(Lists { buf: out })
}

/// What the large-width path needs of one query chunk × base chunk (device addresses).
struct Large<'t> {
    tag: &'t str,
    tf: bool,
    n: usize,
    d: usize,
    w: usize,
    cap: usize,
    q: u64,
    qn: u64,
    excl: u64,
    b: u64,
    bn: u64,
    /// Id of the chunk's first base row.
    id0: usize,
}

/// Widest column range of one filter launch (grid y ≤ 65535 tiles).
const FILTER_COLS_MAX: usize = 1 << 22;

/// Large widths (W > 128) over `bl` base rows: a threshold filter over growing column ranges,
/// each followed by one select of (running list ∪ survivors). Survivors of a range are the keys
/// below the running W-th one, about W·len/seen for data in random order, so ranges grow with
/// the columns seen while staying under cap/2 expected survivors. A range whose survivors
/// overflow `cap` in some row is redone with whole key blocks in device memory.
fn large(gpu: &Gpu, c: &Large<'_>, bl: usize, mut running: Option<Lists>) -> Result<Lists> {
    let (n, d, w, cap) = (c.n, c.d, c.w, c.cap);
    let buf = gpu.alloc::<u64>(n * cap)?;
    let mut count = gpu.alloc::<u32>(n)?;
    let name = format!("filter_{}{}", if c.tf { "tf32_" } else { "" }, c.tag);
    let f = gpu.func(&name)?;
    let smem = if c.tf { TILE_SMEM_TF32 } else { TILE_SMEM };
    f.set_attribute(
        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )
    .map_err(dev_err("shared memory limit"))?;
    let mut seen = 0;
    while seen < bl {
        let done = c.id0 + seen;
        let len = match &running {
            None => cap,
            Some(_) => (done * cap / (2 * w)).max(cap),
        };
        let len = (len.min(FILTER_COLS_MAX) / BASE_TILE * BASE_TILE)
            .max(BASE_TILE)
            .min(bl - seen);
        gpu.stream
            .memset_zeros(&mut count)
            .map_err(dev_err("clearing counts"))?;
        let run_ptr = running.as_ref().map_or(0, |r| gpu.ptr(&r.buf));
        let (pb, pbn) = (c.b + (seen * d * 4) as u64, c.bn + (seen * 4) as u64);
        let (nq64, nb64, id0, dd, ww, cc) = (
            n as i64,
            len as i64,
            done as u32,
            d as i32,
            w as i32,
            cap as i32,
        );
        let (pbuf, pcount) = (gpu.ptr(&buf), gpu.ptr(&count));
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&c.q)
            .arg(&c.qn)
            .arg(&nq64)
            .arg(&pb)
            .arg(&pbn)
            .arg(&nb64)
            .arg(&id0)
            .arg(&dd)
            .arg(&c.excl)
            .arg(&run_ptr)
            .arg(&ww)
            .arg(&cc)
            .arg(&pbuf)
            .arg(&pcount);
        // SAFETY: q n×d, qn n, b/bn offset to `seen` inside the chunk with len rows left,
        // exclude n (or null), running n×w (or null), buf n×cap, count n.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (
                    n.div_ceil(QUERY_TILE) as u32,
                    len.div_ceil(BASE_TILE) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: smem as u32,
            })
        }
        .map_err(dev_err(&name))?;
        let a = running.as_ref().map_or((0, 0), |r| (gpu.ptr(&r.buf), w));
        let next = select(gpu, n, w, a, (pbuf, cap), pcount, None)?;
        let counts = gpu.download(&count, n)?;
        let next = if counts.iter().any(|&k| k as usize > cap) {
            key_blocks(gpu, c, seen, len, running)?
        } else {
            next
        };
        running = Some(next);
        seen += len;
    }
    Ok(running.expect("the base chunk is not empty"))
}

/// Columns [seen, seen+len) of the chunk with FP32 key blocks in device memory, each merged into
/// the running list by a full select (the filter's overflow fallback).
fn key_blocks(
    gpu: &Gpu,
    c: &Large<'_>,
    seen: usize,
    len: usize,
    mut running: Option<Lists>,
) -> Result<Lists> {
    let (n, d, w) = (c.n, c.d, c.w);
    let kb = KEY_BLOCK.min(len);
    let keys = gpu.alloc::<f32>(n * kb)?;
    let name = format!("tile_{}", c.tag);
    let f = gpu.func(&name)?;
    for ks in (seen..seen + len).step_by(kb) {
        let ke = (ks + kb).min(seen + len);
        let kl = ke - ks;
        let pb = c.b + (ks * d * 4) as u64;
        let pbn = c.bn + (ks * 4) as u64;
        let pk = gpu.ptr(&keys);
        let (nq64, nb64, dd, ld) = (n as i64, kl as i64, d as i32, kl as i64);
        let mut l = gpu.stream.launch_builder(f);
        l.arg(&c.q)
            .arg(&c.qn)
            .arg(&nq64)
            .arg(&pb)
            .arg(&pbn)
            .arg(&nb64)
            .arg(&dd)
            .arg(&ld)
            .arg(&pk);
        // SAFETY: keys holds n×kb floats ≥ n×kl; b, bn offset inside the chunk.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (
                    n.div_ceil(QUERY_TILE) as u32,
                    kl.div_ceil(BASE_TILE) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }
        .map_err(dev_err(&name))?;
        let next = select(
            gpu,
            n,
            w,
            running.as_ref().map_or((0, 0), |r| (gpu.ptr(&r.buf), w)),
            (0, 0),
            0,
            Some((pk, kl, kl, (c.id0 + ks) as u32, c.excl)),
        )?;
        gpu.sync()?;
        running = Some(next);
    }
    Ok(running.expect("the range is not empty"))
}

#[cfg(test)]
mod tests {
    use super::f16_scale;

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
    use super::{split_count, split_width, CollectPlan};

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

    #[test]
    fn truncated_splits_keep_a_binomial_margin() {
        // 32 wide over 8 splits: 4 expected per split, 16 kept.
        assert_eq!(split_width(32, 8), 16);
        assert_eq!(split_width(128, 5), 49);
        assert_eq!(split_width(128, 10), 32);
        // One split keeps everything; many splits keep a few each.
        assert_eq!(split_width(32, 1), 32);
        assert_eq!(split_width(32, 264), 6);
    }

    #[test]
    fn splits_fill_the_last_wave() {
        // 79 query tiles on 132 single-block SMs: 5 splits → 395 of 396 slots.
        assert_eq!(split_count(79, 132, 7813), 5);
        // 32 query tiles on 264 slots: 8 splits → 256 of 264.
        assert_eq!(split_count(32, 264, 128), 8);
        // Never more splits than base tiles.
        assert_eq!(split_count(1, 264, 3), 3);
        assert_eq!(split_count(1000, 132, 1), 1);
    }
}
