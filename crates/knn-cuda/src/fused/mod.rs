//! Host side of the fused method: tiles of queries and base points under a memory budget,
//! on-chip top-W for W ≤ 128 ([`SMALL_WIDTH_MAX`]), device key tiles + radix select beyond.

mod few;
mod finish;
mod graph;
mod plan;
mod queries;
mod resident;
mod results;
mod search;
mod select;
mod share;
mod timing;

pub(crate) use finish::{DeviceIo, Finish, Finished, ProofPlan, Proven};
pub(crate) use graph::GraphLists;
pub(crate) use resident::{BaseView, Prefetched, Resident};
pub(crate) use results::{HostLists, Results};
pub use share::GraphShare;

use crate::device::{dev_err, Gpu, HostVec};
use crate::tuning::CudaTuning;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use graph::{graph_finished, graph_lists};
use knn_core::{CandidateRequest, Kernel, KnnError, Result};
use plan::CallPlan;
use queries::{ready_queries, QueryChunk, QuerySource};
use resident::make_resident;
use results::CallRows;
use search::{graph_rows, search_base, BaseSearch, ChunkView};
use select::{prime_thresholds, Lists};
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
    pub composites: HostVec<u64>,
    /// Per row, the smallest entry a truncated split left out (SENTINEL: none): every base
    /// point missing from the row is at least min(its W-th composite, this). Empty when the
    /// device proved the rows (`Finished::proof`).
    pub cut: Vec<u64>,
    pub exact: Option<HostVec<f64>>,
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
///
/// Its steps: the call's plan ([`CallPlan`]), the base made resident when it stays whole
/// (`make_resident`), a whole graph's lists when the call is a first try of one, then per
/// query chunk: its rows readied (`ready_queries`), its lists taken from the graph's or
/// searched over the base (`search_base`) and taken to the host or finished
/// (`CallRows::take_chunk`); last, the rows landed with one wait (`CallRows::land`).
pub(crate) fn run(
    gpu: &Gpu,
    req: &CandidateRequest<'_>,
    budget: usize,
    mut base: BaseView<'_>,
    tag: &str,
    tuning: &CudaTuning,
    to: Results<'_>,
) -> Result<Output> {
    let (mut finish, lists_made) = match to {
        Results::Lists(l) => (None, l),
        Results::Finished(f) => (Some(f), HostLists::default()),
    };
    let device_io = finish.as_ref().and_then(|f| f.device);
    let device_queries = device_io.and_then(|io| io.queries);
    // Base: resident when it is kept from an earlier call or takes at most half the budget
    // (see `CallPlan`), else streamed in chunks.
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
    let plan = CallPlan::new(
        gpu,
        req,
        device_queries,
        budget,
        (centred, base.exact),
        cached,
    );
    let CallPlan {
        nq,
        nb,
        d,
        w,
        small,
        bc,
        rest,
        qc,
        ..
    } = plan;

    let mut phases = Phases::new();
    let mut own = None;
    let centre = (centre_ptr, &mut centre_dev);
    if let Some(r) = make_resident(gpu, req, &mut base, &plan, cached, centre)? {
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
    let mut graph = match (base.graph, held) {
        (Some(slot), Some(r))
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
                r,
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
    let finish = finish.take().filter(|_| given_base.is_some());
    // Finished rows are proven here too, with the absolute input rounding of the graph's
    // keys, when their query norms are the kernels' (not rows of the resident base, read where
    // it lies) or the rows go to device memory (rows of the resident base then read the
    // base's norms): the host then reads one summary, not each row's k-th key, W-th
    // composite, cut and norm.
    let proof = finish.as_ref().and_then(|f| f.proof).filter(|_| {
        device_io.is_some() || resident.is_none() || req.queries.row_offset_in(&req.base).is_none()
    });
    let proof = proof.map(|p| ProofPlan {
        eta: input_abs,
        ..p
    });
    let exact = given_base.is_some();
    let mut call_rows = CallRows::new(gpu, finish, proof, lists_made, exact, (nq, w));
    let mut kernel_ms = Some(graph.map_or(0.0, |g| g.1));
    // Which exact keys the given rows give: Hellinger's, or the kernel's.
    let exact_kind = match base.exact {
        Some(Exact::Hellinger { .. }) => None,
        _ => Some(req.kernel),
    };
    phases.lap(gpu, "base up");
    // A graph's call for no rows (`Engine::begin_graph`): every row (this GPU's share of a
    // shared graph's) is finished now, queued on the device for the calls to come (which take
    // them to the host).
    if let (0, Some((g, _)), Some(f), Some(gb)) = (nq, graph, call_rows.finish.as_ref(), given_base)
    {
        let given = (exact_kind, gpu.ptr(gb), d);
        let parts = parts.as_ref().map(|(p, own)| (&p[..], *own));
        let made = graph_finished(gpu, g, (f.k, f.mode), given, rest, None, parts)?;
        if let (Some(_), Some((p, own)), Some(s)) = (made, parts, base.share) {
            s.merged(GraphShare::row_share_of(own, p.len(), g.cut.len()).len());
        }
    }
    let src = QuerySource {
        device_queries,
        resident,
        exact: base.exact,
        given_base,
        centre: centre_ptr,
        d,
    };
    let search = BaseSearch {
        req,
        tuning,
        tag,
        plan,
        resident,
        centre: centre_ptr,
    };
    for qs in (0..nq).step_by(qc) {
        let qe = (qs + qc).min(nq);
        let n = qe - qs;
        let QueryChunk {
            held: _held,
            alias,
            q,
            qn,
            q_given,
            cut,
        } = ready_queries(gpu, req, &src, (qs, qe))?;

        phases.lap(gpu, "queries up");
        // Rows of a graph whose lists are made: every row is finished at once, by the first
        // call, and each call downloads its own.
        if let (Some((g, _)), Some(at), Some(gb)) = (graph, alias, given_base) {
            let given = (exact_kind, gb, d);
            if call_rows.download_graph_rows(gpu, (g, at), given, qn, rest, (qs, qe))? {
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
        let copied = match (graph, alias) {
            (Some((g, _)), Some(at)) => {
                let into = (&mut running, &mut cut);
                graph_rows(gpu, (g, at), parts.as_ref(), base.share, (n, w), into)?;
                true
            }
            _ => false,
        };
        let chunks = if copied { 0 } else { nb };
        let view = ChunkView {
            qs,
            qe,
            q,
            qn,
            q_given,
            excl: excl_ptr,
            cut: &cut,
        };
        search_base(gpu, &search, &view, chunks, &mut running)?;
        // Read once the chunk's downloads are done: waiting for it here would leave the device
        // idle while the host queues the launches that follow.
        let t1 = timing::kernel_event(gpu)?;
        let r = running.expect("the base is not empty");
        phases.lap(gpu, "kernels");
        call_rows.take_chunk(gpu, (exact_kind, given_base), &plan, &view, &r, &mut phases)?;
        kernel_ms = match (&t0, &t1) {
            (Some(t0), Some(t1)) => {
                t1.synchronize().map_err(dev_err("event"))?;
                kernel_ms.zip(t0.elapsed_ms(t1).ok()).map(|(a, b)| a + b)
            }
            _ => None,
        };
    }
    phases.print(nq);
    call_rows.land(gpu, kernel_ms, input_abs)
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
