//! Host side of the fused method: tiles of queries and base points under a memory budget,
//! on-chip top-W for W ≤ 128 ([`SMALL_WIDTH_MAX`]), device key tiles + radix select beyond.

mod few;
mod finish;
mod graph;
mod resident;
mod results;
mod select;
mod share;
mod timing;

pub(crate) use finish::{DeviceIo, Finish, Finished, ProofPlan, Proven};
pub(crate) use graph::GraphLists;
pub(crate) use resident::{BaseView, Prefetched, Resident};
pub(crate) use results::{HostLists, Results};
pub use share::GraphShare;

use crate::device::{dev_err, Gpu, ReadyRows};
use crate::tuning::CudaTuning;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use finish::{exact_keys, finish_lists, FinishedChunk, RowFacts};
use graph::{graph_finished, graph_lists, list_slots};
use knn_core::{CandidateRequest, Kernel, KnnError, Result};
use resident::{rows_within, upload_base, upload_rows};
use select::{large, merge_runs, prime_thresholds, Large, Lists, FILTER_CAP};
use timing::Phases;

/// Queries per block tile of the fused kernels (`BQ` in `kernels/tiles.cu`).
pub const QUERY_TILE: usize = 128;
/// Base points per block tile (`BB`).
pub const BASE_TILE: usize = 128;
/// Widest list kept on chip.
pub const SMALL_WIDTH_MAX: usize = 128;
/// Widest list the radix select sorts in shared memory.
pub const SELECT_WIDTH_MAX: usize = 8192;

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
        let (f, per_sm) = gpu.blocks_per_sm(&name, smem)?;
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
    /// point missing from the row is at least min(its W-th composite, this). Empty when the
    /// device proved the rows (`Finished::proof`).
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

/// One query chunk against one base chunk, as device addresses.
pub(super) struct Chunk {
    /// Queries (`n × d`) and their squared norms.
    pub(super) q: u64,
    pub(super) qn: u64,
    pub(super) n: usize,
    /// Base rows and their squared norms.
    pub(super) b: (u64, u64),
    pub(super) rows: usize,
    /// Id of the chunk's first row.
    pub(super) id0: usize,
    pub(super) d: usize,
    /// Per query, a base id to leave out (0: none).
    pub(super) exclude: u64,
    /// List width.
    pub(super) w: usize,
}

/// The on-chip lists of `c` by the fused tile kernels (`tile`: TF32 or not, the kernels' tag,
/// list slots): `(lists, splits)`, `lists[(q · splits + s) · w + i]`, each split's list sorted
/// (truncated splits keep fewer real entries, SENTINEL after); `cut` (n values) gets each row's
/// truncation cut. `prior`: the device lists of earlier base chunks, if any, whose W-th entries
/// prime the shared thresholds.
fn tile_lists(
    gpu: &Gpu,
    tuning: &CudaTuning,
    (tf, tag, slots): (bool, &str, usize),
    c: &Chunk,
    cut: u64,
    prior: Option<u64>,
) -> Result<(CudaSlice<u64>, usize)> {
    let (n, w, bl) = (c.n, c.w, c.rows);
    let tiles = bl.div_ceil(BASE_TILE);
    let qblocks = n.div_ceil(QUERY_TILE);
    let SplitPlan {
        f,
        name,
        smem,
        nsplit,
        ws,
    } = split_plan(gpu, tuning, tf, tag, slots, w, qblocks, tiles, bl)?;
    // Several splits take strided rows (split y: rows y, y + nsplit, ...), so that a run of
    // stored neighbours spreads over them (what truncation relies on).
    let (split_len, strided) = if nsplit > 1 {
        (0, 1)
    } else {
        (tiles.div_ceil(nsplit) * BASE_TILE, 0)
    };
    let nsplit = bl.div_ceil(split_len.max(1)).min(nsplit).max(1);
    // Not filled: every (row, split) writes all its w slots.
    let partial = gpu.alloc::<u64>(n * nsplit * w)?;
    // Shared thresholds: truncated splits only read them, and unprimed (no earlier base chunk)
    // they would all be SENTINEL, so then the kernel gets none.
    let gthr = if ws < w && prior.is_none() {
        None
    } else {
        let g = gpu.alloc::<u64>(n)?;
        gpu.fill_u64(gpu.ptr(&g), n, SENTINEL)?;
        Some(g)
    };
    let thr = gthr.as_ref().map_or(0, |g| gpu.ptr(g));
    // Prime each query's shared threshold with a proven bound on its W-th composite: the W-th
    // of the lists so far (earlier base chunks). (Priming with a prefix of the base lost:
    // NOTES.md, 2026-11-23, "Tried and left off".)
    if let Some(lists) = prior {
        prime_thresholds(gpu, lists, n, w, thr)?;
    }
    let (nq, nb, id0, d, ww) = (n as i64, bl as i64, c.id0 as u32, c.d as i32, w as i32);
    let (ws, sl, out) = (ws as i32, split_len as i64, gpu.ptr(&partial));
    let mut l = gpu.stream.launch_builder(f);
    l.arg(&c.q)
        .arg(&c.qn)
        .arg(&nq)
        .arg(&c.b.0)
        .arg(&c.b.1)
        .arg(&nb)
        .arg(&id0)
        .arg(&d)
        .arg(&c.exclude)
        .arg(&ww)
        .arg(&ws)
        .arg(&sl)
        .arg(&strided)
        .arg(&out)
        .arg(&thr)
        .arg(&cut);
    // SAFETY: buffers sized as the kernel documents: q n×d, qn n, b ≥ rows×d, bn ≥ rows,
    // exclude n (or null), out n×nsplit×w, thr and cut n (or null).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (qblocks as u32, nsplit as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }
    .map_err(dev_err(&name))?;
    Ok((partial, nsplit))
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
    to: Results<'_>,
) -> Result<Output> {
    let (mut finish, lists_made) = match to {
        Results::Lists(l) => (None, l),
        Results::Finished(f) => (Some(f), HostLists::default()),
    };
    let device_io = finish.as_ref().and_then(|f| f.device);
    let (nq, nb, d, w) = (
        device_io.map_or(req.queries.rows(), |io| io.rows),
        req.base.rows(),
        req.base.dim(),
        req.width,
    );
    let small = w <= SMALL_WIDTH_MAX;
    let slots = list_slots(w);
    // Base: resident when it takes at most half the budget, else streamed in chunks.
    let row_bytes = (d + 1) * 4;
    let cached = match (req.base_key, base.cache.as_ref()) {
        (Some(key), Some(r)) => r.serves(key, base.centre, base.exact),
        _ => false,
    };
    if !cached {
        // Free the old copy before a new base takes its place.
        *base.cache = None;
    }
    let mut centre_dev = match base.cache.as_ref() {
        Some(_) => None,
        None => base.centre.map(|c| gpu.upload(c)).transpose()?,
    };
    let centre_ptr = match (base.cache.as_ref(), centre_dev.as_ref()) {
        (Some(r), _) => r.centre_dev.as_ref().map_or(0, |c| gpu.ptr(c)),
        (None, c) => c.map_or(0, |c| gpu.ptr(c)),
    };
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
    // The first try of a graph whose pairs several GPUs share: each uploads a share of the
    // rows and takes the others' from their devices (see `GraphShare::gathered_base`).
    let gathered = match (base.share, req.base_key) {
        (Some(s), Some(key)) if base.graph.is_some() && small && !s.began((key, w)) => {
            Some((s, (key, w)))
        }
        _ => None,
    };
    let mut given_rows = |rows: &[f32]| match gathered {
        Some((s, key)) => {
            // This part's rows, prefetched for a search of the base split among the GPUs.
            let part = Some(knn_core::part_key(key.0, s.part().0));
            s.gathered_base(gpu, key, (rows, d), |own| {
                upload_rows(gpu, base.prefetched, part, own)
            })
        }
        None => upload_rows(gpu, base.prefetched, req.base_key, rows),
    };
    if bc == nb && !cached {
        let r = if let Some(roots) = req.base.centred_roots().filter(|_| derived) {
            // Hellinger's centred roots, derived here from the given rows (uploaded once, and
            // kept for the exact keys) with the host's centre: the same bits as the host's.
            let orig = given_rows(roots.given.as_slice())?;
            let centre = gpu.upload(roots.centre)?;
            let (b, norm_up) = (gpu.alloc::<f32>(nb * d)?, gpu.alloc::<f32>(nb)?);
            let ptrs = (gpu.ptr(&b), gpu.ptr(&norm_up));
            gpu.hellinger_roots(gpu.ptr(&orig), nb, d, gpu.ptr(&centre), ptrs)?;
            let bn = gpu.alloc::<f32>(nb)?;
            gpu.sq_norms(gpu.ptr(&b), nb, d, gpu.ptr(&bn))?;
            Resident {
                key: req.base_key.unwrap_or(0),
                centre: None,
                centre_dev: None,
                b,
                bn,
                orig: Some(orig),
                hellinger: true,
                norm_up: Some(gpu.download(&norm_up, nb)?),
            }
        } else {
            let given = given_rows(req.base.as_slice())?;
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
                centre_dev: centre_dev.take(),
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
    let mut graph = match (base.graph, resident) {
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
                base.share,
            )?
        }
        _ => None,
    };
    // This GPU's part of a graph whose pairs several shared: rows are read from every part
    // (held until the call's copies are done), or computed one-sided when one is missing.
    let parts = match (graph, base.share) {
        (Some((g, _)), Some(s)) if g.shared => {
            let parts = s.lists(g.graph());
            if parts.is_none() {
                graph = None;
            }
            parts.map(|p| (p, s.part().0))
        }
        _ => None,
    };
    // Rows taken from the graph's lists carry its keys' absolute input rounding.
    let input_abs = graph.map_or(0.0, |(g, _)| g.input_abs);
    let given_base = base.exact.zip(held).and_then(|(e, r)| r.given(e));
    // Rows finish here only with exact keys at hand.
    let mut finish = finish.take().filter(|_| given_base.is_some());
    // Finished rows whose query norms the kernels measure (not rows of the resident base,
    // read where it lies) are proven here too: the host then reads one summary, not each
    // row's k-th key, W-th composite, cut and norm.
    let proof = finish.as_ref().and_then(|f| f.proof).filter(|_| {
        device_io.is_some() || resident.is_none() || req.queries.row_offset_in(&req.base).is_none()
    });
    let host_facts = if proof.is_some() { 0 } else { nq };
    let lists = if finish.is_some() { 0 } else { nq * w };
    // Every row is written by a download below.
    let (mut out, mut exact) = lists_made.take(lists, given_base.is_some());
    let mut cut_all = vec![0u64; host_facts];
    let mut finished = finish.as_ref().map(|_| Finished {
        kth: vec![0.0; host_facts],
        last: vec![0; host_facts],
        proof: None,
    });
    // Made when the first rows are finished, behind the first chunk's kernels: the device
    // starts on those meanwhile.
    let mut proven: Option<CudaSlice<u8>> = None;
    let mut bad_flagged = false;
    // Word 0: a bad id in a finished row; 1–3: `prove_rows`' summary.
    let mut summary: Option<CudaSlice<u32>> = None;
    // Finished rows read back to the host, landed by the call's one wait at its end.
    let mut reads = gpu.readback();
    let mut in_flight = Vec::new();
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
        let alias = match device_io {
            Some(_) => None,
            None => resident.and_then(|_| req.queries.slice_rows(qs, qe).row_offset_in(&req.base)),
        };
        // Buffers of this chunk's own, kept until its kernels are done.
        let (mut q_up, mut q_own, mut _qn_own) = (None, None, None);
        let mut given_own: Option<CudaSlice<f32>> = None;
        // The query rows as given (the caller's, or uploaded) when they are not rows of the
        // resident base, readied below in one launch: centred into a copy of their own (the
        // given rows stay for the exact keys), measured, and their cut made empty.
        let mut given_q = None;
        let (q, qn) = match (alias, resident) {
            (Some(at), Some((b, bn))) => (
                gpu.ptr(b) + (at * d * 4) as u64,
                gpu.ptr(bn) + (at * 4) as u64,
            ),
            _ => {
                let from = *given_q.insert(match device_io {
                    Some(io) => io.queries + (qs * d * 4) as u64,
                    None => {
                        gpu.ptr(q_up.insert(gpu.upload(req.queries.slice_rows(qs, qe).as_slice())?))
                    }
                });
                let q = match centre_ptr {
                    0 => from,
                    _ => gpu.ptr(q_own.insert(gpu.alloc::<f32>(n * d)?)),
                };
                (q, gpu.ptr(_qn_own.insert(gpu.alloc::<f32>(n)?)))
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
            (_, Some(gb)) if centre_ptr != 0 => match (alias, given_q) {
                (Some(at), _) => gpu.ptr(gb) + (at * d * 4) as u64,
                (None, from) => from.expect("set above for rows not of the base"),
            },
            _ => q,
        };
        let mut cut = None;
        if let Some(from) = given_q {
            let c = gpu.ptr(cut.insert(gpu.alloc::<u64>(n)?));
            let to = if centre_ptr == 0 { 0 } else { q };
            let ready = ReadyRows {
                from,
                to,
                centre: centre_ptr,
                norms: qn,
                cut: c,
            };
            gpu.ready_rows(n, d, ready)?;
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
                let (ids, dists) = f.host.buffers();
                let rows = FinishedChunk {
                    ids: &mut ids[qs * k..qe * k],
                    dists: &mut dists[qs * k..qe * k],
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
        let mut cut = match cut {
            Some(c) => c,
            None => {
                let c = gpu.alloc::<u64>(n)?;
                gpu.fill_u64(gpu.ptr(&c), n, SENTINEL)?;
                c
            }
        };
        let mut running: Option<Lists> = None;
        let t0 = timing::kernel_event(gpu)?;
        let copied = if let (Some((g, _)), Some(at), Some((parts, own))) = (graph, alias, &parts) {
            // The parts' lists of these rows, merged (see `share::merged_rows`).
            let (rows, least) = share::merged_rows(gpu, parts, *own, (at, n, g.cut.len(), w))?;
            if let Some(s) = base.share {
                s.merged(n);
            }
            running = Some(rows);
            cut = least;
            true
        } else if let (Some((g, _)), Some(at)) = (graph, alias) {
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
                // A few queries read the base once, a warp per row (see `few.rs`).
                let few = Chunk {
                    q,
                    qn,
                    n,
                    b: (gpu.ptr(b), gpu.ptr(bn)),
                    rows: bl,
                    id0: bs,
                    d,
                    exclude: excl_ptr,
                    w,
                };
                let (partial, nsplit) = match few::lists(gpu, tag, slots, &few)? {
                    Some(done) => done,
                    None => {
                        let tile = (tf, tag, slots);
                        let prior = running.as_ref().map(|r| gpu.ptr(&r.buf));
                        tile_lists(gpu, tuning, tile, &few, gpu.ptr(&cut), prior)?
                    }
                };
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
        // Read once the chunk's downloads are done: waiting for it here would leave the device
        // idle while the host queues the launches that follow.
        let t1 = timing::kernel_event(gpu)?;
        let r = running.expect("the base is not empty");
        phases.lap(gpu, "kernels");
        if let (Some(gb), Some(ex)) = (given_base, exact.as_mut()) {
            let (gb, rb) = (gpu.ptr(gb), gpu.ptr(&r.buf));
            let keys = exact_keys(gpu, exact_kind, (q_given, n), (gb, nb), rb, w, d)?;
            phases.lap(gpu, "exact keys");
            if let (Some(f), Some(done)) = (finish.as_mut(), finished.as_mut()) {
                if summary.is_none() {
                    let words = gpu.stream.alloc_zeros::<u32>(4);
                    summary = Some(words.map_err(dev_err("allocating device memory"))?);
                }
                if proof.is_some() && proven.is_none() {
                    proven = Some(gpu.alloc::<u8>(nq)?);
                }
                let summary = summary.as_ref().expect("made above");
                let (k, mode) = (f.k, f.mode);
                let lists = (&r.buf, &keys, w);
                let on_device = f.device.map(|io| {
                    let at = (qs * k) as u64;
                    let id_bytes = if io.ids_i64 { 8 } else { 4 };
                    (io.ids + at * id_bytes, io.ids_i64, io.dists + at * 4)
                });
                let flags = (nb, excl_ptr);
                let facts = match (proof, &proven) {
                    (Some(plan), Some(p)) => RowFacts::Device {
                        plan,
                        cut: gpu.ptr(&cut),
                        qsq: qn,
                        proven: gpu.ptr(p) + qs as u64,
                        summary: gpu.ptr(summary),
                    },
                    _ => RowFacts::Host(&mut done.kth[qs..qe], &mut done.last[qs..qe]),
                };
                in_flight.extend(finish_lists(
                    gpu,
                    lists,
                    (k, mode),
                    flags,
                    gpu.ptr(summary),
                    (&mut *f.host, qs * k..qe * k),
                    facts,
                    on_device,
                    &mut reads,
                    n,
                )?);
                bad_flagged = true;
            } else {
                gpu.download_into(&keys, &mut ex[qs * w..qe * w])?;
            }
        }
        phases.lap(gpu, "finished or keys down");
        if finished.is_none() {
            gpu.download_into(&r.buf, &mut out[qs * w..qe * w])?;
        }
        if proof.is_none() {
            gpu.download_into(&cut, &mut cut_all[qs..qe])?;
        }
        phases.lap(gpu, "downloads");
        kernel_ms = match (&t0, &t1) {
            (Some(t0), Some(t1)) => {
                t1.synchronize().map_err(dev_err("event"))?;
                kernel_ms.zip(t0.elapsed_ms(t1).ok()).map(|(a, b)| a + b)
            }
            _ => None,
        };
    }
    phases.print(nq);
    // The output, asked for before the wait: its pages are made while the device works.
    let output = match finish.as_mut() {
        Some(f) if !in_flight.is_empty() => Some(f.host.buffers()),
        _ => None,
    };
    // The summary's words, behind the finished rows: one wait lands them all. (Only
    // `finish_lists` flags a bad id: rows from a finished graph were checked by their own
    // download, and waiting here would wait for the graph's later launches too.) No summary:
    // no rows were finished, none flagged.
    let read_words = bad_flagged || proof.is_some();
    let mut words = [0u32; 4];
    let queued = match &summary {
        // SAFETY: the summary holds 4 words, alive until the wait below.
        Some(s) if read_words => Some(unsafe { reads.queue::<u32>(gpu.ptr(s), 4)? }.ok_or(s)),
        _ => None,
    };
    reads.wait()?;
    match queued {
        Some(Ok(q)) => reads.take(q, &mut words),
        // No room left in the readback: read on its own.
        Some(Err(s)) => gpu.download_into(s, &mut words)?,
        None => {}
    }
    if let Some((ids, dists)) = output {
        for rows in in_flight {
            rows.land(&reads, (&mut *ids, &mut *dists));
        }
    }
    drop(reads);
    if read_words {
        if words[0] != 0 {
            return Err(KnnError::Device(
                "a candidate list holds an unwritten slot or an excluded id".into(),
            ));
        }
        if let (Some(done), Some(_)) = (finished.as_mut(), proof) {
            // Every row proven (the usual case): no verdicts to read.
            let rows = match &proven {
                Some(p) if words[1] != 0 => {
                    gpu.download(p, nq)?.into_iter().map(|b| b != 0).collect()
                }
                _ => vec![true; nq],
            };
            let query_top = if words[3] != 0 {
                f32::NAN
            } else {
                f32::from_bits(words[2])
            };
            done.proof = Some(Proven { rows, query_top });
        }
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

#[cfg(test)]
mod tests {
    use super::{split_count, split_width};
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
