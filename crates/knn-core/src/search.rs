//! The shared search pipeline: validate, prepare, ask an engine for candidates, re-rank them
//! exactly in f64, and widen the rows whose engine floor does not prove them complete.

use crate::engine::{
    CandidateRequest, CandidateRows, Candidates, Engine, ExactFrom, FinishedRows, RowSink,
};
use crate::error::{KnnError, Result};
use crate::matrix::{Matrix, MatrixRef};
use crate::metric::Metric;
use crate::neighbors::Neighbors;
use crate::prepare::{prepare, Data, EngineRows, Prepared, PreparedBase};
use crate::validate::{check_domains, validate};
use rayon::prelude::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// Queries handled per round of the pipeline, so that candidate lists stay a small fraction of
/// memory next to the output.
const CANDIDATE_BYTES_PER_ROUND: usize = 64 << 20;

/// Past this width a failing row is finished by a direct exact scan instead of a wider engine call.
fn max_engine_width(available: usize) -> usize {
    (available / 4).max(4096).min(available)
}

/// Called with (queries done, queries in all) as work completes.
pub type ProgressFn<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// Exact k nearest base points of every query under `metric`, computed by `engine`.
pub fn search(
    engine: &dyn Engine,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
) -> Result<Neighbors> {
    search_with_progress(engine, base, queries, k, metric, &|_, _| {})
}

/// [`search`], reporting progress.
pub fn search_with_progress(
    engine: &dyn Engine,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    run(
        engine,
        Base::given(base),
        Some(queries),
        k,
        metric,
        0..queries.rows(),
        progress,
    )
}

/// Exact kNN graph: the k nearest other points of every point (its own id excluded; duplicates
/// of it are still neighbours, at distance 0).
pub fn graph(
    engine: &dyn Engine,
    points: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
) -> Result<Neighbors> {
    graph_with_progress(engine, points, k, metric, &|_, _| {})
}

/// [`graph`], reporting progress.
pub fn graph_with_progress(
    engine: &dyn Engine,
    points: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let rows = 0..points.rows();
    run(engine, Base::given(points), None, k, metric, rows, progress)
}

/// Rows `rows` of the kNN graph of `points` (a `rows.len() × k` result, row `i` for point
/// `rows.start + i`): the same rows [`graph`] computes, so a graph can be computed, saved and
/// resumed in pieces.
pub fn graph_rows(
    engine: &dyn Engine,
    points: MatrixRef<'_>,
    rows: std::ops::Range<usize>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    check_graph_rows(&rows, points.rows())?;
    run(engine, Base::given(points), None, k, metric, rows, progress)
}

/// [`search_with_progress`] against a base prepared once ([`PreparedBase::new`] of `base`
/// under `metric`; `base` holds the very rows it was made from, unchanged): the same answer,
/// without preparing the base again, and with the engine's copy of it (a device copy) kept
/// from one call to the next.
pub fn search_prepared(
    engine: &dyn Engine,
    prepared: &PreparedBase,
    base: MatrixRef<'_>,
    queries: MatrixRef<'_>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let rows = 0..queries.rows();
    let base = Base::prepared(base, prepared);
    run(engine, base, Some(queries), k, metric, rows, progress)
}

/// [`graph_rows`] of a base prepared once (see [`search_prepared`]).
pub fn graph_prepared(
    engine: &dyn Engine,
    prepared: &PreparedBase,
    points: MatrixRef<'_>,
    rows: std::ops::Range<usize>,
    k: usize,
    metric: &Metric,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    check_graph_rows(&rows, points.rows())?;
    let base = Base::prepared(points, prepared);
    run(engine, base, None, k, metric, rows, progress)
}

/// Rows of a graph of `n` points.
fn check_graph_rows(rows: &std::ops::Range<usize>, n: usize) -> Result<()> {
    if rows.start > rows.end || rows.end > n {
        return Err(KnnError::Option(format!(
            "graph rows {}..{} outside the {n} points",
            rows.start, rows.end,
        )));
    }
    Ok(())
}

/// Queries per round when reporting progress: small enough for a smooth bar, large enough to
/// keep every engine's tiles full.
const MIN_ROUND: usize = 4096;

/// One row's candidates as the engine returned them.
struct RowCandidates<'c> {
    ids: &'c [u32],
    keys: &'c [f32],
    floor: f32,
    /// The engine's exact keys of `ids`, when it gave them (see
    /// [`Engine::candidates_with_exact`]).
    exact: Option<&'c [f64]>,
}

/// Per-thread buffers of the re-rank, so that no row allocates.
#[derive(Default)]
struct RowScratch {
    pairs: Vec<(f64, u32)>,
    ids: Vec<u32>,
    dists: Vec<f32>,
}

thread_local! {
    static ROW_SCRATCH: RefCell<RowScratch> = RefCell::default();
}

// Atomics of 32 bits are laid out as their integers (same size and bit validity) on every
// target this builds for; the views below rely on the alignment being the same too.
const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<u32>());
const _: () = assert!(std::mem::align_of::<AtomicU32>() == std::mem::align_of::<f32>());

/// `v` as atomics, so that the rows the engine hands over on its threads are written in place
/// (relaxed stores: plain stores on common hardware).
fn as_atomic(v: &mut [u32]) -> &[AtomicU32] {
    // SAFETY: `AtomicU32` has the size and bit validity of `u32` and (asserted above) its
    // alignment; the exclusive borrow of `v` means nothing else reads or writes it meanwhile.
    unsafe { &*(v as *mut [u32] as *const [AtomicU32]) }
}

/// `v` as atomics holding the bits of each `f32` (see [`as_atomic`]).
fn as_atomic_f32(v: &mut [f32]) -> &[AtomicU32] {
    // SAFETY: as in `as_atomic`; `f32` has the size and alignment of `u32`, every bit pattern
    // is a valid `f32`, and the stores write `f32::to_bits` values.
    unsafe { &*(v as *mut [f32] as *const [AtomicU32]) }
}

thread_local! {
    /// A query's Hellinger roots (see [`BaseAux`]), reused from row to row.
    static QUERY_ROOTS: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// Rows a round needs before its failures switch later rounds to precise first tries.
const MIN_LOOSE_ROWS: usize = 64;

/// Largest base (values) whose Hellinger roots are kept as f64 for the run: 2²⁷ values, 1 GiB.
const ROOTS_MAX_VALUES: usize = 1 << 27;

/// Values of the base taken once per run that make a metric's exact keys cheaper, with the
/// same result bit for bit (`Metric::exact_key` computes them per pair).
enum BaseAux {
    /// Hellinger: `(v as f64).sqrt()` of every base value, row-major.
    HellingerRoots(Vec<f64>),
    /// Cosine: `Σ v²` (f64, left to right) of every base row.
    CosineNorms(Vec<f64>),
}

impl BaseAux {
    /// Made on the first row that needs it, inside a rayon task: its work goes to threads of
    /// its own, because a rayon join in there could take up another row's task on this thread,
    /// which would wait for this very initialisation (a deadlock seen with 16 threads).
    fn new(metric: &Metric, xb: MatrixRef<'_>) -> Option<BaseAux> {
        match metric {
            Metric::Hellinger if xb.as_slice().len() <= ROOTS_MAX_VALUES => {
                let mut roots = vec![0.0f64; xb.as_slice().len()];
                own_threads(&mut roots, xb.as_slice(), 1, |o, v| {
                    o[0] = (v[0] as f64).sqrt()
                });
                Some(BaseAux::HellingerRoots(roots))
            }
            Metric::Cosine => {
                let mut norms = vec![0.0f64; xb.rows()];
                own_threads(&mut norms, xb.as_slice(), xb.dim(), |o, row| {
                    o[0] = sum_sq(row)
                });
                Some(BaseAux::CosineNorms(norms))
            }
            _ => None,
        }
    }
}

/// `f(out[i..i+1], src[i·per..(i+1)·per])` for every `i`, on scoped threads of its own (one
/// per core), not on the rayon pool.
fn own_threads(out: &mut [f64], src: &[f32], per: usize, f: impl Fn(&mut [f64], &[f32]) + Sync) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let part = out.len().div_ceil(threads).max(1024);
    std::thread::scope(|sc| {
        for (o, s) in out.chunks_mut(part).zip(src.chunks(part * per)) {
            let f = &f;
            sc.spawn(move || {
                for (o, s) in o.chunks_mut(1).zip(s.chunks(per)) {
                    f(o, s)
                }
            });
        }
    });
}

/// `Σ v²` in f64, left to right: the `xx` / `yy` of `Metric::exact_key`'s cosine.
fn sum_sq(x: &[f32]) -> f64 {
    x.iter().fold(0.0f64, |s, &v| s + (v as f64) * (v as f64))
}

/// The cosine exact key of query `q` (with `qq = Σ q²`) against every candidate, appended to
/// `out` as (key, id): `Metric::exact_key`'s value bit for bit (identical rows −1; else
/// −Σqb / (√qq·√bb), at least −1, with the sums left to right), eight candidates' dot products
/// interleaved.
fn cosine_keys(
    q: &[f32],
    qq: f64,
    xb: MatrixRef<'_>,
    norms: &[f64],
    ids: &[u32],
    out: &mut Vec<(f64, u32)>,
) {
    let key = |xy: f64, b: u32| {
        let row = xb.row(b as usize);
        if q == row {
            -1.0
        } else {
            (-xy / (qq.sqrt() * norms[b as usize].sqrt())).max(-1.0)
        }
    };
    let mut chunks = ids.chunks_exact(8);
    for c in &mut chunks {
        let rows: [&[f32]; 8] = std::array::from_fn(|l| xb.row(c[l] as usize));
        let mut acc = [0.0f64; 8];
        for (j, &a) in q.iter().enumerate() {
            for l in 0..8 {
                acc[l] += (a as f64) * (rows[l][j] as f64);
            }
        }
        out.extend(c.iter().zip(acc).map(|(&b, xy)| (key(xy, b), b)));
    }
    for &b in chunks.remainder() {
        let xy = q
            .iter()
            .zip(xb.row(b as usize))
            .fold(0.0f64, |s, (&a, &v)| s + (a as f64) * (v as f64));
        out.push((key(xy, b), b));
    }
}

/// The Hellinger exact key of query roots `rq` against every candidate (base roots rows of
/// `rb`, `d` each), appended to `out` as (key, id): `Metric::exact_key`'s value bit for bit
/// (the same square roots, differences, squares and left-to-right sum), with eight candidates'
/// sums interleaved so that the f64 additions do not wait on each other.
fn hellinger_keys(rq: &[f64], rb: &[f64], d: usize, ids: &[u32], out: &mut Vec<(f64, u32)>) {
    let mut chunks = ids.chunks_exact(8);
    for c in &mut chunks {
        let rows: [&[f64]; 8] = std::array::from_fn(|l| {
            let b = c[l] as usize;
            &rb[b * d..(b + 1) * d]
        });
        let mut acc = [0.0f64; 8];
        for (j, &q) in rq.iter().enumerate() {
            for l in 0..8 {
                let t = q - rows[l][j];
                acc[l] += t * t;
            }
        }
        out.extend(acc.into_iter().zip(c.iter().copied()));
    }
    for &b in chunks.remainder() {
        let row = &rb[b as usize * d..(b as usize + 1) * d];
        let key = rq.iter().zip(row).fold(0.0f64, |a, (&q, &r)| {
            let t = q - r;
            a + t * t
        });
        out.push((key, b));
    }
}

/// What stays fixed across the rows of one pipeline run.
struct Rerank<'m, 'x> {
    metric: &'m Metric,
    xb: MatrixRef<'x>,
    /// Per-base values that make the exact keys cheaper (see [`BaseAux`]), taken on the first
    /// row that needs them: none when the engine gives every exact key.
    aux: &'x OnceLock<Option<BaseAux>>,
    /// Whether this call's rows are many enough to pay for `aux` (a pass over the whole base)
    /// when it is not made yet: the few rows a first try left unproven are re-ranked pair by
    /// pair instead (making Hellinger's roots of 80 000 × 256 values for two such rows, and
    /// freeing them, took ~30 ms of a 75 ms GPU graph).
    aux_pays: bool,
    /// The queries are the base rows (a graph): a query's values are its base row's.
    self_join: bool,
    /// Queries of the exact space (read only when the engine gives no exact keys).
    xq: MatrixRef<'x>,
    k: usize,
    key_scale: f64,
    /// `true` when the candidate lists hold every available point.
    complete: bool,
}

impl Rerank<'_, '_> {
    fn aux(&self) -> Option<&BaseAux> {
        if self.aux_pays {
            self.aux.get_or_init(|| BaseAux::new(self.metric, self.xb))
        } else {
            self.aux.get()?
        }
        .as_ref()
    }

    /// Re-ranks the row of query `qi` exactly into `ids_out` / `dists_out` (`k` each) and returns `true`
    /// when its floor proves it complete; `false` leaves the outputs unspecified (the row is
    /// asked again). `scratch` is reused across rows, so no row allocates.
    fn row(
        &self,
        qi: usize,
        c: &RowCandidates<'_>,
        scratch: &mut Vec<(f64, u32)>,
        ids_out: &mut [u32],
        dists_out: &mut [f32],
    ) -> bool {
        let (k, width) = (self.k, c.ids.len());
        scratch.clear();
        if let Some(exact) = c.exact {
            scratch.extend(exact.iter().copied().zip(c.ids.iter().copied()));
        } else if let Metric::Expr(e) = self.metric {
            // Expression keys are chains of dependent f64 operations: every candidate at once,
            // several chains interleaved, beats stopping early one key at a time.
            e.keys(self.xq.row(qi), self.xb, c.ids, scratch);
        } else if let Some(BaseAux::HellingerRoots(roots)) = self.aux() {
            let d = self.xb.dim();
            QUERY_ROOTS.with_borrow_mut(|own| {
                let rq = if self.self_join {
                    &roots[qi * d..(qi + 1) * d]
                } else {
                    own.clear();
                    own.extend(self.xq.row(qi).iter().map(|&v| (v as f64).sqrt()));
                    &own[..]
                };
                hellinger_keys(rq, roots, d, c.ids, scratch);
            });
        } else if let Some(BaseAux::CosineNorms(norms)) = self.aux() {
            let q = self.xq.row(qi);
            let qq = if self.self_join { norms[qi] } else { sum_sq(q) };
            cosine_keys(q, qq, self.xb, norms, c.ids, scratch);
        } else {
            let q = self.xq.row(qi);
            // The engine's rounding bound, recovered from its floor; candidates whose key less
            // that bound exceeds an exact k-th key cannot enter the top k.
            let floor = c.floor as f64;
            let slack = if floor.is_finite() {
                c.keys[width - 1] as f64 - floor
            } else {
                f64::INFINITY
            };
            let mut kth_bound = f64::INFINITY;
            for (&b, &key) in c.ids.iter().zip(c.keys) {
                if scratch.len() >= k && key as f64 - slack > kth_bound {
                    break;
                }
                scratch.push((self.metric.exact_key(q, self.xb.row(b as usize)), b));
                if scratch.len() == k {
                    kth_bound = scratch
                        .iter()
                        .map(|e| e.0)
                        .fold(f64::NEG_INFINITY, f64::max)
                        * self.key_scale;
                }
            }
        }
        let by_key = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
        if k < scratch.len() {
            scratch.select_nth_unstable_by(k - 1, by_key);
            scratch.truncate(k);
        }
        scratch.sort_unstable_by(by_key);
        let kth = scratch[k - 1].0;
        if !(kth * self.key_scale < c.floor as f64 || self.complete) {
            return false;
        }
        finish_row(self.metric, scratch, ids_out, dists_out);
        true
    }
}

/// Where the pipeline takes the rows of one engine call (see [`RowSink`]): each row re-ranked
/// as it comes and written in place when proven, the others collected to be asked again.
struct Collector<'a> {
    rerank: &'a Rerank<'a, 'a>,
    /// Request row `j` is query `start + j`, or `pending[j]` when the queries were gathered.
    start: usize,
    pending: Option<&'a [u32]>,
    /// Rows in the request.
    requested: usize,
    /// Output row `i` is query `first + i`.
    first: usize,
    width: usize,
    out_ids: &'a [AtomicU32],
    out_dists: &'a [AtomicU32],
    /// Request rows whose floor did not prove them.
    failed: Mutex<Vec<u32>>,
    handed: AtomicUsize,
    malformed: AtomicBool,
}

impl Collector<'_> {
    /// Query of request row `j`.
    fn query_of(&self, j: usize) -> usize {
        self.pending.map_or(self.start + j, |p| p[j] as usize)
    }
    /// Where the output row of request row `j` starts.
    fn out_at(&self, j: usize) -> usize {
        (self.query_of(j) - self.first) * self.rerank.k
    }
}

impl RowSink for Collector<'_> {
    /// The rows land at scattered places of the output: reads of their first and last values
    /// bring those lines (and their pages' translations) into cache while the engine computes
    /// the rows, so the writes later hit. Plain reads, not prefetch instructions: a prefetch
    /// that misses the TLB may be dropped, and these lines are spread over far more pages than
    /// the TLB holds (measured on the grid at k = 1: writing a row cost 3x less after reads
    /// than after prefetches).
    fn upcoming(&self, rows: &[u32]) {
        let (k, mut acc) = (self.rerank.k, 0u32);
        for &j in rows {
            if (j as usize) < self.requested {
                let at = self.out_at(j as usize);
                acc ^= self.out_ids[at].load(Relaxed) ^ self.out_ids[at + k - 1].load(Relaxed);
                acc ^= self.out_dists[at].load(Relaxed) ^ self.out_dists[at + k - 1].load(Relaxed);
            }
        }
        std::hint::black_box(acc);
    }

    fn take(&self, b: CandidateRows<'_>) {
        let width = self.width;
        if !b.is_consistent()
            || b.width != width
            || b.rows.iter().any(|&j| j as usize >= self.requested)
        {
            self.malformed.store(true, Relaxed);
            return;
        }
        let mut lost = Vec::new();
        ROW_SCRATCH.with_borrow_mut(|s| {
            let RowScratch { pairs, ids, dists } = s;
            ids.resize(self.rerank.k, 0);
            dists.resize(self.rerank.k, 0.0);
            for (i, &j) in b.rows.iter().enumerate() {
                let c = RowCandidates {
                    ids: &b.ids[i * width..(i + 1) * width],
                    keys: &b.keys[i * width..(i + 1) * width],
                    floor: b.floor[i],
                    exact: b.exact.map(|e| &e[i * width..(i + 1) * width]),
                };
                if self
                    .rerank
                    .row(self.query_of(j as usize), &c, pairs, ids, dists)
                {
                    let at = self.out_at(j as usize);
                    for (t, (&id, &dist)) in ids.iter().zip(dists.iter()).enumerate() {
                        self.out_ids[at + t].store(id, Relaxed);
                        self.out_dists[at + t].store(dist.to_bits(), Relaxed);
                    }
                } else {
                    lost.push(j);
                }
            }
        });
        if !lost.is_empty() {
            self.failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(lost);
        }
        self.handed.fetch_add(b.rows.len(), Relaxed);
    }
}

/// Candidate lists already computed, handed to `sink` in batches of consecutive rows.
fn hand_over(cand: &Candidates, exact: Option<&[f64]>, sink: &dyn RowSink) {
    const BATCH: usize = 256;
    let (n, w) = (cand.floor.len(), cand.width);
    let rows: Vec<u32> = (0..n as u32).collect();
    rows.par_chunks(BATCH).enumerate().for_each(|(i, r)| {
        let (a, b) = (i * BATCH, i * BATCH + r.len());
        sink.take(CandidateRows {
            rows: r,
            width: w,
            ids: &cand.ids[a * w..b * w],
            keys: &cand.keys[a * w..b * w],
            floor: &cand.floor[a..b],
            exact: exact.map(|e| &e[a * w..b * w]),
        })
    });
}

/// What every round of one pipeline run shares.
struct Run<'a> {
    metric: &'a Metric,
    eb: MatrixRef<'a>,
    eq: MatrixRef<'a>,
    xb: MatrixRef<'a>,
    xq: MatrixRef<'a>,
    key_scale: f64,
    /// The engine computes on the exact space itself: it may hand over exact keys.
    same_space: bool,
    self_join: bool,
    k: usize,
    available: usize,
    width0: usize,
    /// See [`CandidateRequest::base_key`].
    base_key: u64,
    /// See [`CandidateRequest::exact_data`].
    exact_data: bool,
    /// An expression metric's plan (keys from its program, see [`Engine::candidates_expr`]).
    expr: Option<&'a crate::expr::ExprPlan>,
    /// First-try candidates of every row of a whole graph, computed at once with each
    /// unordered pair once (see [`Engine::graph_candidates`]).
    symmetric: Option<crate::engine::Candidates>,
    /// Per-base values for the exact keys, taken once for the run where needed (see
    /// [`BaseAux`]).
    aux: OnceLock<Option<BaseAux>>,
    /// Set when most rows of a round failed their first try's floor: the engine's fast
    /// first-try bound (bf16, TF32) is too wide for this data (cosine keys crowd within it),
    /// so later rounds ask for precise keys at once instead of paying for both. (Rows that fail
    /// on ties wider than the list set it too, and then pay the precise pass for nothing; telling
    /// the two apart would need the gap between the k-th and W-th keys against the bound.)
    loose: AtomicBool,
    profile: bool,
}

impl Run<'_> {
    fn lap(&self, what: &str, since: &mut std::time::Instant) {
        if self.profile {
            eprintln!(
                "pipeline: {what}: {:.2} ms",
                since.elapsed().as_secs_f64() * 1e3
            );
            *since = std::time::Instant::now();
        }
    }

    /// The request for the rows `qv` (query ids `pending`), `width` wide: a first try when
    /// `first` gives its rows' range (contiguous, not yet tried), precise otherwise or when
    /// `loose`.
    fn request<'r>(
        &'r self,
        qv: MatrixRef<'r>,
        pending: &'r [u32],
        width: usize,
        first: Option<std::ops::Range<usize>>,
        loose: bool,
    ) -> CandidateRequest<'r> {
        CandidateRequest {
            base: self.eb,
            queries: qv,
            kernel: self.metric.kernel(),
            width,
            exclude: self.self_join.then_some(pending),
            precise: first.is_none() || loose,
            base_key: Some(self.base_key),
            exact_data: self.exact_data,
            // First tries of Hellinger: an engine may take the exact keys of the given rows.
            exact_from: first
                .filter(|_| matches!(self.metric, Metric::Hellinger))
                .map(|r| ExactFrom::Hellinger {
                    base: self.xb,
                    queries: self.xq.slice_rows(r.start, r.end),
                }),
        }
    }

    /// Whether a first try not answered from host-side graph candidates asks the engine to
    /// finish its rows ([`Engine::finish_rows`]) rather than for candidates.
    fn engine_may_finish(&self) -> bool {
        self.expr.is_none() && (self.same_space || matches!(self.metric, Metric::Hellinger))
    }

    /// The first step of a whole graph (rows from `first` on, every one): host-side
    /// candidates of every row from the engine, else the engine told of the graph and given
    /// the chance to start it.
    fn start_graph(&mut self, engine: &dyn Engine, first: usize) -> Result<()> {
        let mut since = std::time::Instant::now();
        let (kernel, width0) = (self.metric.kernel(), self.width0);
        self.symmetric = engine
            .graph_candidates(self.eb, kernel, width0, false)
            .transpose()?;
        if self.symmetric.is_none() {
            engine.expect_graph(self.base_key, width0);
            if self.engine_may_finish() {
                let none = self.eq.slice_rows(first, first);
                let req = self.request(none, &[], width0, Some(first..first), false);
                engine.begin_graph(&req, self.metric, self.k)?;
            }
        }
        self.lap("engine (symmetric, all rows)", &mut since);
        Ok(())
    }

    /// Queries `start..end` to the end: first try, exact re-rank, wider retries of the rows
    /// whose floor does not prove them, and a direct scan past the widest engine call. Writes
    /// rows `start..end` into `ids` / `dists` (`k` per row).
    fn round(
        &self,
        engine: &dyn Engine,
        start: usize,
        end: usize,
        ids_out: &mut [u32],
        dists_out: &mut [f32],
    ) -> Result<()> {
        let (k, available) = (self.k, self.available);
        let mut since = std::time::Instant::now();
        let mut pending: Vec<u32> = (start as u32..end as u32).collect();
        let mut width = self.width0;
        let loose = self.loose.load(Relaxed);
        let fast = !loose && self.expr.is_none() && engine.fast_first_tries(self.metric.kernel());
        let mut pass = 0usize;
        while !pending.is_empty() {
            // Gather the pending queries (contiguous on the first try: no copy).
            let contiguous = pass == 0;
            let gathered;
            let qv = if contiguous {
                self.eq.slice_rows(start, end)
            } else {
                let d = self.eq.dim();
                let mut v = Vec::with_capacity(pending.len() * d);
                for &i in &pending {
                    // Derived rows not made on the host are derived alone (same bits).
                    self.eq.extend_with_row(i as usize, &mut v);
                }
                gathered = Matrix::from_trusted(v, d);
                gathered.view()
            };
            let req = self.request(qv, &pending, width, contiguous.then_some(start..end), loose);
            let first_try = self.symmetric.as_ref().filter(|_| contiguous && !loose);
            // An engine that re-ranks on its own writes a first try's rows in place.
            let mut proven = vec![false; pending.len()];
            let finished = contiguous
                && first_try.is_none()
                && self.engine_may_finish()
                && engine.finish_rows(
                    &req,
                    self.metric,
                    k,
                    FinishedRows {
                        ids: &mut *ids_out,
                        distances: &mut *dists_out,
                        proven: &mut proven,
                        key_scale: self.key_scale,
                    },
                )?;
            let rerank = Rerank {
                metric: self.metric,
                xb: self.xb,
                aux: &self.aux,
                // Pair by pair, each candidate costs a row of the base's work (its roots or
                // its norm) once more: more than the pass over the base only for many rows.
                aux_pays: pending.len() * width >= self.xb.rows(),
                self_join: self.self_join,
                xq: self.xq,
                k,
                key_scale: self.key_scale,
                complete: width >= available,
            };
            // Re-rank each row exactly as the engine hands it over (in the engine's order, on
            // its threads) and write the rows whose floor proves them complete straight into
            // the output; the others are asked again.
            let requested = pending.len();
            let sink = Collector {
                rerank: &rerank,
                start,
                pending: (!contiguous).then_some(&pending[..]),
                requested,
                first: start,
                width,
                out_ids: as_atomic(ids_out),
                out_dists: as_atomic_f32(dists_out),
                failed: Mutex::new(Vec::new()),
                handed: AtomicUsize::new(0),
                malformed: AtomicBool::new(false),
            };
            if finished {
                // Rows written by the engine; the unproven ones are asked again.
                sink.failed
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend((0..requested as u32).filter(|&j| !proven[j as usize]));
                sink.handed.store(requested, Relaxed);
            } else if let Some(all) = first_try {
                hand_over(&all.rows(start, end), None, &sink);
            } else if let Some(plan) = self.expr {
                hand_over(&engine.candidates_expr(&req, plan)?, None, &sink);
            } else {
                let want_exact = self.same_space || req.exact_from.is_some();
                engine.candidate_rows(&req, want_exact, &sink)?;
            }
            let handed = sink.handed.into_inner();
            if sink.malformed.into_inner() || handed != requested {
                return Err(KnnError::Device(format!(
                    "engine {} handed over {handed} candidate rows of {requested} (or rows of the wrong shape)",
                    engine.name(),
                )));
            }
            let mut failed = sink.failed.into_inner().unwrap_or_else(|e| e.into_inner());
            failed.sort_unstable();
            if contiguous && !loose && requested >= MIN_LOOSE_ROWS && 2 * failed.len() > requested {
                self.loose.store(true, Relaxed);
            }
            self.lap(
                &format!(
                    "candidates and re-rank ({requested} rows, width {width}, {} not proven)",
                    failed.len()
                ),
                &mut since,
            );
            pending = failed
                .iter()
                .map(|&j| {
                    if contiguous {
                        (start + j as usize) as u32
                    } else {
                        pending[j as usize]
                    }
                })
                .collect();
            if pending.is_empty() {
                break;
            }
            // Rows a fast first try left unproven are first asked again at the same width with
            // precise keys, then wider.
            if !(contiguous && fast) {
                width = (width * 4).min(available);
            }
            pass += 1;
            if width > max_engine_width(available) {
                // Ties or rounding too wide for candidate lists: scan these rows exactly.
                let scanned: Vec<(Vec<u32>, Vec<f32>)> = pending
                    .par_iter()
                    .map(|&qi| {
                        let skip = self.self_join.then_some(qi);
                        let exact =
                            exact_scan(self.metric, self.xb, self.xq.row(qi as usize), k, skip);
                        let (mut ids, mut dists) = (vec![0u32; k], vec![0f32; k]);
                        finish_row(self.metric, &exact, &mut ids, &mut dists);
                        (ids, dists)
                    })
                    .collect();
                for (&qi, (ids, dists)) in pending.iter().zip(scanned) {
                    let qi = qi as usize - start;
                    ids_out[qi * k..(qi + 1) * k].copy_from_slice(&ids);
                    dists_out[qi * k..(qi + 1) * k].copy_from_slice(&dists);
                }
                break;
            }
        }
        Ok(())
    }
}

/// The engines rounds run on, one entry per concurrent round: every device of `engine` (or the
/// engine itself), each as many times as it works on rounds at once.
fn workers(engine: &dyn Engine) -> Vec<&dyn Engine> {
    let devices = engine.devices();
    let devices = if devices.is_empty() {
        vec![engine]
    } else {
        devices
    };
    let mut out = Vec::new();
    for e in devices {
        for _ in 0..e.concurrent_rounds().max(1) {
            out.push(e);
        }
    }
    out
}

/// The base of a pipeline run: the given rows, and their preparation when it was made once
/// before ([`search_prepared`]).
#[derive(Clone, Copy)]
struct Base<'a> {
    rows: MatrixRef<'a>,
    prepared: Option<&'a PreparedBase>,
}

impl<'a> Base<'a> {
    fn given(rows: MatrixRef<'a>) -> Self {
        Base {
            rows,
            prepared: None,
        }
    }

    fn prepared(rows: MatrixRef<'a>, prepared: &'a PreparedBase) -> Self {
        Base {
            rows,
            prepared: Some(prepared),
        }
    }
}

/// Values of a base from which the engine is told of it before the host prepares (smaller
/// ones are not worth a thread).
const PREFETCH_MIN: usize = 1 << 22;

/// The pipeline for the query rows `rows` (all of them, or a piece of a graph); the result's row
/// `i` is query `rows.start + i`. Rounds of queries go to the engine's workers (see
/// [`Engine::devices`], [`Engine::concurrent_rounds`]); each round's rows are the same whichever
/// worker takes it, so the answer does not depend on the schedule. The arguments are checked
/// here (see [`validate`], [`check_domains`]).
fn run(
    engine: &dyn Engine,
    base: Base<'_>,
    queries: Option<MatrixRef<'_>>,
    k: usize,
    metric: &Metric,
    rows: std::ops::Range<usize>,
    progress: ProgressFn<'_>,
) -> Result<Neighbors> {
    let Base {
        rows: base,
        prepared: prepared_base,
    } = base;
    let profile = std::env::var_os("KNN_PROFILE").is_some();
    let mut since = std::time::Instant::now();
    let base_key = prepared_base.map_or_else(crate::engine::base_key, |p| p.key);
    let t0 = since;
    // When each concurrent part ended, for the profile (ms from the start).
    let ended = |what: &str| {
        if profile {
            eprintln!(
                "pipeline: {what} ended at {:.2} ms",
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
    };
    let available = validate(metric, base, queries, k)?;
    let whole_graph = queries.is_none()
        && !matches!(metric, Metric::Expr(_))
        && rows == (0..base.rows())
        && metric.is_symmetric();
    let kernel = metric.kernel();
    let workers = workers(engine);
    let width0 = engine
        .candidate_width(k, available, kernel)
        .clamp(k, available);
    // While the host checks the values and prepares, the engine may copy the given base to its
    // device (a base found invalid only wastes the copy). The output is made (and shown to the
    // engine, which may page-lock it) on a thread of its own, joined only once a whole graph's
    // work has started on the device (`Engine::begin_graph`).
    let prepared = std::cell::OnceCell::new();
    let fetched = Signal::default();
    let (ctx, out) = std::thread::scope(|s| {
        let out = s.spawn(|| {
            // A whole graph's output is made once the base's copy is done, while the device
            // works on the graph: its pages would slow the copy, whose end the graph waits for
            // (80k Hellinger: 43.5 against 51.2 ms, median of 28 runs each, same call). Other
            // outputs are needed as soon as the rounds start.
            if whole_graph {
                fetched.wait();
            }
            let mut out = Neighbors::zeroed(rows.len(), k);
            crate::pages::populate(&mut out.ids);
            crate::pages::populate(&mut out.distances);
            ended("output pages");
            // Shown to the engine once the base's copy is done: page-locking memory may hold
            // the driver meanwhile.
            fetched.wait();
            if !engine.adopt_output(&mut out.ids, &mut out.distances) {
                out.mark_unwritten();
            }
            ended("output shown to the engine");
            out
        });
        let ctx = (|| {
            if prepared_base.is_none() && base.rows() * base.dim() >= PREFETCH_MIN {
                s.spawn(|| {
                    // Set however the copy ends (a panic too): the output's thread waits for it.
                    let _set = fetched.set_when_dropped();
                    engine.prefetch_base(base_key, base);
                    ended("prefetch");
                });
            } else {
                fetched.set();
            }
            // Hellinger's check of the base waits for the preparation, whose pass over the
            // base sees every column's smallest value (one pass over memory the base's copy
            // reads meanwhile, instead of two).
            // A prepared base was checked when it was prepared.
            let after = matches!(metric, Metric::Hellinger) || prepared_base.is_some();
            let (domain, prep) = rayon::join(
                || {
                    let r = check_domains(metric, (!after).then_some(base), queries);
                    ended("value checks");
                    r
                },
                || {
                    let reused = prepared_base.and_then(|p| p.with_queries(metric, base, queries));
                    let r = reused.map_or_else(|| prepare(metric, base, queries), Ok);
                    ended("prepare");
                    r
                },
            );
            let domain = if prepared_base.is_none()
                && after
                && !prep.as_ref().is_ok_and(|p| p.base_nonnegative)
            {
                domain.and(check_domains(metric, Some(base), None))
            } else {
                domain
            };
            // Out-of-domain values are the error to report, whatever the preparation made of
            // them.
            let prep = domain.and(prep)?;
            let prep = prepared.get_or_init(|| prep);
            let xb = prep.exact_base.view();
            let mut ctx = Run {
                metric,
                eb: prep.engine_base(),
                eq: prep.engine_queries(),
                xb,
                xq: prep.exact_queries().unwrap_or(xb),
                key_scale: prep.key_scale,
                same_space: prep.engine.is_none()
                    && !matches!(metric, Metric::Cosine | Metric::Hellinger),
                self_join: queries.is_none(),
                k,
                available,
                width0,
                base_key,
                exact_data: prep.engine.is_none(),
                expr: prep.expr.as_ref(),
                symmetric: None,
                aux: OnceLock::new(),
                loose: AtomicBool::new(false),
                profile,
            };
            ctx.lap("prepare", &mut since);
            // A whole graph of a symmetric metric: the engine may compute every row's first
            // candidate lists at once, each unordered pair once (see
            // `Engine::graph_candidates`), or start that work on its device now
            // (`Engine::begin_graph`).
            if whole_graph {
                ctx.start_graph(engine, rows.start)?;
            }
            Ok(ctx)
        })();
        let out = Output {
            engine,
            out: Some(out.join().expect("allocating the output panicked")),
        };
        (ctx, out)
    });
    let (ctx, mut out) = (ctx?, out);
    ctx.lap("output joined", &mut since);
    let first = rows.start;
    let per_round = (CANDIDATE_BYTES_PER_ROUND / workers.len() / (8 * width0))
        .max(1024)
        .min(
            (rows.len() / (32 * workers.len()))
                .max(MIN_ROUND)
                .max(engine.min_round_queries()),
        );
    let total = rows.len();
    // Rounds: (first query, that round's output rows).
    let result: &mut Neighbors = &mut out;
    let rounds = rows
        .clone()
        .step_by(per_round)
        .zip(result.ids.chunks_mut(per_round * k))
        .zip(result.distances.chunks_mut(per_round * k));
    if workers.len() == 1 || total <= per_round {
        for ((start, ids), dists) in rounds {
            let end = (start + per_round).min(rows.end);
            ctx.round(workers[0], start, end, ids, dists)?;
            progress(end - first, total);
        }
    } else {
        let queue = std::sync::Mutex::new(rounds);
        let done = std::sync::atomic::AtomicUsize::new(0);
        let failed: std::sync::Mutex<Option<KnnError>> = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for &e in &workers {
                let (ctx, queue, done, failed) = (&ctx, &queue, &done, &failed);
                s.spawn(move || loop {
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some(((start, ids), dists)) = next else {
                        break;
                    };
                    let end = (start + per_round).min(rows.end);
                    if let Err(e) = ctx.round(e, start, end, ids, dists) {
                        *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        // Hand out no more rounds: the call fails anyway.
                        queue
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .by_ref()
                            .for_each(drop);
                        break;
                    }
                    let n = end - start;
                    let so_far = done.fetch_add(n, std::sync::atomic::Ordering::Relaxed) + n;
                    progress(so_far, total);
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(e);
        }
    }
    ctx.lap("rounds done", &mut since);
    // In blocks (a per-element parallel search costs more than the whole re-rank at k = 16):
    // a branch-free test per block, then the first bad value of the first bad block.
    const BLOCK: usize = 1 << 14;
    let bad_block = out
        .distances
        .par_chunks(BLOCK)
        .position_first(|c| !c.iter().fold(true, |ok, d| ok & d.is_finite()));
    if let Some(b) = bad_block {
        let i = b * BLOCK
            + out.distances[b * BLOCK..]
                .iter()
                .position(|d| !d.is_finite())
                .expect("the block has a non-finite value");
        return Err(KnnError::Overflow {
            metric: metric.name(),
            row: first + i / k,
        });
    }
    ctx.lap("output checked", &mut since);
    if profile {
        if let Some(r) = ctx.eb.centred_roots() {
            eprintln!(
                "pipeline: engine rows (centred roots) made on the host: {}",
                if r.made { "yes" } else { "no" }
            );
        }
    }
    drop(ctx);
    if let Some(prep) = prepared.into_inner() {
        release(prep);
    }
    let out = out.into_inner();
    if profile {
        eprintln!(
            "pipeline: prepared data and output released: {:.2} ms",
            since.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(out)
}

/// A one-way flag threads wait for.
#[derive(Default)]
struct Signal {
    set: Mutex<bool>,
    changed: std::sync::Condvar,
}

impl Signal {
    fn set(&self) {
        *self.set.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// A guard that sets the flag when dropped.
    fn set_when_dropped(&self) -> impl Drop + '_ {
        struct SetOnDrop<'a>(&'a Signal);
        impl Drop for SetOnDrop<'_> {
            fn drop(&mut self) {
                self.0.set();
            }
        }
        SetOnDrop(self)
    }

    fn wait(&self) {
        let mut set = self.set.lock().unwrap_or_else(|e| e.into_inner());
        while !*set {
            set = self.changed.wait(set).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The pipeline's output, shown to `engine` (see [`Engine::adopt_output`]): released by it
/// before the output is returned ([`Output::into_inner`]) or dropped.
struct Output<'e> {
    engine: &'e dyn Engine,
    out: Option<Neighbors>,
}

impl Output<'_> {
    fn into_inner(mut self) -> Neighbors {
        let out = self.out.take().expect("taken only here");
        self.engine.release_output(&out.ids, &out.distances);
        out
    }
}

impl std::ops::Deref for Output<'_> {
    type Target = Neighbors;
    fn deref(&self) -> &Neighbors {
        self.out.as_ref().expect("taken only by into_inner")
    }
}

impl std::ops::DerefMut for Output<'_> {
    fn deref_mut(&mut self) -> &mut Neighbors {
        self.out.as_mut().expect("taken only by into_inner")
    }
}

impl Drop for Output<'_> {
    fn drop(&mut self) {
        if let Some(out) = self.out.take() {
            self.engine.release_output(&out.ids, &out.distances);
            drop(out);
        }
    }
}

/// Frees the copies `prep` made, on a thread of their own when large: unmapping the pages of
/// 80 000 × 256 square roots took 6 ms of a 124 ms GPU graph.
fn release(prep: Prepared<'_>) {
    let mut owned: Vec<Vec<f32>> = Vec::new();
    let Prepared {
        exact_base,
        exact_queries,
        engine,
        ..
    } = prep;
    for d in std::iter::once(exact_base).chain(exact_queries) {
        if let Data::Owned(m) = d {
            owned.push(m.into_vec());
        }
    }
    if let Some((b, q)) = engine {
        match b {
            EngineRows::Owned(b) => owned.push(b.into_vec()),
            EngineRows::Borrowed(_) => {}
            // The values, if the host made them: the borrow of the given rows ends here.
            EngineRows::Roots(r) => owned.extend(r.into_values()),
        }
        owned.extend(q.map(Matrix::into_vec));
    }
    let bytes: usize = owned.iter().map(|v| v.len() * 4).sum();
    if bytes >= 16 << 20 {
        // Should the thread not start, the closure and the copies are dropped here.
        let _ = std::thread::Builder::new()
            .name("knn-release".into())
            .spawn(move || drop(owned));
    }
}

/// The chosen k (selected by exact f64 key, sorted by (key, id)) as reported, into `ids` and
/// `dists`: f32 distances, ordered by (distance, id) — by decreasing similarity for the inner
/// product. Rounding to f32 can make distinct keys equal, so the order is fixed after rounding
/// (an insertion sort: the rows arrive sorted but for such groups).
fn finish_row(metric: &Metric, exact: &[(f64, u32)], ids: &mut [u32], dists: &mut [f32]) {
    let sign = if metric.is_similarity() { -1.0f32 } else { 1.0 };
    let before = |a: (f32, u32), b: (f32, u32)| {
        (sign * a.0)
            .total_cmp(&(sign * b.0))
            .then(a.1.cmp(&b.1))
            .is_lt()
    };
    for (t, e) in exact.iter().enumerate() {
        let item = (metric.distance_from_key(e.0), e.1);
        let mut p = t;
        while p > 0 && before(item, (dists[p - 1], ids[p - 1])) {
            dists[p] = dists[p - 1];
            ids[p] = ids[p - 1];
            p -= 1;
        }
        dists[p] = item.0;
        ids[p] = item.1;
    }
}

/// The k smallest exact keys of one query over the whole base, sorted by (key, id).
pub(crate) fn exact_scan(
    metric: &Metric,
    base: MatrixRef<'_>,
    q: &[f32],
    k: usize,
    skip: Option<u32>,
) -> Vec<(f64, u32)> {
    let mut all: Vec<(f64, u32)> = match metric {
        Metric::Expr(e) => {
            let ids: Vec<u32> = (0..base.rows() as u32)
                .filter(|&b| Some(b) != skip)
                .collect();
            let mut all = Vec::with_capacity(ids.len());
            e.keys(q, base, &ids, &mut all);
            all
        }
        _ => (0..base.rows() as u32)
            .filter(|&b| Some(b) != skip)
            .map(|b| (metric.exact_key(q, base.row(b as usize)), b))
            .collect(),
    };
    let cmp = |a: &(f64, u32), b: &(f64, u32)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1));
    if k < all.len() {
        all.select_nth_unstable_by(k - 1, cmp);
        all.truncate(k);
    }
    all.sort_unstable_by(cmp);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::oracle;
    use crate::synth::{generate, Distribution};

    #[test]
    fn hellinger_and_cosine_keys_are_exact_key_bit_for_bit() {
        for d in [13usize, 256] {
            // Values over many magnitudes, zeros included.
            let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
            let base: Vec<f32> = generate(u, 50, d, 7)
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    if i % 11 == 0 {
                        0.0
                    } else {
                        v * 10f32.powi((i % 9) as i32 - 3)
                    }
                })
                .collect();
            let q: Vec<f32> = generate(u, 1, d, 8).iter().map(|v| v * 4e6).collect();
            let roots: Vec<f64> = base.iter().map(|&v| (v as f64).sqrt()).collect();
            let rq: Vec<f64> = q.iter().map(|&v| (v as f64).sqrt()).collect();
            let ids: Vec<u32> = (0..21).map(|i| (i * 7 % 50) as u32).collect();
            let mut got = Vec::new();
            hellinger_keys(&rq, &roots, d, &ids, &mut got);
            assert_eq!(got.len(), ids.len());
            for (&(key, id), &want_id) in got.iter().zip(&ids) {
                let b = &base[want_id as usize * d..(want_id as usize + 1) * d];
                let want = Metric::Hellinger.exact_key(&q, b);
                assert_eq!((key.to_bits(), id), (want.to_bits(), want_id), "d={d}");
            }
            // Cosine, with the query equal to one candidate row (the −1 case).
            let xb = MatrixRef::new("b", &base, d).unwrap();
            let Some(BaseAux::CosineNorms(norms)) = BaseAux::new(&Metric::Cosine, xb) else {
                panic!("no cosine norms");
            };
            for q in [&q[..], xb.row(14)] {
                let mut got = Vec::new();
                cosine_keys(q, sum_sq(q), xb, &norms, &ids, &mut got);
                for (&(key, id), &want_id) in got.iter().zip(&ids) {
                    let want = Metric::Cosine.exact_key(q, xb.row(want_id as usize));
                    assert_eq!((key.to_bits(), id), (want.to_bits(), want_id), "d={d}");
                }
            }
        }
    }

    /// An engine that returns every point (so the pipeline alone decides): enough to check
    /// that pieces of a graph are the graph's rows.
    struct AllPoints;

    impl Engine for AllPoints {
        fn name(&self) -> String {
            "all".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            let (nq, nb) = (req.queries.rows(), req.base.rows());
            let w = req.width;
            let mut ids = Vec::with_capacity(nq * w);
            let mut keys = Vec::with_capacity(nq * w);
            for i in 0..nq {
                let q = req.queries.row(i);
                let mut row: Vec<(f32, u32)> = (0..nb as u32)
                    .filter(|&b| req.exclude.is_none_or(|e| e[i] != b))
                    .map(|b| (req.kernel.exact(q, req.base.row(b as usize)) as f32, b))
                    .collect();
                row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                row.truncate(w);
                keys.extend(row.iter().map(|r| r.0));
                ids.extend(row.iter().map(|r| r.1));
            }
            // Exact f32 keys of f64 values: a floor just below the w-th, or +inf when complete.
            let floor = (0..nq)
                .map(|i| {
                    if w >= req.available() {
                        f32::INFINITY
                    } else {
                        keys[i * w + w - 1].next_down().next_down()
                    }
                })
                .collect();
            Ok(crate::Candidates {
                width: w,
                ids,
                keys,
                floor,
            })
        }
    }

    /// [`AllPoints`] that finishes even rows itself (as the re-rank would) and leaves odd rows
    /// unproven, with garbage in their outputs.
    #[derive(Default)]
    struct Finisher(std::sync::atomic::AtomicUsize);

    impl Engine for Finisher {
        fn name(&self) -> String {
            "finisher".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            AllPoints.candidates(req)
        }
        fn finish_rows(
            &self,
            req: &CandidateRequest<'_>,
            metric: &Metric,
            k: usize,
            out: FinishedRows<'_>,
        ) -> Result<bool> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let c = AllPoints.candidates(req)?;
            let w = c.width;
            for i in 0..req.queries.rows() {
                let (ids, dists) = (&mut out.ids[i * k..][..k], &mut out.distances[i * k..][..k]);
                if i % 2 == 1 {
                    ids.fill(u32::MAX);
                    dists.fill(-1.0);
                    out.proven[i] = false;
                    continue;
                }
                let q = req.queries.row(i);
                let mut row: Vec<(f64, u32)> = c.ids[i * w..(i + 1) * w]
                    .iter()
                    .map(|&b| (req.kernel.exact(q, req.base.row(b as usize)), b))
                    .collect();
                row.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
                row.truncate(k);
                out.proven[i] = row[k - 1].0 < c.floor[i] as f64 || w >= req.available();
                finish_row(metric, &row, ids, dists);
            }
            Ok(true)
        }
    }

    #[test]
    fn rows_finished_by_the_engine_equal_the_rerank() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let b = Matrix::new("b", generate(u, 300, 3, 8), 3).unwrap();
        let q = Matrix::new("q", generate(u, 41, 3, 9), 3).unwrap();
        for metric in [Metric::L2, Metric::L1, Metric::SqL2] {
            let e = Finisher(Default::default());
            let got = search(&e, b.view(), q.view(), 4, &metric).unwrap();
            assert_eq!(e.0.load(std::sync::atomic::Ordering::Relaxed), 1);
            assert_eq!(
                got,
                search(&AllPoints, b.view(), q.view(), 4, &metric).unwrap()
            );
            let want = oracle(b.view(), Some(q.view()), 4, &metric).unwrap();
            assert_eq!(got.ids, want.ids, "{metric}");
            let g = graph(&e, b.view(), 3, &metric).unwrap();
            assert_eq!(g, graph(&AllPoints, b.view(), 3, &metric).unwrap());
        }
    }

    /// [`Finisher`] that records the pipeline's calls of the output and graph hooks.
    #[derive(Default)]
    struct Hooks {
        finisher: Finisher,
        calls: std::sync::Mutex<Vec<String>>,
    }

    impl Hooks {
        fn log(&self, what: String) {
            self.calls.lock().unwrap().push(what);
        }
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.calls.lock().unwrap())
        }
    }

    impl Engine for Hooks {
        fn name(&self) -> String {
            "hooks".into()
        }
        fn candidates(&self, req: &CandidateRequest<'_>) -> Result<crate::Candidates> {
            self.finisher.candidates(req)
        }
        fn finish_rows(
            &self,
            req: &CandidateRequest<'_>,
            metric: &Metric,
            k: usize,
            out: FinishedRows<'_>,
        ) -> Result<bool> {
            self.finisher.finish_rows(req, metric, k, out)
        }
        fn expect_graph(&self, _: u64, width: usize) {
            self.log(format!("expect {width}"));
        }
        fn begin_graph(&self, req: &CandidateRequest<'_>, _: &Metric, k: usize) -> Result<()> {
            let rows = (req.queries.rows(), req.exclude.map(<[u32]>::len));
            self.log(format!("begin {rows:?} k={k} first={}", !req.precise));
            Ok(())
        }
        fn adopt_output(&self, ids: &mut [u32], distances: &mut [f32]) -> bool {
            self.log(format!("adopt {} {}", ids.len(), distances.len()));
            false
        }
        fn release_output(&self, ids: &[u32], distances: &[f32]) {
            self.log(format!("release {} {}", ids.len(), distances.len()));
        }
    }

    #[test]
    fn output_and_graph_hooks_are_called_in_order() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let b = Matrix::new("b", generate(u, 300, 3, 8), 3).unwrap();
        let q = Matrix::new("q", generate(u, 41, 3, 9), 3).unwrap();
        let e = Hooks::default();
        let g = graph(&e, b.view(), 3, &Metric::L2).unwrap();
        assert_eq!(g, graph(&AllPoints, b.view(), 3, &Metric::L2).unwrap());
        // (The output is adopted on a thread of its own, at any point before the rounds.)
        let mut calls = e.take();
        let at = calls.iter().position(|c| c == "adopt 900 900");
        assert!(at.is_some_and(|i| i < 3), "{calls:?}");
        calls.remove(at.unwrap());
        let w = calls[0]
            .strip_prefix("expect ")
            .expect("told of the graph first");
        assert_eq!(
            calls[1], "begin (0, Some(0)) k=3 first=true",
            "{calls:?} (width {w})"
        );
        assert_eq!(calls[2..], ["release 900 900"], "{calls:?}");
        // A search: no graph hooks; the output is adopted and released.
        search(&e, b.view(), q.view(), 4, &Metric::L2).unwrap();
        assert_eq!(e.take(), ["adopt 164 164", "release 164 164"]);
        // An error after the output was made releases it too.
        let mut bad = generate(u, 300, 3, 8);
        bad[7] = -1.0;
        let bad = Matrix::new("b", bad, 3).unwrap();
        assert!(graph(&e, bad.view(), 3, &Metric::Hellinger).is_err());
        assert_eq!(e.take(), ["adopt 900 900", "release 900 900"]);
    }

    /// Hellinger's check of the base rides on the preparation's pass: a negative value is still
    /// named, for graphs and searches, in base and queries; -0 is no negative.
    #[test]
    fn hellinger_domain_errors_name_the_value() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let mut v = generate(u, 300, 3, 8);
        v[57 * 3 + 2] = -0.5;
        v[200 * 3] = -1.0;
        let bad = Matrix::new("b", v, 3).unwrap();
        let good = Matrix::new("q", generate(u, 20, 3, 9), 3).unwrap();
        let named = |r: Result<Neighbors>, want: (&str, usize, usize)| match r {
            Err(KnnError::Negative { what, row, col, .. }) => {
                assert_eq!((what.as_str(), row, col), want)
            }
            r => panic!("{:?}", r.map(|_| ())),
        };
        named(
            graph(&AllPoints, bad.view(), 3, &Metric::Hellinger),
            ("base", 57, 2),
        );
        named(
            search(&AllPoints, bad.view(), good.view(), 3, &Metric::Hellinger),
            ("base", 57, 2),
        );
        named(
            search(&AllPoints, good.view(), bad.view(), 3, &Metric::Hellinger),
            ("queries", 57, 2),
        );
        let mut v = generate(u, 300, 3, 8);
        v[5] = -0.0;
        let zero = Matrix::new("b", v, 3).unwrap();
        assert!(graph(&AllPoints, zero.view(), 3, &Metric::Hellinger).is_ok());
    }

    #[test]
    fn graph_rows_are_the_graphs_rows() {
        let u = Distribution::Uniform { lo: 0.0, hi: 1.0 };
        let p = Matrix::new("p", generate(u, 230, 5, 3), 5).unwrap();
        let whole = oracle(p.view(), None, 6, &Metric::L2).unwrap();
        let mut pieced = Neighbors::with_shape(0, 6);
        for r in [0..1, 1..100, 100..100, 100..230] {
            let part = graph_rows(&AllPoints, p.view(), r, 6, &Metric::L2, &|_, _| {}).unwrap();
            pieced.ids.extend(part.ids);
            pieced.distances.extend(part.distances);
        }
        assert_eq!(pieced.ids, whole.ids);
        assert!(graph_rows(&AllPoints, p.view(), 200..231, 6, &Metric::L2, &|_, _| {}).is_err());
    }
}
